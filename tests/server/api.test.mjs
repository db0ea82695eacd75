// Integration tests of `dsv4 serve` driven by the official `openai` npm
// client (and raw HTTP where the client cannot send what we need).
// Run: node --test tests/server/api.test.mjs   (see tests/server/README.md)
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';

import { getPath, postJSON, rawRequest, sleep, sse, startServer, waitFor, wordsPrompt, rng } from './lib.mjs';

const CONTEXT = 1024;
let server;
let client;

before(async () => {
  server = await startServer(['--context-length', String(CONTEXT), '--chunked-prefill-size', '256',
    '--served-model-name', 'dsv4-test']);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});
after(async () => { await server?.stop(); });

const user = (content) => [{ role: 'user', content }];

// Concatenates the deltas of a chat stream per choice index.
async function collectChat(stream) {
  const out = {};
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const o = (out[c.index] ??= { role: null, content: '', reasoning: '', finish: null, logprobs: [], tools: [], afterFinish: 0 });
      if (o.finish) o.afterFinish++;
      if (c.delta.role) o.role = c.delta.role;
      if (c.delta.content) o.content += c.delta.content;
      if (c.delta.reasoning_content) o.reasoning += c.delta.reasoning_content;
      if (c.delta.tool_calls) o.tools.push(...c.delta.tool_calls);
      if (c.logprobs?.content) o.logprobs.push(...c.logprobs.content);
      if (c.finish_reason) o.finish = c.finish_reason;
    }
  }
  return { choices: out, usage, chunks };
}

async function expectStatus(promise, status, messageRe) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `expected an APIError, got ${e}`);
    assert.equal(e.status, status, `status of: ${e.message}`);
    if (messageRe) assert.match(e.error?.message ?? e.message, messageRe);
    return e;
  }
  assert.fail(`expected HTTP ${status}, the request succeeded`);
}

function assertErrorShape(r, status, messageRe) {
  assert.equal(r.status, status, `status; body: ${r.text.slice(0, 300)}`);
  assert.ok(r.json && typeof r.json.error === 'object', `OpenAI error shape expected, got: ${r.text.slice(0, 300)}`);
  const e = r.json.error;
  for (const k of ['message', 'type', 'param', 'code']) assert.ok(k in e, `error.${k} missing`);
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0, 'error message is empty');
  assert.equal(e.code, status);
  if (messageRe) assert.match(e.message, messageRe);
}

describe('models and info routes', () => {
  test('GET /v1/models lists the served model', async () => {
    const page = await client.models.list();
    const ids = page.data.map((m) => m.id);
    assert.deepEqual(ids, ['dsv4-test']);
    const m = await client.models.retrieve('dsv4-test');
    assert.equal(m.object, 'model');
    await expectStatus(client.models.retrieve('no-such-model'), 404);
  });

  test('/health, /health_generate, /get_model_info, /get_server_info, /get_load', async () => {
    assert.equal((await getPath(server.origin, '/health')).status, 200);
    assert.equal((await getPath(server.origin, '/health_generate')).status, 200);
    const mi = await getPath(server.origin, '/get_model_info');
    assert.equal(mi.status, 200);
    assert.equal(mi.json.is_generation, true);
    const si = await getPath(server.origin, '/get_server_info');
    assert.equal(si.status, 200);
    assert.equal(si.json.context_length, CONTEXT);
    assert.equal(si.json.chunked_prefill_size, 256);
    assert.ok(Array.isArray(si.json.internal_states));
    assert.equal(typeof si.json.internal_states[0].num_running_reqs, 'number');
    const load = await getPath(server.origin, '/get_load');
    assert.equal(load.status, 200);
    assert.ok(Array.isArray(load.json));
  });

  test('/tokenize and /detokenize round-trip', async () => {
    const t = await postJSON(server.origin, '/tokenize', { prompt: 'hello world' });
    assert.equal(t.status, 200);
    assert.ok(t.json.tokens.length > 0);
    assert.equal(t.json.count, t.json.tokens.length);
    const d = await postJSON(server.origin, '/detokenize', { tokens: t.json.tokens });
    assert.equal(d.status, 200);
    assert.equal(d.json.text, 'hello world');
  });
});

