// The prefix cache (docs/hicache.md) through `dsv4 serve` and the official
// `openai` client: a restarted server reuses the storage tier (L3) with the
// same tokens and logprobs as a cold run, a damaged L3 record is dropped,
// counted and never changes an answer, and 64 concurrent clients under a
// tiny cache budget all get exact answers.
// Run: node --test tests/server/hicache.test.mjs   (see tests/server/README.md)
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';

import { getPath, metricValue, rng, startServer, waitFor, wordsPrompt } from './lib.mjs';

// Small pages and checkpoint spacing so that prompts of a few hundred tokens
// of the smoke model make many records and checkpoints inside prompts.
const CACHE_ARGS = ['--context-length', '2048', '--chunked-prefill-size', '256', '--enable-cache-report',
  '--page-size', '32', '--hicache-checkpoint-interval', '64'];
const storageArgs = (dir) => ['--enable-hierarchical-cache', '--hicache-storage-backend', 'file',
  '--hicache-storage-dir', dir, '--hicache-storage-prefetch-policy', 'wait_complete'];

const clientOf = (server) => new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });

// One greedy chat turn; the answer as text plus [token, logprob] pairs.
async function turn(client, messages, maxTokens = 6) {
  const r = await client.chat.completions.create({
    model: 'm', messages, max_tokens: maxTokens, temperature: 0, ignore_eos: true, logprobs: true,
    chat_template_kwargs: { thinking: false },
  });
  const c = r.choices[0];
  return {
    content: c.message.content ?? '',
    logprobs: c.logprobs.content.map((x) => [x.token, x.logprob]),
    prompt: r.usage.prompt_tokens,
    cached: r.usage.prompt_tokens_details?.cached_tokens,
  };
}
const same = (got, want, where) => {
  assert.equal(got.content, want.content, `${where}: text`);
  assert.deepEqual(got.logprobs, want.logprobs, `${where}: tokens and logprobs`);
};

async function metricsText(server) {
  return (await getPath(server.origin, '/metrics')).text;
}
const sampleOf = (text, name, label = '') => {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(label));
  assert.ok(line, `metric ${name}${label} in /metrics`);
  return Number(line.slice(line.lastIndexOf(' ') + 1));
};

// A two-turn conversation with a shared system prompt: the second turn
// resends the first with the answer.
const rand = rng(14);
const SYSTEM = `You are a careful agent. ${wordsPrompt(260, rand)}`;
const conversation = [{ role: 'system', content: SYSTEM }, { role: 'user', content: wordsPrompt(60, rand) }];
const FOLLOW_UP = wordsPrompt(40, rand);

