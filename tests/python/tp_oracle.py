"""mlx-lm 0.32.2's own tensor-parallel model: the oracle of `archgen launch`.

Run under mlx.launch (every rank runs this script):

    mlx.launch --backend ring -n 2 --starting-port P -- python tp_oracle.py --jobs JOBS.json

JOBS.json is a list of {"model": DIR, "prompt_ids": [..], "decode_steps": N,
"out": FILE}: one launch serves a batch of checkpoints. Each is loaded as
mlx_lm.utils.sharded_load loads it (load_model lazily and non-strict,
`model.shard(group)`, then `mx.eval(model.parameters())` and one all_sum to
synchronise), and runs the logits protocol of oracle_logits.py (one prefill
forward, greedy one-token steps on the same cache). Every rank runs every
forward (the all_sums need them); rank 0 alone writes FILE.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model

import compat
from oracle_logits import run_protocol, write


def sharded(model_dir: Path, group: mx.distributed.Group):
    compat.apply()
    model, _ = load_model(Path(model_dir), lazy=True, strict=False)
    if not hasattr(model, "shard"):
        raise SystemExit(f"{model_dir}: mlx-lm has no shard() for this model type")
    model.shard(group)
    mx.eval(model.parameters())
    mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu))
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", required=True, type=Path)
    a = p.parse_args()
    group = mx.distributed.init(strict=True, backend="ring")
    with open(a.jobs) as f:
        jobs = json.load(f)
    for job in jobs:
        model = sharded(Path(job["model"]), group)
        ids = [int(t) for t in job["prompt_ids"]]
        steps = int(job["decode_steps"])
        tensors, _ = run_protocol(model, ids, steps)
        if group.rank() == 0:
            write(Path(job["out"]), tensors, ids, steps)
    print(f"tp_oracle: rank {group.rank()} of {group.size()}: {len(jobs)} checkpoints done",
          flush=True)


if __name__ == "__main__":
    main()
