//! What every runnable model (monolith or generated) offers the CLI.

use mlx_rs::Array;

use crate::batch::BatchLm;
use crate::ops::Result;

/// A causal language model over token ids.
/// Generated models have a typed cache (a field per layer that owns K/V);
/// the monolith keeps one slot per layer.
pub trait CausalLm {
    type Cache;
    fn vocab_size(&self) -> i32;
    /// A fresh cache, as mlx-lm's `make_cache`.
    fn make_cache(&self) -> Self::Cache;
    /// Logits [B, L, vocab] for `ids` [B, L] (int32), appending to `cache`.
    fn forward(&self, ids: &Array, cache: &mut Self::Cache) -> Result<Array>;
    /// The same model's batched forward (B sequences of different lengths
    /// in one forward, as mlx-lm's `BatchGenerator` runs them), when it has
    /// one; a server batches concurrent requests through it.
    fn batched(&self) -> Option<&dyn BatchLm> {
        None
    }
}

/// Something to do with a model whose concrete type is chosen at run time
/// (monolith or one of the generated models), without dynamic dispatch in
/// the forward pass.
pub trait ModelTask {
    type Output;
    /// Whether the task runs one sequence at a time or batches of several
    /// (whose parity tier can be another: `archgen_ir::tier::batch_tier`).
    fn runs(&self) -> Runs {
        Runs::OneSequence
    }
    fn run<M: CausalLm>(self, model: &M) -> Self::Output;
}

/// What a [`ModelTask`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    OneSequence,
    /// Batches of several sequences through `CausalLm::batched`.
    Batches,
}

/// A model that could not be built: names the tensor or field.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ModelError(pub String);
