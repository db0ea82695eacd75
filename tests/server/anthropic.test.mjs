// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) driven
// by the official @anthropic-ai/sdk, and the chat route's drop_thinking
// switch. The smoke model has random weights: the tests check shapes, event
// sequences and prompt token counts, never the generated text.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

import { dsv4Bin, modelDir, postJSON, startServer } from './lib.mjs';

const CONTEXT = 2048;
const KEY = 'sk-anthropic-test';
let server;
let anthropic;
let openai;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dsv4-anthropic-'));

before(async () => {
  server = await startServer(['--context-length', String(CONTEXT), '--api-key', KEY]);
  // The SDK sends the key as x-api-key, with an anthropic-version header.
  anthropic = new Anthropic({ baseURL: server.origin, apiKey: KEY, maxRetries: 0, timeout: 120000 });
  openai = new OpenAI({ baseURL: server.baseURL, apiKey: KEY, maxRetries: 0, timeout: 120000 });
});
after(async () => {
  await server?.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const weather = {
  name: 'get_weather',
  description: 'Current weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

function checkUsage(usage) {
  assert.equal(typeof usage.input_tokens, 'number');
  assert.equal(typeof usage.output_tokens, 'number');
  assert.equal(usage.cache_read_input_tokens, 0);  // no --enable-cache-report
  assert.ok(usage.input_tokens > 0);
}

function checkMessage(m, maxTokens) {
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(typeof m.model, 'string');
  assert.ok(Array.isArray(m.content));
  assert.ok(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'].includes(m.stop_reason), m.stop_reason);
  checkUsage(m.usage);
  assert.ok(m.usage.output_tokens <= maxTokens);
  if (m.stop_reason === 'max_tokens') assert.equal(m.usage.output_tokens, maxTokens);
  if (m.stop_reason !== 'stop_sequence') assert.equal(m.stop_sequence, null);
  for (const b of m.content) {
    if (b.type === 'text') assert.equal(typeof b.text, 'string');
    else if (b.type === 'thinking') {
      assert.equal(typeof b.thinking, 'string');
      assert.equal(typeof b.signature, 'string');
    } else if (b.type === 'tool_use') {
      assert.equal(typeof b.id, 'string');
      assert.equal(typeof b.name, 'string');
      assert.equal(typeof b.input, 'object');
    } else assert.fail(`unexpected block type ${b.type}`);
  }
}

// The prompt's token count as the chat route sees it.
async function chatPromptTokens(request) {
  const r = await openai.chat.completions.create({ model: 'x', max_tokens: 1, seed: 1, ...request });
  return r.usage.prompt_tokens;
}

describe('POST /v1/messages', () => {
  test('messages.create: a message of content blocks, usage, stop_reason', async () => {
    const m = await anthropic.messages.create({
      model: 'dsv4-test', max_tokens: 8, system: 'Be brief.', temperature: 0.7, top_p: 0.9, top_k: 20,
      metadata: { user_id: 'u1' },
      messages: [{ role: 'user', content: 'Hello there' }],
    });
    checkMessage(m, 8);
    assert.equal(m.model, 'dsv4-test');
    assert.ok(!m.content.some((b) => b.type === 'thinking'), 'thinking is off unless asked');
    // The same conversation through the chat route renders the same prompt.
    const chat = await chatPromptTokens({ messages: [{ role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Hello there' }] });
    assert.equal(m.usage.input_tokens, chat);
  });

  test('system as text blocks, content as text blocks', async () => {
    const m = await anthropic.messages.create({
      model: 'x', max_tokens: 2,
      system: [{ type: 'text', text: 'Be brief.' }],
      messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello there' }] }],
    });
    checkMessage(m, 2);
  });

  test('messages.stream: the event sequence', async () => {
    const stream = anthropic.messages.stream({
      model: 'x', max_tokens: 12, messages: [{ role: 'user', content: 'Count to five' }],
      thinking: { type: 'enabled', budget_tokens: 1024 },
    });
    const events = [];
    // A copy: the SDK builds its message snapshot inside message_start's object.
    for await (const ev of stream) events.push(JSON.parse(JSON.stringify(ev)));
    const final = await stream.finalMessage();
    const types = events.map((e) => e.type);
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
    assert.equal(types.at(-2), 'message_delta');
    const start = events[0].message;
    assert.match(start.id, /^msg_/);
    assert.deepEqual(start.content, []);
    assert.equal(start.stop_reason, null);
    assert.ok(start.usage.input_tokens > 0);
    // Blocks open, get deltas of their own kind, and close, one at a time.
    let open = null;
    let next = 0;
    const deltaKind = { text: ['text_delta'], thinking: ['thinking_delta', 'signature_delta'],
      tool_use: ['input_json_delta'] };
    for (const e of events.slice(1, -2)) {
      if (e.type === 'ping') continue;
      if (e.type === 'content_block_start') {
        assert.equal(open, null);
        assert.equal(e.index, next);
        open = e.content_block.type;
      } else if (e.type === 'content_block_delta') {
        assert.notEqual(open, null);
        assert.equal(e.index, next);
        assert.ok(deltaKind[open].includes(e.delta.type), `${e.delta.type} in a ${open} block`);
      } else if (e.type === 'content_block_stop') {
        assert.equal(e.index, next);
        open = null;
        next += 1;
      } else {
        assert.fail(`unexpected event ${e.type}`);
      }
    }
    assert.equal(open, null);
    const delta = events.at(-2);
    assert.equal(delta.delta.stop_reason, final.stop_reason);
    assert.equal(delta.usage.output_tokens, final.usage.output_tokens);
    checkMessage(final, 12);
    assert.equal(final.content.length, next);
    // Thinking on: the prompt ends inside <think>, so output starts as thinking.
    if (final.content.length > 0) assert.equal(final.content[0].type, 'thinking');
  });

  test('the raw stream: named events, a ping, no [DONE]', async () => {
    const r = await fetch(`${server.origin}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ model: 'x', max_tokens: 3, stream: true, messages: [{ role: 'user', content: 'Hi' }] }),
    });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/event-stream/);
    const text = await r.text();
    assert.ok(text.startsWith('event: message_start\ndata: {"type":"message_start"'), text.slice(0, 80));
    assert.match(text, /event: ping\ndata: \{"type":"ping"\}\n\n/);
    assert.ok(text.endsWith('event: message_stop\ndata: {"type":"message_stop"}\n\n'), text.slice(-80));
    assert.ok(!text.includes('[DONE]'));
    for (const frame of text.trim().split('\n\n')) {
      const [ev, data] = frame.split('\n');
      assert.equal(JSON.parse(data.slice('data: '.length)).type, ev.slice('event: '.length));
    }
  });

  test('thinking enabled and disabled', async () => {
    const base = { model: 'x', max_tokens: 6, messages: [{ role: 'user', content: 'Why is the sky blue?' }] };
    const on = await anthropic.messages.create({ ...base, thinking: { type: 'enabled', budget_tokens: 2048 } });
    checkMessage(on, 6);
    if (on.content.length > 0) assert.equal(on.content[0].type, 'thinking');
    const off = await anthropic.messages.create({ ...base, thinking: { type: 'disabled' } });
    checkMessage(off, 6);
    assert.ok(!off.content.some((b) => b.type === 'thinking'));
    assert.equal(on.usage.input_tokens, await chatPromptTokens({ messages: base.messages,
      chat_template_kwargs: { thinking: true } }));
  });

  test('tools and tool_result over two turns', async () => {
    const turn1 = { role: 'user', content: 'Weather in Paris?' };
    const first = await anthropic.messages.create({
      model: 'x', max_tokens: 8, tools: [weather], tool_choice: { type: 'auto' }, messages: [turn1],
    });
    checkMessage(first, 8);
    for (const choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }, { type: 'none' }]) {
      checkMessage(await anthropic.messages.create({
        model: 'x', max_tokens: 2, tools: [weather], tool_choice: choice, messages: [turn1],
      }), 2);
    }
    // The client runs the tool and sends the result back.
    const history = [
      turn1,
      { role: 'assistant', content: [{ type: 'text', text: 'Let me check.' },
        { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Paris' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: '18 C, clear' },
        { type: 'text', text: 'And tomorrow?' }] },
    ];
    const second = await anthropic.messages.create({ model: 'x', max_tokens: 8, tools: [weather], messages: history });
    checkMessage(second, 8);
    // The same conversation in OpenAI's shape renders the same prompt.
    const chat = await chatPromptTokens({
      tools: [{ type: 'function', function: { name: weather.name, description: weather.description,
        parameters: weather.input_schema } }],
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: 'Let me check.', tool_calls: [{ id: 'toolu_01', type: 'function',
          function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'toolu_01', content: '18 C, clear' },
        { role: 'user', content: 'And tomorrow?' },
      ],
    });
    assert.equal(second.usage.input_tokens, chat);
    const count = await anthropic.messages.countTokens({ model: 'x', tools: [weather], messages: history });
    assert.equal(count.input_tokens, chat);
  });

  test('stop_sequences and max_tokens', async () => {
    const m = await anthropic.messages.create({
      model: 'x', max_tokens: 3, stop_sequences: ['\n\n', 'END'], messages: [{ role: 'user', content: 'Hi' }],
    });
    checkMessage(m, 3);
    assert.ok(['max_tokens', 'stop_sequence', 'end_turn'].includes(m.stop_reason));
    if (m.stop_reason === 'stop_sequence') assert.ok(['\n\n', 'END'].includes(m.stop_sequence));
  });

  test('thinking blocks sent back keep the history reasoning (drop_thinking false)', async () => {
    const messages = (withThinking) => [
      { role: 'user', content: 'q1' },
      { role: 'assistant', content: [
        ...(withThinking ? [{ type: 'thinking', thinking: 'Some earlier reasoning here.', signature: 'sig' }] : []),
        { type: 'text', text: 'a1' }] },
      { role: 'user', content: 'q2' },
    ];
    const thinking = { type: 'enabled', budget_tokens: 1024 };
    const kept = await anthropic.messages.countTokens({ model: 'x', thinking, messages: messages(true) });
    const dropped = await anthropic.messages.countTokens({ model: 'x', thinking, messages: messages(false) });
    assert.ok(kept.input_tokens > dropped.input_tokens + 3, `${kept.input_tokens} vs ${dropped.input_tokens}`);
    const chat = await chatPromptTokens({ drop_thinking: false, chat_template_kwargs: { thinking: true },
      messages: [{ role: 'user', content: 'q1' },
        { role: 'assistant', reasoning_content: 'Some earlier reasoning here.', content: 'a1' },
        { role: 'user', content: 'q2' }] });
    assert.equal(kept.input_tokens, chat);
  });

  test('a final assistant turn is a prefill', async () => {
    const m = await anthropic.messages.create({ model: 'x', max_tokens: 2, messages: [
      { role: 'user', content: 'Say hi' }, { role: 'assistant', content: 'Hi' }] });
    checkMessage(m, 2);
  });
});

describe('POST /v1/messages/count_tokens', () => {
  test('counts the rendered prompt', async () => {
    const r = await anthropic.messages.countTokens({ model: 'x', system: 'Be brief.',
      messages: [{ role: 'user', content: 'Hello there' }] });
    assert.deepEqual(Object.keys(r), ['input_tokens']);
    const chat = await chatPromptTokens({ messages: [{ role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Hello there' }] });
    assert.equal(r.input_tokens, chat);
  });
});

describe('Anthropic errors', () => {
  const image = { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } };

  test('an image block is refused with a 400 in Anthropic\'s shape', async () => {
    await assert.rejects(
      anthropic.messages.create({ model: 'x', max_tokens: 4,
        messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, image] }] }),
      (err) => {
        assert.ok(err instanceof Anthropic.BadRequestError, String(err));
        assert.equal(err.status, 400);
        assert.equal(err.error.type, 'error');
        assert.equal(err.error.error.type, 'invalid_request_error');
        assert.match(err.error.error.message, /image/);
        return true;
      });
    await assert.rejects(anthropic.messages.countTokens({ model: 'x', messages: [{ role: 'user', content: [image] }] }),
      Anthropic.BadRequestError);
  });

  test('missing max_tokens, bad fields, a wrong key', async () => {
    const r = await postJSON(server.origin, '/v1/messages', { model: 'x', messages: [{ role: 'user', content: 'hi' }] },
      { 'x-api-key': KEY, 'anthropic-version': '2023-06-01' });
    assert.equal(r.status, 400);
    assert.equal(r.json.type, 'error');
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, /max_tokens/);
    for (const body of [
      { max_tokens: 4, messages: [{ role: 'system', content: 'hi' }] },
      { max_tokens: 4, messages: [] },
      { max_tokens: 4, messages: [{ role: 'user', content: 'hi' }], thinking: { type: 'sometimes' } },
      { max_tokens: 4, messages: [{ role: 'user', content: 'hi' }], tool_choice: { type: 'tool', name: 'nope' },
        tools: [weather] },
      { max_tokens: 0, messages: [{ role: 'user', content: 'hi' }] },
    ]) {
      const e = await postJSON(server.origin, '/v1/messages', body, { 'x-api-key': KEY });
      assert.equal(e.status, 400, JSON.stringify(body));
      assert.equal(e.json.error.type, 'invalid_request_error');
    }
    const bad = new Anthropic({ baseURL: server.origin, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.messages.countTokens({ model: 'x', messages: [{ role: 'user', content: 'hi' }] }),
      (err) => err instanceof Anthropic.AuthenticationError && err.error.error.type === 'authentication_error');
  });
});

// The chat route's drop_thinking switch (request level or chat_template_kwargs).
describe('drop_thinking on /v1/chat/completions', () => {
  const messages = [
    { role: 'user', content: 'q1' },
    { role: 'assistant', reasoning_content: 'Some earlier reasoning here.', content: 'a1' },
    { role: 'user', content: 'q2' },
  ];

  function renderIds(request) {
    const file = path.join(tmp, `req-${Math.random().toString(36).slice(2)}.json`);
    fs.writeFileSync(file, JSON.stringify(request));
    return JSON.parse(execFileSync(dsv4Bin, ['render', '--ids', '--model', modelDir, '--request', file,
      '--semantics', 'sglang', '--no-special-tokens-in-content'], { encoding: 'utf8' }));
  }

  test('false keeps the earlier reasoning in the prompt', async () => {
    const base = { messages, chat_template_kwargs: { thinking: true } };
    const dropped = await chatPromptTokens(base);
    const kept = await chatPromptTokens({ ...base, drop_thinking: false });
    const keptKwargs = await chatPromptTokens({ messages, chat_template_kwargs: { thinking: true, drop_thinking: false } });
    assert.ok(kept > dropped + 3, `${kept} vs ${dropped}`);
    assert.equal(keptKwargs, kept);
    assert.equal(kept, renderIds({ ...base, drop_thinking: false }).length);
    assert.equal(dropped, renderIds(base).length);
    const bad = await postJSON(server.origin, '/v1/chat/completions', { ...base, drop_thinking: 'no', max_tokens: 1 },
      { authorization: `Bearer ${KEY}` });
    assert.equal(bad.status, 400);
  });
});
