"""Batched decode on the GPU: tokens/s at batch 1, 8 and 32 for archgen's
batched forward and for mlx-lm 0.32.2's own `BatchGenerator`, in one call,
against the weight-read bound.

Runs on the GPU machine after runtime/mlx-cuda/parity.sh's setup (the
wheels in /tmp/site, the binaries in /tmp); serve_bench_gpu.sh calls it.

  * Checkpoint: `archgen init --spec specs/SPEC.yaml --seed 2` (random
    weights, made on the GPU), or --model DIR.
  * Workers (the stdin/stdout protocol of `cargo xtask bench`, one process
    each, every weight read and one forward run before they say ready):
      monolith  `archgen-bench worker --impl monolith`: `batch B P W S`
                runs B sequences through one `BatchSession`, the scheduler
                `archgen serve` drives (mlx-lm's `BatchGenerator` schedule),
                over the monolith's batched forward (`BatchLm`).
      generated `archgen-bench worker --impl generated`: the same
                `BatchSession` over the generated model's batched forward
                (what `archgen serve --impl auto` serves).
      mlx-lm    tests/python/bench_mlx_lm.py (--mlx-worker): `batch B P W S`
                runs mlx-lm's own `BatchGenerator` with its defaults.
      BASE@VAR=VALUE[@VAR=VALUE...]
                BASE with those environment variables, as in bench.py
                (e.g. the generated model with archgen's L3 levers on).
  * For each round and each B, every worker in turn: B sequences of P
    prompt tokens (sequence j's ids `(i * 37 + 11 + 101 j) % vocab`) join at
    once; untimed steps until one step returns a token for all B; W untimed
    and S timed steps. A step's time is the interval between two steps'
    tokens; tokens/s = B / median step.
  * Bound: bound_tok_s(B) = B * copy bandwidth / bytes a decode step reads
    (bench.py's step_bytes: all weights, the untied input embedding aside;
    copy bandwidth: an 8 GiB device-to-device copy through PyTorch, bytes
    read plus written per second). It ignores the KV cache reads (small
    here: prompts of P tokens) and compute, so at large B it is far above
    what any implementation reaches. Without PyTorch or CUDA (a CPU run)
    there is no bound: bound_tok_s=none.
  * Greedy tokens: for each B and round, every archgen worker's timed tokens are
    each compared with mlx-lm's (`same` or the first step and row where they
    part).

Prints one line per (B, worker), last:
  gpu batch spec=NAME B=8 impl=monolith step_ms=X tok_s=Y bound_tok_s=Z of_bound=P%
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archgen", required=True)
    ap.add_argument("--bench", required=True, help="the archgen-bench binary")
    ap.add_argument("--repo", type=Path, default=HERE.parents[1])
    ap.add_argument("--mlx-worker", type=Path,
                    help="bench_mlx_lm.py with the `batch` command (default: the repo's)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/parity"))
    ap.add_argument("--model", type=Path, help="an existing checkpoint (default: archgen init)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--impls", default="monolith,mlx-lm,generated")
    ap.add_argument("--json", type=Path)
    ap.add_argument("spec", nargs="?", default="gemma4-12b")
    a = ap.parse_args()

    # bench.py (the single-sequence GPU benchmark) has the worker wrapper,
    # the byte count and the copy bandwidth; the same code measures both.
    sys.path.insert(0, str(a.repo / "runtime/mlx-cuda"))
    from bench import Worker, base_and_env, copy_bandwidth, step_bytes

    mlx_worker = a.mlx_worker or a.repo / "tests/python/bench_mlx_lm.py"
    bw = copy_bandwidth()
    if bw is not None:
        print(f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    model = a.model or a.work / f"bench-{a.spec}"
    if not (model / "config.json").exists():
        t = time.time()
        r = subprocess.run([a.archgen, "init", "--spec", str(a.repo / "specs" / f"{a.spec}.yaml"),
                            "--out", str(model), "--seed", "2"], capture_output=True, text=True)
        print((r.stderr.strip().splitlines() or ["?"])[-1], f"({time.time() - t:.0f} s)", flush=True)
        if r.returncode != 0:
            raise SystemExit(f"archgen init failed (rc {r.returncode})")
    read, total = step_bytes(model)
    bound_one = None if bw is None else bw / read
    print(f"checkpoint {model}: {total / 1e9:.2f} GB, read per step {read / 1e9:.2f} GB, "
          + ("no bound" if bound_one is None else f"bound {bound_one:.1f} tok/s per sequence"), flush=True)

    cmds = {
        "monolith": [a.bench, "worker", "--impl", "monolith", "--model", str(model)],
        "generated": [a.bench, "worker", "--impl", "generated", "--model", str(model)],
        "mlx-lm": [sys.executable, str(mlx_worker), "--model", str(model)],
    }
    names = a.impls.split(",")
    workers = {}
    for name in names:
        base, env = base_and_env(name)
        if base not in cmds:
            raise SystemExit(f"unknown worker {name!r}: BASE is one of {', '.join(cmds)}")
        t = time.time()
        workers[name] = Worker(name, cmds[base], env)
        print(f"{name} ready in {time.time() - t:.1f} s{workers[name].choices_note()}", flush=True)

    steps: dict[tuple[int, str], list[float]] = {}
    fills: dict[tuple[int, str], list[float]] = {}
    tokens: dict[tuple[int, str, int], list] = {}
    for rnd in range(a.rounds):
        for b in a.batches:
            for name in names:
                w = workers[name]
                r = w.ask(f"batch {b} {a.prompt} {a.warm} {a.steps}")
                if "error" in r:
                    raise SystemExit(f"{name}: {r['error']}")
                fill = r["fill_s"]
                tokens[(b, name, rnd)] = r["tokens"]
                steps.setdefault((b, name), []).extend(r["steps_s"])
                fills.setdefault((b, name), []).append(fill)
                med = statistics.median(r["steps_s"])
                print(f"round {rnd + 1} B={b:>2} {name:>9}: median step {med * 1e3:.2f} ms "
                      f"({b / med:.1f} tok/s), fill {fill:.2f} s", flush=True)
    for w in workers.values():
        w.close()

    for ours in names:
        if ours == "mlx-lm" or "mlx-lm" not in names:
            continue
        for b in a.batches:
            for rnd in range(a.rounds):
                mine, ref = tokens[(b, ours, rnd)], tokens[(b, "mlx-lm", rnd)]
                where = next(((s, j) for s, (x, y) in enumerate(zip(mine, ref))
                              for j, (u, v) in enumerate(zip(x, y)) if u != v), None)
                print(f"tokens B={b} round {rnd + 1} {ours} vs mlx-lm: "
                      + ("same" if where is None else f"part at timed step {where[0]}, sequence {where[1]}"))

    results = []
    for b in a.batches:
        for name in names:
            if (b, name) not in steps:
                continue
            med = statistics.median(steps[(b, name)])
            row = {
                "spec": a.spec, "batch": b, "impl": name,
                "step_ms": med * 1e3,
                "tok_s": b / med,
                "bound_tok_s": None if bound_one is None else b * bound_one,
                "of_bound": None if bound_one is None else b / med / (b * bound_one),
                "p10_step_ms": statistics.quantiles(steps[(b, name)], n=10, method="inclusive")[0] * 1e3,
                "p90_step_ms": statistics.quantiles(steps[(b, name)], n=10, method="inclusive")[-1] * 1e3,
                "fill_s": statistics.median(fills[(b, name)]),
            }
            results.append(row)
    for row in results:
        print(f"gpu batch spec={row['spec']} B={row['batch']} impl={row['impl']} "
              f"step_ms={row['step_ms']:.2f} tok_s={row['tok_s']:.1f} "
              + ("bound_tok_s=none " if row["bound_tok_s"] is None else
                 f"bound_tok_s={row['bound_tok_s']:.1f} of_bound={100 * row['of_bound']:.1f}% ")
              + f"(p10/p90 step {row['p10_step_ms']:.2f}/{row['p90_step_ms']:.2f} ms)")
    if a.json:
        a.json.write_text(json.dumps({"copy_bw": bw, "read_bytes": read, "results": results}, indent=2))


if __name__ == "__main__":
    main()
