#!/usr/bin/env node
// Hardening probe suite for `dsv4 serve`: an attacker's test kit.
//
// Each probe sends one kind of hostile or malformed traffic to a server on a
// loopback port and checks the target behaviour (tests/probe/README.md): the
// request is refused with the right status, memory stays bounded, other
// clients keep being served, nothing leaks between clients, and the process
// is still alive with GET /health answering 200 afterwards.
//
//   node tests/probe/probe.mjs --short            # CI (CTest server_probe), ~2 min on 2 cores
//   node tests/probe/probe.mjs --full             # scripts/probe.sh, a few minutes
//   options: --csv FILE   write one row per probe with the measured numbers
//            --only RE    run the probes whose name matches RE
//
// One line per probe: PASS/FAIL, the name, the numbers (status, latency,
// RSS) and, for a failure, why. Exit status 1 if any probe failed.
// Node built-ins only; every loop is bounded in count and time; all traffic
// goes to 127.0.0.1.
import fs from 'node:fs';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import {
  HOST, startServer, rawRequest, sse, sleep, metricValue,
} from '../server/lib.mjs';

// ---------------------------------------------------------------- options

const argv = process.argv.slice(2);
const opt = { mode: 'short', csv: null, only: null };
for (let i = 0; i < argv.length; ++i) {
  const a = argv[i];
  if (a === '--short') opt.mode = 'short';
  else if (a === '--full') opt.mode = 'full';
  else if (a === '--csv') opt.csv = argv[++i];
  else if (a === '--only') opt.only = new RegExp(argv[++i]);
  else if (a === '-h' || a === '--help') {
    console.log('usage: probe.mjs [--short|--full] [--csv FILE] [--only REGEX]');
    process.exit(0);
  } else {
    console.error(`probe.mjs: unknown argument ${a}`);
    process.exit(2);
  }
}
const FULL = opt.mode === 'full';

// Sizes and limits of both modes. The targets (caps) are the same; the full
// mode only pushes harder and longer.
const CFG = {
  ctx: 256,                                  // --context-length of the main server
  deepDepths: FULL ? [1000, 100000] : [100000],
  headerCapBytes: 64 << 10,                  // the server's header-block cap (target)
  floodBudget: FULL ? 200 << 20 : 48 << 20,  // bytes streamed at an endless header block
  floodRssBound: 50 << 20,                   // allowed RSS growth for a header flood
  bodyCount: 16,
  bodyBytes: 30 << 20,
  // 16 bodies of 30 MiB are 480 MiB. A hardened server either refuses them
  // (413) or buffers at most a few at a time; 200 MiB is room for ~6 bodies
  // in flight (or the 32 MiB default limit times 6), far below the 480+ MiB
  // (plus parse copies) that buffering all of them costs.
  bodyRssBound: 200 << 20,
  bodyRssSettle: 64 << 20,                   // RSS must come back within this of the baseline
  slowConns: FULL ? 1000 : 300,
  slowHeaderDeadlineS: 20,                   // slow header blocks must be closed by then
  slowObserveS: FULL ? 60 : 24,
  healthEveryMs: 200,
  healthMaxMs: 1000,
  probeTimeoutMs: FULL ? 180000 : 90000,
  totalTimeoutMs: FULL ? 1500000 : 300000,
};

const SECRET = 'probe-SECRET-k3y-7f1d2c';
const EVIL = 'http://evil.example';
const GOOD = 'http://a.example';

// ---------------------------------------------------------------- results

const results = [];
const t0 = performance.now();

function fmtNum(v) {
  if (typeof v !== 'number') return String(v);
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

function record(name, pass, nums = {}, note = '') {
  const r = { name, pass: !!pass, nums, note };
  results.push(r);
  const numsText = Object.entries(nums).map(([k, v]) => `${k}=${fmtNum(v)}`).join(' ');
  console.log(`${pass ? 'PASS' : 'FAIL'}  ${name}${numsText ? '  ' + numsText : ''}${note ? '  -- ' + note : ''}`);
  return r;
}

function selected(name) { return !opt.only || opt.only.test(name); }

function writeCsv(file) {
  const keys = [];
  for (const r of results) for (const k of Object.keys(r.nums)) if (!keys.includes(k)) keys.push(k);
  const esc = (v) => {
    const s = v === undefined || v === null ? '' : String(v);
    return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  };
  const lines = [['probe', 'class', 'result', ...keys, 'note'].join(',')];
  for (const r of results) {
    const vals = keys.map((k) => (r.nums[k] === undefined ? '' : fmtNum(r.nums[k])));
    lines.push([r.name, r.name.split('/')[0], r.pass ? 'PASS' : 'FAIL', ...vals, r.note].map(esc).join(','));
  }
  fs.writeFileSync(file, lines.join('\n') + '\n');
}

// ---------------------------------------------------------------- helpers

const MiB = 1 << 20;
const mib = (bytes) => Math.round((bytes / MiB) * 10) / 10;

function procStatus(pid) {
  try {
    const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (k) => { const m = s.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm')); return m ? Number(m[1]) * 1024 : NaN; };
    return { rss: kb('VmRSS'), hwm: kb('VmHWM') };
  } catch { return { rss: NaN, hwm: NaN }; }
}

// Samples VmRSS every 20 ms until stop(); reports the peak together with
// VmHWM (the kernel's own peak, which catches spikes between samples).
function rssSampler(pid) {
  const before = procStatus(pid);
  let peak = before.rss;
  const timer = setInterval(() => { const r = procStatus(pid).rss; if (r > peak) peak = r; }, 20);
  return {
    before,
    stop() {
      clearInterval(timer);
      const after = procStatus(pid);
      peak = Math.max(peak, after.rss);
      // A VmHWM above its starting value is a peak reached during the probe.
      if (after.hwm > before.hwm) peak = Math.max(peak, after.hwm);
      return { base: before.rss, peak, growth: peak - before.rss, after: after.rss };
    },
  };
}

function withTimeout(promise, ms, what) {
  let t;
  return Promise.race([promise, new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`${what}: no answer within ${ms} ms`)), ms); })])
    .finally(() => clearTimeout(t));
}

// One HTTP request (node:http, fresh connection). Never throws: a transport
// error or timeout comes back as status 'ERR' with the error message.
async function http(origin, method, path, body, headers = {}, timeoutMs = 15000) {
  const t = performance.now();
  try {
    const r = await withTimeout(rawRequest(origin, method, path, body, headers), timeoutMs, `${method} ${path}`);
    return { ...r, ms: performance.now() - t };
  } catch (e) {
    return { status: 'ERR', error: e.message, headers: {}, text: '', ms: performance.now() - t };
  }
}

const isOpenAIError = (r) => r.json && typeof r.json === 'object' && r.json.error && typeof r.json.error.message === 'string';
const brief = (r) => r.status === 'ERR' ? `transport error: ${r.error}` : `${r.status} ${String(r.text).slice(0, 140).replace(/\s+/g, ' ')}`;

// A raw TCP exchange: write the chunks, collect what comes back until the
// server closes, `expect` responses are complete, or timeoutMs passes.
function rawExchange(port, chunks, { timeoutMs = 4000, expect = 1 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect({ host: HOST, port });
    const data = [];
    let done = false, closed = false, error = null;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      const buf = Buffer.concat(data);
      resolve({ ...parseResponses(buf), closed, error, raw: buf });
    };
    const timer = setTimeout(finish, timeoutMs);
    sock.on('connect', () => { for (const c of chunks) sock.write(c); });
    sock.on('data', (d) => {
      data.push(d);
      if (parseResponses(Buffer.concat(data)).responses.length >= expect) setTimeout(finish, 150);  // a little more, to see extras
    });
    sock.on('end', () => { closed = true; finish(); });
    sock.on('close', () => { closed = true; finish(); });
    sock.on('error', (e) => { error = e.message; closed = true; finish(); });
  });
}

