//! The blocks of the hybrid Qwen3.5 / Qwen3.6 models (mlx-lm 0.32.2's
//! `qwen3_5.py`, `qwen3_5_moe.py`, with `qwen3_next.py` and
//! `gated_delta.py`), op for op as mlx-lm runs them on the CPU:
//!
//! ```text
//! linear layer: h = x + GatedDeltaNet(norm(x))     full layer: h = x + GatedAttention(norm(x))
//!               out = h + ffn(norm(h))             ffn: SwiGLU MLP, or routed experts + shared expert
//! ```
//!
//! A Gated DeltaNet layer projects `qkv`, `z`, `b`, `a`; runs a depthwise
//! causal conv1d over `qkv` (its last `K - 1` inputs are the conv state, in
//! the activation dtype); L2-normalises q and k; runs the gated delta rule
//! recurrence over the tokens (its state [B, Hv, Dv, Dk] is float32); then a
//! gated RMSNorm with `z` and the output projection. Its cache is mlx-lm's
//! `ArraysCache(size=2)`: [`ArraysCache`].
//!
//! The recurrence is the path mlx-lm takes off Metal (`gated_delta_ops`):
//! a loop over the tokens of one compiled step. On Metal mlx-lm runs a custom
//! kernel instead, whose float reductions are ordered differently (see
//! docs/parity.md); nothing here reproduces that kernel.
//!
//! `mx.compile`d functions of mlx-lm are compiled here too (same ops, same
//! `shapeless` flag). On the CPU the delta rule's step takes its inputs
//! already expanded ([`gated_delta_ops`] says why), so MLX fuses its
//! elementwise ops into fewer kernels than mlx-lm's graph gets; each element
//! goes through the same float32 operations, and the parity tests compare
//! the bytes. A GPU runs mlx-lm's graph as it is.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

use crate::attention::{batch_and_len, Mask};
use crate::blocks::{attend_own_kv, AttentionShape, Mlp, SparseMoe};
use crate::cache::LayerCache;
use crate::distributed::sharded_to_all;
use crate::flat::Flat;
use crate::layers::{pretranspose_all, Linear};
use crate::moe::{softmax_topk_moe, SoftmaxTopKRouter, SwitchGlu};
use crate::ops::{rms_norm, scalar_like, Result};
use crate::rope::Rope;
use crate::weights::Weights;

fn refused(what: String) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(what)
}

// ---- Compiled functions (mlx-lm's `mx.compile` and mlx nn's)

type Compiled1 = Box<dyn for<'a> FnMut(&'a Array) -> Result<Array>>;
type Compiled3 = Box<dyn for<'a> FnMut((&'a Array, &'a Array, &'a Array)) -> Result<Array>>;
type CompiledN = Box<dyn for<'a> FnMut(&'a [Array]) -> Result<Vec<Array>>>;

/// mlx nn's `silu(x) = x * sigmoid(x)` (`mx.compile`, shapeless).
fn silu_graph(x: &Array) -> Result<Array> {
    x.multiply(mlx_rs::ops::sigmoid(x)?)
}

/// `compute_g` (gated_delta.py, shapeless):
/// `exp(-exp(A_log.astype(f32)) * nn.softplus(a + dt_bias))`, with mlx nn's
/// `softplus(x) = logaddexp(x, 0)` inlined (the 0 a weak scalar of x's dtype).
fn compute_g_graph((a_log, a, dt_bias): (&Array, &Array, &Array)) -> Result<Array> {
    let x = a.add(dt_bias)?;
    let softplus = mlx_rs::ops::logaddexp(&x, scalar_like(0.0, &x))?;
    let decay = a_log.as_dtype(Dtype::Float32)?.exp()?.negative()?;
    decay.multiply(&softplus)?.exp()
}

/// `precise_swiglu(h, gate, x)` (activations.py, shapeless):
/// `(silu(gate.astype(f32)) * x.astype(f32)).astype(h.dtype)`; `h` only
/// gives the dtype, as in mlx-lm (it is an input of the compiled graph there
/// too, so the final cast is traced inside it).
fn precise_swiglu_graph((h, gate, x): (&Array, &Array, &Array)) -> Result<Array> {
    let gate = silu_graph(&gate.as_dtype(Dtype::Float32)?)?;
    gate.multiply(x.as_dtype(Dtype::Float32)?)?
        .as_dtype(h.dtype())
}

/// How the recurrence's graph is laid out, by the device it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecurrenceGraph {
    /// mlx-lm's graph view for view: each token's inputs sliced and
    /// squeezed, expanded inside the step, the sums dropping their axis, y
    /// cast in every step. On a GPU, whose kernels can give other bits for
    /// other layouts (docs/parity.md, "On the GPU": build the graph Python
    /// builds).
    AsMlxLm,
    /// The same float32 operations on every element with fewer view nodes
    /// ([`gated_delta_ops`] says how): on the CPU, whose kernels give the
    /// same bits for any layout (the parity tests compare the bytes).
    Lean,
}

impl RecurrenceGraph {
    fn here() -> Self {
        match crate::device::on_cpu() {
            true => RecurrenceGraph::Lean,
            false => RecurrenceGraph::AsMlxLm,
        }
    }
}

/// `_gated_delta_step_ops` (gated_delta.py, `mx.compile`, not shapeless), for
/// a scalar gate per head and no mask, over one token's inputs as `form`
/// lays them out ([`delta_step_ops`]). Outputs: y and the new state.
fn delta_step_graph(form: RecurrenceGraph, inputs: &[Array]) -> Result<Vec<Array>> {
    let [q, k, v, g, beta, state] = inputs else {
        return Err(refused(format!(
            "gated delta step: 6 inputs expected, got {}",
            inputs.len()
        )));
    };
    let (y, state) = delta_step_ops(form, [q, k, v, g, beta, state])?;
    Ok(vec![y, state])
}