describe('chat completions', () => {
  const base = { model: 'dsv4-test', messages: user('Say hello.'), max_tokens: 12, seed: 1234, ignore_eos: true };

  test('non-streaming: OpenAI response shape and usage', async () => {
    const r = await client.chat.completions.create(base);
    assert.match(r.id, /\S+/);
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.model, 'dsv4-test');
    assert.equal(typeof r.created, 'number');
    assert.equal(r.choices.length, 1);
    const c = r.choices[0];
    assert.equal(c.index, 0);
    assert.equal(c.message.role, 'assistant');
    assert.equal(typeof c.message.content, 'string');
    assert.ok(c.message.content.length > 0);
    assert.equal(c.finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 12);
    assert.ok(r.usage.prompt_tokens > 3);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    // cached_tokens is a prefix-cache oracle: only with --enable-cache-report.
    assert.equal(r.usage.prompt_tokens_details, undefined);
  });

  test('streaming: deltas concatenate to the non-streamed content (same seed), usage chunk', async () => {
    const full = await client.chat.completions.create(base);
    const stream = await client.chat.completions.create({ ...base, stream: true, stream_options: { include_usage: true } });
    const got = await collectChat(stream);
    const c = got.choices[0];
    assert.equal(c.role, 'assistant');
    assert.equal(c.content, full.choices[0].message.content ?? '');
    assert.equal(c.reasoning, full.choices[0].message.reasoning_content ?? '');
    assert.equal(c.finish, 'length');
    assert.equal(c.afterFinish, 0, 'no deltas after the finish chunk');
    assert.ok(got.usage, 'include_usage: a usage chunk');
    assert.equal(got.usage.completion_tokens, 12);
    assert.equal(got.usage.prompt_tokens, full.usage.prompt_tokens);
    assert.equal(got.usage.prompt_tokens_details, undefined);
  });

  test('streaming over raw SSE ends with data: [DONE]', async () => {
    const r = await sse(server.origin, '/v1/chat/completions', { ...base, stream: true });
    assert.equal(r.status, 200);
    assert.ok(r.done, 'saw data: [DONE]');
    assert.ok(!r.afterDone, 'nothing after [DONE]');
    assert.equal(r.events.at(-1).choices[0].finish_reason, 'length');
  });

  test('seed reproducibility: same seed gives identical content and logprobs; another seed differs', async () => {
    const req = { ...base, max_tokens: 10, logprobs: true, top_logprobs: 2 };
    const a = await client.chat.completions.create(req);
    const b = await client.chat.completions.create(req);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    assert.deepEqual(a.choices[0].logprobs, b.choices[0].logprobs);
    const c = await client.chat.completions.create({ ...req, seed: 99 });
    assert.notEqual(c.choices[0].message.content, a.choices[0].message.content);
  });

  test('content as a list of text parts equals the plain string; system/developer roles', async () => {
    const plain = await client.chat.completions.create({ ...base, messages: user('Say hello.') });
    const parts = await client.chat.completions.create({ ...base, messages: [{ role: 'user', content: [{ type: 'text', text: 'Say hello.' }] }] });
    assert.equal(parts.usage.prompt_tokens, plain.usage.prompt_tokens);
    assert.equal(parts.choices[0].message.content, plain.choices[0].message.content);
    for (const role of ['system', 'developer']) {
      const r = await client.chat.completions.create({ ...base, max_tokens: 2, messages: [{ role, content: 'Be brief.' }, ...user('Hi')] });
      assert.ok(r.usage.prompt_tokens > plain.usage.prompt_tokens - 2, role);
    }
  });

  test('temperature 0 is greedy and reproducible without a seed', async () => {
    const req = { model: 'dsv4-test', messages: user('Count.'), max_tokens: 6, temperature: 0 };
    const a = await client.chat.completions.create(req);
    const b = await client.chat.completions.create({ ...req, seed: 5 });
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  });

  test('n > 1: n choices with indexes 0..n-1 (streamed and not)', async () => {
    const r = await client.chat.completions.create({ ...base, n: 3, max_tokens: 6 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    for (const c of r.choices) assert.equal(c.finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 18);
    const texts = new Set(r.choices.map((c) => c.message.content));
    assert.ok(texts.size > 1, 'choices sample independently');
    const s = await collectChat(await client.chat.completions.create({ ...base, n: 3, max_tokens: 6, stream: true }));
    assert.deepEqual(Object.keys(s.choices).map(Number).sort(), [0, 1, 2]);
    for (let i = 0; i < 3; ++i) {
      assert.equal(s.choices[i].finish, 'length');
      assert.equal(s.choices[i].content, r.choices[i].message.content ?? '', `choice ${i} streamed == non-streamed`);
    }
  });

  test('logprobs / top_logprobs: shape, one entry per completion token', async () => {
    const r = await client.chat.completions.create({ ...base, max_tokens: 8, logprobs: true, top_logprobs: 3 });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, r.usage.completion_tokens);
    let text = '';
    for (const e of content) {
      assert.equal(typeof e.token, 'string');
      assert.ok(e.logprob <= 0 && Number.isFinite(e.logprob));
      assert.ok(Array.isArray(e.bytes));
      assert.equal(e.top_logprobs.length, 3);
      for (let i = 1; i < 3; ++i) assert.ok(e.top_logprobs[i - 1].logprob >= e.top_logprobs[i].logprob, 'top sorted');
      assert.ok(e.logprob <= e.top_logprobs[0].logprob);
      text += Buffer.from(e.bytes).toString('latin1');
    }
    assert.equal(Buffer.from(text, 'latin1').toString('utf8'), r.choices[0].message.content);
    // Streamed logprobs equal the non-streamed ones.
    const s = await collectChat(await client.chat.completions.create({ ...base, max_tokens: 8, logprobs: true, top_logprobs: 3, stream: true }));
    assert.deepEqual(s.choices[0].logprobs, content);
    // top_logprobs without logprobs is refused.
    await expectStatus(client.chat.completions.create({ ...base, top_logprobs: 2 }), 400, /logprobs/);
  });

  test('stop strings and max_completion_tokens', async () => {
    const full = await client.chat.completions.create({ ...base, max_tokens: 12 });
    const text = full.choices[0].message.content;
    const stop = [...text].slice(3, 5).join('');
    const r = await client.chat.completions.create({ ...base, max_tokens: 12, stop: [stop] });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].message.content, text.slice(0, text.indexOf(stop)));
    const m = await client.chat.completions.create({ ...base, max_tokens: undefined, max_completion_tokens: 3 });
    assert.equal(m.usage.completion_tokens, 3);
  });
});

