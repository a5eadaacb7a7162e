"""Serving benchmark: `archgen serve` and `mlx_lm.server` side by side, on
the same checkpoint, in one run, over loopback.

usage: serve_bench.py [--archgen target/release/archgen] [--spec specs/gemma4-e2b-tiny.yaml]
                      [--init-dtype bfloat16]
                      [--workdir DIR] [--max-tokens 24] [--clients 1 4 16 64]
                      [--long-tokens 12000] [--long-clients 1 4 16 64]
                      [--prefill-step 2048] [--level-budget 90] [--timeout 120]
                      [--json OUT.json] [--markdown OUT.md]

It makes the checkpoint (`archgen init --spec SPEC`, plus
tests/python/make_chat_tokenizer.py for a tokenizer and the Qwen3 chat
template; a Gemma-4 config.json's max_position_embeddings is removed, so each server
must know the family's default context, 131072 for Gemma-4), then for each
server in turn (started here on a free loopback port with the same prefill
step, stopped at the end):

  load        1, 4, 16 and 64 concurrent clients, each sending streamed chat
              completions (temperature 0, --max-tokens tokens); a bounded
              number of requests per level, and none started after
              --level-budget seconds. Reports aggregate completion tokens/s
              (all completion tokens / wall time), p50/p99 time to first
              token and p50/p99 inter-token latency (the gaps between two
              content chunks of one stream), and the 1-minute load average.
  load+long   one ~12k-token request (--long-tokens) is sent; --probe-delay
              seconds later, while it is in prefill, one short request alone
              (the probe: its time to completion); then the --long-clients
              levels as above, each noting whether the long request was still
              in prefill when it ended (the long request is not counted).
  probes      the time for a short request right after a client drops a long
              streamed request (one second in); the time to a 4xx for a
              prompt past the context (~140k tokens).

  alternating (--alternate-rounds R) both servers up at once; for R rounds,
              each --alternate-clients level runs on one server then the
              other, the order swapped every round, and each round gives
              the ratio archgen / mlx-lm and archgen's rate against its own
              single client. Drift of a shared machine lands inside each
              round instead of on one server's whole run.

Every request has a time limit on the whole request (--timeout; the long
one --long-timeout), after which the client leaves; a request that times out
or fails is counted and reported, never retried, so the run stops by itself. Prints a Markdown table (and writes it with
--markdown) and the raw numbers as JSON (--json).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

SHORT = "Hello there! How are you today?"
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    at = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[at]


def metrics_text(port: int, timeout: float = 30) -> str | None:
    """`GET /metrics` of an `archgen serve` on loopback: its text, or None
    when it does not answer 200."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        text = resp.read().decode()
        return text if resp.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def metric_samples(text: str | None) -> dict[str, float]:
    """Every sample line of a metrics text: `name{labels}` -> value (none
    for no text)."""
    values = {}
    for line in (text or "").splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                values[key] = float(value)
            except ValueError:
                pass
    return values


class Result:
    def __init__(self) -> None:
        self.status: int | None = None
        self.start = time.perf_counter()
        self.chunk_times: list[float] = []
        self.completion_tokens: int | None = None
        self.end: float | None = None
        self.error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def chat(port: int, content: str, max_tokens: int, timeout: float, stream: bool = True,
         drop_after_s: float | None = None, into: Result | None = None) -> Result:
    """One chat completion; streamed, the arrival time of each content chunk.
    With drop_after_s, the client closes the connection after that long
    (during the prefill or mid-stream), as a client that goes away. With
    `into`, the result is filled in place (another thread can watch it)."""
    r = into or Result()
    r.start = time.perf_counter()
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    wait = timeout if drop_after_s is None else min(timeout, drop_after_s)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=wait)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        r.status = resp.status
        if resp.status != 200 or not stream:
            data = resp.read()
            if resp.status == 200:
                usage = json.loads(data).get("usage") or {}
                r.completion_tokens = usage.get("completion_tokens")
            else:
                r.error = data[:200].decode(errors="replace")
            return r
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            event = json.loads(data)
            # A failure after the 200 header arrives in the stream (OpenAI's
            # `{"error": ...}` event): the request failed.
            if event.get("error"):
                r.error = str(event["error"].get("message", event["error"]))[:200]
                return r
            if event.get("usage"):
                r.completion_tokens = event["usage"].get("completion_tokens")
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    r.chunk_times.append(time.perf_counter())
            if drop_after_s is not None and time.perf_counter() - r.start > drop_after_s:
                r.error = "dropped by the client"
                return r
            # The socket timeout bounds each read only, and a server may send
            # keep-alive comments during a prefill: bound the whole request.
            if time.perf_counter() - r.start > timeout:
                r.error = f"no complete answer within {timeout:g} s (the client left)"
                return r
        if r.completion_tokens is None:
            r.completion_tokens = len(r.chunk_times)
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
        r.error = f"{type(e).__name__}: {e}"
    finally:
        r.end = time.perf_counter()
        conn.close()
    return r