/// The body of `_gated_delta_step_ops`, shared by the unmasked and the
/// masked graph: the state decayed by `g` and corrected by the delta rule,
/// and the output `y` read from it with `q`. The ops and their operands are
/// mlx-lm's, in its order; `form` says where the views are taken.
///
/// [`RecurrenceGraph::AsMlxLm`]: q, k [B, H, Dk], v [B, H, Dv], g and beta
/// [B, H], the state [B, H, Dv, Dk]; the expansions are taken here, and y
/// [B, H, Dv] is cast to q's dtype.
///
/// [`RecurrenceGraph::Lean`]: every input in float32 (as the products
/// promote it) and already in the shape its product takes, with the token's
/// time axis of 1 kept ([`gated_delta_ops`]): q and k [B, 1, H, 1, Dk]
/// (mlx-lm's `k[..., None, :]`), v [B, 1, H, Dv, 1], g [B, 1, H, 1, 1]
/// (`g[..., None, None]`), beta [B, 1, H, 1, 1] (`beta[..., None]`), the
/// state [B, 1, H, Dv, Dk]. The sums keep their axis (MLX's sum computes
/// that shape and then drops the axis), so `kv_mem`, `delta` and y are
/// [B, 1, H, Dv, 1] and `delta` needs no `[..., None]`; y stays float32
/// (the caller casts all tokens' at once).
fn delta_step_ops(
    form: RecurrenceGraph,
    [q, k, v, g, beta, state]: [&Array; 6],
) -> Result<(Array, Array)> {
    match form {
        RecurrenceGraph::AsMlxLm => {
            let decay = g.expand_dims_axes(&[-1, -2])?;
            let state = state.multiply(&decay)?;
            let k_row = k.expand_dims(-2)?;
            let kv_mem = state.multiply(&k_row)?.sum_axis(-1, None)?;
            let delta = v.subtract(&kv_mem)?.multiply(beta.expand_dims(-1)?)?;
            let state = state.add(k_row.multiply(delta.expand_dims(-1)?)?)?;
            let y = state.multiply(q.expand_dims(-2)?)?.sum_axis(-1, None)?;
            Ok((y.as_dtype(q.dtype())?, state))
        }
        RecurrenceGraph::Lean => {
            let state = state.multiply(g)?;
            let kv_mem = state.multiply(k)?.sum_axis(-1, true)?;
            let delta = v.subtract(&kv_mem)?.multiply(beta)?;
            let state = state.add(k.multiply(&delta)?)?;
            let y = state.multiply(q)?.sum_axis(-1, true)?;
            Ok((y, state))
        }
    }
}

thread_local! {
    // One compiled function per thread, so MLX's compile cache is hit on
    // every call (the step is shape-specialised: one trace per shape).
    static SILU: std::cell::RefCell<Compiled1> =
        std::cell::RefCell::new(Box::new(mlx_rs::transforms::compile::compile(silu_graph, true)));
    static COMPUTE_G: std::cell::RefCell<Compiled3> =
        std::cell::RefCell::new(Box::new(mlx_rs::transforms::compile::compile(compute_g_graph, true)));
    static PRECISE_SWIGLU: std::cell::RefCell<Compiled3> =
        std::cell::RefCell::new(Box::new(mlx_rs::transforms::compile::compile(precise_swiglu_graph, true)));
    // The step in each form, unmasked and masked (four traced graphs).
    static DELTA_STEP: std::cell::RefCell<CompiledN> = std::cell::RefCell::new(Box::new(
        mlx_rs::transforms::compile::compile(|x: &[Array]| delta_step_graph(RecurrenceGraph::AsMlxLm, x), false),
    ));
    static MASKED_STEP: std::cell::RefCell<CompiledN> = std::cell::RefCell::new(Box::new(
        mlx_rs::transforms::compile::compile(|x: &[Array]| masked_step_graph(RecurrenceGraph::AsMlxLm, x), false),
    ));
    static LEAN_STEP: std::cell::RefCell<CompiledN> = std::cell::RefCell::new(Box::new(
        mlx_rs::transforms::compile::compile(|x: &[Array]| delta_step_graph(RecurrenceGraph::Lean, x), false),
    ));
    static LEAN_MASKED_STEP: std::cell::RefCell<CompiledN> = std::cell::RefCell::new(Box::new(
        mlx_rs::transforms::compile::compile(|x: &[Array]| masked_step_graph(RecurrenceGraph::Lean, x), false),
    ));
}

/// mlx nn's compiled `silu`.
pub fn silu(x: &Array) -> Result<Array> {
    SILU.with(|f| (f.borrow_mut())(x))
}

/// `compute_g(A_log, a, dt_bias)`: the per-token, per-head decay (float32).
pub fn compute_g(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    COMPUTE_G.with(|f| (f.borrow_mut())((a_log, a, dt_bias)))
}

/// mlx-lm's compiled `precise_swiglu(h, gate, x)`.
pub fn precise_swiglu(h: &Array, gate: &Array, x: &Array) -> Result<Array> {
    PRECISE_SWIGLU.with(|f| (f.borrow_mut())((h, gate, x)))
}

/// One call of a compiled step graph that returns y and the new state.
fn run_step(
    step: &'static std::thread::LocalKey<std::cell::RefCell<CompiledN>>,
    inputs: &[Array],
    what: &str,
) -> Result<(Array, Array)> {
    let mut out = step.with(|f| (f.borrow_mut())(inputs))?;
    match (out.pop(), out.pop()) {
        (Some(state), Some(y)) => Ok((y, state)),
        _ => Err(refused(format!("{what}: two outputs expected"))),
    }
}

/// `_gated_delta_step_ops` called with a mask (mlx-lm compiles it; with a
/// mask it is another traced graph): the unmasked step, then
/// `state = where(mask[:, None, None, None], state, old_state)`; the
/// token's mask comes as [B] ([`RecurrenceGraph::AsMlxLm`], expanded here)
/// or already as [B, 1, 1, 1, 1] ([`RecurrenceGraph::Lean`]).
fn masked_step_graph(form: RecurrenceGraph, inputs: &[Array]) -> Result<Vec<Array>> {
    let [q, k, v, g, beta, old_state, mask] = inputs else {
        return Err(refused(format!(
            "masked gated delta step: 7 inputs expected, got {}",
            inputs.len()
        )));
    };
    let (y, state) = delta_step_ops(form, [q, k, v, g, beta, old_state])?;
    let mask = match form {
        RecurrenceGraph::AsMlxLm => mask.expand_dims_axes(&[1, 2, 3])?,
        RecurrenceGraph::Lean => mask.clone(),
    };
    let state = mlx_rs::ops::select(&mask, &state, old_state)?;
    Ok(vec![y, state])
}

// ---- The recurrence

/// `normalize_qk(q, k, inv_scale=Dk**-0.5, eps=1e-6)`: L2-normalise q and k
/// with `mx.fast.rms_norm` (its eps scaled by `inv_scale**2`) and fold the
/// readout scale into q. The Python floats are computed in f64 and meet the
/// arrays as weak scalars.
pub fn normalize_qk(q: &Array, k: &Array, head_k_dim: i32) -> Result<(Array, Array)> {
    let (inv_scale_sq, inv_scale) = qk_scales(head_k_dim);
    let q_scale = scalar_like(inv_scale_sq, q);
    let k_scale = scalar_like(inv_scale, k);
    normalize_qk_with(q, k, head_k_dim, (&q_scale, &k_scale))
}

/// `normalize_qk`'s Python floats for `head_k_dim`, computed in f64:
/// (`inv_scale**2`, `inv_scale`).
pub fn qk_scales(head_k_dim: i32) -> (f64, f64) {
    let inv_scale = f64::from(head_k_dim).powf(-0.5);
    (inv_scale.powf(2.0), inv_scale)
}

