// Request lifecycle: a client that disconnects mid-stream frees its request;
// /abort_request ends a named stream with finish_reason "abort".
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';

import { metricValue, postJSON, runningRequests, sse, startServer, waitFor } from './lib.mjs';

let server;
let client;
before(async () => {
  server = await startServer(['--context-length', '4096']);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  // Abort whatever still runs first: the server drains in-flight requests on SIGTERM.
  if (server) await postJSON(server.origin, '/abort_request', { abort_all: true }).catch(() => {});
  await server?.stop();
});

test('the startup log says which kernel path and which limits the server runs with', async () => {
  // stderr and stdout are separate pipes: the log may be read just after the
  // "serving" line that startServer waited for.
  await waitFor(() => /^limits: /m.test(server.stderr()), { timeoutMs: 5000, what: 'the startup log' });
  const log = server.stderr();
  assert.match(log, /^kernels: (scalar|avx2|avx512) \((the best this CPU supports|forced by DSV4_KERNELS=|DSV4_KERNELS=)/m);
  // --context-length 4096 from before(); the other limits are the defaults.
  assert.match(log, /^limits: context 4096 tokens, 64 running requests, 1024 queued, chunked prefill 2048 tokens per step$/m);
  assert.match(log, /^model: .*, 2 layers \(1 ratio-4, 1 ratio-128\) \+ 1 MTP, /m);
});

const longChat = (extra = {}) => ({
  model: 'm', messages: [{ role: 'user', content: 'Write a very long story.' }],
  max_tokens: 3000, ignore_eos: true, seed: 5, stream: true, ...extra,
});

test('client disconnect mid-stream (openai client) frees the request and counts an abort', async () => {
  const abortedBefore = await metricValue(server.origin, 'sglang:num_aborted_requests_total');
  const stream = await client.chat.completions.create(longChat());
  let chunks = 0;
  for await (const _ of stream) {
    if (++chunks === 4) {
      assert.ok(await runningRequests(server.origin) >= 1, 'the request is running');
      stream.controller.abort();  // drop the connection
      break;
    }
  }
  await waitFor(async () => (await runningRequests(server.origin)) === 0,
    { timeoutMs: 5000, what: 'num_running_reqs to drop to 0 after the disconnect' });
  await waitFor(async () => (await metricValue(server.origin, 'sglang:num_aborted_requests_total')) === abortedBefore + 1,
    { timeoutMs: 5000, what: 'sglang:num_aborted_requests_total to increment' });
});

test('client disconnect on /v1/completions and /generate streams (raw SSE)', async () => {
  for (const [path, body] of [
    ['/v1/completions', { prompt: 'Once upon a time', max_tokens: 3000, ignore_eos: true, stream: true }],
    ['/generate', { text: 'Once upon a time', sampling_params: { max_new_tokens: 3000, ignore_eos: true }, stream: true }],
  ]) {
    const abortedBefore = await metricValue(server.origin, 'sglang:num_aborted_requests_total');
    const r = await sse(server.origin, path, body, { onEvent: (_, i) => (i >= 3 ? 'abort' : undefined) });
    assert.ok(r.aborted);
    await waitFor(async () => (await runningRequests(server.origin)) === 0, { timeoutMs: 5000, what: `${path}: running to 0` });
    await waitFor(async () => (await metricValue(server.origin, 'sglang:num_aborted_requests_total')) > abortedBefore,
      { timeoutMs: 5000, what: `${path}: aborted counter` });
  }
});

test('/abort_request {rid} ends the stream with finish_reason "abort"', async () => {
  const rid = `abort-me-${process.pid}`;
  const stream = await client.chat.completions.create(longChat({ rid }));
  let chunks = 0;
  let finish = null;
  let aborted = false;
  for await (const chunk of stream) {
    chunks++;
    if (chunks === 4 && !aborted) {
      const r = await postJSON(server.origin, '/abort_request', { rid });
      assert.equal(r.status, 200, r.text);
      aborted = true;
    }
    for (const c of chunk.choices) if (c.finish_reason) finish = c.finish_reason;
  }
  assert.ok(aborted);
  assert.equal(finish, 'abort');
  assert.ok(chunks < 200, `the stream stopped soon after the abort (${chunks} chunks)`);
  await waitFor(async () => (await runningRequests(server.origin)) === 0, { timeoutMs: 5000, what: 'running to 0' });
});

test('/abort_request on /generate: finish_reason type abort and [DONE]', async () => {
  const rid = `gen-abort-${process.pid}`;
  let sent = false;
  const r = await sse(server.origin, '/generate',
    { text: 'Tell me everything.', rid, stream: true, sampling_params: { max_new_tokens: 3000, ignore_eos: true } },
    {
      onEvent: (_, i) => {
        if (i === 2 && !sent) {
          sent = true;
          postJSON(server.origin, '/abort_request', { rid });
        }
      },
    });
  assert.equal(r.status, 200);
  assert.ok(r.done, 'the aborted stream still ends with [DONE]');
  assert.equal(r.events.at(-1).meta_info.finish_reason.type, 'abort');
  assert.ok(r.events.length < 200);
});

test('/abort_request {abort_all: true} aborts every running request', async () => {
  const streams = [0, 1, 2].map((i) =>
    sse(server.origin, '/v1/completions', { prompt: `story ${i}`, max_tokens: 3000, ignore_eos: true, stream: true }));
  await waitFor(async () => (await runningRequests(server.origin)) === 3, { timeoutMs: 10000, what: '3 running' });
  const r = await postJSON(server.origin, '/abort_request', { abort_all: true });
  assert.equal(r.status, 200);
  assert.ok(r.json.aborted >= 3, r.text);
  for (const s of await Promise.all(streams)) {
    assert.ok(s.done);
    assert.equal(s.events.at(-1).choices[0].finish_reason, 'abort');
  }
  await waitFor(async () => (await runningRequests(server.origin)) === 0, { timeoutMs: 5000, what: 'running to 0' });
});

test('/abort_request of a non-streaming request returns its partial output', async () => {
  const rid = `plain-${process.pid}`;
  const pending = client.chat.completions.create({ ...longChat({ rid }), stream: false });
  await waitFor(async () => (await runningRequests(server.origin)) === 1, { timeoutMs: 10000, what: 'running' });
  await new Promise((r) => setTimeout(r, 300));
  const a = await postJSON(server.origin, '/abort_request', { rid });
  assert.equal(a.status, 200, a.text);
  const res = await pending;
  assert.equal(res.choices[0].finish_reason, 'abort');
  assert.ok(res.usage.completion_tokens < 3000);
});

test('a full waiting queue answers 503 with Retry-After', async () => {
  const small = await startServer(['--max-running-requests', '1', '--max-queued-requests', '1']);
  try {
    // Far more tokens than the test lasts (the smoke model writes 3000 in a
    // second or two, so a loaded machine could see the first one end before
    // the second was queued); abort_all ends them.
    const body = { prompt: 'busy', max_tokens: 100000, ignore_eos: true, stream: true };
    const first = sse(small.origin, '/v1/completions', body);
    await waitFor(async () => (await runningRequests(small.origin)) === 1, { timeoutMs: 10000, what: 'one running' });
    const second = sse(small.origin, '/v1/completions', body);
    await waitFor(async () => (await runningRequests(small.origin)) === 2, { timeoutMs: 10000, what: 'one queued' });
    const r = await postJSON(small.origin, '/v1/completions', { prompt: 'one more', max_tokens: 2 });
    assert.equal(r.status, 503, r.text);
    assert.ok(r.headers['retry-after'], 'Retry-After header');
    assert.match(r.json.error.message, /capacity|queue/);
    const c = new OpenAI({ baseURL: small.baseURL, apiKey: 'unused', maxRetries: 0 });
    await assert.rejects(c.completions.create({ model: 'm', prompt: 'x', max_tokens: 2 }), (e) => e.status === 503);
    await postJSON(small.origin, '/abort_request', { abort_all: true });
    for (const s of await Promise.all([first, second])) assert.ok(s.done);
  } finally {
    // The server drains in-flight requests on SIGTERM: abort them first.
    await postJSON(small.origin, '/abort_request', { abort_all: true }).catch(() => {});
    await small.stop();
  }
});

// Non-streaming answers are chunked with whitespace pings, so a departed
// client is noticed and its request cancelled.
test('client disconnect during a non-streaming request frees the request', async () => {
  const abortedBefore = await metricValue(server.origin, 'sglang:num_aborted_requests_total');
  const ctrl = new AbortController();
  const pending = client.chat.completions.create({ ...longChat(), stream: false }, { signal: ctrl.signal });
  await waitFor(async () => (await runningRequests(server.origin)) === 1, { timeoutMs: 10000, what: 'running' });
  ctrl.abort();
  await assert.rejects(pending);
  await waitFor(async () => (await runningRequests(server.origin)) === 0,
    { timeoutMs: 5000, what: 'num_running_reqs to drop to 0 after a non-streaming client went away' });
  assert.ok((await metricValue(server.origin, 'sglang:num_aborted_requests_total')) > abortedBefore);
});
