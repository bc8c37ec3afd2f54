// Every call a judge script makes, through `apidispatch serve`, with the official SDK.
//
// Nothing here is specific to the gateway but the base URL and the key, which the
// SDK reads from the environment:
//
//   npm install @anthropic-ai/sdk
//   ANTHROPIC_BASE_URL=http://127.0.0.1:8787   # printed by `apidispatch serve`
//   ANTHROPIC_API_KEY=sk-gw-...                 # the gateway's token, not an org's key
//   node judge.mjs
//
// It creates a message, streams the same request (the accumulated text must equal
// the final message), counts tokens, lists and retrieves models, asks for a model
// that does not exist (the API's 404 not_found_error), then runs two
// Message Batches: one to the end (retrieve, list, results, delete) and one
// canceled at once. It exits non-zero at the first answer that is not what the
// Anthropic API answers.
import { isDeepStrictEqual } from "node:util";
import Anthropic from "@anthropic-ai/sdk";

const MODEL = "claude-sonnet-4-5";
const BATCH_MODEL = "claude-haiku-4-5";
const N = 10; // requests per batch

const judge = (i) => ({
  model: MODEL,
  max_tokens: 256,
  system: "You are a judge. Evaluate the answer.",
  messages: [{ role: "user", content: `Item ${i}. Provide your evaluation as a JSON object.` }],
});

function check(ok, what) {
  console.log((ok ? "ok   " : "FAIL ") + what);
  if (!ok) process.exit(1);
}

const textOf = (msg) => msg.content.filter((b) => b.type === "text").map((b) => b.text).join("");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitEnded(client, id, timeoutS = 600) {
  const deadline = Date.now() + timeoutS * 1000;
  for (;;) {
    const b = await client.messages.batches.retrieve(id);
    if (b.processing_status === "ended") return b;
    if (Date.now() > deadline) throw new Error(`batch ${id} still ${b.processing_status} after ${timeoutS} s`);
    await sleep(1000);
  }
}

// The gateway retries 429, 529 and 5xx inside itself (--retry-for), so the
// SDK need not; an SDK retry would only queue the request again.
const client = new Anthropic({ maxRetries: 0 });

// Create, and read the gateway's own headers from the raw response.
const { data: msg, response } = await client.messages.create(judge(0)).withResponse();
check(msg.type === "message" && msg.stop_reason !== null && msg.usage.output_tokens > 0,
  `create: ${msg.id}, ${msg.usage.output_tokens} output tokens, stop_reason ${msg.stop_reason}`);
const h = (k) => response.headers.get(k);
console.log(`     org ${h("x-apidispatch-org")}, attempts ${h("x-apidispatch-attempts")}, cost $${h("x-apidispatch-cost-usd")}, request-id ${h("request-id")}`);

// Stream: the text deltas, accumulated, are the final message.
const stream = client.messages.stream(judge(0));
let streamed = "";
stream.on("text", (t) => { streamed += t; });
const final = await stream.finalMessage();
check(streamed === textOf(final) && final.usage.output_tokens > 0 && final.stop_reason !== null,
  `stream: ${streamed.length} characters streamed = the final message's text, ${final.usage.output_tokens} output tokens`);
// The simulator answers a request the same way every time; the real API does not.
console.log(`     streamed = unstreamed create: ${textOf(final) === textOf(msg) && isDeepStrictEqual(final.usage, msg.usage)}`);

const count = await client.messages.countTokens({ model: MODEL, system: judge(0).system, messages: judge(0).messages });
check(count.input_tokens > 0, `count_tokens: ${count.input_tokens} input tokens (create billed ${msg.usage.input_tokens})`);

const models = [];
for await (const m of client.models.list({ limit: 2 })) models.push(m.id); // every page
check(models.length > 0 && new Set(models).size === models.length, `models.list: ${models.length} models, ${models.slice(0, 3)}...`);
const m = await client.models.retrieve(models[0]);
check(m.id === models[0] && m.type === "model", `models.retrieve: ${m.id} (${m.display_name})`);

// A model the API does not serve: its 404 not_found_error, as the API answers.
try {
  await client.messages.create({ ...judge(0), model: "claude-nonexistent-9" });
  check(false, "an unknown model is answered 404");
} catch (e) {
  check(e instanceof Anthropic.NotFoundError && e.status === 404, "an unknown model: 404 not_found_error");
}

// Message Batches. A gateway batch is fanned out over every org; the route is
// the gateway's default (the Batches API, half price) unless a header names
// another: x-apidispatch-route: auto (with x-apidispatch-deadline: 2h) or sync.
const requests = Array.from({ length: N }, (_, i) => ({ custom_id: `item-${i}`, params: { ...judge(i), model: BATCH_MODEL } }));
const batch = await client.messages.batches.create({ requests }, { headers: { "x-apidispatch-route": "batch" } });
check(batch.id.startsWith("msgbatch_") && batch.processing_status === "in_progress" && batch.request_counts.processing === N,
  `batches.create: ${batch.id} in_progress, ${N} processing`);
const other = await client.messages.batches.create({ requests });
const canceling = await client.messages.batches.cancel(other.id);
check(canceling.id === other.id && ["canceling", "ended"].includes(canceling.processing_status),
  `batches.cancel: ${other.id} ${canceling.processing_status}`);

const listed = [];
for await (const b of client.messages.batches.list({ limit: 1 })) listed.push(b.id); // one a page, newest first
check(listed[0] === other.id && listed[1] === batch.id, `batches.list: ${listed.length} batches, newest first`);

let ended = await waitEnded(client, batch.id);
check(ended.request_counts.succeeded + ended.request_counts.errored === N && ended.results_url !== null,
  `batches.retrieve: ended, ${JSON.stringify(ended.request_counts)}`);
const results = new Map();
for await (const r of await client.messages.batches.results(batch.id)) results.set(r.custom_id, r.result);
check(results.size === N && requests.every((q) => results.has(q.custom_id)) &&
  [...results.values()].every((r) => r.type === "succeeded" && r.message.usage.output_tokens > 0),
  `batches.results: ${results.size} results, each custom_id once, all succeeded`);

ended = await waitEnded(client, other.id);
const c = ended.request_counts;
check(c.canceled + c.succeeded + c.errored + c.expired === N && ended.cancel_initiated_at !== null,
  `canceled batch ended: ${JSON.stringify(c)}`);
const kinds = new Set();
for await (const r of await client.messages.batches.results(other.id)) kinds.add(r.result.type);
check([...kinds].every((k) => k === "canceled" || k === "succeeded"), `canceled batch's results: ${[...kinds]}`);

for (const id of [batch.id, other.id]) {
  const d = await client.messages.batches.delete(id);
  check(d.id === id && d.type === "message_batch_deleted", `batches.delete: ${id}`);
}
try {
  await client.messages.batches.retrieve(batch.id);
  check(false, "a deleted batch is gone");
} catch (e) {
  check(e instanceof Anthropic.NotFoundError, "a deleted batch is gone (404 not_found_error)");
}

// A wrong key is the API's 401, which the SDK throws and never retries.
try {
  await new Anthropic({ apiKey: "sk-gw-not-a-token", maxRetries: 0 }).messages.create(judge(0));
  check(false, "a wrong token is refused");
} catch (e) {
  check(e instanceof Anthropic.AuthenticationError && e.status === 401, "a wrong token is refused (401 authentication_error)");
}