/// The eps of `normalize_qk`'s `rms_norm`: `1e-6 * inv_scale**2` as float32.
pub fn qk_norm_eps(head_k_dim: i32) -> f32 {
    (1e-6 * qk_scales(head_k_dim).0) as f32
}

/// [`normalize_qk`] with its two scales given as scalar arrays (q's
/// `inv_scale**2`, k's `inv_scale`), cast to q's and k's dtype: a compiled
/// decode block passes them as traced inputs, not inlined constants
/// (`decode::reads_back`). A float32 scalar cast to bfloat16 or float16
/// rounds to nearest even, as [`scalar_like`] does.
pub fn normalize_qk_with(
    q: &Array,
    k: &Array,
    head_k_dim: i32,
    (q_scale, k_scale): (&Array, &Array),
) -> Result<(Array, Array)> {
    let rms_eps = qk_norm_eps(head_k_dim);
    let q = q_scale
        .as_dtype(q.dtype())?
        .multiply(rms_norm(q, None, rms_eps)?)?;
    let k = k_scale
        .as_dtype(k.dtype())?
        .multiply(rms_norm(k, None, rms_eps)?)?;
    Ok((q, k))
}

/// What `gated_delta_update` starts from: the recurrent state (zeros
/// [B, Hv, Dv, Dk] in f32 when there is none yet) and q, k repeated to the
/// value heads (`mx.repeat(q, Hv // Hk, -2)` when there are fewer key heads).
pub(crate) fn delta_rule_inputs(
    q: &Array,
    k: &Array,
    v: &Array,
    state: Option<&Array>,
) -> Result<(Array, Array, Array)> {
    let (b, hk, dk) = (q.shape()[0], q.shape()[2], q.shape()[3]);
    let (hv, dv) = (v.shape()[2], v.shape()[3]);
    let state = match state {
        Some(s) => s.clone(),
        None => mlx_rs::ops::zeros_dtype(&[b, hv, dv, dk], Dtype::Float32)?,
    };
    let repeat = hv / hk;
    let (q, k) = if repeat > 1 {
        (
            Array::repeat_axis::<f32>(q.clone(), repeat, -2)?,
            Array::repeat_axis::<f32>(k.clone(), repeat, -2)?,
        )
    } else {
        (q.clone(), k.clone())
    };
    Ok((state, q, k))
}

/// `gated_delta_ops` (prefill and decode alike): q, k [B, T, Hk, Dk], v
/// [B, T, Hv, Dv], g and beta [B, T, Hv], state [B, Hv, Dv, Dk] or zeros;
/// q and k repeated to Hv heads, then one compiled step per token. Returns
/// y [B, T, Hv, Dv] and the final state. With a `mask` [B, T] (a batch's
/// padding) each token runs mlx-lm's masked step, a compiled graph of its
/// own that keeps a padded row's state.
///
/// mlx-lm's loop slices each token's inputs (`q[:, t]`: a slice and a
/// squeeze per input), expands them inside the step (`k[..., None, :]` and
/// the like) and drops the summed axis (a squeeze per sum). On the CPU
/// each of those views is a node that MLX schedules on its own, and with
/// tiny per-token work the scheduling is most of a prefill's time. On the
/// CPU ([`RecurrenceGraph::Lean`]; a GPU keeps mlx-lm's graph, views and
/// all) the inputs are cast and expanded once for all tokens and sliced per token
/// keeping a time axis of 1 (the state carries it too, [B, 1, Hv, Dv,
/// Dk]), the sums keep their axis, and the y's are concatenated along the
/// time axis (shapes: [`delta_step_ops`]). A 32-token prefill of
/// qwen3.5-4b-tiny went from 6,066 graph nodes to 3,066. The same
/// elementwise ops and last-axis sums run over the same values in the same
/// order, so the bits are mlx-lm's (tests/generated_parity.rs and
/// tests/batch_parity.rs compare them).
pub fn gated_delta_ops(
    [q, k, v, g, beta]: [&Array; 5],
    state: Option<&Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    if g.ndim() != 3 {
        return Err(refused(format!(
            "gated delta rule: a scalar gate per head [B, T, Hv] expected, got shape {:?} \
             (mlx-lm's vector gate is not used by Qwen3.5)",
            g.shape()
        )));
    }
    match (q.shape()[1] > 1, crate::device::chunked_delta_rule()) {
        (true, true) => {
            crate::device::count_outcome(crate::device::LeverOutcome::ChunkedPrefill);
            chunked_scan([q, k, v, g, beta], state, mask)
        }
        (true, false) | (false, _) => {
            scan(RecurrenceGraph::here(), [q, k, v, g, beta], state, mask)
        }
    }
}

/// The loop over the tokens in `form`: each token's inputs (as the form
/// lays them out, [`delta_step_ops`]), one compiled step each, then the y's
/// joined along the time axis and the final state.
fn scan(
    form: RecurrenceGraph,
    [q, k, v, g, beta]: [&Array; 5],
    state: Option<&Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let t = q.shape()[1];
    let (state, q, k) = delta_rule_inputs(q, k, v, state)?;
    let y_dtype = q.dtype();
    let (tokens, masks, mut state) = match form {
        // mlx-lm's `q[:, t]`: a slice and a squeeze per input and token.
        RecurrenceGraph::AsMlxLm => {
            let at = |a: &Array| {
                (0..t)
                    .map(|i| a.try_index((.., i)))
                    .collect::<Result<Vec<_>>>()
            };
            let tokens = [at(&q)?, at(&k)?, at(v)?, at(g)?, at(beta)?];
            (tokens, mask.map(at).transpose()?, state)
        }
        // Every product promotes q, k, v and beta to the state's float32
        // (an exact cast), and y is cast back to q's dtype after the loop:
        // both once for every token rather than in each step. mlx-lm's
        // `q[..., None, :]`, `g[..., None, None]`, `beta[..., None]` and
        // `mask[:, None, None, None]` are taken once for every token too, v
        // and beta with the trailing axis the kept sums have; each token is
        // a slice keeping the time axis.
        RecurrenceGraph::Lean => {
            let f32 = |a: &Array| a.as_dtype(Dtype::Float32);
            let split = |a: Array| match t {
                1 => Ok(vec![a]),
                _ => a.split_equal(t, 1),
            };
            let tokens = [
                split(f32(&q)?.expand_dims(-2)?)?,
                split(f32(&k)?.expand_dims(-2)?)?,
                split(f32(v)?.expand_dims(-1)?)?,
                split(g.expand_dims_axes(&[-1, -2])?)?,
                split(f32(beta)?.expand_dims_axes(&[-1, -2])?)?,
            ];
            let masks = match mask {
                Some(m) => Some(split(m.expand_dims_axes(&[2, 3, 4])?)?),
                None => None,
            };
            (tokens, masks, state.expand_dims(1)?)
        }
    };
    let (step, masked_step) = match form {
        RecurrenceGraph::AsMlxLm => (&DELTA_STEP, &MASKED_STEP),
        RecurrenceGraph::Lean => (&LEAN_STEP, &LEAN_MASKED_STEP),
    };
    let mut ys = Vec::with_capacity(t as usize);
    for i in 0..t as usize {
        let mut inputs: Vec<Array> = tokens.iter().map(|a| a[i].clone()).collect();
        inputs.push(state);
        let (y, next) = match &masks {
            None => run_step(step, &inputs, "gated delta step")?,
            Some(masks) => {
                inputs.push(masks[i].clone());
                run_step(masked_step, &inputs, "masked gated delta step")?
            }
        };
        ys.push(y);
        state = next;
    }
    match form {
        RecurrenceGraph::AsMlxLm => Ok((mlx_rs::ops::stack(&ys, 1)?, state)),
        RecurrenceGraph::Lean => {
            let y = match t {
                1 => ys
                    .pop()
                    .ok_or_else(|| refused("gated delta rule: no token".into()))?,
                _ => mlx_rs::ops::concatenate(&ys, 1)?,
            };
            let y = y.squeeze_axes(&[-1])?.as_dtype(y_dtype)?;
            Ok((y, state.squeeze_axes(&[1])?))
        }
    }
}