// Parses consecutive HTTP/1.1 responses (Content-Length, chunked, or
// until-close bodies). Returns { responses: [{status, headers, body}], rest }.
function parseResponses(buf) {
  const responses = [];
  let pos = 0;
  for (let guard = 0; guard < 64 && pos < buf.length; ++guard) {
    const end = buf.indexOf('\r\n\r\n', pos);
    if (end < 0) break;
    const head = buf.slice(pos, end).toString('latin1').split('\r\n');
    const m = head[0].match(/^HTTP\/1\.[01] (\d{3})/);
    if (!m) break;
    const headers = {};
    for (const line of head.slice(1)) {
      const i = line.indexOf(':');
      if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
    }
    let p = end + 4, body;
    if (/chunked/i.test(headers['transfer-encoding'] || '')) {
      const parts = [];
      let ok = false;
      for (let g = 0; g < 100000; ++g) {
        const le = buf.indexOf('\r\n', p);
        if (le < 0) break;
        const size = parseInt(buf.slice(p, le).toString('latin1'), 16);
        if (!(size >= 0) || le + 2 + size + 2 > buf.length) break;
        if (size === 0) { p = le + 4; ok = true; break; }
        parts.push(buf.slice(le + 2, le + 2 + size));
        p = le + 2 + size + 2;
      }
      if (!ok) break;
      body = Buffer.concat(parts);
    } else if (headers['content-length'] !== undefined) {
      const n = Number(headers['content-length']);
      if (p + n > buf.length) break;
      body = buf.slice(p, p + n);
      p += n;
    } else {
      body = buf.slice(p);
      p = buf.length;
    }
    responses.push({ status: Number(m[1]), headers, body: body.toString('utf8') });
    pos = p;
  }
  return { responses, rest: buf.slice(pos) };
}

// ---------------------------------------------------------------- servers

// A named server configuration. ensure() (re)starts it when it is not
// running, e.g. after a probe crashed it.
class Srv {
  constructor(name, args) { this.name = name; this.args = args; this.s = null; this.startError = null; this.restarts = 0; }
  get origin() { return this.s.origin; }
  get port() { return this.s.port; }
  get pid() { return this.s.pid; }
  running() { return !!this.s && this.s.proc.exitCode === null && this.s.proc.signalCode === null; }
  async ensure() {
    if (this.running()) return true;
    if (this.s) this.restarts++;
    try {
      this.s = await startServer(this.args, { timeoutMs: 60000 });
      this.startError = null;
      return true;
    } catch (e) {
      this.s = null;
      this.startError = e.message.split('\n').filter(Boolean).slice(0, 3).join(' | ');
      return false;
    }
  }
  // Alive: process running and GET /health 200 within `waitMs`.
  async alive(waitMs = 5000) {
    const deadline = Date.now() + waitMs;
    let last = '';
    for (let i = 0; i < 50 && Date.now() < deadline; ++i) {
      if (!this.running()) {
        const p = this.s?.proc;
        return { ok: false, why: `server process died (exit ${p?.exitCode}, signal ${p?.signalCode})` };
      }
      const r = await http(this.origin, 'GET', '/health', undefined, {}, Math.max(500, deadline - Date.now()));
      if (r.status === 200) return { ok: true };
      last = brief(r);
      await sleep(100);
    }
    return { ok: false, why: `GET /health did not answer 200 within ${waitMs} ms (${last})` };
  }
  async stop() { if (this.s) await this.s.stop().catch(() => {}); this.s = null; }
  // For throwaway servers a probe may have left busy: no graceful shutdown.
  async kill() {
    if (this.running()) {
      const exited = new Promise((r) => this.s.proc.once('exit', r));
      this.s.proc.kill('SIGKILL');
      await withTimeout(exited, 5000, 'SIGKILL').catch(() => {});
    }
    this.s = null;
  }
}

const servers = {};
async function server(name, args) {
  let srv = servers[name];
  if (!srv) srv = servers[name] = new Srv(name, args);
  await srv.ensure();
  return srv;
}

// Runs one probe: fn(srv) returns { pass, nums, note } (or throws). Afterwards
// the server must be alive with /health 200; a dead or wedged server fails the
// probe and is restarted for the next one.
async function probe(name, srvName, srvArgs, fn, { fresh = false } = {}) {
  if (!selected(name)) return;
  if (performance.now() - t0 > CFG.totalTimeoutMs) return record(name, false, {}, 'skipped: total time limit reached');
  if (fresh && servers[srvName]) { await servers[srvName].stop(); delete servers[srvName]; }
  const srv = await server(srvName, srvArgs);
  if (!srv.running()) return record(name, false, {}, `server [${srv.name}] ${srvArgs.join(' ')} did not start: ${srv.startError}`);
  let out;
  try {
    out = await withTimeout(Promise.resolve().then(() => fn(srv)), CFG.probeTimeoutMs, `probe ${name}`);
  } catch (e) {
    out = { pass: false, nums: {}, note: `probe error: ${e.message}` };
  }
  const life = await srv.alive(FULL ? 15000 : 8000);
  let { pass, nums = {}, note = '' } = out;
  if (!life.ok) {
    pass = false;
    note = (note ? note + '; ' : '') + `AFTER: ${life.why}`;
    await srv.stop();
    await srv.ensure();
  }
  return record(name, pass, nums, note);
}

async function getLoad(srv) {
  const r = await http(srv.origin, 'GET', '/get_load', undefined, {}, 3000);
  if (r.status !== 200 || !Array.isArray(r.json)) return NaN;
  return r.json.reduce((a, x) => a + (x.num_reqs || 0), 0);
}

// Polls /get_load until num_reqs is 0; returns { zeroAfterMs, maxSeen }.
async function waitLoadZero(srv, timeoutMs) {
  const t = performance.now();
  let maxSeen = 0;
  for (let i = 0; i < 400; ++i) {
    const n = await getLoad(srv);
    if (n > maxSeen) maxSeen = n;
    if (n === 0) return { zeroAfterMs: performance.now() - t, maxSeen };
    if (performance.now() - t > timeoutMs) break;
    await sleep(25);
  }
  return { zeroAfterMs: NaN, maxSeen };
}

async function abortAll(srv) {
  await http(srv.origin, 'POST', '/abort_request', { abort_all: true });
  await waitLoadZero(srv, 15000);
}

// Starts a streaming request in the background. Returns { first, done, abort() }:
// `first` resolves at the first event (or with the status when refused),
// `done` when the stream ends (normally, refused or aborted).
function startStream(srv, path, body) {
  const ctrl = new AbortController();
  let firstResolve;
  const first = new Promise((r) => { firstResolve = r; });
  const done = sse(srv.origin, path, body, {
    signal: ctrl.signal,
    onEvent: () => { firstResolve({ status: 200 }); },
  }).then((out) => { firstResolve({ status: out.status, text: out.raw }); return { ended: true, status: out.status }; },
    (e) => { firstResolve({ status: 'ERR', error: e.message }); return { ended: true, status: 'ERR', error: e.message }; });
  return { first, done, abort: () => ctrl.abort() };
}

