// Speculative decoding through the server: NGRAM and EAGLE servers answer
// /generate with exactly the tokens and logprobs of a plain server (greedy
// and seeded), report SGLang's meta_info spec fields and metrics, say so at
// startup, and refuse what cannot run with one clear line. An EAGLE server
// with a draft vocabulary (--speculative-token-map) answers the same.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, metricValue, dsv4Bin, modelDir } from './lib.mjs';

// A prompt that repeats itself, so that n-gram drafts have something to copy.
const prompt = 'def f(x):\n    return x + 1\n\n'.repeat(6) + 'def f(x):\n';
const servers = {};
// A draft vocabulary: every seventh token id, as a JSON array.
const mapDir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsv4-token-map-'));
const tokenMap = path.join(mapDir, 'map.json');
fs.writeFileSync(tokenMap, JSON.stringify(Array.from({ length: 18469 }, (_, i) => 7 * i)));

before(async () => {
  servers.plain = await startServer([]);
  servers.ngram = await startServer(['--speculative-algorithm', 'NGRAM', '--speculative-num-draft-tokens', '6',
    '--speculative-ngram-max-match-window-size', '8', '--disable-speculative-bypass']);
  servers.eagle = await startServer(['--speculative-algorithm', 'EAGLE', '--speculative-num-steps', '2',
    '--speculative-eagle-topk', '1', '--speculative-num-draft-tokens', '3', '--disable-speculative-bypass']);
  servers.eagle_map = await startServer(['--speculative-algorithm', 'EAGLE', '--speculative-token-map', tokenMap,
    '--disable-speculative-bypass']);
});
after(async () => {
  for (const s of Object.values(servers)) await s.stop();
  fs.rmSync(mapDir, { recursive: true, force: true });
});