/// Tokens per chunk of [`chunked_scan`]: its matrices are chunk x chunk per
/// head, and its decay ratios stay within float32 over a chunk.
const CHUNK_TOKENS: i32 = 64;

/// The lowest log-decay a token contributes in [`chunked_scan`]: a decay
/// below e^-60 is taken as e^-60, so that no ratio of two decays is
/// `-inf - -inf`.
const MIN_LOG_DECAY: f32 = -60.0;

/// The gated delta rule over many tokens in chunks (the chunkwise form of
/// Gated DeltaNet, lever `deltanet-chunked-prefill`, L3): the same state and
/// outputs as [`gated_delta_ops`] up to float32 rounding, with a few dozen
/// graph nodes per chunk of [`CHUNK_TOKENS`] in place of a compiled step and
/// its views per token.
///
/// Within a chunk starting from state S0 ([Dv, Dk] per head), with
/// gamma_t = g_1 ... g_t: each token's correction u_t = beta_t (v_t - g_t
/// S_(t-1) k_t) satisfies `u_t + beta_t sum_(j<t) (gamma_t / gamma_j) (k_t .
/// k_j) u_j = beta_t (v_t - gamma_t S0 k_t)`, a unit lower-triangular system
/// solved for all t at once; then `y_t = gamma_t S0 q_t + sum_(j<=t) (gamma_t
/// / gamma_j) (q_t . k_j) u_j` and the chunk's last state is `gamma_C S0 +
/// sum_j (gamma_C / gamma_j) u_j k_j^T`. A padded token (`mask` false) has
/// no decay and no correction, so it leaves the state as mlx-lm's masked
/// step does; its y is not mlx-lm's (no later real token reads it).
/// Matrices: MLX's triangular solve, which runs on the CPU.
pub fn chunked_scan(
    [q, k, v, g, beta]: [&Array; 5],
    state: Option<&Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let t = q.shape()[1];
    let (mut state, q, k) = delta_rule_inputs(q, k, v, state)?;
    let y_dtype = q.dtype();
    // [B, H, T, D] and [B, H, T], float32.
    let heads_first = |a: &Array| a.as_dtype(Dtype::Float32)?.transpose_axes(&[0, 2, 1, 3]);
    let (q, k, v) = (heads_first(&q)?, heads_first(&k)?, heads_first(v)?);
    let per_head = |a: &Array| a.as_dtype(Dtype::Float32)?.transpose_axes(&[0, 2, 1]);
    let log_decay = mlx_rs::ops::maximum(&per_head(g)?.log()?, Array::from_f32(MIN_LOG_DECAY))?;
    let beta = per_head(beta)?;
    let (log_decay, beta) = match mask {
        Some(m) => {
            let m = m.expand_dims(1)?;
            let zero = Array::from_f32(0.0);
            (
                mlx_rs::ops::select(&m, &log_decay, &zero)?,
                mlx_rs::ops::select(&m, &beta, &zero)?,
            )
        }
        None => (log_decay, beta),
    };
    let mut ys = Vec::new();
    let mut start = 0;
    while start < t {
        let end = (start + CHUNK_TOKENS).min(t);
        let tokens = |a: &Array| a.try_index((.., .., start..end));
        let (y, next) = chunk_step(
            [&tokens(&q)?, &tokens(&k)?, &tokens(&v)?],
            &tokens(&log_decay)?,
            &tokens(&beta)?,
            &state,
        )?;
        ys.push(y);
        state = next;
        start = end;
    }
    let y = match ys.len() {
        1 => ys
            .pop()
            .ok_or_else(|| refused("chunked delta rule: no token".into()))?,
        _ => mlx_rs::ops::concatenate(&ys, 2)?,
    };
    Ok((y.transpose_axes(&[0, 2, 1, 3])?.as_dtype(y_dtype)?, state))
}

/// One chunk of [`chunked_scan`]: q, k [B, H, C, Dk], v [B, H, C, Dv], the
/// log-decays and betas [B, H, C], the state [B, H, Dv, Dk]; returns y [B,
/// H, C, Dv] (float32) and the state after the chunk.
fn chunk_step(
    [q, k, v]: [&Array; 3],
    log_decay: &Array,
    beta: &Array,
    state: &Array,
) -> Result<(Array, Array)> {
    let c = q.shape()[2];
    let cum = mlx_rs::ops::cumsum(log_decay, -1, false, true)?;
    // decay[t, j] = gamma_t / gamma_j for j <= t, else 0.
    let ones = mlx_rs::ops::ones::<bool>(&[c, c])?;
    let causal = mlx_rs::ops::tril(&ones, 0)?;
    let before = mlx_rs::ops::tril(&ones, -1)?;
    let ratio = cum.expand_dims(-1)?.subtract(cum.expand_dims(-2)?)?;
    let decay = mlx_rs::ops::select(&causal, &ratio, Array::from_f32(f32::NEG_INFINITY))?.exp()?;
    let keys_t = k.transpose_axes(&[0, 1, 3, 2])?;
    let state_t = state.transpose_axes(&[0, 1, 3, 2])?;
    let gamma = cum.exp()?.expand_dims(-1)?;
    let beta_col = beta.expand_dims(-1)?;
    let mixing = beta_col.multiply(&decay)?.multiply(k.matmul(&keys_t)?)?;
    let mixing = mlx_rs::ops::select(&before, &mixing, Array::from_f32(0.0))?;
    let system = mixing.add(mlx_rs::ops::eye::<f32>(c, None, None)?)?;
    let target = beta_col.multiply(v.subtract(gamma.multiply(k.matmul(&state_t)?)?)?)?;
    let u = mlx_rs::linalg::solve_triangular(&system, &target, false)?;
    let y = gamma
        .multiply(q.matmul(&state_t)?)?
        .add(decay.multiply(q.matmul(&keys_t)?)?.matmul(&u)?)?;
    let last = cum.try_index((.., .., (c - 1)..c))?;
    let to_end = last.subtract(&cum)?.exp()?.expand_dims(-1)?;
    let state = last.exp()?.expand_dims(-1)?.multiply(state)?.add(
        u.multiply(&to_end)?
            .transpose_axes(&[0, 1, 3, 2])?
            .matmul(k)?,
    )?;
    Ok((y, state))
}

