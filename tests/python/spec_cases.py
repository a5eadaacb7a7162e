"""Build a checkpoint and the mlx-lm reference logits for each job of a batch:
the Rust parity test derives one job per tiny spec in specs/ (config.json from
the spec, weights random but deterministic), so generated models, the monolith
and mlx-lm are compared on exactly the structure each spec declares.

Usage: spec_cases.py JOBS.json
JOBS.json: [{"config": {...}, "out": DIR, "seed": S, "dtype": "bfloat16",
             "bits": null|B, "group_size": null|G, "kv_quant": null|{"layer": [bits, group]},
             "prompt_ids": [...], "decode_steps": N}]
Writes DIR/model/ (checkpoint, plus kv_config.json when kv_quant) and
DIR/oracle.safetensors (prefill_logits, decode_logits, tokens).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compat  # noqa: E402
from make_checkpoint import write_checkpoint  # noqa: E402
from oracle_logits import load, read_kv_config, run_protocol, write, write_kv_config  # noqa: E402


def main() -> None:
    compat.apply()
    jobs = json.loads(Path(sys.argv[1]).read_text())
    for job in jobs:
        out = Path(job["out"])
        model_dir = out / "model"
        write_checkpoint(job["config"], model_dir, job["seed"], job["dtype"],
                         job.get("bits"), job.get("group_size"))
        if job.get("kv_quant"):
            kv = {int(k): (v[0], v[1]) for k, v in job["kv_quant"].items()}
            write_kv_config(model_dir, kv)
        tensors, _ = run_protocol(load(model_dir), job["prompt_ids"], job["decode_steps"],
                                  read_kv_config(model_dir))
        write(out / "oracle.safetensors", tensors, job["prompt_ids"], job["decode_steps"])


if __name__ == "__main__":
    main()
