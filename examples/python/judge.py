"""Every call a judge script makes, through `apidispatch serve`, with the official SDK.

Nothing here is specific to the gateway but the base URL and the key, which the
SDK reads from the environment:

    ANTHROPIC_BASE_URL=http://127.0.0.1:8787   # printed by `apidispatch serve`
    ANTHROPIC_API_KEY=sk-gw-...                 # the gateway's token, not an org's key
    python3 judge.py

It creates a message, streams the same request (the accumulated text must equal
the final message), counts tokens, lists and retrieves models, asks for a model
that does not exist (the API's 404 not_found_error), then runs two
Message Batches: one to the end (retrieve, list, results, delete) and one
canceled at once. It exits non-zero at the first answer that is not what the
Anthropic API answers.
"""

import json
import sys
import time

import anthropic
import pydantic
from anthropic.types import Message, MessageTokensCount, ModelInfo, RawMessageStreamEvent
from anthropic.types.messages import DeletedMessageBatch, MessageBatch, MessageBatchIndividualResponse
from anthropic.types.shared import ErrorResponse

MODEL = "claude-sonnet-4-5"
BATCH_MODEL = "claude-haiku-4-5"
N = 10  # requests per batch


def judge(i):
    return {
        "model": MODEL,
        "max_tokens": 256,
        "system": "You are a judge. Evaluate the answer.",
        "messages": [{"role": "user", "content": f"Item {i}. Provide your evaluation as a JSON object."}],
    }


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        sys.exit(1)


# The SDK builds its objects without validating them (a missing field is
# None, a wrong type is kept), so an answer can be read without error and
# still differ from the API's. strict validates each answer's body against
# the SDK's own types and notes every difference, with its request-id header.
differ = []
validated = 0


def strict(type_, data, what, headers=None):
    global validated
    validated += 1
    try:
        pydantic.TypeAdapter(type_).validate_python(data)
    except pydantic.ValidationError as e:
        differ.append(f"{what}: {e}")
    if headers is not None and not headers.get("request-id"):
        differ.append(f"{what}: no request-id header")


def strict_raw(raw, type_, what):
    strict(type_, raw.http_response.json(), what, raw.http_response.headers)


def strict_error(e, what):
    strict(ErrorResponse, e.body, what, e.response.headers)


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


def wait_ended(client, batch_id, timeout_s=600):
    deadline = time.monotonic() + timeout_s
    while True:
        b = client.messages.batches.retrieve(batch_id)
        if b.processing_status == "ended":
            return b
        if time.monotonic() > deadline:
            sys.exit(f"batch {batch_id} still {b.processing_status} after {timeout_s} s")
        time.sleep(1)


