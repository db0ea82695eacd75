// Decode rate of N concurrent streams with and without a JSON-schema
// constraint, against a running `dsv4 serve` (node built-ins only):
//   node bench/structured_decode.mjs http://127.0.0.1:30000 [streams=16] [tokens=256]
// Each stream asks /generate for `tokens` new tokens. Unconstrained streams
// ignore EOS; constrained ones follow a schema of `tokens` array items, so
// the grammar never lets them stop early (a long JSON array of objects with
// strings, numbers and enums: string, number and structure masks all occur).
// Prints tokens/s of both runs and the relative loss.
const [origin = 'http://127.0.0.1:30000', streamsArg = '16', tokensArg = '256'] = process.argv.slice(2);
const streams = Number(streamsArg);
const tokens = Number(tokensArg);

const schema = {
  type: 'array',
  minItems: tokens,
  items: {
    type: 'object',
    properties: { id: { type: 'integer' }, name: { type: 'string' }, kind: { enum: ['a', 'b', 'c'] }, score: { type: 'number' } },
    required: ['id', 'name', 'kind', 'score'],
    additionalProperties: false,
  },
};

async function run(constrained) {
  const body = (i) => ({
    text: `stream ${i}:`,
    sampling_params: { max_new_tokens: tokens, seed: i + 1, ...(constrained ? { json_schema: schema } : { ignore_eos: true }) },
  });
  const start = performance.now();
  const results = await Promise.all(Array.from({ length: streams }, async (_, i) => {
    const r = await fetch(`${origin}/generate`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body(i)) });
    if (!r.ok) throw new Error(`${r.status} ${await r.text()}`);
    return (await r.json()).meta_info.completion_tokens;
  }));
  const seconds = (performance.now() - start) / 1000;
  const total = results.reduce((a, b) => a + b, 0);
  return { total, seconds, rate: total / seconds };
}

await run(false);  // warm-up: threads, caches
await run(true);   // warm-up: the schema compiles, its token classes fill in
const free = await run(false);
const json = await run(true);
const line = (name, r) => `${name}: ${r.total} tokens in ${r.seconds.toFixed(2)} s = ${r.rate.toFixed(1)} tokens/s`;
console.log(`${streams} streams x ${tokens} tokens`);
console.log(line('unconstrained', free));
console.log(line('json_schema  ', json));
console.log(`decode rate with the schema: ${((json.rate / free.rate - 1) * 100).toFixed(1)}%`);