describe('tools', () => {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Get the weather of a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  }];
  const req = { model: 'dsv4-test', messages: user('What is the weather in Paris?'), tools, max_tokens: 8, seed: 7 };

  test('request with tools renders and returns a valid response', async () => {
    const r = await client.chat.completions.create(req);
    const c = r.choices[0];
    assert.equal(c.message.role, 'assistant');
    assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason));
    assert.ok(c.message.tool_calls === null || c.message.tool_calls === undefined || Array.isArray(c.message.tool_calls));
    for (const call of c.message.tool_calls ?? []) {
      assert.equal(call.type, 'function');
      assert.equal(typeof call.function.name, 'string');
      assert.equal(typeof call.function.arguments, 'string');
    }
    // The tool definitions are in the rendered prompt.
    const plain = await client.chat.completions.create({ ...req, tools: undefined });
    assert.ok(r.usage.prompt_tokens > plain.usage.prompt_tokens + 10, 'tools add prompt tokens');
  });

  test('tool_choice auto / none / named function are accepted; streamed with tools', async () => {
    for (const tool_choice of ['auto', 'none', { type: 'function', function: { name: 'get_weather' } }]) {
      const r = await client.chat.completions.create({ ...req, tool_choice });
      assert.equal(r.object, 'chat.completion');
    }
    const s = await collectChat(await client.chat.completions.create({ ...req, stream: true }));
    assert.ok(s.choices[0].finish);
  });

  test('a conversation with assistant tool calls and tool results renders', async () => {
    const messages = [
      ...user('Weather in Paris?'),
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
    ];
    const r = await client.chat.completions.create({ ...req, messages });
    assert.equal(r.choices.length, 1);
  });

  test('tool_choice "required" without tools -> 400', async () => {
    await expectStatus(client.chat.completions.create({ ...req, tools: undefined, tool_choice: 'required' }), 400, /[Tt]ool/);
  });

  test('tool_choice naming an unknown function -> 400', async () => {
    await expectStatus(client.chat.completions.create({ ...req, tool_choice: { type: 'function', function: { name: 'nope' } } }),
      400, /nope/);
  });
});

describe('reasoning', () => {
  const req = {
    model: 'dsv4-test', messages: user('Think about it.'), max_tokens: 10, seed: 3, ignore_eos: true,
    chat_template_kwargs: { thinking: true },
  };

  test('thinking: the message has reasoning_content; streamed reasoning equals it', async () => {
    const r = await client.chat.completions.create(req);
    const m = r.choices[0].message;
    assert.ok('reasoning_content' in m, 'reasoning_content field present');
    assert.ok(m.reasoning_content === null || typeof m.reasoning_content === 'string');
    // The prompt ends inside <think>: the output starts as reasoning.
    assert.equal(typeof m.reasoning_content, 'string');
    assert.ok(m.reasoning_content.length > 0);
    const s = await collectChat(await client.chat.completions.create({ ...req, stream: true }));
    assert.equal(s.choices[0].reasoning, m.reasoning_content ?? '');
    assert.equal(s.choices[0].content, m.content ?? '');
    // Without thinking there is no reasoning.
    const plain = await client.chat.completions.create({ ...req, chat_template_kwargs: { thinking: false } });
    assert.ok(!plain.choices[0].message.reasoning_content);
  });
});

describe('completions', () => {
  const base = { model: 'dsv4-test', prompt: 'hello world', max_tokens: 6, seed: 11, ignore_eos: true };

  test('string prompt: shape and usage', async () => {
    const r = await client.completions.create(base);
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].index, 0);
    assert.equal(typeof r.choices[0].text, 'string');
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 6);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 6);
  });

  test('echo prefixes the prompt; token-id prompts; list of prompts', async () => {
    const plain = await client.completions.create(base);
    const echo = await client.completions.create({ ...base, echo: true });
    assert.equal(echo.choices[0].text, 'hello world' + plain.choices[0].text);
    const tok = await postJSON(server.origin, '/tokenize', { prompt: 'hello world' });
    const ids = await client.completions.create({ ...base, prompt: tok.json.tokens });
    assert.equal(ids.choices[0].text, plain.choices[0].text);
    const two = await client.completions.create({ ...base, prompt: ['hello world', 'good night'] });
    assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
    assert.equal(two.choices[0].text, plain.choices[0].text);
  });

  test('logprobs: tokens, token_logprobs and top_logprobs per completion token', async () => {
    const r = await client.completions.create({ ...base, logprobs: 2 });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, r.usage.completion_tokens);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    assert.equal(lp.top_logprobs.length, lp.tokens.length);
    for (const t of lp.top_logprobs) {
      const n = Object.keys(t).length;
      assert.ok(n >= 1 && n <= 2, `top_logprobs entries: ${n}`);
    }
    for (const v of lp.token_logprobs) assert.ok(v <= 0);
  });

  test('streaming completions concatenate to the non-streamed text and end with [DONE]', async () => {
    const full = await client.completions.create(base);
    const r = await sse(server.origin, '/v1/completions', { ...base, stream: true, stream_options: { include_usage: true } });
    assert.ok(r.done);
    const text = r.events.filter((e) => e.choices.length).map((e) => e.choices[0].text).join('');
    assert.equal(text, full.choices[0].text);
    assert.equal(r.events.at(-1).usage.completion_tokens, 6);
    const viaClient = await client.completions.create({ ...base, stream: true });
    let t2 = '';
    for await (const ch of viaClient) t2 += ch.choices[0]?.text ?? '';
    assert.equal(t2, full.choices[0].text);
  });
});

