"""Build a checkpoint and the mlx-lm reference logits for each job of a batch:
the Rust parity test derives one job per tiny spec in specs/ (config.json from
the spec, weights random but deterministic), so generated models, the monolith
and mlx-lm are compared on exactly the structure each spec declares.

Usage: spec_cases.py JOBS.json
JOBS.json: [{"config": {...}, "out": DIR, "seed": S, "dtype": "bfloat16",
             "bits": null|B, "group_size": null|G, "mode_overrides": null|{path: {...}},
             "kv_quant": null|{"layer": [bits, group]},
             "mixed_kv": null|{"layers": {"layer": [bits, group]}, "quantized_kv_start": S},
             "prompt_ids": [...], "decode_steps": N}]
Writes DIR/model/ (checkpoint, plus kv_config.json when kv_quant or mixed_kv, and
kv_scheme.json when mixed_kv) and DIR/oracle.safetensors (prefill_logits,
decode_logits, tokens).

A job with mixed_kv is an L2 job: its reference is mlx-optiq's install_mixed_kv on
mlx-lm (optiq_oracle.py), which patches mlx-lm process-wide, so a batch holds L2
jobs only or none (the Rust test spawns one process per tier).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compat  # noqa: E402
from make_checkpoint import write_checkpoint  # noqa: E402
from oracle_logits import load, read_kv_config, run_protocol, write, write_kv_config  # noqa: E402
import optiq_oracle  # noqa: E402


def main() -> None:
    compat.apply()
    jobs = json.loads(Path(sys.argv[1]).read_text())
    tiers = {bool(job.get("mixed_kv")) for job in jobs}
    if len(tiers) > 1:
        raise SystemExit("spec_cases.py: a batch mixes L1 and L2 (mixed_kv) jobs; "
                         "mlx-optiq patches mlx-lm process-wide, so run them in two batches")
    for job in jobs:
        out = Path(job["out"])
        model_dir = out / "model"
        write_checkpoint(job["config"], model_dir, job["seed"], job["dtype"],
                         job.get("bits"), job.get("group_size"),
                         mode_overrides=job.get("mode_overrides"))
        if job.get("kv_quant"):
            kv = {int(k): (v[0], v[1]) for k, v in job["kv_quant"].items()}
            write_kv_config(model_dir, kv)
        mixed = job.get("mixed_kv")
        if mixed:
            kv = {int(k): (v[0], v[1]) for k, v in mixed["layers"].items()}
            start = int(mixed["quantized_kv_start"])
            write_kv_config(model_dir, kv)
            optiq_oracle.write_kv_scheme(model_dir, start)
            tensors, _, converted = optiq_oracle.run_protocol_optiq(
                load(model_dir), job["prompt_ids"], job["decode_steps"],
                read_kv_config(model_dir), optiq_oracle.read_kv_scheme(model_dir))
            if converted != sorted(kv):
                raise SystemExit(f"{out}: optiq converted layers {converted}, "
                                 f"kv_config lists {sorted(kv)}")
            write(out / "oracle.safetensors", tensors, job["prompt_ids"], job["decode_steps"])
            continue
        tensors, _ = run_protocol(load(model_dir), job["prompt_ids"], job["decode_steps"],
                                  read_kv_config(model_dir))
        write(out / "oracle.safetensors", tensors, job["prompt_ids"], job["decode_steps"])


if __name__ == "__main__":
    main()