/// `gated_delta_update` without a mask, off Metal: `beta = sigmoid(b)`,
/// `g = compute_g(A_log, a, dt_bias)`, then [`gated_delta_ops`].
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update(
    q: &Array,
    k: &Array,
    v: &Array,
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    state: Option<&Array>,
) -> Result<(Array, Array)> {
    let beta = mlx_rs::ops::sigmoid(b)?;
    let g = compute_g(a_log, a, dt_bias)?;
    gated_delta_ops([q, k, v, &g, &beta], state, None)
}

// ---- The Gated DeltaNet layer

/// The static shape of a Gated DeltaNet layer (`linear_*` of the config).
#[derive(Debug, Clone, Copy)]
pub struct DeltaNetShape {
    pub hidden: i32,
    pub num_k_heads: i32,
    pub num_v_heads: i32,
    pub head_k_dim: i32,
    pub head_v_dim: i32,
    /// `linear_conv_kernel_dim`.
    pub conv_kernel: i32,
    /// `rms_norm_eps`, the gated norm's eps.
    pub eps: f32,
}

impl DeltaNetShape {
    pub fn key_dim(&self) -> i32 {
        self.head_k_dim * self.num_k_heads
    }
    pub fn value_dim(&self) -> i32 {
        self.head_v_dim * self.num_v_heads
    }
    /// Channels of the conv: q, k and v side by side.
    pub fn conv_dim(&self) -> i32 {
        2 * self.key_dim() + self.value_dim()
    }
    /// mlx-lm refuses value heads that are not a multiple of key heads.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.num_k_heads <= 0 || self.num_v_heads % self.num_k_heads != 0 {
            return Err(format!(
                "linear_num_value_heads ({}) must be a positive multiple of linear_num_key_heads ({})",
                self.num_v_heads, self.num_k_heads
            ));
        }
        if self.conv_kernel < 1 {
            return Err(format!(
                "linear_conv_kernel_dim must be at least 1, got {}",
                self.conv_kernel
            ));
        }
        Ok(())
    }
}

/// The input projections, in the layout the module has them.
#[derive(Debug, Clone)]
pub enum InProj {
    /// qwen3_5: `in_proj_qkv` [conv_dim], `in_proj_z` [value_dim],
    /// `in_proj_b` and `in_proj_a` [Hv].
    Split {
        qkv: Linear,
        z: Linear,
        b: Linear,
        a: Linear,
    },
    /// qwen3_next: `in_proj_qkvz` and `in_proj_ba`, interleaved per key
    /// head (`fix_query_key_value_ordering`).
    Fused { qkvz: Linear, ba: Linear },
}

/// The weights of one Gated DeltaNet layer (`linear_attn`).
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    pub in_proj: InProj,
    /// Depthwise conv weight [conv_dim, K, 1] (mlx layout, after sanitize).
    pub conv1d: Array,
    pub dt_bias: Array,
    /// Kept float32 by mlx-lm's `cast_predicate`.
    pub a_log: Array,
    /// The gated RMSNorm's weight [Dv] (no +1: sanitize leaves it alone).
    pub norm: Array,
    pub out_proj: Linear,
    pub shape: DeltaNetShape,
}

/// mlx-lm's `ArraysCache(size=2)` of a linear layer: `[0]` the conv state
/// [B, K-1, conv_dim] in the activation dtype, `[1]` the recurrent state
/// [B, Hv, Dv, Dk] in float32. Empty until the first forward.
#[derive(Debug, Default, Clone)]
pub struct ArraysCache {
    pub conv: Option<Array>,
    pub state: Option<Array>,
}

/// The projections of a Gated DeltaNet layer: (mixed qkv [B, S, conv_dim],
/// z [B, S, Hv, Dv], b [B, S, Hv], a [B, S, Hv]).
pub fn deltanet_projections(
    x: &Array,
    w: &InProj,
    s: &DeltaNetShape,
) -> Result<(Array, Array, Array, Array)> {
    let (bsz, len) = batch_and_len(x);
    match w {
        InProj::Split { qkv, z, b, a } => {
            let mixed = qkv.forward(x)?;
            let z = z
                .forward(x)?
                .reshape(&[bsz, len, s.num_v_heads, s.head_v_dim])?;
            Ok((mixed, z, b.forward(x)?, a.forward(x)?))
        }
        InProj::Fused { qkvz, ba } => {
            let (nk, dn, nv, dv) = (s.num_k_heads, s.head_k_dim, s.num_v_heads, s.head_v_dim);
            let mixed_qkvz = qkvz.forward(x)?.reshape(&[bsz, len, nk, -1])?;
            let mixed_ba = ba.forward(x)?.reshape(&[bsz, len, nk, -1])?;
            let qkvz = mixed_qkvz.split_at_indices(&[dn, 2 * dn, 2 * dn + nv / nk * dv], -1)?;
            let ba = mixed_ba.split_at_indices(&[nv / nk], -1)?;
            let (q, k, v, z) = (&qkvz[0], &qkvz[1], &qkvz[2], &qkvz[3]);
            let v = v.reshape(&[bsz, len, -1, dv])?;
            let z = z.reshape(&[bsz, len, -1, dv])?;
            let b = ba[0].reshape(&[bsz, len, nv])?;
            let a = ba[1].reshape(&[bsz, len, nv])?;
            let mixed = mlx_rs::ops::concatenate(
                &[
                    q.reshape(&[bsz, len, -1])?,
                    k.reshape(&[bsz, len, -1])?,
                    v.reshape(&[bsz, len, -1])?,
                ],
                -1,
            )?;
            Ok((mixed, z, b, a))
        }
    }
}

/// The depthwise causal conv1d with its state: `conv_input = concat([state
/// or zeros(B, K-1, conv_dim) in `dtype`, qkv], 1)`, the new state its last
/// K-1 rows (`mx.contiguous`), output `silu(conv1d(conv_input, groups =
/// conv_dim))`. `dtype` is the layer input's (mlx-lm's `inputs.dtype`).
pub fn causal_conv1d(
    qkv: &Array,
    weight: &Array,
    state: Option<&Array>,
    dtype: Dtype,
) -> Result<(Array, Array)> {
    let (b, channels) = (qkv.shape()[0], qkv.shape()[2]);
    let kernel = weight.shape()[1];
    let n_keep = kernel - 1;
    let state = match state {
        Some(s) => s.clone(),
        None => mlx_rs::ops::zeros_dtype(&[b, n_keep, channels], dtype)?,
    };
    let conv_input = mlx_rs::ops::concatenate(&[state, qkv.clone()], 1)?;
    let new_state = conv_input.try_index((.., -n_keep.., ..))?.contiguous()?;
    let y = mlx_rs::ops::conv1d(&conv_input, weight, 1, 0, 1, channels)?;
    Ok((silu(&y)?, new_state))
}

