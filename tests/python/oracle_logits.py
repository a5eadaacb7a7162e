"""Reference logits from mlx-lm 0.32.2 (the contract `archgen logits` implements).

Protocol (batch 1, fresh cache from model.make_cache()):
  prefill: ONE forward over the whole prompt [1, L] int32 -> prefill_logits [L, V]
  decode:  N steps; step i feeds ONE token [1, 1] int32 = argmax of the previous
           logits row (step 0: argmax of the last prefill row), same cache
           -> decode_logits [N, V], tokens [N] int32.
Logits stay in the model's compute dtype (bf16 for bf16 weights); no casts.

KV-cache quantization: when the model directory has an mlx-optiq style
kv_config.json ([{"layer_idx": i, "bits": b, "group_size": g}]), the KVCache of
each listed layer is replaced by mlx-lm's QuantizedKVCache(group_size=g, bits=b)
before the prefill (what KVCache.to_quantized returns for an empty cache), so
mlx-lm's attention takes quantized_scaled_dot_product_attention there. Only
full-attention layers that no KV-shared layer reads can be listed: mlx-lm has
no quantized RotatingKVCache, and a sharer of a quantized donor would crash.

Usage: oracle_logits.py --model DIR --prompt-ids 1,2,3 --decode-steps N --out FILE
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache
from mlx_lm.utils import load_model

import compat


def load(model_dir: Path) -> nn.Module:
    # load_model = mlx_lm.load minus the tokenizer (same sanitize/quantize path).
    compat.apply()  # see compat.py: needed only for quantized MoE
    model, _ = load_model(Path(model_dir))
    return model


KV_CONFIG = "kv_config.json"


def read_kv_config(model_dir: Path) -> Optional[dict[int, tuple[int, int]]]:
    """{layer_idx: (bits, group_size)} from DIR/kv_config.json, or None."""
    path = Path(model_dir) / KV_CONFIG
    if not path.is_file():
        return None
    with open(path) as f:
        entries = json.load(f)
    # mlx-optiq's default group size is 64 (QuantizedKVCache's default too).
    return {int(e["layer_idx"]): (int(e["bits"]), int(e.get("group_size", 64)))
            for e in entries}


def write_kv_config(model_dir: Path, kv_quant: dict[int, tuple[int, int]]) -> None:
    with open(Path(model_dir) / KV_CONFIG, "w") as f:
        json.dump([{"layer_idx": i, "bits": b, "group_size": g}
                   for i, (b, g) in sorted(kv_quant.items())], f, indent=2)


def run_protocol(model: nn.Module, prompt_ids: list[int], decode_steps: int,
                 kv_quant: Optional[dict[int, tuple[int, int]]] = None
                 ) -> tuple[dict[str, mx.array], list[Any]]:
    """Returns the three oracle tensors and the final cache (for self-checks)."""
    if not prompt_ids:
        raise ValueError("prompt must have at least one token")
    cache = make_prompt_cache(model)  # == model.make_cache() for gemma4
    for i, (bits, group_size) in sorted((kv_quant or {}).items()):
        if i >= len(cache) or type(cache[i]) is not KVCache:
            raise ValueError(f"kv_config: layer {i} has no KVCache (sliding or KV-shared); "
                             "mlx-lm can quantize only full-attention caches")
        cache[i] = cache[i].to_quantized(group_size=group_size, bits=bits)
    x = mx.array(prompt_ids, dtype=mx.int32)[None]
    logits = model(x, cache=cache)[0]  # [L, V]
    mx.eval(logits, [c.state for c in cache])
    prefill = logits
    last = logits[-1]
    rows, toks = [], []
    for _ in range(decode_steps):
        # mx.argmax: first index among equal maxima.
        tok = int(mx.argmax(last, axis=-1).item())
        toks.append(tok)
        out = model(mx.array([[tok]], dtype=mx.int32), cache=cache)[0, -1]  # [V]
        mx.eval(out, [c.state for c in cache])
        rows.append(out)
        last = out
    vocab = prefill.shape[-1]
    decode = mx.stack(rows) if rows else mx.zeros((0, vocab), dtype=prefill.dtype)
    tensors = {
        "prefill_logits": prefill,
        "decode_logits": decode,
        "tokens": mx.array(toks, dtype=mx.int32),
    }
    mx.eval(tensors)
    return tensors, cache


def write(path: Path, tensors: dict[str, mx.array], prompt_ids: list[int],
          decode_steps: int) -> None:
    meta = {
        "prompt_ids": ",".join(map(str, prompt_ids)),
        "decode_steps": str(decode_steps),
        "mlx": mx.__version__,
        "device": "gpu" if mx.default_device().type == mx.gpu else "cpu",
    }
    mx.save_safetensors(str(path), tensors, metadata=meta)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--prompt-ids", required=True,
                   help="comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--decode-steps", type=int, default=0)
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args()
    ids = [int(t) for t in a.prompt_ids.split(",") if t.strip()]
    tensors, _ = run_protocol(load(a.model), ids, a.decode_steps, read_kv_config(a.model))
    write(a.out, tensors, ids, a.decode_steps)


if __name__ == "__main__":
    main()
