//! Gemma 3 text models (`gemma3_text.py`): Gemma-2's layers with `1 + w`
//! q/k norms per head, fused SDPA (no softcaps), every
//! `sliding_window_pattern`-th layer full attention with `rope_theta` (and
//! `rope_scaling`), the others sliding with `rope_local_base_freq`.

use super::gemma2::GEMMA2;
use super::{
    ConfigDefaults, GemmaVariant, Layering, Packaging, RopeBases, SizeDefault, Softcaps,
    WrapperArgs,
};
use crate::ir::{AttentionScale, EmbedScale, QkNorm, Residual};
use crate::layout_reader::{Layout, Text};
use crate::model::{ConfigModelType, Family};

pub(crate) const GEMMA3_TEXT: GemmaVariant = GemmaVariant {
    family: Family::Gemma3Text,
    model_types: &[
        (ConfigModelType::Gemma3Text, Packaging::Flat),
        // gemma3.py's `ModelArgs`: `vocab_size` 262208 written over
        // text_config's, 8 query and 4 key/value heads where it has none.
        (
            ConfigModelType::Gemma3,
            Packaging::Wrapped(WrapperArgs {
                vocab_size: 262_208,
                num_attention_heads: 8,
                num_key_value_heads: 4,
            }),
        ),
    ],
    layout: Layout {
        family: "gemma3_text",
        anchor: "gemma-3",
        texts: &[
            Text::Field("layers", "a mapping {num_hidden_layers, sliding_window, sliding_window_pattern}", "see docs/spec-format.md#gemma-3"),
            Text::Field("rope", "a mapping {traditional, rope_theta, rope_local_base_freq, scaling (optional)}", "see docs/spec-format.md#gemma-3"),
            Text::Refused("kv_quantization", "archgen runs gemma3_text with a plain KV cache: KV-cache quantization is supported for Gemma-4 only (docs/spec-format.md#gemma-3)"),
        ],
        ..GEMMA2.layout
    },
    qk_norm: QkNorm::RmsPerHeadOnePlus,
    // `query_pre_attn_scalar**-0.5`: one pow in f64, passed to SDPA.
    attention_scale: |s| AttentionScale::Constant(s.powf(-0.5)),
    // `h *= mx.array(hidden_size**0.5, mx.bfloat16).astype(h.dtype)`.
    embed_scale: |hidden| EmbedScale::Constant(bf16(f64::from(hidden).sqrt())),
    // Its `sanitize` ties the head when `lm_head.weight` is absent (a spec's
    // head is tied), which no rule needs.
    sanitize: &[],
    // `clip_residual`: float16 sums in float32, clipped to float16's range.
    residual: Residual::ClippedInFloat16,
    defaults: ConfigDefaults {
        rope_theta: 1_000_000.0,
        query_pre_attn_scalar: 256.0,
        max_position_embeddings: (32768, "absent: mlx-lm's gemma3_text default (no RoPE it builds here reads it)"),
    },
    // gemma3_text.ModelArgs' defaults (the published 4B/12B/27B configs leave
    // most of them out).
    size_defaults: &[
        ("hidden_size", SizeDefault::Uint(1152)),
        ("num_hidden_layers", SizeDefault::Uint(26)),
        ("intermediate_size", SizeDefault::Uint(6912)),
        ("num_attention_heads", SizeDefault::Uint(4)),
        ("head_dim", SizeDefault::Uint(256)),
        ("rms_norm_eps", SizeDefault::Float(1.0e-6)),
        ("vocab_size", SizeDefault::Uint(262_144)),
        ("num_key_value_heads", SizeDefault::Uint(1)),
    ],
    softcaps: Softcaps::Absent,
    layering: Layering::SlidingPattern { window: 512, pattern: 6 },
    rope: RopeBases::LocalAndGlobal { local_base_default: 10_000.0 },
    untied_head: "false: archgen's gemma3_text spec has the tied head of the published checkpoints (mlx-lm unties it only when lm_head.weight is present)",
};

/// `x` rounded to bfloat16 as `mx.array(x, mx.bfloat16)` does: to f32, then to
/// the nearest bfloat16, ties to even.
fn bf16(x: f64) -> f64 {
    let bits = (x as f32).to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    f64::from(f32::from_bits(rounded))
}
