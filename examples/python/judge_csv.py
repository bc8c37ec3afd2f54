"""Judge every prompt of a CSV through `apidispatch serve`, with Python's standard library only.

The CSV has a header row with the columns `id` and `prompt` (other columns are
ignored); `id` becomes the custom_id, so it must match [a-zA-Z0-9_-]{1,64}.
Each prompt is sent as the user message under a judge's system prompt, and one
JSON line per prompt is written: {"id", "ok", "text", "usage", "cost_usd"} or
{"id", "ok": false, "error"}. A summary goes to stderr, and the exit code is 0
only when every prompt was judged.

    export ANTHROPIC_BASE_URL=http://127.0.0.1:8787   # printed by `apidispatch serve`
    export ANTHROPIC_API_KEY=sk-gw-...                # the gateway's token, not an org's key
    python3 judge_csv.py prompts.csv --mode sync  > verdicts.jsonl   # one request at a time
    python3 judge_csv.py prompts.csv --mode async > verdicts.jsonl   # 200 requests in flight
    python3 judge_csv.py prompts.csv --mode batch > verdicts.jsonl   # one Message Batch, half price

The gateway spreads the requests over every org under the polite caps and
retries 429, 529 and 5xx inside itself (--retry-for), so this script never
retries a request it sent: a second send could be billed twice. With the
official SDK (`pip install anthropic`) the same is `anthropic.Anthropic(max_retries=0)`
for sync, `anthropic.AsyncAnthropic(max_retries=0)` with an asyncio.Semaphore(200)
for async, and `client.messages.batches` for batch; judge.py shows each call.
"""

import argparse
import asyncio
import concurrent.futures
import csv
import http.client
import json
import os
import re
import sys
import threading
import time
import urllib.parse

SYSTEM = ("You are a judge. Read the text the user gives you and evaluate it for accuracy, "
          "relevance and clarity. Answer with a JSON object: "
          '{"score": 1-10, "reason": "one sentence"}.')
ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_BATCH = 100_000  # requests in one Message Batch (the API's limit)


