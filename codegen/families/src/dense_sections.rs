//! The dense layout's model, layer, attention and MLP sections: plain data,
//! read by the dense families (`dense/`) and by the section writers every
//! family shares (`yaml_writer.rs`, `hf.rs`, `layout_reader.rs`). They live below all of
//! them so that the shared writers do not import a family's module. The
//! sizes every dense-shaped import reads first ([`RequiredSizes`]) build them.

use crate::reader::Reader;
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

/// The sizes every imported config.json of a dense-shaped stack holds and
/// mlx-lm's `ModelArgs` has no default for (it fails without them): read
/// first, in its field order, before what each family reads of its own.
pub(crate) struct RequiredSizes {
    pub(crate) hidden_size: u32,
    pub(crate) num_layers: u32,
    pub(crate) intermediate_size: u32,
    pub(crate) num_heads: u32,
    pub(crate) rms_norm_eps: f64,
    pub(crate) vocab_size: u32,
}

impl RequiredSizes {
    pub(crate) fn read(r: &mut Reader) -> Self {
        RequiredSizes {
            hidden_size: r.required_uint("hidden_size"),
            num_layers: r.required_uint("num_hidden_layers"),
            intermediate_size: r.required_uint("intermediate_size"),
            num_heads: r.required_uint("num_attention_heads"),
            rms_norm_eps: r.required_float("rms_norm_eps"),
            vocab_size: r.required_uint("vocab_size"),
        }
    }

    /// The model section, with the head's tie and the context length as the
    /// family reads them.
    pub(crate) fn model(
        &self,
        tie_word_embeddings: bool,
        max_position_embeddings: u32,
    ) -> DenseModel {
        DenseModel {
            hidden_size: self.hidden_size,
            vocab_size: self.vocab_size,
            rms_norm_eps: self.rms_norm_eps,
            tie_word_embeddings,
            max_position_embeddings,
        }
    }

    pub(crate) fn layers(&self) -> DenseLayers {
        DenseLayers {
            num_hidden_layers: self.num_layers,
        }
    }

    /// The attention section, with the K/V heads and head size as the family
    /// reads them.
    pub(crate) fn attention(&self, num_key_value_heads: u32, head_dim: u32) -> DenseAttention {
        DenseAttention {
            num_attention_heads: self.num_heads,
            num_key_value_heads,
            head_dim,
        }
    }
}
