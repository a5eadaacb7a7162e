"""Serving on the GPU: `archgen serve` and `mlx_lm.server` on one real-size
checkpoint, 1, 8 and 32 concurrent streaming clients, over loopback.

Runs on the GPU machine (serve_bench_gpu.sh sets up the wheels, the
binaries and the checkpoint). It reuses tests/python/serve_bench.py's
client and server code (streamed chat completions over http.client,
temperature 0; a server started on a free loopback port and stopped at the
end) and measures the load levels only: aggregate completion tokens/s, p50/p99
time to first token, p50/p99 inter-token latency, failed requests. The CPU
script's long-request levels and probes are left out here (device time).

Servers (each started in turn on the same checkpoint):
  archgen            `archgen serve` with its defaults: --max-batch 16 and
                     --impl auto, which serves the generated model through
                     its batched forward (BatchSession, mlx-lm's
                     BatchGenerator schedule)
  archgen-monolith   `archgen serve --impl monolith`: the monolith's batched
                     forward (what `archgen` served before generated models
                     batched, 259dd6d)
  archgen-monolith-b32  the same with --max-batch 32 (mlx-lm's decode
                     concurrency); any `archgen` or `archgen-monolith`
                     with `-bN` runs --max-batch N (e.g. archgen-b64)
  mlx-lm             `python3 -m mlx_lm.server` with its defaults (decode
                     concurrency 32, prompt concurrency 8, prefill step 2048)
  NAME@VAR=VALUE[@VAR=VALUE...]
                     server NAME with those environment variables, as
                     bench.py's workers (e.g. `archgen` with its L3 levers'
                     variables on)

Before the timed levels each server gets an untimed warm-up: one request,
then one request per client at each level (8 tokens each), so MLX's CUDA
kernels for those batch shapes are compiled (NVRTC, on first use in each
process) before anything is timed. Each level sends
max(--min-requests, --waves * clients) requests of --max-tokens tokens,
`clients` at a time; every request has a timeout and none is retried, and
no request starts after --level-budget seconds (those are counted as not
sent).

usage: serve_bench_gpu.py --archgen BIN --model DIR [--servers ...] [--clients 1 8 32]
                          [--max-tokens 64] [--json OUT] [--markdown OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SERVERS = ["archgen", "archgen-monolith", "archgen-monolith-b32", "mlx-lm"]
# archgen[-monolith][-bN] (`-bN`: --max-batch N) or mlx-lm
SERVER_NAME = re.compile(r"archgen(-monolith)?(?:-b(\d+))?|mlx-lm")


STEP_KINDS = ("full", "decode_only", "prefill_chunk", "decode")
# The parts of a batched step (archgen_step_phase_seconds{phase}).
STEP_PHASES = ("generation", "admission", "joining", "prefill")


def breakdown(before: dict[str, float], after: dict[str, float]) -> dict:
    """What one level added to the server's histograms: counts and mean
    seconds of archgen's `archgen_queue_wait_seconds` and
    `archgen_time_to_first_token_seconds`, and per label of
    `archgen_scheduler_step_seconds{kind}` and `archgen_step_phase_seconds{phase}`
    (also their total seconds)."""
    def delta(name: str, labels: str = "") -> tuple[float, float]:
        # The text format puts labels after the _count / _sum suffix.
        return tuple(after.get(f"{name}_{part}{labels}", 0.0) - before.get(f"{name}_{part}{labels}", 0.0)
                     for part in ("count", "sum"))

    def mean(name: str) -> dict:
        n, total = delta(name)
        return {"count": n, "mean_s": total / n if n > 0 else None}

    def by_label(name: str, label: str, values: tuple[str, ...]) -> dict:
        # The label values seen in this level, each with count, mean and total.
        out = {}
        for value in values:
            n, total = delta(name, f'{{{label}="{value}"}}')
            if n > 0:
                out[value] = {"count": n, "mean_s": total / n, "total_s": total}
        return out

    # The server's own time to first token runs from queueing to the first
    # sampled token, visible or not; the client's counts to the first chunk
    # with text, later where a token decodes to no text.
    return {"queue_wait": mean("archgen_queue_wait_seconds"),
            "server_ttft": mean("archgen_time_to_first_token_seconds"),
            "steps": by_label("archgen_scheduler_step_seconds", "kind", STEP_KINDS),
            "phases": by_label("archgen_step_phase_seconds", "phase", STEP_PHASES)}


def describe_breakdown(b: dict) -> str:
    def ms(v: dict) -> str:
        return "-" if v["mean_s"] is None else f"{1e3 * v['mean_s']:.1f}"

    q, t = b["queue_wait"], b["server_ttft"]
    parts = [f"queue wait mean {ms(q)} ms over {q['count']:.0f}",
             f"server TTFT mean {ms(t)} ms over {t['count']:.0f}"]
    parts += [f"{kind} steps {v['count']:.0f} x {1e3 * v['mean_s']:.1f} ms" for kind, v in b["steps"].items()]
    parts += [f"{phase} {v['count']:.0f} x {1e3 * v['mean_s']:.1f} ms (total {v['total_s']:.2f} s)"
              for phase, v in b.get("phases", {}).items()]
    return ", ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archgen", required=True)
    ap.add_argument("--model", type=Path, required=True,
                    help="checkpoint with tokenizer.json and a chat template")
    ap.add_argument("--repo", type=Path, default=HERE.parents[1])
    ap.add_argument("--servers", nargs="+", default=["archgen", "archgen-monolith", "mlx-lm"],
                    help=f"each one of {', '.join(SERVERS)}, or NAME@VAR=VALUE[@VAR=VALUE...]")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--min-requests", type=int, default=16)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--level-budget", type=float, default=300,
                    help="seconds after which a level starts no more requests")
    ap.add_argument("--logs", type=Path, default=Path("/tmp"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    a = ap.parse_args()
    for name in a.servers:
        if not SERVER_NAME.fullmatch(name.split("@")[0]):
            ap.error(f"unknown server {name!r}: NAME is archgen[-monolith][-bN] or mlx-lm "
                     f"(e.g. {', '.join(SERVERS)})")

    sys.path.insert(0, str(a.repo / "tests/python"))
    from serve_bench import SHORT, Server, chat, fmt, free_port, load_level, metric_samples, metrics_text

    from bench import base_and_env

    results: dict[str, dict] = {}
    for name in a.servers:
        base, env = base_and_env(name)
        port = free_port()
        if base.startswith("archgen"):
            # Not --quiet: the server's log then names its tier and the
            # levers on, which shows what the L3 variables reached.
            argv = [a.archgen, "serve", "--model", str(a.model), "--host", "127.0.0.1",
                    "--port", str(port)]
            if base.startswith("archgen-monolith"):
                argv += ["--impl", "monolith"]
            # `-bN`: --max-batch N (sequences in flight at once)
            m = SERVER_NAME.fullmatch(base)
            if m and m.group(2):
                argv += ["--max-batch", m.group(2)]
        else:
            argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(a.model), "--host", "127.0.0.1",
                    "--port", str(port)]
        t = time.time()
        print(f"{name}: starting: {' '.join(argv)}", flush=True)
        log = a.logs / f"serve-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.log"
        server = Server(name, argv, port, log, env)
        out: dict = {"start_s": time.time() - t, "levels": []}
        print(f"{name}: answering after {out['start_s']:.1f} s", flush=True)
        try:
            t = time.time()
            first = chat(port, SHORT, 4, a.timeout)
            for clients in a.clients:
                load_level(port, clients, clients, 8, a.timeout, a.level_budget)
            out["warmup_s"] = time.time() - t
            print(f"{name}: warm-up {out['warmup_s']:.1f} s (first request ok: {first.ok})", flush=True)
            for clients in a.clients:
                requests = max(a.min_requests, a.waves * clients)
                before = metric_samples(metrics_text(port)) if base.startswith("archgen") else None
                level = load_level(port, clients, requests, a.max_tokens, a.timeout, a.level_budget)
                if before is not None:
                    level["breakdown"] = breakdown(before, metric_samples(metrics_text(port)))
                    print(f"{name}: {clients:>2} clients: {describe_breakdown(level['breakdown'])}", flush=True)
                out["levels"].append(level)
                print(f"{name}: {clients:>2} clients, {requests} requests: "
                      f"{fmt(level['tokens_per_s'])} tok/s, "
                      f"TTFT p50/p99 {fmt(level['ttft_p50_s'], 1e3, 0)}/{fmt(level['ttft_p99_s'], 1e3, 0)} ms, "
                      f"ITL p50/p99 {fmt(level['itl_p50_s'], 1e3, 1)}/{fmt(level['itl_p99_s'], 1e3, 1)} ms, "
                      f"{level['completion_tokens']} tokens in {level['wall_s']:.1f} s, "
                      f"failed {level['failed']}/{level['requests']} {level['errors']}, "
                      f"not sent {level['not_sent']}", flush=True)
            if base.startswith("archgen"):
                # Where the time to first token went (queue wait, step times
                # by kind): the server's own metrics after the levels.
                (a.logs / f"{log.stem}.metrics.txt").write_text(metrics_text(port) or "# no metrics\n")
        finally:
            server.close()
        results[name] = out

    version = subprocess.run([a.archgen, "--version"], capture_output=True, text=True).stdout.strip()
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        gpu = "no nvidia-smi (not a GPU machine)"
    lines = [
        f"GPU: {gpu}; {os.cpu_count()} cores. Checkpoint {a.model.name}; {a.max_tokens} completion "
        f"tokens per streamed chat request at temperature 0; {version}.",
        "",
        "| clients | server | tokens/s | TTFT p50 / p99 (ms) | inter-token p50 / p99 (ms) | failed |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for i, clients in enumerate(a.clients):
        for name in a.servers:
            lv = results[name]["levels"][i]
            lines.append(
                f"| {clients} | {name} | {fmt(lv['tokens_per_s'])} | "
                f"{fmt(lv['ttft_p50_s'], 1e3, 0)} / {fmt(lv['ttft_p99_s'], 1e3, 0)} | "
                f"{fmt(lv['itl_p50_s'], 1e3, 1)} / {fmt(lv['itl_p99_s'], 1e3, 1)} | "
                f"{lv['failed']}/{lv['requests']} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if a.markdown:
        a.markdown.write_text(table)
    if a.json:
        a.json.write_text(json.dumps({"gpu": gpu, "archgen": version, "results": results}, indent=2))


if __name__ == "__main__":
    main()
