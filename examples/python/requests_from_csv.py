"""Write a request file for `apidispatch run` from a CSV of prompts (Python's standard library only).

The CSV has a header row with a `prompt` column, and optionally `id` (the
custom_id: 1 to 64 characters of [a-zA-Z0-9_-]; without the column the ids are
PREFIX000000, PREFIX000001, ... by row), `system` (a system prompt for that
row) and `max_tokens`. Each row becomes one line of the Message Batches request
format, {"custom_id", "params": {"model", "max_tokens", "messages", ...}},
the input of `apidispatch plan` and `apidispatch run`:

    python3 requests_from_csv.py prompts.csv --model claude-haiku-4-5 --out requests.jsonl
    apidispatch plan requests.jsonl
    apidispatch run requests.jsonl --confirm

A bad row (a duplicate or malformed id, an empty prompt, a max_tokens that is
not a positive integer) stops it with the line number, before --out is written.
"""

import argparse
import csv
import json
import os
import re
import sys
import tempfile

ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def requests_from(path, args):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        cols = set(reader.fieldnames or [])
        if "prompt" not in cols:
            sys.exit(f"{path}: the header has no prompt column (found: {', '.join(sorted(cols)) or 'nothing'})")
        seen = {}
        for n, row in enumerate(reader):
            line = reader.line_num
            pid = (row.get("id") or "").strip() if "id" in cols else f"{args.prefix}{n:06d}"
            if not ID.match(pid):
                sys.exit(f"{path}:{line}: id {pid!r} must be 1 to 64 characters of [a-zA-Z0-9_-]")
            if pid in seen:
                sys.exit(f"{path}:{line}: id {pid!r} is a duplicate of line {seen[pid]}")
            seen[pid] = line
            prompt = row["prompt"] or ""
            if not prompt.strip():
                sys.exit(f"{path}:{line}: id {pid!r} has an empty prompt")
            max_tokens = args.max_tokens
            if (row.get("max_tokens") or "").strip():
                try:
                    max_tokens = int(row["max_tokens"])
                except ValueError:
                    max_tokens = 0
                if max_tokens < 1:
                    sys.exit(f"{path}:{line}: max_tokens {row['max_tokens']!r} is not a positive integer")
            p = {"model": args.model, "max_tokens": max_tokens,
                 "messages": [{"role": "user", "content": prompt}]}
            system = (row.get("system") or "").strip() or args.system
            if system:
                p["system"] = system
            if args.temperature is not None:
                p["temperature"] = args.temperature
            yield {"custom_id": pid, "params": p}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="CSV file with a prompt column (and optionally id, system, max_tokens)")
    ap.add_argument("--model", default="claude-sonnet-4-5")
    ap.add_argument("--max-tokens", type=int, default=256, help="max_tokens of a row without its own")
    ap.add_argument("--system", default="", help="system prompt of a row without its own")
    ap.add_argument("--temperature", type=float, help="temperature of every request (0 lets the result cache answer repeats)")
    ap.add_argument("--prefix", default="row_", help="custom_id prefix when the CSV has no id column")
    ap.add_argument("--out", help="write here (atomically) instead of stdout")
    args = ap.parse_args()
    if args.max_tokens < 1:
        sys.exit("--max-tokens must be at least 1")
    lines = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in requests_from(args.csv, args)]
    if not args.out:
        sys.stdout.writelines(lines)
        return
    # A temporary file renamed into place: --out is never half-written.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(args.out)), prefix=".requests-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(lines)
        os.chmod(tmp, 0o644)
        os.replace(tmp, args.out)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"wrote {len(lines)} requests to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
