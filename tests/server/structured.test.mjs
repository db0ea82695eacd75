// Constrained decoding on the embedded random-weight model: its text is
// gibberish, so a grammar is the only reason an output parses. Every
// constrained output must parse and validate (ajv) against its schema: random
// schemas from a seeded generator, json_object, /v1/completions and /generate,
// forced tool calls (named, required, one or several), thinking mode (the
// grammar starts after </think>), regex and ebnf; unsupported schemas are
// 400s naming the keyword. Run: node --test tests/server/structured.test.mjs
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';
import OpenAI from 'openai';

import { postJSON, rng, startServer } from './lib.mjs';

const N_SCHEMAS = Number(process.env.DSV4_TEST_SCHEMAS || 200);
let server;
let client;
// Formats are not checked by ajv here (no ajv-formats): the grammar's formats
// have unit tests.
const ajv = new Ajv({ strict: false, validateFormats: false });

before(async () => {
  // Strings close after at most 12 characters: the random model would
  // otherwise rarely draw one of the few hundred tokens with a quote.
  server = await startServer(['--context-length', '4096', '--grammar-max-string-chars', '12',
    '--served-model-name', 'dsv4-test']);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
});
after(async () => { await server?.stop(); });

const user = (content) => [{ role: 'user', content }];
const plain = { thinking: false };

// A random schema of the supported subset, bounded (every array has maxItems).
function randomSchema(rand, depth = 0, defs = null) {
  const pick = (xs) => xs[Math.floor(rand() * xs.length)];
  const name = () => pick(['id', 'name', 'value', 'items', 'kind', 'x', 'when', 'ok', 'tags', 'n']) + Math.floor(rand() * 10);
  const leaf = () => pick([
    () => ({ type: 'string' }),
    () => ({ type: 'string', minLength: 1, maxLength: 1 + Math.floor(rand() * 6) }),
    () => ({ type: 'string', format: pick(['date', 'date-time', 'uuid', 'email', 'ipv4', 'time']) }),
    () => ({ type: 'integer' }),
    () => ({ type: 'number' }),
    () => ({ type: 'boolean' }),
    () => ({ type: 'null' }),
    () => ({ enum: ['red', 'green', 42, null, true].slice(0, 1 + Math.floor(rand() * 5)) }),
    () => ({ const: pick(['fixed', 7, false, { a: [1, 'b'] }]) }),
    () => ({ type: ['string', 'null'] }),
    () => ({ type: 'string', pattern: pick(['^[a-z]{1,4}$', '^\\d{2}-[A-F]+$', 'id_[0-9]?']) }),
  ])();
  if (depth >= 3 || rand() < 0.35) return leaf();
  const kind = pick(['object', 'object', 'array', 'anyOf', 'ref']);
  if (kind === 'array') {
    const minItems = Math.floor(rand() * 2);
    return { type: 'array', items: randomSchema(rand, depth + 1, defs), minItems, maxItems: minItems + Math.floor(rand() * 3) };
  }
  if (kind === 'anyOf') return { anyOf: [randomSchema(rand, depth + 1, defs), randomSchema(rand, depth + 1, defs)] };
  if (kind === 'ref' && defs) {
    const key = `d${Object.keys(defs).length}`;
    defs[key] = true;  // the name is taken before the body may add more
    defs[key] = randomSchema(rand, depth + 1, defs);
    return { $ref: `#/$defs/${key}` };
  }
  const properties = {};
  const n = 1 + Math.floor(rand() * 4);
  for (let i = 0; i < n; ++i) properties[name()] = randomSchema(rand, depth + 1, defs);
  const required = Object.keys(properties).filter(() => rand() < 0.6);
  return { type: 'object', properties, required, additionalProperties: false };
}

function schemaFor(seed) {
  const rand = rng(seed);
  const defs = {};
  const schema = randomSchema(rand, 0, defs);
  return Object.keys(defs).length ? { ...schema, $defs: defs } : schema;
}

function checkJson(text, schema, where) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    assert.fail(`${where}: not JSON (${e.message}): ${text}`);
  }
  if (schema) {
    const validate = ajv.compile(schema);
    assert.ok(validate(value), `${where}: ${JSON.stringify(validate.errors)}\nschema ${JSON.stringify(schema)}\n${text}`);
  }
  return value;
}

// Runs fn over items, `width` at a time.
async function pool(items, width, fn) {
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < items.length) {
      const i = next++;
      await fn(items[i], i);
    }
  }));
}

