"""Build a tiny random-weight checkpoint in the mlx-community layout, for any
model_type mlx-lm has (Gemma-4, qwen3, llama, and qwen2, gemma2, gemma3_text, gemma3,
qwen3_moe, minicpm, mistral, lfm2, qwen3_5, qwen3_next: mlx-lm's own Model class is instantiated from config.json).

The checkpoint is written by mlx-lm's own convert-path functions
(`quantize_model`, `save_model`, `save_config`), so the tensor names, dtypes,
sharding index and the `quantization` dict in config.json are exactly what
`mlx_lm.convert` would produce for a real model with this config.

Usage:
  make_checkpoint.py --config CONFIG.json --out DIR [--seed S]
      [--dtype bfloat16|float16|float32] [--quantize BITS --group-size G]
      [--shards N]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm import utils as mlx_utils

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}


def refuse_unloadable(config: dict) -> None:
    """Configs whose checkpoint mlx-lm 0.32.2 could not load back."""
    if config.get("model_type") == "minicpm" and config.get("tie_word_embeddings", False):
        # minicpm.sanitize always adds lm_head.weight (a copy of the
        # embedding) but a tied Model has no lm_head: load_model's strict
        # load_weights then fails. Untied with no lm_head in the checkpoint is
        # how mlx-lm runs a tied MiniCPM.
        raise ValueError("config.json: minicpm with tie_word_embeddings=true cannot be loaded "
                         "by mlx-lm 0.32.2 (its sanitize adds lm_head.weight, which a tied "
                         "model lacks); set tie_word_embeddings to false")


def build_model(config: dict) -> nn.Module:
    """Instantiate the architecture exactly as mlx_lm.utils.load_model does.

    Note: gemma4.ModelArgs mutates config["text_config"] in place (vocab_size,
    default head counts); convert saves that mutated dict, and so do we.
    """
    refuse_unloadable(config)
    model_class, args_class = mlx_utils._get_classes(config=config)
    model = model_class(args_class.from_dict(config))
    # gemma3_text.sanitize ties the head when the checkpoint has no
    # lm_head.weight, as the published ones have none: write it so (an
    # explicit tie_word_embeddings: false keeps lm_head). The gemma3 wrapper
    # holds the same text model under language_model.
    model_type = config.get("model_type")
    if model_type in ("gemma3_text", "gemma3") and text_config_of(config).get("tie_word_embeddings", True):
        text_model = model.language_model if model_type == "gemma3" else model
        text_model.tie_word_embeddings = True
        text_model.pop("lm_head")
    model.eval()
    return model


def _init_array(name: str, shape: tuple[int, ...], rng: np.random.RandomState,
                text_cfg: dict) -> np.ndarray:
    """Random values chosen so every parameter visibly affects the logits."""
    if name.endswith("e_score_correction_bias"):
        # glm4_moe's routing correction (float32, added to sigmoid scores in
        # (0, 1) for the choice only): small enough that the scores still
        # decide, large enough to change some choices.
        return rng.uniform(-0.2, 0.2, size=shape)
    if name.endswith(".bias"):
        # Linear biases (qwen2's q/k/v): centred, so they do not push every
        # query and key the same way and flatten the attention.
        return rng.uniform(-0.5, 0.5, size=shape)
    if len(shape) == 1:
        # Norm weights, layer_scalar, router.scale, router.per_expert_scale:
        # away from 1 (and from 0) so a missed or doubled multiply shows up.
        return rng.uniform(0.5, 1.5, size=shape)
    if name.endswith("embed_tokens_per_layer.weight"):
        # Scaled by sqrt(P) in the forward -> unit RMS.
        std = 1.0 / math.sqrt(text_cfg["hidden_size_per_layer_input"])
    elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
        # embed is scaled by sqrt(hidden) in the forward; 0.5 keeps the
        # (tied or untied) head's logits at a few units so the tanh softcap
        # is non-linear.
        std = 0.5
    else:
        # Linear / SwitchLinear [.., out, in]: unit-variance outputs.
        std = 1.0 / math.sqrt(shape[-1])
    return rng.normal(0.0, std, size=shape)


def text_config_of(config: dict) -> dict:
    return config.get("text_config", config)


def init_weights(model: nn.Module, config: dict, seed: int, dtype: mx.Dtype) -> None:
    rng = np.random.RandomState(seed)
    text_cfg = text_config_of(config)
    params = dict(tree_flatten(model.parameters()))
    # mlx_lm.convert keeps the parameters its model's cast_predicate refuses
    # (qwen3_5: A_log) in float32; models without one cast everything.
    cast_predicate = getattr(model, "cast_predicate", lambda _: True)
    new = []
    for name in sorted(params):  # sorted: independent of module traversal order
        v = params[name]
        arr = _init_array(name, tuple(v.shape), rng, text_cfg).astype(np.float32)
        # Cast like mlx_lm.convert's set_dtype: every floating param to dtype.
        new.append((name, mx.array(arr).astype(dtype if cast_predicate(name) else mx.float32)))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


def _split_shards(weights: dict, n: int) -> list[dict]:
    """Split, in mlx-lm's insertion order, into n contiguous non-empty shards."""
    items = list(weights.items())
    if not 1 <= n <= len(items):
        raise ValueError(f"--shards {n} not in 1..{len(items)} (tensor count)")
    bounds = [len(items) * i // n for i in range(n + 1)]
    return [dict(items[bounds[i]:bounds[i + 1]]) for i in range(n)]


def write_checkpoint(config: dict, out: Path, seed: int, dtype: str = "bfloat16",
                     bits: Optional[int] = None, group_size: Optional[int] = None,
                     shards: int = 1, mode_overrides: Optional[dict] = None) -> dict:
    """Returns the config as written to config.json.

    mode_overrides: {module path: {"group_size", "bits", "mode"}} for modules
    quantized in another mode than the affine default (mlx-community's
    gpt-oss experts in mxfp4); every other module keeps the model's own
    quant_predicate.
    """
    config = copy.deepcopy(config)
    model = build_model(config)
    init_weights(model, config, seed, DTYPES[dtype])
    if bits is not None:
        # Same call as mlx_lm.convert(quantize=True): the model's own
        # quant_predicate (gemma4: router.proj -> 8-bit g64) is picked up.
        predicate = None
        if mode_overrides:
            own = getattr(model, "quant_predicate", None)

            def predicate(path, module):
                if path in mode_overrides:
                    return dict(mode_overrides[path])
                return own(path, module) if own is not None else True
        with contextlib.redirect_stdout(sys.stderr):  # keep stdout clean
            model, config = mlx_utils.quantize_model(model, config, group_size,
                                                     bits, mode="affine",
                                                     quant_predicate=predicate)
    out.mkdir(parents=True, exist_ok=True)
    if shards > 1:
        # mlx-lm shards only past 5 GB; patch its splitter so a tiny model
        # still gets the authentic model-0000i-of-0000N + index layout.
        orig = mlx_utils.make_shards
        mlx_utils.make_shards = lambda w, *a, **k: _split_shards(w, shards)
        try:
            mlx_utils.save_model(out, model)
        finally:
            mlx_utils.make_shards = orig
    else:
        mlx_utils.save_model(out, model)
    mlx_utils.save_config(config, config_path=out / "config.json")
    with open(out / "config.json") as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    p.add_argument("--quantize", type=int, default=None, metavar="BITS")
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--shards", type=int, default=1)
    a = p.parse_args()
    with open(a.config) as f:
        config: dict[str, Any] = json.load(f)
    write_checkpoint(config, a.out, a.seed, a.dtype, a.quantize,
                     a.group_size if a.quantize else None, a.shards)


if __name__ == "__main__":
    main()
