"""One speed table for one spec: single stream, batched decode and serving,
each with archgen at L1, archgen at L3 and mlx-lm 0.32.2, in one call.

Runs the three existing benchmarks one after another on one random
checkpoint (`archgen init --seed 2`, made by the first and reused by the
others, deleted at the end unless --keep):
  single stream  bench.py: workers `generated` (L1), `generated@L3ENV` and
                 mlx-lm alternate round by round; tokens/s = 1 / median step
  batch B        batch_bench.py at --batches: the same three workers, B
                 sequences through one BatchSession / mlx-lm's
                 BatchGenerator; tokens/s = B / median step
  serving C      serve_bench_gpu.py at --clients: `archgen serve`,
                 `archgen serve` with L3ENV and mlx_lm.server, one after
                 another; aggregate completion tokens/s of streamed chats
L1 is archgen's default levers (every L1; the L3 levers' variables are
removed from the environment the benchmarks inherit). L3ENV is every lever
that `archgen levers`'s --l3 alias turns on, each through its environment
variable (the form the bench worker and `archgen serve` both read).

The share of the bound is the one bench.py and batch_bench.py compute: the
GPU's device-to-device copy bandwidth (PyTorch, read + write) over the
bytes a decode step reads, times B. The serving benchmark computes no
bound. Without PyTorch or CUDA the scripts say "no GPU: no bound", and so
does the table. Every number in the table is one the run measured; a
benchmark that failed leaves its rows marked failed.

Writes the table to --markdown (default LOGS/speed-table-SPEC.md) and the
inputs and rows to --json, and prints the table last. The three parts can
run in separate calls (a real-size table can outlast one call): --only PART
runs some, --keep keeps the checkpoint for the next call, and --reuse fills
the parts not run now from the JSON an earlier call left in --logs (the
table names those parts and their files' times).

Two kinds of extra rows, beside the three columns: --baseline-bench adds
bench.py's `baseline` worker (the generated model of another archgen-bench
build, e.g. an older commit) to the single-stream rounds, for a paired A/B
of two binaries in the same rounds; --extra-servers adds servers to the
serving part (serve_bench_gpu.py's names, e.g. `archgen-b64`, a larger
--max-batch). Each extra is a line under the table with its ratio to
archgen L1 and to mlx-lm. A second table gives each server's time to first
token and inter-token latency per serving level.

On the GPU machine: runtime/mlx-cuda/parity.sh's `speedtable` step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def lever_envs(archgen: str) -> dict[str, str]:
    """The environment variables that turn on what --l3 turns on, read from
    `archgen levers --format json` so the table follows the binary."""
    levers = json.loads(subprocess.run([archgen, "levers", "--format", "json"], check=True,
                                       capture_output=True, text=True).stdout)
    env_of = {lv["name"]: lv.get("environment") for lv in levers["levers"]}
    l3 = next(al for al in levers["aliases"] if al["flag"] == "--l3")
    on = {}
    for name, value in l3["sets"].items():
        if not env_of.get(name):
            raise SystemExit(f"lever {name} (set by --l3) has no environment variable: "
                             "the bench worker cannot turn it on")
        on[env_of[name]] = value
    return on


def run(label: str, argv: list[str], env: dict, log: Path) -> int:
    """Runs one benchmark, its output both shown and kept in `log`."""
    print(f"== {label}: {' '.join(argv)}", flush=True)
    t = time.time()
    with open(log, "w") as fh:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for line in p.stdout:
            sys.stdout.write(line)
            fh.write(line)
        rc = p.wait()
    print(f"== {label}: rc {rc} in {time.time() - t:.0f} s (log {log})", flush=True)
    return rc


def load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def cell(tok_s: float | None, ref: float | None, of_bound: float | None, bound_known: bool,
         ours: bool, note: str = "") -> str:
    if tok_s is None:
        return "failed"
    parts = []
    if ours:
        parts.append("-" if not ref else f"{tok_s / ref:.2f}x mlx-lm")
    if bound_known:
        parts.append("-" if of_bound is None else f"{100 * of_bound:.1f}% of bound")
    if note:
        parts.append(note)
    return f"{tok_s:.1f}" + (f" ({', '.join(parts)})" if parts else "")


def ratio(x: float | None, y: float | None) -> str:
    return "-" if not x or not y else f"{x / y:.2f}x"


def level_of(serve: dict, server: str, i: int) -> dict | None:
    """The `i`-th serving level of `server` in serve_bench_gpu.py's JSON, or
    None where it did not run."""
    levels = (serve["results"].get(server) or {}).get("levels") or []
    return levels[i] if i < len(levels) else None


def extra_lines(a, single, serve, impls: dict, servers: dict) -> list[str]:
    """The extra workers' and servers' lines: tokens/s and the ratios to
    archgen L1 and to mlx-lm in the same rounds or levels."""
    lines = []
    if a.baseline_bench and single and a.spec in single:
        s = single[a.spec]
        w = s["workers"]
        b, l1, ref = (w.get(k) for k in ("baseline", impls["archgen L1"], "mlx-lm"))
        if b:
            share = "" if b["of_bound"] is None else f", {100 * b['of_bound']:.1f}% of bound"
            lines += ["", f"Single stream, {a.baseline_label} (`baseline`, same rounds): {b['tok_s']:.1f} tok/s"
                      f"{share}; archgen L1 / {a.baseline_label} = {ratio(l1 and l1['tok_s'], b['tok_s'])} "
                      f"(tokens/s); {a.baseline_label} / mlx-lm = {ratio(b['tok_s'], ref and ref['tok_s'])}."]
    served = []
    if a.extra_servers and serve:
        for name in a.extra_servers:
            for i, c_n in enumerate(a.clients):
                lv, l1, ref = (level_of(serve, s, i) for s in (name, servers["archgen L1"], servers["mlx-lm"]))
                if lv is None:
                    served.append(f"- serving {c_n} clients, `{name}`: not run")
                    continue
                served.append(
                    f"- serving {c_n} clients, `{name}`: {lv['tokens_per_s']:.1f} tok/s, "
                    f"{ratio(lv['tokens_per_s'], l1 and l1['tokens_per_s'])} archgen L1, "
                    f"{ratio(lv['tokens_per_s'], ref and ref['tokens_per_s'])} mlx-lm; "
                    f"{lv['failed']}/{lv['requests']} failed, {lv.get('not_sent', 0)} not sent")
    return lines + ([""] + served if served else [])


def latency_table(a, serve, all_servers: list[str]) -> list[str]:
    """Time to first token and inter-token latency, p50 / p99 in ms, per
    server and serving level."""
    if not serve:
        return []

    def ms(v) -> str:
        return "-" if v is None else f"{1e3 * v:.0f}"

    def steps(b: dict | None) -> str:
        # archgen's own step histograms over the level: kind count x mean,
        # then the parts of its batched steps: phase count x mean (older
        # JSON has no parts).
        if not b:
            return "-"
        kinds = [f"{kind} {v['count']:.0f} x {1e3 * v['mean_s']:.1f}" for kind, v in b["steps"].items()]
        parts = [f"{p} {v['count']:.0f} x {1e3 * v['mean_s']:.1f}" for p, v in (b.get("phases") or {}).items()]
        return "; ".join(x for x in (", ".join(kinds), ", ".join(parts)) if x) or "-"

    lines = ["", "| serving | server | client TTFT p50 / p99 ms (first text) | server TTFT mean ms | inter-token p50 / p99 ms | "
             "queue wait mean ms | steps (kind count x mean ms; parts: phase count x mean ms) |", "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for i, c_n in enumerate(a.clients):
        for name in all_servers:
            v = level_of(serve, name, i)
            if v is None:
                continue
            b = v.get("breakdown")

            def mean_ms(part: str) -> str:
                # Older JSON has no server TTFT; mlx-lm's server has no metrics.
                m = (b.get(part) or {}).get("mean_s") if b else None
                return "-" if m is None else f"{1e3 * m:.1f}"
            lines.append(f"| {c_n} clients | `{name}` | {ms(v.get('ttft_p50_s'))} / {ms(v.get('ttft_p99_s'))} | "
                         f"{mean_ms('server_ttft')} | {ms(v.get('itl_p50_s'))} / {ms(v.get('itl_p99_s'))} | "
                         f"{mean_ms('queue_wait')} | {steps(b)} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archgen", required=True)
    ap.add_argument("--bench", required=True, help="the archgen-bench binary")
    ap.add_argument("--repo", type=Path, default=HERE.parents[1])
    ap.add_argument("--work", type=Path, default=Path("/tmp/parity"))
    ap.add_argument("--spec", default="gemma4-12b")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the single-stream and batched benchmarks")
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps per round")
    ap.add_argument("--prefills", type=int, default=1, help="bench.py's prefills per worker and round")
    ap.add_argument("--prompt", type=int, default=128, help="batched prompt tokens per sequence")
    ap.add_argument("--max-tokens", type=int, default=64, help="completion tokens per served request")
    ap.add_argument("--min-requests", type=int, default=16)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--level-budget", type=float, default=300)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--only", nargs="*", choices=["single", "batch", "serve"],
                    default=["single", "batch", "serve"],
                    help="run these benchmarks only (none, with --reuse: write the table from earlier calls' "
                         "JSON, on any machine)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint")
    ap.add_argument("--reuse", action="store_true",
                    help="parts not run in this call come from an earlier call's JSON in --logs")
    ap.add_argument("--logs", type=Path, help="the benchmarks' logs and JSON (default WORK/speedtable)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--baseline-bench", help="another archgen-bench binary: its generated model joins the "
                    "single-stream rounds as worker `baseline`")
    ap.add_argument("--baseline-label", default="baseline", help="what the baseline binary is (e.g. a commit)")
    ap.add_argument("--pairs", action="store_true",
                    help="single stream and batched: archgen L1 and archgen L3 each in rounds of their own "
                         "against mlx-lm (two processes hold the weights at a time, not three: a 12B on an "
                         "80 GB card); each archgen column's ratio is to the mlx-lm of its own rounds")
    ap.add_argument("--extra-servers", nargs="*", default=[],
                    help="more servers for the serving part (serve_bench_gpu.py names)")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    logs = a.logs or a.work / "speedtable"
    logs.mkdir(parents=True, exist_ok=True)
    model = a.work / f"bench-{a.spec}"  # bench.py's and batch_bench.py's checkpoint path

    l3_env = lever_envs(a.archgen)
    l3_suffix = "".join(f"@{k}={v}" for k, v in sorted(l3_env.items()))
    # L1 means the binary's defaults: none of the L3 levers' variables may
    # leak in from the caller's environment.
    base = {k: v for k, v in os.environ.items() if k not in l3_env}
    for k in sorted(set(os.environ) & set(l3_env)):
        print(f"speed table: {k}={os.environ[k]} removed from the environment (L1 is the defaults)")
    # As serve_bench_gpu.sh: MLX's default of 400 CUDA graphs thrashes under
    # continuous batching and killed mlx_lm.server's generation thread.
    batched = dict(base, MLX_CUDA_GRAPH_CACHE_SIZE=base.get("MLX_CUDA_GRAPH_CACHE_SIZE", "40000"))
    impls = {"archgen L1": "generated", "archgen L3": "generated" + l3_suffix, "mlx-lm": "mlx-lm"}
    servers = {"archgen L1": "archgen", "archgen L3": "archgen" + l3_suffix, "mlx-lm": "mlx-lm"}
    single_impls = list(impls.values()) + (["baseline"] if a.baseline_bench else [])
    all_servers = list(servers.values()) + a.extra_servers
    print(f"speed table {a.spec}: L3 = {', '.join(f'{k}={v}' for k, v in sorted(l3_env.items()))}", flush=True)

    py = sys.executable
    rc: dict[str, int] = {}
    out = {k: logs / f"speed-{a.spec}-{k}.json" for k in ("single", "batch", "serve")}
    earlier = {}
    for part, f in out.items():
        if part in a.only or not a.reuse:
            f.unlink(missing_ok=True)
        elif f.exists():
            earlier[part] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(f.stat().st_mtime))
    # With --pairs, the L3 rounds are a second run beside their own mlx-lm
    # (written to *-l3.json), merged into the first run's JSON below.
    l3_out = {k: logs / f"speed-{a.spec}-{k}-l3.json" for k in ("single", "batch")}
    for part, f in l3_out.items():
        if part in a.only or not a.reuse:
            f.unlink(missing_ok=True)
    if "single" in a.only:
        groups = ([single_impls] if not a.pairs else
                  [[i for i in single_impls if i != impls["archgen L3"]], [impls["archgen L3"], "mlx-lm"]])
        for n, group in enumerate(groups):
            l3_run = n == 1
            code = run("single stream" + (" (L3)" if l3_run else ""), [
                py, str(HERE / "bench.py"), "--archgen", a.archgen, "--bench", a.bench, "--repo", str(a.repo),
                "--work", str(a.work), "--rounds", str(a.rounds), "--warm", str(a.warm), "--steps", str(a.steps),
                "--prefills", str(a.prefills), "--keep", "--impls", ",".join(group),
                "--gen", group[0], "--json", str(l3_out["single"] if l3_run else out["single"]), a.spec,
                *(["--baseline-bench", a.baseline_bench] if a.baseline_bench and not l3_run else [])],
                base, logs / f"speed-{a.spec}-single{'-l3' if l3_run else ''}.log")
            rc["single"] = rc.get("single") or code
    if "batch" in a.only:
        all_impls = list(impls.values())
        groups = ([all_impls] if not a.pairs else
                  [[impls["archgen L1"], "mlx-lm"], [impls["archgen L3"], "mlx-lm"]])
        for n, group in enumerate(groups):
            l3_run = n == 1
            code = run("batched" + (" (L3)" if l3_run else ""), [
                py, str(HERE / "batch_bench.py"), "--archgen", a.archgen, "--bench", a.bench, "--repo", str(a.repo),
                "--work", str(a.work), "--batches", *map(str, a.batches), "--prompt", str(a.prompt),
                "--warm", str(a.warm), "--steps", str(a.steps), "--rounds", str(a.rounds),
                "--impls", ",".join(group), "--json", str(l3_out["batch"] if l3_run else out["batch"]), a.spec],
                batched, logs / f"speed-{a.spec}-batch{'-l3' if l3_run else ''}.log")
            rc["batch"] = rc.get("batch") or code
    if "serve" in a.only:
        if not (model / "config.json").exists():
            r = subprocess.run([a.archgen, "init", "--spec", str(a.repo / "specs" / f"{a.spec}.yaml"),
                                "--out", str(model), "--seed", "2"], capture_output=True, text=True)
            print((r.stderr.strip().splitlines() or ["?"])[-1], flush=True)
        if not (model / "tokenizer.json").exists():
            # As serve_bench_gpu.sh: a chat tokenizer (Qwen3's template)
            # padded to the checkpoint's whole vocabulary.
            subprocess.run([py, str(a.repo / "tests/python/make_chat_tokenizer.py"), str(model),
                            str(a.repo / "runtime/cli/tests/fixtures/chat_templates/qwen3.jinja")], check=True)
            subprocess.run([py, str(HERE / "pad_tokenizer_vocab.py"), str(model)], check=True)
        rc["serve"] = run("serving", [
            py, str(HERE / "serve_bench_gpu.py"), "--archgen", a.archgen, "--model", str(model),
            "--repo", str(a.repo), "--servers", *all_servers, "--clients", *map(str, a.clients),
            "--min-requests", str(a.min_requests), "--waves", str(a.waves), "--max-tokens", str(a.max_tokens),
            "--level-budget", str(a.level_budget), "--timeout", str(a.timeout), "--logs", str(logs),
            "--json", str(out["serve"])], batched, logs / f"speed-{a.spec}-serve.log")
    if not a.keep:
        shutil.rmtree(model, ignore_errors=True)

    single, batch, serve = (load(out[k]) for k in ("single", "batch", "serve"))
    single_l3, batch_l3 = (load(l3_out[k]) if a.pairs else None for k in ("single", "batch"))
    cols = list(impls)

    def status(part: str) -> str:
        return f"failed (rc {rc[part]})" if part in rc else "not run"

    rows = []
    bound_bw = None
    if single and a.spec in single:
        s = single[a.spec]
        bound_bw = s["copy_bw"]
        w = {c: s["workers"].get(impls[c]) for c in cols}
        row = {"row": "single stream", "bound_tok_s": s["bound_tok_s"],
               **{c: None if w[c] is None else {"tok_s": w[c]["tok_s"], "of_bound": w[c]["of_bound"]}
                  for c in cols}}
        if a.pairs:
            s3 = (single_l3 or {}).get(a.spec) or {}
            w3 = (s3.get("workers") or {})
            l3, ref = w3.get(impls["archgen L3"]), w3.get("mlx-lm")
            row["archgen L3"] = None if l3 is None else {
                "tok_s": l3["tok_s"], "of_bound": l3["of_bound"], "ref_tok_s": ref and ref["tok_s"]}
            s["tokens_differ"].update((s3.get("tokens_differ") or {}))
        rows.append(row)
    elif "single" in a.only or a.reuse:
        rows.append({"row": "single stream", "failed": status("single")})
    if batch:
        bound_bw = bound_bw or batch["copy_bw"]
        by = {(r["batch"], r["impl"]): r for r in batch["results"]}
        by3 = {(r["batch"], r["impl"]): r for r in (batch_l3 or {}).get("results", [])}
        for b in a.batches:
            r = {c: by.get((b, impls[c])) for c in cols}
            if a.pairs:
                r["archgen L3"] = by3.get((b, impls["archgen L3"]))
            some = next((x for x in r.values() if x), None)
            row = {"row": f"batch B={b}", "bound_tok_s": some and some["bound_tok_s"],
                   **{c: None if r[c] is None else {"tok_s": r[c]["tok_s"], "of_bound": r[c]["of_bound"]}
                      for c in cols}}
            if a.pairs and row["archgen L3"] is not None:
                ref = by3.get((b, "mlx-lm"))
                row["archgen L3"]["ref_tok_s"] = ref and ref["tok_s"]
            rows.append(row)
    elif "batch" in a.only or a.reuse:
        rows += [{"row": f"batch B={b}", "failed": status("batch")} for b in a.batches]
    if serve:
        for i, c_n in enumerate(a.clients):
            row = {"row": f"serving {c_n} clients", "bound_tok_s": None, "no_bound": True}
            for c in cols:
                lv = level_of(serve, servers[c], i)
                row[c] = None if lv is None else {
                    "tok_s": lv["tokens_per_s"], "of_bound": None,
                    "failed": lv["failed"], "not_sent": lv.get("not_sent", 0), "requests": lv["requests"]}
            rows.append(row)
    elif "serve" in a.only or a.reuse:
        rows += [{"row": f"serving {c} clients", "failed": status("serve")} for c in a.clients]

    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        gpu = ""
    earlier_table = logs / f"speed-table-{a.spec}.json"
    if not a.only and earlier_table.exists():
        # Nothing ran here: the GPU is the one the earlier calls ran on.
        gpu = json.loads(earlier_table.read_text()).get("gpu") or gpu
    version = subprocess.run([a.archgen, "--version"], capture_output=True, text=True).stdout.strip()
    bound_note = ("no GPU: no bound (no CUDA copy bandwidth on this machine)" if bound_bw is None else
                  f"bound = device-to-device copy {bound_bw / 1e12:.2f} TB/s (read + write) over the bytes a "
                  "decode step reads, times B (bench.py, batch_bench.py); serving has no bound")
    lines = [
        f"Spec {a.spec} (random weights, `archgen init --seed 2`); {gpu or 'no GPU (nvidia-smi absent)'}; "
        f"{version}; mlx-lm 0.32.2. L3 = {', '.join(f'{k}={v}' for k, v in sorted(l3_env.items()))}.",
        f"Single stream and batched: {a.rounds} rounds of {a.warm} untimed + {a.steps} timed decode steps "
        f"(batched prompts {a.prompt} tokens), tokens/s from the median step. Serving: streamed chats of "
        f"{a.max_tokens} tokens, max({a.min_requests}, {a.waves} x clients) requests per level, aggregate "
        "completion tokens/s. Ratios are tokens/s over mlx-lm's (> 1: archgen faster). " + bound_note + "."
        + (" --pairs: archgen L3 ran in rounds of its own beside another mlx-lm process (its ratio is to that "
           "mlx-lm; the mlx-lm column is the L1 rounds')." if a.pairs else ""),
        "",
        "| row | archgen L1 tok/s | archgen L3 tok/s | mlx-lm tok/s | bound tok/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        if "failed" in row:
            lines.append(f"| {row['row']} | {row['failed']} | {row['failed']} | {row['failed']} | - |")
            continue
        ref = row["mlx-lm"]["tok_s"] if row.get("mlx-lm") else None
        known = not row.get("no_bound") and row["bound_tok_s"] is not None
        cells = []
        for c in cols:
            v = row.get(c)
            note = ""
            if v and (v.get("failed") or v.get("not_sent")):
                note = f"{v['failed']}/{v['requests']} failed, {v['not_sent']} not sent"
            # --pairs: an archgen column's ratio is to the mlx-lm of its own rounds.
            own_ref = v.get("ref_tok_s", ref) if v else ref
            cells.append(cell(v and v["tok_s"], own_ref, v and v["of_bound"], known, c != "mlx-lm", note))
        bound = ("none (serving)" if row.get("no_bound") else
                 "no GPU: no bound" if row["bound_tok_s"] is None else f"{row['bound_tok_s']:.1f}")
        lines.append(f"| {row['row']} | " + " | ".join(cells) + f" | {bound} |")
    if single and a.spec in single:
        differ = {k: v for k, v in single[a.spec]["tokens_differ"].items() if v}
        lines += ["", "Single-stream greedy tokens: " + (
            "every worker's equal to mlx-lm's and L1's in every round" if not differ else
            "; ".join(f"{k} differ in rounds " + ", ".join(f"{d['round']} (from step {d['from_step']})" for d in v)
                      for k, v in differ.items())) + " (batched: the batched log's `tokens` lines)."]
    lines += extra_lines(a, single, serve, impls, servers)
    lines += latency_table(a, serve, all_servers)
    if earlier:
        lines += ["", "From an earlier call (--reuse): " + "; ".join(
            f"{part} ({out[part].name}, written {when})" for part, when in earlier.items()) + "."]
    table = "\n".join(lines) + "\n"
    md = a.markdown or logs / f"speed-table-{a.spec}.md"
    md.write_text(table)
    js = a.json or logs / f"speed-table-{a.spec}.json"
    js.write_text(json.dumps({"spec": a.spec, "gpu": gpu, "archgen": version, "l3_env": l3_env,
                              "copy_bw": bound_bw, "rc": rc, "rows": rows, "earlier": earlier,
                              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}},
                             indent=2))
    print(f"\nspeed table written to {md} and {js}\n")
    print(table)
    if any(rc.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