describe('response_format', () => {
  test(`${N_SCHEMAS} random JSON schemas: every output parses and validates`, async () => {
    const seeds = Array.from({ length: N_SCHEMAS }, (_, i) => i + 1);
    await pool(seeds, 8, async (seed) => {
      const schema = schemaFor(seed);
      const r = await client.chat.completions.create({
        model: 'dsv4-test', messages: user('answer in JSON'), max_tokens: 3000, seed,
        response_format: { type: 'json_schema', json_schema: { name: 'out', schema, strict: true } },
        chat_template_kwargs: plain,
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', `schema ${seed} ${JSON.stringify(schema)}: ${c.message.content}`);
      checkJson(c.message.content, schema, `schema ${seed}`);
    });
  });

  test('json_object: objects, also streamed and with n > 1', async () => {
    await Promise.all([1, 2, 3].map(async (seed) => {
      const r = await client.chat.completions.create({
        model: 'dsv4-test', messages: user('json please'), max_tokens: 3000, seed, n: 2,
        response_format: { type: 'json_object' }, chat_template_kwargs: plain,
      });
      for (const c of r.choices) {
        assert.equal(c.finish_reason, 'stop');
        const v = checkJson(c.message.content, null, `json_object ${seed}`);
        assert.equal(typeof v, 'object');
        assert.ok(v !== null && !Array.isArray(v));
      }
    }));
    const stream = await client.chat.completions.create({
      model: 'dsv4-test', messages: user('json please'), max_tokens: 3000, seed: 9, stream: true,
      response_format: { type: 'json_object' }, chat_template_kwargs: plain,
    });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    checkJson(text, { type: 'object' }, 'streamed json_object');
  });

  test('/v1/completions response_format and /generate json_schema', async () => {
    const schema = { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'array', items: { type: 'boolean' }, maxItems: 3 } }, required: ['a', 'b'], additionalProperties: false };
    const c = await client.completions.create({
      model: 'dsv4-test', prompt: 'JSON:', max_tokens: 2000, seed: 5,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
    });
    assert.equal(c.choices[0].finish_reason, 'stop');
    checkJson(c.choices[0].text, schema, 'completions');
    for (const js of [schema, JSON.stringify(schema)]) {
      const g = await postJSON(server.origin, '/generate', { text: 'JSON:', sampling_params: { max_new_tokens: 2000, json_schema: js } });
      assert.equal(g.status, 200, g.text);
      assert.equal(g.json.meta_info.finish_reason.type, 'stop');
      checkJson(g.json.text, schema, '/generate');
    }
  });

  test('the openai client\'s chat.completions.parse gives the parsed object', async () => {
    const schema = { type: 'object', properties: { city: { type: 'string' }, temp: { type: 'number' } }, required: ['city', 'temp'], additionalProperties: false };
    const r = await client.chat.completions.parse({
      model: 'dsv4-test', messages: user('weather'), max_tokens: 2000, seed: 11,
      response_format: { type: 'json_schema', json_schema: { name: 'weather', schema, strict: true } },
      chat_template_kwargs: plain,
    });
    const parsed = r.choices[0].message.parsed;
    assert.ok(ajv.compile(schema)(parsed), JSON.stringify(r.choices[0].message));
  });

  test('Responses API text.format json_schema', async () => {
    const schema = { type: 'object', properties: { items: { type: 'array', items: { type: 'integer' }, maxItems: 4 } }, required: ['items'], additionalProperties: false };
    const r = await postJSON(server.origin, '/v1/responses', {
      model: 'dsv4-test', input: 'list', max_output_tokens: 2000, reasoning: { effort: 'none' },
      text: { format: { type: 'json_schema', name: 'list', schema, strict: true } },
    });
    assert.equal(r.status, 200, r.text);
    const message = r.json.output.find((o) => o.type === 'message');
    assert.ok(message, r.text);
    checkJson(message.content.map((c) => c.text ?? '').join(''), schema, 'responses');
  });

  test('thinking mode: free reasoning first, the JSON after </think>', async () => {
    const think = await postJSON(server.origin, '/tokenize', { prompt: '</think>' });
    assert.equal(think.json.tokens.length, 1);
    const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
    // The random model would think for ever: a bias makes it close the reasoning soon.
    const r = await client.chat.completions.create({
      model: 'dsv4-test', messages: user('think, then JSON'), max_tokens: 2000, seed: 3,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
      chat_template_kwargs: { thinking: true }, logit_bias: { [think.json.tokens[0]]: 12 },
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'stop', JSON.stringify(m));
    checkJson(m.content, schema, 'after reasoning');
  });

  test('unsupported schemas and parameters are 400s naming them', async () => {
    const cases = [
      [{ type: 'integer', minimum: 3 }, 'minimum'],
      [{ oneOf: [{ type: 'string' }] }, 'oneOf'],
      [{ type: 'object', patternProperties: { x: {} } }, 'patternProperties'],
      [{ type: 'string', format: 'hostname' }, 'hostname'],
      [{ type: 'string', pattern: '(?!x)y' }, 'lookaround'],
      [{ $ref: '#/$defs/missing' }, 'does not resolve'],
      [{ $ref: '#/$defs/a', $defs: { a: { anyOf: [{ $ref: '#/$defs/a' }, { type: 'null' }] } } }, 'left-recursive'],
    ];
    for (const [schema, word] of cases) {
      const r = await postJSON(server.origin, '/v1/chat/completions', {
        messages: user('x'), max_tokens: 5, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
      });
      assert.equal(r.status, 400, `${JSON.stringify(schema)}: ${r.text}`);
      assert.ok(r.json.error.message.includes(word), r.json.error.message);
    }
    const both = await postJSON(server.origin, '/v1/chat/completions', {
      messages: user('x'), max_tokens: 5, response_format: { type: 'json_object' }, regex: 'a+',
    });
    assert.equal(both.status, 400, both.text);
  });
});

const weather = {
  type: 'function',
  function: {
    name: 'get_weather', strict: true,
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false },
  },
};
const search = { type: 'function', function: { name: 'search', parameters: { type: 'object', properties: { q: { type: 'string' } } } } };

