// OpenAI's Responses API (/v1/responses and /v1/responses/{id}) driven by the
// official openai client. The smoke model has random weights: the tests check
// shapes, event sequences, the store and prompt token counts (a request's
// prompt against the same conversation sent to the chat route), never the
// generated text.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';

import { getPath, postJSON, rawRequest, sse, startServer } from './lib.mjs';

const CONTEXT = 2048;
let server;
let client;

before(async () => {
  server = await startServer(['--context-length', String(CONTEXT)]);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  await server?.stop();
});

const weather = {
  type: 'function',
  name: 'get_weather',
  description: 'Current weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  strict: false,
};
const chatWeather = {
  type: 'function',
  function: { name: weather.name, description: weather.description, parameters: weather.parameters, strict: false },
};

// The prompt's token count as the chat route sees it.
async function chatPromptTokens(request) {
  const r = await client.chat.completions.create({ model: 'x', max_tokens: 1, seed: 1, ...request });
  return r.usage.prompt_tokens;
}

function checkResponse(r, maxTokens) {
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(typeof r.created_at, 'number');
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  assert.equal(r.error, null);
  assert.equal(r.background, false);
  assert.ok(Array.isArray(r.output));
  const u = r.usage;
  assert.ok(u.input_tokens > 0);
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  assert.equal(u.input_tokens_details.cached_tokens, 0);  // no --enable-cache-report
  assert.ok(u.output_tokens_details.reasoning_tokens <= u.output_tokens);
  if (maxTokens !== undefined) assert.ok(u.output_tokens <= maxTokens);
  if (r.status === 'incomplete') assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  else assert.equal(r.incomplete_details, null);
  const itemStatus = r.status === 'incomplete' ? 'incomplete' : 'completed';
  for (const item of r.output) {
    assert.equal(item.status, itemStatus);
    if (item.type === 'message') {
      assert.match(item.id, /^msg_/);
      assert.equal(item.role, 'assistant');
      assert.equal(item.content.length, 1);
      assert.equal(item.content[0].type, 'output_text');
      assert.equal(typeof item.content[0].text, 'string');
      assert.deepEqual(item.content[0].annotations, []);
    } else if (item.type === 'reasoning') {
      assert.match(item.id, /^rs_/);
      assert.deepEqual(item.summary, []);
      for (const part of item.content) assert.equal(part.type, 'reasoning_text');
    } else if (item.type === 'function_call') {
      assert.match(item.id, /^fc_/);
      assert.equal(typeof item.call_id, 'string');
      assert.equal(typeof item.name, 'string');
      assert.equal(typeof item.arguments, 'string');
    } else {
      assert.fail(`unexpected output item ${item.type}`);
    }
  }
}

// Checks the typed event sequence of one stream and returns the final
// response (from response.completed / response.incomplete).
function checkEvents(events) {
  const types = events.map((e) => e.type);
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.at(-1));
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  assert.equal(events[0].response.status, 'in_progress');
  assert.deepEqual(events[0].response.output, []);
  const final = events.at(-1).response;
  // Items open, carry their own kind of deltas, and close, one at a time.
  let open = null;
  let text = '';
  let outputIndex = 0;
  const texts = [];
  const deltaOf = { message: 'response.output_text.delta', reasoning: 'response.reasoning_text.delta',
    function_call: 'response.function_call_arguments.delta' };
  for (const e of events.slice(2, -1)) {
    if (e.type === 'response.output_item.added') {
      assert.equal(open, null);
      assert.equal(e.output_index, outputIndex);
      assert.equal(e.item.status, 'in_progress');
      open = e.item;
      text = '';
      continue;
    }
    assert.notEqual(open, null, `${e.type} outside an item`);
    assert.equal(e.output_index, outputIndex);
    if (e.type !== 'response.output_item.done') assert.equal(e.item_id, open.id);
    if (e.type === deltaOf[open.type]) text += e.delta;
    else if (e.type === 'response.output_item.done') {
      assert.equal(e.item.id, open.id);
      assert.deepEqual(e.item, final.output[outputIndex]);
      texts.push(text);
      open = null;
      outputIndex += 1;
    } else if (e.type === 'response.output_text.done' || e.type === 'response.reasoning_text.done') {
      assert.equal(e.text, text);
    } else if (e.type === 'response.function_call_arguments.done') {
      assert.equal(e.arguments, text);
    } else {
      assert.ok(['response.content_part.added', 'response.content_part.done'].includes(e.type), e.type);
      assert.notEqual(open.type, 'function_call');
    }
  }
  assert.equal(open, null);
  assert.equal(final.output.length, outputIndex);
  // The deltas concatenate to the final items' text.
  final.output.forEach((item, i) => {
    if (item.type === 'message') assert.equal(item.content[0].text, texts[i]);
    if (item.type === 'reasoning') assert.equal(item.content.map((p) => p.text).join(''), texts[i]);
    if (item.type === 'function_call') assert.equal(item.arguments, texts[i]);
  });
  return final;
}