/// `Qwen3NextRMSNormGated(out, z)`: `rms_norm(out, weight, eps)`, then
/// `precise_swiglu(out, z, that)`.
pub fn rms_norm_gated(out: &Array, z: &Array, weight: &Array, eps: f32) -> Result<Array> {
    let x = rms_norm(out, Some(weight), eps)?;
    precise_swiglu(out, z, &x)
}

/// `GatedDeltaNet.__call__` without a mask (one unpadded sequence), with
/// its `ArraysCache`: prefill (any number of tokens) and decode steps alike.
pub fn gated_delta_net(x: &Array, w: &GatedDeltaNet, cache: &mut ArraysCache) -> Result<Array> {
    gated_delta_net_with(x, w, cache, None)
}

/// [`gated_delta_net`], with `qk_scales` the scales of
/// [`normalize_qk_with`] when they are given as arrays (the compiled decode
/// block), else the weak scalars of [`normalize_qk`].
pub fn gated_delta_net_with(
    x: &Array,
    w: &GatedDeltaNet,
    cache: &mut ArraysCache,
    qk_scales: Option<(&Array, &Array)>,
) -> Result<Array> {
    let s = &w.shape;
    let (bsz, len) = batch_and_len(x);
    let (qkv, z, b, a) = deltanet_projections(x, &w.in_proj, s)?;
    let (conv_out, conv_state) = causal_conv1d(&qkv, &w.conv1d, cache.conv.as_ref(), x.dtype())?;
    cache.conv = Some(conv_state);
    let kd = s.key_dim();
    let parts = conv_out.split_at_indices(&[kd, 2 * kd], -1)?;
    let q = parts[0].reshape(&[bsz, len, s.num_k_heads, s.head_k_dim])?;
    let k = parts[1].reshape(&[bsz, len, s.num_k_heads, s.head_k_dim])?;
    let v = parts[2].reshape(&[bsz, len, s.num_v_heads, s.head_v_dim])?;
    let (q, k) = match qk_scales {
        None => normalize_qk(&q, &k, s.head_k_dim)?,
        Some(scales) => normalize_qk_with(&q, &k, s.head_k_dim, scales)?,
    };
    let (out, state) = gated_delta_update(
        &q,
        &k,
        &v,
        &a,
        &b,
        &w.a_log,
        &w.dt_bias,
        cache.state.as_ref(),
    )?;
    cache.state = Some(state);
    let out = rms_norm_gated(&out, &z, &w.norm, s.eps)?;
    // Under tensor parallelism `out_proj` holds this rank's columns and the
    // layer sums its output over the ranks (`all_sum` of `sharding_group`).
    sharded_to_all(w.out_proj.forward(&out.reshape(&[bsz, len, -1])?)?)
}

impl GatedDeltaNet {
    /// [`Linear::pretranspose`] on the projections (generated models).
    pub fn pretranspose(&mut self) {
        match &mut self.in_proj {
            InProj::Split { qkv, z, b, a } => pretranspose_all([qkv, z, b, a]),
            InProj::Fused { qkvz, ba } => pretranspose_all([qkvz, ba]),
        }
        self.out_proj.pretranspose();
    }
}

/// `layers.{i}.linear_attn` of a qwen3_5 checkpoint (the split projections,
/// sanitized names): every tensor's presence and shape checked by `w`
/// against the whole layer's `s`. On a tensor-parallel rank the weights are
/// this rank's slices and the layer's shape has its heads divided by the
/// ranks (qwen3_5's `shard()`: `num_k_heads //= N`, `num_v_heads //= N`).
pub fn load_gated_delta_net(w: &mut Weights, layer: usize, s: DeltaNetShape) -> GatedDeltaNet {
    let p = format!("layers.{layer}.linear_attn");
    let (conv, vd, hv) = (s.conv_dim(), s.value_dim(), s.num_v_heads);
    let ranks = w.parts(&format!("{p}.out_proj"));
    let local = DeltaNetShape {
        num_k_heads: s.num_k_heads / ranks,
        num_v_heads: s.num_v_heads / ranks,
        ..s
    };
    let in_proj = InProj::Split {
        qkv: w.linear(&format!("{p}.in_proj_qkv"), conv, s.hidden),
        z: w.linear(&format!("{p}.in_proj_z"), vd, s.hidden),
        b: w.linear(&format!("{p}.in_proj_b"), hv, s.hidden),
        a: w.linear(&format!("{p}.in_proj_a"), hv, s.hidden),
    };
    load_after_in_proj(w, &p, s, local, in_proj)
}

/// `layers.{i}.linear_attn` of a qwen3_next checkpoint: `in_proj_qkvz` and
/// `in_proj_ba`, grouped per key head (`fix_query_key_value_ordering`
/// regroups their outputs). Never split over ranks: qwen3_next.py has no
/// `shard()`, and the plan refuses the split.
pub fn load_grouped_gated_delta_net(
    w: &mut Weights,
    layer: usize,
    s: DeltaNetShape,
) -> GatedDeltaNet {
    let p = format!("layers.{layer}.linear_attn");
    let (conv, vd, hv) = (s.conv_dim(), s.value_dim(), s.num_v_heads);
    let in_proj = InProj::Fused {
        qkvz: w.linear(&format!("{p}.in_proj_qkvz"), conv + vd, s.hidden),
        ba: w.linear(&format!("{p}.in_proj_ba"), 2 * hv, s.hidden),
    };
    load_after_in_proj(w, &p, s, s, in_proj)
}

/// The tensors of `p` (a `linear_attn`) after its input projections, the
/// same in both layouts; `local` is the shape this rank runs.
fn load_after_in_proj(
    w: &mut Weights,
    p: &str,
    s: DeltaNetShape,
    local: DeltaNetShape,
    in_proj: InProj,
) -> GatedDeltaNet {
    let (conv, vd, hv) = (s.conv_dim(), s.value_dim(), s.num_v_heads);
    GatedDeltaNet {
        in_proj,
        conv1d: w.param(&format!("{p}.conv1d.weight"), &[conv, s.conv_kernel, 1]),
        dt_bias: w.param(&format!("{p}.dt_bias"), &[hv]),
        a_log: w.param(&format!("{p}.A_log"), &[hv]),
        norm: w.param(&format!("{p}.norm.weight"), &[s.head_v_dim]),
        out_proj: w.linear(&format!("{p}.out_proj"), s.hidden, vd),
        shape: local,
    }
}