describe('/generate (SGLang native)', () => {
  const sp = { max_new_tokens: 6, seed: 21, ignore_eos: true };

  test('text and input_ids give the same output', async () => {
    const a = await postJSON(server.origin, '/generate', { text: 'hello world', sampling_params: sp });
    assert.equal(a.status, 200, a.text);
    assert.equal(typeof a.json.text, 'string');
    assert.equal(a.json.output_ids.length, 6);
    assert.equal(a.json.meta_info.completion_tokens, 6);
    assert.equal(a.json.meta_info.finish_reason.type, 'length');
    const tok = await postJSON(server.origin, '/tokenize', { prompt: 'hello world' });
    const b = await postJSON(server.origin, '/generate', { input_ids: tok.json.tokens, sampling_params: sp });
    assert.equal(b.status, 200, b.text);
    assert.deepEqual(b.json.output_ids, a.json.output_ids);
    assert.equal(b.json.text, a.json.text);
  });

  test('return_logprob', async () => {
    const r = await postJSON(server.origin, '/generate', { text: 'hello', sampling_params: sp, return_logprob: true, top_logprobs_num: 2 });
    assert.equal(r.status, 200);
    const lp = r.json.meta_info.output_token_logprobs;
    assert.equal(lp.length, 6);
    lp.forEach(([v, id], i) => { assert.ok(v <= 0); assert.equal(id, r.json.output_ids[i]); });
    assert.equal(r.json.meta_info.output_top_logprobs.length, 6);
  });

  test('streaming: cumulative text grows to the non-streamed text; [DONE]', async () => {
    const full = await postJSON(server.origin, '/generate', { text: 'hello world', sampling_params: sp });
    const r = await sse(server.origin, '/generate', { text: 'hello world', sampling_params: sp, stream: true });
    assert.equal(r.status, 200);
    assert.ok(r.done, 'ends with data: [DONE]');
    assert.ok(r.events.length >= 2);
    for (let i = 1; i < r.events.length; ++i)
      assert.ok(r.events[i].text.startsWith(r.events[i - 1].text), 'text is cumulative');
    const last = r.events.at(-1);
    assert.equal(last.text, full.json.text);
    assert.deepEqual(last.output_ids, full.json.output_ids);
    assert.equal(last.meta_info.finish_reason.type, 'length');
  });

  test('batched text list', async () => {
    const r = await postJSON(server.origin, '/generate', { text: ['hello world', 'abc'], sampling_params: sp });
    assert.equal(r.status, 200);
    assert.equal(r.json.length, 2);
  });
});

describe('logit_bias', () => {
  test('+100 forces a token, -100 bans one (greedy and sampled; /generate, completions, chat)', async () => {
    const tok = await postJSON(server.origin, '/tokenize', { prompt: ' banana' });
    const T = tok.json.tokens.at(-1);
    const sp = { max_new_tokens: 4, ignore_eos: true };
    for (const extra of [{ temperature: 0 }, { temperature: 1, seed: 5 }, { temperature: 0.7, top_p: 0.9, seed: 6 }]) {
      const r = await postJSON(server.origin, '/generate', { text: 'hello', sampling_params: { ...sp, ...extra, logit_bias: { [T]: 100 } } });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.json.output_ids, [T, T, T, T]);
    }
    const plain = await postJSON(server.origin, '/generate', { text: 'hello', sampling_params: { ...sp, temperature: 0 } });
    const G = plain.json.output_ids[0];
    const banned = await postJSON(server.origin, '/generate',
      { text: 'hello', sampling_params: { ...sp, temperature: 0, logit_bias: { [G]: -100 } } });
    assert.equal(banned.status, 200, banned.text);
    assert.ok(!banned.json.output_ids.includes(G), `${G} banned: ${banned.json.output_ids}`);
    // An empty map changes nothing.
    const empty = await postJSON(server.origin, '/generate', { text: 'hello', sampling_params: { ...sp, temperature: 0, logit_bias: {} } });
    assert.deepEqual(empty.json.output_ids, plain.json.output_ids);
    // The OpenAI routes: top-level logit_bias.
    const text = (await postJSON(server.origin, '/detokenize', { tokens: [T, T, T] })).json.text;
    const c = await client.completions.create({ model: 'dsv4-test', prompt: 'hello', max_tokens: 3, seed: 1, ignore_eos: true, logit_bias: { [T]: 100 } });
    assert.equal(c.choices[0].text, text);
    const chat = await client.chat.completions.create({ model: 'dsv4-test', messages: user('hi'), max_tokens: 3, seed: 1, ignore_eos: true,
      logit_bias: { [T]: 100 }, chat_template_kwargs: { thinking: false } });
    const m = chat.choices[0].message;
    assert.ok(((m.content ?? '') + (m.reasoning_content ?? '')).includes(text.trim()), JSON.stringify(m));
  });
});