def read_prompts(path):
    """The (id, prompt) rows of the CSV, with clear errors for a bad file."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"id", "prompt"} - set(reader.fieldnames or [])
        if missing:
            sys.exit(f"{path}: the header has no column {', '.join(sorted(missing))} (it needs id and prompt)")
        rows, seen = [], {}
        for row in reader:
            line = reader.line_num
            pid, prompt = (row["id"] or "").strip(), row["prompt"] or ""
            if not ID.match(pid):
                sys.exit(f"{path}:{line}: id {pid!r} must be 1 to 64 characters of [a-zA-Z0-9_-]")
            if pid in seen:
                sys.exit(f"{path}:{line}: id {pid!r} is a duplicate of line {seen[pid]}")
            if not prompt.strip():
                sys.exit(f"{path}:{line}: id {pid!r} has an empty prompt")
            seen[pid] = line
            rows.append((pid, prompt))
    return rows


class Gateway:
    """A small JSON client of the Anthropic API at ANTHROPIC_BASE_URL: one
    kept-alive connection per thread, safe to use from many threads."""

    def __init__(self, base_url, api_key, timeout_s=900):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            sys.exit(f"ANTHROPIC_BASE_URL {base_url!r} is not an http(s) URL")
        self.https, self.host, self.port = u.scheme == "https", u.hostname, u.port
        self.prefix = u.path.rstrip("/")
        self.headers = {"x-api-key": api_key, "anthropic-version": "2023-06-01",
                        "content-type": "application/json"}
        self.timeout_s = timeout_s
        self.local = threading.local()

    def _conn(self):
        c = getattr(self.local, "conn", None)
        if c is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            c = self.local.conn = cls(self.host, self.port, timeout=self.timeout_s)
        return c

    def call(self, method, path, body=None, headers=None):
        """(status, response headers, body bytes). A GET that meets a closed
        connection is tried once more on a new one; a POST is not, since the
        API may have received (and billed) it."""
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        for attempt in (1, 2):
            c = self._conn()
            try:
                c.request(method, self.prefix + path, body=data, headers={**self.headers, **(headers or {})})
                resp = c.getresponse()
                return resp.status, resp.headers, resp.read()
            except (http.client.HTTPException, OSError):
                c.close()
                self.local.conn = None
                if method != "GET" or attempt == 2:
                    raise

    def json(self, method, path, body=None, headers=None):
        status, _, raw = self.call(method, path, body, headers)
        if status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {raw[:300].decode(errors='replace')}")
        return json.loads(raw)


def params(args, prompt):
    return {"model": args.model, "max_tokens": args.max_tokens, "system": SYSTEM,
            "messages": [{"role": "user", "content": prompt}]}


def text_of(message):
    return "".join(b.get("text", "") for b in message.get("content", []) if b.get("type") == "text")


def judge_one(gw, args, pid, prompt):
    """One POST /v1/messages; the result line for pid."""
    try:
        status, headers, raw = gw.call("POST", "/v1/messages", params(args, prompt))
    except (http.client.HTTPException, OSError) as e:
        return {"id": pid, "ok": False, "error": f"connection: {e}"}
    if status != 200:
        return {"id": pid, "ok": False, "error": f"HTTP {status}: {raw[:300].decode(errors='replace')}"}
    msg = json.loads(raw)
    return {"id": pid, "ok": True, "text": text_of(msg), "usage": msg["usage"],
            "cost_usd": headers.get("x-apidispatch-cost-usd")}


def run_sync(gw, args, rows, emit):
    for pid, prompt in rows:
        emit(judge_one(gw, args, pid, prompt))
    return None


def run_async(gw, args, rows, emit):
    """Every prompt at once, at most args.concurrency in flight: asyncio
    schedules, and a pool of as many threads does the blocking I/O."""
    peak, now, lock = 0, 0, threading.Lock()

    def in_flight(d):
        nonlocal peak, now
        with lock:
            now += d
            peak = max(peak, now)

    def one(pid, prompt):
        in_flight(+1)
        try:
            return judge_one(gw, args, pid, prompt)
        finally:
            in_flight(-1)

    async def main():
        loop = asyncio.get_running_loop()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency)
        sem = asyncio.Semaphore(args.concurrency)

        async def task(pid, prompt):
            async with sem:
                emit(await loop.run_in_executor(pool, one, pid, prompt))

        try:
            await asyncio.gather(*(task(pid, prompt) for pid, prompt in rows))
        finally:
            pool.shutdown()

    asyncio.run(main())
    return peak


def run_batch(gw, args, rows, emit):
    """One Message Batch per 100,000 prompts through the gateway, which fans it
    out over every org; poll until it ends, then read its results."""
    route = {"x-apidispatch-route": args.route}
    for i in range(0, len(rows), MAX_BATCH):
        chunk = rows[i:i + MAX_BATCH]
        batch = gw.json("POST", "/v1/messages/batches",
                        {"requests": [{"custom_id": pid, "params": params(args, p)} for pid, p in chunk]}, route)
        print(f"batch {batch['id']}: {len(chunk)} requests, {batch['processing_status']}", file=sys.stderr)
        while batch["processing_status"] != "ended":
            time.sleep(args.poll)
            batch = gw.json("GET", f"/v1/messages/batches/{batch['id']}")
        print(f"batch {batch['id']}: ended, {batch['request_counts']}", file=sys.stderr)
        status, _, raw = gw.call("GET", f"/v1/messages/batches/{batch['id']}/results")
        if status != 200:
            raise RuntimeError(f"results of {batch['id']}: HTTP {status}")
        for line in raw.decode().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            res = r["result"]
            if res["type"] == "succeeded":
                msg = res["message"]
                emit({"id": r["custom_id"], "ok": True, "text": text_of(msg), "usage": msg["usage"]})
            else:
                emit({"id": r["custom_id"], "ok": False, "error": json.dumps(res)})
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="CSV file with the columns id and prompt")
    ap.add_argument("--mode", choices=("sync", "async", "batch"), default="sync")
    ap.add_argument("--concurrency", type=int, default=200, help="requests in flight in async mode")
    ap.add_argument("--model", default="claude-sonnet-4-5")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--route", default="batch", help="batch mode: the gateway's route (batch, auto or sync)")
    ap.add_argument("--poll", type=float, default=10.0, help="batch mode: seconds between status checks")
    ap.add_argument("--out", help="write the JSON lines here instead of stdout")
    args = ap.parse_args()
    if args.concurrency < 1 or args.max_tokens < 1 or args.poll <= 0:
        sys.exit("--concurrency and --max-tokens must be at least 1, --poll above 0")
    base, key = os.environ.get("ANTHROPIC_BASE_URL"), os.environ.get("ANTHROPIC_API_KEY")
    if not base or not key:
        sys.exit("set ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY (apidispatch serve prints both)")

    rows = read_prompts(args.csv)
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    counts, lock = {"ok": 0, "errors": 0}, threading.Lock()

    def emit(line):
        with lock:
            counts["ok" if line["ok"] else "errors"] += 1
            out.write(json.dumps(line, ensure_ascii=False) + "\n")

    gw = Gateway(base, key)
    t0 = time.monotonic()
    peak = {"sync": run_sync, "async": run_async, "batch": run_batch}[args.mode](gw, args, rows, emit)
    out.flush()
    in_flight = "" if peak is None else f", at most {peak} in flight"
    print(f"judged {len(rows)} prompts ({args.mode}): {counts['ok']} ok, {counts['errors']} errors, "
          f"in {time.monotonic() - t0:.1f} s{in_flight}", file=sys.stderr)
    sys.exit(0 if counts["ok"] == len(rows) else 1)


if __name__ == "__main__":
    main()
