"""Drives the official openai Python SDK through a judge workflow against the
apidispatch simulator (run by sim's TestOpenAIPythonSDK, built with -tags
sdkexamples).

Environment: SIM_URL (the simulator's base URL), SIM_KEY (an OpenAI org's
key), SIM_ORG and SIM_PROJECT (its organization and a project of it). It
sets and clears the simulator's faults (POST/DELETE /sim/faults) for the
500s, 429s and the error event mid-stream.

Through 'apidispatch serve' (run by internal/openaiconform's
TestOpenAIPythonSDKBatchesThroughServe): GW_URL (the gateway's base URL),
GW_KEY and GW_KEY2 (two clients' gateway tokens), and no SIM_*. The SDK
is given only the gateway's base URL and a token, and runs the chat part
of the workflow as main() does (chat(), without the simulator's faults,
with the gateway's own answers where they differ), the batch lifecycle
(files and batches), then checks that the second client finds none of
the first's files and batches (404).

It prints one line per check, "ok     what" or "differ what: how", then
"usages [...]" (every usage the SDK saw, for the Go test to price against
the simulator's ledger) and "N checks, M differ"; it exits 1 when any
check differs or a call fails unexpectedly.

A check differs when an answer is not what the API reference and the SDK
expect: its body does not validate against the SDK's own type (a field the
type requires is absent, a value of another type or outside its Literal,
or a field the type does not declare: the SDK builds its objects without
validating them, so none of this would raise), a header the API sends is
missing, the SDK raises another error than the API's for that answer, or
it retries other than the API's headers direct.
"""

import asyncio
import json
import os
import sys
import threading
import time
import urllib.request

import openai
import pydantic
from openai.types import Batch, FileObject, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.shared import ErrorObject

SERVE = bool(os.environ.get("GW_URL"))
URL = os.environ["GW_URL"] if SERVE else os.environ["SIM_URL"]
KEY = os.environ["GW_KEY"] if SERVE else os.environ["SIM_KEY"]
ORG = None if SERVE else os.environ["SIM_ORG"]
PROJECT = None if SERVE else os.environ["SIM_PROJECT"]
MODEL = "gpt-4.1-mini"

checks = 0
differ = []
usages = []


def check(ok, what, how=""):
    global checks
    checks += 1
    if ok:
        print(f"ok     {what}", flush=True)
    else:
        differ.append(what)
        print(f"differ {what}: {how}", flush=True)


# --- the SDK's declared shapes ----------------------------------------------


def extras(v, where):
    """The fields of v (an SDK object) and of the objects in it that its
    type does not declare."""
    if isinstance(v, pydantic.BaseModel):
        for k in v.model_extra or {}:
            yield f"{where}.{k}: not declared by the SDK's {type(v).__name__}"
        for name in type(v).model_fields:
            yield from extras(getattr(v, name), f"{where}.{name}")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from extras(x, f"{where}[{i}]")
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from extras(x, f"{where}.{k}")


