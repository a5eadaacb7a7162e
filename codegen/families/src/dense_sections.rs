//! The dense layout's model, layer, attention and MLP sections: plain data,
//! read by the dense families (`dense.rs`) and by the section writers every
//! family shares (`emit.rs`, `hf.rs`, `layout.rs`). They live below all of
//! them so that the shared writers do not import a family's module.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Model-wide dimensions and numerics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DenseModel {
    /// `hidden_size`.
    pub hidden_size: u32,
    /// `vocab_size`.
    pub vocab_size: u32,
    /// `rms_norm_eps` of every RMSNorm.
    pub rms_norm_eps: f64,
    /// `tie_word_embeddings`: the head is `embed_tokens.as_linear`.
    pub tie_word_embeddings: bool,
    /// `max_position_embeddings` (informational: no RoPE kind here reads it).
    pub max_position_embeddings: u32,
}

/// The decoder stack: every layer is full (causal) attention.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DenseLayers {
    /// `num_hidden_layers`.
    pub num_hidden_layers: u32,
}

/// Grouped-query attention geometry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DenseAttention {
    /// `num_attention_heads`.
    pub num_attention_heads: u32,
    /// `num_key_value_heads`.
    pub num_key_value_heads: u32,
    /// `head_dim` (Llama: `hidden_size / num_attention_heads` when config.json has none).
    pub head_dim: u32,
}

/// SwiGLU MLP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DenseMlp {
    /// `intermediate_size`.
    pub intermediate_size: u32,
}

crate::document::impl_model_sizes!(DenseModel);