describe('errors', () => {
  test('malformed JSON -> 400 with a message', async () => {
    for (const p of ['/v1/chat/completions', '/v1/completions', '/generate']) {
      const r = await postJSON(server.origin, p, '{"messages": [');
      assertErrorShape(r, 400, /JSON/);
    }
  });

  test('wrong types -> 400 naming the field', async () => {
    const cases = [
      [{ messages: 'hi' }, /messages/],
      [{ messages: user('x'), max_tokens: 'ten' }, /max_tokens/],
      [{ messages: user('x'), temperature: 'hot' }, /temperature/],
      [{ messages: user('x'), stream: 'yes' }, /stream/],
      [{ messages: user('x'), n: 1.5 }, /'n'/],
      [{ messages: user('x'), stop: 5 }, /stop/],
      [{ messages: user('x'), logprobs: 1 }, /logprobs/],
      [{ messages: user('x'), top_p: 0 }, /top_p/],
      [{ messages: user('x'), temperature: -1 }, /temperature/],
      [{ messages: [{ content: 'no role' }] }, /role/],
      [[1, 2, 3], /object/],
    ];
    for (const [body, re] of cases) assertErrorShape(await postJSON(server.origin, '/v1/chat/completions', body), 400, re);
    assertErrorShape(await postJSON(server.origin, '/v1/completions', { prompt: 42 }), 400, /prompt/);
    assertErrorShape(await postJSON(server.origin, '/v1/completions', { prompt: [1, 2, 10 ** 9] }), 400, /vocabulary/);
    assertErrorShape(await postJSON(server.origin, '/generate', { sampling_params: {} }), 400, /text|input_ids/);
    // Through the client: a typed BadRequestError.
    const e = await expectStatus(client.chat.completions.create({ model: 'dsv4-test', messages: user('x'), max_tokens: -3 }), 400, /max_tokens/);
    assert.ok(e instanceof OpenAI.BadRequestError);
  });

  test('wrong types in tool_choice, tool_calls, name, stream_options, logit_bias, response_format, ... -> 400', async () => {
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }];
    const call = { id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } };
    const chat = [
      [{ tools, tool_choice: { type: 'function', function: { name: 5 } } }, /tool_choice\.function\.name/],
      [{ tools, tool_choice: { type: 'function', function: 'f' } }, /tool_choice\.function/],
      [{ tools, tool_choice: 7 }, /tool_choice/],
      [{ tools: [{ type: 'function', function: { name: 3 } }] }, /tools\[0\]\.function\.name/],
      [{ tools: [{ type: 'function', function: { name: 'f', parameters: 'x' } }] }, /parameters/],
      [{ tools: [{ type: 'function' }] }, /tools\[0\]\.function/],
      [{ messages: [{ role: 'assistant', content: null, tool_calls: 'x' }, ...user('x')] }, /messages\[0\]\.tool_calls/],
      [{ messages: [{ role: 'assistant', tool_calls: [5] }, ...user('x')] }, /tool_calls\[0\]/],
      [{ messages: [{ role: 'assistant', tool_calls: [{ ...call, function: { name: 1, arguments: '{}' } }] }, ...user('x')] },
        /tool_calls\[0\]\.function\.name/],
      [{ messages: [{ role: 'assistant', tool_calls: [{ ...call, function: { name: 'f', arguments: 12 } }] }, ...user('x')] },
        /arguments/],
      [{ messages: [{ role: 'user', content: 'x', name: 5 }] }, /messages\[0\]\.name/],
      [{ messages: [{ role: 'tool', content: 'x', tool_call_id: 5 }, ...user('x')] }, /tool_call_id/],
      [{ messages: [{ role: 'user', content: 5 }] }, /messages\[0\]\.content/],
      [{ messages: [{ role: 'user', content: [{ type: 'text', text: 5 }] }] }, /content\[0\]\.text/],
      [{ messages: [{ role: 'user', content: ['x'] }] }, /content\[0\]/],
      [{ messages: [{ role: 'assistant', content: 'x', reasoning_content: 5 }, ...user('x')] }, /reasoning_content/],
      [{ stream_options: 'yes' }, /stream_options/],
      [{ stream: true, stream_options: { include_usage: 'yes' } }, /include_usage/],
      [{ logit_bias: [1, 2] }, /logit_bias/],
      [{ logit_bias: { abc: 1 } }, /logit_bias/],
      [{ logit_bias: { 10: 'x' } }, /logit_bias/],
      [{ logit_bias: { 10: 101 } }, /logit_bias.*-100 and 100/],
      [{ logit_bias: { 10: -100.5 } }, /logit_bias/],
      [{ logit_bias: { 999999999: 1 } }, /vocabulary/],
      [{ response_format: 'json' }, /response_format/],
      [{ response_format: { type: 5 } }, /response_format\.type/],
      [{ response_format: { type: 'yaml' } }, /response_format\.type/],
      [{ response_format: { type: 'json_schema', json_schema: 'x' } }, /json_schema/],
      [{ separate_reasoning: 'no' }, /separate_reasoning/],
      [{ rid: 5 }, /rid/],
      [{ rid: ['a'] }, /rid/],
      [{ model: 5 }, /model/],
      [{ chat_template_kwargs: 'thinking' }, /chat_template_kwargs/],
      [{ continue_final_message: 'yes' }, /continue_final_message/],
      [{ seed: 'x' }, /seed/],
    ];
    for (const [extra, re] of chat) {
      const r = await postJSON(server.origin, '/v1/chat/completions', { messages: user('x'), max_tokens: 1, ...extra });
      assertErrorShape(r, 400, re);
    }
    const completions = [
      [{ rid: 5 }, /rid/], [{ model: 5 }, /model/], [{ stream_options: 1 }, /stream_options/],
      [{ logit_bias: { '-1': 5 } }, /logit_bias/], [{ logit_bias: 'x' }, /logit_bias/],
      [{ response_format: 5 }, /response_format/], [{ echo: 'x' }, /echo/],
    ];
    for (const [extra, re] of completions) {
      const r = await postJSON(server.origin, '/v1/completions', { prompt: 'x', max_tokens: 1, ...extra });
      assertErrorShape(r, 400, re);
    }
    const generate = [
      [{ rid: 5 }, /rid/], [{ rid: ['a', 'b', 'c'], text: ['x', 'y'] }, /rid/], [{ rid: ['a', 5], text: ['x', 'y'] }, /rid/],
      [{ rid: ['a', 'b'] }, /rid/], [{ sampling_params: 'x' }, /sampling_params/],
      [{ sampling_params: { logit_bias: [1] } }, /logit_bias/], [{ sampling_params: { sampling_seed: 'x' } }, /sampling_seed/],
      [{ return_logprob: 'yes' }, /return_logprob/],
    ];
    for (const [extra, re] of generate) {
      const r = await postJSON(server.origin, '/generate', { text: 'x', ...extra });
      assertErrorShape(r, 400, re);
    }
    // A list of rids names the requests of a batch.
    const ok = await postJSON(server.origin, '/generate',
      { text: ['x', 'y'], rid: ['rid-a', 'rid-b'], sampling_params: { max_new_tokens: 1 } });
    assert.equal(ok.status, 200, ok.text);
    assert.deepEqual(ok.json.map((r) => r.meta_info.id), ['rid-a', 'rid-b']);
    assert.equal((await getPath(server.origin, '/health')).status, 200);
  });

  test('JSON nested deeper than 128 levels -> 400 anywhere in a body; the server lives', async () => {
    const D = 100000;
    const deepObj = '{"a":'.repeat(D) + '1' + '}'.repeat(D);
    const deepArr = '['.repeat(D) + ']'.repeat(D);
    const bodies = [
      ['/v1/chat/completions', `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":${deepObj}}}]}`],
      ['/v1/chat/completions', `{"messages":[{"role":"user","content":[{"type":"text","text":"x","extra":${deepArr}}]}]}`],
      ['/v1/chat/completions', `{"messages":[{"role":"user","content":"x","extra":${deepArr}}]}`],
      ['/v1/chat/completions', deepArr],
      ['/v1/completions', `{"prompt":"x","max_tokens":1,"x":${deepObj}}`],
      ['/generate', `{"text":"x","sampling_params":{"max_new_tokens":1,"x":${deepArr}}}`],
      ['/tokenize', `{"prompt":"x","x":${deepArr}}`],
      ['/abort_request', `{"rid":"x","x":${deepArr}}`],
    ];
    for (const [p, body] of bodies) assertErrorShape(await postJSON(server.origin, p, body), 400, /JSON nesting deeper than 128 levels/);
    // 128 levels are fine; 129 are not.
    const at = (n) => `{"prompt":"x","max_tokens":1,"x":${'['.repeat(n - 1)}${']'.repeat(n - 1)}}`;
    assert.equal((await postJSON(server.origin, '/v1/completions', at(128))).status, 200);
    assertErrorShape(await postJSON(server.origin, '/v1/completions', at(129)), 400, /nesting/);
    // Deep nesting inside a JSON string (tool-call arguments) is text, and is
    // not parsed into a deep value when rendered.
    const args = JSON.stringify('['.repeat(1000) + ']'.repeat(1000));
    const conv = `{"max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":${args}}}]},{"role":"tool","tool_call_id":"c","content":"ok"}],"tools":[{"type":"function","function":{"name":"f"}}]}`;
    const r = await postJSON(server.origin, '/v1/chat/completions', conv);
    assert.ok(r.status === 200 || r.status === 400, `status ${r.status}: ${r.text.slice(0, 200)}`);
    assert.equal((await getPath(server.origin, '/health')).status, 200);
    assert.equal((await postJSON(server.origin, '/tokenize', { prompt: 'still alive' })).status, 200);
  });

  test('max_tokens past the context -> 400 with the lengths; absent max_tokens takes what the context leaves', async () => {
    const ids = Array.from({ length: CONTEXT - 4 }, (_, i) => 1000 + (i % 500));
    const over = await postJSON(server.origin, '/v1/completions', { prompt: ids, max_tokens: 10 });
    assertErrorShape(over, 400, new RegExp(`maximum context length of ${CONTEXT} tokens: prompt has ${CONTEXT - 4} tokens, max_tokens 10`));
    assertErrorShape(await postJSON(server.origin, '/generate', { input_ids: ids, sampling_params: { max_new_tokens: 5 } }), 400,
      /max_new_tokens 5/);
    const chat = await postJSON(server.origin, '/v1/chat/completions',
      { messages: user('hello'), max_completion_tokens: CONTEXT });
    assertErrorShape(chat, 400, /maximum context length.*max_completion_tokens 1024/);
    // Exactly filling the context is fine.
    const fits = await postJSON(server.origin, '/v1/completions', { prompt: ids, max_tokens: 4, ignore_eos: true });
    assert.equal(fits.status, 200, fits.text);
    assert.equal(fits.json.usage.completion_tokens, 4);
    // No max_tokens: the default (16 here, 128 for /generate) is cut to the room left.
    const dflt = await postJSON(server.origin, '/v1/completions', { prompt: ids, ignore_eos: true });
    assert.equal(dflt.status, 200, dflt.text);
    assert.equal(dflt.json.usage.completion_tokens, 4);
    const g = await postJSON(server.origin, '/generate', { input_ids: ids, sampling_params: { ignore_eos: true } });
    assert.equal(g.status, 200, g.text);
    assert.equal(g.json.meta_info.completion_tokens, 4);
  });

  test('empty messages -> 400; empty body -> 400', async () => {
    assertErrorShape(await postJSON(server.origin, '/v1/chat/completions', { messages: [] }), 400, /messages/);
    await expectStatus(client.chat.completions.create({ model: 'dsv4-test', messages: [] }), 400, /messages/);
    assertErrorShape(await rawRequest(server.origin, 'POST', '/v1/chat/completions', Buffer.alloc(0)), 400, /empty/);
  });

  test('invalid UTF-8 -> 400', async () => {
    const body = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}]}')]);
    assertErrorShape(await postJSON(server.origin, '/v1/chat/completions', body), 400, /UTF-8/);
  });

  test('huge body (> 32 MiB) -> 413', async () => {
    const big = Buffer.alloc(33 * 1024 * 1024, 0x61);
    big.write('{"prompt":"', 0);
    const r = await postJSON(server.origin, '/v1/completions', big);
    assertErrorShape(r, 413, /too large/);
    // A declared length far past the limit (10 GB) is answered at once, not read.
    const reply = await new Promise((resolve, reject) => {
      const u = new URL(server.origin);
      const sock = net.connect(Number(u.port), u.hostname, () => {
        sock.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
                   'Content-Length: 10000000000\r\n\r\n{"prompt":"');
      });
      let text = '';
      const timer = setTimeout(() => { sock.destroy(); reject(new Error('no answer within 10 s: ' + text)); }, 10000);
      sock.on('data', (d) => { text += d; if (text.includes('\r\n\r\n') && text.includes('}')) { clearTimeout(timer); sock.destroy(); resolve(text); } });
      sock.on('error', () => {});
      sock.on('close', () => { clearTimeout(timer); resolve(text); });
    });
    assert.match(reply, /^HTTP\/1\.1 413/, reply.slice(0, 200));
    assert.match(reply, /too large/);
    // The server is still healthy.
    assert.equal((await getPath(server.origin, '/health')).status, 200);
  });

  // cpp-httplib 0.11 enforces the payload limit only for bodies with a
  // Content-Length; the server counts chunked uploads itself while reading.
  test('huge chunked body (> 32 MiB, Transfer-Encoding: chunked) -> 413', async () => {
      const r = await new Promise((resolve, reject) => {
        const u = new URL('/v1/completions', server.origin);
        const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent: false,
          headers: { 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked' } }, (res) => {
          let text = '';
          res.setEncoding('utf8');
          res.on('data', (d) => { text += d; });
          res.on('end', () => resolve({ status: res.statusCode, text }));
        });
        req.on('error', (e) => { if (!req.res) reject(e); });
        req.write('{"prompt":"');
        const piece = Buffer.alloc(1 << 20, 0x61);
        for (let i = 0; i < 33; ++i) req.write(piece);
        req.end('"}');
      });
      assert.equal(r.status, 413, r.text.slice(0, 200));
    });

  test('prompt longer than --context-length -> 400 saying how long it was', async () => {
    const prompt = wordsPrompt(CONTEXT + 200, rng(1));
    const tok = await postJSON(server.origin, '/tokenize', { prompt });
    const n = tok.json.count;
    assert.ok(n > CONTEXT);
    const e = await expectStatus(client.completions.create({ model: 'dsv4-test', prompt, max_tokens: 4 }), 400);
    assert.match(e.error.message, new RegExp(`\\b${n} tokens`), e.error.message);
    const c = await expectStatus(client.chat.completions.create({ model: 'dsv4-test', messages: user(prompt), max_tokens: 4 }), 400);
    const m = c.error.message.match(/(\d+) tokens/);
    assert.ok(m && Number(m[1]) > CONTEXT, c.error.message);
    assertErrorShape(await postJSON(server.origin, '/generate', { text: prompt }), 400, new RegExp(`\\b${n} tokens`));
    // max_tokens beyond the context is refused too.
    await expectStatus(client.completions.create({ model: 'dsv4-test', prompt: 'hi', max_tokens: CONTEXT * 4 }), 400, /context/);
  });

  test('unknown route -> 404 in the OpenAI error shape', async () => {
    assertErrorShape(await getPath(server.origin, '/v1/nothing-here'), 404);
    assertErrorShape(await postJSON(server.origin, '/v2/chat/completions', { messages: user('x') }), 404);
  });

  test('/abort_request with an unknown rid -> 404; without rid -> 400', async () => {
    assertErrorShape(await postJSON(server.origin, '/abort_request', { rid: 'no-such-request' }), 404);
    assertErrorShape(await postJSON(server.origin, '/abort_request', {}), 400);
  });
});

