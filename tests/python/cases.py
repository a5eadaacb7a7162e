"""Oracle test cases: tiny Gemma-4 configs covering every structural branch
of mlx_lm/models/gemma4_text.py (0.32.2).

Every config states every ModelArgs field explicitly: mlx-lm, HF and other
stacks disagree on defaults (num_kv_shared_layers, use_double_wide_mlp,
hidden_size_per_layer_input, final_logit_softcapping, ...), so a case must
never depend on one.

Shared tiny geometry: hidden 64, head_dim 16, global_head_dim 32,
intermediate 128, vocab 512, sliding_window 8 (prompts/decodes go past it),
MoE 8 experts top-2 width 32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

VOCAB = 512
WINDOW = 8

ROPE = {
    "full_attention": {
        "partial_rotary_factor": 0.25,
        "rope_theta": 1000000.0,
        "rope_type": "proportional",
    },
    "sliding_attention": {
        "partial_rotary_factor": 1.0,
        "rope_theta": 10000.0,
        "rope_type": "default",
    },
}


def layer_types(n: int, period: int) -> list[str]:
    """(period-1) sliding + 1 full, repeated: e2b uses 5 (4S+1F), others 6."""
    return ["full_attention" if (i + 1) % period == 0 else "sliding_attention"
            for i in range(n)]


def text_config(**over) -> dict:
    """Every gemma4_text.ModelArgs field, explicitly. Callers override."""
    n = over.get("num_hidden_layers", 12)
    cfg = {
        "model_type": "gemma4_text",
        "hidden_size": 64,
        "num_hidden_layers": n,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "head_dim": 16,
        "global_head_dim": 32,
        "global_partial_rotary_factor": 0.25,  # dead in mlx-lm; stated anyway
        "partial_rotary_factor": 1.0,          # dead in mlx-lm; stated anyway
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB,
        "vocab_size_per_layer_input": VOCAB,
        "num_key_value_heads": 2,
        "num_global_key_value_heads": None,
        "num_kv_shared_layers": 0,
        "pad_token_id": 0,
        "hidden_size_per_layer_input": 0,
        "rope_traditional": False,
        "rope_parameters": ROPE,
        "sliding_window": WINDOW,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
        "attention_k_eq_v": False,
        "final_logit_softcapping": 30.0,
        "use_double_wide_mlp": False,
        "enable_moe_block": False,
        "num_experts": None,
        "top_k_experts": None,
        "moe_intermediate_size": None,
        "layer_types": layer_types(n, 6),
        "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh",  # ignored by mlx-lm (hard-coded)
    }
    cfg.update(over)
    return cfg


def wrap(text: dict, model_type: str = "gemma4") -> dict:
    """The multimodal-wrapper layout of released checkpoints. The top-level
    vocab_size is required: gemma4.ModelArgs copies it into text_config
    (default 262144)."""
    return {
        "model_type": model_type,
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text,
        "vocab_size": text["vocab_size"],
        "tie_word_embeddings": text["tie_word_embeddings"],
    }


# --- architecture families (tiny) ------------------------------------------

def e2b() -> dict:
    # 10 layers SSSSF SSSSF; M = 10 - 4 = 6 -> sharers 6..9 (S,S,S,F),
    # donors: sliding 5, full 4. Double-wide MLP (256) on sharers. PLE 32.
    n = 10
    return wrap(text_config(
        num_hidden_layers=n, layer_types=layer_types(n, 5), sliding_window_pattern=5,
        num_key_value_heads=1, num_kv_shared_layers=4, use_double_wide_mlp=True,
        hidden_size_per_layer_input=32))


def e4b() -> dict:
    # 12 layers SSSSSF x2; M = 8 -> sharers 8..11 (S,S,S,F),
    # donors: sliding 7, full 5. No double-wide. PLE 32.
    return wrap(text_config(
        num_hidden_layers=12, num_key_value_heads=2, num_kv_shared_layers=4,
        use_double_wide_mlp=False, hidden_size_per_layer_input=32))


def g12b() -> dict:
    # gemma4_unified (remapped to gemma4 by mlx-lm). Full layers: k_eq_v with
    # 1 global kv head (no v_proj); sliding: 2 kv heads. Dense, no sharing/PLE.
    t = text_config(model_type="gemma4_unified_text", num_hidden_layers=12,
                    num_key_value_heads=2, num_global_key_value_heads=1,
                    attention_k_eq_v=True, max_position_embeddings=262144,
                    use_bidirectional_attention="vision")  # ignored by mlx-lm
    c = wrap(t, "gemma4_unified")
    c["architectures"] = ["Gemma4UnifiedForConditionalGeneration"]
    return c


def g26b_a4b() -> dict:
    # MoE on every layer (dense MLP || 8 experts top-2, width 32) + k_eq_v
    # with 2 global kv heads.
    return wrap(text_config(
        num_hidden_layers=12, num_key_value_heads=2, num_global_key_value_heads=2,
        attention_k_eq_v=True, enable_moe_block=True, num_experts=8,
        top_k_experts=2, moe_intermediate_size=32, max_position_embeddings=262144))


def g31b_flat() -> dict:
    # 31B shape ratios (8 q heads, 4 kv, 2 global kv, k_eq_v), dense; given as a
    # flat gemma4_text config -> weight keys "model.*" instead of
    # "language_model.model.*".
    return text_config(num_hidden_layers=12, num_attention_heads=8,
                       num_key_value_heads=4, num_global_key_value_heads=2,
                       attention_k_eq_v=True, max_position_embeddings=262144)


def edge_flat() -> dict:
    # Off-release branches: untied lm_head, no softcap, last layer sliding
    # (explicit layer_types, not a pattern), num_global_key_value_heads set but
    # k_eq_v off (must be ignored -> full layers use num_key_value_heads and
    # have v_proj), MHA-ish kv=4.
    n = 7
    lt = ["sliding_attention", "full_attention", "sliding_attention",
          "sliding_attention", "full_attention", "sliding_attention",
          "sliding_attention"]
    return text_config(num_hidden_layers=n, layer_types=lt, num_key_value_heads=4,
                       num_global_key_value_heads=1, attention_k_eq_v=False,
                       tie_word_embeddings=False, final_logit_softcapping=None)


# --- cases -------------------------------------------------------------------

@dataclass
class Case:
    name: str
    config: dict
    prompt_len: int
    decode_steps: int
    seed: int
    dtype: str = "bfloat16"
    bits: Optional[int] = None
    group_size: Optional[int] = None
    shards: int = 1
    covers: list[str] = field(default_factory=list)
    # KV-cache quantization {layer_idx: (bits, group_size)}: written as the
    # checkpoint's kv_config.json; mlx-lm runs QuantizedKVCache on those layers.
    kv_quant: Optional[dict[int, tuple[int, int]]] = None

    @property
    def prompt_ids(self) -> list[int]:
        # Legacy RandomState: stable across numpy versions.
        rng = np.random.RandomState(10_000 + self.seed)
        return [int(t) for t in rng.randint(0, VOCAB, size=self.prompt_len)]


CASES: list[Case] = [
    Case("e2b-tiny-bf16", e2b(), 13, 12, seed=1, covers=[
        "gemma4 wrapper", "4S+1F", "KV sharing (sliding+full donors)",
        "double-wide MLP on sharers", "PLE", "prefill > window (concat wrap)"]),
    Case("e2b-tiny-q4", e2b(), 13, 12, seed=2, bits=4, group_size=32, covers=[
        "4-bit g32: every Linear/Embedding quantized incl. PLE table+projection"]),
    Case("e2b-tiny-f16", e2b(), 10, 6, seed=3, dtype="float16", covers=[
        "float16 weights/compute"]),
    Case("e4b-tiny-bf16", e4b(), 5, 10, seed=4, shards=3, covers=[
        "5S+1F", "KV sharing, no double-wide", "PLE",
        "prefill < window ('causal' mask), decode wraps ring in place",
        "sharded safetensors + index"]),
    Case("e4b-tiny-q8", e4b(), 11, 8, seed=5, bits=8, group_size=64, covers=[
        "8-bit g64", "mixed: per_layer_projection (in=32) left unquantized"]),
    Case("12b-tiny-bf16", g12b(), 20, 8, seed=6, covers=[
        "gemma4_unified remap", "k_eq_v, 1 global kv head", "dense", "no sharing/PLE"]),
    Case("12b-tiny-q4", g12b(), 9, 8, seed=7, bits=4, group_size=64, covers=[
        "4-bit g64 (k_eq_v)"]),
    # No bf16/f16 unquantized MoE case: on the CPU backend mx.gather_mm (the
    # un-quantized SwitchLinear) only supports float32, so mlx-lm itself cannot
    # run it (nor can anything else on the same libmlx). Hence f32 for the
    # unquantized MoE, and g32 for quantized MoE so every expert matrix
    # (down_proj has in=32) goes through gather_qmm.
    Case("26b-a4b-tiny-f32", g26b_a4b(), 40, 8, seed=8, dtype="float32", covers=[
        "MoE (dense || 8 experts top-2), unquantized experts (gather_mm, f32 only on CPU)",
        "k_eq_v, 2 global kv heads",
        "SwitchGLU sort path in prefill (1*40*2=80 >= 64), unsorted in decode"]),
    Case("26b-a4b-tiny-q4", g26b_a4b(), 32, 6, seed=9, bits=4, group_size=32, covers=[
        "bf16 4-bit g32: all experts quantized (gather_qmm)",
        "router.proj 8-bit g64 override", "sort threshold exactly (32*2=64)"]),
    Case("26b-a4b-tiny-q8", g26b_a4b(), 31, 6, seed=10, bits=8, group_size=32, covers=[
        "bf16 8-bit g32", "router.proj 8-bit g64 override",
        "multi-token prefill below sort threshold (31*2=62)"]),
    Case("31b-tiny-bf16", g31b_flat(), 1, 12, seed=11, covers=[
        "flat gemma4_text config ('model.*' keys)", "8 heads/4 kv/2 global kv, k_eq_v",
        "prompt length 1", "decode past window"]),
    Case("31b-tiny-f32", g31b_flat(), 17, 4, seed=12, dtype="float32", covers=[
        "float32 weights/compute"]),
    Case("edge-untied-nocap-bf16", edge_flat(), 8, 9, seed=13, covers=[
        "untied lm_head", "final_logit_softcapping null", "last layer sliding",
        "num_global_key_value_heads ignored without k_eq_v", "prompt == window"]),
]

# Quantized KV cache (QuantizedKVCache + quantized_scaled_dot_product_attention).
# mlx-lm can quantize only full-attention layers that no KV-shared layer reads.
CASES += [
    Case("12b-tiny-kv8-bf16", g12b(), 20, 10, seed=14, kv_quant={5: (8, 32), 11: (8, 32)},
         covers=["quantized KV cache 8-bit g32 on both full layers (bf16 weights)",
                 "quantized SDPA with GQA (4 q heads over 1 global kv head)",
                 "prefill with the 'causal' string mask (q_indices >= k_indices)",
                 "mask of the full type from a QuantizedKVCache"]),
    Case("31b-tiny-q4-kv4", g31b_flat() | {"global_head_dim": 64}, 250, 12, seed=15,
         bits=4, group_size=64, kv_quant={11: (4, 64)},
         covers=["quantized KV cache 4-bit g64 on layer 11 only (4-bit g64 weights)",
                 "plain KVCache on full layer 5 next to a QuantizedKVCache",
                 "cache growth past 256 during decode (slice to offset, concat 256 more)"]),
    Case("e4b-18l-kv4-bf16",
         wrap(text_config(num_hidden_layers=18, layer_types=layer_types(18, 6),
                          num_key_value_heads=2, num_kv_shared_layers=6,
                          hidden_size_per_layer_input=32)),
         12, 8, seed=16, kv_quant={5: (4, 32)},
         covers=["quantized KV cache 4-bit g32 with KV sharing and PLE",
                 "layer 5 quantized; sharers read donors 10 (sliding) and 11 (full)"]),
]

CASES_BY_NAME = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES), "duplicate case name"
