//! The MoE blocks as mlx-lm runs them: Gemma-4's router (norm -> scale ->
//! project -> argpartition top-k -> softmax over the k -> per-expert scale),
//! qwen3_moe's (project -> precise softmax over all experts -> argpartition
//! top-k of the probabilities -> optional renormalization), and SwitchGLU
//! experts with gather matmuls, sorting tokens by expert when B*L*k >= 64.

use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
use mlx_rs::Array;

use crate::flat::Flat;
use crate::layers::{Linear, SwitchLinear};
use crate::ops::{geglu, rms_norm, scalar_like, swiglu, swiglu_oai, Result};

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

    /// gpt_oss's experts: `SwigluOAI()`, the compiled `swiglu_oai(gate, up)`.
    pub fn forward_swiglu_oai(&self, x: &Array, indices: &Array) -> Result<Array> {
        self.forward_with(x, indices, swiglu_oai)
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

// Whether qwen3_moe's router renormalizes the chosen probabilities
// (`norm_topk_prob`): the IR's fact itself, `Renormalized` being
// `scores /= sum(scores, -1, keepdims=True)`.
pub use archgen_ir::TopKProbs;

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
    weighted_swiglu_experts(glu, x, &idx, &scores)
}

/// The SwiGLU experts `idx` picked, weighted by their `scores` and summed:
/// `(y * scores[..., None]).sum(-2).astype(y.dtype)` (float32 scores promote
/// the product; the sum comes back to the experts' dtype).
fn weighted_swiglu_experts(
    glu: &SwitchGlu,
    x: &Array,
    idx: &Array,
    scores: &Array,
) -> Result<Array> {
    let y = glu.forward_swiglu(x, idx)?;
    let dtype = y.dtype();
    y.multiply(scores.expand_dims(-1)?)?
        .sum_axis(-2, None)?
        .as_dtype(dtype)
}

/// The facts of glm4_moe's `noaux_tc` router (`group_expert_select`'s
/// Python arguments, which `mx.compile` bakes into its trace).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupTopK {
    pub top_k: i32,
    /// `n_group` (1: every expert eligible).
    pub n_group: i32,
    /// `topk_group`: the groups that stay eligible.
    pub topk_group: i32,
    pub probs: TopKProbs,
    /// `routed_scaling_factor`, a Python float (a weak scalar: float32 here).
    pub routed_scaling_factor: f64,
}

type CompiledSelect = Box<dyn for<'a> FnMut(&'a [Array]) -> Result<Vec<Array>>>;

thread_local! {
    // One compiled `group_expert_select` per set of constants, as mlx-lm's
    // `@mx.compile` keeps one trace per distinct non-array argument.
    static GROUP_SELECT: std::cell::RefCell<Vec<(GroupTopK, CompiledSelect)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// glm4_moe's `group_expert_select` on the gate's logits and the float32
/// `e_score_correction_bias`, traced with `mx.compile` (not shapeless) as
/// mlx-lm runs it: returns (top-k indices, their float32 weights), in
/// argpartition's order.
pub fn group_expert_select(
    facts: GroupTopK,
    gates: &Array,
    correction_bias: &Array,
) -> Result<(Array, Array)> {
    let out = GROUP_SELECT.with(|cell| {
        let mut table = cell.borrow_mut();
        let at = match table.iter().position(|(k, _)| *k == facts) {
            Some(at) => at,
            None => {
                let graph =
                    move |inputs: &[Array]| -> Result<Vec<Array>> { select_graph(facts, inputs) };
                table.push((
                    facts,
                    Box::new(mlx_rs::transforms::compile::compile(graph, false)),
                ));
                table.len() - 1
            }
        };
        (table[at].1)(&[gates.clone(), correction_bias.clone()])
    })?;
    let [inds, scores] = <[Array; 2]>::try_from(out).map_err(|_| {
        mlx_rs::error::Exception::custom("group_expert_select: expected two outputs")
    })?;
    Ok((inds, scores))
}

/// The body of `group_expert_select`, op for op.
fn select_graph(f: GroupTopK, inputs: &[Array]) -> Result<Vec<Array>> {
    let (gates, bias) = (&inputs[0], &inputs[1]);
    let scores = mlx_rs::ops::sigmoid(gates.as_dtype(mlx_rs::Dtype::Float32)?)?;
    let orig_scores = scores.clone();
    let mut scores = scores.add(bias)?;
    if f.n_group > 1 {
        scores = mlx_rs::ops::unflatten(&scores, -1, &[f.n_group, -1])?;
        let group_scores = mlx_rs::ops::indexing::topk_axis(&scores, 2, -1)?.sum_axis(-1, true)?;
        let k = f.n_group - f.topk_group;
        let group_idx = mlx_rs::ops::argpartition_axis(&group_scores, k - 1, -2)?;
        let group_idx = group_idx.try_index((Ellipsis, ..k, ..))?;
        // `mx.array(0.0)`: a float32 array, not a weak scalar.
        scores =
            scores.put_along_axis(mlx_rs::stop_gradient(&group_idx)?, Array::from_f32(0.0), -2)?;
        scores = scores.flatten(-2, -1)?;
    }
    let k = f.top_k;
    let inds = mlx_rs::ops::argpartition_axis(scores.negative()?, k - 1, -1)?;
    let inds = mlx_rs::stop_gradient(inds.try_index((Ellipsis, ..k))?)?;
    let mut scores = mlx_rs::ops::indexing::take_along_axis(&orig_scores, &inds, -1)?;
    match f.probs {
        TopKProbs::Renormalized if f.top_k > 1 => {
            scores = scores.divide(scores.sum_axis(-1, true)?)?;
        }
        TopKProbs::Renormalized | TopKProbs::AsTaken => {}
    }
    let scores = scores.multiply(scalar_like(f.routed_scaling_factor, &scores))?;
    Ok(vec![inds, scores])
}

/// glm4_moe's router (`MoEGate`): `x @ weight.T` (a plain, never quantized
/// parameter), then [`group_expert_select`].
#[derive(Debug, Clone, Flat)]
#[flat(key(self.facts.top_k, self.facts.n_group, self.facts.topk_group,
    match self.facts.probs {
        TopKProbs::Renormalized => 0,
        TopKProbs::AsTaken => 1,
    },
    self.facts.routed_scaling_factor.to_bits() as i64))]
