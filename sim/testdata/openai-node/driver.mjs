// Drives the official openai npm SDK through a judge workflow against the
// apidispatch simulator and prints one JSON report on stdout:
//   {"differ": [...], "failures": [...], "usages": [...], "calls": N}
// "differ" lists every way an object the SDK returned departs from the
// SDK's own type declarations (.d.ts): a required member absent, or a
// member the type does not declare. "usages" are the usages the SDK saw,
// for the Go test to price and compare with the simulator's ledger.
// Environment: SIM_URL, SIM_KEY, SIM_ORG, SIM_PROJECT. Through 'apidispatch
// serve' (internal/openaiconform's TestOpenAINodeSDKBatchesThroughServe):
// GW_URL, GW_KEY and GW_KEY2 (two clients' gateway tokens) instead; the
// SDK, given only the gateway's base URL and a token, runs the chat part
// as main() does (chat(), without the simulator's faults, with the
// gateway's own answers where they differ), the batch lifecycle, then
// another client finds none of it (404s).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI, { toFile } from 'openai';

// The SDK's directory: its package exports no package.json, so find it
// from this driver's own node_modules.
const sdkDir = path.join(path.dirname(fileURLToPath(import.meta.url)), 'node_modules', 'openai');
const { SIM_URL, SIM_KEY, SIM_ORG, SIM_PROJECT, GW_URL, GW_KEY, GW_KEY2 } = process.env;
const SERVE = !!GW_URL;

// calls counts the workflow's calls, polls the retrieves of a batch until
// it ends (as many as its pace makes them).
const report = { differ: [], failures: [], usages: [], calls: 0, polls: 0, objects: 0 };
const fail = (msg) => report.failures.push(msg);

// --- the SDK's declared shapes -------------------------------------------------

const dts = {};
function readDts(file) {
  if (!dts[file]) dts[file] = fs.readFileSync(path.join(sdkDir, 'resources', file), 'utf8').split('\n');
  return dts[file];
}

// members returns {name: required} of the interface whose header line
// matches head, after the line matching within (a namespace) when given.
function members(file, head, within) {
  const lines = readDts(file);
  let i = 0;
  if (within) {
    while (i < lines.length && lines[i] !== within) i++;
  }
  while (i < lines.length && lines[i] !== head) i++;
  if (i === lines.length) throw new Error(`${file}: no "${head}"`);
  const indent = head.match(/^ */)[0].length;
  const prop = new RegExp(`^ {${indent + 4}}(?:readonly )?([A-Za-z_][A-Za-z0-9_]*)(\\??):`);
  const out = {};
  for (i++; i < lines.length && lines[i] !== ' '.repeat(indent) + '}'; i++) {
    const m = lines[i].match(prop);
    if (m) out[m[1]] = m[2] !== '?';
  }
  return out;
}

const C = 'chat/completions/completions.d.ts';
const types = {
  ChatCompletion: members(C, 'export interface ChatCompletion {'),
  'ChatCompletion.Choice': members(C, '    interface Choice {', 'export declare namespace ChatCompletion {'),
  ChatCompletionMessage: members(C, 'export interface ChatCompletionMessage {'),
  ChatCompletionChunk: members(C, 'export interface ChatCompletionChunk {'),
  'ChatCompletionChunk.Choice': members(C, '    interface Choice {', 'export declare namespace ChatCompletionChunk {'),
  'ChatCompletionChunk.Choice.Delta': members(C, '        interface Delta {', 'export declare namespace ChatCompletionChunk {'),
  CompletionUsage: members('completions.d.ts', 'export interface CompletionUsage {'),
  'CompletionUsage.CompletionTokensDetails': members('completions.d.ts', '    interface CompletionTokensDetails {', 'export declare namespace CompletionUsage {'),
  'CompletionUsage.PromptTokensDetails': members('completions.d.ts', '    interface PromptTokensDetails {', 'export declare namespace CompletionUsage {'),
  Batch: members('batches.d.ts', 'export interface Batch {'),
  BatchRequestCounts: members('batches.d.ts', 'export interface BatchRequestCounts {'),
  BatchUsage: members('batches.d.ts', 'export interface BatchUsage {'),
  FileObject: members('files.d.ts', 'export interface FileObject {'),
  Model: members('models.d.ts', 'export interface Model {'),
};
const children = {
  ChatCompletion: { choices: ['ChatCompletion.Choice'], usage: 'CompletionUsage' },
  'ChatCompletion.Choice': { message: 'ChatCompletionMessage' },
  ChatCompletionChunk: { choices: ['ChatCompletionChunk.Choice'], usage: 'CompletionUsage' },
  'ChatCompletionChunk.Choice': { delta: 'ChatCompletionChunk.Choice.Delta' },
  CompletionUsage: { completion_tokens_details: 'CompletionUsage.CompletionTokensDetails', prompt_tokens_details: 'CompletionUsage.PromptTokensDetails' },
  Batch: { request_counts: 'BatchRequestCounts', usage: 'BatchUsage' },
};

