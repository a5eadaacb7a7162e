"""Tiny checkpoints of the issue-#11 families, built and run by mlx-lm itself.

  family_checkpoints.py [--out DIR]

For each real config in specs/configs/ of model_type qwen2, gemma2, qwen3_moe,
mistral, minicpm, smollm3 or granite: shrink the sizes (every other field kept as published),
write a random checkpoint with make_checkpoint.write_checkpoint (mlx-lm's own
Model class, quant_predicate and save path) in bf16, bf16 4-bit (group 64 and
32) and f32, load it back with mlx-lm's load_model and run the oracle protocol
(prefill + greedy decode). bf16 unquantized MoE is left out on purpose: mlx's
CPU gather_mm runs only in float32 (this script checks that it still fails).

Checks per checkpoint: finite, non-constant logits in the compute dtype; the
family's tensors as mlx-lm saves them (qwen2's q/k/v biases and no o_proj
bias; gemma2's four norms per layer and no lm_head; qwen3_moe's stacked
switch_mlp experts and its router gate at 8 bits; minicpm's lm_head; smollm3's
interval and tied head; granite's o_proj / down_proj at 8 bits); that
the unquantized weights in their Hugging Face layout (variants.py
family-hf-layout) load through mlx-lm's sanitize to the same logits; and that
a tied minicpm config is refused. Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import compat  # noqa: E402
from make_checkpoint import write_checkpoint  # noqa: E402
from oracle_logits import load, run_protocol  # noqa: E402
from variants import family_hf_layout  # noqa: E402

CONFIGS = HERE.parent.parent / "specs" / "configs"
FAMILIES = ("qwen2", "gemma2", "qwen3_moe", "mistral", "minicpm", "smollm3", "granite")
FAIL: list[str] = []


def check(ok: bool, msg: str) -> None:
    if not ok:
        FAIL.append(msg)
        print("  FAIL", msg)


def tiny(config: dict) -> dict:
    """The same config at a tiny size (head_dim 16 wherever it is derived)."""
    c = copy.deepcopy(config)
    c.update(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    if "head_dim" in c:
        c["head_dim"] = 16
    if c["model_type"] == "qwen3_moe":
        c.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64)
    if c["model_type"] == "gemma2":
        c["query_pre_attn_scalar"] = 16
    if c["model_type"] == "minicpm":
        c["dim_model_base"] = 16
    if c["model_type"] == "smollm3":
        # 4 layers so that layer 3 is a NoPE one; llama.py builds one layer
        # per layer_types entry, and smollm3.py checks no_rope_layers' length.
        n = 4
        c["num_hidden_layers"] = n
        c["layer_types"] = ["full_attention"] * n
        interval = c.get("no_rope_layer_interval", 4)
        c["no_rope_layers"] = [int((i + 1) % interval != 0) for i in range(n)]
    return c


def tensor_names(model_dir: Path) -> dict:
    names = {}
    for f in sorted(model_dir.glob("model*.safetensors")):
        names.update(mx.load(str(f)))
    return names


def family_layout(model_type: str, t: dict, written: dict) -> None:
    """The family's tensors, as mlx-lm's save path wrote them."""
    p = "model.layers.0."
    if model_type == "qwen2":
        for proj in ("q_proj", "k_proj", "v_proj"):
            check(p + f"self_attn.{proj}.bias" in t, f"qwen2: {proj}.bias missing")
        check(p + "self_attn.o_proj.bias" not in t, "qwen2: o_proj has a bias")
        tied = written.get("tie_word_embeddings", True)  # qwen2.py's default
        check(("lm_head.weight" in t) != tied, f"qwen2: lm_head vs tie_word_embeddings={tied}")
    elif model_type == "gemma2":
        for norm in ("input_layernorm", "post_attention_layernorm",
                     "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            check(p + f"{norm}.weight" in t, f"gemma2: {norm} missing")
        check("lm_head.weight" not in t, "gemma2: lm_head written (always tied)")
    elif model_type == "qwen3_moe":
        w = t.get(p + "mlp.switch_mlp.gate_proj.weight")
        check(w is not None and w.shape[0] == 8, "qwen3_moe: stacked switch_mlp experts missing")
        check(p + "mlp.gate.weight" in t, "qwen3_moe: router gate missing")
        q = written.get("quantization")
        if q is not None:
            check(q.get(p + "mlp.gate") == {"group_size": 64, "bits": 8},
                  f"qwen3_moe: router gate not at 8 bits / 64: {q.get(p + 'mlp.gate')}")
    elif model_type == "minicpm":
        check("lm_head.weight" in t, "minicpm: lm_head missing")
    elif model_type == "mistral":
        check(written["model_type"] == "mistral", "mistral: model_type not kept")
    elif model_type == "smollm3":
        check(written.get("no_rope_layer_interval") == 4, "smollm3: no_rope_layer_interval not kept")
        check("lm_head.weight" not in t, "smollm3: lm_head written for a tied head")
    elif model_type == "granite":
        # granite's quant_predicate: o_proj and down_proj (and an untied
        # lm_head) at 8 bits / 64.
        q = written.get("quantization")
        if q is not None:
            for m in ("self_attn.o_proj", "mlp.down_proj"):
                check(q.get(p + m) == {"group_size": 64, "bits": 8},
                      f"granite: {m} not at 8 bits / 64: {q.get(p + m)}")
            check(p + "self_attn.q_proj" not in q, "granite: q_proj has its own entry")


def head_is_embedding(src: Path) -> Path:
    """A copy of the checkpoint with lm_head.weight = model.embed_tokens.weight."""
    dst = src.with_name(src.name + "-head-is-embedding")
    dst.mkdir(parents=True, exist_ok=True)
    w = tensor_names(src)
    w["lm_head.weight"] = w["model.embed_tokens.weight"]
    (dst / "config.json").write_text((src / "config.json").read_text())
    mx.save_safetensors(str(dst / "model.safetensors"), w)
    return dst


def run_one(name: str, config: dict, out: Path, dtype: str, bits, group) -> None:
    tag = f"{name} {dtype} {'dense' if bits is None else f'q{bits}g{group}'}"
    written = write_checkpoint(config, out, 0, dtype, bits, group)
    tensors, _ = run_protocol(load(out), [1, 5, 9, 33, 2, 17, 60], 4)
    pre = tensors["prefill_logits"]
    f = pre.astype(mx.float32)
    check(pre.dtype == {"bfloat16": mx.bfloat16, "float32": mx.float32}[dtype],
          f"{tag}: logits dtype {pre.dtype}")
    check(pre.shape == (7, 256), f"{tag}: prefill shape {pre.shape}")
    check(bool(mx.all(mx.isfinite(f)).item()), f"{tag}: non-finite logits")
    std = float(mx.std(f).item())
    check(std > 1e-2, f"{tag}: constant logits (std {std})")
    family_layout(config["model_type"], tensor_names(out), written)
    hf = ""
    if bits is None and config["model_type"] != "gemma2":
        # The Hugging Face layout of the same weights: mlx-lm's sanitize must
        # turn it back into the same model (same logits, byte for byte).
        if config["model_type"] == "minicpm":
            # HF MiniCPM has no lm_head (tied): start from a head equal to
            # the embedding, which sanitize copies back.
            out = head_is_embedding(out)
            tensors, _ = run_protocol(load(out), [1, 5, 9, 33, 2, 17, 60], 4)
        family_hf_layout(out, out.with_name(out.name + "-hf"))
        again, _ = run_protocol(load(out.with_name(out.name + "-hf")), [1, 5, 9, 33, 2, 17, 60], 4)
        for k in tensors:
            check(bool(mx.array_equal(tensors[k], again[k]).item()),
                  f"{tag}: HF layout gives other {k}")
        hf = ", HF layout sanitized to the same logits"
    print(f"  ok {tag}: logits std {std:.3f}, greedy tokens {tensors['tokens'].tolist()}{hf}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help="keep the checkpoints here (default: a temporary directory)")
    a = p.parse_args()
    compat.apply()
    with tempfile.TemporaryDirectory() as tmp:
        root = a.out or Path(tmp)
        seen = set()
        for path in sorted(CONFIGS.glob("*.config.json")):
            config = json.loads(path.read_text())
            if config.get("model_type") not in FAMILIES:
                continue
            name = path.name.removesuffix(".config.json")
            seen.add(config["model_type"])
            print(name)
            c = tiny(config)
            moe = c["model_type"] == "qwen3_moe"
            for dtype, bits, group in [("bfloat16", None, None), ("bfloat16", 4, 64),
                                       ("bfloat16", 4, 32), ("float32", None, None)]:
                if moe and dtype == "bfloat16" and bits is None:
                    try:
                        run_one(name, c, root / f"{name}-bf16-moe", dtype, None, None)
                        check(False, f"{name}: bf16 unquantized MoE ran on the CPU; "
                                     "the oracle could cover it now")
                    except RuntimeError as e:
                        check("GatherMM" in str(e), f"{name}: unexpected error {e}")
                        print(f"  skipped {name} bf16 dense: {e}")
                    continue
                run_one(name, c, root / f"{name}-{dtype}-{bits}-{group}", dtype, bits, group)
        check(seen == set(FAMILIES), f"configs missing for {set(FAMILIES) - seen}")
        tied = tiny(json.loads((CONFIGS / "minicpm-2b.config.json").read_text()))
        tied["tie_word_embeddings"] = True
        try:
            write_checkpoint(tied, root / "minicpm-tied", 0)
            check(False, "a tied minicpm config was not refused")
        except ValueError as e:
            check("tie_word_embeddings" in str(e), f"tied minicpm: unexpected message {e}")
    if FAIL:
        print(f"{len(FAIL)} check(s) failed")
        sys.exit(1)
    print("all family checkpoints built, loaded and ran in mlx-lm")


if __name__ == "__main__":
    main()
