"""Build every oracle case and its mlx-lm reference logits.

  run_oracle.py --cases-out DIR [--only NAME[,NAME...]]
  run_oracle.py --list [--json]

Writes, per case:
  DIR/<case>/model/              checkpoint (config.json + model*.safetensors + index,
                                 + kv_config.json for KV-quantized cases)
  DIR/<case>/oracle.safetensors  prefill_logits [L,V], decode_logits [N,V], tokens [N] i32
  DIR/<case>/case.json           prompt ids, decode steps, provenance (schema in docs/parity.md)
and DIR/index.json = {"cases": [<case names>], ...}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx_lm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compat  # noqa: E402
from cases import CASES, CASES_BY_NAME, Case  # noqa: E402
from make_checkpoint import write_checkpoint  # noqa: E402
from oracle_logits import load, run_protocol, write, write_kv_config  # noqa: E402

SCHEMA_VERSION = 1


def case_json(c: Case, written_config: dict, kv_changes: Optional[bool] = None) -> dict:
    text = written_config.get("text_config", written_config)
    # Only quantized MoE forwards reach the shimmed call (compat.py).
    uses_shim = bool(text["enable_moe_block"]) and c.bits is not None
    return {
        "schema_version": SCHEMA_VERSION,
        "name": c.name,
        "model_dir": "model",
        "oracle": "oracle.safetensors",
        "prompt_ids": c.prompt_ids,
        "decode_steps": c.decode_steps,
        "dtype": c.dtype,
        "quantization": (None if c.bits is None
                         else {"bits": c.bits, "group_size": c.group_size, "mode": "affine"}),
        "shards": c.shards,
        "kv_quantization": (None if c.kv_quant is None
                            else [{"layer_idx": i, "bits": b, "group_size": g}
                                  for i, (b, g) in sorted(c.kv_quant.items())]),
        # Whether the same checkpoint without kv_config.json gives other bytes
        # (proof that the quantized path ran); null without kv_quantization.
        "kv_quant_changes_logits": kv_changes,
        "seed": c.seed,
        "sliding_window": text["sliding_window"],
        "covers": c.covers,
        "compat_shims": list(compat.ACTIVE) if uses_shim else [],
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "device": "gpu" if mx.default_device().type == mx.gpu else "cpu",
    }


def build_case(c: Case, root: Path) -> float:
    t0 = time.perf_counter()
    d = root / c.name
    if d.exists():
        shutil.rmtree(d)  # only our own per-case directory
    written = write_checkpoint(c.config, d / "model", c.seed, c.dtype, c.bits,
                               c.group_size, c.shards)
    model = load(d / "model")
    kv_changes = None
    if c.kv_quant is not None:
        write_kv_config(d / "model", c.kv_quant)
        plain, _ = run_protocol(model, c.prompt_ids, c.decode_steps)
    tensors, _ = run_protocol(model, c.prompt_ids, c.decode_steps, c.kv_quant)
    if c.kv_quant is not None:
        kv_changes = any(
            bytes(memoryview(plain[k])) != bytes(memoryview(tensors[k]))
            for k in ("prefill_logits", "decode_logits"))
        if not kv_changes:
            raise SystemExit(f"{c.name}: KV quantization left the logits unchanged")
    write(d / "oracle.safetensors", tensors, c.prompt_ids, c.decode_steps)
    with open(d / "case.json", "w") as f:
        json.dump(case_json(c, written, kv_changes), f, indent=2)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases-out", type=Path)
    p.add_argument("--only", default="", help="comma-separated case names")
    p.add_argument("--list", action="store_true")
    p.add_argument("--json", action="store_true", help="with --list: JSON output")
    a = p.parse_args()

    selected = CASES
    if a.only:
        names = [n for n in a.only.split(",") if n]
        unknown = [n for n in names if n not in CASES_BY_NAME]
        if unknown:
            p.error(f"unknown case(s): {unknown}")
        selected = [CASES_BY_NAME[n] for n in names]

    if a.list:
        if a.json:
            print(json.dumps([{"name": c.name, "covers": c.covers} for c in selected],
                             indent=2))
        else:
            for c in selected:
                print(f"{c.name:24s} {'; '.join(c.covers)}")
        return
    if a.cases_out is None:
        p.error("--cases-out DIR (or --list) is required")

    a.cases_out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    for c in selected:
        dt = build_case(c, a.cases_out)
        print(f"{c.name:24s} {dt * 1000:7.0f} ms", file=sys.stderr)
    with open(a.cases_out / "index.json", "w") as f:
        json.dump({"schema_version": SCHEMA_VERSION,
                   "cases": [c.name for c in selected]}, f, indent=2)
    print(f"{len(selected)} cases in {time.perf_counter() - t_all:.2f} s -> "
          f"{a.cases_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
