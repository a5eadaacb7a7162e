//! Gemma-2 (`gemma2.py`): the parent every other family of the layout is
//! written as a difference from.

use super::{ConfigDefaults, GemmaVariant, Layering, Packaging, RopeBases, Softcaps};
use crate::ir::{AttentionScale, EmbedScale, QkNorm, Residual};
use crate::layout_reader::{Layout, Section, Text};
use crate::model::{ConfigModelType, Family};

pub(crate) const GEMMA2: GemmaVariant = GemmaVariant {
    family: Family::Gemma2,
    model_types: &[(ConfigModelType::Gemma2, Packaging::Flat)],
    layout: LAYOUT,
    qk_norm: QkNorm::None,
    // `1.0 / (query_pre_attn_scalar**0.5)`.
    attention_scale: AttentionScale::InvSqrtQueryPreAttnScalar,
    // `h * (hidden_size**0.5)`: a weak Python float.
    embed_scale: |_| EmbedScale::SqrtHidden,
    // gemma2.py has no `sanitize`: mlx-lm loads its checkpoints strictly.
    sanitize: &[],
    residual: Residual::Plain,
    defaults: ConfigDefaults {
        rope_theta: 10000.0,
        query_pre_attn_scalar: 144.0,
        max_position_embeddings: (
            8192,
            "absent: not read by mlx-lm's gemma2 (informational); transformers' Gemma2Config default",
        ),
    },
    // gemma2.ModelArgs has no defaults for its sizes.
    size_defaults: &[],
    softcaps: Softcaps::Applied {
        attention: 50.0,
        logits: 30.0,
    },
    layering: Layering::AllFull,
    rope: RopeBases::One,
    untied_head: "false, but mlx-lm's gemma2 always uses the embedding as the head (it has no lm_head)",
};

/// How a gemma2 document is read (see [`crate::layout_reader`]).
const LAYOUT: Layout = Layout {
    family: "gemma2",
    anchor: "gemma-2",
    head: crate::layout_reader::HEAD,
    sections: &[
        Section::of::<super::Gemma2Model>("model"),
        Section::of::<super::Gemma2Layers>("layers"),
        Section::of::<super::Gemma2Attention>("attention"),
        Section::of::<super::Gemma2Rope>("rope"),
        Section::of::<super::Gemma2Mlp>("mlp"),
        crate::layout_reader::QUANTIZATION,
    ],
    texts: &[
        Text::Field("model", "a mapping {hidden_size, vocab_size, rms_norm_eps, final_logit_softcapping, max_position_embeddings}", "model-wide sizes; the head is always tied; see docs/spec-format.md#gemma-2"),
        Text::Field("layers", "a mapping {num_hidden_layers}", "every Gemma-2 layer is full attention (mlx-lm has no sliding window for it); see docs/spec-format.md#gemma-2"),
        Text::Field("attention", "a mapping {num_attention_heads, num_key_value_heads, head_dim, query_pre_attn_scalar, attn_logit_softcapping}", "attention geometry and its scale and softcap; see docs/spec-format.md#gemma-2"),
        Text::Field("rope", "a mapping {traditional, rope_theta}", "`rope_traditional`, `rope_theta`; see docs/spec-format.md#gemma-2"),
        Text::Field("mlp", "a mapping {intermediate_size}", "GeLU-approx MLP width; see docs/spec-format.md#gemma-2"),
        Text::Refused("sliding_window", "mlx-lm's gemma2 has no sliding window: every layer is full attention with a plain KV cache (docs/spec-format.md#gemma-2)"),
        Text::Refused("tie_word_embeddings", "mlx-lm's gemma2 always uses the embedding as the head; there is nothing to write (docs/spec-format.md#gemma-2)"),
        Text::Refused("kv_quantization", "mlx-lm's gemma2 attention cannot read a quantized KV cache (docs/spec-format.md#gemma-2)"),
    ],
};
