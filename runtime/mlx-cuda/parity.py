"""L1 parity on the GPU: mlx-lm 0.32.2 against `archgen logits` (generated and
monolith) on the same checkpoints, all through MLX's CUDA backend.

Runs on the GPU machine (runtime/mlx-cuda/parity.sh sets it up): python3 with
the mlx, mlx-cuda-13 and mlx-lm wheels on PYTHONPATH, the archgen binary built
on the CPU machine. One process runs mlx-lm for every case (its kernels are
compiled once); archgen runs as a subprocess per implementation and case.

Per case: `archgen init --spec S --seed 1` makes the checkpoint; the prompt is
ids (i*37+11) % vocab; the oracle protocol of docs/parity.md runs on each side;
prefill_logits, decode_logits and tokens are compared byte for byte (tensor
data, not file bytes). A case whose spec has no generated model reports the
generated side as n/a.

`generated` runs with `ARCHGEN_GPU_DECODE=1`: on the GPU its one-token
steps take the compiled decode blocks (runtime/core/src/decode.rs,
`Path::NativeFastOps`, the default on CUDA, docs/parity.md "On the GPU";
the CPU ignores the switch); `gen-eager` is the same binary with
`ARCHGEN_GPU_DECODE=0` (the eager blocks), so
`gen/eager` checks the compiled blocks against the eager ones,
`gen/mlx-lm` and `eager/mlx-lm` each against the oracle. PARITY_VARIANTS=gen-1tok adds a run with
`ARCHGEN_GPU_ONE_TOKEN_SDPA=1` (one-token attention as grouped matmuls,
compared with gen-eager); gen-pre, gen-post and gen-none compile only the
block before attention, only those after it, or none of them
(`ARCHGEN_GPU_DECODE_BLOCKS`), each compared with gen-eager.

Usage: parity.py --archgen BIN --repo DIR --work DIR CASE...
  CASE = SPEC:L:N (prompt length, decode steps); SPEC is specs/SPEC.yaml or a
  reduced real-width spec from EXTRA_SPECS below.
  --keep: keep checkpoints (default: delete each after its case).
Prints one line per case, starting `parity spec=`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

# Reduced-layer specs at real width that are not in specs/ (no generated model
# exists for them; the monolith and mlx-lm are compared). Written next to a
# copy of specs/ so that `derive.from` finds the parent.
EXTRA_SPECS = {
    "gemma4-12b-l6-q4": """format_version: 1
identity:
  name: gemma4-12b-l6-q4
derive:
  from: gemma4-12b-l6
  reduce: null
  quantization:
    default: {bits: 4, group_size: 64, mode: affine}
    overrides: {}
  kv_quantization: null
""",
    "qwen3-8b-l4": """format_version: 1
identity:
  name: qwen3-8b-l4
derive:
  from: qwen3-8b
  reduce:
    num_hidden_layers: 4
    hidden_size: 4096
    vocab_size: 151936
    num_attention_heads: 32
    num_key_value_heads: 8
    head_dim: 128
    intermediate_size: 12288
  quantization: null
""",
    "qwen3-8b-l4-q4": """format_version: 1
identity:
  name: qwen3-8b-l4-q4
derive:
  from: qwen3-8b-l4
  reduce: null
  quantization:
    default: {bits: 4, group_size: 64, mode: affine}
    overrides: {}
""",
    "llama-3.2-3b-l4-q4": """format_version: 1
identity:
  name: llama-3.2-3b-l4-q4
derive:
  from: llama-3.2-3b
  reduce:
    num_hidden_layers: 4
    hidden_size: 3072
    vocab_size: 128256
    num_attention_heads: 24
    num_key_value_heads: 8
    head_dim: 128
    intermediate_size: 8192
  quantization:
    default: {bits: 4, group_size: 64, mode: affine}
    overrides: {}