describe('regex and ebnf (SGLang parameters)', () => {
  const phone = /^\(\d{3}\) \d{3}-\d{4}$/;
  test('regex on chat, completions and /generate', async () => {
    const regex = '\\(\\d{3}\\) \\d{3}-\\d{4}';
    const chat = await postJSON(server.origin, '/v1/chat/completions', {
      messages: user('phone?'), max_tokens: 100, seed: 1, regex, chat_template_kwargs: plain });
    assert.equal(chat.status, 200, chat.text);
    assert.match(chat.json.choices[0].message.content, phone);
    assert.equal(chat.json.choices[0].finish_reason, 'stop');
    const comp = await postJSON(server.origin, '/v1/completions', { prompt: 'phone:', max_tokens: 100, seed: 2, regex });
    assert.match(comp.json.choices[0].text, phone, comp.text);
    const gen = await postJSON(server.origin, '/generate', { text: 'phone:', sampling_params: { max_new_tokens: 100, regex } });
    assert.match(gen.json.text, phone, gen.text);
  });

  test('ebnf on /generate and chat', async () => {
    const ebnf = 'root ::= "answer: " ("yes" | "no") (", " num)?\nnum ::= [1-9] [0-9]{0,2}';
    const re = /^answer: (yes|no)(, [1-9][0-9]{0,2})?$/;
    for (const seed of [1, 2, 3]) {
      const gen = await postJSON(server.origin, '/generate', { text: 'q:', sampling_params: { max_new_tokens: 100, ebnf, seed } });
      assert.equal(gen.status, 200, gen.text);
      assert.match(gen.json.text, re);
    }
    const chat = await postJSON(server.origin, '/v1/chat/completions', {
      messages: user('q'), max_tokens: 100, ebnf, chat_template_kwargs: plain });
    assert.match(chat.json.choices[0].message.content, re, chat.text);
  });

  test('bad regex / ebnf: 400', async () => {
    for (const [field, value, word] of [['regex', '(a', "missing ')'"], ['regex', '(?=a)b', 'lookaround'],
      ['ebnf', 'root ::= x', "'x' is used but not defined"], ['ebnf', 'root ::= root "a" | "b"', 'left-recursive']]) {
      const r = await postJSON(server.origin, '/generate', { text: 'q', sampling_params: { max_new_tokens: 5, [field]: value } });
      assert.equal(r.status, 400, r.text);
      assert.ok(r.json.error.message.includes(word), r.json.error.message);
    }
  });
});

