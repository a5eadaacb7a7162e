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
    fn forward(&self, ids: &Array, cache: &mut Self::Cache) -> Result<Array> {
        self.forward_to(ids, cache, Readout::Logits)
    }
    /// The forward of `ids` [B, L] (int32), appending to `cache`, read out
    /// as `readout` says: the one trunk behind both readouts, so an
    /// embedding is the very hidden state the head would have projected.
    fn forward_to(&self, ids: &Array, cache: &mut Self::Cache, readout: Readout) -> Result<Array>;
    /// The same model's batched forward (B sequences of different lengths
    /// in one forward, as mlx-lm's `BatchGenerator` runs them), when it has
    /// one; a server batches concurrent requests through it.
    fn batched(&self) -> Option<&dyn BatchLm> {
        None
    }
}

/// What a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readout {
    /// The head's logits [B, L, vocab] (final norm, scale, head, softcap).
    Logits,
    /// The final norm's output [B, L, hidden], the head's input (mlx-lm's
    /// `model.model(inputs)`): what an embedding pools.
    NormedHidden,
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