// ---- Gated full attention

/// `Qwen3NextAttention`'s weights: `q_proj` has 2 * heads * head_dim outputs
/// (per head: the queries, then the output gate).
#[derive(Debug, Clone, Flat)]
pub struct GatedAttention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    #[flat(elsewhere = crate::flat::unused_linear())]
    pub o_proj: Linear,
    pub q_norm: Array,
    pub k_norm: Array,
}

/// `Qwen3NextAttention.__call__`: queries and gate split per head, q/k
/// RMSNorm, RoPE (partial: `rope`'s dims < head_dim) at the cache offset,
/// the cache update, SDPA, then `o_proj(output * sigmoid(gate))`.
pub fn gated_attention(
    x: &Array,
    w: &GatedAttention,
    s: AttentionShape,
    rope: &Rope,
    cache: &mut LayerCache,
    mask: &Mask,
) -> Result<Array> {
    let offset = Array::from_int(cache.offset());
    let rope = |t: &Array| rope.apply(t, &offset);
    let [queries, keys, values, gate] = gated_attention_qkv(x, w, s, &rope)?;
    let (o, _) = attend_own_kv(
        &queries, &keys, &values, s, cache, mask, offset, false, None,
    )?;
    gated_attention_output(&o, &gate, &w.o_proj)
}

/// The part of [`gated_attention`] before the cache: queries, keys and
/// values [B, heads, L, head_dim] (q/k normed, `rope` applied to both) and
/// the output gate [B, L, heads * head_dim].
pub fn gated_attention_qkv(
    x: &Array,
    w: &GatedAttention,
    s: AttentionShape,
    rope: &dyn Fn(&Array) -> Result<Array>,
) -> Result<[Array; 4]> {
    let (b, l) = batch_and_len(x);
    // Heads as -1: a tensor-parallel rank has n_heads / N and n_kv_heads / N
    // of them (the shape's counts are the model's), and the same shapes
    // come out unsharded.
    let q_out = w.q_proj.forward(x)?.reshape(&[b, l, -1, 2 * s.head_dim])?;
    let halves = q_out.split_equal(2, -1)?;
    let (queries, gate) = (&halves[0], halves[1].reshape(&[b, l, -1])?);
    let keys = w.k_proj.forward(x)?;
    let values = w.v_proj.forward(x)?;
    let queries = rms_norm(queries, Some(&w.q_norm), s.eps)?.transpose_axes(&[0, 2, 1, 3])?;
    let keys = rms_norm(
        &keys.reshape(&[b, l, -1, s.head_dim])?,
        Some(&w.k_norm),
        s.eps,
    )?
    .transpose_axes(&[0, 2, 1, 3])?;
    let values = values
        .reshape(&[b, l, -1, s.head_dim])?
        .transpose_axes(&[0, 2, 1, 3])?;
    Ok([rope(&queries)?, rope(&keys)?, values, gate])
}

/// The part of [`gated_attention`] after the cache: `o_proj(o * sigmoid(gate))`,
/// summed over the ranks under tensor parallelism (`ShardedToAllLinear`).
pub fn gated_attention_output(o: &Array, gate: &Array, o_proj: &Linear) -> Result<Array> {
    sharded_to_all(o_proj.forward(&o.multiply(mlx_rs::ops::sigmoid(gate)?)?)?)
}

impl GatedAttention {
    /// [`Linear::pretranspose`] on the projections (generated models).
    pub fn pretranspose(&mut self) {
        pretranspose_all([
            &mut self.q_proj,
            &mut self.k_proj,
            &mut self.v_proj,
            &mut self.o_proj,
        ]);
    }
}

/// `layers.{i}.self_attn` of a gated full-attention layer: `q_proj` of
/// `2 * heads * head_dim` outputs, K/V, q/k norms, `o_proj`.
pub fn load_gated_attention(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    s: AttentionShape,
) -> GatedAttention {
    let (p, (q, kv)) = (
        crate::blocks::self_attn_prefix(layer),
        s.projection_widths(),
    );
    GatedAttention {
        q_proj: w.linear(&format!("{p}.q_proj"), 2 * q, hidden),
        k_proj: w.linear(&format!("{p}.k_proj"), kv, hidden),
        v_proj: w.linear(&format!("{p}.v_proj"), kv, hidden),
        o_proj: w.linear(&format!("{p}.o_proj"), hidden, q),
        q_norm: w.param(&format!("{p}.q_norm.weight"), &[s.head_dim]),
        k_norm: w.param(&format!("{p}.k_norm.weight"), &[s.head_dim]),
    }
}

// ---- The MoE block

/// `Qwen3NextSparseMoeBlock`: qwen3_moe's routed experts (precise softmax
/// over all experts, top-k, optional renormalization, SwiGLU experts) plus a
/// shared SwiGLU expert scaled by `sigmoid(shared_expert_gate(x))`.
#[derive(Debug, Clone, Flat)]
pub struct SharedExpertMoe {
    pub router: SoftmaxTopKRouter,
    pub experts: SwitchGlu,
    pub shared_expert: Mlp,
    pub shared_expert_gate: Linear,
}

impl SharedExpertMoe {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        // `(y * scores[..., None]).sum(-2)`: softmax_topk_moe's final astype
        // is to y's own dtype, which the scores share (both the activation
        // dtype), so it adds no op.
        let routed = softmax_topk_moe(&self.router, &self.experts, x)?;
        // The shared expert's own down projection, not `Mlp::down`: under
        // tensor parallelism its columns are split in place (`shard_inplace`,
        // no all_sum of its own) and the block sums `routed + gate * shared`
        // over the ranks once, as `Qwen3NextSparseMoeBlock` does with its
        // `sharding_group`; the one-output gate is whole on every rank.
        let e = &self.shared_expert;
        let (g, u) = e.gate_and_up(x)?;
        let shared = e.down_proj.forward(&e.activate(&g, &u)?)?;
        let gate = mlx_rs::ops::sigmoid(self.shared_expert_gate.forward(x)?)?;
        sharded_to_all(routed.add(gate.multiply(&shared)?)?)
    }
}

impl SharedExpertMoe {
    /// [`Linear::pretranspose`] on the dense projections (generated models;
    /// the experts' weights stay as gathered).
    pub fn pretranspose(&mut self) {
        pretranspose_all([&mut self.router.gate, &mut self.shared_expert_gate]);
        self.shared_expert.pretranspose();
    }
}

