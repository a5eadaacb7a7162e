"""Memory soak of `archgen serve`: mixed, partly hostile load for a fixed
time, with the server's memory sampled throughout (docs/benchmarks.md,
"Serving: memory under long load").

usage: serve_soak.py [--archgen target/release/archgen] [--spec specs/qwen3-0.6b-tiny.yaml]
                     [--minutes 30] [--clients 16] [--sample-every 15]
                     [--json OUT.json] [--markdown OUT.md]

It makes a checkpoint as tests/python/serve_bench.py does (`archgen init`
plus a tokenizer and the Qwen3 chat template), starts `archgen serve` on a
free loopback port, and asks it the temperature-0 question it asks again at
the end. Then --clients threads loop until --minutes have passed, each
request drawn in turn from this mix:

  chat         streamed chat, temperature 0 or 0.8 with a seed, short prompts
               of several lengths, max_tokens 8-48
  multi-turn   a conversation that grows by one turn per request (the prompt
               cache's reuse and its eviction)
  completion   /v1/completions with logprobs 3, not streamed
  sampling     top_k, min_p, the penalties and logit_bias (a batch of one
               beside the batch)
  dropped      a streamed request whose client leaves after 0.2 s
  refused      a malformed body, a wrong type, a prompt past --max-prompt-tokens
  extra        unknown and null fields that real clients send

Every --sample-every seconds it reads GET /metrics
(archgen_process_resident_bytes, archgen_mlx_active_bytes,
archgen_mlx_cache_bytes, archgen_mlx_peak_bytes, archgen_prompt_cache_bytes,
archgen_prompt_cache_entries, archgen_active_sequences) and the process's
VmRSS from /proc. Each request has a time limit, after which its client
leaves; nothing is retried, and no request starts after the deadline, so the
run ends by itself.

The report: the samples (one row a minute in the Markdown), the requests by
kind and status, any 5xx, whether the temperature-0 answer is the same after
the soak as before, and the resident set's growth: the mean of the last third
of the samples against the mean of the middle third (a leak keeps growing
after the start-up third; a bounded pool levels off).
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import PYTHON, REPO, Server, free_port, metric_samples, metrics_text  # noqa: E402

GAUGES = [
    "archgen_process_resident_bytes",
    "archgen_mlx_active_bytes",
    "archgen_mlx_cache_bytes",
    "archgen_mlx_peak_bytes",
    "archgen_prompt_cache_bytes",
    "archgen_prompt_cache_entries",
    "archgen_active_sequences",
]
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()
QUESTION = {"messages": [{"role": "user", "content": "Say something about the sea."}],
            "max_tokens": 16, "temperature": 0}


def request(port: int, method: str, path: str, body, timeout: float,
            drop_after_s: float | None = None) -> tuple[int, bytes]:
    """One request; (status, body). Status 0: the client gave up or the
    connection failed; -1: the client left on purpose (drop_after_s)."""
    raw = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    start = time.perf_counter()
    try:
        conn.request(method, path, raw, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if drop_after_s is None:
            return resp.status, resp.read()
        while time.perf_counter() - start < drop_after_s:
            if not resp.read(64):
                break
        return -1, b""
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        conn.close()


def metrics(port: int) -> dict[str, float]:
    samples = metric_samples(metrics_text(port))
    return {name: samples[name] for name in GAUGES if name in samples}


def vm_rss(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def one(kind: str, rng: random.Random, port: int, timeout: float, turns: list) -> int:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60)))
    if kind == "chat":
        body = {"messages": [{"role": "user", "content": words}], "max_tokens": rng.randint(8, 48),
                "stream": rng.random() < 0.7}
        if rng.random() < 0.5:
            body |= {"temperature": 0.8, "seed": rng.randint(0, 1 << 30)}
        else:
            body["temperature"] = 0
        return request(port, "POST", "/v1/chat/completions", body, timeout)[0]
    if kind == "multi-turn":
        if len(turns) >= 12:
            turns.clear()
        turns.append({"role": "user", "content": words})
        status, data = request(port, "POST", "/v1/chat/completions",
                               {"messages": turns, "max_tokens": 12, "temperature": 0}, timeout)
        if status == 200:
            turns.append(json.loads(data)["choices"][0]["message"])
        else:
            turns.clear()
        return status
    if kind == "completion":
        return request(port, "POST", "/v1/completions",
                       {"prompt": words, "max_tokens": 12, "logprobs": 3, "temperature": 0}, timeout)[0]
    if kind == "sampling":
        return request(port, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": words}], "max_tokens": 16, "temperature": 0.7,
            "top_k": 20, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": 0.3,
            "repetition_penalty": 1.1, "logit_bias": {"5": -10}, "seed": rng.randint(0, 1 << 30)},
            timeout)[0]
    if kind == "dropped":
        return request(port, "POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": words}], "max_tokens": 64,
                        "stream": True, "temperature": 0}, timeout, drop_after_s=0.2)[0]
    if kind == "refused":
        choice = rng.randrange(3)
        if choice == 0:
            return request(port, "POST", "/v1/chat/completions", b'{"messages": [', timeout)[0]
        if choice == 1:
            return request(port, "POST", "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}, timeout)[0]
        return request(port, "POST", "/v1/completions",
                       {"prompt": " ".join(WORDS) * 200, "max_tokens": 4}, timeout)[0]
    if kind == "extra":
        return request(port, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": words}], "max_tokens": 8, "temperature": 0,
            "response_format": None, "parallel_tool_calls": True, "metadata": {}, "user": "soak",
            "store": False, "service_tier": None, "x_unknown": [1, 2]}, timeout)[0]
    raise ValueError(kind)


def answer(reply: tuple[int, bytes]) -> dict | None:
    """The message of a 200 chat reply, else None."""
    if reply[0] != 200:
        return None
    return json.loads(reply[1])["choices"][0]["message"]


KINDS = ["chat", "chat", "chat", "multi-turn", "completion", "sampling", "dropped", "refused", "extra"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archgen", default=str(REPO / "target/release/archgen"))
    ap.add_argument("--spec", default=str(REPO / "specs/qwen3-0.6b-tiny.yaml"))
    ap.add_argument("--workdir")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--sample-every", type=float, default=15)
    ap.add_argument("--timeout", type=float, default=60, help="seconds one request may take")
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="serve-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    if model.exists():
        shutil.rmtree(model)
    subprocess.run([args.archgen, "init", "--spec", args.spec, "--out", str(model)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    template = REPO / "runtime/cli/tests/fixtures/chat_templates/qwen3.jinja"
    subprocess.run([PYTHON, str(REPO / "tests/python/make_chat_tokenizer.py"), str(model), str(template)],
                   check=True, stdout=subprocess.DEVNULL)

    port = free_port()
    argv = [args.archgen, "--quiet", "serve", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--max-prompt-tokens", str(args.max_prompt_tokens)]
    server = Server("archgen", argv, port, work / "archgen.log")
    statuses: dict[str, Counter] = {k: Counter() for k in set(KINDS)}
    samples: list[dict] = []
    lock = threading.Lock()
    try:
        before = request(port, "POST", "/v1/chat/completions", QUESTION, args.timeout)
        start = time.time()
        deadline = start + args.minutes * 60

        def client(i: int) -> None:
            rng = random.Random(i)
            turns: list = []
            k = i
            while time.time() < deadline:
                kind = KINDS[k % len(KINDS)]
                k += 1
                status = one(kind, rng, port, args.timeout, turns)
                with lock:
                    statuses[kind][status] += 1

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
        for t in threads:
            t.start()
        while time.time() < deadline:
            row = {"t_s": round(time.time() - start, 1), "vm_rss": vm_rss(server.proc.pid)}
            row |= metrics(port)
            samples.append(row)
            print("soak " + json.dumps(row), file=sys.stderr, flush=True)
            time.sleep(min(args.sample_every, max(0.0, deadline - time.time())))
        for t in threads:
            t.join(args.timeout + 30)
        samples.append({"t_s": round(time.time() - start, 1), "vm_rss": vm_rss(server.proc.pid)}
                       | metrics(port))
        after = request(port, "POST", "/v1/chat/completions", QUESTION, args.timeout)
    finally:
        server.close()

    rss = [s.get("archgen_process_resident_bytes") for s in samples if s.get("archgen_process_resident_bytes")]
    third = max(1, len(rss) // 3)
    middle, last = rss[third:2 * third] or rss, rss[-third:]
    growth = (sum(last) / len(last)) / (sum(middle) / len(middle)) - 1 if rss else None
    five_xx = {k: {s: n for s, n in c.items() if s >= 500} for k, c in statuses.items()}
    report = {
        "machine": f"{platform.node()} {platform.machine()} {platform.processor()}".strip(),
        "archgen": subprocess.run([args.archgen, "--version"], capture_output=True, text=True).stdout.strip(),
        "spec": args.spec,
        "minutes": args.minutes,
        "clients": args.clients,
        "requests": {k: dict(c) for k, c in statuses.items()},
        "requests_total": sum(sum(c.values()) for c in statuses.values()),
        "five_xx": {k: v for k, v in five_xx.items() if v},
        "same_answer_after": answer(before) is not None and answer(before) == answer(after),
        "rss_growth_last_vs_middle_third": growth,
        "rss_max_bytes": max(rss) if rss else None,
        "samples": samples,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    lines = [f"Soak: {report['archgen']}, {args.spec}, {args.clients} clients, {args.minutes:g} min, "
             f"{report['machine']}", "",
             f"requests: {report['requests_total']}; 5xx: {report['five_xx'] or 'none'}; "
             f"same temperature-0 answer after: {report['same_answer_after']}; "
             f"resident set, last third against middle third: "
             f"{'n/a' if growth is None else f'{growth * 100:+.1f}%'}", "",
             "| minute | resident MiB | MLX active MiB | MLX pool MiB | MLX peak MiB | prompt cache MiB | "
             "prompt cache entries | sequences in flight |", "|---|---|---|---|---|---|---|---|"]
    mib = 1 << 20
    shown = -1
    for s in samples:
        minute = int(s["t_s"] // 60)
        if minute == shown and s is not samples[-1]:
            continue
        shown = minute
        cells = [f"{s.get(g, float('nan')) / mib:.1f}" for g in GAUGES[:4]]
        cells.append(f"{s.get('archgen_prompt_cache_bytes', float('nan')) / mib:.1f}")
        cells.append(f"{s.get('archgen_prompt_cache_entries', float('nan')):.0f}")
        cells.append(f"{s.get('archgen_active_sequences', float('nan')):.0f}")
        lines.append(f"| {s['t_s'] / 60:.1f} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("requests by kind and status: " + json.dumps(report["requests"]))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