describe('forced tool calls', () => {
  test('named: exactly one call of that tool, arguments valid when strict', async () => {
    await Promise.all([1, 2, 3, 4].map(async (seed) => {
      const r = await client.chat.completions.create({
        model: 'dsv4-test', messages: user('weather?'), max_tokens: 2000, seed, tools: [search, weather],
        tool_choice: { type: 'function', function: { name: 'get_weather' } }, chat_template_kwargs: plain,
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
      assert.equal(c.message.tool_calls.length, 1);
      assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
      checkJson(c.message.tool_calls[0].function.arguments, weather.function.parameters, `named ${seed}`);
    }));
  });

  test('required: one or more calls; parallel_tool_calls false: exactly one', async () => {
    let sawMany = false;
    const cases = [1, 2, 3, 4, 5, 6].flatMap((seed) => [true, false].map((parallel) => [seed, parallel]));
    await Promise.all(cases.map(async ([seed, parallel]) => {
      const r = await client.chat.completions.create({
        model: 'dsv4-test', messages: user('do something'), max_tokens: 3000, seed, tools: [search, weather],
        tool_choice: 'required', parallel_tool_calls: parallel, chat_template_kwargs: plain,
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
      assert.ok(c.message.tool_calls.length >= 1);
      if (!parallel) assert.equal(c.message.tool_calls.length, 1);
      sawMany ||= c.message.tool_calls.length > 1;
      for (const call of c.message.tool_calls) {
        const schema = call.function.name === 'get_weather' ? weather.function.parameters : { type: 'object' };
        checkJson(call.function.arguments, schema, `required ${seed}`);
      }
    }));
    assert.ok(sawMany, 'some parallel request made several calls');
  });

  test('streamed forced call arrives as tool_calls deltas', async () => {
    const stream = await client.chat.completions.create({
      model: 'dsv4-test', messages: user('weather?'), max_tokens: 2000, seed: 7, tools: [weather], stream: true,
      tool_choice: { type: 'function', function: { name: 'get_weather' } }, chat_template_kwargs: plain,
    });
    let args = '';
    let name = null;
    let finish = null;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      for (const t of c.delta.tool_calls ?? []) {
        name ??= t.function?.name ?? null;
        args += t.function?.arguments ?? '';
      }
      finish = c.finish_reason ?? finish;
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(name, 'get_weather');
    checkJson(args, weather.function.parameters, 'streamed call');
  });

  test('streamed call: its header first, then an arguments delta per member adding up to the unstreamed call', async () => {
    const request = {
      model: 'dsv4-test', messages: user('weather?'), max_tokens: 2000, seed: 11, tools: [weather],
      tool_choice: { type: 'function', function: { name: 'get_weather' } }, chat_template_kwargs: plain,
    };
    const whole = await client.chat.completions.create(request);
    const expected = whole.choices[0].message.tool_calls[0].function.arguments;
    const stream = await client.chat.completions.create({ ...request, stream: true });
    const deltas = [];
    for await (const chunk of stream) deltas.push(...(chunk.choices[0]?.delta?.tool_calls ?? []));
    const [header, ...fragments] = deltas;
    assert.equal(header.index, 0);
    assert.match(header.id, /^call_/);
    assert.equal(header.type, 'function');
    assert.deepEqual(header.function, { name: 'get_weather', arguments: '' });
    // city and unit are required: two members, then the closing brace.
    assert.ok(fragments.length >= 3, JSON.stringify(deltas));
    for (const f of fragments) {
      assert.equal(f.index, 0);
      assert.equal(f.id, undefined);
      assert.equal(f.function.name, undefined);
      assert.ok(f.function.arguments.length > 0);
    }
    assert.match(fragments[0].function.arguments, /^\{"/);
    assert.equal(fragments.at(-1).function.arguments, '}');
    const args = fragments.map((f) => f.function.arguments).join('');
    assert.equal(args, expected);
    checkJson(args, weather.function.parameters, 'streamed call');
  });

  test('Anthropic streamed tool_use: block start, an input_json_delta per member, block stop', async () => {
    // The Messages API has no seed: the stream is checked against itself.
    const anthropic = new Anthropic({ baseURL: server.origin, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
    const stream = anthropic.messages.stream({
      model: 'dsv4-test', max_tokens: 2000, messages: user('weather?'),
      tools: [{ name: 'get_weather', input_schema: weather.function.parameters }],
      tool_choice: { type: 'tool', name: 'get_weather' },
    });
    const events = [];
    for await (const ev of stream) events.push(JSON.parse(JSON.stringify(ev)));
    const types = events.map((e) => e.type);
    const start = events.findIndex((e) => e.type === 'content_block_start' && e.content_block.type === 'tool_use');
    assert.ok(start >= 0, types.join(' '));
    assert.equal(events[start].content_block.name, 'get_weather');
    assert.deepEqual(events[start].content_block.input, {});
    const stop = types.indexOf('content_block_stop', start);
    const parts = events.slice(start + 1, stop).filter((e) => e.type !== 'ping');
    for (const e of parts) assert.equal(e.delta.type, 'input_json_delta');
    const input = JSON.parse(parts.map((e) => e.delta.partial_json).join(''));
    // One delta per member and the closing brace ('{}' alone for no member).
    assert.equal(parts.length, Math.max(1, Object.keys(input).length + 1), types.join(' '));
    assert.deepEqual((await stream.finalMessage()).content.find((b) => b.type === 'tool_use').input, input);
    assert.equal(types.at(-2), 'message_delta');
    assert.equal(events.at(-2).delta.stop_reason, 'tool_use');
  });

  test('Responses streamed function_call: added at the header, an arguments delta per member, done at the close', async () => {
    const stream = await client.responses.create({
      model: 'dsv4-test', input: 'weather?', max_output_tokens: 2000, stream: true,
      tools: [{ type: 'function', ...weather.function }], tool_choice: { type: 'function', name: 'get_weather' },
    });
    const events = [];
    for await (const e of stream) events.push(e);
    const types = events.map((e) => e.type);
    const added = events.findIndex((e) => e.type === 'response.output_item.added' && e.item.type === 'function_call');
    assert.ok(added >= 0, types.join(' '));
    assert.equal(events[added].item.name, 'get_weather');
    assert.equal(events[added].item.arguments, '');
    const done = types.indexOf('response.function_call_arguments.done');
    const deltas = events.slice(added + 1, done);
    assert.ok(deltas.length >= 3, types.join(' '));
    for (const e of deltas) assert.equal(e.type, 'response.function_call_arguments.delta');
    assert.equal(deltas.map((e) => e.delta).join(''), events[done].arguments);
    assert.equal(types[done + 1], 'response.output_item.done');
    assert.equal(types.at(-1), 'response.completed');
    checkJson(events[done].arguments, weather.function.parameters, 'streamed Responses call');
  });

  test('auto with a strict tool: free until a block opens (never, on random weights)', async () => {
    const r = await client.chat.completions.create({
      model: 'dsv4-test', messages: user('weather?'), max_tokens: 20, seed: 1, tools: [weather, search],
      chat_template_kwargs: plain,
    });
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 20);
    // With a response format the format wins.
    const j = await client.chat.completions.create({
      model: 'dsv4-test', messages: user('weather?'), max_tokens: 2000, seed: 1, tools: [weather],
      response_format: { type: 'json_object' }, chat_template_kwargs: plain,
    });
    checkJson(j.choices[0].message.content, { type: 'object' }, 'format with strict tools');
  });

  test('Anthropic tool_choice tool: a tool_use block', async () => {
    const r = await postJSON(server.origin, '/v1/messages', {
      model: 'dsv4-test', max_tokens: 2000, messages: user('weather?'),
      tools: [{ name: 'get_weather', input_schema: weather.function.parameters }],
      tool_choice: { type: 'tool', name: 'get_weather' },
    }, { 'anthropic-version': '2023-06-01' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.stop_reason, 'tool_use', r.text);
    const use = r.json.content.find((b) => b.type === 'tool_use');
    assert.equal(use.name, 'get_weather');
    assert.equal(typeof use.input, 'object');
  });
});

describe('with speculative decoding', () => {
  let spec;
  before(async () => {
    spec = await startServer(['--speculative-algorithm', 'NGRAM', '--speculative-num-draft-tokens', '6',
      '--disable-speculative-bypass', '--grammar-max-string-chars', '12']);
  });
  after(async () => { await spec?.stop(); });

  test('constrained requests decode plainly beside speculating ones and stay valid', async () => {
    const schemas = Array.from({ length: 12 }, (_, i) => schemaFor(1000 + i));
    const free = Array.from({ length: 4 }, (_, i) => postJSON(spec.origin, '/generate', {
      text: 'a b a b a b a b', sampling_params: { max_new_tokens: 64, ignore_eos: true, seed: i } }));
    await pool(schemas, 6, async (schema, i) => {
      const r = await postJSON(spec.origin, '/generate', { text: 'JSON:', sampling_params: { max_new_tokens: 3000, json_schema: schema, seed: i } });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.meta_info.finish_reason.type, 'stop', r.text);
      checkJson(r.json.text, schema, `speculative server, schema ${i}`);
    });
    for (const f of await Promise.all(free)) assert.equal(f.status, 200, f.text);
  });
});