""",
}


def tensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype, shape, raw data bytes) of a safetensors file."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = (meta["dtype"], meta["shape"], data[8 + n + a:8 + n + b])
    return out


def compare(a: Path, b: Path) -> str:
    """IDENTICAL, or where the first difference is (tensor, row, count)."""
    ta, tb = tensors(a), tensors(b)
    diffs = []
    for name in ("prefill_logits", "decode_logits", "tokens"):
        (da, sa, xa), (db, sb, xb) = ta[name], tb[name]
        if (da, sa) != (db, sb):
            diffs.append(f"{name} {da}{sa} vs {db}{sb}")
            continue
        if xa == xb:
            continue
        rows = sa[0] if sa else 1
        width = len(xa) // max(rows, 1)
        bad = [r for r in range(rows) if xa[r * width:(r + 1) * width] != xb[r * width:(r + 1) * width]]
        diffs.append(f"{name} differs in {len(bad)}/{rows} rows from row {bad[0]}")
    return "IDENTICAL" if not diffs else "DIFF(" + "; ".join(diffs) + ")"


# name -> (archgen --impl, extra environment)
IMPLS = {
    "generated": ("generated", {"ARCHGEN_GPU_DECODE": "1"}),
    "monolith": ("monolith", {}),
    "gen-eager": ("generated", {"ARCHGEN_GPU_DECODE": "0"}),
    "gen-1tok": ("generated", {"ARCHGEN_GPU_DECODE": "1", "ARCHGEN_GPU_ONE_TOKEN_SDPA": "1"}),
    # Bisection of the GPU path (decode.rs `ARCHGEN_GPU_DECODE_BLOCKS`): only
    # the block before attention compiled, only those after it, or none (the
    # path's rows form, run eagerly).
    "gen-pre": ("generated", {"ARCHGEN_GPU_DECODE": "1", "ARCHGEN_GPU_DECODE_BLOCKS": "pre"}),
    "gen-post": ("generated", {"ARCHGEN_GPU_DECODE": "1", "ARCHGEN_GPU_DECODE_BLOCKS": "post"}),
    "gen-none": ("generated", {"ARCHGEN_GPU_DECODE": "1", "ARCHGEN_GPU_DECODE_BLOCKS": "none"}),
}


def run(cmd: list[str], env=None) -> tuple[int, str]:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return p.returncode, (p.stdout + p.stderr).strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archgen", required=True)
    ap.add_argument("--repo", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()

    sys.path.insert(0, str(a.repo / "tests/python"))
    import mlx.core as mx
    from oracle_logits import load, read_kv_config, run_protocol, write

    print(f"mlx {mx.__version__} default device {mx.default_device()}", flush=True)
    specs = a.work / "specs"
    if not specs.exists():
        shutil.copytree(a.repo / "specs", specs)
        for name, text in EXTRA_SPECS.items():
            (specs / f"{name}.yaml").write_text(text)
    for case in a.cases:
        spec, L, N = case.split(":")
        L, N = int(L), int(N)
        d = a.work / spec
        model = d / "model"
        t0 = time.time()
        if not (model / "config.json").exists():
            rc, out = run([a.archgen, "init", "--spec", str(specs / f"{spec}.yaml"),
                           "--out", str(model), "--seed", "1"])
            if rc != 0:
                print(f"parity spec={spec} INIT FAILED: {out[-600:]}", flush=True)
                continue
        config = json.loads((model / "config.json").read_text())
        vocab = config.get("text_config", config)["vocab_size"]
        ids = [(i * 37 + 11) % vocab for i in range(L)]
        ids_arg = ",".join(map(str, ids))
        result = {}
        names = ["generated", "monolith", "gen-eager"] + \
            [v for v in os.environ.get("PARITY_VARIANTS", "").split(",") if v]
        for name in names:
            impl, extra = IMPLS[name]
            out_file = d / f"{name}.safetensors"
            rc, out = run([a.archgen, "logits", "--model", str(model), "--prompt-ids", ids_arg,
                           "--decode-steps", str(N), "--impl", impl, "--out", str(out_file)],
                          env={**os.environ, **extra})
            if rc != 0:
                result[name] = "n/a (no generated model)" if "no generated model" in out \
                    else "ERROR: " + out.splitlines()[-1][-300:]
            else:
                # MLX's CUDA backend reports some failures on stderr and goes
                # on (e.g. "Failed to initialize the TMA descriptor"): keep them.
                said = sorted({line.strip()[:200] for line in out.splitlines()
                               if "rror" in line and not line.startswith("archgen:")})
                if said:
                    print(f"parity spec={spec} {name} stderr: " + " | ".join(said[:3]), flush=True)
        oracle = d / "mlx_lm.safetensors"
        try:
            tensors_, _ = run_protocol(load(model), ids, N, read_kv_config(model))
            write(oracle, tensors_, ids, N)
            mx.clear_cache()
        except Exception as e:  # report and go on: one case must not hide the rest
            result["mlx-lm"] = f"ERROR: {type(e).__name__}: {str(e)[:300]}"
        pairs = [("gen/mlx-lm", "generated", "mlx-lm"), ("mono/mlx-lm", "monolith", "mlx-lm"),
                 ("gen/mono", "generated", "monolith"), ("gen/eager", "generated", "gen-eager"),
                 ("eager/mlx-lm", "gen-eager", "mlx-lm")]
        for variant in ("gen-1tok", "gen-pre", "gen-post", "gen-none"):
            if variant in names:
                pairs.append((f"{variant[4:]}/eager", variant, "gen-eager"))
        files = {name: d / f"{name}.safetensors" for name in names}
        files["mlx-lm"] = oracle
        parts = []
        for label, x, y in pairs:
            if x in result or y in result:
                parts.append(f"{label}={result.get(x) or result.get(y)}")
            else:
                parts.append(f"{label}={compare(files[x], files[y])}")
        if spec in os.environ.get("REPEAT", "").split(","):
            # Run-to-run: the monolith and generated again, same checkpoint.
            for impl in ("monolith", "generated"):
                again = d / f"{impl}-again.safetensors"
                rc, out = run([a.archgen, "logits", "--model", str(model), "--prompt-ids", ids_arg,
                               "--decode-steps", str(N), "--impl", impl, "--out", str(again)])
                if rc == 0 and impl not in result:
                    parts.append(f"{impl}/again={compare(files[impl], again)}")
        print(f"parity spec={spec} L={L} N={N} " + " ".join(parts)
              + f" ({time.time() - t0:.0f} s)", flush=True)
        if not a.keep:
            shutil.rmtree(model, ignore_errors=True)


if __name__ == "__main__":
    main()