async function expectStatus(promise, status, pattern) {
  await assert.rejects(promise, (e) => {
    assert.equal(e.status, status, e.message);
    if (pattern) assert.match(e.message, pattern);
    return true;
  });
}

describe('POST /v1/responses', () => {
  test('responses.create: output items, usage, the echoed request', async () => {
    const r = await client.responses.create({
      model: 'dsv4-test', input: 'Hello there', max_output_tokens: 8, temperature: 0.7, top_p: 0.9,
      metadata: { purpose: 'test' }, parallel_tool_calls: false,
    });
    checkResponse(r, 8);
    assert.equal(r.model, 'dsv4-test');
    assert.equal(r.temperature, 0.7);
    assert.equal(r.top_p, 0.9);
    assert.equal(r.max_output_tokens, 8);
    assert.equal(r.parallel_tool_calls, false);
    assert.deepEqual(r.metadata, { purpose: 'test' });
    assert.equal(r.store, true);
    assert.equal(r.previous_response_id, null);
    assert.deepEqual(r.text, { format: { type: 'text' } });
    assert.equal(typeof r.output_text, 'string');  // the SDK's join of the message items
    assert.equal(r.usage.input_tokens, await chatPromptTokens({ messages: [{ role: 'user', content: 'Hello there' }] }));
  });

  test('instructions are a system message, and are echoed', async () => {
    const r = await client.responses.create({ model: 'x', instructions: 'Be brief.', input: 'Hello there',
      max_output_tokens: 2 });
    checkResponse(r, 2);
    assert.equal(r.instructions, 'Be brief.');
    assert.equal(r.usage.input_tokens, await chatPromptTokens({ messages: [{ role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Hello there' }] }));
  });

  test('input items: messages with input_text parts, developer role, assistant output_text', async () => {
    const r = await client.responses.create({
      model: 'x', max_output_tokens: 2,
      input: [
        { role: 'developer', content: 'Answer in French.' },
        { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hi' }, { type: 'input_text', text: 'there' }] },
        { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Bonjour', annotations: [] }] },
        { role: 'user', content: 'How are you?' },
      ],
    });
    checkResponse(r, 2);
    assert.equal(r.usage.input_tokens, await chatPromptTokens({ messages: [
      { role: 'developer', content: 'Answer in French.' }, { role: 'user', content: 'Hi\n\nthere' },
      { role: 'assistant', content: 'Bonjour' }, { role: 'user', content: 'How are you?' }] }));
  });

  test('tools, tool_choice, and function_call + function_call_output over two turns', async () => {
    const first = await client.responses.create({
      model: 'x', max_output_tokens: 8, tools: [weather], tool_choice: 'auto', input: 'Weather in Paris?',
    });
    checkResponse(first, 8);
    assert.equal(first.tools[0].name, 'get_weather');
    for (const choice of ['required', 'none', { type: 'function', name: 'get_weather' }]) {
      const r = await client.responses.create({ model: 'x', max_output_tokens: 2, tools: [weather],
        tool_choice: choice, input: 'Weather in Paris?' });
      checkResponse(r, 2);
      assert.deepEqual(r.tool_choice, choice);
    }
    // The client ran the tool and sends the call and its output back.
    const second = await client.responses.create({
      model: 'x', max_output_tokens: 4, tools: [weather],
      input: [
        { role: 'user', content: 'Weather in Paris?' },
        { type: 'function_call', call_id: 'call_01', name: 'get_weather', arguments: '{"city":"Paris"}' },
        { type: 'function_call_output', call_id: 'call_01', output: '18 C, clear' },
      ],
    });
    checkResponse(second, 4);
    assert.equal(second.usage.input_tokens, await chatPromptTokens({
      tools: [chatWeather],
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: '', tool_calls: [{ id: 'call_01', type: 'function',
          function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_01', content: '18 C, clear' },
      ] }));
  });

  test('reasoning effort: thinking on, echoed; none: thinking off', async () => {
    const input = 'Why is the sky blue?';
    const on = await client.responses.create({ model: 'x', input, reasoning: { effort: 'high' }, max_output_tokens: 6 });
    checkResponse(on, 6);
    assert.equal(on.reasoning.effort, 'high');
    // Thinking on: the prompt ends inside <think>, so output starts as reasoning.
    if (on.output.length > 0) assert.equal(on.output[0].type, 'reasoning');
    if (on.output.some((i) => i.type === 'reasoning')) assert.ok(on.usage.output_tokens_details.reasoning_tokens > 0);
    assert.equal(on.usage.input_tokens, await chatPromptTokens({ messages: [{ role: 'user', content: input }],
      chat_template_kwargs: { thinking: true }, reasoning_effort: 'high' }));
    const off = await client.responses.create({ model: 'x', input, reasoning: { effort: 'none' }, max_output_tokens: 4 });
    checkResponse(off, 4);
    assert.ok(!off.output.some((i) => i.type === 'reasoning'));
    for (const effort of ['low', 'medium', 'minimal', 'xhigh']) {
      checkResponse(await client.responses.create({ model: 'x', input, reasoning: { effort, summary: 'auto' },
        max_output_tokens: 1 }), 1);
    }
  });

  test('text.format: text, json_object and json_schema are accepted and echoed', async () => {
    const schema = { type: 'json_schema', name: 'answer', strict: true,
      schema: { type: 'object', properties: { a: { type: 'string' } }, required: ['a'], additionalProperties: false } };
    for (const format of [{ type: 'text' }, { type: 'json_object' }, schema]) {
      const r = await client.responses.create({ model: 'x', input: 'Reply in JSON', text: { format },
        max_output_tokens: 2 });
      checkResponse(r, 2);
      assert.deepEqual(r.text.format, format);
    }
  });

  test('max_output_tokens: status incomplete, incomplete_details', async () => {
    const r = await client.responses.create({ model: 'x', input: 'Tell me a long story', max_output_tokens: 3 });
    checkResponse(r, 3);
    // Random weights: an end-of-text token within 3 steps is possible, if unlikely.
    if (r.usage.output_tokens === 3) assert.equal(r.status, 'incomplete');
  });
});

describe('streaming', () => {
  test('stream: true: the typed events in order, deltas concatenate to the final items', async () => {
    const stream = await client.responses.create({ model: 'x', input: 'Count to five', max_output_tokens: 12,
      stream: true });
    const events = [];
    for await (const e of stream) events.push(e);
    const final = checkEvents(events);
    checkResponse(final, 12);
    // A streamed response is stored like a whole one.
    const stored = await client.responses.retrieve(final.id);
    assert.deepEqual(stored.output, final.output);
    assert.deepEqual(stored.usage, final.usage);
  });

  test('stream with reasoning: reasoning_text events before the message', async () => {
    const stream = await client.responses.create({ model: 'x', input: 'Why?', reasoning: { effort: 'high' },
      max_output_tokens: 10, stream: true });
    const events = [];
    for await (const e of stream) events.push(e);
    const final = checkEvents(events);
    checkResponse(final, 10);
    if (final.output.length > 0) {
      assert.equal(final.output[0].type, 'reasoning');
      const types = events.map((e) => e.type);
      assert.ok(types.includes('response.reasoning_text.delta'));
      const added = events.find((e) => e.type === 'response.content_part.added');
      assert.deepEqual(added.part, { type: 'reasoning_text', text: '' });
    }
  });

  test('the SDK stream helper accepts the events; max_output_tokens gives response.incomplete', async () => {
    const stream = client.responses.stream({ model: 'x', input: 'Tell me a long story', max_output_tokens: 4 });
    const events = [];
    for await (const e of stream) events.push(e);
    const final = await stream.finalResponse();
    checkEvents(events);
    checkResponse(final, 4);
    if (final.usage.output_tokens === 4) {
      assert.equal(events.at(-1).type, 'response.incomplete');
      assert.equal(final.status, 'incomplete');
    }
  });

  test('an aborted request ends its stream with error and response.failed', async () => {
    let aborted;
    const s = await sse(server.origin, '/v1/responses', { model: 'x', input: 'Go on forever', stream: true,
      max_output_tokens: CONTEXT - 64 }, { onEvent: (e) => {
      // SGLang's /abort_request takes the response id as its rid.
      if (e.type === 'response.created') aborted = postJSON(server.origin, '/abort_request', { rid: e.response.id });
    } });
    assert.equal(s.status, 200);
    assert.equal((await aborted).status, 200);
    const types = s.events.map((e) => e.type);
    assert.equal(types.at(-2), 'error');
    assert.match(s.events.at(-2).message, /aborted/);
    assert.equal(types.at(-1), 'response.failed');
    assert.equal(s.events.at(-1).response.status, 'failed');
    assert.match(s.events.at(-1).response.error.message, /aborted/);
  });

  test('the raw stream: named events, no [DONE]', async () => {
    const r = await fetch(`${server.baseURL}/responses`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'x', input: 'Hi', max_output_tokens: 3, stream: true }),
    });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/event-stream/);
    const text = await r.text();
    assert.ok(text.startsWith('event: response.created\ndata: {"type":"response.created"'), text.slice(0, 80));
    assert.ok(!text.includes('[DONE]'));
    for (const frame of text.trim().split('\n\n')) {
      if (frame.startsWith(':')) continue;  // keep-alive comment
      const [ev, data] = frame.split('\n');
      assert.equal(JSON.parse(data.slice('data: '.length)).type, ev.slice('event: '.length));
    }
  });
});

describe('stored responses', () => {
  test('previous_response_id continues the stored conversation, without its instructions', async () => {
    const first = await client.responses.create({ model: 'x', instructions: 'Be brief.', input: 'Hello',
      max_output_tokens: 4 });
    checkResponse(first, 4);
    const second = await client.responses.create({ model: 'x', previous_response_id: first.id, input: 'And then?',
      max_output_tokens: 2 });
    checkResponse(second, 2);
    assert.equal(second.previous_response_id, first.id);
    assert.equal(second.instructions, null);
    // The same turns sent as items: the first input, its output items (an
    // empty assistant turn when it said nothing), the new input.
    const turn = first.output.filter((i) => i.type !== 'reasoning');
    if (turn.length === 0) turn.push({ role: 'assistant', content: '' });
    const spelled = await client.responses.create({ model: 'x', max_output_tokens: 1,
      input: [{ role: 'user', content: 'Hello' }, ...turn, { role: 'user', content: 'And then?' }] });
    assert.equal(second.usage.input_tokens, spelled.usage.input_tokens);
    // Chains go on: the third turn sees both earlier ones.
    const third = await client.responses.create({ model: 'x', previous_response_id: second.id, input: 'Go on.',
      max_output_tokens: 1 });
    assert.ok(third.usage.input_tokens > second.usage.input_tokens);
  });

  test('retrieve returns the stored response; delete removes it', async () => {
    const r = await client.responses.create({ model: 'x', input: 'Keep me', max_output_tokens: 2 });
    const got = await client.responses.retrieve(r.id);
    assert.equal(got.id, r.id);
    assert.equal(got.status, r.status);
    assert.deepEqual(got.output, r.output);
    assert.deepEqual(got.usage, r.usage);
    await client.responses.delete(r.id);
    await expectStatus(client.responses.retrieve(r.id), 404, /no stored response/);
    await expectStatus(client.responses.delete(r.id), 404);
    await expectStatus(client.responses.create({ model: 'x', input: 'x', previous_response_id: r.id }), 400,
      /previous_response_id/);
  });

  test('store: false is not retrievable and cannot be continued', async () => {
    const r = await client.responses.create({ model: 'x', input: 'Forget me', store: false, max_output_tokens: 2 });
    checkResponse(r, 2);
    assert.equal(r.store, false);
    await expectStatus(client.responses.retrieve(r.id), 404);
    await expectStatus(client.responses.create({ model: 'x', input: 'x', previous_response_id: r.id }), 400,
      /previous_response_id/);
  });

  test('cancel: only background responses can be cancelled', async () => {
    const r = await client.responses.create({ model: 'x', input: 'Hi', max_output_tokens: 1 });
    await expectStatus(client.responses.cancel(r.id), 400, /background/);
    await expectStatus(client.responses.cancel('resp_unknown'), 404);
  });
});

describe('refusals and errors', () => {
  test('background: true is a 400', async () => {
    await expectStatus(client.responses.create({ model: 'x', input: 'Hi', background: true }), 400, /background/);
  });

  test('bad fields are 400s in OpenAI\'s error shape, naming the field', async () => {
    const cases = [
      [{ input: 5 }, /'input'/],
      [{}, /'input' is required/],
      [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] }, /text only/],
      [{ input: [{ role: 'robot', content: 'Hi' }] }, /input\[0\]\.role/],
      [{ input: [{ type: 'function_call', name: 'f', arguments: '{}' }] }, /input\[0\]\.call_id/],
      [{ input: [{ type: 'web_search_call', id: 'w' }] }, /input\[0\]\.type/],
      [{ input: 'Hi', tools: [{ type: 'web_search' }] }, /tools\[0\]\.type/],
      [{ input: 'Hi', tools: [{ type: 'function', name: 'f', parameters: 'x' }] }, /tools\[0\]\.parameters/],
      [{ input: 'Hi', tools: [weather], tool_choice: { type: 'function', name: 'nope' } }, /nope/],
      [{ input: 'Hi', tool_choice: 'sometimes' }, /tool_choice/],
      [{ input: 'Hi', reasoning: { effort: 'extreme' } }, /reasoning\.effort/],
      [{ input: 'Hi', text: { format: { type: 'json_schema', name: 'a' } } }, /text\.format\.schema/],
      [{ input: 'Hi', text: { format: { type: 'yaml' } } }, /text\.format\.type/],
      [{ input: 'Hi', max_output_tokens: 0 }, /max_output_tokens/],
      [{ input: 'Hi', max_output_tokens: CONTEXT * 2 }, /max_output_tokens/],
      [{ input: 'Hi', temperature: 'hot' }, /temperature/],
      [{ input: 'Hi', metadata: { a: 1 } }, /metadata/],
      [{ input: 'Hi', truncation: 'auto' }, /truncation/],
      [{ input: 'Hi', include: ['message.output_text.logprobs'] }, /include\[0\]/],
      [{ input: 'Hi', previous_response_id: 'resp_missing' }, /previous_response_id/],
      [{ input: 'Hi', conversation: 'conv_1' }, /conversation/],
      [{ input: 'Hi', store: 'yes' }, /store/],
    ];
    for (const [body, pattern] of cases) {
      const r = await postJSON(server.origin, '/v1/responses', { model: 'x', ...body });
      assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
      assert.equal(typeof r.json.error.message, 'string');
      assert.match(r.json.error.message, pattern, JSON.stringify(body));
    }
  });

  test('routes: unknown ids, sub-paths and methods', async () => {
    assert.equal((await getPath(server.origin, '/v1/responses/resp_nope')).status, 404);
    assert.equal((await getPath(server.origin, '/v1/responses/resp_nope/input_items')).status, 404);
    assert.equal((await rawRequest(server.origin, 'DELETE', '/v1/responses/resp_nope')).status, 404);
    assert.equal((await postJSON(server.origin, '/v1/responses/resp_nope/other', {})).status, 404);
    assert.equal((await getPath(server.origin, '/v1/responses')).status, 405);
    const r = await client.responses.create({ model: 'x', input: 'Hi', max_output_tokens: 1 });
    assert.equal((await getPath(server.origin, `/v1/responses/${r.id}?stream=true`)).status, 400);
  });
});

describe('--responses-store-size, --enable-cache-report', () => {
  test('the store keeps the most recently used responses; cached_tokens with the cache report', async () => {
    const small = await startServer(['--context-length', '512', '--responses-store-size', '2', '--enable-cache-report']);
    try {
      const c = new OpenAI({ baseURL: small.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
      const ids = [];
      for (let i = 0; i < 3; ++i) ids.push((await c.responses.create({ model: 'x', input: `Hi ${i}`,
        max_output_tokens: 1 })).id);
      await expectStatus(c.responses.retrieve(ids[0]), 404);
      assert.equal((await c.responses.retrieve(ids[1])).id, ids[1]);
      // ids[1] was used last: the next one evicts ids[2].
      await c.responses.create({ model: 'x', input: 'Hi 3', max_output_tokens: 1 });
      assert.equal((await c.responses.retrieve(ids[1])).id, ids[1]);
      await expectStatus(c.responses.retrieve(ids[2]), 404);
      // The same prompt again: its prefix comes from the cache.
      const body = { model: 'x', instructions: 'A longer prompt, to be cached.', input: 'Hello', max_output_tokens: 1 };
      await c.responses.create(body);
      const again = await c.responses.create(body);
      assert.ok(again.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(again.usage));
      assert.ok(again.usage.input_tokens_details.cached_tokens <= again.usage.input_tokens);
    } finally {
      await small.stop();
    }
  });
});
