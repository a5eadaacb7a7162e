"""Reference logits from mlx-lm 0.32.2 (the contract `archgen logits` implements).

Protocol (batch 1, fresh cache from model.make_cache()):
  prefill: ONE forward over the whole prompt [1, L] int32 -> prefill_logits [L, V]
  decode:  N steps; step i feeds ONE token [1, 1] int32 = argmax of the previous
           logits row (step 0: argmax of the last prefill row), same cache
           -> decode_logits [N, V], tokens [N] int32.
Logits stay in the model's compute dtype (bf16 for bf16 weights); no casts.

Usage: oracle_logits.py --model DIR --prompt-ids 1,2,3 --decode-steps N --out FILE
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

import compat


def load(model_dir: Path) -> nn.Module:
    # load_model = mlx_lm.load minus the tokenizer (same sanitize/quantize path).
    compat.apply()  # see compat.py: needed only for quantized MoE
    model, _ = load_model(Path(model_dir))
    return model


def run_protocol(model: nn.Module, prompt_ids: list[int], decode_steps: int
                 ) -> tuple[dict[str, mx.array], list[Any]]:
    """Returns the three oracle tensors and the final cache (for self-checks)."""
    if not prompt_ids:
        raise ValueError("prompt must have at least one token")
    cache = make_prompt_cache(model)  # == model.make_cache() for gemma4
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
    tensors, _ = run_protocol(load(a.model), ids, a.decode_steps)
    write(a.out, tensors, ids, a.decode_steps)


if __name__ == "__main__":
    main()