describe('metrics and cache', () => {
  test('/metrics has SGLang metric names and counts requests', async () => {
    const r = await getPath(server.origin, '/metrics');
    assert.equal(r.status, 200);
    for (const name of ['sglang:num_requests_total', 'sglang:prompt_tokens_total', 'sglang:generation_tokens_total',
      'sglang:num_running_reqs', 'sglang:time_to_first_token_seconds_bucket'])
      assert.ok(r.text.includes(name), `${name} in /metrics`);
    const m = r.text.match(/^sglang:num_requests_total\{[^}]*\} (\d+)/m);
    assert.ok(m && Number(m[1]) > 0);
    // Where the steps' time went: the engine's share of the process's CPU
    // (its compute threads carry its name), decode-only steps within all.
    const value = (name) => {
      const v = r.text.match(new RegExp(`^${name}\\{[^}]*\\} ([0-9.e+-]+)`, 'm'));
      assert.ok(v, `${name} in /metrics`);
      return Number(v[1]);
    };
    const cpu = value('process_cpu_seconds_total'), engine = value('dsv4:engine_cpu_seconds_total');
    assert.ok(engine > 0 && engine <= cpu, `engine CPU ${engine} s within the process's ${cpu} s`);
    assert.ok(value('dsv4:compute_threads') >= 1);
    assert.ok(value('dsv4:engine_decode_steps_total') <= value('dsv4:engine_steps_total'));
    assert.ok(value('dsv4:engine_decode_step_seconds_total') <= value('dsv4:engine_step_seconds_total'));
    assert.ok(value('dsv4:engine_decode_forward_seconds_total') <= value('dsv4:engine_decode_step_seconds_total'));
  });

  test('/flush_cache empties the prefix cache', async () => {
    await client.completions.create({ model: 'dsv4-test', prompt: 'cache me please', max_tokens: 2 });
    const again = await client.completions.create({ model: 'dsv4-test', prompt: 'cache me please', max_tokens: 2 });
    // Without --enable-cache-report the hit is not reported to the client.
    assert.equal(again.usage.prompt_tokens_details, undefined);
    const before = await getPath(server.origin, '/get_server_info');
    assert.ok(before.json.internal_states[0].prefix_cache_entries > 0, 'the prompts were cached');
    const f = await getPath(server.origin, '/flush_cache');
    assert.equal(f.status, 200, f.text);
    const info = await getPath(server.origin, '/get_server_info');
    assert.equal(info.json.internal_states[0].prefix_cache_entries, 0);
    assert.equal((await postJSON(server.origin, '/flush_cache', {})).status, 200);
  });

  test('no cached_tokens anywhere without --enable-cache-report', async () => {
    const body = { prompt: 'cache report off', max_tokens: 2 };
    await postJSON(server.origin, '/v1/completions', body);
    const r = await postJSON(server.origin, '/v1/completions', body);
    assert.equal(r.status, 200, r.text);
    assert.ok(!r.text.includes('cached_tokens'), r.text);
    const s = await sse(server.origin, '/v1/completions', { ...body, stream: true, stream_options: { include_usage: true } });
    assert.ok(s.events.at(-1).usage);
    assert.ok(!s.raw.includes('cached_tokens'));
    const c = await sse(server.origin, '/v1/chat/completions',
      { messages: user('cache report off'), max_tokens: 2, stream: true, stream_options: { include_usage: true } });
    assert.ok(c.events.at(-1).usage);
    assert.ok(!c.raw.includes('cached_tokens'));
    const g = await postJSON(server.origin, '/generate', { text: 'cache report off', sampling_params: { max_new_tokens: 2 } });
    assert.equal(g.status, 200, g.text);
    assert.equal(g.json.meta_info.cached_tokens, undefined);
    assert.equal(g.json.meta_info.prompt_tokens > 0, true);
    assert.equal((await getPath(server.origin, '/get_server_info')).json.enable_cache_report, false);
  });
});

