//! OLMo-2 (`olmo2.py`, llama.py's `ModelArgs` fields and defaults): Llama
//! with the norms after the mixer and the MLP instead of before them, and q/k
//! RMSNorms over the whole projection.

use super::llama::{no_extras, LLAMA};
use super::{ConfigReading, DenseVariant};
use crate::ir::{NormArrangement, QkNorm, SanitizeRule, ShardOracle};
use crate::model::{ConfigModelType, Family};

pub(crate) const OLMO2: DenseVariant = DenseVariant {
    family: Family::Olmo2,
    model_types: &[ConfigModelType::Olmo2],
    // `nn.RMSNorm(n_heads * head_dim)` on `q_proj(x)` before the reshape.
    qk_norm: QkNorm::RmsWholeProjection,
    // `TransformerBlock`: norms after the attention and the MLP only.
    arrangement: NormArrangement::PostNorm,
    // olmo2.py's sanitize drops `self_attn.rotary_emb.inv_freq` only; a tied
    // checkpoint with an lm_head fails its strict load.
    sanitize: &[SanitizeRule::DropRotaryTables],
    // olmo2.py has no shard().
    shard_oracle: ShardOracle::Absent,
    config: ConfigReading {
        read_extras: no_extras,
        ..LLAMA.config
    },
    ..LLAMA
};
