//! Qwen2 / Qwen2.5 (`qwen2.py`): Llama plus a bias on the q, k and v
//! projections; no head_dim field, no sliding window.

use super::llama::LLAMA;
use super::{BiasFlags, ConfigDefault, ConfigReading, ConfigRope, DenseVariant, HeadDim, KvHeads};
use crate::ir::ProjectionBias;
use crate::model::{ConfigModelType, Family};
use crate::reader::Reader;

pub(crate) const QWEN2: DenseVariant = DenseVariant {
    family: Family::Qwen2,
    model_types: &[ConfigModelType::Qwen2],
    bias: ProjectionBias::QueryKeyValue,
    head_dim: HeadDim::HiddenOverHeads,
    config: ConfigReading {
        kv_heads: KvHeads::Required,
        max_position_embeddings: ConfigDefault::Value(32768),
        bias_flags: BiasFlags::NotRead,
        rope: ConfigRope::Flat(ConfigDefault::Value(1_000_000.0)),
        read_extras: note_no_sliding_window,
        ..LLAMA.config
    },
    ..LLAMA
};

/// The window fields qwen2.py does not read.
fn note_no_sliding_window(r: &mut Reader) {
    for field in ["use_sliding_window", "sliding_window", "max_window_layers"] {
        if let Some(v) = r.get(field).cloned() {
            r.note(
                field,
                v,
                "ignored: mlx-lm's qwen2.py has no sliding window (every layer is full attention)",
            );
        }
    }
}