def shape(type_, raw, where, documented=()):
    """How the JSON text raw departs from the SDK's type_: validated
    strictly (no coercion), then walked for undeclared fields, but for the
    top-level fields named in documented: those the API reference documents
    and the SDK's type does not model."""
    if isinstance(raw, (dict, list)):
        raw = json.dumps(raw)
    try:
        obj = pydantic.TypeAdapter(type_).validate_json(raw, strict=True)
    except pydantic.ValidationError as e:
        return [f"{where}.{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()]
    return [d for d in extras(obj, where) if d.split(":")[0] not in {f"{where}.{k}" for k in documented}]


def check_shape(type_, raw, what):
    d = shape(type_, raw, what)
    check(not d, f"{what} is the SDK's {type_.__name__}", "; ".join(d))


# The check can fail: a field missing and a string for an int differ
# twice; a field undeclared, nested or not, once each.
_self = (shape(Model, {"id": "m", "object": "model", "created": "1"}, "selftest")
         + shape(Model, {"id": "m", "object": "model", "created": 1, "owned_by": "system", "extra": 1}, "selftest")
         + shape(Batch, {"id": "b", "object": "batch", "completion_window": "24h", "created_at": 1, "endpoint": "e",
                         "input_file_id": "f", "status": "completed", "request_counts": {"total": 1, "completed": 1,
                                                                                         "failed": 0, "extra": 1}},
                 "selftest"))
if len(_self) != 4:
    sys.exit(f"the shape check is broken: {_self}")


def check_complete(type_, raw, what):
    """The API writes every field of a Batch and a FileObject, null when
    unset: each field the SDK's type declares is present."""
    obj = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    missing = [k for k in type_.model_fields if k not in obj]
    check(not missing, f"{what}: every field of the SDK's {type_.__name__} present", f"missing {missing}")


def check_headers(headers, what, org=True):
    # The gateway answers with its own request id; the upstream org's id
    # and processing time are not a client's to see.
    want = ["x-request-id"] if SERVE else ["x-request-id", "openai-processing-ms"] + (["openai-organization"] if org else [])
    missing = [h for h in want if not headers.get(h)]
    check(not missing, f"{what}: headers {', '.join(want)}", f"missing {missing}")


def check_error(e, cls, status, typ, code, what, param=None):
    """e is the SDK's exception for an error answer: its class, status,
    the error object's shape and its type, code and param."""
    ok = isinstance(e, cls) and e.status_code == status and e.type == typ and e.code == code and e.param == param
    check(ok, f"{what}: {cls.__name__} {status} {typ}/{code}",
          f"{type(e).__name__} {getattr(e, 'status_code', None)} type={getattr(e, 'type', None)} "
          f"code={getattr(e, 'code', None)} param={getattr(e, 'param', None)}")
    if isinstance(e, openai.APIStatusError):
        body = e.response.json()
        check(list(body) == ["error"], f"{what}: the body is {{\"error\": {{...}}}}", f"keys {list(body)}")
        check_shape(ErrorObject, body.get("error", {}), f"{what}: error")
        check_headers(e.response.headers, what, org=status != 401)


def usage(model, u, batch=False):
    usages.append({
        "model": model, "batch": batch,
        "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
        "cached_tokens": (u.prompt_tokens_details.cached_tokens or 0) if u.prompt_tokens_details else 0,
        "reasoning_tokens": (u.completion_tokens_details.reasoning_tokens or 0) if u.completion_tokens_details else 0,
    })


def fault(f):
    req = urllib.request.Request(f"{URL}/sim/faults", data=json.dumps(f).encode(), method="POST")
    with urllib.request.urlopen(req) as r:
        r.read()


def clear_fault(fid):
    with urllib.request.urlopen(urllib.request.Request(f"{URL}/sim/faults?id={fid}", method="DELETE")) as r:
        r.read()


def judge(i, **extra):
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are an impartial judge. Evaluate the answer for correctness."},
            {"role": "user", "content": f"Question: what is 2+2? Answer: 4. Item {i}. Reply with a JSON object."},
        ],
        "max_completion_tokens": 200,
        **extra,
    }


class Attempts:
    """Records each request the SDK sends (its x-stainless-retry-count) and
    each answer, with their times, through httpx's event hooks; on_answer
    runs on every answer."""

    def __init__(self):
        self.log = []
        self.on_answer = None

    def request(self, req):
        self.log.append(("request", time.monotonic(), req.headers.get("x-stainless-retry-count"), None))

    def response(self, resp):
        self.log.append(("answer", time.monotonic(), resp.status_code, resp.headers))
        if self.on_answer:
            self.on_answer(resp)

    def client(self):
        return openai.DefaultHttpxClient(event_hooks={"request": [self.request], "response": [self.response]})


def client(max_retries=0, key=KEY, http_client=None):
    return openai.OpenAI(api_key=key, base_url=f"{URL}/v1", organization=ORG, project=PROJECT,
                         max_retries=max_retries, http_client=http_client)


def main():
    cl = client()
    chat(cl, direct=True)
    faults(cl)
    batches(cl)


