// Shared helpers for the dsv4 server tests: start `dsv4 serve` on a free
// loopback port, raw HTTP requests (for bodies the openai client cannot
// send), an SSE reader, and small polling utilities.
//
// Environment:
//   DSV4_BIN         path of the dsv4 executable   (default: <repo>/build/dsv4)
//   DSV4_TEST_MODEL  checkpoint made by `dsv4 make-model`
//                    (default: <repo>/build/test-smoke-model)
//   DSV4_TEST_THREADS  optional --threads for the server
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '..', '..');
export const dsv4Bin = process.env.DSV4_BIN || path.join(repoRoot, 'build', 'dsv4');
export const modelDir = process.env.DSV4_TEST_MODEL || path.join(repoRoot, 'build', 'test-smoke-model');
export const HOST = '127.0.0.1';  // loopback only, always

const live = new Set();
function killAll() {
  for (const p of live) {
    try { p.kill('SIGKILL'); } catch { /* already gone */ }
  }
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => { killAll(); process.exit(130); });

export function checkPrerequisites() {
  if (!fs.existsSync(dsv4Bin)) throw new Error(`dsv4 binary not found at ${dsv4Bin} (set DSV4_BIN)`);
  if (!fs.existsSync(path.join(modelDir, 'config.json')))
    throw new Error(`test model not found in ${modelDir}: run \`dsv4 make-model --out ${modelDir}\` (or set DSV4_TEST_MODEL)`);
}

// Starts `dsv4 serve --port 0` and resolves once it printed its address.
// Returns { proc, pid, port, origin, baseURL, stderr(), stop() }.
export async function startServer(extraArgs = [], { timeoutMs = 60000, env = {}, model = modelDir } = {}) {
  checkPrerequisites();
  const args = ['serve', '--model-path', model, '--host', HOST, '--port', '0', ...extraArgs];
  if (process.env.DSV4_TEST_THREADS) args.push('--threads', process.env.DSV4_TEST_THREADS);
  // Passive OpenMP waiting: on a small shared CI box, spinning worker threads
  // of an idle server compete with the test client and other test processes.
  const childEnv = { OMP_WAIT_POLICY: 'passive', ...process.env, ...env };
  const proc = spawn(dsv4Bin, args, { stdio: ['ignore', 'pipe', 'pipe'], env: childEnv });
  live.add(proc);
  let stderr = '';
  let stdout = '';
  proc.stderr.setEncoding('utf8');
  proc.stderr.on('data', (d) => {
    stderr += d;
    if (stderr.length > 1 << 20) stderr = stderr.slice(-(1 << 19));
    if (process.env.DSV4_TEST_VERBOSE) process.stderr.write(d);
  });
  proc.stdout.setEncoding('utf8');
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start within ${timeoutMs} ms\n${stderr}`)), timeoutMs);
    proc.stdout.on('data', (d) => {
      stdout += d;
      const m = stdout.match(/dsv4 serving (\S+) on http:\/\/([^:\s]+):(\d+) \(OpenAI API at \/v1\)/);
      if (m) {
        clearTimeout(timer);
        if (m[2] !== HOST) reject(new Error(`server bound ${m[2]}, expected ${HOST}`));
        else resolve(Number(m[3]));
      }
    });
    proc.on('exit', (code, sig) => {
      clearTimeout(timer);
      reject(new Error(`server exited early (code ${code}, signal ${sig})\n${stderr}`));
    });
  });
  const origin = `http://${HOST}:${port}`;
  const server = {
    proc,
    pid: proc.pid,
    port,
    origin,
    baseURL: `${origin}/v1`,
    stderr: () => stderr,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      const exited = new Promise((r) => proc.once('exit', r));
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
      await exited;
      clearTimeout(t);
      live.delete(proc);
    },
  };
  return server;
}