/// `layers.{i}.mlp` of a layer with routed experts and a shared expert:
/// router `mlp.gate`, SwiGLU experts `mlp.switch_mlp`, `mlp.shared_expert`
/// and `mlp.shared_expert_gate` (one output).
pub fn load_shared_expert_moe(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    shape: crate::moe::ExpertsShape,
    shared_width: i32,
    probs: crate::moe::TopKProbs,
) -> SharedExpertMoe {
    // The router and the routed experts are qwen3_moe's block's; then the
    // shared expert and its one-output gate.
    let SparseMoe { router, experts } =
        crate::blocks::load_sparse_moe(w, layer, hidden, shape, probs);
    let p = crate::blocks::mlp_prefix(layer);
    SharedExpertMoe {
        router,
        experts,
        shared_expert: crate::blocks::load_mlp_at(
            w,
            &format!("{p}.shared_expert"),
            hidden,
            shared_width,
            crate::blocks::Activation::Silu,
            crate::blocks::GateUpProjection::Separate,
        ),
        shared_expert_gate: w.linear(&format!("{p}.shared_expert_gate"), 1, hidden),
    }
}

/// Routed experts and a shared expert in the feed-forward half of a pre-norm
/// layer (`DecoderLayer.__call__`, through [`crate::blocks::experts_feed_forward`]).
impl crate::blocks::RoutedExperts for SharedExpertMoe {
    const IN_A_SANDWICH: &'static str = "routed experts with a shared expert in a sandwich layer";
    fn route(&self, x: &Array) -> Result<Array> {
        self.forward(x)
    }
}

// ---- What the models keep per layer: its cache

/// The cache of one layer, by mixer kind (`make_cache`).
#[derive(Debug)]
pub enum MixerCache {
    Arrays(ArraysCache),
    Kv(LayerCache),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic array of `shape` with values spread over (-1, 1)
    /// (g's over (0, 1), as a decay is).
    fn spread(shape: &[i32], seed: u64, decay: bool, dtype: Dtype) -> Array {
        let key = mlx_rs::random::key(seed).unwrap();
        let x = mlx_rs::random::uniform::<f32, f32>(0.0, 1.0, shape, &key).unwrap();
        let x = match decay {
            true => x,
            false => x
                .multiply(Array::from_f32(2.0))
                .unwrap()
                .subtract(Array::from_f32(1.0))
                .unwrap(),
        };
        x.as_dtype(dtype).unwrap()
    }

    /// The chunked form keeps the recurrence's state and real tokens' outputs
    /// to float32 rounding: one token, a part of a chunk and more than one
    /// chunk, with and without a padding mask and a starting state.
    #[test]
    fn the_chunked_form_tracks_the_recurrence() {
        let (b, hk, hv, dk, dv) = (2, 2, 4, 16, 8);
        for t in [1, 7, 70] {
            let q = spread(&[b, t, hk, dk], 1, false, Dtype::Float32)
                .multiply(Array::from_f32(0.25))
                .unwrap();
            let k = spread(&[b, t, hk, dk], 2, false, Dtype::Float32)
                .multiply(Array::from_f32(0.25))
                .unwrap();
            let v = spread(&[b, t, hv, dv], 3, false, Dtype::Float32);
            let g = spread(&[b, t, hv], 4, true, Dtype::Float32);
            let beta = spread(&[b, t, hv], 5, true, Dtype::Float32);
            let state = spread(&[b, hv, dv, dk], 6, false, Dtype::Float32);
            // Row 1's first two tokens padded (a left-padded batch).
            let keep: Vec<bool> = (0..b * t).map(|i| i < t || i >= t + 2).collect();
            let mask = Array::from_slice(&keep, &[b, t]);
            for mask in [None, Some(&mask)] {
                for state in [None, Some(&state)] {
                    let inputs = [&q, &k, &v, &g, &beta];
                    let (y0, s0) = scan(RecurrenceGraph::Lean, inputs, state, mask).unwrap();
                    let (y1, s1) = chunked_scan(inputs, state, mask).unwrap();
                    assert_eq!(y0.shape(), y1.shape());
                    assert_eq!(s0.shape(), s1.shape());
                    let real = match mask {
                        Some(m) => m.expand_dims_axes(&[-1, -2]).unwrap(),
                        None => Array::from_bool(true),
                    };
                    let gap = |a: &Array, b: &Array| {
                        let d = a.subtract(b).unwrap().abs().unwrap();
                        let d = mlx_rs::ops::select(&real, &d, Array::from_f32(0.0)).unwrap();
                        d.max(None).unwrap().item_exact::<f32>()
                    };
                    let what = format!(
                        "{t} tokens, mask {}, state {}",
                        mask.is_some(),
                        state.is_some()
                    );
                    let y_gap = gap(&y0, &y1);
                    let s_gap = s0
                        .subtract(&s1)
                        .unwrap()
                        .abs()
                        .unwrap()
                        .max(None)
                        .unwrap()
                        .item_exact::<f32>();
                    assert!(y_gap < 1e-4, "y: {y_gap} ({what})");
                    assert!(s_gap < 1e-4, "state: {s_gap} ({what})");
                }
            }
        }
    }

    /// The CPU's lean recurrence gives the bytes of mlx-lm's graph (the form
    /// a GPU runs), with and without a padding mask, for one token and
    /// several, grouped heads (Hk < Hv), bfloat16 and float32 inputs.
    #[test]
    fn the_lean_recurrence_gives_the_bytes_of_mlx_lms_graph() {
        let (b, hk, hv, dk, dv) = (2, 2, 4, 16, 8);
        for dtype in [Dtype::Bfloat16, Dtype::Float32] {
            for t in [1, 7] {
                let q = spread(&[b, t, hk, dk], 1, false, dtype);
                let k = spread(&[b, t, hk, dk], 2, false, dtype);
                let v = spread(&[b, t, hv, dv], 3, false, dtype);
                let g = spread(&[b, t, hv], 4, true, Dtype::Float32);
                let beta = spread(&[b, t, hv], 5, true, dtype);
                let state = spread(&[b, hv, dv, dk], 6, false, Dtype::Float32);
                // Row 1's first token padded (a right-padded chunk's mask shape).
                let mask =
                    Array::from_slice(&(0..b * t).map(|i| i != t).collect::<Vec<bool>>(), &[b, t]);
                for mask in [None, Some(&mask)] {
                    for state in [None, Some(&state)] {
                        let inputs = [&q, &k, &v, &g, &beta];
                        let (y0, s0) = scan(RecurrenceGraph::AsMlxLm, inputs, state, mask).unwrap();
                        let (y1, s1) = scan(RecurrenceGraph::Lean, inputs, state, mask).unwrap();
                        assert_eq!(y0.shape(), y1.shape());
                        assert_eq!(s0.shape(), s1.shape());
                        assert_eq!(y0.dtype(), y1.dtype());
                        let bytes = |a: &Array| crate::bytes::array_bytes(a).unwrap();
                        let what = format!(
                            "{dtype:?}, {t} tokens, mask {}, state {}",
                            mask.is_some(),
                            state.is_some()
                        );
                        assert!(bytes(&y0) == bytes(&y1), "y differs: {what}");
                        assert!(bytes(&s0) == bytes(&s1), "state differs: {what}");
                    }
                }
            }
        }
    }
}