def chat(cl, direct):
    """The chat part of the judge workflow: models, completions plain,
    streamed, with n choices, in JSON mode and with structured outputs,
    the async client, and the errors a client provokes itself. direct:
    against the simulator itself, with its faults (an error event
    mid-stream); else through the gateway, which answers a model without
    a price as a 400 on model and adds its own headers."""
    # Models.
    raw = cl.models.with_raw_response.list()
    listed = [m["id"] for m in raw.http_response.json()["data"]]
    for i, m in enumerate(raw.http_response.json()["data"]):
        check_shape(Model, m, f"models.list[{i}]")
    check(MODEL in listed, f"models.list: {len(listed)} models, {MODEL} among them", str(listed))
    m = cl.models.retrieve(MODEL)
    check(m.id == MODEL and m.object == "model", f"models.retrieve: {m.id}", repr(m))

    # A completion, with its headers.
    raw = cl.chat.completions.with_raw_response.create(**judge(1))
    c1 = raw.parse()
    check_shape(ChatCompletion, raw.http_response.text, "chat.completions.create")
    check_headers(raw.headers, "chat.completions.create")
    rl = ["x-ratelimit-limit-requests", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-requests",
          "x-ratelimit-remaining-tokens", "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]
    check(all(raw.headers.get(h) for h in rl), "chat.completions.create: the x-ratelimit-* headers",
          str({h: raw.headers.get(h) for h in rl}))
    check(c1._request_id == raw.headers.get("x-request-id"), f"_request_id {c1._request_id} is x-request-id")
    if not direct:
        gw = ["x-apidispatch-org", "x-apidispatch-attempts", "x-apidispatch-cost-usd"]
        check(all(raw.headers.get(h) for h in gw) and not raw.headers.get("openai-organization")
              and not raw.headers.get("openai-project"),
              "chat.completions.create through the gateway: x-apidispatch-org, -attempts, -cost-usd; "
              "no upstream openai-organization or openai-project",
              str({h: raw.headers.get(h) for h in gw + ["openai-organization", "openai-project"]}))
    try:
        json.loads(c1.choices[0].message.content)
        verdict = True
    except (TypeError, ValueError):
        verdict = False
    check(c1.object == "chat.completion" and c1.choices[0].finish_reason == "stop" and verdict
          and c1.usage.total_tokens == c1.usage.prompt_tokens + c1.usage.completion_tokens,
          f"create: {c1.id}, a JSON verdict, {c1.usage.completion_tokens} completion tokens", repr(c1))
    usage(c1.model, c1.usage)

    # The same streamed with usage: the raw events, then the SDK's Stream.
    with cl.chat.completions.with_streaming_response.create(
            **judge(1), stream=True, stream_options={"include_usage": True}) as resp:
        lines = [ln for ln in resp.iter_lines() if ln]
        headers = resp.headers
    check_headers(headers, "stream")
    check(headers.get("content-type", "").startswith("text/event-stream"), "stream: content-type text/event-stream",
          headers.get("content-type"))
    data = [ln[len("data: "):] for ln in lines if ln.startswith("data: ")]
    check(len(data) == len(lines) and data and data[-1] == "[DONE]",
          f"stream: {len(data)} data events, the last [DONE], no other lines",
          str([ln for ln in lines if not ln.startswith("data: ")][:3]) + " last " + (data[-1] if data else ""))
    # obfuscation: padding the API adds to streamed chunks unless
    # stream_options.include_obfuscation is false (the SDK documents it on
    # that parameter; its ChatCompletionChunk does not declare it).
    bad = [d for i, x in enumerate(data[:-1])
           for d in shape(ChatCompletionChunk, x, f"chunk {i}", documented=["obfuscation"])]
    check(not bad, f"stream: {len(data) - 1} chunks are the SDK's ChatCompletionChunk", "; ".join(bad[:5]))
    chunks = [json.loads(x) for x in data[:-1]]
    check(all(isinstance(ch.get("obfuscation"), str) for ch in chunks if ch["choices"]),
          "stream: each chunk with choices has an obfuscation string (include_obfuscation defaults to true)",
          json.dumps(chunks[0]))
    with cl.chat.completions.with_streaming_response.create(
            **judge(1), stream=True, stream_options={"include_usage": True, "include_obfuscation": False}) as resp:
        plain = [json.loads(ln[len("data: "):]) for ln in resp.iter_lines() if ln.startswith("data: {")]
    bad = [d for i, x in enumerate(plain) for d in shape(ChatCompletionChunk, x, f"chunk {i}")]
    check(plain and not bad, "stream with include_obfuscation false: chunks the SDK's ChatCompletionChunk, "
                             "no obfuscation", "; ".join(bad[:5]))
    usage(plain[-1]["model"], ChatCompletionChunk.model_validate(plain[-1]).usage)
    # With include_usage every chunk has "usage": null but the last, which
    # has the usage and no choices.
    check(all("usage" in ch and ch["usage"] is None for ch in chunks[:-1]) and chunks[-1]["choices"] == []
          and chunks[-1]["usage"] is not None, "stream: usage null in every chunk but the last, which has no choices",
          json.dumps(chunks[-1]))
    usage(chunks[-1]["model"], ChatCompletionChunk.model_validate(chunks[-1]).usage)

    text, finish, su, model, n_usage = "", None, None, None, 0
    for ch in cl.chat.completions.create(**judge(1), stream=True, stream_options={"include_usage": True}):
        model = ch.model
        if ch.usage:
            n_usage, su = n_usage + 1, ch.usage
        for c in ch.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    check(n_usage == 1 and text == c1.choices[0].message.content and finish == "stop"
          and su.completion_tokens == c1.usage.completion_tokens and su.prompt_tokens == c1.usage.prompt_tokens,
          f"stream: {len(text)} characters accumulated = the unstreamed completion, one usage chunk = its usage",
          f"{n_usage} usage chunks, finish {finish}, {text!r} vs {c1.choices[0].message.content!r}, {su} vs {c1.usage}")
    usage(model, su)

    if not direct:
        # A client that did not ask for the usage gets none (the gateway
        # asks upstream for it, to settle the stream, and takes it out):
        # no chunk has a usage field. The simulator answers the same
        # request alike, so it is billed c1's usage.
        with cl.chat.completions.with_streaming_response.create(**judge(1), stream=True) as resp:
            bare = [json.loads(ln[len("data: "):]) for ln in resp.iter_lines() if ln.startswith("data: {")]
        bad = [d for i, x in enumerate(bare) for d in shape(ChatCompletionChunk, x, f"chunk {i}", documented=["obfuscation"])]
        text = "".join(c["delta"].get("content") or "" for ch in bare for c in ch["choices"])
        check(bare and not bad and all("usage" not in ch and ch["choices"] for ch in bare)
              and text == c1.choices[0].message.content,
              f"stream without include_usage through the gateway: {len(bare)} chunks, none with a usage field, "
              f"the same {len(text)} characters", "; ".join(bad[:3]) + json.dumps(bare[-1:])[:300])
        usage(c1.model, c1.usage)

    # The SDK's stream helper: its deltas accumulated = its final completion.
    with cl.chat.completions.stream(**judge(2), stream_options={"include_usage": True}) as s:
        deltas = "".join(ev.delta for ev in s if ev.type == "content.delta")
        final = s.get_final_completion()
    check(deltas and deltas == final.choices[0].message.content and final.usage and final.choices[0].finish_reason == "stop",
          f"chat.completions.stream: {len(deltas)} characters of content.delta = get_final_completion's content",
          f"{deltas!r} vs {final.choices[0].message.content!r}")
    usage(final.model, final.usage)

    if direct:
        # An error after the 200 (the API's overloaded, as a data event): the
        # SDK raises APIError with the event's error object, after the chunks
        # before it.
        fault({"id": "py-cut", "kind": "stream_overloaded", "org": "oa"})
        got = []
        try:
            for ch in cl.chat.completions.create(**judge(8), stream=True):
                got.append(ch)
            check(False, "an error event mid-stream", "the stream ended without raising")
        except openai.APIError as e:
            check(type(e) is openai.APIError and got and e.message == "The server is overloaded or not ready yet."
                  and e.type == "server_error" and not shape(ErrorObject, e.body, "error event"),
                  f"an error event mid-stream: APIError {e.type!r} after {len(got)} chunks",
                  f"{type(e).__name__} {e.message!r} {e.body!r}, {len(got)} chunks")
        finally:
            clear_fault("py-cut")

    # n choices and a reasoning model (a developer message).
    raw = cl.chat.completions.with_raw_response.create(**judge(3, n=2))
    c3 = raw.parse()
    check_shape(ChatCompletion, raw.http_response.text, "n=2")
    check([c.index for c in c3.choices] == [0, 1], "n=2: choices 0 and 1", str([c.index for c in c3.choices]))
    usage(c3.model, c3.usage)
    raw = cl.chat.completions.with_raw_response.create(
        model="o4-mini", max_completion_tokens=1000,
        messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}])
    cr = raw.parse()
    check_shape(ChatCompletion, raw.http_response.text, "o4-mini")
    check(cr.usage.completion_tokens_details.reasoning_tokens > 0, "o4-mini: reasoning tokens",
          repr(cr.usage))
    usage(cr.model, cr.usage)

    # JSON mode: response_format json_object answers valid JSON whatever
    # else the prompt asks; the API refuses it when no message names JSON.
    jm = {"model": MODEL, "max_completion_tokens": 300, "response_format": {"type": "json_object"},
          "messages": [{"role": "user", "content": "Is 2+2 = 4? Answer in JSON, with a field correct."}]}
    cj = cl.chat.completions.create(**jm)
    usage(cj.model, cj.usage)
    try:
        json.loads(cj.choices[0].message.content)
        is_json = True
    except (TypeError, ValueError):
        is_json = False
    check(is_json and cj.choices[0].finish_reason == "stop", "response_format json_object: the content is JSON",
          f"{cj.choices[0].finish_reason}: {cj.choices[0].message.content[:120]!r}")
    try:
        cl.chat.completions.create(**{**jm, "messages": [{"role": "user", "content": "Is 2+2 = 4?"}]})
        check(False, "json_object without JSON in the messages", "accepted")
    except openai.APIError as e:
        check_error(e, openai.BadRequestError, 400, "invalid_request_error", None,
                    "json_object without JSON in the messages", param="messages")

    # Structured outputs: the SDK's parse() sends its pydantic model as a
    # strict json_schema (a nested model under $defs) and validates the
    # answer into it; its stream helper does the same at the stream's end.
    class Verdict(pydantic.BaseModel):
        correct: bool
        score: int
        reasoning: str

    class Review(pydantic.BaseModel):
        verdict: Verdict
        flags: list[str]

    ask = [{"role": "system", "content": "You are an impartial judge."},
           {"role": "user", "content": "Question: what is 2+2? Answer: 4. Review the answer."}]
    try:
        p = cl.chat.completions.parse(model=MODEL, messages=ask, max_completion_tokens=300, response_format=Review)
        usage(p.model, p.usage)
        check(isinstance(p.choices[0].message.parsed, Review) and p.choices[0].finish_reason == "stop",
              f"chat.completions.parse: the answer is the schema's Review: {p.choices[0].message.content[:80]}",
              repr(p.choices[0]))
    except (pydantic.ValidationError, openai.OpenAIError, ValueError) as e:
        check(False, "chat.completions.parse: the answer is the schema's Review", f"{type(e).__name__}: {e}"[:300])
    try:
        with cl.chat.completions.stream(model=MODEL, messages=ask, max_completion_tokens=300, response_format=Review,
                                        stream_options={"include_usage": True}) as s:
            for _ in s:
                pass
            fp = s.get_final_completion()
        usage(fp.model, fp.usage)
        check(isinstance(fp.choices[0].message.parsed, Review),
              "chat.completions.stream with a response_format: get_final_completion's parsed is a Review",
              repr(fp.choices[0]))
    except (pydantic.ValidationError, openai.OpenAIError, ValueError) as e:
        check(False, "chat.completions.stream with a response_format: a Review", f"{type(e).__name__}: {e}"[:300])

    # The async client.
    async def acreate():
        async with openai.AsyncOpenAI(api_key=KEY, base_url=f"{URL}/v1", organization=ORG, project=PROJECT,
                                      max_retries=0) as ac:
            return await ac.chat.completions.create(**judge(1))
    ca = asyncio.run(acreate())
    check(ca.choices[0].message.content == c1.choices[0].message.content, "AsyncOpenAI: the same completion")
    usage(ca.model, ca.usage)

    # Errors: 401, 404, 400.
    try:
        client(key="sk-proj-not-a-key").chat.completions.create(**judge(4))
        check(False, "401", "a wrong key was accepted")
    except openai.APIError as e:
        check_error(e, openai.AuthenticationError, 401, "invalid_request_error", "invalid_api_key", "a wrong key")
    try:
        cl.chat.completions.create(**{**judge(4), "model": "gpt-no-such-model"})
        check(False, "404", "an unknown model was accepted")
    except openai.APIError as e:
        if direct:
            check_error(e, openai.NotFoundError, 404, "invalid_request_error", "model_not_found", "an unknown model")
        else:
            # The gateway refuses a model it has no price for before
            # sending it: its spend could not be bounded.
            check_error(e, openai.BadRequestError, 400, "invalid_request_error", "model_not_found",
                        "an unknown model through the gateway", param="model")
    try:
        cl.files.retrieve("file-NoSuchFile0000000000")
        check(False, "404", "an unknown file was found")
    except openai.APIError as e:
        check_error(e, openai.NotFoundError, 404, "invalid_request_error", None, "files.retrieve unknown", param="id")
    try:
        cl.batches.retrieve("batch_no_such_batch")
        check(False, "404", "an unknown batch was found")
    except openai.APIError as e:
        check_error(e, openai.NotFoundError, 404, "invalid_request_error", None, "batches.retrieve unknown",
                    param="batch_id")
    try:
        cl.chat.completions.create(**judge(4, temperature=3))
        check(False, "400", "temperature 3 accepted")
    except openai.APIError as e:
        check_error(e, openai.BadRequestError, 400, "invalid_request_error", "decimal_above_max_value",
                    "temperature 3", param="temperature")



