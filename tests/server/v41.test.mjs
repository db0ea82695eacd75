// A DeepSeek-V4.1 checkpoint through the server (a random-weight one from
// `dsv4 make-model --preset smoke-v41`): the openai client gets reasoning
// split by the deepseek-v41 parser, reasoning_effort as V4.1 takes it, tool
// calls in V4.1's spaced DSML parsed into message.tool_calls, and the same
// tokens and logprobs with DSPARK on as off.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, postJSON, dsv4Bin } from './lib.mjs';

let dir;
const servers = {};
const clients = {};

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsv4-v41-'));
  const made = spawnSync(dsv4Bin, ['make-model', '--out', dir, '--preset', 'smoke-v41'], { encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  servers.plain = await startServer(['--served-model-name', 'v41', '--grammar-max-string-chars', '12'], { model: dir });
  servers.dspark = await startServer(['--served-model-name', 'v41', '--speculative-algorithm', 'DSPARK',
    '--speculative-dspark-block-size', '5', '--disable-speculative-bypass'], { model: dir });
  servers.replay = await startServer(['--served-model-name', 'v41', '--enable-decoder-swa-bounded-replay'], { model: dir });
  for (const [k, s] of Object.entries(servers))
    clients[k] = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  for (const s of Object.values(servers)) await s.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

const user = (content) => [{ role: 'user', content }];

test('startup log names the V4.1 layout, the Engram map and the numerics', () => {
  const log = servers.plain.stderr();
  assert.match(log, /Engram token map: 129280 token ids -> 99092 classes/);
  assert.match(log, /V4\.1 layout: kv sources 0 2, index sources 0 2, candidate source 2/);
  assert.match(log, /numerics: exact/);
  assert.match(log, /bundles a DSpark head \(3 stages, block 5/);
  assert.match(servers.dspark.stderr(), /speculative decoding: DSPARK, up to 5 drafts per step/);
});

test('reasoning is split into reasoning_content; effort tiers, floats and fallbacks as V4.1 takes them', async () => {
  for (const effort of ['low', 'high', 'max', 0.5]) {
    const r = await clients.plain.chat.completions.create({
      model: 'v41', messages: user('think about it'), max_tokens: 12, reasoning_effort: effort, seed: 3 });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.ok(m.reasoning_content && m.reasoning_content.length > 0, `effort ${effort}: ${JSON.stringify(m)}`);
  }
  // OpenAI tiers V4.1 has no counterpart, and floats past 0.99, fall back to
  // the server default (high) with a warning instead of failing.
  for (const effort of ['minimal', 1.5]) {
    const r = await postJSON(servers.plain.origin, '/v1/chat/completions',
      { messages: user('hi'), max_tokens: 4, reasoning_effort: effort });
    assert.equal(r.status, 200, r.text);
    assert.match(servers.plain.stderr(), new RegExp(`reasoning_effort "?${effort}"? is not supported`));
  }
});

test('tool calls come back parsed from V4.1\'s DSML', async () => {
  const weather = { type: 'function', function: { name: 'get_weather', strict: true,
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { enum: ['c', 'f'] } },
      required: ['city', 'unit'], additionalProperties: false } } };
  const r = await clients.plain.chat.completions.create({
    model: 'v41', messages: user('weather in Paris?'), max_tokens: 400, seed: 2, tools: [weather],
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, chat_template_kwargs: { thinking: false } });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
  const args = JSON.parse(c.message.tool_calls[0].function.arguments);
  assert.equal(typeof args.city, 'string');
  assert.ok(['c', 'f'].includes(args.unit));
});

test('DSPARK gives the plain server\'s tokens and logprobs (greedy and seeded)', async () => {
  for (const params of [{ temperature: 0 }, { temperature: 0.8, top_k: 40, sampling_seed: 9 }]) {
    const body = { text: 'The quick brown fox', return_logprob: true,
      sampling_params: { max_new_tokens: 24, ignore_eos: true, ...params } };
    const plain = await postJSON(servers.plain.origin, '/generate', body);
    const spec = await postJSON(servers.dspark.origin, '/generate', body);
    assert.equal(plain.status, 200, plain.text);
    assert.equal(spec.status, 200, spec.text);
    assert.deepEqual(spec.json.output_ids, plain.json.output_ids);
    assert.deepEqual(spec.json.meta_info.output_token_logprobs, plain.json.meta_info.output_token_logprobs);
    assert.ok(spec.json.meta_info.spec_verify_ct > 0);
  }
});

test('bounded replay serves, says so, and refuses prompt logprobs', async () => {
  assert.match(servers.replay.stderr(), /bounded replay: on: prompts run layers 2-3 on their last 128 tokens only/);
  const long = 'one two three four five six seven eight nine ten '.repeat(40);
  const r = await postJSON(servers.replay.origin, '/generate',
    { text: long, sampling_params: { max_new_tokens: 8, temperature: 0, ignore_eos: true } });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.output_ids.length, 8);
  const refused = await postJSON(servers.replay.origin, '/generate',
    { text: 'hi', return_logprob: true, logprob_start_len: 0, sampling_params: { max_new_tokens: 2 } });
  assert.equal(refused.status, 400);
  assert.match(refused.text, /not available with --enable-decoder-swa-bounded-replay/);
  // A short prompt (within one window) runs every layer: the plain server's tokens.
  const body = { text: 'The quick brown fox', sampling_params: { max_new_tokens: 8, temperature: 0, ignore_eos: true } };
  const a = await postJSON(servers.replay.origin, '/generate', body);
  const b = await postJSON(servers.plain.origin, '/generate', body);
  assert.deepEqual(a.json.output_ids, b.json.output_ids);
});
