"""Kernels of one decode step on the GPU, archgen against mlx-lm, through
Nsight Compute (`ncu`) on the GPU machine (parity.sh step `profile`).

A decode step cannot be cut out of a run by kernel index reliably (loading and
prefill launch a number of kernels that depends on the checkpoint), so each
side runs twice on the same checkpoint and prompt: once with SHORT greedy
steps and once with LONG. Every kernel of both runs is timed by ncu
(`gpu__time_duration.sum`, clocks left alone); the difference of the two
runs, per kernel name, divided by LONG - SHORT, is one step's kernels: how
many launch, and how long the GPU is busy with them. Without ncu, the same
runs give the step's wall time (the median interval between two tokens over
the last steps), so

    idle share = 1 - busy / wall

is the part of a step in which the GPU runs no kernel of it: launch gaps,
host work the pipelining does not hide, synchronisation.

Each kernel runs alone under ncu (it serialises launches), so `busy` is the
sum of isolated kernel times: close to what a memory-bound kernel takes in
the stream, and an upper bound for kernels that would overlap.

Usage (on the GPU machine, LD_LIBRARY_PATH/PYTHONPATH as parity.sh sets):
  step_profile.py --archgen BIN --model DIR [--short 2 --long 6] [--csv-dir D]
Prints per side: kernels per step, busy ms per step, wall ms per step, idle
share, and the kernel names that take the most time per step.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

MLX_LM_RUNNER = r"""
import sys, time, json
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.generate import generate_step
from pathlib import Path
model, _ = load_model(Path(sys.argv[1]))
ids = mx.array([int(t) for t in sys.argv[2].split(",")], mx.int32)
steps = int(sys.argv[3])
stamps = []
for n, (tok, _) in zip(range(steps), generate_step(ids, model, max_tokens=steps)):
    stamps.append(time.perf_counter())
gaps = [b - a for a, b in zip(stamps, stamps[1:])]
print("STEP_GAPS", json.dumps(gaps))
"""


def ids(n: int, vocab: int) -> str:
    return ",".join(str((i * 37 + 11) % vocab) for i in range(n))


def command(side: str, archgen: str, model: Path, prompt: str, steps: int) -> list[str]:
    if side == "archgen":
        return [archgen, "generate", "--model", str(model), "--prompt-ids", prompt,
                "--max-tokens", str(steps), "--ignore-eos"]
    return [sys.executable, "-c", MLX_LM_RUNNER, str(model), prompt, str(steps)]


def kernels(cmd: list[str], ncu: str, log: Path) -> dict[str, list[float]]:
    """Kernel name -> durations (ns) of every kernel the command launched."""
    full = [ncu, "--clock-control", "none", "--metrics", "gpu__time_duration.sum",
            "--csv", "--print-units", "base", "--target-processes", "all"] + cmd
    out = subprocess.run(full, capture_output=True, text=True)
    log.write_text(out.stdout + "\n--- stderr ---\n" + out.stderr)
    rows = [line for line in out.stdout.splitlines() if line.startswith('"')]
    by_name: dict[str, list[float]] = defaultdict(list)
    for row in csv.DictReader(io.StringIO("\n".join(rows))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = row["Metric Value"].replace(",", "")
        by_name[row["Kernel Name"]].append(float(value))
    return by_name


def wall_ms(cmd: list[str], steps: int) -> float | None:
    """Median interval between two tokens over the run's steps (ms)."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    text = out.stdout + out.stderr
    for line in text.splitlines():
        if line.startswith("STEP_GAPS"):
            gaps = __import__("json").loads(line.split(" ", 1)[1])
            return statistics.median(gaps[len(gaps) // 4:]) * 1e3
        if "median step" in line:
            # archgen generate: "...; median step 8.880 ms (112.6 tokens/s); ..."
            return float(line.split("median step", 1)[1].split("ms", 1)[0])
    print(f"  no step times in output of {cmd[0]} (rc {out.returncode}): {text[-400:]}")
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--archgen", required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--short", type=int, default=2)
    p.add_argument("--long", type=int, default=6)
    p.add_argument("--wall-steps", type=int, default=64)
    p.add_argument("--sides", default="archgen,mlx-lm")
    p.add_argument("--logs", type=Path, default=Path("/tmp/out"))
    p.add_argument("--top", type=int, default=14)
    a = p.parse_args()
    ncu = os.environ.get("NCU", "ncu")
    prompt = ids(a.prompt, a.vocab)
    a.logs.mkdir(parents=True, exist_ok=True)
    name = a.model.name
    for side in a.sides.split(","):
        t = time.time()
        short = kernels(command(side, a.archgen, a.model, prompt, a.short), ncu,
                        a.logs / f"ncu-{name}-{side}-{a.short}.log")
        long = kernels(command(side, a.archgen, a.model, prompt, a.long), ncu,
                       a.logs / f"ncu-{name}-{side}-{a.long}.log")
        steps = a.long - a.short
        per_step = {}
        for k in set(short) | set(long):
            n = len(long.get(k, [])) - len(short.get(k, []))
            ns = sum(long.get(k, [])) - sum(short.get(k, []))
            if n or abs(ns) > 1:
                per_step[k] = (n / steps, ns / steps / 1e6)
        count = sum(n for n, _ in per_step.values())
        busy = sum(ms for _, ms in per_step.values())
        wall = wall_ms(command(side, a.archgen, a.model, prompt, a.wall_steps), a.wall_steps)
        idle = f"{1 - busy / wall:.1%}" if wall else "?"
        print(f"profile {name} {side}: {count:.0f} kernels/step, busy {busy:.2f} ms/step, "
              f"wall {wall if wall is None else round(wall, 2)} ms/step, idle share {idle}, "
              f"runs of {a.short} and {a.long} steps ({sum(map(len, long.values()))} kernels in the "
              f"longer; {time.time() - t:.0f} s)")
        groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for k, (n, ms) in per_step.items():
            g = k.split("<")[0].split("(")[0][:60]
            groups[g][0] += n
            groups[g][1] += ms
        for g, (n, ms) in sorted(groups.items(), key=lambda kv: -kv[1][1])[: a.top]:
            print(f"  {ms:7.3f} ms  {n:6.0f}x  {g}")


if __name__ == "__main__":
    main()