// check records how obj departs from the declared type name.
function check(where, name, obj) {
  report.objects++;
  if (obj === null || typeof obj !== 'object') {
    report.differ.push(`${where}: not an object`);
    return;
  }
  const decl = types[name];
  for (const k of Object.keys(obj)) {
    if (!(k in decl)) report.differ.push(`${where}.${k}: not in the SDK's ${name}`);
  }
  for (const [k, req] of Object.entries(decl)) {
    if (req && !(k in obj)) report.differ.push(`${where}.${k}: required by ${name}, absent`);
  }
  for (const [k, sub] of Object.entries(children[name] || {})) {
    const v = obj[k];
    if (v === null || v === undefined) continue;
    if (Array.isArray(sub)) v.forEach((x, i) => check(`${where}.${k}[${i}]`, sub[0], x));
    else check(`${where}.${k}`, sub, v);
  }
}

// The check can fail: every declared type has members, and an object with
// a member too many and one missing is caught twice.
for (const [n, d] of Object.entries(types)) {
  if (Object.keys(d).length === 0) fail(`the SDK's ${n} declares no members: the .d.ts parse is broken`);
}
check('selftest', 'Model', { id: 'm', object: 'model', owned_by: 'system', extra: 1 });
if (report.differ.length !== 2) fail(`the shape check missed a differ: ${report.differ}`);
report.differ = [];
report.objects = 0;

function usage(model, u, batch) {
  report.usages.push({
    model, batch,
    prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens,
    cached_tokens: u.prompt_tokens_details?.cached_tokens ?? 0,
    reasoning_tokens: u.completion_tokens_details?.reasoning_tokens ?? 0,
  });
}

// errorIs records how e, the SDK's error for an answer, departs from the
// API's: its class, status, error type, code and param, and the body's
// {"error": {...}} envelope with the request id.
function errorIs(what, e, cls, status, type, code, param = null) {
  if (!(e instanceof cls) || e.status !== status || e.type !== type || e.code !== code || e.param !== param) {
    fail(`${what}: ${e && e.constructor && e.constructor.name} ${e && e.status} ${e && e.type}/${e && e.code} param ${e && e.param}`);
  }
  if (!e || !e.error || typeof e.error.message !== 'string' || !e.headers || !e.headers.get('x-request-id')) {
    fail(`${what}: no error message or x-request-id`);
  }
}

// attempts records each request the SDK sends (its x-stainless-retry-count)
// and each answer's status, with their times, through the client's fetch;
// onAnswer runs on every answer.
function attempts() {
  const log = { sent: [], answers: [], onAnswer: null };
  log.fetch = async (url, init) => {
    const h = new Headers(init?.headers);
    log.sent.push({ t: performance.now(), retry: h.get('x-stainless-retry-count') });
    const r = await fetch(url, init);
    log.answers.push({ t: performance.now(), status: r.status, headers: r.headers });
    if (log.onAnswer) await log.onAnswer(r);
    return r;
  };
  return log;
}

async function fault(f) {
  const r = await fetch(`${SIM_URL}/sim/faults`, { method: 'POST', body: JSON.stringify(f) });
  if (!r.ok) throw new Error(`fault ${JSON.stringify(f)}: ${r.status}`);
}
async function clearFault(id) {
  await fetch(`${SIM_URL}/sim/faults?id=${id}`, { method: 'DELETE' });
}