pub struct SigmoidGroupRouter {
    pub gate: Linear,
    pub correction_bias: Array,
    #[flat(copied)]
    pub facts: GroupTopK,
}

impl SigmoidGroupRouter {
    /// Returns (top-k indices, their float32 weights), in argpartition's order.
    pub fn route(&self, x: &Array) -> Result<(Array, Array)> {
        group_expert_select(self.facts, &self.gate.forward(x)?, &self.correction_bias)
    }
}

/// The routed half of glm4_moe's `MoE`: route, then the weighted SwiGLU
/// experts as qwen3_moe's block sums them.
pub fn sigmoid_group_moe(router: &SigmoidGroupRouter, glu: &SwitchGlu, x: &Array) -> Result<Array> {
    let (idx, scores) = router.route(x)?;
    weighted_swiglu_experts(glu, x, &idx, &scores)
}

/// gpt_oss's router (`MLPBlock.__call__`): `g = router(x)` (a biased
/// linear), `mlx_topk`: `argpartition(g, kth=-k)[..., -k:]`, `take_along_axis`,
/// then `softmax(precise=True)` over the k chosen logits, in their dtype.
#[derive(Debug, Clone, Flat)]
#[flat(key(self.top_k))]
pub struct TopKSoftmaxRouter {
    pub router: Linear,
    #[flat(copied)]
    pub top_k: i32,
}

impl TopKSoftmaxRouter {
    /// Returns (top-k indices, their weights), in argpartition's order.
    pub fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let g = self.router.forward(x)?;
        let k = self.top_k;
        let idx = mlx_rs::ops::argpartition_axis(&g, -k, -1)?;
        let idx = mlx_rs::stop_gradient(idx.try_index((Ellipsis, -k..))?)?;
        let chosen = mlx_rs::ops::indexing::take_along_axis(&g, &idx, -1)?;
        Ok((idx, mlx_rs::ops::softmax_axis(&chosen, -1, true)?))
    }
}

/// gpt_oss's `MLPBlock`: route, the biased experts with the clamped SwiGLU,
/// `x * expand_dims(expert_weights, -1)`, summed over the k (no cast: the
/// weights are in the experts' dtype).
pub fn biased_experts_moe(router: &TopKSoftmaxRouter, glu: &SwitchGlu, x: &Array) -> Result<Array> {
    let (idx, weights) = router.route(x)?;
    let y = glu.forward_swiglu_oai(x, &idx)?;
    y.multiply(weights.expand_dims(-1)?)?.sum_axis(-2, None)
}
