"""GPU benchmark: archgen generated, archgen monolith and mlx-lm 0.32.2, all on
MLX's CUDA backend, alternating round by round in one call.

Runs on the GPU machine through runtime/mlx-cuda/parity.sh (`bench` step),
which sets up the wheels and the binaries. Per spec:
  * `archgen init --spec specs/NAME.yaml --seed 2` makes a random checkpoint
    (on the GPU); it is deleted after the spec.
  * Workers start on it (`archgen-bench worker --impl generated|monolith`
    and tests/python/bench_mlx_lm.py, the same stdin/stdout protocol as
    `cargo xtask bench`); each loads every weight and runs one forward before
    it says ready, so nothing below times loading. By default four: the
    generated model as the binary runs it by default (`generated`, the
    result line's gen; on CUDA the compiled GPU decode path, docs/parity.md
    "On the GPU"), the generated model on the eager blocks
    (`generated@ARCHGEN_GPU_DECODE=0`), the monolith and mlx-lm.
  * Prefill: `prefill 2048` then `prefill 128` per worker, each a fresh cache
    and one forward with the logits evaluated, --prefills times each per
    worker and round (default 3; the first after another worker's turn can
    pay for allocations); the median of all is reported.
  * Decode: ROUNDS rounds; in each, every worker in turn runs `prefill 128`
    and `steps WARM STEPS`: pipelined decode steps as mlx-lm's generate_step
    runs them (async_eval of the next step before reading this token); a
    step's time is the interval between two tokens. Bit-exact
    implementations feed the same greedy tokens: after the rounds, each
    worker's tokens are compared with gen's and mlx-lm's (`tokens ... same in
    every round` or the rounds and step where they part).
  * Memory: each worker holds its own copy of the weights; past
    --max-gpu-bytes (100 GB) of weights together the bench warns, since
    five 23.8 GB workers on the H200 made prefill 14-85 times slower.
  * Weight bytes per step: the checkpoint's tensors a decode step reads (all,
    less an untied input embedding, of which one row is read; MoE experts
    scaled by top_k / num_experts).
  * Copy bandwidth: a device-to-device copy of 8 GiB through PyTorch, bytes
    read plus written per second (the streaming rate a read-only
    matrix-vector product can approach); bound_tok_s = that / bytes per step.
    Without PyTorch or CUDA (a CPU run) there is no bound: the line says
    bound_tok_s=none rather than guess one.
  * Variants (--impls, which must hold gen and mlx-lm; without the monolith
    the result line has no gen/mono): besides `generated`, `monolith` and `mlx-lm`,
    `baseline` is the generated model of another build of archgen-bench
    (--baseline-bench: an older commit, for a paired A/B of two binaries on
    one checkpoint in one call), and a
    worker `BASE@VAR=VALUE[@VAR=VALUE...]` runs BASE with those environment
    variables (e.g. `generated@ARCHGEN_GPU_DECODE=0`, the eager blocks, or
    `generated@MLX_MAX_OPS_PER_BUFFER=400`); each worker holds its own copy
    of the weights on the GPU, so a 24 GB model takes at most 4 or 5.
  * Primitives per step: after the rounds, each worker counts one more
    decode step's graph before evaluating it (`nodes`: the primitives
    `export_to_dot` lists; a compiled block is one).
--json FILE writes each spec's per-worker medians, the bound and the token
agreement as JSON (runtime/mlx-cuda/speed_table.py reads it).
Prints, last, one line per spec:
  gpu ratio spec=NAME gen/mlx-lm=X gen/mono=Y gen_tok_s=A mlx_lm_tok_s=B bound_tok_s=C
gen/mlx-lm and gen/mono are ratios of median step times (< 1: generated is
faster); tokens/s are 1 / median step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

# The generated model as shipped (on CUDA: the compiled GPU decode path,
# byte-identical to the eager blocks on the H200, docs/parity.md "On the
# GPU"), the same binary on the eager blocks, the monolith and mlx-lm.
DEFAULT_GEN = "generated"
DEFAULT_IMPLS = f"{DEFAULT_GEN},generated@ARCHGEN_GPU_DECODE=0,monolith,mlx-lm"


def base_and_env(name: str) -> tuple[str, dict]:
    """A worker or server named `BASE[@VAR=VALUE...]`: BASE, and this
    process's environment with those variables set (batch_bench.py and
    serve_bench_gpu.py name theirs the same way)."""
    base, *sets = name.split("@")
    env = dict(os.environ)
    for kv in sets:
        var, _, value = kv.partition("=")
        env[var] = value
    return base, env


def worker_cmd(name: str, model: Path, a) -> tuple[list[str], dict]:
    """The command and environment of worker `name` (BASE[@VAR=VALUE...])."""
    base, env = base_and_env(name)
    cmds = {
        "generated": [a.bench, "worker", "--impl", "generated", "--model", str(model)],
        "monolith": [a.bench, "worker", "--impl", "monolith", "--model", str(model)],
        "baseline": [a.baseline_bench or "", "worker", "--impl", "generated", "--model", str(model)],
        "mlx-lm": [sys.executable, str(a.repo / "tests/python/bench_mlx_lm.py"), "--model", str(model)],
    }
    if base not in cmds:
        raise SystemExit(f"unknown worker {name!r}: BASE is one of {', '.join(cmds)}")
    if base == "baseline" and not a.baseline_bench:
        raise SystemExit(f"worker {name!r} needs --baseline-bench (the other archgen-bench binary)")
    return cmds[base], env


def copy_bandwidth() -> float | None:
    """Bytes read plus written per second by a device-to-device copy, or None
    (said on stdout) where there is no CUDA GPU: a CPU run has no bound."""
    try:
        import torch
    except ImportError:
        print("no GPU: no bound (PyTorch is not installed, so no copy bandwidth)", flush=True)
        return None
    if not torch.cuda.is_available():
        print("no GPU: no bound (torch.cuda.is_available() is false)", flush=True)
        return None
    n = 8 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / 10
    del x, y
    torch.cuda.empty_cache()
    return 2 * n / dt


def step_bytes(model: Path) -> tuple[int, int]:
    """(bytes a decode step reads, all weight bytes) from the safetensors headers."""
    config = json.loads((model / "config.json").read_text())
    text = config.get("text_config", config)
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", True))
    experts = text.get("num_experts") or 0
    top_k = text.get("top_k_experts") or text.get("num_experts_per_tok") or 0
    total = read = 0
    for f in sorted(model.glob("model*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            a, b = meta["data_offsets"]
            size = b - a
            total += size
            if "embed_tokens" in name and not tied and "per_layer" not in name:
                continue  # untied: one row of the input embedding is read
            if "per_layer" in name and "embed" in name:
                continue  # per-layer embedding table: one row per layer is read
            if experts and (".experts." in name or "switch_glu" in name):
                read += size * top_k // experts
            else:
                read += size
    return read, total


class Worker:
    def __init__(self, name: str, cmd: list[str], env: dict):
        self.name = name
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        self.ready = self.read()

    def read(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.name} worker exited early (rc {self.p.wait()})")
        return json.loads(line)

    def choices_note(self) -> str:
        """`; decode choices {...}` from an archgen worker's ready line (the
        levers its variables set), empty for mlx-lm's worker."""
        choices = self.ready.get("decode_choices")
        return f"; decode choices {json.dumps(choices, sort_keys=True)}" if choices else ""

    def ask(self, cmd: str) -> dict:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.read()

    def close(self) -> None:
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            pass
        self.p.wait()


