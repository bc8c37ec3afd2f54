// Judge every prompt of a CSV through `apidispatch serve`, with the official TypeScript SDK.
//
// The CSV has a header row with the columns `id` and `prompt` (other columns are
// ignored); `id` becomes the custom_id, so it must match [a-zA-Z0-9_-]{1,64}.
// Each prompt is sent as the user message under a judge's system prompt, and one
// JSON line per prompt is written: {id, ok, text, usage, cost_usd} or
// {id, ok: false, error}. A summary goes to stderr, and the exit code is 0 only
// when every prompt was judged.
//
//   npm install                                          # @anthropic-ai/sdk, from package.json
//   export ANTHROPIC_BASE_URL=http://127.0.0.1:8787      # printed by `apidispatch serve`
//   export ANTHROPIC_API_KEY=sk-gw-...                   # the gateway's token, not an org's key
//   node judge_csv.mjs prompts.csv --mode sync  > verdicts.jsonl   # one request at a time
//   node judge_csv.mjs prompts.csv --mode async > verdicts.jsonl   # 200 requests in flight
//   node judge_csv.mjs prompts.csv --mode batch > verdicts.jsonl   # one Message Batch, half price
//
// The gateway spreads the requests over every org under the polite caps and
// retries 429, 529 and 5xx inside itself (--retry-for), so the SDK is told not
// to retry (maxRetries: 0): a second send could be billed twice.
import { readFileSync, createWriteStream } from "node:fs";
import { parseArgs } from "node:util";
import Anthropic from "@anthropic-ai/sdk";

const SYSTEM = "You are a judge. Read the text the user gives you and evaluate it for accuracy, " +
  "relevance and clarity. Answer with a JSON object: " +
  '{"score": 1-10, "reason": "one sentence"}.';
const ID = /^[a-zA-Z0-9_-]{1,64}$/;
const MAX_BATCH = 100_000; // requests in one Message Batch (the API's limit)

function fail(msg) {
  console.error(msg);
  process.exit(2);
}

// parseCSV reads RFC 4180 CSV: quoted fields may hold commas, newlines and "" for a quote.
// It returns the rows, each with the line its record starts on.
function parseCSV(text) {
  const rows = [];
  let row = [], field = "", quoted = false, line = 1, start = 1;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; }
      else if (c === '"') quoted = false;
      else { if (c === "\n") line++; field += c; }
    } else if (c === '"' && field === "") quoted = true;
    else if (c === ",") { row.push(field); field = ""; }
    else if (c === "\n" || c === "\r") {
      if (c === "\r" && text[i + 1] === "\n") i++;
      row.push(field); field = "";
      if (row.length > 1 || row[0] !== "") rows.push({ line: start, cells: row });
      row = []; line++; start = line;
    } else field += c;
  }
  if (quoted) fail("the CSV ends inside a quoted field");
  if (field !== "" || row.length > 0) { row.push(field); rows.push({ line: start, cells: row }); }
  return rows;
}

function readPrompts(path) {
  const [header, ...records] = parseCSV(readFileSync(path, "utf8").replace(/^\uFEFF/, ""));
  const col = (name) => header?.cells.indexOf(name) ?? -1;
  const [idCol, promptCol] = [col("id"), col("prompt")];
  if (idCol < 0 || promptCol < 0) fail(`${path}: the header has no id or no prompt column (it needs both)`);
  const seen = new Map();
  return records.map(({ line, cells }) => {
    const id = (cells[idCol] ?? "").trim(), prompt = cells[promptCol] ?? "";
    if (!ID.test(id)) fail(`${path}:${line}: id ${JSON.stringify(id)} must be 1 to 64 characters of [a-zA-Z0-9_-]`);
    if (seen.has(id)) fail(`${path}:${line}: id ${JSON.stringify(id)} is a duplicate of line ${seen.get(id)}`);
    if (prompt.trim() === "") fail(`${path}:${line}: id ${JSON.stringify(id)} has an empty prompt`);
    seen.set(id, line);
    return { id, prompt };
  });
}