class Server:
    """A server process on a free loopback port, stopped when closed."""

    def __init__(self, name: str, argv: list[str], port: int, log: Path, env: dict | None = None) -> None:
        self.name, self.port = name, port
        self.log = open(log, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited ({self.proc.returncode}); see {log}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/v1/models")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.close()
        raise SystemExit(f"{name} did not answer GET /v1/models within 300 s; see {log}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def load_level(port: int, clients: int, requests: int, max_tokens: int, timeout: float,
               budget: float) -> dict:
    """`clients` threads share `requests` requests; aggregate numbers. A
    client starts no request once `budget` seconds have passed since the
    level began (those it did not send are counted as not sent), so a level
    lasts at most about budget + timeout."""
    per_client = [requests // clients + (1 if i < requests % clients else 0) for i in range(clients)]
    start = time.perf_counter()
    load_before = os.getloadavg()[0]

    def client(i: int) -> list[Result]:
        out = []
        for k in range(per_client[i]):
            if time.perf_counter() - start > budget:
                break
            out.append(chat(port, f"{SHORT} {WORDS[(i + k) % len(WORDS)]}", max_tokens, timeout))
        return out

    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    ttft = [r.chunk_times[0] - r.start for r in ok if r.chunk_times]
    itl = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    return {
        "clients": clients,
        "requests": len(results),
        "not_sent": requests - len(results),
        "load_avg_1m": [load_before, os.getloadavg()[0]],
        "failed": len(results) - len(ok),
        "errors": sorted({r.error or str(r.status) for r in results if not r.ok})[:3],
        "completion_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(itl, 50),
        "itl_p99_s": percentile(itl, 99),
    }


def long_text(tokenizer, tokens: int) -> str:
    """Text of about `tokens` tokens under the checkpoint's tokenizer."""
    unit = " ".join(WORDS) + " "
    repeats = max(1, tokens // len(tokenizer.encode(unit).ids))
    # Token merges differ inside a repetition: scale by the measured count.
    measured = len(tokenizer.encode(unit * repeats).ids)
    return unit * max(1, -(-repeats * tokens // measured))


def in_background(fn, *args):
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("r", fn(*args)), daemon=True)
    thread.start()
    return thread, box


def run_server(server: Server, args, text12k: str, text140k: str) -> dict:
    port, timeout = server.port, args.timeout
    out: dict = {"load": [], "load_12k": [], "load_avg_1m_start": os.getloadavg()[0]}
    chat(port, SHORT, 4, timeout)  # warm-up (first-use kernel builds)
    for clients in args.clients:
        requests = max(clients, args.min_requests)
        level = load_level(port, clients, requests, args.max_tokens, timeout, args.level_budget)
        print(f"  {server.name}: {clients:>2} clients: {level['tokens_per_s']:.1f} tok/s "
              f"({level['failed']} failed, load {level['load_avg_1m'][1]:.1f})", file=sys.stderr)
        out["load"].append(level)

    # One ~12k-token request in flight (streamed, --long-max-tokens tokens).
    # While it is in prefill: a short request alone (the probe), then each
    # --long-clients level. Each records whether the long request was still
    # in prefill (no token of it yet) when it ended.
    long = Result()
    bg, _ = in_background(lambda: chat(port, text12k, args.long_max_tokens, args.long_timeout, into=long))
    time.sleep(args.probe_delay)
    r = chat(port, SHORT, args.max_tokens, timeout)
    out["short_during_12k_prefill"] = {
        "seconds": (r.end - r.start) if r.ok else None,
        "error": r.error,
        "long_in_prefill_at_end": not long.chunk_times,
        "load_avg_1m": os.getloadavg()[0],
    }
    print(f"  {server.name}: short request during the long prefill: "
          f"{out['short_during_12k_prefill']['seconds']} s", file=sys.stderr)
    for clients in args.long_clients or args.clients:
        requests = max(clients, args.min_requests)
        level = load_level(port, clients, requests, args.max_tokens, timeout, args.level_budget)
        level["long_in_prefill_at_end"] = not long.chunk_times
        print(f"  {server.name}: {clients:>2} clients + long: {level['tokens_per_s']:.1f} tok/s "
              f"({level['failed']} failed, long in prefill: {level['long_in_prefill_at_end']})",
              file=sys.stderr)
        out["load_12k"].append(level)
    bg.join(args.long_timeout + 5)
    out["long_request"] = {
        "ok": long.ok,
        "error": long.error,
        "ttft_s": (long.chunk_times[0] - long.start) if long.chunk_times else None,
        "total_s": (long.end - long.start) if long.end else None,
    }
    print(f"  {server.name}: long request: {out['long_request']}", file=sys.stderr)

    # A short request right after a client drops a long streamed request
    # (12k prompt, 2000 tokens asked) one second in.
    chat(port, text12k, 2000, timeout, drop_after_s=1.0)
    r = chat(port, SHORT, args.max_tokens, timeout)
    out["short_after_drop_s"] = (r.end - r.start) if r.ok else None
    out["short_after_drop_error"] = r.error

    # Past the context: the time to a 4xx (bounded; last, since a server that
    # accepts it may compute for a long time).
    r = chat(port, text140k, 4, args.context_timeout, stream=False)
    out["past_context"] = {
        "status": r.status,
        "seconds": r.end - r.start,
        "refused": r.status is not None and 400 <= r.status < 500,
        "error": r.error,
    }
    out["load_avg_1m_end"] = os.getloadavg()[0]
    return out


def alternating(servers: dict, args) -> dict:
    """Both servers up at once, each level run on one then the other, the
    order swapped every round: a drift of the machine (other load, thermal,
    the page cache) lands on both sides of each round's ratio instead of on
    one server's whole run."""
    out: dict = {}
    names = list(servers)
    for server in servers.values():
        chat(server.port, SHORT, 4, args.timeout)  # warm-up
    for r in range(args.alternate_rounds):
        order = names if r % 2 == 0 else names[::-1]
        for clients in args.alternate_clients:
            requests = max(clients, args.min_requests)
            row = out.setdefault(str(clients), {n: [] for n in names})
            for name in order:
                level = load_level(servers[name].port, clients, requests, args.max_tokens, args.timeout,
                                   args.level_budget)
                row[name].append({"tokens_per_s": level["tokens_per_s"], "failed": level["failed"],
                                  "load_avg_1m": level["load_avg_1m"]})
                print(f"  round {r + 1}: {name}: {clients:>2} clients: {level['tokens_per_s']:.1f} tok/s "
                      f"({level['failed']} failed)", file=sys.stderr)
    return out


def alternating_markdown(alt: dict) -> list[str]:
    """Per round: each server's tokens/s and the ratio archgen / mlx-lm; for
    archgen, its rate against its own single-client rate of that round."""
    lines = ["", "Alternating rounds (both servers up, each level on one then the other, order swapped "
             "every round):", "",
             "| clients | round | archgen tok/s | mlx-lm tok/s | archgen / mlx-lm | archgen / its 1 client |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    single = alt.get("1", {}).get("archgen", [])
    for clients, row in alt.items():
        ratios, own = [], []
        for i, (a, m) in enumerate(zip(row["archgen"], row["mlx-lm"])):
            ratio = a["tokens_per_s"] / m["tokens_per_s"] if m["tokens_per_s"] else None
            vs_one = (a["tokens_per_s"] / single[i]["tokens_per_s"]
                      if i < len(single) and single[i]["tokens_per_s"] and clients != "1" else None)
            ratios.append(ratio)
            own.append(vs_one)
            failed = "" if not (a["failed"] or m["failed"]) else f" ({a['failed']} / {m['failed']} failed)"
            lines.append(f"| {clients} | {i + 1} | {fmt(a['tokens_per_s'])} | {fmt(m['tokens_per_s'])}{failed} | "
                         f"{fmt(ratio, 1, 2)} | {fmt(vs_one, 1, 2)} |")
        got = sorted(x for x in ratios if x is not None)
        if got:
            lines.append(f"| {clients} | median | | | {statistics.median(got):.2f} (min {got[0]:.2f}) | |")
    variant = [(clients, row) for clients, row in alt.items() if VARIANT in row]
    if variant:
        lines += ["", f"`{VARIANT}` (archgen with the extra flags) in the same rounds:", "",
                  "| clients | round | variant tok/s | variant / archgen | variant / mlx-lm |",
                  "| ---: | ---: | ---: | ---: | ---: |"]
        for clients, row in variant:
            over_archgen = []
            for i, (v, a, m) in enumerate(zip(row[VARIANT], row["archgen"], row["mlx-lm"])):
                va = v["tokens_per_s"] / a["tokens_per_s"] if a["tokens_per_s"] else None
                vm = v["tokens_per_s"] / m["tokens_per_s"] if m["tokens_per_s"] else None
                over_archgen.append(va)
                lines.append(f"| {clients} | {i + 1} | {fmt(v['tokens_per_s'])} | {fmt(va, 1, 2)} | "
                             f"{fmt(vm, 1, 2)} |")
            got = sorted(x for x in over_archgen if x is not None)
            if got:
                lines.append(f"| {clients} | median | | {statistics.median(got):.2f} (min {got[0]:.2f}) | |")
    return lines


# The third server of --archgen-variant.
VARIANT = "archgen-variant"


def fmt(v, scale=1.0, digits=1):
    return "—" if v is None else f"{v * scale:.{digits}f}"


def markdown(results: dict, meta: dict) -> str:
    names = list(results)
    loads = ", ".join(f"{n} {results[n]['load_avg_1m_start']:.1f}-{results[n]['load_avg_1m_end']:.1f}"
                      for n in names)
    lines = [
        f"Machine: {meta['machine']}; 1-minute load average from start to end of each server's run: "
        f"{loads}. Checkpoint: {meta['spec']} (random weights, `archgen init`), "
        f"{meta['max_tokens']} completion tokens per request at temperature 0, streamed chat completions "
        f"over loopback; {meta['min_requests']}+ requests per level (none started after "
        f"{meta['level_budget']:.0f} s), {meta['timeout']:.0f} s timeout per request. "
        f"archgen {meta['archgen']} (--max-batch {meta['max_batch']}, --impl {meta['archgen_impl']}), "
        f"mlx-lm {meta['mlx_lm']}; prefill step {meta['prefill_step']} in both.",
        "",
        "| load | server | tokens/s | TTFT p50 / p99 (ms) | inter-token p50 / p99 (ms) | failed | load avg |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    long = f" + one {meta['long_tokens']}-token request"
    for key, label in (("load", ""), ("load_12k", long)):
        for i in range(len(results[names[0]][key])):
            for name in names:
                lv = results[name][key][i]
                clients = lv["clients"]
                note = ""
                if key == "load_12k" and not lv["long_in_prefill_at_end"]:
                    note = " (long prefill over before the level's end)"
                not_sent = f", {lv['not_sent']} not sent" if lv.get("not_sent") else ""
                lines.append(
                    f"| {clients} clients{label}{note} | {name} | {fmt(lv['tokens_per_s'])} | "
                    f"{fmt(lv['ttft_p50_s'], 1e3, 0)} / {fmt(lv['ttft_p99_s'], 1e3, 0)} | "
                    f"{fmt(lv['itl_p50_s'], 1e3, 1)} / {fmt(lv['itl_p99_s'], 1e3, 1)} | "
                    f"{lv['failed']}/{lv['requests']}{not_sent} | "
                    f"{lv['load_avg_1m'][0]:.1f}-{lv['load_avg_1m'][1]:.1f} |"
                )
    lines += ["", "| probe | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]

    def during(n):
        p = results[n]["short_during_12k_prefill"]
        if p["seconds"] is None:
            return f"failed ({p['error']})"
        where = "" if p["long_in_prefill_at_end"] else " (the long prefill had ended)"
        return f"{p['seconds']:.2f}{where}"

    lines.append(f"| short request sent {meta['probe_delay']:g} s after a {meta['long_tokens']}-token "
                 "prompt, while it is in prefill (s) | " + " | ".join(during(n) for n in names) + " |")

    def long_request(n):
        p = results[n]["long_request"]
        if not p["ok"]:
            return f"failed ({p['error']})"
        return f"first token {fmt(p['ttft_s'], 1, 1)} s, done {fmt(p['total_s'], 1, 1)} s"

    lines.append(f"| the {meta['long_tokens']}-token request itself | "
                 + " | ".join(long_request(n) for n in names) + " |")

    def after_drop(n):
        v = results[n]["short_after_drop_s"]
        return fmt(v, 1, 2) if v is not None else f"failed ({results[n]['short_after_drop_error']})"

    lines.append("| short request after a client drops a long one (s) | "
                 + " | ".join(after_drop(n) for n in names) + " |")

    def past(n):
        p = results[n]["past_context"]
        if p["refused"]:
            return f"{p['status']} in {p['seconds']:.2f} s"
        return f"no 4xx ({p['status'] or p['error']}) after {p['seconds']:.1f} s"

    lines.append("| prompt past the context (~140k tokens) | " + " | ".join(past(n) for n in names) + " |")
    if meta.get("alternating"):
        lines += alternating_markdown(meta["alternating"])
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archgen", default=str(REPO / "target/release/archgen"))
    ap.add_argument("--spec", default=str(REPO / "specs/gemma4-e2b-tiny.yaml"))
    ap.add_argument("--workdir")
    ap.add_argument("--model",
                    help="an existing checkpoint with tokenizer.json and a chat template (the H200 run: "
                         "runtime/mlx-cuda/serve_bench_gpu.sh); default: `archgen init --spec` in --workdir")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--min-requests", type=int, default=16)
    ap.add_argument("--long-tokens", type=int, default=12_000,
                    help="prompt tokens of the long request (in flight, in prefill, dropped)")
    ap.add_argument("--long-clients", type=int, nargs="+",
                    help="the client counts run with the long request in flight (default: --clients)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=120, help="seconds per short request")
    ap.add_argument("--level-budget", type=float, default=90,
                    help="seconds after which a level's clients start no new request")
    ap.add_argument("--long-max-tokens", type=int, default=8,
                    help="completion tokens of the long request in flight")
    ap.add_argument("--long-timeout", type=float, default=900,
                    help="seconds for the long request in flight (its prefill is minutes on a CPU)")
    ap.add_argument("--probe-delay", type=float, default=1.0,
                    help="seconds between sending the long request and the short probe")
    ap.add_argument("--prefill-step", type=int, default=2048,
                    help="archgen serve --prefill-step and mlx_lm.server --prefill-step-size")
    ap.add_argument("--context-timeout", type=float, default=15)
    ap.add_argument("--servers", nargs="+", default=["archgen", "mlx-lm"],
                    choices=["archgen", "archgen-b1", "mlx-lm"],
                    help="archgen-b1: archgen with --max-batch 1 (one sequence at a time)")
    ap.add_argument("--archgen-impl", default="auto", choices=["auto", "monolith", "generated"],
                    help="archgen serve --impl: the monolith has the batched forward (BatchLm); "
                         "a model without one serves one sequence per forward")
    ap.add_argument("--alternate-rounds", type=int, default=0,
                    help="after the per-server runs: this many rounds with archgen and mlx-lm up together, "
                         "each --alternate-clients level on one then the other (order swapped each round)")
    ap.add_argument("--alternate-clients", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--archgen-variant", metavar="FLAGS",
                    help="with --alternate-rounds: a third server in the same rounds, archgen with these "
                         "extra serve flags (e.g. --archgen-variant=--keep-buffer-pool, with `=` as the value starts with --): a paired A/B of a lever")
    ap.add_argument("--alternate-only", action="store_true",
                    help="run only the alternating rounds (no per-server levels, long prompts or probes)")
    ap.add_argument("--init-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                    help="dtype of the checkpoint's unquantized weights (archgen init --dtype); "
                         "unquantized MoE specs need float32 on the CPU, whose gathered-expert "
                         "matmul takes float32 only")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--with-results",
                    help="an earlier --json of this script on the same model: its servers join this run's "
                         "table (the H200 runs one server per device call, each under 10 minutes)")
    args = ap.parse_args()
    if args.archgen_variant and args.alternate_rounds <= 0:
        raise SystemExit("--archgen-variant runs in the alternating rounds: give --alternate-rounds R too")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="serve-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.model:
        model = Path(args.model)
    else:
        model = work / "model"
        if model.exists():
            shutil.rmtree(model)
        subprocess.run([args.archgen, "init", "--spec", args.spec, "--out", str(model),
                        "--dtype", args.init_dtype], check=True)
        template = REPO / "runtime/cli/tests/fixtures/chat_templates/qwen3.jinja"
        subprocess.run([PYTHON, str(REPO / "tests/python/make_chat_tokenizer.py"), str(model), str(template)],
                       check=True, stdout=subprocess.DEVNULL)
    # Gemma-4 without max_position_embeddings: the context is the family
    # default mlx-lm uses (the past-context probe sends 140k tokens against
    # its 131072). Families whose ModelArgs have no default keep the field.
    config = json.loads((model / "config.json").read_text())
    if str(config.get("model_type", "")).startswith("gemma4"):
        config.pop("max_position_embeddings", None)
        if isinstance(config.get("text_config"), dict):
            config["text_config"].pop("max_position_embeddings", None)
    (model / "config.json").write_text(json.dumps(config, indent=2))
    # transformers picks a tokenizer class from config.json's model_type when
    # tokenizer_config.json names none; for gemma2 and gemma3_text that is
    # GemmaTokenizerFast, which refuses a vocabulary without `<unk>` (the
    # bench's tokenizer has none), so mlx_lm.server answered every request
    # with 404. The bench's tokenizer is a plain fast tokenizer: say so.
    if config.get("model_type") in ("gemma2", "gemma3_text"):
        tc_path = model / "tokenizer_config.json"
        tc = json.loads(tc_path.read_text())
        tc["tokenizer_class"] = "PreTrainedTokenizerFast"
        tc_path.write_text(json.dumps(tc, indent=2))

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    text12k = long_text(tokenizer, args.long_tokens)
    text140k = long_text(tokenizer, 140_000)
    print(f"long prompt {len(tokenizer.encode(text12k).ids)} tokens, past-context prompt "
          f"{len(tokenizer.encode(text140k).ids)} tokens", file=sys.stderr)

    import mlx_lm

    results = json.loads(Path(args.with_results).read_text())["results"] if args.with_results else {}

    def start(name: str) -> Server:
        port = free_port()
        if name in ("archgen", "archgen-b1", VARIANT):
            batch = 1 if name == "archgen-b1" else args.max_batch
            argv = [args.archgen, "--quiet", "serve", "--model", str(model), "--host", "127.0.0.1",
                    "--port", str(port), "--max-batch", str(batch), "--impl", args.archgen_impl,
                    "--prefill-step", str(args.prefill_step)]
            if name == VARIANT:
                argv += shlex.split(args.archgen_variant)
        else:
            argv = [PYTHON, "-m", "mlx_lm.server", "--model", str(model), "--host", "127.0.0.1",
                    "--port", str(port), "--max-tokens", str(args.max_tokens),
                    "--prefill-step-size", str(args.prefill_step)]
        print(f"{name}: starting", file=sys.stderr)
        return Server(name, argv, port, work / f"{name}.log")

    for name in [] if args.alternate_only else args.servers:
        server = start(name)
        try:
            results[name] = run_server(server, args, text12k, text140k)
        finally:
            server.close()

    alt = None
    if args.alternate_rounds > 0:
        if set(args.servers) != {"archgen", "mlx-lm"}:
            raise SystemExit("--alternate-rounds needs --servers archgen mlx-lm")
        servers: dict = {}
        try:
            for name in ("archgen", "mlx-lm") + ((VARIANT,) if args.archgen_variant else ()):
                servers[name] = start(name)
            alt = alternating(servers, args)
        finally:
            for server in servers.values():
                server.close()

    version = subprocess.run([args.archgen, "--version"], capture_output=True, text=True).stdout.strip()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    machine = f"{cpu}, {os.cpu_count()} cores"
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
        if gpu:
            machine = f"{gpu}; {machine}"
    except OSError:
        pass
    meta = {
        "machine": machine,
        "spec": Path(args.model).name if args.model else Path(args.spec).name,
        "max_tokens": args.max_tokens,
        "min_requests": args.min_requests,
        "clients": args.clients,
        "long_tokens": args.long_tokens,
        "archgen": version,
        "max_batch": args.max_batch,
        "archgen_impl": args.archgen_impl,
        "prefill_step": args.prefill_step,
        "level_budget": args.level_budget,
        "timeout": args.timeout,
        "probe_delay": args.probe_delay,
        "mlx_lm": mlx_lm.__version__,
        "alternating": alt,
    }
    table = markdown(results, meta) if results else "\n".join(alternating_markdown(alt or {}))
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