// Sends a streamed request, reads only the status and disconnects.
async function statusThenDisconnect(srv, path, body) {
  const ctrl = new AbortController();
  const t = performance.now();
  try {
    const res = await withTimeout(fetch(new URL(path, srv.origin), {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: ctrl.signal,
    }), 15000, `POST ${path}`);
    let text = '';
    if (res.status !== 200) text = await res.text();
    ctrl.abort();
    let json;
    try { json = JSON.parse(text); } catch { /* not JSON */ }
    return { status: res.status, text, json, ms: performance.now() - t };
  } catch (e) {
    ctrl.abort();
    return { status: 'ERR', error: e.message, text: '', ms: performance.now() - t };
  }
}

const pct = (sorted, p) => sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] : NaN;

// ---------------------------------------------------------------- server set

const MAIN_ARGS = ['--context-length', String(CFG.ctx), '--max-running-requests', '2', '--max-queued-requests', '4'];
const KEY_ARGS = ['--api-key', SECRET];
const LONG_TOKENS = 3000;
const LONG_ARGS = ['--context-length', '4096', '--max-running-requests', '4'];
const ORIGIN_ARGS = ['--allowed-origins', GOOD];
const CACHE_ARGS = ['--enable-cache-report'];

const CHAT = (extra = {}) => ({ messages: [{ role: 'user', content: 'hello there' }], max_tokens: 1, ...extra });
const COMPL = (extra = {}) => ({ prompt: 'hello there', max_tokens: 1, ...extra });
const RESP = (extra = {}) => ({ input: 'hello there', max_output_tokens: 1, ...extra });
const GEN = (extra = {}, sp = {}) => ({ text: 'hello there', sampling_params: { max_new_tokens: 1, ...sp }, ...extra });

// ================================================================ 1. deep JSON

function deepArr(d) { return '['.repeat(d) + ']'.repeat(d); }
function deepObj(d) { return '{"a":'.repeat(d) + '1' + '}'.repeat(d); }
// The body of `template` with the string "__DEEP__" replaced by a nested value.
function withDeep(template, deep) { return JSON.stringify(template).replace('"__DEEP__"', deep); }

const DEEP_CASES = [
  // [name, route, template, 'arr' | 'obj']
  ['chat.content', '/v1/chat/completions', CHAT({ messages: [{ role: 'user', content: '__DEEP__' }] }), 'arr'],
  ['chat.content_part', '/v1/chat/completions', CHAT({ messages: [{ role: 'user', content: [{ type: 'text', text: 'hi', extra: '__DEEP__' }] }] }), 'obj'],
  ['chat.tools_parameters', '/v1/chat/completions', CHAT({ tools: [{ type: 'function', function: { name: 'f', description: 'd', parameters: '__DEEP__' } }] }), 'obj'],
  ['chat.message_extra_key', '/v1/chat/completions', CHAT({ messages: [{ role: 'user', content: 'hi', extra: '__DEEP__' }] }), 'obj'],
  ['chat.tool_call_arguments', '/v1/chat/completions', CHAT({ messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '__DEEP__' } }] }, { role: 'tool', tool_call_id: 'c1', content: 'ok' }] }), 'obj'],
  ['chat.logit_bias', '/v1/chat/completions', CHAT({ logit_bias: '__DEEP__' }), 'obj'],
  ['chat.response_format', '/v1/chat/completions', CHAT({ response_format: { type: 'json_schema', json_schema: { name: 's', schema: '__DEEP__' } } }), 'obj'],
  ['chat.chat_template_kwargs', '/v1/chat/completions', CHAT({ chat_template_kwargs: '__DEEP__' }), 'obj'],
  ['chat.top_level_extra', '/v1/chat/completions', CHAT({ extra_body: '__DEEP__' }), 'arr'],
  ['responses.input', '/v1/responses', RESP({ input: '__DEEP__' }), 'arr'],
  ['responses.tools_parameters', '/v1/responses', RESP({ tools: [{ type: 'function', name: 'f', parameters: '__DEEP__' }] }), 'obj'],
  ['completions.prompt', '/v1/completions', COMPL({ prompt: '__DEEP__' }), 'arr'],
  ['completions.logit_bias', '/v1/completions', COMPL({ logit_bias: '__DEEP__' }), 'obj'],
  ['generate.sampling_params', '/generate', { text: 'hello', sampling_params: '__DEEP__' }, 'obj'],
  ['generate.sampling_params_inner', '/generate', GEN({}, { extra: '__DEEP__' }), 'arr'],
  ['generate.input_ids', '/generate', { input_ids: '__DEEP__', sampling_params: { max_new_tokens: 1 } }, 'arr'],
  ['tokenize.prompt', '/tokenize', { prompt: '__DEEP__' }, 'arr'],
  ['detokenize.tokens', '/detokenize', { tokens: '__DEEP__' }, 'arr'],
  ['abort_request.rid', '/abort_request', { rid: '__DEEP__' }, 'obj'],
  ['abort_request.extra', '/abort_request', { rid: 'none', extra: '__DEEP__' }, 'arr'],
];

async function deepJsonProbes() {
  for (const depth of CFG.deepDepths) {
    for (const [name, route, tpl, kind] of DEEP_CASES) {
      await probe(`deep_json/${name}@${depth}`, 'main', MAIN_ARGS, async (srv) => {
        const body = withDeep(tpl, kind === 'arr' ? deepArr(depth) : deepObj(depth));
        const r = await http(srv.origin, 'POST', route, body);
        const ok = r.status === 400 && isOpenAIError(r);
        return { pass: ok, nums: { status: r.status, ms: r.ms, body_kib: Math.round(body.length / 1024) }, note: ok ? '' : `expected 400 (depth limit); got ${brief(r)}` };
      });
    }
  }
}

// ================================================================ 2. floods

// Streams an endless header block at the server: `prefix`, then `unit`
// repeated, never the blank line that ends it. The server must answer (431,
// 414 or 400) or close before `budget` bytes, and its RSS must stay bounded.
async function headerFlood(srv, prefix, unit, budget) {
  const sampler = rssSampler(srv.pid);
  const t = performance.now();
  const timeLimit = FULL ? 90000 : 40000;
  const res = await new Promise((resolve) => {
    const sock = net.connect({ host: HOST, port: srv.port });
    const got = [];
    let sent = 0, closed = false, err = null, firstAnswerAt = NaN, sentAtAnswer = NaN;
    const unitBuf = Buffer.from(unit);
    let settle;
    const finish = () => { clearTimeout(settle); sock.destroy(); resolve({ sent, closed, err, got: Buffer.concat(got), firstAnswerAt, sentAtAnswer }); };
    sock.on('data', (d) => { got.push(d); if (Number.isNaN(firstAnswerAt)) { firstAnswerAt = performance.now() - t; sentAtAnswer = sent; } });
    sock.on('close', () => { closed = true; });
    sock.on('error', (e) => { err = e.message; closed = true; });
    sock.on('connect', async () => {
      sock.write(prefix);
      sent += prefix.length;
      for (let i = 0; i < 1e6 && sent < budget && !closed && got.length === 0 && performance.now() - t < timeLimit; ++i) {
        const more = sock.write(unitBuf);
        sent += unitBuf.length;
        if (!more) {
          // Wait for the server to read (drain), to close, or the time limit.
          await new Promise((r) => {
            const tm = setTimeout(r, Math.max(0, timeLimit - (performance.now() - t)));
            const done = () => { clearTimeout(tm); sock.off('drain', done); sock.off('close', done); r(); };
            sock.once('drain', done);
            sock.once('close', done);
          });
        }
      }
      // Give the server a moment to answer or close.
      settle = setTimeout(finish, 1500);
      if (closed) finish();
      else sock.once('close', finish);
    });
  });
  const rss = sampler.stop();
  const answered = parseResponses(res.got).responses[0];
  const stoppedEarly = res.closed || !!answered;
  const status = answered ? answered.status : res.closed ? 'closed' : 'none';
  const okStatus = !answered || [400, 413, 414, 431].includes(answered.status);
  const nums = {
    status, sent_mib: mib(res.sent), ms: performance.now() - t,
    rss_base_mib: mib(rss.base), rss_peak_mib: mib(rss.peak), rss_growth_mib: mib(rss.growth), rss_after_mib: mib(rss.after),
  };
  const why = [];
  if (!stoppedEarly || res.sent >= budget) why.push(`server neither answered nor closed before ${mib(budget)} MiB were sent`);
  if (!okStatus) why.push(`answered ${answered.status}, expected 431 (or 400/414)`);
  if (rss.growth > CFG.floodRssBound) why.push(`RSS grew by ${mib(rss.growth)} MiB (bound ${mib(CFG.floodRssBound)} MiB)`);
  return { pass: why.length === 0, nums, note: why.join('; ') };
}