const { values: opt, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    mode: { type: "string", default: "sync" },
    concurrency: { type: "string", default: "200" },
    model: { type: "string", default: "claude-sonnet-4-5" },
    "max-tokens": { type: "string", default: "256" },
    route: { type: "string", default: "batch" },
    poll: { type: "string", default: "10" },
    out: { type: "string" },
  },
});
const concurrency = Number(opt.concurrency), maxTokens = Number(opt["max-tokens"]), poll = Number(opt.poll);
if (positionals.length !== 1) fail("usage: node judge_csv.mjs PROMPTS.csv [--mode sync|async|batch] [--concurrency 200] [--out FILE]");
if (!["sync", "async", "batch"].includes(opt.mode)) fail(`--mode ${opt.mode}: want sync, async or batch`);
if (!(Number.isInteger(concurrency) && concurrency >= 1 && Number.isInteger(maxTokens) && maxTokens >= 1 && poll > 0)) {
  fail("--concurrency and --max-tokens must be whole numbers of at least 1, --poll above 0");
}
if (!process.env.ANTHROPIC_BASE_URL || !process.env.ANTHROPIC_API_KEY) {
  fail("set ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY (apidispatch serve prints both)");
}

const rows = readPrompts(positionals[0]);
const out = opt.out ? createWriteStream(opt.out) : process.stdout;
const counts = { ok: 0, errors: 0 };
function emit(line) {
  counts[line.ok ? "ok" : "errors"]++;
  out.write(JSON.stringify(line) + "\n");
}

const client = new Anthropic({ maxRetries: 0 });
const params = (prompt) => ({
  model: opt.model, max_tokens: maxTokens, system: SYSTEM,
  messages: [{ role: "user", content: prompt }],
});
const textOf = (msg) => msg.content.filter((b) => b.type === "text").map((b) => b.text).join("");

async function judgeOne({ id, prompt }) {
  try {
    const { data: msg, response } = await client.messages.create(params(prompt)).withResponse();
    return { id, ok: true, text: textOf(msg), usage: msg.usage, cost_usd: response.headers.get("x-apidispatch-cost-usd") };
  } catch (e) {
    return { id, ok: false, error: e instanceof Anthropic.APIError ? `HTTP ${e.status}: ${e.message}` : String(e) };
  }
}

let peak = 0;
const t0 = performance.now();
if (opt.mode === "sync") {
  for (const row of rows) emit(await judgeOne(row));
} else if (opt.mode === "async") {
  // A pool of `concurrency` workers, each taking the next prompt as it finishes one.
  let next = 0, now = 0;
  const worker = async () => {
    while (next < rows.length) {
      const row = rows[next++];
      peak = Math.max(peak, ++now);
      emit(await judgeOne(row));
      now--;
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, rows.length) }, worker));
} else {
  // One Message Batch per 100,000 prompts through the gateway, which fans it out
  // over every org; poll until it ends, then read its results.
  for (let i = 0; i < rows.length; i += MAX_BATCH) {
    const chunk = rows.slice(i, i + MAX_BATCH);
    let batch = await client.messages.batches.create(
      { requests: chunk.map(({ id, prompt }) => ({ custom_id: id, params: params(prompt) })) },
      { headers: { "x-apidispatch-route": opt.route } });
    console.error(`batch ${batch.id}: ${chunk.length} requests, ${batch.processing_status}`);
    while (batch.processing_status !== "ended") {
      await new Promise((r) => setTimeout(r, poll * 1000));
      batch = await client.messages.batches.retrieve(batch.id);
    }
    console.error(`batch ${batch.id}: ended, ${JSON.stringify(batch.request_counts)}`);
    for await (const r of await client.messages.batches.results(batch.id)) {
      if (r.result.type === "succeeded") {
        emit({ id: r.custom_id, ok: true, text: textOf(r.result.message), usage: r.result.message.usage });
      } else {
        emit({ id: r.custom_id, ok: false, error: JSON.stringify(r.result) });
      }
    }
  }
}
if (opt.out) await new Promise((r) => out.end(r));
const inFlight = opt.mode === "async" ? `, at most ${peak} in flight` : "";
console.error(`judged ${rows.length} prompts (${opt.mode}): ${counts.ok} ok, ${counts.errors} errors, ` +
  `in ${((performance.now() - t0) / 1000).toFixed(1)} s${inFlight}`);
process.exitCode = counts.ok === rows.length ? 0 : 1;