describe('--api-key', () => {
  let secured;
  // Also the opt-in flags: --clamp-max-tokens and --enable-cache-report.
  before(async () => {
    secured = await startServer(['--api-key', 'sk-test-123', '--context-length', '512', '--clamp-max-tokens',
      '--enable-cache-report']);
  });
  const auth = { Authorization: 'Bearer sk-test-123' };
  after(async () => { await secured?.stop(); });

  test('missing or wrong key -> 401; right key works; /health stays open', async () => {
    const wrong = new OpenAI({ baseURL: secured.baseURL, apiKey: 'sk-wrong', maxRetries: 0 });
    const e = await expectStatus(wrong.models.list(), 401);
    assert.ok(e instanceof OpenAI.AuthenticationError);
    await expectStatus(wrong.chat.completions.create({ model: 'x', messages: user('hi'), max_tokens: 2 }), 401);
    assertErrorShape(await getPath(secured.origin, '/v1/models'), 401);
    assertErrorShape(await postJSON(secured.origin, '/generate', { text: 'hi' }), 401);
    const right = new OpenAI({ baseURL: secured.baseURL, apiKey: 'sk-test-123', maxRetries: 0 });
    const r = await right.chat.completions.create({ model: 'x', messages: user('hi'), max_tokens: 2 });
    assert.equal(r.usage.completion_tokens <= 2, true);
    assert.equal((await getPath(secured.origin, '/health')).status, 200);
  });

  test('a 401 leaves a kept-alive connection usable (its body is read, not left in the socket)', async () => {
    // One socket, two requests; the first one's body goes out in its own
    // segment after its headers (as Node 18's fetch sends it).
    const sock = net.connect(secured.port, '127.0.0.1');
    await new Promise((r, j) => { sock.once('connect', r); sock.once('error', j); });
    let got = '';
    sock.setEncoding('latin1');
    sock.on('data', (d) => { got += d; });
    const responses = () => got.split(/(?=HTTP\/1\.1 )/).filter((x) => x.includes('\r\n\r\n'));
    const body = JSON.stringify({ prompt: 'hello' });
    const head = (key) => `POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n` +
      `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
    sock.write(head('sk-wrong'));
    await sleep(100);
    sock.write(body);
    await waitFor(() => /\r\n\r\n\{.*\}$/s.test(got), { what: 'the 401 response' });
    assert.match(got, /^HTTP\/1\.1 401 /);
    assert.doesNotMatch(got, /Connection: close/i, 'the 401 keeps the connection open');
    sock.write(head('sk-test-123') + body);
    await waitFor(() => responses().length >= 2 && /"tokens"|"error"/.test(responses()[1]), { what: 'the second response' });
    sock.destroy();
    assert.match(responses()[1], /^HTTP\/1\.1 200 /, responses()[1]);
  });

  test('/get_server_info redacts the API key', async () => {
    const r = await getPath(secured.origin, '/get_server_info', auth);
    assert.equal(r.status, 200, r.text);
    assert.ok(!r.text.includes('sk-test-123'), 'the key is not shown');
    assert.ok(r.json.server_args.includes('--api-key=<redacted>'), JSON.stringify(r.json.server_args));
    assert.ok(r.json.server_args.includes('--context-length=512'), JSON.stringify(r.json.server_args));
    assert.equal(r.json.enable_cache_report, true);
    assert.equal(r.json.clamp_max_tokens, true);
  });

  test('--clamp-max-tokens cuts max_tokens to the context instead of a 400', async () => {
    const ids = Array.from({ length: 508 }, (_, i) => 1000 + i);
    const r = await postJSON(secured.origin, '/v1/completions', { prompt: ids, max_tokens: 100, ignore_eos: true }, auth);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.usage.completion_tokens, 4);
    assert.equal(r.json.choices[0].finish_reason, 'length');
    // Past the context length itself it is still refused.
    assertErrorShape(await postJSON(secured.origin, '/v1/completions', { prompt: 'x', max_tokens: 10000 }, auth), 400, /context/);
  });

  test('--enable-cache-report: cached_tokens in usage (also streamed) and /generate meta_info', async () => {
    const body = { prompt: 'cache report on, a longer prompt to cache', max_tokens: 2 };
    await postJSON(secured.origin, '/v1/completions', body, auth);
    const r = await postJSON(secured.origin, '/v1/completions', body, auth);
    assert.ok(r.json.usage.prompt_tokens_details.cached_tokens > 0, r.text);
    const s = await sse(secured.origin, '/v1/completions', { ...body, stream: true, stream_options: { include_usage: true } },
      { headers: auth });
    assert.ok(s.events.at(-1).usage.prompt_tokens_details.cached_tokens > 0, s.raw.slice(-400));
    const chat = { messages: user('cache report on'), max_tokens: 2 };
    await postJSON(secured.origin, '/v1/chat/completions', chat, auth);
    const c = await postJSON(secured.origin, '/v1/chat/completions', chat, auth);
    assert.ok(c.json.usage.prompt_tokens_details.cached_tokens > 0, c.text);
    const g = await postJSON(secured.origin, '/generate', { text: body.prompt, sampling_params: { max_new_tokens: 1 } }, auth);
    assert.equal(typeof g.json.meta_info.cached_tokens, 'number', g.text);
  });
});
