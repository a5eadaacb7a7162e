"""Cost per token of constrained decoding in `archgen serve`: the same
greedy chat request, one at a time, with and without an output grammar.

usage: structured_bench.py [--archgen target/debug/archgen] [--spec specs/qwen3-0.6b-tiny.yaml]
                           [--workdir DIR] [--max-tokens 256] [--repeats 5]

It makes the checkpoint (`archgen init --spec SPEC`, plus
tests/python/make_chat_tokenizer.py for a tokenizer and the Qwen3 chat
template), starts the server on a free loopback port, and times each kind of
request --repeats times, round robin (one of each kind per round, after one
warm-up round), each producing exactly --max-tokens tokens (finish_reason
"length" is checked):

  batched       no processor: the batched session's path
  solo          `logit_bias {"0": 0}` (a processor that changes nothing): the
                batch-of-one path constrained requests take, without a mask
  constrained   `response_format` json_schema `{"type": "string",
                "minLength": 1000000}`: the batch-of-one path with the
                grammar's mask every step (a string that cannot close within
                --max-tokens, so every request runs to the end)

Per request: (duration - time to first token) / (completion tokens - 1) from
the server's request log line, the decode time per token. Prints the median
per kind and the constrained / solo overhead as a table.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--archgen", default=str(REPO / "target/debug/archgen"))
    ap.add_argument("--spec", default=str(REPO / "specs/qwen3-0.6b-tiny.yaml"))
    ap.add_argument("--workdir")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="structured-bench-"))
    model = work / "model"
    if not (model / "tokenizer.json").exists():
        subprocess.run([args.archgen, "init", "--spec", args.spec, "--out", str(model)], check=True,
                       capture_output=True)
        subprocess.run([sys.executable, str(REPO / "tests/python/make_chat_tokenizer.py"), str(model),
                        str(REPO / "runtime/cli/tests/fixtures/chat_templates/qwen3.jinja")],
                       check=True, capture_output=True)

    port = free_port()
    server = subprocess.Popen([args.archgen, "serve", "--model", str(model), "--host", "127.0.0.1",
                               "--port", str(port)], stderr=subprocess.PIPE, text=True)
    logs: dict[str, dict] = {}
    ready = threading.Event()

    def read_log() -> None:
        for line in server.stderr:
            if "http://" in line:
                ready.set()
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("log") == "request":
                logs[entry["id"]] = entry

    threading.Thread(target=read_log, daemon=True).start()
    try:
        if not ready.wait(300):
            raise SystemExit("the server did not start in 300 s")
        base = f"http://127.0.0.1:{port}"
        common = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": args.max_tokens,
                  "temperature": 0}
        kinds = {
            "batched": {},
            "solo": {"logit_bias": {"0": 0}},
            "constrained": {"response_format": {"type": "json_schema", "json_schema": {
                "name": "long", "schema": {"type": "string", "minLength": 1000000}}}},
        }
        per_token: dict[str, list[float]] = {kind: [] for kind in kinds}
        # Round robin (one request of each kind per round), so that the drift
        # of a shared machine falls on every kind alike; round 0 warms up.
        for i in range(args.repeats + 1):
            for kind, extra in kinds.items():
                answer = post(base, {**common, **extra})
                finish = answer["choices"][0]["finish_reason"]
                tokens = answer["usage"]["completion_tokens"]
                if finish != "length" or tokens != args.max_tokens:
                    raise SystemExit(f"{kind}: finish {finish}, {tokens} tokens: {answer}")
                deadline = time.time() + 10
                while answer["id"] not in logs and time.time() < deadline:
                    time.sleep(0.01)
                entry = logs[answer["id"]]
                if i > 0:
                    per_token[kind].append((entry["duration_s"] - entry["ttft_s"]) / (tokens - 1))
        medians = {k: statistics.median(v) for k, v in per_token.items()}
        print(f"| path | ms / token (median of {args.repeats}, {args.max_tokens} tokens each) |")
        print("|---|---|")
        for kind, m in medians.items():
            print(f"| {kind} | {m * 1000:.3f} |")
        overhead = medians["constrained"] - medians["solo"]
        print(f"\nconstrained - solo: {overhead * 1000:.3f} ms / token "
              f"({overhead / medians['solo'] * 100:.0f} % of solo)")
        print(json.dumps({"ms_per_token": {k: m * 1000 for k, m in medians.items()}}))
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
