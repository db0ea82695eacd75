// Load test of `dsv4 serve` (loopback only, bounded in count and time):
//  - 64 concurrent streaming clients (chat and completions), prompts of
//    5..1500 tokens, chunked prefill of 256 tokens per step;
//  - every stream completes with data: [DONE], the right finish reason and
//    token count; a sample is re-run non-streamed with the same seed and must
//    match exactly (text and logprob floats);
//  - fixed seeded probes run ALONE and DURING the load give bitwise-identical
//    tokens and logprobs (batch invariance);
//  - after the load and /flush_cache the server's RSS returns to within 15%
//    (or 30 MB) of the baseline measured after a warm-up request.
// Usage: node load_test.mjs [--clients N] [--time-limit S]   (env DSV4_BIN, DSV4_TEST_MODEL)
import assert from 'node:assert/strict';
import fs from 'node:fs';

import { getPath, metricValue, postJSON, rng, runningRequests, sleep, sse, startServer, waitFor, wordsPrompt } from './lib.mjs';

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? Number(argv[i + 1]) : dflt;
};
const CLIENTS = opt('--clients', 64);
const TIME_LIMIT_S = opt('--time-limit', 280);
const SAMPLE = Math.min(16, CLIENTS);
const LENGTHS = [5, 16, 48, 120, 300, 700, 1100, 1500];
// Token-id prompts draw from ordinary (non-special) ids in a fixed range that
// the warm-up feeds once: the checkpoint is mmap'd, so the first use of an
// embedding row pages it in (file-backed RSS that is not server memory).
const VOCAB_LO = 1000, VOCAB_HI = 9000;

const t0 = Date.now();
const elapsed = () => ((Date.now() - t0) / 1000).toFixed(1);
const log = (...a) => console.log(`[${elapsed()}s]`, ...a);
const watchdog = setTimeout(() => {
  console.error(`FAIL: the load test exceeded its time limit of ${TIME_LIMIT_S} s`);
  process.exit(1);
}, TIME_LIMIT_S * 1000);

function randomIds(n, rand) {
  const ids = [];
  for (let i = 0; i < n; ++i) ids.push(VOCAB_LO + Math.floor(rand() * (VOCAB_HI - VOCAB_LO)));
  return ids;
}

// The 64 clients: even ones use chat with word prompts, odd ones completions
// with token-id prompts of exact length.
function makeClient(i) {
  const rand = rng(1000 + i);
  const len = LENGTHS[i % LENGTHS.length];
  const max_tokens = 4 + (i % 13);
  const seed = 5000 + i;
  if (i % 2 === 0) {
    return {
      i, kind: 'chat', path: '/v1/chat/completions', len, max_tokens,
      body: {
        model: 'm', messages: [{ role: 'user', content: wordsPrompt(len, rand) }], max_tokens, seed, ignore_eos: true,
        logprobs: true, top_logprobs: 2, stream: true, stream_options: { include_usage: true },
      },
    };
  }
  return {
    i, kind: 'completions', path: '/v1/completions', len, max_tokens,
    body: { model: 'm', prompt: randomIds(len, rand), max_tokens, seed, ignore_eos: true, logprobs: 2, stream: true,
      stream_options: { include_usage: true } },
  };
}

