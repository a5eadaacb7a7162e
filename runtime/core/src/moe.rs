//! The MoE blocks as mlx-lm runs them: Gemma-4's router (norm -> scale ->
//! project -> argpartition top-k -> softmax over the k -> per-expert scale),
//! qwen3_moe's (project -> precise softmax over all experts -> argpartition
//! top-k of the probabilities -> optional renormalization), and SwitchGLU
//! experts with gather matmuls, sorting tokens by expert when B*L*k >= 64.

use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
use mlx_rs::Array;

use crate::flat::Flat;
use crate::layers::{Linear, SwitchLinear};
use crate::ops::{geglu, rms_norm, scalar_like, swiglu, Result};

#[derive(Debug, Clone, Flat)]
#[flat(key(self.top_k, self.hidden, self.eps.to_bits()))]
pub struct Router {
    pub proj: Linear,
    pub scale: Array,
    pub per_expert_scale: Array,
    #[flat(copied)]
    pub top_k: i32,
    #[flat(copied)]
    pub hidden: i32,
    #[flat(copied)]
    pub eps: f32,
}

impl Router {
    /// Returns (top-k indices, their weights), in argpartition's order.
    pub fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let root = scalar_like((self.hidden as f64).powf(-0.5), &self.scale);
        let x = rms_norm(x, Some(&self.scale.multiply(&root)?), self.eps)?;
        let scores = self.proj.forward(&x)?;
        let k = self.top_k;
        let idx = mlx_rs::ops::argpartition_axis(&scores, -k, -1)?;
        let idx = mlx_rs::stop_gradient(idx.try_index((Ellipsis, -k..))?)?;
        let w = mlx_rs::ops::indexing::take_along_axis(&scores, &idx, -1)?;
        let w = mlx_rs::ops::softmax_axis(&w, -1, false)?;
        let w = w.multiply(self.per_expert_scale.try_index(&idx)?)?;
        Ok((idx, w))
    }
}

#[derive(Debug, Clone, Flat)]
pub struct SwitchGlu {
    pub gate_proj: SwitchLinear,
    pub up_proj: SwitchLinear,
    pub down_proj: SwitchLinear,
}

impl SwitchGlu {
    /// Gemma-4's experts: the activation is the compiled `geglu`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        self.forward_with(x, indices, geglu)
    }

    /// mlx-lm's default `SwitchGLU` activation, `SwiGLU`: the compiled
    /// `swiglu(gate, up)` (qwen3_moe's experts).
    pub fn forward_swiglu(&self, x: &Array, indices: &Array) -> Result<Array> {
        self.forward_with(x, indices, swiglu)
    }

    /// `SwitchGLU.__call__` with `activation(x_up, x_gate)` calling
    /// `act(x_gate, x_up)`.
    fn forward_with(
        &self,
        x: &Array,
        indices: &Array,
        act: impl Fn(&Array, &Array) -> Result<Array>,
    ) -> Result<Array> {
        let x = x.expand_dims_axes(&[-2, -3])?;
        let indices = mlx_rs::stop_gradient(indices)?;
        let do_sort = indices.size() >= 64;
        let (x, idx, inv_order) = if do_sort {
            // _gather_sort
            let m = *indices.shape().last().unwrap();
            let flat = indices.flatten(None, None)?;
            let order = mlx_rs::ops::argsort_axis(&flat, -1)?;
            let inv_order = mlx_rs::ops::argsort_axis(&order, -1)?;
            // `order // M`: M a weak Python int, so the quotient stays
            // argsort's uint32 (an int32 array would promote both to int64:
            // two extra AsType nodes and int64 gather indices).
            let rows = order.floor_divide(Array::from_slice(&[m as u32], &[]))?;
            let x = x.flatten(0, -3)?.try_index(&rows)?;
            (x, flat.try_index(&order)?, Some(inv_order))
        } else {
            (x, indices.clone(), None)
        };
        let x_up = self.up_proj.forward(&x, &idx, do_sort)?;
        let x_gate = self.gate_proj.forward(&x, &idx, do_sort)?;
        let mut y = self
            .down_proj
            .forward(&act(&x_gate, &x_up)?, &idx, do_sort)?;
        if let Some(inv) = inv_order {
            // _scatter_unsort
            y = mlx_rs::ops::unflatten(y.try_index(&inv)?, 0, indices.shape())?;
        }
        y.squeeze_axes(&[-2])
    }
}

/// `Experts`: `(expand_dims(w, -1) * switch_glu(x, idx)).sum(-2)`.
pub fn experts(glu: &SwitchGlu, x: &Array, idx: &Array, w: &Array) -> Result<Array> {
    let w = w.expand_dims(-1)?;
    let y = glu.forward(x, idx)?;
    w.multiply(&y)?.sum_axis(-2, None)
}

/// The sizes routed experts load with (IR `Moe`): how many experts, how
/// many of them each token takes, and each one's hidden width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertsShape {
    pub count: i32,
    pub top_k: i32,
    pub width: i32,
}

/// Whether qwen3_moe's router renormalizes the chosen probabilities
/// (`norm_topk_prob`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopKProbs {
    /// `scores /= sum(scores, -1, keepdims=True)`.
    Renormalized,
    /// The softmax probabilities as taken.
    AsTaken,
}

/// qwen3_moe's router (`Qwen3MoeSparseMoeBlock.__call__`): `gates = gate(x)`,
/// `softmax(gates, precise=True)` over every expert (in the activation
/// dtype), `argpartition(gates, -k)[..., -k:]` on the probabilities,
/// `take_along_axis`, then the optional renormalization.
#[derive(Debug, Clone, Flat)]
#[flat(key(self.top_k, match self.probs {
    TopKProbs::Renormalized => 0,
    TopKProbs::AsTaken => 1,
}))]
pub struct SoftmaxTopKRouter {
    pub gate: Linear,
    #[flat(copied)]
    pub top_k: i32,
    #[flat(copied)]
    pub probs: TopKProbs,
}

impl SoftmaxTopKRouter {
    /// Returns (top-k indices, their weights), in argpartition's order.
    pub fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = mlx_rs::ops::softmax_axis(&self.gate.forward(x)?, -1, true)?;
        let k = self.top_k;
        let idx = mlx_rs::ops::argpartition_axis(&gates, -k, -1)?;
        let idx = mlx_rs::stop_gradient(idx.try_index((Ellipsis, -k..))?)?;
        let scores = mlx_rs::ops::indexing::take_along_axis(&gates, &idx, -1)?;
        let scores = match self.probs {
            TopKProbs::Renormalized => scores.divide(scores.sum_axis(-1, true)?)?,
            TopKProbs::AsTaken => scores,
        };
        Ok((idx, scores))
    }
}

/// qwen3_moe's sparse MoE block: route, SwiGLU experts, then
/// `(y * scores[..., None]).sum(-2).astype(y.dtype)`.
pub fn softmax_topk_moe(router: &SoftmaxTopKRouter, glu: &SwitchGlu, x: &Array) -> Result<Array> {
    let (idx, scores) = router.route(x)?;
    let y = glu.forward_swiglu(x, &idx)?;
    let dtype = y.dtype();
    y.multiply(scores.expand_dims(-1)?)?
        .sum_axis(-2, None)?
        .as_dtype(dtype)
}