def main():
    # The gateway retries 429, 529 and 5xx inside itself (--retry-for), so the
    # SDK need not; an SDK retry would only queue the request again.
    client = anthropic.Anthropic(max_retries=0)

    # Create, and read the gateway's own headers from the raw response.
    raw = client.messages.with_raw_response.create(**judge(0))
    strict_raw(raw, Message, "create")
    msg = raw.parse()
    check(msg.type == "message" and msg.stop_reason is not None and msg.usage.output_tokens > 0,
          f"create: {msg.id}, {msg.usage.output_tokens} output tokens, stop_reason {msg.stop_reason}")
    print(f"     org {raw.headers.get('x-apidispatch-org')}, attempts {raw.headers.get('x-apidispatch-attempts')},"
          f" cost ${raw.headers.get('x-apidispatch-cost-usd')}, request-id {raw.headers.get('request-id')}")

    # Stream: the text deltas, accumulated, are the final message.
    with client.messages.stream(**judge(0)) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(streamed == text_of(final) and final.usage.output_tokens > 0 and final.stop_reason is not None,
          f"stream: {len(streamed)} characters streamed = the final message's text, {final.usage.output_tokens} output tokens")
    raw = client.messages.with_raw_response.create(**judge(0), stream=True)
    events, name = 0, None
    for line in raw.http_response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            events += 1
            event = json.loads(line[len("data: "):])
            if name != event.get("type"):  # the SDK reads the event's name, not its data's type
                differ.append(f"stream event {events}: named {name!r}, its data of type {event.get('type')!r}")
            if event.get("type") != "ping":  # the API's keep-alive, which the SDK skips
                strict(RawMessageStreamEvent, event, f"stream event {events}")
            name = None
    check(events > 0, f"stream: {events} events")
    # The simulator answers a request the same way every time; the real API does not.
    print(f"     streamed = unstreamed create: {text_of(final) == text_of(msg) and final.usage == msg.usage}")

    count = client.messages.count_tokens(model=MODEL, system=judge(0)["system"], messages=judge(0)["messages"])
    strict_raw(client.messages.with_raw_response.count_tokens(model=MODEL, system=judge(0)["system"], messages=judge(0)["messages"]),
               MessageTokensCount, "count_tokens")
    check(count.input_tokens > 0, f"count_tokens: {count.input_tokens} input tokens (create billed {msg.usage.input_tokens})")

    models = [m.id for m in client.models.list(limit=2)]  # iterating pages through every model
    check(len(models) > 0 and len(set(models)) == len(models), f"models.list: {len(models)} models, {models[:3]}...")
    page = client.models.with_raw_response.list(limit=2)
    body = page.http_response.json()
    strict(list[ModelInfo], body.get("data"), "models.list's data", page.http_response.headers)
    if not isinstance(body.get("has_more"), bool) or not all(k in body for k in ("first_id", "last_id")):
        differ.append(f"models.list: a page without has_more, first_id or last_id: {sorted(body)}")
    strict_raw(client.models.with_raw_response.retrieve(models[0]), ModelInfo, "models.retrieve")
    m = client.models.retrieve(models[0])
    check(m.id == models[0] and m.type == "model", f"models.retrieve: {m.id} ({m.display_name})")

    # A model the API does not serve: its 404 not_found_error, as the API answers.
    try:
        client.messages.create(**{**judge(0), "model": "claude-nonexistent-9"})
        check(False, "an unknown model is answered 404")
    except anthropic.NotFoundError as e:
        strict_error(e, "an unknown model's 404")
        check(e.status_code == 404, "an unknown model: 404 not_found_error")

    # Message Batches. A gateway batch is fanned out over every org; the route
    # is the gateway's default (the Batches API, half price) unless a header
    # names another: x-apidispatch-route: auto (with x-apidispatch-deadline: 2h) or sync.
    requests = [{"custom_id": f"item-{i}", "params": {**judge(i), "model": BATCH_MODEL}} for i in range(N)]
    raw = client.messages.batches.with_raw_response.create(requests=requests, extra_headers={"x-apidispatch-route": "batch"})
    strict_raw(raw, MessageBatch, "batches.create")
    batch = raw.parse()
    check(batch.id.startswith("msgbatch_") and batch.processing_status == "in_progress"
          and batch.request_counts.processing == N, f"batches.create: {batch.id} in_progress, {N} processing")
    other = client.messages.batches.create(requests=requests)
    raw = client.messages.batches.with_raw_response.cancel(other.id)
    strict_raw(raw, MessageBatch, "batches.cancel")
    canceling = raw.parse()
    check(canceling.id == other.id and canceling.processing_status in ("canceling", "ended"),
          f"batches.cancel: {other.id} {canceling.processing_status}")

    page = client.messages.batches.with_raw_response.list(limit=1)
    body = page.http_response.json()
    strict(list[MessageBatch], body.get("data"), "batches.list's data", page.http_response.headers)
    if not isinstance(body.get("has_more"), bool) or not all(k in body for k in ("first_id", "last_id")):
        differ.append(f"batches.list: a page without has_more, first_id or last_id: {sorted(body)}")
    listed = [b.id for b in client.messages.batches.list(limit=1)]  # one a page, newest first
    check(listed[:2] == [other.id, batch.id], f"batches.list: {len(listed)} batches, newest first")

    ended = wait_ended(client, batch.id)
    strict_raw(client.messages.batches.with_raw_response.retrieve(batch.id), MessageBatch, "batches.retrieve (ended)")
    check(ended.request_counts.succeeded + ended.request_counts.errored == N and ended.results_url is not None,
          f"batches.retrieve: ended, {ended.request_counts}")
    lines = client.get(ended.results_url, cast_to=str, options={"headers": {"Accept": "application/binary"}})
    for i, line in enumerate(lines.splitlines()):
        if line.strip():
            strict(MessageBatchIndividualResponse, json.loads(line), f"batches.results line {i + 1}")
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    check(sorted(results) == sorted(r["custom_id"] for r in requests)
          and all(r.type == "succeeded" and r.message.usage.output_tokens > 0 for r in results.values()),
          f"batches.results: {len(results)} results, each custom_id once, all succeeded")

    ended = wait_ended(client, other.id)
    c = ended.request_counts
    check(c.canceled + c.succeeded + c.errored + c.expired == N and ended.cancel_initiated_at is not None,
          f"canceled batch ended: {c}")
    kinds = sorted({r.result.type for r in client.messages.batches.results(other.id)})
    check(set(kinds) <= {"canceled", "succeeded"}, f"canceled batch's results: {kinds}")

    for bid in (batch.id, other.id):
        raw = client.messages.batches.with_raw_response.delete(bid)
        strict_raw(raw, DeletedMessageBatch, "batches.delete")
        d = raw.parse()
        check(d.id == bid and d.type == "message_batch_deleted", f"batches.delete: {bid}")
    try:
        client.messages.batches.retrieve(batch.id)
        check(False, "a deleted batch is gone")
    except anthropic.NotFoundError as e:
        strict_error(e, "a deleted batch's 404")
        check(True, "a deleted batch is gone (404 not_found_error)")

    # A wrong key is the API's 401, which the SDK raises and never retries.
    try:
        anthropic.Anthropic(api_key="sk-gw-not-a-token", max_retries=0).messages.create(**judge(0))
        check(False, "a wrong token is refused")
    except anthropic.AuthenticationError as e:
        strict_error(e, "a wrong token's 401")
        check(e.status_code == 401, "a wrong token is refused (401 authentication_error)")

    for d in differ:
        print("     differs: " + d)
    check(not differ, f"{validated} answers validated against the SDK's types: {len(differ)} differ")


if __name__ == "__main__":
    main()