describe('storage tier across a restart', () => {
  let dir;
  const cold = {};  // answers of the first server, which starts with an empty cache
  let records = 0;

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsv4-hicache-'));
    const server = await startServer([...CACHE_ARGS, ...storageArgs(path.join(dir, 'l3'))]);
    try {
      const client = clientOf(server);
      cold.first = await turn(client, conversation);
      assert.equal(cold.first.cached, 0, 'an empty cache serves nothing');
      cold.second = await turn(client, [...conversation, { role: 'assistant', content: cold.first.content },
        { role: 'user', content: FOLLOW_UP }]);
      assert.ok(cold.second.cached > 0, 'the second turn reuses the first from memory');
      // write_through queues every part for L3; wait until the writes settle.
      let last = -1;
      await waitFor(async () => {
        const n = await metricValue(server.origin, 'dsv4:hicache_storage_writes_total');
        const settled = n > 0 && n === last;
        last = n;
        return settled;
      }, { timeoutMs: 20000, intervalMs: 300, what: 'L3 writes to settle' });
      records = await metricValue(server.origin, 'dsv4:hicache_storage_records');
    } finally {
      await server.stop();
    }
    assert.ok(records > 0, 'records on disk');
    // A second copy of the directory with every record damaged.
    fs.cpSync(path.join(dir, 'l3'), path.join(dir, 'l3-flipped'), { recursive: true });
    for (const name of fs.readdirSync(path.join(dir, 'l3-flipped'))) {
      const p = path.join(dir, 'l3-flipped', name);
      const buf = fs.readFileSync(p);
      for (const at of [buf.length >> 1, buf.length - 3]) buf[at] ^= 0x5a;  // payload bytes, not the header
      fs.writeFileSync(p, buf);
    }
  });
  after(() => { if (dir) fs.rmSync(dir, { recursive: true, force: true }); });

  test('a restarted server serves the same tokens and logprobs from L3', async () => {
    const server = await startServer([...CACHE_ARGS, ...storageArgs(path.join(dir, 'l3'))]);
    try {
      const client = clientOf(server);
      const first = await turn(client, conversation);
      assert.ok(first.cached > 0, `cached_tokens ${first.cached} after a restart`);
      same(first, cold.first, 'first turn from L3');
      const second = await turn(client, [...conversation, { role: 'assistant', content: first.content },
        { role: 'user', content: FOLLOW_UP }]);
      assert.ok(second.cached >= first.prompt, `second turn cached ${second.cached} of ${second.prompt}`);
      same(second, cold.second, 'second turn');
      const m = await metricsText(server);
      assert.ok(sampleOf(m, 'sglang:cached_tokens_total', 'cache_source="storage_file"') > 0, 'tokens from storage');
      assert.equal(sampleOf(m, 'dsv4:hicache_storage_corrupt_records_total'), 0);
    } finally {
      await server.stop();
    }
  });

  test('flipped bytes in L3 records are dropped, counted, and the answers stay exact', async () => {
    const server = await startServer([...CACHE_ARGS, ...storageArgs(path.join(dir, 'l3-flipped'))]);
    try {
      const client = clientOf(server);
      const first = await turn(client, conversation);
      same(first, cold.first, 'first turn over damaged records');
      const m = await metricsText(server);
      assert.ok(sampleOf(m, 'dsv4:hicache_storage_corrupt_records_total') > 0, 'damaged records counted');
      assert.equal(sampleOf(m, 'sglang:cached_tokens_total', 'cache_source="storage_file"'), 0,
        'nothing served from a damaged record');
      const second = await turn(client, [...conversation, { role: 'assistant', content: first.content },
        { role: 'user', content: FOLLOW_UP }]);
      same(second, cold.second, 'second turn');
    } finally {
      await server.stop();
    }
  });
});

describe('64 concurrent clients under a tiny cache budget', () => {
  // 4 shared system prompts x 16 clients, two turns each: prefixes shared
  // across clients and turns, while budgets of a few pages make eviction run
  // on nearly every insert and requests hold leases on what they use.
  const CLIENTS = 64;
  const r = rng(64);
  const systems = Array.from({ length: 4 }, () => `Rules: ${wordsPrompt(120, r)}`);
  const firsts = Array.from({ length: CLIENTS }, () => wordsPrompt(20 + Math.floor(r() * 40), r));
  const seconds = Array.from({ length: CLIENTS }, () => wordsPrompt(10 + Math.floor(r() * 20), r));

  async function run(server) {
    const client = clientOf(server);
    return Promise.all(firsts.map(async (q, i) => {
      const msgs = [{ role: 'system', content: systems[i % 4] }, { role: 'user', content: q }];
      const a = await turn(client, msgs, 4);
      const b = await turn(client, [...msgs, { role: 'assistant', content: a.content },
        { role: 'user', content: seconds[i] }], 4);
      return [a, b];
    }));
  }

  test('every answer equals the one of a server without a cache', async () => {
    const ref = await startServer([...CACHE_ARGS, '--disable-radix-cache']);
    let want;
    try {
      want = await run(ref);
    } finally {
      await ref.stop();
    }
    const server = await startServer([...CACHE_ARGS, '--prefix-cache-gb', '0.0005', '--enable-hierarchical-cache',
      '--hicache-size', '0.001', '--hicache-write-policy', 'write_back']);
    try {
      const got = await run(server);
      for (let i = 0; i < CLIENTS; ++i) {
        same(got[i][0], want[i][0], `client ${i} turn 1`);
        same(got[i][1], want[i][1], `client ${i} turn 2`);
      }
      const m = await metricsText(server);
      assert.ok(sampleOf(m, 'dsv4:hicache_evictions_total', 'tier="device"') > 0, 'L1 evicted under the budget');
      assert.ok(got.some(([, b]) => b.cached > 0), 'some turn still hit the cache');
    } finally {
      await server.stop();
    }
  });
});
