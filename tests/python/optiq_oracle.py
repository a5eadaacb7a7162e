"""The L2 oracle: mlx-optiq 0.7.7's per-layer mixed-precision KV cache on mlx-lm 0.32.2.

mlx-optiq applies a kv_config.json with `install_mixed_kv(kv_configs,
quantized_kv_start)` (optiq/serve.py; the path of `optiq eval --kv-config` and
`optiq serve --kv-config --no-fused-kv`). It replaces mlx-lm's
`generate.maybe_quantize_kv_cache`, the hook mlx-lm calls after every model
call, by one that converts each listed layer's filled cache, once its offset is
at least `quantized_kv_start`, with `quantize_cache_layer`: a `KVCache` becomes
a `QuantizedKVCache` holding `mx.quantize` of the whole key and value buffers
(optiq/runtime/kv/rotating.py). So the prefill that fills a cache runs with
unquantized K/V, and the steps after the conversion go through mlx-lm's
`quantized_scaled_dot_product_attention`. stock mlx-lm has no such cache: this
is archgen's tier L2.

Protocol: the logits protocol of docs/parity.md §2 (one prefill forward, then
one-token decode steps, greedy), with optiq's hook called after every forward,
as mlx-lm's generate_step does. The hook is optiq's own function, taken from
`sys.modules["mlx_lm.generate"]` after `install_mixed_kv`; nothing of it is
re-implemented here.

Usage: optiq_oracle.py --model DIR --prompt-ids 1,2,3 --decode-steps N --out FILE
(DIR holds kv_config.json and kv_scheme.json, see read_kv_scheme).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_logits import load, read_kv_config, write  # noqa: E402

KV_SCHEME = "kv_scheme.json"
OPTIQ_SCHEME = "mlx-optiq install_mixed_kv"


def read_kv_scheme(model_dir: Path) -> int:
    """quantized_kv_start from DIR/kv_scheme.json, which archgen writes next to
    kv_config.json to say the config is applied as mlx-optiq applies it."""
    with open(Path(model_dir) / KV_SCHEME) as f:
        scheme = json.load(f)
    if scheme.get("scheme") != OPTIQ_SCHEME:
        raise ValueError(f"{KV_SCHEME}: scheme must be {OPTIQ_SCHEME!r}, found {scheme!r}")
    return int(scheme["quantized_kv_start"])


def write_kv_scheme(model_dir: Path, quantized_kv_start: int) -> None:
    with open(Path(model_dir) / KV_SCHEME, "w") as f:
        json.dump({"scheme": OPTIQ_SCHEME, "quantized_kv_start": quantized_kv_start},
                  f, indent=2)


def install(kv_quant: dict[int, tuple[int, int]], quantized_kv_start: int):
    """optiq's install_mixed_kv for this bit map; returns the hook it installed."""
    from optiq.serve import _LayerQuantConfig, install_mixed_kv

    configs = [_LayerQuantConfig(layer_idx=i, bits=b, group_size=g)
               for i, (b, g) in sorted(kv_quant.items())]
    install_mixed_kv(kv_configs=configs, quantized_kv_start=quantized_kv_start)
    return sys.modules["mlx_lm.generate"].maybe_quantize_kv_cache


def run_protocol_optiq(model: nn.Module, prompt_ids: list[int], decode_steps: int,
                       kv_quant: dict[int, tuple[int, int]], quantized_kv_start: int
                       ) -> tuple[dict[str, mx.array], list[Any], list[int]]:
    """The three oracle tensors, the final cache and the layers optiq converted."""
    if not prompt_ids:
        raise ValueError("prompt must have at least one token")
    hook = install(kv_quant, quantized_kv_start)
    cache = make_prompt_cache(model)
    for i in kv_quant:
        if i >= len(cache) or type(cache[i]) is not KVCache:
            raise ValueError(f"kv_config: layer {i} has no KVCache; archgen's L2 covers "
                             "full-attention layers that own a cache")
    # mlx-lm passes its own kv_group_size / kv_bits; optiq's hook ignores them.
    def forward(x):
        out = model(x, cache=cache)
        hook(cache, quantized_kv_start, 64, max(b for b, _ in kv_quant.values()))
        return out

    logits = forward(mx.array(prompt_ids, dtype=mx.int32)[None])[0]
    mx.eval(logits, [c.state for c in cache])
    prefill, last = logits, logits[-1]
    rows, toks = [], []
    for _ in range(decode_steps):
        tok = int(mx.argmax(last, axis=-1).item())
        toks.append(tok)
        out = forward(mx.array([[tok]], dtype=mx.int32))[0, -1]
        mx.eval(out, [c.state for c in cache])
        rows.append(out)
        last = out
    vocab = prefill.shape[-1]
    decode = mx.stack(rows) if rows else mx.zeros((0, vocab), dtype=prefill.dtype)
    tensors = {"prefill_logits": prefill, "decode_logits": decode,
               "tokens": mx.array(toks, dtype=mx.int32)}
    mx.eval(tensors)
    converted = [i for i, c in enumerate(cache) if isinstance(c, QuantizedKVCache)]
    return tensors, cache, converted


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--prompt-ids", required=True)
    p.add_argument("--decode-steps", type=int, default=0)
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args()
    ids = [int(t) for t in a.prompt_ids.split(",") if t.strip()]
    kv = read_kv_config(a.model)
    if not kv:
        raise SystemExit(f"{a.model}: no kv_config.json (the L2 oracle needs one)")
    tensors, _, _ = run_protocol_optiq(load(a.model), ids, a.decode_steps, kv,
                                       read_kv_scheme(a.model))
    write(a.out, tensors, ids, a.decode_steps)


if __name__ == "__main__":
    main()