def faults(cl):
    """The simulator's faults (set and cleared through its admin
    endpoints): 500s and 429s the SDK retries or raises, a drained token
    bucket, the quota 429. Direct only: the gateway retries these itself."""
    # A 500 the SDK retries through (its own backoff).
    att = Attempts()
    fault({"id": "py-500", "kind": "server_error_500", "org": "oa"})
    att.on_answer = lambda r: r.status_code == 500 and clear_fault("py-500")
    c = client(max_retries=2, http_client=att.client()).chat.completions.create(**judge(5))
    answers = [a[2] for a in att.log if a[0] == "answer"]
    check(answers == [500, 200], "a 500 retried through: 500 then 200", str(answers))
    usage(c.model, c.usage)

    # The rate-limit 429, retried when its headers say: retry-after-ms
    # (1.2 s) before retry-after (2 s, whole seconds) and before the SDK's
    # own backoff (at most 0.5 s for a first retry).
    att = Attempts()
    fault({"id": "py-429", "kind": "storm_429", "org": "oa", "retry_after": "240s"})  # 1.2 s at K = 200
    att.on_answer = lambda r: r.status_code == 429 and clear_fault("py-429")
    c = client(max_retries=2, http_client=att.client()).chat.completions.create(**judge(6))
    usage(c.model, c.usage)
    answers = [a for a in att.log if a[0] == "answer"]
    requests = [a for a in att.log if a[0] == "request"]
    h = answers[0][3]
    check([a[2] for a in answers] == [429, 200] and [r[2] for r in requests] == ["0", "1"],
          "a 429 rate_limit_exceeded retried once: 429 then 200, x-stainless-retry-count 0 then 1",
          f"{[a[2] for a in answers]} {[r[2] for r in requests]}")
    check(h.get("retry-after") == "2" and h.get("retry-after-ms") == "1200" and h.get("x-ratelimit-limit-requests"),
          "the 429's retry-after 2, retry-after-ms 1200, x-ratelimit-* headers",
          f"retry-after {h.get('retry-after')}, retry-after-ms {h.get('retry-after-ms')}")
    if len(requests) == 2:
        gap = requests[1][1] - answers[0][1]
        # Honouring retry-after-ms waits 1.2 s (less a timer's granularity);
        # retry-after would be 2 s, the SDK's own backoff at most 0.5 s.
        check(1.15 <= gap < 1.95, f"the SDK waited retry-after-ms: {gap:.3f} s", f"{gap:.3f} s")
    try:
        fault({"id": "py-429b", "kind": "storm_429", "org": "oa", "retry_after": "240s"})
        cl.chat.completions.create(**judge(6))
        check(False, "429", "the storm was not answered")
    except openai.APIError as e:
        check_error(e, openai.RateLimitError, 429, "requests", "rate_limit_exceeded", "a 429 without retries")
    finally:
        clear_fault("py-429b")

    # The rate-limit 429 of a drained bucket: o4-mini's TPM is 3,000 and
    # each request reserves its prompt and max_completion_tokens (1,000).
    reason = {"model": "o4-mini", "max_completion_tokens": 1000,
              "messages": [{"role": "user", "content": "Is 2+2 = 4? Answer yes or no."}]}
    limited = None
    for _ in range(10):
        try:
            c = cl.chat.completions.create(**reason)
            usage(c.model, c.usage)
        except openai.RateLimitError as e:
            limited = e
            break
    if limited is None:
        check(False, "o4-mini's TPM drained", "10 requests of 1,000 tokens were all admitted")
    else:
        h = limited.response.headers
        check_error(limited, openai.RateLimitError, 429, "tokens", "rate_limit_exceeded", "o4-mini's TPM drained")
        check("tokens per min (TPM)" in limited.message and h.get("retry-after-ms") and h.get("retry-after")
              and h.get("x-ratelimit-remaining-tokens") and h.get("x-ratelimit-reset-tokens"),
              f"the drained bucket's 429: TPM named, retry-after-ms {h.get('retry-after-ms')}, "
              f"x-ratelimit-remaining-tokens {h.get('x-ratelimit-remaining-tokens')}", limited.message + str(h))
        # Drained again by a client that retries: the first call that meets
        # a 429 waits its retry-after-ms and goes through.
        att = Attempts()
        retrying = client(max_retries=5, http_client=att.client())
        for _ in range(20):
            att.log = []
            c = retrying.chat.completions.create(**reason)
            usage(c.model, c.usage)
            if any(a[0] == "answer" and a[2] == 429 for a in att.log):
                break
        answers = [a for a in att.log if a[0] == "answer"]
        sent = [a for a in att.log if a[0] == "request"]
        waits = [sent[i + 1][1] - a[1] for i, a in enumerate(answers[:-1])]
        asked = [float(a[3].get("retry-after-ms")) / 1000 for a in answers[:-1]]
        check(len(answers) > 1 and answers[-1][2] == 200 and all(w >= x - 0.002 for w, x in zip(waits, asked)),
              f"the SDK retried through the drained bucket: {len(answers) - 1} 429s, each retry after its "
              f"retry-after-ms ({', '.join(f'{x * 1000:.0f} ms' for x in asked)})",
              f"statuses {[a[2] for a in answers]}, waited {waits}, asked {asked}")

    # The quota 429: RateLimitError with code insufficient_quota, at once
    # without retries and after the SDK's own retries with them (the API
    # gives no retry-after for it).
    fault({"id": "py-quota", "kind": "spend_cap", "org": "oa"})
    try:
        cl.chat.completions.create(**judge(7))
        check(False, "insufficient_quota", "quota not refused")
    except openai.APIError as e:
        check_error(e, openai.RateLimitError, 429, "insufficient_quota", "insufficient_quota", "the quota 429")
        check(e.response.headers.get("retry-after") is None and e.response.headers.get("retry-after-ms") is None,
              "the quota 429 has no retry-after", str(e.response.headers))
    att = Attempts()
    try:
        client(max_retries=2, http_client=att.client()).chat.completions.create(**judge(7))
        check(False, "insufficient_quota", "quota not refused")
    except openai.APIError as e:
        n = sum(1 for a in att.log if a[0] == "request")
        check(isinstance(e, openai.RateLimitError) and e.code == "insufficient_quota",
              f"the quota 429 with max_retries=2: RateLimitError insufficient_quota after {n} attempts",
              f"{type(e).__name__} {getattr(e, 'code', None)}")
    clear_fault("py-quota")