// Folds a stream's events into text + per-token logprobs.
function foldStream(c, r) {
  const where = `client ${c.i} (${c.kind}, ${c.len} tokens)`;
  assert.equal(r.status, 200, `${where}: HTTP ${r.status} ${r.raw.slice(0, 200)}`);
  assert.ok(r.done, `${where}: stream did not end with data: [DONE]`);
  assert.ok(!r.afterDone, `${where}: data after [DONE]`);
  let text = '', finish = null, usage = null, id = null;
  const logprobs = [];
  for (const e of r.events) {
    assert.ok(!e.error, `${where}: error event ${JSON.stringify(e)}`);
    id ??= e.id;
    assert.equal(e.id, id, `${where}: chunk ids differ`);
    if (e.usage) usage = e.usage;
    for (const ch of e.choices) {
      assert.equal(ch.index, 0);
      assert.equal(finish, null, `${where}: output after the finish chunk`);
      if (c.kind === 'chat') {
        text += ch.delta.content ?? '';
        text += ch.delta.reasoning_content ?? '';
        if (ch.logprobs?.content) logprobs.push(...ch.logprobs.content.map((x) => [x.token, x.logprob]));
      } else {
        text += ch.text;
        if (ch.logprobs) ch.logprobs.tokens.forEach((t, k) => logprobs.push([t, ch.logprobs.token_logprobs[k]]));
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(finish, 'length', `${where}: finish_reason ${finish}`);
  assert.ok(usage, `${where}: no usage chunk`);
  assert.equal(usage.completion_tokens, c.max_tokens, `${where}: completion_tokens`);
  assert.equal(logprobs.length, c.max_tokens, `${where}: one logprob per token`);
  return { text, logprobs, usage };
}

function foldFull(c, j) {
  const ch = j.choices[0];
  if (c.kind === 'chat')
    return { text: (ch.message.content ?? '') + (ch.message.reasoning_content ?? ''),
      logprobs: ch.logprobs.content.map((x) => [x.token, x.logprob]) };
  return { text: ch.text, logprobs: ch.logprobs.tokens.map((t, k) => [t, ch.logprobs.token_logprobs[k]]) };
}

// Exact comparison of [token, logprob] lists: logprobs are compared as
// floats with ===, i.e. bitwise after the exact JSON round trip.
function assertSameLogprobs(a, b, what) {
  assert.equal(a.length, b.length, `${what}: token counts differ`);
  for (let k = 0; k < a.length; ++k) {
    assert.equal(a[k][0], b[k][0], `${what}: token ${k} differs`);
    assert.ok(Object.is(a[k][1], b[k][1]), `${what}: logprob ${k} differs: ${a[k][1]} vs ${b[k][1]}`);
  }
}

// Seeded probes, run alone and during the load.
const probeRand = rng(424242);
const PROBES = {
  generate: {
    path: '/generate',
    body: { input_ids: randomIds(600, probeRand), sampling_params: { max_new_tokens: 24, seed: 777, ignore_eos: true },
      return_logprob: true, top_logprobs_num: 5 },
    fold: (j) => ({ ids: j.output_ids, text: j.text, lp: j.meta_info.output_token_logprobs, top: j.meta_info.output_top_logprobs }),
  },
  chat: {
    path: '/v1/chat/completions',
    body: { model: 'm', messages: [{ role: 'user', content: wordsPrompt(400, probeRand) }], max_tokens: 20, seed: 31337,
      ignore_eos: true, logprobs: true, top_logprobs: 5 },
    fold: (j) => ({ text: j.choices[0].message.content, lp: j.choices[0].logprobs.content }),
  },
};
async function runProbe(name) {
  const p = PROBES[name];
  const r = await postJSON(origin, p.path, p.body);
  assert.equal(r.status, 200, `probe ${name}: ${r.text.slice(0, 300)}`);
  return { raw: r.text, value: p.fold(r.json) };
}
function assertProbeEqual(name, alone, loaded) {
  // Deep equality of parsed values (floats compared exactly) ...
  assert.deepStrictEqual(loaded.value, alone.value, `probe ${name}: output under load differs from the output alone`);
  // ... and the serialized logprobs are byte-identical.
  const lpText = (raw) => JSON.stringify(JSON.parse(raw).meta_info?.output_token_logprobs ?? JSON.parse(raw).choices[0].logprobs);
  assert.equal(lpText(loaded.raw), lpText(alone.raw), `probe ${name}: logprob JSON differs`);
}

function memory(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const get = (k) => Number((s.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm')) ?? [0, NaN])[1]);
  return { VmRSS: get('VmRSS'), RssAnon: get('RssAnon'), RssFile: get('RssFile') };
}
const fmtMem = (m) => `VmRSS ${(m.VmRSS / 1024).toFixed(1)} MiB (anon ${(m.RssAnon / 1024).toFixed(1)}, ` +
  `file-backed ${(m.RssFile / 1024).toFixed(1)})`;

async function flushCache() {
  await waitFor(async () => (await getPath(origin, '/flush_cache')).status === 200, { timeoutMs: 20000, what: '/flush_cache to succeed' });
}

let server;
let origin;
async function main() {
  server = await startServer(['--chunked-prefill-size', '256', '--context-length', '2048', '--max-running-requests', '64',
    '--max-queued-requests', '256', '--enable-deterministic-inference']);
  origin = server.origin;
  log(`server pid ${server.pid} on ${origin}; ${CLIENTS} clients, prompts ${LENGTHS.join('/')} tokens`);

  // Warm-up, then the probes alone (cache flushed before each so that every
  // run prefills from scratch), then the baseline RSS.
  const warm = await postJSON(origin, '/v1/chat/completions',
    { messages: [{ role: 'user', content: wordsPrompt(200, rng(7)) }], max_tokens: 4 });
  assert.equal(warm.status, 200);
  for (let lo = VOCAB_LO; lo < VOCAB_HI; lo += 1600) {
    const ids = [];
    for (let id = lo; id < Math.min(lo + 1600, VOCAB_HI); ++id) ids.push(id);
    const w = await postJSON(origin, '/generate', { input_ids: ids, sampling_params: { max_new_tokens: 1 } });
    assert.equal(w.status, 200, w.text);
  }
  const alone = {};
  for (const name of Object.keys(PROBES)) {
    await flushCache();
    alone[name] = await runProbe(name);
  }
  await flushCache();
  await sleep(300);
  const base = memory(server.pid);
  const baseKiB = base.VmRSS;
  const requestsBefore = await metricValue(origin, 'sglang:num_requests_total');
  const abortedBefore = await metricValue(origin, 'sglang:num_aborted_requests_total');
  log(`baseline after warm-up: ${fmtMem(base)}`);

  // The load.
  const clients = Array.from({ length: CLIENTS }, (_, i) => makeClient(i));
  let firstTokens = 0;
  let peakKiB = baseKiB;
  const rssTimer = setInterval(() => { peakKiB = Math.max(peakKiB, memory(server.pid).VmRSS); }, 200);
  const loadStart = Date.now();
  const streams = clients.map((c) => sse(origin, c.path, c.body, {
    onEvent: () => { if (!c.sawFirst) { c.sawFirst = true; firstTokens++; } },
  }));
  // Probes during the load: once a quarter of the clients are streaming.
  await waitFor(async () => firstTokens >= CLIENTS / 4, { timeoutMs: 120000, intervalMs: 50, what: 'the load to start streaming' });
  const running = await runningRequests(origin);
  log(`load running (${running} requests in the engine); submitting the probes`);
  const loadedProbes = Promise.all(Object.keys(PROBES).map(async (n) => [n, await runProbe(n)]));
  const results = await Promise.all(streams);
  const probes = Object.fromEntries(await loadedProbes);
  const loadSeconds = (Date.now() - loadStart) / 1000;
  clearInterval(rssTimer);
  log(`all ${CLIENTS} streams finished in ${loadSeconds.toFixed(1)} s`);
  assert.ok(running >= 8, `the probes should run under load (only ${running} requests were in the engine)`);

  const folded = clients.map((c, k) => foldStream(c, results[k]));
  let tokens = 0;
  for (const f of folded) tokens += f.usage.completion_tokens;
  log(`every stream completed with [DONE], finish_reason length and the right token count (${tokens} tokens)`);
  for (const name of Object.keys(PROBES)) assertProbeEqual(name, alone[name], probes[name]);
  log(`probes ${Object.keys(PROBES).join(', ')}: tokens and logprobs under load are bitwise identical to alone`);

  // Corruption check: a sample re-run non-streamed (concurrently) must match.
  const sample = [];
  for (let k = 0; k < SAMPLE; ++k) sample.push(clients[Math.floor((k * CLIENTS) / SAMPLE) + (k % 2)] ?? clients[k]);
  const reruns = await Promise.all(sample.map((c) => postJSON(origin, c.path, { ...c.body, stream: false, stream_options: undefined })));
  sample.forEach((c, k) => {
    assert.equal(reruns[k].status, 200, reruns[k].text.slice(0, 200));
    const full = foldFull(c, reruns[k].json);
    const streamed = folded[c.i];
    assert.equal(streamed.text, full.text, `client ${c.i}: streamed text differs from the non-streamed re-run`);
    assertSameLogprobs(streamed.logprobs, full.logprobs, `client ${c.i} streamed vs re-run`);
  });
  log(`sample of ${sample.length} streams equals their non-streamed re-runs (text and logprobs)`);

  const requestsAfter = await metricValue(origin, 'sglang:num_requests_total');
  const expectedRequests = CLIENTS + Object.keys(PROBES).length + sample.length;
  assert.equal(requestsAfter - requestsBefore, expectedRequests, 'sglang:num_requests_total counts every request');
  assert.equal(await metricValue(origin, 'sglang:num_aborted_requests_total'), abortedBefore, 'no request was aborted');

  // Memory back to baseline.
  await waitFor(async () => (await runningRequests(origin)) === 0, { timeoutMs: 20000, what: 'the engine to go idle' });
  await flushCache();
  // VmRSS, less the growth of file-backed pages: those are pages of the
  // mmap'd checkpoint (embedding rows of tokens seen for the first time, with
  // the kernel's fault-around), bounded by the checkpoint's size, shared with
  // the page cache and reclaimable; they are not memory the server holds.
  const allowedKiB = Math.max(baseKiB * 1.15, baseKiB + 30 * 1024);
  let afterMem = memory(server.pid);
  const owned = (m) => m.VmRSS - Math.max(0, m.RssFile - base.RssFile);
  for (let k = 0; k < 20 && owned(afterMem) > allowedKiB; ++k) {  // give the allocator up to 2 s
    await sleep(100);
    afterMem = memory(server.pid);
  }
  const mib = (k) => (k / 1024).toFixed(1);
  log(`baseline: ${fmtMem(base)}`);
  log(`peak:     VmRSS ${mib(peakKiB)} MiB`);
  log(`after load + /flush_cache: ${fmtMem(afterMem)}`);
  log(`VmRSS less checkpoint page-ins: ${mib(owned(afterMem))} MiB (allowed: ${mib(allowedKiB)} MiB = baseline + max(15%, 30 MiB)); ` +
    `raw VmRSS ${mib(afterMem.VmRSS)} MiB ${afterMem.VmRSS <= allowedKiB ? 'is also' : 'is NOT'} within the allowance`);
  assert.ok(owned(afterMem) <= allowedKiB,
    `memory did not return to baseline: ${mib(owned(afterMem))} MiB > ${mib(allowedKiB)} MiB`);
  assert.equal((await getPath(origin, '/health')).status, 200);
  log('PASS');
}

main().then(async () => {
  clearTimeout(watchdog);
  await server?.stop();
  process.exit(0);
}, async (e) => {
  console.error(`FAIL: ${e.stack || e}`);
  if (server) console.error(`--- server stderr (tail) ---\n${server.stderr().slice(-3000)}`);
  clearTimeout(watchdog);
  await server?.stop();
  process.exit(1);
});
