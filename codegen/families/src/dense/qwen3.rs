//! Qwen3 (`qwen3.py`): Llama plus an RMSNorm per head on queries and keys;
//! its config.json has no defaults for the sizes and may hold RoPE in
//! transformers >= 5's `rope_parameters`.

use super::llama::{no_extras, LLAMA};
use super::{BiasFlags, KvHeads};
use super::{ConfigDefault, ConfigReading, ConfigRope, DenseVariant, HeadDim, RopeTraditional};
use crate::ir::QkNorm;
use crate::model::{ConfigModelType, Family};

pub(crate) const QWEN3: DenseVariant = DenseVariant {
    family: Family::Qwen3,
    model_types: &[ConfigModelType::Qwen3],
    qk_norm: QkNorm::RmsPerHead,
    head_dim: HeadDim::Required,
    rope_traditional: RopeTraditional::AlwaysFalse {
        hint: "Qwen3 ignores rope_traditional; write false",
    },
    config: ConfigReading {
        kv_heads: KvHeads::Required,
        tie_word_embeddings: ConfigDefault::Required,
        bias_flags: BiasFlags::NotRead,
        rope: ConfigRope::FlatOrParameters,
        read_extras: no_extras,
        ..LLAMA.config
    },
    ..LLAMA
};
