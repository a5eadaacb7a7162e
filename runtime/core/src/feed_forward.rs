//! A layer's feed-forward half, owned: the one enum of what follows the
//! mixer (IR `FeedForward`), for every family. It sits above [`crate::blocks`]
//! and [`crate::deltanet`], whose blocks it holds, so neither of them needs
//! to know the other's feed-forward kinds.

use mlx_rs::error::Exception;
use mlx_rs::Array;

use crate::blocks::{
    self as b, BiasedExpertsMoe, GroupRoutedMoe, LayerNorms, Mlp, MoeBlock, Residual, SparseMoe,
};
use crate::deltanet::SharedExpertMoe;
use crate::ops::Result;

/// A layer's feed-forward weights, by IR `FeedForward`.
// One per layer, never moved after loading: boxing would only add a hop.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum FeedForward {
    /// The dense gated MLP, with Gemma-4's routed experts beside it when
    /// present (IR `Mlp`, `MlpAndMoe`).
    Mlp { mlp: Mlp, moe: Option<MoeBlock> },
    /// Routed experts in place of the MLP (IR `Moe`: Qwen3-MoE).
    SparseMoe(SparseMoe),
    /// Routed experts and a sigmoid-gated shared expert (IR
    /// `MoeAndSharedExpert`: Qwen3.5/3.6 MoE).
    SharedExpertMoe(SharedExpertMoe),
    /// Routed experts behind the sigmoid group router and ungated shared
    /// experts (IR `MoeAndSharedExperts`: GLM-4.5 MoE).
    GroupRoutedMoe(GroupRoutedMoe),
    /// Routed experts with biases and the clamped SwiGLU behind the top-k
    /// softmax router (IR `BiasedExperts`: gpt-oss).
    BiasedExperts(BiasedExpertsMoe),
}

impl FeedForward {
    /// [`crate::layers::Linear::pretranspose`] on every dense projection of
    /// the variant's blocks (generated models; experts stay as gathered).
    pub fn pretranspose(&mut self) {
        match self {
            FeedForward::Mlp { mlp, moe } => {
                mlp.pretranspose();
                if let Some(moe) = moe {
                    moe.pretranspose();
                }
            }
            FeedForward::SparseMoe(m) => m.pretranspose(),
            FeedForward::SharedExpertMoe(m) => m.pretranspose(),
            FeedForward::GroupRoutedMoe(m) => m.pretranspose(),
            FeedForward::BiasedExperts(m) => m.pretranspose(),
        }
    }

    /// The second half of a pre-norm or sandwich layer from the residual
    /// stream `h` and the mixer's output `a`: the attention residual, then
    /// `+ ffn(norm(.))` with the layer's norms, both branches added in the
    /// layer's [`Residual`] form. Routed experts in place of the MLP join a
    /// plain residual only: no family scales or clips theirs.
    pub fn after_mixer(
        &self,
        h: &Array,
        a: &Array,
        norms: &LayerNorms,
        residual: Residual<'_>,
        eps: f32,
    ) -> Result<Array> {
        let h1 = b::attention_residual(h, a, norms, eps, residual)?;
        match (self, residual) {
            (FeedForward::Mlp { mlp, moe }, residual) => {
                b::feed_forward(&h1, norms, mlp, moe.as_ref(), eps, residual)
            }
            (FeedForward::SparseMoe(m), Residual::Plain) => {
                b::experts_feed_forward(&h1, norms, m, eps)
            }
            (FeedForward::SharedExpertMoe(m), Residual::Plain) => {
                b::experts_feed_forward(&h1, norms, m, eps)
            }
            (FeedForward::GroupRoutedMoe(m), Residual::Plain) => {
                b::experts_feed_forward(&h1, norms, m, eps)
            }
            (FeedForward::BiasedExperts(m), Residual::Plain) => {
                b::experts_feed_forward(&h1, norms, m, eps)
            }
            (
                FeedForward::SparseMoe(_)
                | FeedForward::SharedExpertMoe(_)
                | FeedForward::GroupRoutedMoe(_)
                | FeedForward::BiasedExperts(_),
                Residual::Scaled(_) | Residual::ClippedInFloat16,
            ) => Err(Exception::custom(
                "routed experts with scaled or clipped residuals: no runtime block runs them",
            )),
        }
    }
}