def batches(cl):
    """The batch lifecycle: upload, create, cancel, retrieve, list, the
    output and error files, the files list and delete."""
    lines = [json.dumps({"custom_id": f"py-{i}", "method": "POST", "url": "/v1/chat/completions", "body": judge(100 + i)})
             for i in range(20)]
    bad_line = json.dumps({"custom_id": "py-bad", "method": "POST", "url": "/v1/chat/completions",
                           "body": judge(200, temperature=3)})
    data = ("\n".join(lines + [bad_line]) + "\n").encode()
    raw = cl.files.with_raw_response.create(file=("judge.jsonl", data), purpose="batch")
    f = raw.parse()
    check_shape(FileObject, raw.http_response.text, "files.create")
    check_complete(FileObject, raw.http_response.text, "files.create")
    check_headers(raw.headers, "files.create")
    check(f.bytes == len(data) and f.filename == "judge.jsonl" and f.purpose == "batch" and f.object == "file",
          f"files.create: {f.id}, {f.bytes} bytes, purpose batch", repr(f))
    raw = cl.files.with_raw_response.retrieve(f.id)
    check_shape(FileObject, raw.http_response.text, "files.retrieve")
    check(raw.parse() == f, "files.retrieve = files.create's object", f"{raw.parse()!r} vs {f!r}")

    raw = cl.batches.with_raw_response.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                              completion_window="24h", metadata={"job": "judge"})
    b = raw.parse()
    check_shape(Batch, raw.http_response.text, "batches.create")
    check_complete(Batch, raw.http_response.text, "batches.create")
    check_headers(raw.headers, "batches.create")
    check(b.status == "validating" and b.metadata == {"job": "judge"} and b.input_file_id == f.id,
          f"batches.create: {b.id} validating, metadata kept", repr(b))
    b2 = cl.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    raw = cl.batches.with_raw_response.cancel(b2.id)
    b2 = raw.parse()
    check_shape(Batch, raw.http_response.text, "batches.cancel")
    check(b2.status == "cancelling" and b2.cancelling_at, f"batches.cancel: {b2.id} cancelling", repr(b2))

    seen, bad = set(), []
    deadline = time.monotonic() + 60
    while not (b.status == "completed" and b2.status == "cancelled") and time.monotonic() < deadline:
        time.sleep(0.01)
        raw = cl.batches.with_raw_response.retrieve(b.id)
        b = raw.parse()
        bad += shape(Batch, raw.http_response.text, f"batches.retrieve {b.status}")
        b2 = cl.batches.retrieve(b2.id)
        seen.add(b.status)
    check(not bad, f"batches.retrieve: every poll the SDK's Batch, statuses {sorted(seen)}", "; ".join(bad[:5]))
    check(b.status == "completed" and b2.status == "cancelled" and "in_progress" in seen,
          f"batches: {b.id} completed (seen in_progress), {b2.id} cancelled", f"{b.status} {b2.status} seen {seen}")
    rc = b.request_counts
    check(rc.total == 21 and rc.completed == 20 and rc.failed == 1 and b.output_file_id and b.error_file_id
          and b.completed_at and b.in_progress_at and b.finalizing_at,
          f"the completed batch: {rc.completed} completed, {rc.failed} failed of {rc.total}, its files and times",
          repr(b))
    check(b.created_at <= b.in_progress_at <= b.finalizing_at <= b.completed_at < b.expires_at
          and b2.created_at <= b2.cancelling_at <= b2.cancelled_at,
          "the batches' times in order: created, in progress, finalizing, completed (cancelling, cancelled)", repr(b))
    check(b2.request_counts.total == 21 and b2.request_counts.completed == 0 and b2.cancelled_at and b2.error_file_id
          and not b2.output_file_id, "the cancelled batch: 0 of 21 completed, an error file, no output file", repr(b2))

    raw = cl.batches.with_raw_response.list(limit=1)
    page = raw.http_response.json()
    check(set(page) <= {"object", "data", "first_id", "last_id", "has_more"} and page["object"] == "list"
          and page["has_more"] is True and page["first_id"] == page["last_id"] == b2.id,
          "batches.list(limit=1): a list page, has_more, first_id = last_id = the newest", json.dumps(page)[:300])
    check_shape(Batch, page["data"][0], "batches.list's batch")
    ids = [x.id for x in cl.batches.list(limit=1)]
    check(ids == [b2.id, b.id], "batches.list auto-paginated: newest first, each once", str(ids))

    out = cl.files.retrieve(b.output_file_id)
    check(out.purpose == "batch_output" and out.object == "file", f"the output file {out.id}: purpose batch_output",
          repr(out))
    content = cl.files.content(b.output_file_id)
    got, bad = set(), []
    for ln in content.text.splitlines():
        o = json.loads(ln)
        r = o.get("response") or {}
        if list(o) != ["id", "custom_id", "response", "error"] or o["error"] is not None or \
                sorted(r) != ["body", "request_id", "status_code"] or r["status_code"] != 200 or not r["request_id"]:
            bad.append(ln[:200])
            continue
        bad += shape(ChatCompletion, r["body"], f"output {o['custom_id']}")
        body = ChatCompletion.model_validate(r["body"])
        usage(body.model, body.usage, batch=True)
        if o["custom_id"] in got:
            bad.append(f"{o['custom_id']} twice")
        got.add(o["custom_id"])
    bu = b.usage
    lines_usage = [u for u in usages if u["batch"]]
    check(bu.input_tokens == sum(u["prompt_tokens"] for u in lines_usage)
          and bu.output_tokens == sum(u["completion_tokens"] for u in lines_usage)
          and bu.total_tokens == bu.input_tokens + bu.output_tokens,
          f"the batch's usage = its output lines' usages summed: {bu.input_tokens} in, {bu.output_tokens} out", repr(bu))
    check(not bad and got == {f"py-{i}" for i in range(20)},
          f"the output file: {len(got)} lines, each custom_id once, each body the SDK's ChatCompletion",
          "; ".join(bad[:5]) + f" ids {sorted(got)[:5]}")
    errs = [json.loads(ln) for ln in cl.files.content(b.error_file_id).text.splitlines()]
    e0 = errs[0] if errs else {}
    r = e0.get("response") or {}
    ok = len(errs) == 1 and e0.get("custom_id") == "py-bad" and e0.get("error") is None and r.get("status_code") == 400
    check(ok and not shape(ErrorObject, (r.get("body") or {}).get("error", {}), "error line"),
          "the error file: the bad line, its 400 and the API's error object", json.dumps(errs)[:300])
    cancelled = [json.loads(ln) for ln in cl.files.content(b2.error_file_id).text.splitlines()]
    check(len(cancelled) == 21 and all(x["response"] is None and x["error"]["code"] == "batch_cancelled"
                                       and x["error"]["message"] for x in cancelled)
          and len({x["custom_id"] for x in cancelled}) == 21,
          f"the cancelled batch's error file: {len(cancelled)} lines, each batch_cancelled", json.dumps(cancelled[:2]))

    # Files: listed newest first by purpose; the input file deleted.
    raw = cl.files.with_raw_response.list(purpose="batch_output")
    page = raw.http_response.json()
    bad = [d for i, x in enumerate(page["data"]) for d in shape(FileObject, x, f"files.list[{i}]")]
    listed = [x["id"] for x in page["data"]]
    check(not bad and page["object"] == "list" and set(listed) == {b.output_file_id, b.error_file_id, b2.error_file_id},
          f"files.list(purpose=batch_output): the {len(listed)} files the batches wrote",
          "; ".join(bad[:3]) + f" {listed}")
    d = cl.files.delete(f.id)
    check(d.id == f.id and d.deleted and d.object == "file", f"files.delete: {d.id} deleted", repr(d))
    try:
        cl.files.retrieve(f.id)
        check(False, "a deleted file is gone", "still retrieved")
    except openai.APIError as e:
        check(isinstance(e, openai.NotFoundError), "a deleted file is gone (404)", repr(e))
    return b, b2