async function floodProbes() {
  // Many headers, each line short: only a cap on the whole block stops it.
  const line = 'X-Flood: ' + 'a'.repeat(90) + '\r\n';
  await probe('flood/many_headers', 'flood', [], (srv) =>
    headerFlood(srv, 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n', line.repeat(Math.floor(65536 / line.length)), CFG.floodBudget), { fresh: true });
  // One request line without a newline.
  await probe('flood/endless_request_line', 'flood', [], (srv) =>
    headerFlood(srv, 'GET /', 'a'.repeat(65536), CFG.floodBudget), { fresh: true });
  // One header line without a newline.
  await probe('flood/endless_header_line', 'flood', [], (srv) =>
    headerFlood(srv, 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: ', 'b'.repeat(65536), CFG.floodBudget), { fresh: true });

  // 16 parallel 30 MiB bodies: refused (413) or buffered within a bound.
  await probe('flood/parallel_bodies_16x30MiB', 'flood', [], async (srv) => {
    const pad = CFG.bodyBytes - '{"messages":5,"pad":""}'.length;
    const body = Buffer.from('{"messages":5,"pad":"' + 'a'.repeat(pad) + '"}');
    const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`;
    const sampler = rssSampler(srv.pid);
    const t = performance.now();
    const one = () => new Promise((resolve) => {
      const sock = net.connect({ host: HOST, port: srv.port });
      const got = [];
      let finished = false;
      const done = (why) => { if (finished) return; finished = true; clearTimeout(tm); sock.destroy(); resolve({ why, got: Buffer.concat(got) }); };
      const tm = setTimeout(() => done('timeout'), 60000);
      sock.on('data', (d) => got.push(d));
      sock.on('close', () => done('closed'));
      sock.on('error', () => done('error'));
      sock.on('connect', async () => {
        sock.write(head);
        for (let off = 0; off < body.length && !finished; off += MiB) {
          if (!sock.write(body.subarray(off, Math.min(body.length, off + MiB)))) {
            await new Promise((r) => { const d = () => { sock.off('close', d); sock.off('drain', d); r(); }; sock.once('drain', d); sock.once('close', d); });
          }
        }
      });
    });
    const outs = await Promise.all(Array.from({ length: CFG.bodyCount }, one));
    const rss = sampler.stop();
    const statuses = {};
    for (const o of outs) {
      const r = parseResponses(o.got).responses[0];
      const k = r ? r.status : o.why;
      statuses[k] = (statuses[k] || 0) + 1;
    }
    // RSS must come back near the baseline (freed buffers returned).
    let settled = NaN;
    const ts = performance.now();
    for (let i = 0; i < 100 && performance.now() - ts < 10000; ++i) {
      const r = procStatus(srv.pid).rss;
      if (r - rss.base <= CFG.bodyRssSettle) { settled = performance.now() - ts; break; }
      await sleep(100);
    }
    const after = procStatus(srv.pid).rss;
    const nums = {
      statuses: Object.entries(statuses).map(([k, v]) => `${k}x${v}`).join('/'), ms: performance.now() - t,
      rss_base_mib: mib(rss.base), rss_peak_mib: mib(rss.peak), rss_growth_mib: mib(rss.growth), rss_after_mib: mib(after),
      settle_ms: settled,
    };
    const why = [];
    if (rss.growth > CFG.bodyRssBound) why.push(`RSS peak grew by ${mib(rss.growth)} MiB (bound ${mib(CFG.bodyRssBound)} MiB)`);
    if (Number.isNaN(settled)) why.push(`RSS still ${mib(after - rss.base)} MiB above the baseline 10 s later (bound ${mib(CFG.bodyRssSettle)} MiB)`);
    const bad = Object.keys(statuses).filter((k) => !['413', '400', '503', 'closed'].includes(k));
    if (bad.length) why.push(`unexpected outcomes ${bad.join(',')}`);
    return { pass: why.length === 0, nums, note: why.join('; ') };
  }, { fresh: true });
  if (servers.flood) { await servers.flood.stop(); delete servers.flood; }
}

// ================================================================ 3. slowloris

async function slowlorisProbes() {
  if (!selected('slowloris/')) return;
  let stats = null;
  await probe('slowloris/health_latency', 'slow', [], async (srv) => {
    const N = CFG.slowConns;
    const conns = [];
    const t = performance.now();
    const head = 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ';
    // Open the slow connections in batches of 50 (bounded in time).
    for (let i = 0; i < N && performance.now() - t < 15000; ++i) {
      const c = { openedAt: performance.now(), closedAt: NaN, error: null, sent: 0, timer: null };
      c.sock = net.connect({ host: HOST, port: srv.port });
      c.sock.on('connect', () => {
        c.sock.write(head.slice(0, 10)); c.sent = 10;
        let k = 10;
        // One byte a second, never the end of the header block; 'a' padding
        // once the prefix is out.
        c.timer = setInterval(() => {
          if (c.sock.destroyed) return clearInterval(c.timer);
          c.sock.write(k < head.length ? head[k] : 'a');
          k++; c.sent++;
        }, 1000 + (i % 97));
      });
      const closed = () => { if (Number.isNaN(c.closedAt)) c.closedAt = performance.now(); if (c.timer) clearInterval(c.timer); };
      c.sock.on('close', closed);
      c.sock.on('end', closed);
      c.sock.on('error', (e) => { c.error = e.code || e.message; closed(); });
      c.sock.on('data', () => {});
      conns.push(c);
      if (i % 50 === 49) await sleep(50);
    }
    // Meanwhile an ordinary client polls /health every 200 ms (each poll on
    // its own connection, started on schedule whether or not the previous
    // one was answered; a poll unanswered after 3 s counts as failed).
    const polls = [];
    const tEnd = t + CFG.slowObserveS * 1000;
    for (let i = 0; i < 10000 && performance.now() < tEnd - 3000; ++i) {
      polls.push(http(srv.origin, 'GET', '/health', undefined, {}, 3000));
      await sleep(CFG.healthEveryMs);
    }
    const answers = await Promise.all(polls);
    const lat = answers.map((r) => r.ms);
    const failed = answers.filter((r) => r.status !== 200);
    const failures = failed.length, firstFailure = failed.length ? brief(failed[0]) : '';
    const left = tEnd - performance.now();
    if (left > 0) await sleep(left);
    const closedCount = conns.filter((c) => !Number.isNaN(c.closedAt)).length;
    const closeAges = conns.filter((c) => !Number.isNaN(c.closedAt)).map((c) => (c.closedAt - c.openedAt) / 1000).sort((a, b) => a - b);
    const openErrors = conns.filter((c) => c.error && c.sent === 0).length;
    for (const c of conns) { if (c.timer) clearInterval(c.timer); c.sock.destroy(); }
    lat.sort((a, b) => a - b);
    stats = { N, closedCount, closeAges, openErrors };
    const nums = {
      conns: N, health_n: lat.length, health_fail: failures,
      p50_ms: pct(lat, 50), p99_ms: pct(lat, 99), max_ms: lat[lat.length - 1],
    };
    const why = [];
    if (failures) why.push(`${failures} /health polls failed (first: ${firstFailure})`);
    if (lat[lat.length - 1] > CFG.healthMaxMs) why.push(`/health max latency ${Math.round(lat[lat.length - 1])} ms > ${CFG.healthMaxMs} ms`);
    return { pass: why.length === 0, nums, note: why.join('; ') };
  }, { fresh: true });
  if (stats) {
    const { N, closedCount, closeAges, openErrors } = stats;
    const late = closeAges.filter((a) => a > CFG.slowHeaderDeadlineS + 2).length;
    const why = [];
    if (closedCount < N) why.push(`${N - closedCount} of ${N} slow connections still open after ${CFG.slowObserveS} s (target: closed by a header deadline of <= ${CFG.slowHeaderDeadlineS} s)`);
    if (late) why.push(`${late} closed later than ${CFG.slowHeaderDeadlineS} s`);
    if (openErrors) why.push(`${openErrors} could not connect`);
    record('slowloris/header_deadline', why.length === 0,
      { conns: N, closed_conns: closedCount, close_p50_s: pct(closeAges, 50), close_max_s: closeAges.length ? closeAges[closeAges.length - 1] : NaN },
      why.join('; '));
  }
  if (servers.slow) { await servers.slow.stop(); delete servers.slow; }
}

// ================================================================ 4. refused requests leave nothing

async function refusedLeaveNothing(srv, path, body, expectStatuses) {
  const reqs0 = await metricValue(srv.origin, 'sglang:num_requests_total').catch(() => NaN);
  const r = await statusThenDisconnect(srv, path, body);
  const w = await waitLoadZero(srv, 1000);
  const reqs1 = await metricValue(srv.origin, 'sglang:num_requests_total').catch(() => NaN);
  await abortAll(srv);  // clean up what a failing server left running
  const nums = { status: r.status, ms: r.ms, load_max: w.maxSeen, load_zero_ms: w.zeroAfterMs, engine_reqs_delta: reqs1 - reqs0 };
  const why = [];
  if (!expectStatuses.includes(r.status)) why.push(`expected ${expectStatuses.join('/')}; got ${brief(r)}`);
  if (Number.isNaN(w.zeroAfterMs)) why.push(`/get_load num_reqs still ${w.maxSeen > 0 ? '>0' : 'unknown'} 1 s after the refusal (saw ${w.maxSeen}): the refused request left work running`);
  return { pass: why.length === 0, nums, note: why.join('; ') };
}

async function refusedProbes() {
  const long = 'x '.repeat(CFG.ctx * 3);
  const longIds = Array.from({ length: CFG.ctx * 2 }, (_, i) => 100 + (i % 500));
  await probe('refused/completions_last_prompt_too_long', 'main', MAIN_ARGS, (srv) =>
    refusedLeaveNothing(srv, '/v1/completions', { prompt: ['hello there', 'general kenobi', long], max_tokens: 100, ignore_eos: true, stream: true }, [400]));
  await probe('refused/generate_text_list_last_too_long', 'main', MAIN_ARGS, (srv) =>
    refusedLeaveNothing(srv, '/generate', { text: ['hello there', 'general kenobi', long], stream: true, sampling_params: { max_new_tokens: 100, ignore_eos: true } }, [400]));
  await probe('refused/generate_input_ids_last_too_long', 'main', MAIN_ARGS, (srv) =>
    refusedLeaveNothing(srv, '/generate', { input_ids: [[100, 101, 102], [200, 201], longIds], stream: true, sampling_params: { max_new_tokens: 100, ignore_eos: true } }, [400]));
  await probe('refused/generate_empty_last_prompt', 'main', MAIN_ARGS, (srv) =>
    refusedLeaveNothing(srv, '/generate', { text: ['hello there', 'general kenobi', ''], stream: true, sampling_params: { max_new_tokens: 100, ignore_eos: true } }, [400]));
  await probe('refused/chat_n16_over_queue_limit', 'main', MAIN_ARGS, (srv) =>
    refusedLeaveNothing(srv, '/v1/chat/completions', CHAT({ n: 16, max_tokens: 100, ignore_eos: true, stream: true }), [503, 400, 429]));
}

// ================================================================ 5. duplicate rid

async function dupRid(srv, how) {
  const rid = `probe-dup-${how}-${Math.random().toString(16).slice(2, 10)}`;
  // Long enough (thousands of tokens) that neither stream ends by itself
  // during the probe: only the abort can end them.
  const body = { text: 'hello there', rid, stream: true, sampling_params: { max_new_tokens: LONG_TOKENS, ignore_eos: true } };
  const a = startStream(srv, '/generate', body);
  const fa = await withTimeout(a.first, 15000, 'first event of the first request').catch((e) => ({ status: 'ERR', error: e.message }));
  if (fa.status !== 200) { a.abort(); return { pass: false, nums: { a_status: fa.status }, note: `the first request did not stream: ${fa.error || fa.text}` }; }
  const b = startStream(srv, '/generate', body);
  const fb = await withTimeout(b.first, 15000, 'the second request').catch((e) => ({ status: 'ERR', error: e.message }));
  const abortBody = how === 'rid' ? { rid } : { abort_all: true };
  const ab = await http(srv.origin, 'POST', '/abort_request', abortBody);
  const t = performance.now();
  const ended = (s) => withTimeout(s.done, 5000, 'stream end').then(() => true, () => false);
  const [aEnded, bEnded] = await Promise.all([ended(a), fb.status === 200 ? ended(b) : Promise.resolve(true)]);
  const endMs = performance.now() - t;
  const w = await waitLoadZero(srv, 3000);
  a.abort(); b.abort();  // the caller kills this throwaway server: whatever still runs dies with it
  const nums = { second_status: fb.status, abort_status: ab.status, streams_end_ms: aEnded && bEnded ? endMs : NaN, load_zero_ms: w.zeroAfterMs };
  const why = [];
  if (fb.status !== 400 && fb.status !== 200) why.push(`second request with the same rid: expected 400 (or accepted and abortable), got ${fb.status} ${fb.error || fb.text || ''}`);
  if (ab.status !== 200) why.push(`/abort_request ${JSON.stringify(abortBody)} answered ${brief(ab)}`);
  if (!aEnded) why.push('the first stream did not end within 5 s of the abort');
  if (!bEnded) why.push('the second stream did not end within 5 s of the abort');
  if (Number.isNaN(w.zeroAfterMs)) why.push('/get_load num_reqs did not go to 0');
  if (fb.status === 400 && !isOpenAIError({ json: (() => { try { return JSON.parse(fb.text); } catch { return null; } })() }))
    why.push('the 400 has no OpenAI-shaped error body');
  return { pass: why.length === 0, nums, note: why.join('; ') };
}

async function dupRidProbes() {
  for (const how of ['rid', 'all']) {
    await probe(`dup_rid/abort_${how === 'rid' ? 'by_rid' : 'all'}`, 'long', LONG_ARGS, (srv) => dupRid(srv, how), { fresh: true });
    if (servers.long) { await servers.long.kill(); delete servers.long; }
  }
}

// ================================================================ 6. cross-origin

async function corsProbes() {
  await probe('cors/text_plain_post_refused', 'main', MAIN_ARGS, async (srv) => {
    const r = await http(srv.origin, 'POST', '/abort_request', '{"abort_all": true}', { 'Content-Type': 'text/plain', Origin: EVIL });
    const ok = r.status === 415 || r.status === 400;
    return { pass: ok, nums: { status: r.status }, note: ok ? '' : `a text/plain POST (a CORS "simple request" any web page can send) was executed: ${brief(r)}` };
  });
  await probe('cors/no_wildcard_acao', 'main', MAIN_ARGS, async (srv) => {
    const seen = [];
    for (const [m, p, b] of [['GET', '/v1/models'], ['GET', '/get_server_info'], ['POST', '/tokenize', { prompt: 'hi' }]]) {
      const r = await http(srv.origin, m, p, b, { Origin: EVIL });
      const acao = r.headers['access-control-allow-origin'];
      if (acao === '*' || acao === EVIL) seen.push(`${m} ${p}: ACAO ${acao}`);
    }
    return { pass: seen.length === 0, nums: { reflected: seen.length }, note: seen.length ? `Access-Control-Allow-Origin for ${EVIL}: ${seen.join(', ')}` : '' };
  });
  await probe('cors/allowed_origins', 'origins', ORIGIN_ARGS, async (srv) => {
    const good = await http(srv.origin, 'GET', '/v1/models', undefined, { Origin: GOOD });
    const bad = await http(srv.origin, 'GET', '/v1/models', undefined, { Origin: EVIL });
    const ga = good.headers['access-control-allow-origin'], ba = bad.headers['access-control-allow-origin'];
    const why = [];
    if (ga !== GOOD) why.push(`Origin ${GOOD}: ACAO ${ga}, expected ${GOOD}`);
    if (ba !== undefined) why.push(`Origin ${EVIL}: ACAO ${ba}, expected none`);
    return { pass: why.length === 0, nums: { good_status: good.status, bad_status: bad.status }, note: why.join('; ') };
  });
  await probe('cors/preflight_with_api_key', 'key', KEY_ARGS, async (srv) => {
    const r = await http(srv.origin, 'OPTIONS', '/v1/chat/completions', undefined, {
      Origin: GOOD, 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization, content-type',
    });
    const acah = String(r.headers['access-control-allow-headers'] || '');
    const why = [];
    if (r.status !== 204 && r.status !== 200) why.push(`preflight answered ${brief(r)}, expected 204/200`);
    if (!/authorization/i.test(acah)) why.push(`Access-Control-Allow-Headers "${acah}" lacks authorization`);
    return { pass: why.length === 0, nums: { status: r.status }, note: why.join('; ') };
  });
}

// ================================================================ 7. HTTP framing

async function framingProbes() {
  await probe('framing/duplicate_content_length', 'main', MAIN_ARGS, async (srv) => {
    const body = '{"prompt":"hi"}';
    const x = await rawExchange(srv.port, [
      `POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nContent-Length: 5\r\n\r\n${body}`,
    ], { expect: 1 });
    const r = x.responses[0];
    const ok = r && r.status === 400;
    return { pass: ok, nums: { status: r ? r.status : x.closed ? 'closed' : 'none', responses: x.responses.length }, note: ok ? '' : `expected 400; got ${r ? `${r.status} ${r.body.slice(0, 100)}` : 'no response'}` };
  });
  await probe('framing/te_identity_chunked', 'main', MAIN_ARGS, async (srv) => {
    const json = '{"prompt":"hi"}';
    const chunked = `${json.length.toString(16)}\r\n${json}\r\n0\r\n\r\n`;
    const x = await rawExchange(srv.port, [
      `POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: identity, chunked\r\n\r\n${chunked}` +
      'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n',
    ], { expect: 2, timeoutMs: 5000 });
    const [r0, r1] = x.responses;
    const tokenized = r0 && r0.status === 200 && /"tokens"/.test(r0.body);
    const healthOk = r1 && r1.status === 200 && !/"error"/.test(r1.body);
    const only = x.responses.length === 1;
    let ok = false;
    if (tokenized) ok = (only && x.closed) || (x.responses.length === 2 && healthOk);
    else if (r0 && (r0.status === 400 || r0.status === 501)) ok = (only && x.closed) || (x.responses.length === 2 && healthOk);
    const desc = x.responses.map((r) => `${r.status}${r.body ? ' ' + r.body.slice(0, 60).replace(/\s+/g, ' ') : ''}`).join(' | ') || 'no response';
    return {
      pass: ok, nums: { responses: x.responses.length, first: r0 ? r0.status : 'none', closed: x.closed ? 1 : 0 },
      note: ok ? '' : `expected the body read as chunked (200) or 400/501 with no desync; got [${desc}]${x.closed ? ' then close' : ', connection left open'}`,
    };
  });
  await probe('framing/pipelined_health', 'main', MAIN_ARGS, async (srv) => {
    const one = 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n';
    const x = await rawExchange(srv.port, [one + one], { expect: 2, timeoutMs: 4000 });
    const st = x.responses.map((r) => r.status);
    const ok = (st.length === 2 && st[0] === 200 && st[1] === 200) || (st.length === 1 && st[0] === 200 && x.closed && x.rest.length === 0);
    return { pass: ok, nums: { responses: st.length, statuses: st.join('/') || 'none' }, note: ok ? '' : `expected two 200s (or one and a clean close); got [${st.join(',')}]${x.rest.length ? ` + ${x.rest.length} unparsed bytes` : ''}` };
  });
}

// ================================================================ 8. wrong types

const BAD = {
  scalarsNotBool: ['yes', 1, {}, []],
  notInt: ['5', 1.5, {}, [], true],
  notNumber: ['0.5', {}, [], true],
  notString: [5, {}, [], true],
  notObject: [5, 'x', [], true],
  notList: [5, 'x', {}, true],
};

function typeCases() {
  const cases = [];  // [name, route, body]
  const add = (route, field, values, mk) => values.forEach((v, i) => cases.push([`${route.replace(/^\/(v1\/)?/, '').replace('/completions', '')}.${field}#${i}`, route, mk(v)]));
  const chat = '/v1/chat/completions', compl = '/v1/completions', gen = '/generate';
  const user = { role: 'user', content: 'hi' };
  const fn = { type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } };
  // chat
  add(chat, 'messages', [5, 'hi', {}, [5], [{ role: 5, content: 'hi' }], [{ role: 'user', content: 5 }], [{ role: 'user', content: [5] }],
    [{ role: 'user', content: [{ type: 'text', text: 5 }] }], [{ role: 'user', content: [{ type: 5, text: 'x' }] }], [{ role: 'user', content: {} }]],
  (v) => CHAT({ messages: v }));
  add(chat, 'tools', [5, 'x', {}, [5], [{ type: 'function', function: 5 }], [{ type: 'function', function: { name: 5 } }],
    [{ type: 'function', function: { name: 'f', parameters: 5 } }], [{ type: 'function', function: { name: 'f', description: 5 } }], [{ type: 5, function: { name: 'f' } }]],
  (v) => CHAT({ tools: v }));
  add(chat, 'tool_choice', [5, [], true, { type: 'function', function: { name: 5 } }, { type: 'function', function: 5 }, { type: 5 }],
    (v) => CHAT({ tools: [fn], tool_choice: v }));
  add(chat, 'tool_calls', [5, 'x', [5], [{ id: 5, type: 'function', function: { name: 'f', arguments: '{}' } }],
    [{ id: 'c', type: 'function', function: { name: 5, arguments: '{}' } }], [{ id: 'c', type: 'function', function: { name: 'f', arguments: 5 } }],
    [{ id: 'c', type: 'function', function: 5 }]],
  (v) => CHAT({ tools: [fn], messages: [user, { role: 'assistant', content: '', tool_calls: v }, { role: 'tool', tool_call_id: 'c', content: 'ok' }] }));
  add(chat, 'name', [5, {}, [], true], (v) => CHAT({ messages: [{ role: 'user', content: 'hi', name: v }] }));
  add(chat, 'tool_call_id', [5, {}], (v) => CHAT({ tools: [fn], messages: [user, { role: 'assistant', content: '', tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{}' } }] }, { role: 'tool', tool_call_id: v, content: 'ok' }] }));
  add(chat, 'stream', BAD.scalarsNotBool, (v) => CHAT({ stream: v }));
  add(chat, 'stream_options', [5, 'x', [], { include_usage: 'yes' }], (v) => CHAT({ stream: true, stream_options: v }));
  add(chat, 'logit_bias', [5, 'x', [], { abc: 1 }, { 1: 'x' }, { 1: {} }], (v) => CHAT({ logit_bias: v }));
  add(chat, 'response_format', [5, 'json', [], { type: 5 }, { type: 'json_schema', json_schema: 5 }, { type: 'nonsense' }], (v) => CHAT({ response_format: v }));
  add(chat, 'separate_reasoning', ['yes', 5, {}], (v) => CHAT({ separate_reasoning: v }));
  add(chat, 'rid', BAD.notString, (v) => CHAT({ rid: v }));
  add(chat, 'model', [5, {}], (v) => CHAT({ model: v }));
  add(chat, 'max_tokens', [...BAD.notInt, -1, 0], (v) => CHAT({ max_tokens: v }));
  add(chat, 'max_completion_tokens', ['5', 1.5, {}], (v) => CHAT({ max_completion_tokens: v }));
  add(chat, 'temperature', BAD.notNumber, (v) => CHAT({ temperature: v }));
  add(chat, 'top_p', BAD.notNumber, (v) => CHAT({ top_p: v }));
  add(chat, 'n', [...BAD.notInt, 0], (v) => CHAT({ n: v }));
  add(chat, 'stop', [5, [5], {}, true, [[]]], (v) => CHAT({ stop: v }));
  add(chat, 'seed', ['1', 1.5, {}, [], true], (v) => CHAT({ seed: v }));
  add(chat, 'logprobs', BAD.scalarsNotBool, (v) => CHAT({ logprobs: v }));
  add(chat, 'top_logprobs', ['5', 1.5, {}, true], (v) => CHAT({ logprobs: true, top_logprobs: v }));
  add(chat, 'presence_penalty', ['1', {}], (v) => CHAT({ presence_penalty: v }));
  add(chat, 'chat_template_kwargs', [5, 'x', []], (v) => CHAT({ chat_template_kwargs: v }));
  // responses
  const resp = '/v1/responses';
  add(resp, 'input', [5, {}, true, [5], [{ role: 5, content: 'hi' }], [{ role: 'user', content: 5 }], [{ role: 'user', content: [{ type: 'input_text', text: 5 }] }],
    [{ type: 'function_call', call_id: 5, name: 'f', arguments: '{}' }], [{ type: 'function_call_output', call_id: 'c', output: 5 }], [{ type: 'reasoning', summary: 5 }]],
  (v) => RESP({ input: v }));
  add(resp, 'tools', [5, {}, [5], [{ type: 'function', name: 5 }], [{ type: 'function', name: 'f', parameters: 5 }], [{ type: 'function', name: 'f', strict: 'yes' }]],
    (v) => RESP({ tools: v }));
  add(resp, 'tool_choice', [5, [], true, 'sometimes', { type: 'function', name: 5 }], (v) => RESP({ tools: [{ type: 'function', name: 'f' }], tool_choice: v }));
  add(resp, 'reasoning', [5, 'high', { effort: 5 }, { effort: 'extreme' }], (v) => RESP({ reasoning: v }));
  add(resp, 'text', [5, { format: 5 }, { format: { type: 5 } }, { format: { type: 'json_schema', name: 'a', schema: 5 } }], (v) => RESP({ text: v }));
  add(resp, 'max_output_tokens', [...BAD.notInt, -1, 0], (v) => RESP({ max_output_tokens: v }));
  add(resp, 'temperature', BAD.notNumber, (v) => RESP({ temperature: v }));
  add(resp, 'stream', BAD.scalarsNotBool, (v) => RESP({ stream: v }));
  add(resp, 'store', BAD.scalarsNotBool, (v) => RESP({ store: v }));
  add(resp, 'metadata', [5, 'x', [], { a: 5 }], (v) => RESP({ metadata: v }));
  add(resp, 'previous_response_id', [5, {}, 'resp_missing'], (v) => RESP({ previous_response_id: v }));
  add(resp, 'background', [true], (v) => RESP({ background: v }));
  // completions
  add(compl, 'prompt', [5, {}, [{}], [['a']], true, null, [], [1.5]], (v) => COMPL({ prompt: v }));
  add(compl, 'stream', BAD.scalarsNotBool, (v) => COMPL({ stream: v }));
  add(compl, 'stream_options', [5, 'x', []], (v) => COMPL({ stream: true, stream_options: v }));
  add(compl, 'logit_bias', [5, 'x', [], { 1: 'x' }], (v) => COMPL({ logit_bias: v }));
  add(compl, 'max_tokens', BAD.notInt, (v) => COMPL({ max_tokens: v }));
  add(compl, 'temperature', BAD.notNumber, (v) => COMPL({ temperature: v }));
  add(compl, 'top_p', BAD.notNumber, (v) => COMPL({ top_p: v }));
  add(compl, 'n', BAD.notInt, (v) => COMPL({ n: v }));
  add(compl, 'stop', [5, [5], {}], (v) => COMPL({ stop: v }));
  add(compl, 'seed', ['1', 1.5, {}], (v) => COMPL({ seed: v }));
  add(compl, 'logprobs', ['5', true, 1.5, {}], (v) => COMPL({ logprobs: v }));
  add(compl, 'echo', ['yes', 1], (v) => COMPL({ echo: v }));
  add(compl, 'rid', BAD.notString, (v) => COMPL({ rid: v }));
  add(compl, 'model', [5, {}], (v) => COMPL({ model: v }));
  // generate
  add(gen, 'text', [5, {}, [5], true], (v) => ({ text: v, sampling_params: { max_new_tokens: 1 } }));
  add(gen, 'input_ids', ['x', [['a']], [1.5], {}, [[]]], (v) => ({ input_ids: v, sampling_params: { max_new_tokens: 1 } }));
  add(gen, 'sampling_params', [5, 'x', [], true], (v) => ({ text: 'hi', sampling_params: v }));
  add(gen, 'sampling_params.max_new_tokens', ['5', 1.5, {}, true], (v) => GEN({}, { max_new_tokens: v }));
  add(gen, 'sampling_params.temperature', BAD.notNumber, (v) => GEN({}, { temperature: v }));
  add(gen, 'sampling_params.stop', [5, [5], {}], (v) => GEN({}, { stop: v }));
  add(gen, 'sampling_params.seed', ['1', 1.5], (v) => GEN({}, { seed: v }));
  add(gen, 'sampling_params.skip_special_tokens', ['yes', 1], (v) => GEN({}, { skip_special_tokens: v }));
  add(gen, 'rid', BAD.notString, (v) => GEN({ rid: v }));
  add(gen, 'stream', BAD.scalarsNotBool, (v) => GEN({ stream: v }));
  add(gen, 'return_logprob', ['yes', 1], (v) => GEN({ return_logprob: v }));
  add(gen, 'top_logprobs_num', ['5', 1.5, {}], (v) => GEN({ return_logprob: true, top_logprobs_num: v }));
  // other JSON routes
  add('/tokenize', 'prompt', [5, {}, [], null], (v) => ({ prompt: v }));
  add('/detokenize', 'tokens', ['x', [1.5], [{}], {}], (v) => ({ tokens: v }));
  add('/abort_request', 'rid', [5, {}, []], (v) => ({ rid: v }));
  add('/abort_request', 'abort_all', ['yes', 1, {}], (v) => ({ abort_all: v }));
  return cases;
}

async function typeProbes() {
  const cases = typeCases();
  for (const [name, route, body] of cases) {
    await probe(`types/${name}`, 'main', MAIN_ARGS, async (srv) => {
      // Streamed requests that a lenient server accepts are cut off after
      // their status line (their choices are 1 token long anyway).
      const r = body.stream === true ? await statusThenDisconnect(srv, route, body) : await http(srv.origin, 'POST', route, body);
      const ok = r.status === 400 && isOpenAIError(r);
      let note = '';
      if (!ok) {
        note = r.status === 400 ? `400 without an OpenAI-shaped error body: ${brief(r)}` : `expected 400; got ${brief(r)}`;
        note += `  body=${JSON.stringify(body).slice(0, 160)}`;
      }
      return { pass: ok, nums: { status: r.status, ms: r.ms }, note };
    });
  }
  if (servers.main?.running()) await abortAll(servers.main);
}

// ================================================================ 9. leaks between clients

async function leakProbes() {
  await probe('leak/server_info_hides_api_key', 'key', KEY_ARGS, async (srv) => {
    const auth = { Authorization: `Bearer ${SECRET}` };
    const where = [];
    const statuses = [];
    for (const p of ['/get_server_info', '/server_info', '/get_model_info', '/v1/models', '/metrics']) {
      const r = await http(srv.origin, 'GET', p, undefined, auth);
      statuses.push(r.status);
      if (String(r.text).includes(SECRET) || JSON.stringify(r.headers).includes(SECRET)) where.push(p);
    }
    const ok = where.length === 0 && statuses[0] === 200;
    return { pass: ok, nums: { info_status: statuses[0], leaks: where.length }, note: ok ? '' : where.length ? `the API key appears in ${where.join(', ')}` : `/get_server_info answered ${statuses[0]}` };
  });
  const cached = async (srv, route, body) => {
    const a = await http(srv.origin, 'POST', route, body);
    const b = await http(srv.origin, 'POST', route, body);
    const v = (r) => r.json?.usage?.prompt_tokens_details?.cached_tokens;
    return { a, b, va: v(a), vb: v(b) };
  };
  const prompt = 'the secret plan of client A is to meet at the old mill at noon';
  for (const [route, body] of [['/v1/chat/completions', CHAT({ messages: [{ role: 'user', content: prompt }] })], ['/v1/completions', COMPL({ prompt })]]) {
    const short = route.replace(/^\/v1\//, '');
    await probe(`leak/cached_tokens_hidden_by_default/${short}`, 'main', MAIN_ARGS, async (srv) => {
      const { a, b, va, vb } = await cached(srv, route, body);
      const hidden = (x) => x === undefined || x === null;
      const ok = a.status === 200 && b.status === 200 && hidden(va) && hidden(vb);
      return {
        pass: ok, nums: { status: b.status, cached_first: va ?? 'absent', cached_second: vb ?? 'absent' },
        note: ok ? '' : a.status !== 200 || b.status !== 200 ? `requests failed: ${brief(a)} / ${brief(b)}` : 'usage.prompt_tokens_details.cached_tokens is reported without --enable-cache-report (tells a client what other clients sent)',
      };
    });
  }
  await probe('leak/cached_tokens_with_cache_report', 'cache', CACHE_ARGS, async (srv) => {
    const { a, b, vb } = await cached(srv, '/v1/chat/completions', CHAT({ messages: [{ role: 'user', content: prompt }] }));
    const ok = a.status === 200 && b.status === 200 && typeof vb === 'number';
    return { pass: ok, nums: { status: b.status, cached_second: vb ?? 'absent' }, note: ok ? '' : `with --enable-cache-report cached_tokens should be a number; got ${vb} (${brief(b)})` };
  });
}

// ================================================================ 10. max_tokens over the context

async function maxTokensProbes() {
  const over = CFG.ctx - 2;  // any prompt of 3+ tokens puts prompt + max_tokens over the context
  const cases = [
    ['chat', '/v1/chat/completions', CHAT({ max_tokens: over, stream: true })],
    ['chat_max_completion_tokens', '/v1/chat/completions', CHAT({ max_tokens: undefined, max_completion_tokens: over, stream: true })],
    ['completions', '/v1/completions', COMPL({ prompt: 'hello there general kenobi', max_tokens: over, stream: true })],
    ['generate', '/generate', GEN({ text: 'hello there general kenobi', stream: true }, { max_new_tokens: over })],
  ];
  for (const [name, route, body] of cases) {
    await probe(`max_tokens_over_context/${name}`, 'main', MAIN_ARGS, async (srv) => {
      const r = await statusThenDisconnect(srv, route, body);
      await abortAll(srv);
      const ok = r.status === 400 && isOpenAIError(r);
      return { pass: ok, nums: { status: r.status, ms: r.ms, max_tokens: over, ctx: CFG.ctx }, note: ok ? '' : `prompt + ${over} > context ${CFG.ctx}: expected 400; got ${brief(r)}${r.status === 200 ? ' (silently clamped)' : ''}` };
    });
  }
}

// ================================================================ main

async function main() {
  const watchdog = setTimeout(() => {
    console.log(`FAIL  probe-suite  -- total time limit ${CFG.totalTimeoutMs / 1000} s exceeded`);
    if (opt.csv) writeCsv(opt.csv);
    process.exit(1);
  }, CFG.totalTimeoutMs + 60000);
  watchdog.unref();
  console.log(`# dsv4 probe suite, ${opt.mode} mode`);
  await deepJsonProbes();
  await typeProbes();
  await refusedProbes();
  await dupRidProbes();
  await maxTokensProbes();
  await corsProbes();
  await framingProbes();
  await leakProbes();
  await floodProbes();
  await slowlorisProbes();
  for (const s of Object.values(servers)) {
    if (s.restarts) console.log(`# server [${s.name}] was restarted ${s.restarts} time(s) after a probe killed or wedged it`);
    await s.stop();
  }
  const failed = results.filter((r) => !r.pass);
  const byClass = {};
  for (const r of results) {
    const c = r.name.split('/')[0];
    byClass[c] = byClass[c] || { pass: 0, fail: 0 };
    byClass[c][r.pass ? 'pass' : 'fail']++;
  }
  console.log(`# summary: ${results.length - failed.length} passed, ${failed.length} failed in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  for (const [c, v] of Object.entries(byClass)) console.log(`#   ${c.padEnd(24)} pass ${v.pass}  fail ${v.fail}`);
  if (opt.csv) { writeCsv(opt.csv); console.log(`# wrote ${opt.csv}`); }
  process.exit(failed.length ? 1 : 0);
}

main().catch((e) => { console.error(e); process.exit(1); });