async function generate(server, samplingParams) {
  const r = await postJSON(server.origin, '/generate', {
    text: prompt, return_logprob: true,
    sampling_params: { max_new_tokens: 40, ignore_eos: true, ...samplingParams },
  });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

for (const [name, params] of [['greedy', { temperature: 0 }],
  ['seeded sampling', { temperature: 0.8, top_k: 40, sampling_seed: 11 }]]) {
  test(`${name}: NGRAM and EAGLE give the plain server's tokens and logprobs`, async () => {
    const plain = await generate(servers.plain, params);
    for (const kind of ['ngram', 'eagle', 'eagle_map']) {
      const spec = await generate(servers[kind], params);
      assert.deepEqual(spec.output_ids, plain.output_ids, kind);
      assert.deepEqual(spec.meta_info.output_token_logprobs, plain.meta_info.output_token_logprobs, kind);
      // EAGLE drafts every step; n-gram drafts need a repeat, which random
      // weights produce greedily (loops) but rarely when sampling.
      if (kind !== 'ngram' || name === 'greedy') {
        assert.ok(spec.meta_info.spec_verify_ct > 0, `${kind}: no verify step in meta_info`);
        assert.ok(spec.meta_info.spec_accept_length >= 1);
        assert.ok(spec.meta_info.spec_draft_token_num >= spec.meta_info.spec_accept_token_num);
      }
      assert.equal(plain.meta_info.spec_verify_ct, undefined);
    }
  });
}

test('a JSON-schema request drafts under its grammar and keeps the plain server\'s tokens', async () => {
  // The schema's fixed keys and punctuation are tokens the grammar forces:
  // they are drafted without a drafter and always accepted.
  const schema = {
    type: 'object', additionalProperties: false, required: ['name', 'version', 'tags'],
    properties: {
      name: { type: 'string', maxLength: 12 }, version: { type: 'integer' },
      tags: { type: 'array', maxItems: 3, items: { type: 'string', maxLength: 8 } },
    },
  };
  for (const params of [{ temperature: 0 }, { temperature: 0.8, top_k: 40, sampling_seed: 3 }]) {
    const sampling = { ...params, max_new_tokens: 200, ignore_eos: false, json_schema: JSON.stringify(schema) };
    const plain = await generate(servers.plain, sampling);
    JSON.parse(plain.text);
    for (const kind of ['ngram', 'eagle']) {
      const spec = await generate(servers[kind], sampling);
      assert.deepEqual(spec.output_ids, plain.output_ids, kind);
      assert.deepEqual(spec.meta_info.output_token_logprobs, plain.meta_info.output_token_logprobs, kind);
      assert.ok(spec.meta_info.spec_verify_ct > 0, `${kind}: no verify step`);
      assert.ok(spec.meta_info.spec_accept_token_num > 0, `${kind}: no draft accepted`);
    }
  }
});

test('metrics and the startup log describe speculation', async () => {
  await generate(servers.ngram, { temperature: 0 });
  assert.ok(await metricValue(servers.ngram.origin, 'dsv4:spec_verify_total') > 0);
  assert.ok(await metricValue(servers.ngram.origin, 'sglang:spec_accept_length') >= 1);
  assert.match(servers.ngram.stderr(), /speculative decoding: NGRAM, up to 5 drafts per step/);
  assert.match(servers.eagle.stderr(), /speculative decoding: EAGLE, up to 2 drafts per step \(MTP top-1 chain\)/);
  assert.match(servers.plain.stderr(), /speculative decoding: off \(the checkpoint bundles an MTP head/);
  assert.match(servers.eagle_map.stderr(), /draft vocabulary: the MTP head scores 18469 of 129280 tokens/);
});

test('simulated acceptance is announced and reached', async () => {
  const sim = await startServer(['--speculative-algorithm', 'EAGLE', '--disable-speculative-bypass'],
    { env: { SGLANG_SIMULATE_ACC_LEN: '3' } });
  try {
    assert.match(sim.stderr(), /WARNING: SGLANG_SIMULATE_ACC_LEN=3\.00.*NOT THE MODEL'S/);
    const out = await generate(sim, { temperature: 0, max_new_tokens: 61 });
    assert.ok(Math.abs(out.meta_info.spec_accept_length - 3) < 0.1, String(out.meta_info.spec_accept_length));
  } finally {
    await sim.stop();
  }
});

test('what cannot run is refused at startup with one line', () => {
  const refused = (args, pattern) => {
    const r = spawnSync(dsv4Bin, ['serve', '--model-path', modelDir, '--port', '0', ...args], { encoding: 'utf8', timeout: 60000 });
    assert.notEqual(r.status, 0, args.join(' '));
    assert.match(r.stderr, pattern);
  };
  refused(['--speculative-algorithm', 'DSPARK'], /no DSpark draft head.*--speculative-algorithm EAGLE/);
  refused(['--speculative-algorithm', 'NGRAM', '--speculative-num-draft-tokens', '100'], /must be in \[2, 64\]/);
  refused(['--speculative-algorithm', 'EAGLE', '--speculative-eagle-topk', '4'], /only 1 \(a chain of drafts\)/);
  refused(['--speculative-algorithm', 'MEDUSA'], /expected EAGLE .* NGRAM or DSPARK/);
  refused(['--speculative-algorithm', 'NGRAM', '--speculative-token-map', tokenMap], /needs --speculative-algorithm EAGLE/);
  const torchMap = path.join(mapDir, 'freq_32768.pt');
  fs.writeFileSync(torchMap, 'PK');
  refused(['--speculative-algorithm', 'EAGLE', '--speculative-token-map', torchMap], /convert the map to JSON/);
  const outside = path.join(mapDir, 'outside.json');
  fs.writeFileSync(outside, '[1, 129280]');
  refused(['--speculative-algorithm', 'EAGLE', '--speculative-token-map', outside], /token id 129280 is outside/);
});

test('a checkpoint with a DSpark head serves target-only and with DSPARK, with the plain checkpoint\'s tokens', async () => {
  // smoke-0731: the smoke model's weights (same seed) plus a DSpark head.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsv4-0731-'));
  try {
    const made = spawnSync(dsv4Bin, ['make-model', '--out', dir, '--preset', 'smoke-0731'], { encoding: 'utf8' });
    assert.equal(made.status, 0, made.stderr);
    const server = await startServer([], { model: dir });
    try {
      assert.match(server.stderr(), /bundles a DSpark head \(3 stages, block 5/);
      const plain = await generate(servers.plain, { temperature: 0 });
      const target = await generate(server, { temperature: 0 });
      assert.deepEqual(target.output_ids, plain.output_ids);
    } finally {
      await server.stop();
    }
    const dspark = await startServer(['--speculative-algorithm', 'DSPARK', '--disable-speculative-bypass'], { model: dir });
    try {
      assert.match(dspark.stderr(), /speculative decoding: DSPARK, up to 5 drafts per step \(one DSpark block\)/);
      for (const params of [{ temperature: 0 }, { temperature: 0.8, top_k: 40, sampling_seed: 5 }]) {
        const plain = await generate(servers.plain, params);
        const spec = await generate(dspark, params);
        assert.deepEqual(spec.output_ids, plain.output_ids);
        assert.deepEqual(spec.meta_info.output_token_logprobs, plain.meta_info.output_token_logprobs);
        assert.ok(spec.meta_info.spec_verify_ct > 0);
      }
    } finally {
      await dspark.stop();
    }
    const eagle = spawnSync(dsv4Bin, ['serve', '--model-path', dir, '--port', '0', '--speculative-algorithm', 'EAGLE'],
      { encoding: 'utf8', timeout: 60000 });
    assert.notEqual(eagle.status, 0);
    assert.match(eagle.stderr, /bundles a DSpark draft head, not an MTP head.*--speculative-algorithm DSPARK/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