def serve_main():
    """Through the gateway: the chat part, the batch lifecycle, then
    another client finds none of it."""
    cl = client()
    chat(cl, direct=False)
    b, b2 = batches(cl)
    other = client(key=os.environ["GW_KEY2"])
    for what, call in [("batches.retrieve", lambda: other.batches.retrieve(b.id)),
                       ("batches.cancel", lambda: other.batches.cancel(b2.id)),
                       ("files.retrieve", lambda: other.files.retrieve(b.output_file_id)),
                       ("files.content", lambda: other.files.content(b.error_file_id)),
                       ("files.delete", lambda: other.files.delete(b.output_file_id))]:
        try:
            call()
            check(False, f"another client's {what} of the first's: 404", "answered")
        except openai.APIError as e:
            check_error(e, openai.NotFoundError, 404, "invalid_request_error", None,
                        f"another client's {what} of the first's", param="batch_id" if what.startswith("batches") else "id")
    page = other.batches.list()
    check(page.data == [], "another client's batches.list: empty", repr(page.data))
    check(cl.files.retrieve(b.output_file_id).id == b.output_file_id, "the first client's output file is still there", "")


if __name__ == "__main__":
    try:
        serve_main() if SERVE else main()
    except Exception as e:  # a call that failed is a differ too
        import traceback
        traceback.print_exc()
        check(False, "the workflow ran to its end", f"{type(e).__name__}: {e}")
    print("usages " + json.dumps(usages))
    print(f"openai {openai.__version__}: {checks} checks, {len(differ)} differ")
    sys.exit(1 if differ else 0)