// A raw HTTP request with node:http, so tests can send any bytes (invalid
// UTF-8, huge bodies) and see any status. Resolves { status, headers, text, json }.
export function rawRequest(origin, method, urlPath, body, headers = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(urlPath, origin);
    const payload = body === undefined ? undefined : Buffer.isBuffer(body) ? body
      : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    const h = { ...headers };
    if (payload) {
      h['Content-Length'] = String(payload.length);
      if (!Object.keys(h).some((k) => k.toLowerCase() === 'content-type')) h['Content-Type'] = 'application/json';
    }
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname + u.search, method, headers: h, agent: false },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json;
          try { json = JSON.parse(text); } catch { json = undefined; }
          resolve({ status: res.statusCode, headers: res.headers, text, json });
        });
        res.on('error', reject);
      });
    // The server may answer (e.g. 413) and close before the whole body is sent;
    // the response is what matters then.
    req.on('error', (e) => { if (!req.res) reject(e); });
    if (payload) req.end(payload); else req.end();
  });
}

export const postJSON = (origin, p, body, headers) => rawRequest(origin, 'POST', p, body, headers);
export const getPath = (origin, p, headers) => rawRequest(origin, 'GET', p, undefined, headers);

// Reads a server-sent-events response with fetch. Returns
// { status, events: [parsed JSON of every data line], done: saw [DONE], comments, raw }.
// onEvent(json, index) may return 'abort' to disconnect.
export async function sse(origin, p, body, { headers = {}, onEvent, signal } = {}) {
  const ctrl = new AbortController();
  if (signal) signal.addEventListener('abort', () => ctrl.abort());
  const res = await fetch(new URL(p, origin), {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify(body),
    signal: ctrl.signal,
  });
  const out = { status: res.status, events: [], done: false, comments: 0, raw: '', afterDone: false, aborted: false };
  if (!res.ok || !res.body) {
    out.raw = await res.text();
    return out;
  }
  const decoder = new TextDecoder('utf-8', { fatal: true });
  let buf = '';
  try {
    for await (const chunk of res.body) {
      const s = decoder.decode(chunk, { stream: true });
      out.raw += s;
      buf += s;
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) { out.comments++; continue; }
          if (!line.startsWith('data: ')) continue;
          const data = line.slice(6);
          if (out.done) out.afterDone = true;
          if (data === '[DONE]') { out.done = true; continue; }
          const j = JSON.parse(data);
          out.events.push(j);
          if (onEvent && onEvent(j, out.events.length - 1) === 'abort') {
            out.aborted = true;
            ctrl.abort();
            return out;
          }
        }
      }
    }
  } catch (e) {
    if (!out.aborted && e.name !== 'AbortError') throw e;
  }
  out.trailing = buf;
  return out;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function waitFor(pred, { timeoutMs = 10000, intervalMs = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await pred();
    if (last) return last;
    await sleep(intervalMs);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
}

export async function serverInfo(origin) {
  const r = await getPath(origin, '/get_server_info');
  if (r.status !== 200) throw new Error(`/get_server_info: ${r.status} ${r.text}`);
  return r.json;
}

export async function runningRequests(origin) {
  const info = await serverInfo(origin);
  const st = info.internal_states[0];
  return st.num_running_reqs + st.num_queue_reqs;
}

export async function metricValue(origin, name) {
  const r = await getPath(origin, '/metrics');
  const re = new RegExp(`^${name.replace(/[:]/g, '\\:')}\\{[^}]*\\} (\\S+)$`, 'm');
  const m = r.text.match(re);
  if (!m) throw new Error(`metric ${name} not found in /metrics`);
  return Number(m[1]);
}

export function rssKiB(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = s.match(/^VmRSS:\s+(\d+) kB/m);
  return m ? Number(m[1]) : NaN;
}

// Deterministic pseudo-random numbers for building prompts.
export function rng(seed) {
  let x = BigInt.asUintN(64, BigInt(seed) * 0x9E3779B97F4A7C15n + 1n);
  return () => {
    x = BigInt.asUintN(64, x ^ (x << 13n));
    x ^= x >> 7n;
    x = BigInt.asUintN(64, x ^ (x << 17n));
    return Number(x >> 11n) / 2 ** 53;
  };
}

const WORDS = ('the quick brown fox jumps over lazy dog server token stream batch model cache prefix chunk ' +
  'decode prefill sample seed logits vector matrix kernel thread queue abort health metric').split(' ');
export function wordsPrompt(n, rand) {
  const out = [];
  for (let i = 0; i < n; ++i) out.push(WORDS[Math.floor(rand() * WORDS.length)]);
  return out.join(' ');
}
