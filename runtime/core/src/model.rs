//! What every runnable model (monolith or generated) offers the CLI.

use std::fmt;

use mlx_rs::Array;

use crate::cache::LayerCache;
use crate::ops::Result;

/// A causal language model over token ids.
pub trait CausalLm {
    fn vocab_size(&self) -> i32;
    /// A fresh cache: one slot per layer, `None` for layers that share K/V.
    fn make_cache(&self) -> Vec<Option<LayerCache>>;
    /// Logits [B, L, vocab] for `ids` [B, L] (int32), appending to `caches`.
    fn forward(&self, ids: &Array, caches: &mut [Option<LayerCache>]) -> Result<Array>;
}

/// A model that could not be built: names the tensor or field.
#[derive(Debug)]
pub struct ModelError(pub String);

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ModelError {}
