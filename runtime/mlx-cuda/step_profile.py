"""Kernels of one decode step on the GPU, archgen against mlx-lm, through
Nsight Compute (`ncu`) on the GPU machine (parity.sh step `profile`).

Each side runs a few greedy steps (--steps) on a checkpoint under ncu, every
kernel timed (`gpu__time_duration.sum`, clocks left alone). Greedy sampling
ends each step with one argmax kernel, so the kernels between two argmaxes
after the prefill are one decode step: how many launch, and how long the
GPU is busy with them (the median step). Without ncu, a longer run gives the
step's wall time (the median interval between two tokens), so

    idle share = 1 - busy / wall

is the part of a step in which the GPU runs no kernel of it: launch gaps,
host work the pipelining does not hide, synchronisation.

ncu runs each kernel alone and flushes the caches before it, so `busy` is
the sum of isolated, cold kernel times: an upper bound of what the kernels
take in the stream (a small kernel's fixed cost counts in full), not a
measurement of it. Loading a 24 GB checkpoint under ncu takes minutes: keep
--steps small.

Usage (on the GPU machine, LD_LIBRARY_PATH/PYTHONPATH as parity.sh sets):
  step_profile.py --archgen BIN --model DIR --vocab V [--steps 3]
Prints per side: kernels per step, busy ms per step, wall ms per step, idle
share, and the kernels that take the most time per step.
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


def kernels(cmd: list[str], ncu: str, log: Path) -> list[tuple[str, float]]:
    """(kernel name, duration ns) of every kernel the command launched, in order."""
    full = [ncu, "--clock-control", "none", "--metrics", "gpu__time_duration.sum",
            "--csv", "--print-units", "base", "--target-processes", "all"] + cmd
    out = subprocess.run(full, capture_output=True, text=True)
    log.write_text(out.stdout + "\n--- stderr ---\n" + out.stderr)
    rows = [line for line in out.stdout.splitlines() if line.startswith('"')]
    return [(row["Kernel Name"], float(row["Metric Value"].replace(",", "")))
            for row in csv.DictReader(io.StringIO("\n".join(rows)))
            if row.get("Metric Name") == "gpu__time_duration.sum"]


def steps_of(launched: list[tuple[str, float]]) -> list[list[tuple[str, float]]]:
    """The kernels between consecutive argmax kernels: one decode step each."""
    ends = [i for i, (name, _) in enumerate(launched) if "ArgMax" in name]
    return [launched[a + 1:b + 1] for a, b in zip(ends, ends[1:])]


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
    p.add_argument("--steps", type=int, default=3)
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
        launched = kernels(command(side, a.archgen, a.model, prompt, a.steps), ncu,
                           a.logs / f"ncu-{name}-{side}.log")
        steps = steps_of(launched)
        if not steps:
            print(f"profile {name} {side}: no two argmax kernels among {len(launched)} kernels")
            continue
        busy_of = lambda step: sum(ns for _, ns in step) / 1e6
        step = sorted(steps, key=busy_of)[len(steps) // 2]
        busy = busy_of(step)
        wall = wall_ms(command(side, a.archgen, a.model, prompt, a.wall_steps), a.wall_steps)
        idle = f"{1 - busy / wall:.1%}" if wall else "?"
        print(f"profile {name} {side}: {len(step)} kernels/step, busy {busy:.2f} ms/step "
              f"(ncu, isolated kernels), wall {wall if wall is None else round(wall, 2)} ms/step, "
              f"idle share {idle}; {len(steps)} steps of {len(launched)} kernels ({time.time() - t:.0f} s)")
        groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for k, ns in step:
            g = k.replace("void ", "").split("<")[0].split("(")[0][:60]
            groups[g][0] += 1
            groups[g][1] += ns / 1e6
        for g, (n, ms) in sorted(groups.items(), key=lambda kv: -kv[1][1])[: a.top]:
            print(f"  {ms:7.3f} ms  {n:6.0f}x  {g}")


if __name__ == "__main__":
    main()