def bench(spec: str, a, bound_bw: float | None, report: dict) -> str:
    spec, _, impls = spec.partition(":")
    model = a.work / f"bench-{spec}"
    t0 = time.time()
    if not (model / "config.json").exists():
        r = subprocess.run([a.archgen, "init", "--spec", str(a.repo / "specs" / f"{spec}.yaml"),
                            "--out", str(model), "--seed", "2"], capture_output=True, text=True)
        print(r.stderr.strip().splitlines()[-1], flush=True)
        if r.returncode != 0:
            return f"gpu ratio spec={spec} FAILED: init"
    read, total = step_bytes(model)
    print(f"bench {spec}: checkpoint {total / 1e9:.2f} GB, read per step {read / 1e9:.2f} GB "
          f"(made in {time.time() - t0:.0f} s)", flush=True)
    IMPLS = (impls or a.impls).split(",")
    if total * len(IMPLS) > a.max_gpu_bytes:
        # Seen on the H200: five 23.8 GB workers made 2,048-token prefills
        # 14-85 times slower (docs/benchmarks.md); the numbers would mislead.
        print(f"bench {spec}: WARNING {len(IMPLS)} workers x {total / 1e9:.1f} GB = "
              f"{len(IMPLS) * total / 1e9:.0f} GB of weights on the GPU, over "
              f"{a.max_gpu_bytes / 1e9:.0f} GB (--max-gpu-bytes): timings may measure memory "
              "pressure; run fewer workers for this spec", flush=True)
    gen = a.gen
    for need in (gen, "mlx-lm"):
        if need not in IMPLS:
            raise SystemExit(f"--impls must include {need} (the result line compares with it)")
    workers = {}
    for name in IMPLS:
        t = time.time()
        workers[name] = Worker(name, *worker_cmd(name, model, a))
        print(f"bench {spec}: {name} ready in {time.time() - t:.1f} s "
              f"(load_s {workers[name].ready['load_s']:.1f}){workers[name].choices_note()}", flush=True)
    steps = {n: [] for n in IMPLS}
    fed = {n: [] for n in IMPLS}  # greedy tokens per round
    pre128 = {n: [] for n in IMPLS}
    pre2048 = {n: [] for n in IMPLS}
    for rnd in range(a.rounds):
        for name in IMPLS:
            w = workers[name]
            # Several prefills in a row: the first one after another
            # worker's turn can pay for allocations the rest do not.
            for _ in range(a.prefills):
                pre2048[name].append(w.ask("prefill 2048")["prefill_s"])
            for _ in range(a.prefills):
                pre128[name].append(w.ask("prefill 128")["prefill_s"])
            r = w.ask(f"steps {a.warm} {a.steps}")
            steps[name].append(r["steps_s"])
            fed[name].append(r["tokens"])
        print(f"bench {spec} round {rnd + 1}/{a.rounds}: median step " + ", ".join(
            f"{n} {1e3 * statistics.median(steps[n][-1]):.2f} ms" for n in IMPLS), flush=True)
    # Bit-exact implementations feed the same greedy tokens; say who agrees
    # with whom over all rounds (the first difference, if any).
    agree = {}
    for name in IMPLS:
        for ref in (gen, "mlx-lm"):
            if name == ref or (ref == "mlx-lm" and name == gen):
                continue
            diff = [(rnd, next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y),
                          min(len(mine), len(theirs))))
                    for rnd, (mine, theirs) in enumerate(zip(fed[name], fed[ref])) if mine != theirs]
            agree[f"{name} vs {ref}"] = [{"round": r + 1, "from_step": i} for r, i in diff]
            print(f"bench {spec} tokens {name} vs {ref}: "
                  + ("same in every round" if not diff else
                     "differ in rounds " + ", ".join(f"{r + 1} (from step {i})" for r, i in diff)),
                  flush=True)
    for name, w in workers.items():
        try:
            n = w.ask("nodes")
            top = sorted(n["by_op"].items(), key=lambda kv: -kv[1])[:8]
            print(f"bench {spec} {name}: {n['nodes']} primitives per decode step; most: "
                  + ", ".join(f"{op} {c}" for op, c in top), flush=True)
        except (SystemExit, Exception) as e:  # a count is extra: report, go on
            print(f"bench {spec} {name}: nodes failed: {e}", flush=True)
        w.close()
    if not a.keep:
        shutil.rmtree(model, ignore_errors=True)
    med = {n: statistics.median([t for r in steps[n] for t in r]) for n in IMPLS}
    overall = {n: sum(len(r) for r in steps[n]) / sum(sum(r) for r in steps[n]) for n in IMPLS}
    for n in IMPLS:
        print(f"bench {spec} {n}: median step {1e3 * med[n]:.2f} ms ({1 / med[n]:.1f} tok/s), "
              f"overall {overall[n]:.1f} tok/s; prefill 128 median {1e3 * statistics.median(pre128[n]):.1f} ms, "
              f"2048 median {1e3 * statistics.median(pre2048[n]):.1f} ms "
              f"(min {1e3 * min(pre2048[n]):.1f}) "
              f"({2048 / statistics.median(pre2048[n]):.0f} tok/s); "
              f"weights read/step {read / 1e9:.2f} GB = {read / med[n] / 1e12:.2f} TB/s", flush=True)
    for n in IMPLS:
        if n != gen:
            print(f"bench {spec} {gen}/{n} median step ratio {med[gen] / med[n]:.3f}", flush=True)
    bound = None if bound_bw is None else bound_bw / read
    report[spec] = {
        "read_bytes": read, "total_bytes": total, "copy_bw": bound_bw, "bound_tok_s": bound,
        "rounds": a.rounds, "steps": a.steps,
        "workers": {n: {"median_step_s": med[n], "tok_s": 1 / med[n], "overall_tok_s": overall[n],
                        "of_bound": None if bound is None else 1 / med[n] / bound} for n in IMPLS},
        "tokens_differ": agree,
    }
    mono = f"gen/mono={med[gen] / med['monolith']:.3f} " if "monolith" in med else ""
    return (f"gpu ratio spec={spec} gen/mlx-lm={med[gen] / med['mlx-lm']:.3f} "
            f"{mono}gen_tok_s={1 / med[gen]:.1f} "
            f"mlx_lm_tok_s={1 / med['mlx-lm']:.1f} "
            f"bound_tok_s={'none' if bound is None else f'{bound:.1f}'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archgen", required=True)
    ap.add_argument("--bench", required=True, help="the archgen-bench binary")
    ap.add_argument("--baseline-bench", default=os.environ.get("BENCH_BASELINE"),
                    help="the archgen-bench binary of worker `baseline` (env BENCH_BASELINE)")
    ap.add_argument("--repo", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefills", type=int, default=int(os.environ.get("BENCH_PREFILLS", "3")),
                    help="prefills of each length per worker and round (the median is reported)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--max-gpu-bytes", type=float, default=100e9,
                    help="warn when the workers' weights together exceed this many bytes")
    ap.add_argument("--impls", default=os.environ.get("BENCH_IMPLS", DEFAULT_IMPLS),
                    help="comma-separated workers, BASE[@VAR=VALUE...] (default: env BENCH_IMPLS "
                         f"or {DEFAULT_IMPLS})")
    ap.add_argument("--gen", default=os.environ.get("BENCH_GEN", DEFAULT_GEN),
                    help=f"the worker the result line calls gen (default: env BENCH_GEN or {DEFAULT_GEN})")
    ap.add_argument("--json", type=Path, help="write the per-worker results of every spec here")
    ap.add_argument("specs", nargs="+", help="SPEC or SPEC:IMPLS (that spec's workers)")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth()
    if bw is not None:
        print(f"bench: device-to-device copy {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    lines = []
    report: dict = {}
    for spec in a.specs:
        try:
            lines.append(bench(spec, a, bw, report))
        except (SystemExit, Exception) as e:  # report, go on with the next spec
            lines.append(f"gpu ratio spec={spec.partition(':')[0]} FAILED: {e}")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