// --- the workflow -------------------------------------------------------------------

const judge = (i, extra = {}) => ({
  model: 'gpt-4.1-mini',
  messages: [
    { role: 'system', content: 'You are an impartial judge. Evaluate the answer for correctness.' },
    { role: 'user', content: `Question: what is 2+2? Answer: 4. Item ${i}. Reply with a JSON object.` },
  ],
  max_completion_tokens: 200,
  ...extra,
});

const client = SERVE ? new OpenAI({ apiKey: GW_KEY, baseURL: `${GW_URL}/v1`, organization: null, project: null, maxRetries: 0 })
  : new OpenAI({ apiKey: SIM_KEY, baseURL: `${SIM_URL}/v1`, organization: SIM_ORG, project: SIM_PROJECT, maxRetries: 0 });
const BASE = SERVE ? `${GW_URL}/v1` : `${SIM_URL}/v1`;
const retrying = SERVE ? null : new OpenAI({ apiKey: SIM_KEY, baseURL: `${SIM_URL}/v1`, organization: SIM_ORG, project: SIM_PROJECT, maxRetries: 2 });

async function main() {
  await chat(true);
  await faults();
  await batches();
}

// The chat part of the judge workflow: models, completions plain,
// streamed, with n choices, in JSON mode and with structured outputs, and
// the errors a client provokes itself. direct: against the simulator
// itself, with its faults (an error event mid-stream) and its own
// headers; else through the gateway, which answers a model without a
// price as a 400 on model and adds its own headers.
async function chat(direct) {
  // Models.
  const models = [];
  for await (const m of client.models.list()) {
    check('models', 'Model', m);
    models.push(m.id);
  }
  report.calls++;
  if (!models.includes('gpt-4.1-mini')) fail(`models: ${models}`);
  const m = await client.models.retrieve('o4-mini');
  report.calls++;
  check('model', 'Model', m);
  if (m.id !== 'o4-mini' || m.object !== 'model') fail(`models.retrieve: ${JSON.stringify(m)}`);

  // A completion with its headers.
  const { data: c1, response } = await client.chat.completions.create(judge(1)).withResponse();
  report.calls++;
  check('completion', 'ChatCompletion', c1);
  usage(c1.model, c1.usage, false);
  // The gateway answers with its own request id and x-apidispatch-*; the
  // upstream org's id and processing time are not a client's to see.
  const want = direct ? ['x-request-id', 'openai-organization', 'openai-processing-ms']
    : ['x-request-id', 'x-apidispatch-org', 'x-apidispatch-attempts', 'x-apidispatch-cost-usd'];
  for (const h of [...want, 'x-ratelimit-limit-requests', 'x-ratelimit-remaining-tokens', 'x-ratelimit-reset-tokens']) {
    if (!response.headers.get(h)) fail(`header ${h} missing`);
  }
  if (!direct && (response.headers.get('openai-organization') || response.headers.get('openai-project'))) {
    fail(`the upstream org's headers reached the client: ${response.headers.get('openai-organization')} ${response.headers.get('openai-project')}`);
  }
  if (c1._request_id !== response.headers.get('x-request-id')) fail(`_request_id ${c1._request_id}`);
  try {
    JSON.parse(c1.choices[0].message.content);
  } catch {
    fail(`not a JSON verdict: ${c1.choices[0].message.content}`);
  }

  // The same streamed with usage.
  const stream = await client.chat.completions.create(judge(1, { stream: true, stream_options: { include_usage: true } }));
  report.calls++;
  let text = '', usageChunks = 0, finish = null, model = null, su = null;
  for await (const ch of stream) {
    check('chunk', 'ChatCompletionChunk', ch);
    model = ch.model;
    if (ch.usage) { usageChunks++; su = ch.usage; if (ch.choices.length) fail('the usage chunk has choices'); }
    for (const c of ch.choices) {
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  if (usageChunks !== 1 || text !== c1.choices[0].message.content || finish !== 'stop' || su.completion_tokens !== c1.usage.completion_tokens) {
    fail(`stream: ${usageChunks} usage chunks, finish ${finish}, text ${JSON.stringify(text)} vs ${JSON.stringify(c1.choices[0].message.content)}`);
  }
  usage(model, su, false);
  if (!direct) {
    // A client that did not ask for the usage gets none (the gateway asks
    // upstream for it, to settle the stream, and takes it out): no chunk
    // has a usage member. The simulator answers the same request alike,
    // so it is billed c1's usage.
    let bare = '', chunks = 0, withUsage = 0;
    for await (const ch of await client.chat.completions.create(judge(1, { stream: true }))) {
      check('chunk without usage', 'ChatCompletionChunk', ch);
      chunks++;
      if ('usage' in ch) withUsage++;
      for (const c of ch.choices) bare += c.delta.content ?? '';
    }
    report.calls++;
    if (chunks === 0 || withUsage !== 0 || bare !== c1.choices[0].message.content) {
      fail(`stream without include_usage: ${chunks} chunks, ${withUsage} with a usage member, ${JSON.stringify(bare)}`);
    }
    usage(c1.model, c1.usage, false);
  }
  // finalChatCompletion of the SDK's own stream helper.
  const runner = client.chat.completions.stream(judge(2, { stream_options: { include_usage: true } }));
  report.calls++;
  const fc = await runner.finalChatCompletion();
  usage(fc.model, fc.usage, false);
  if (!fc.choices[0].message.content) fail('finalChatCompletion has no content');

  if (direct) {
    // An error after the 200 (the API's overloaded, as a data event): the
    // SDK throws APIError with the event's error object, after the chunks
    // before it.
    await fault({ id: 'node-cut', kind: 'stream_overloaded', org: 'oa' });
    {
      let got = 0;
      try {
        for await (const ch of await client.chat.completions.create(judge(8, { stream: true }))) {
          check('chunk before the error', 'ChatCompletionChunk', ch);
          got++;
        }
        fail('an error event mid-stream: the stream ended without throwing');
      } catch (e) {
        if (e.constructor !== OpenAI.APIError || got === 0 || e.error?.message !== 'The server is overloaded or not ready yet.' || e.type !== 'server_error') {
          fail(`an error event mid-stream: ${e && e.constructor && e.constructor.name} ${e && e.message} after ${got} chunks`);
        }
      }
      report.calls++;
    }
    await clearFault('node-cut');
  }

  // n choices and a reasoning model.
  const c3 = await client.chat.completions.create(judge(3, { n: 2 }));
  report.calls++;
  check('n=2', 'ChatCompletion', c3);
  if (c3.choices.length !== 2) fail(`n=2: ${c3.choices.length} choices`);
  usage(c3.model, c3.usage, false);
  const cr = await client.chat.completions.create({ model: 'o4-mini', messages: [{ role: 'developer', content: 'Be brief.' }, { role: 'user', content: 'Why is the sky blue?' }], max_completion_tokens: 1000 });
  report.calls++;
  check('reasoning', 'ChatCompletion', cr);
  if (!(cr.usage.completion_tokens_details.reasoning_tokens > 0)) fail('no reasoning tokens');
  usage(cr.model, cr.usage, false);

  // JSON mode answers JSON whatever else the prompt asks, and is refused
  // when no message names JSON.
  {
    const jm = { model: 'gpt-4.1-mini', max_completion_tokens: 300, response_format: { type: 'json_object' },
      messages: [{ role: 'user', content: 'Is 2+2 = 4? Answer in JSON, with a field correct.' }] };
    const cj = await client.chat.completions.create(jm);
    report.calls++;
    check('json_object', 'ChatCompletion', cj);
    usage(cj.model, cj.usage, false);
    try {
      JSON.parse(cj.choices[0].message.content);
    } catch {
      fail(`json_object: not JSON: ${cj.choices[0].message.content}`);
    }
    try {
      await client.chat.completions.create({ ...jm, messages: [{ role: 'user', content: 'Is 2+2 = 4?' }] });
      fail('json_object accepted without JSON in the messages');
    } catch (e) {
      errorIs('json_object without JSON', e, OpenAI.BadRequestError, 400, 'invalid_request_error', null, 'messages');
    }
    report.calls++;
  }

  // Structured outputs: the SDK's parse() parses a json_schema answer;
  // it fits the schema (a nested object under $defs, an enum, a bounded
  // integer).
  {
    const schema = {
      type: 'object', additionalProperties: false, required: ['verdict', 'flags', 'label'],
      properties: { verdict: { $ref: '#/$defs/Verdict' }, flags: { type: 'array', items: { type: 'string' } }, label: { type: 'string', enum: ['good', 'bad'] } },
      $defs: { Verdict: { type: 'object', additionalProperties: false, required: ['correct', 'score'], properties: { correct: { type: 'boolean' }, score: { type: 'integer', minimum: 1, maximum: 5 } } } },
    };
    const p = await client.chat.completions.parse({
      model: 'gpt-4.1-mini', max_completion_tokens: 300, messages: [{ role: 'system', content: 'You are an impartial judge.' }, { role: 'user', content: 'Is 2+2 = 4?' }],
      response_format: { type: 'json_schema', json_schema: { name: 'Review', strict: true, schema } },
    });
    report.calls++;
    usage(p.model, p.usage, false);
    const v = p.choices[0].message.parsed;
    const keys = (o) => Object.keys(o || {}).sort().join();
    if (!v || keys(v) !== 'flags,label,verdict' || keys(v.verdict) !== 'correct,score' || typeof v.verdict.correct !== 'boolean' ||
        !Number.isInteger(v.verdict.score) || v.verdict.score < 1 || v.verdict.score > 5 || !['good', 'bad'].includes(v.label) ||
        !Array.isArray(v.flags) || p.choices[0].finish_reason !== 'stop') {
      fail(`structured output: ${p.choices[0].message.content}`);
    }
  }

  // Errors: a 400; a 500 and a 429 retried through; the quota 429.
  try {
    await client.chat.completions.create(judge(4, { temperature: 3 }));
    fail('temperature 3 accepted');
  } catch (e) {
    errorIs('temperature 3', e, OpenAI.BadRequestError, 400, 'invalid_request_error', 'decimal_above_max_value', 'temperature');
  }
  report.calls++;
  const wrongKey = new OpenAI({ apiKey: 'sk-proj-not-a-key', baseURL: BASE, maxRetries: 0 });
  try {
    await wrongKey.chat.completions.create(judge(4));
    fail('a wrong key accepted');
  } catch (e) {
    errorIs('401', e, OpenAI.AuthenticationError, 401, 'invalid_request_error', 'invalid_api_key');
  }
  try {
    await client.chat.completions.create(judge(4, { model: 'gpt-no-such-model' }));
    fail('an unknown model accepted');
  } catch (e) {
    // The gateway refuses a model it has no price for before sending it:
    // its spend could not be bounded.
    if (direct) errorIs('404 model', e, OpenAI.NotFoundError, 404, 'invalid_request_error', 'model_not_found');
    else errorIs('a model without a price through the gateway', e, OpenAI.BadRequestError, 400, 'invalid_request_error', 'model_not_found', 'model');
  }
  try {
    await client.files.retrieve('file-NoSuchFile0000000000');
    fail('an unknown file found');
  } catch (e) {
    errorIs('404 file', e, OpenAI.NotFoundError, 404, 'invalid_request_error', null, 'id');
  }
  try {
    await client.batches.retrieve('batch_no_such_batch');
    fail('an unknown batch found');
  } catch (e) {
    errorIs('404 batch', e, OpenAI.NotFoundError, 404, 'invalid_request_error', null, 'batch_id');
  }
  report.calls += 4;
}

// The simulator's faults (set and cleared through its admin endpoints):
// 429s and 500s the SDK retries or throws, the quota 429. Direct only: the
// gateway retries these itself.
async function faults() {
  // A 429 the SDK retries when its headers say: retry-after-ms (1.2 s)
  // before retry-after (2 s, whole seconds) and its own backoff (at most
  // 0.5 s for a first retry). The storm ends when its 429 is answered.
  {
    const log = attempts();
    await fault({ id: 'node-429ms', kind: 'storm_429', org: 'oa', retry_after: '240s' }); // 1.2 s at K = 200
    log.onAnswer = async (r) => { if (r.status === 429) await clearFault('node-429ms'); };
    const c = await new OpenAI({ apiKey: SIM_KEY, baseURL: `${SIM_URL}/v1`, maxRetries: 2, fetch: log.fetch }).chat.completions.create(judge(5));
    report.calls += 2;
    usage(c.model, c.usage, false);
    const st = log.answers.map((a) => a.status), rc = log.sent.map((x) => x.retry);
    const h = log.answers[0].headers;
    if (st.join() !== '429,200' || rc.join() !== '0,1') fail(`retry-after-ms: answers ${st}, retry counts ${rc}`);
    if (h.get('retry-after') !== '2' || h.get('retry-after-ms') !== '1200' || !h.get('x-ratelimit-limit-requests')) {
      fail(`the 429's headers: retry-after ${h.get('retry-after')}, retry-after-ms ${h.get('retry-after-ms')}`);
    }
    const gap = log.sent.length === 2 ? (log.sent[1].t - log.answers[0].t) / 1000 : 0;
    if (!(gap >= 1.15 && gap < 1.95)) fail(`the SDK waited ${gap.toFixed(3)} s, not retry-after-ms's 1.2 s`);
    report.retryAfterMsWait = gap;
  }
  for (const kind of ['server_error_500', 'storm_429']) {
    const id = `node-${kind}`;
    await fault({ id, kind, org: 'oa', from_now: true, duration: '2s', retry_after: '1s' });
    const c = await retrying.chat.completions.create(judge(5));
    report.calls++;
    usage(c.model, c.usage, false);
    await clearFault(id);
  }
  await fault({ id: 'node-quota', kind: 'spend_cap', org: 'oa' });
  try {
    await client.chat.completions.create(judge(6));
    fail('quota not refused');
  } catch (e) {
    errorIs('quota 429', e, OpenAI.RateLimitError, 429, 'insufficient_quota', 'insufficient_quota');
    if (e.headers?.get('retry-after') || e.headers?.get('retry-after-ms')) fail('the quota 429 has a retry-after');
  }
  report.calls++;
  {
    // With retries the SDK retries it (the API gives no retry-after nor
    // x-should-retry for it) and raises the same error at the end.
    const log = attempts();
    try {
      await new OpenAI({ apiKey: SIM_KEY, baseURL: `${SIM_URL}/v1`, maxRetries: 2, fetch: log.fetch }).chat.completions.create(judge(6));
      fail('quota not refused with retries');
    } catch (e) {
      errorIs('quota 429 with retries', e, OpenAI.RateLimitError, 429, 'insufficient_quota', 'insufficient_quota');
    }
    report.calls += log.sent.length;
  }
  await clearFault('node-quota');
}

// The batch lifecycle: upload, create, cancel, poll, list, the output and
// error files.
async function batches() {
  const lines = [];
  for (let i = 0; i < 20; i++) {
    lines.push(JSON.stringify({ custom_id: `node-${i}`, method: 'POST', url: '/v1/chat/completions', body: judge(100 + i) }));
  }
  // One line the API refuses when it runs it: a 400 in the error file.
  lines.push(JSON.stringify({ custom_id: 'node-bad', method: 'POST', url: '/v1/chat/completions', body: judge(200, { temperature: 3 }) }));
  const file = await client.files.create({ file: await toFile(Buffer.from(lines.join('\n') + '\n'), 'judge.jsonl'), purpose: 'batch' });
  report.calls++;
  check('file', 'FileObject', file);
  const got = await client.files.retrieve(file.id);
  check('file retrieve', 'FileObject', got);
  let b = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', metadata: { job: 'judge' } });
  let b2 = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  b2 = await client.batches.cancel(b2.id);
  report.calls += 4;
  check('batch', 'Batch', b);
  check('cancelled batch', 'Batch', b2);
  const seen = new Set();
  for (let tries = 0; tries < 3000 && !(b.status === 'completed' && b2.status === 'cancelled'); tries++) {
    await new Promise((r) => setTimeout(r, 10));
    b = await client.batches.retrieve(b.id);
    b2 = await client.batches.retrieve(b2.id);
    report.polls += 2;
    seen.add(b.status);
    check('polled batch', 'Batch', b);
  }
  if (b.status !== 'completed' || b2.status !== 'cancelled' || !seen.has('in_progress')) fail(`batches ${b.status} ${b2.status}, seen ${[...seen]}`);
  const listed = [];
  for await (const x of client.batches.list({ limit: 1 })) {
    check('listed batch', 'Batch', x);
    listed.push(x.id);
  }
  if (listed[0] !== b2.id || listed[1] !== b.id) fail(`list ${listed}`);
  const content = await client.files.content(b.output_file_id);
  report.calls++;
  const ids = new Set();
  for (const l of (await content.text()).trim().split('\n')) {
    const o = JSON.parse(l);
    if (o.response?.status_code !== 200 || o.error !== null) fail(`output line ${l}`);
    check('batch completion', 'ChatCompletion', o.response.body);
    usage(o.response.body.model, o.response.body.usage, true);
    ids.add(o.custom_id);
  }
  if (ids.size !== 20) fail(`${ids.size} custom_ids in the output`);
  const rc = b.request_counts;
  if (rc.total !== 21 || rc.completed !== 20 || rc.failed !== 1 || !b.error_file_id) fail(`request_counts ${JSON.stringify(rc)}`);
  const bad = (await (await client.files.content(b.error_file_id)).text()).trim().split('\n').map((l) => JSON.parse(l));
  report.calls++;
  if (bad.length !== 1 || bad[0].custom_id !== 'node-bad' || bad[0].error !== null || bad[0].response?.status_code !== 400 ||
      bad[0].response.body?.error?.param !== 'temperature' || !bad[0].response.request_id) {
    fail(`the error file: ${JSON.stringify(bad)}`);
  }
  const errs = (await (await client.files.content(b2.error_file_id)).text()).trim().split('\n').map((l) => JSON.parse(l));
  report.calls++;
  if (errs.length !== 21 || !errs.every((x) => x.response === null && x.error?.code === 'batch_cancelled' && x.error.message) ||
      new Set(errs.map((x) => x.custom_id)).size !== 21) {
    fail(`cancelled lines: ${JSON.stringify(errs.slice(0, 2))}`);
  }
  return { b, b2 };
}

// Through the gateway: the chat part, the batch lifecycle, then another
// client finds none of it.
async function serveMain() {
  await chat(false);
  const { b, b2 } = await batches();
  const other = new OpenAI({ apiKey: GW_KEY2, baseURL: `${GW_URL}/v1`, organization: null, project: null, maxRetries: 0 });
  const calls = [
    ['batches.retrieve', 'batch_id', () => other.batches.retrieve(b.id)],
    ['batches.cancel', 'batch_id', () => other.batches.cancel(b2.id)],
    ['files.retrieve', 'id', () => other.files.retrieve(b.output_file_id)],
    ['files.content', 'id', () => other.files.content(b.error_file_id)],
    ['files.delete', 'id', () => other.files.delete(b.output_file_id)],
  ];
  for (const [what, param, call] of calls) {
    report.calls++;
    try {
      await call();
      fail(`another client's ${what} of the first's was answered`);
    } catch (e) {
      errorIs(`another client's ${what}`, e, OpenAI.NotFoundError, 404, 'invalid_request_error', null, param);
    }
  }
  const listed = [];
  for await (const x of other.batches.list()) listed.push(x.id);
  report.calls++;
  if (listed.length !== 0) fail(`another client's batches.list: ${listed}`);
  if ((await client.files.retrieve(b.output_file_id)).id !== b.output_file_id) fail('the first client\'s output file is gone');
}

(SERVE ? serveMain() : main())
  .catch((e) => fail(`uncaught: ${e && e.stack ? e.stack : e}`))
  .finally(() => process.stdout.write(JSON.stringify(report) + '\n'));
