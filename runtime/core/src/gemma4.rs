//! Gemma-4 blocks, op for op as mlx-lm 0.32.2's `gemma4_text.py` runs them.
//! The monolith composes these with run-time branches; generated models call
//! the same functions with every branch resolved, so the math exists once.

use std::collections::HashMap;

use mlx_rs::Array;

use crate::attention::{attend, batch_and_len, merged, quantized_sdpa, Mask};
use crate::cache::LayerCache;
use crate::layers::{Embedding, Linear};
use crate::moe::{experts, Router, SwitchGlu};
use crate::ops::{geglu, gelu_approx_compiled, rms_norm, scalar_like, Result};
use crate::rope::Rope;

/// `x * s(value)`: a Python float scalar multiplying a tensor (weakly typed).
pub fn scale(x: &Array, value: f64) -> Result<Array> {
    x.multiply(scalar_like(value, x))
}

/// Token embedding times bf16(sqrt(hidden)) (`Gemma4TextModel.__call__`).
pub fn embed(embed_tokens: &Embedding, ids: &Array, hidden: i32) -> Result<Array> {
    let e = embed_tokens.lookup(ids)?;
    scale(&e, (hidden as f64).powf(0.5))
}

/// Per-layer inputs (`_get_per_layer_inputs` + `_project_per_layer_inputs`):
/// returns [B, L, layers, width]; layer i reads `[:, :, i, :]`.
#[allow(clippy::too_many_arguments)]
pub fn per_layer_inputs(
    ids: &Array,
    h: &Array,
    embed_per_layer: &Embedding,
    model_projection: &Linear,
    projection_norm: &Array,
    layers: i32,
    width: i32,
    hidden: i32,
    eps: f32,
) -> Result<Array> {
    let tok = scale(&embed_per_layer.lookup(ids)?, (width as f64).powf(0.5))?;
    let tok = mlx_rs::ops::unflatten(&tok, -1, &[layers, width])?;
    let p = scale(&model_projection.forward(h)?, (hidden as f64).powf(-0.5))?;
    let p = mlx_rs::ops::unflatten(&p, -1, &[layers, width])?;
    let p = rms_norm(&p, Some(projection_norm), eps)?;
    scale(&p.add(&tok)?, 2f64.powf(-0.5))
}

/// `per_layer_inputs[:, :, i, :]`.
pub fn per_layer_slice(all: &Array, i: i32) -> Result<Array> {
    use mlx_rs::ops::indexing::TryIndexOp;
    all.try_index((.., .., i, ..))
}

/// Attention weights of one layer. `kv` is `None` on KV-sharing layers.
#[derive(Debug, Clone)]
pub struct AttentionWeights {
    pub q_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Array,
    pub kv: Option<KvWeights>,
}

impl AttentionWeights {
    /// [`Linear::pretranspose`] on the projections (generated models).
    pub fn pretranspose(&mut self) {
        self.q_proj.pretranspose();
        self.o_proj.pretranspose();
        if let Some(kv) = &mut self.kv {
            kv.pretranspose();
        }
    }
}

/// K/V projections of a layer that computes its own K/V. `v_proj` is `None`
/// with `attention_k_eq_v` on full layers (V is the raw k_proj output).
#[derive(Debug, Clone)]
pub struct KvWeights {
    pub k_proj: Linear,
    pub v_proj: Option<Linear>,
    pub k_norm: Array,
}

impl KvWeights {
    /// [`Linear::pretranspose`] on the projections (generated models).
    pub fn pretranspose(&mut self) {
        self.k_proj.pretranspose();
        if let Some(v) = &mut self.v_proj {
            v.pretranspose();
        }
    }
}

/// K/V a layer attended over, and the rope offset it used: what mlx-lm passes
/// from a donor to the layers that share its K/V. From a quantized cache,
/// `keys`/`values` hold only the packed uint32 data, which sharers refuse.
#[derive(Debug, Clone)]
pub struct SharedKv {
    pub keys: Array,
    pub values: Array,
    pub offset: Array,
}

/// The static shape of one layer's attention.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub eps: f32,
}

/// A donor's attention: computes K/V, updates its cache, attends.
pub fn attention_own_kv(
    x: &Array,
    w: &AttentionWeights,
    kv: &KvWeights,
    s: AttentionShape,
    rope: &Rope,
    cache: &mut LayerCache,
    mask: &Mask,
) -> Result<(Array, SharedKv)> {
    let offset = Array::from_int(cache.offset());
    let (q, k, v) = project_qkv(x, w, kv, s, &|t| rope.apply(t, &offset))?;
    let (o, shared) = attend_own_kv(&q, &k, &v, cache, mask, offset, false)?;
    Ok((w.o_proj.forward(&o)?, shared))
}

/// Queries, keys and values of a layer that computes its own K/V: projected,
/// normed, transposed to [B, heads, L, head_dim]; Q and K through `rope`.
pub fn project_qkv(
    x: &Array,
    w: &AttentionWeights,
    kv: &KvWeights,
    s: AttentionShape,
    rope: &dyn Fn(&Array) -> Result<Array>,
) -> Result<(Array, Array, Array)> {
    let (b, l) = batch_and_len(x);
    let q = queries(x, w, s)?;
    let k = kv
        .k_proj
        .forward(x)?
        .reshape(&[b, l, s.n_kv_heads, s.head_dim])?;
    let v = match &kv.v_proj {
        None => k.clone(),
        Some(v_proj) => v_proj
            .forward(x)?
            .reshape(&[b, l, s.n_kv_heads, s.head_dim])?,
    };
    let k = rms_norm(&k, Some(&kv.k_norm), s.eps)?.transpose_axes(&[0, 2, 1, 3])?;
    let k = rope(&k)?;
    let v = rms_norm(&v, None, s.eps)?.transpose_axes(&[0, 2, 1, 3])?;
    let q = rope(&q.transpose_axes(&[0, 2, 1, 3])?)?;
    Ok((q, k, v))
}

/// The queries [B, heads, L, head_dim] of a KV-sharing layer, through `rope`.
pub fn project_q(
    x: &Array,
    w: &AttentionWeights,
    s: AttentionShape,
    rope: &dyn Fn(&Array) -> Result<Array>,
) -> Result<Array> {
    let q = queries(x, w, s)?;
    rope(&q.transpose_axes(&[0, 2, 1, 3])?)
}

/// A donor's cache update and attention over the cache: returns the heads
/// merged back to [B, L, heads * head_dim] (or [B * L, ...] with `rows`),
/// the input of `o_proj`, and the K/V sharers read.
pub fn attend_own_kv(
    q: &Array,
    k: &Array,
    v: &Array,
    cache: &mut LayerCache,
    mask: &Mask,
    offset: Array,
    rows: bool,
) -> Result<(Array, SharedKv)> {
    let (b, l) = (q.shape()[0], q.shape()[2]);
    if let LayerCache::Quantized(qc) = cache {
        // base.scaled_dot_product_attention: a cache with `.bits` routes to
        // quantized_scaled_dot_product_attention.
        let (qk, qv) = qc.update_and_fetch(k, v)?;
        let o = quantized_sdpa(q, &qk, &qv, 1.0, mask, qc.group_size, qc.bits)?;
        let o = o
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&merged(b, l, rows))?;
        // mlx-lm would hand the quantized tuples to sharers, whose plain SDPA
        // then fails; the spec validator forbids that, and the packed uint32
        // data carried here is refused by `attention_shared_kv`.
        return Ok((
            o,
            SharedKv {
                keys: qk.data,
                values: qv.data,
                offset,
            },
        ));
    }
    let (keys, values) = cache.update_and_fetch(k, v)?;
    let o = attend(q, &keys, &values, 1.0, mask, rows)?;
    Ok((
        o,
        SharedKv {
            keys,
            values,
            offset,
        },
    ))
}

/// A KV-sharing layer's attention: its own queries over the donor's K/V.
pub fn attention_shared_kv(
    x: &Array,
    w: &AttentionWeights,
    s: AttentionShape,
    rope: &Rope,
    shared: &SharedKv,
    mask: &Mask,
) -> Result<Array> {
    let q = project_q(x, w, s, &|t| rope.apply(t, &shared.offset))?;
    w.o_proj
        .forward(&attend_shared_kv(&q, shared, mask, false)?)
}

/// A KV-sharing layer's attention over the donor's K/V, heads merged back to
/// [B, L, heads * head_dim] (or [B * L, ...] with `rows`), the input of
/// `o_proj`.
pub fn attend_shared_kv(q: &Array, shared: &SharedKv, mask: &Mask, rows: bool) -> Result<Array> {
    if shared.keys.dtype() == mlx_rs::Dtype::Uint32 {
        return Err(mlx_rs::error::Exception::custom(
            "KV-shared layer over a quantized donor cache: mlx-lm cannot run this (its sharers take the unquantized SDPA)",
        ));
    }
    attend(q, &shared.keys, &shared.values, 1.0, mask, rows)
}

fn queries(x: &Array, w: &AttentionWeights, s: AttentionShape) -> Result<Array> {
    let (b, l) = batch_and_len(x);
    let q = w
        .q_proj
        .forward(x)?
        .reshape(&[b, l, s.n_heads, s.head_dim])?;
    rms_norm(&q, Some(&w.q_norm), s.eps)
}

/// Dense GeGLU MLP: `down(geglu(gate(x), up(x)))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    /// [`Linear::pretranspose`] on the projections (generated models).
    pub fn pretranspose(&mut self) {
        self.gate_proj.pretranspose();
        self.up_proj.pretranspose();
        self.down_proj.pretranspose();
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gate = self.gate_proj.forward(x)?;
        let up = self.up_proj.forward(x)?;
        self.down_proj.forward(&geglu(&gate, &up)?)
    }
}

/// The four norms every decoder layer has.
#[derive(Debug, Clone)]
pub struct LayerNorms {
    pub input: Array,
    pub post_attention: Array,
    pub pre_feedforward: Array,
    pub post_feedforward: Array,
}

/// The MoE branch (26B-A4B): router, experts and their three extra norms.
#[derive(Debug, Clone)]
pub struct MoeBlock {
    pub router: Router,
    pub experts: SwitchGlu,
    pub pre_feedforward_2: Array,
    pub post_feedforward_1: Array,
    pub post_feedforward_2: Array,
}

/// The per-layer-input gate (E-models).
#[derive(Debug, Clone)]
pub struct PleGate {
    pub gate: Linear,
    pub projection: Linear,
    pub post_norm: Array,
}

impl PleGate {
    /// [`Linear::pretranspose`] on the projections (generated models).
    pub fn pretranspose(&mut self) {
        self.gate.pretranspose();
        self.projection.pretranspose();
    }
}

impl MoeBlock {
    /// [`Linear::pretranspose`] on the router's projection (generated models).
    pub fn pretranspose(&mut self) {
        self.router.proj.pretranspose();
    }
}

/// Feed-forward half of a decoder layer after attention: `h` is the residual
/// stream after attention. Returns the layer output (before the PLE gate).
pub fn feed_forward(
    h: &Array,
    norms: &LayerNorms,
    mlp: &Mlp,
    moe: Option<&MoeBlock>,
    eps: f32,
) -> Result<Array> {
    let f = match moe {
        None => mlp.forward(&rms_norm(h, Some(&norms.pre_feedforward), eps)?)?,
        Some(m) => {
            let h1 = mlp.forward(&rms_norm(h, Some(&norms.pre_feedforward), eps)?)?;
            let h1 = rms_norm(&h1, Some(&m.post_feedforward_1), eps)?;
            let (idx, w) = m.router.route(h)?;
            let h2 = rms_norm(h, Some(&m.pre_feedforward_2), eps)?;
            let h2 = experts(&m.experts, &h2, &idx, &w)?;
            let h2 = rms_norm(&h2, Some(&m.post_feedforward_2), eps)?;
            h1.add(&h2)?
        }
    };
    let f = rms_norm(&f, Some(&norms.post_feedforward), eps)?;
    h.add(&f)
}

/// Attention output into the residual stream: `x + post_attention_norm(a)`.
pub fn attention_residual(x: &Array, a: &Array, norms: &LayerNorms, eps: f32) -> Result<Array> {
    x.add(rms_norm(a, Some(&norms.post_attention), eps)?)
}

/// The PLE gate after the FFN residual, then `* layer_scalar`.
pub fn finish_layer(
    h: &Array,
    ple: Option<(&PleGate, &Array)>,
    layer_scalar: &Array,
    eps: f32,
) -> Result<Array> {
    let h = match ple {
        None => h.clone(),
        Some((g, input)) => {
            let gate = gelu_approx_compiled(&g.gate.forward(h)?)?;
            let gate = gate.multiply(input)?;
            let gate = g.projection.forward(&gate)?;
            let gate = rms_norm(&gate, Some(&g.post_norm), eps)?;
            h.add(&gate)?
        }
    };
    h.multiply(layer_scalar)
}

pub use crate::layers::{logits, Head};

/// mlx-lm's `gemma4.Model.sanitize` + `gemma4_text.Model.sanitize`, then the
/// model prefix removed: names come out relative to the text model
/// (`embed_tokens.weight`, `layers.3.mlp.up_proj.weight`, `lm_head.weight`).
/// `wrapper` is true for `gemma4` / `gemma4_unified` configs.
pub fn sanitize(
    tensors: HashMap<String, Array>,
    wrapper: bool,
    first_kv_shared: i32,
) -> Result<HashMap<String, Array>> {
    let mut renamed = HashMap::new();
    for (k, v) in tensors {
        let k = if wrapper {
            let starts_with_model = k.starts_with("model.");
            let k = k.strip_prefix("model.").unwrap_or(&k).to_string();
            const TOWERS: [&str; 6] = [
                "vision_tower",
                "multi_modal_projector",
                "audio_tower",
                "embed_audio",
                "embed_vision",
                "vision_embedder",
            ];
            if TOWERS.iter().any(|t| k.starts_with(t)) {
                continue;
            }
            let k = if starts_with_model && k.starts_with("language_model") {
                k.replacen("language_model.", "language_model.model.", 1)
            } else {
                k
            };
            match k.strip_prefix("language_model.") {
                Some(rest) => rest.to_string(),
                None => k,
            }
        } else {
            k
        };
        renamed.insert(k, v);
    }
    let mut out = HashMap::new();
    for (k, v) in renamed {
        const DROP: [&str; 5] = [
            "self_attn.rotary_emb",
            "input_max",
            "input_min",
            "output_max",
            "output_min",
        ];
        if DROP.iter().any(|d| k.contains(d)) {
            continue;
        }
        if [
            ".self_attn.k_proj",
            ".self_attn.v_proj",
            ".self_attn.k_norm",
        ]
        .iter()
        .any(|s| k.contains(s))
        {
            let layer = k
                .split("layers.")
                .nth(1)
                .and_then(|r| r.split('.').next())
                .and_then(|n| n.parse::<i32>().ok());
            if matches!(layer, Some(i) if i >= first_kv_shared) {
                continue;
            }
        }
        let k = k.strip_prefix("model.").map(str::to_string).unwrap_or(k);
        if let Some(base) = k.strip_suffix(".experts.gate_up_proj") {
            let parts = v.split_equal(2, -2)?;
            out.insert(
                format!("{base}.experts.switch_glu.gate_proj.weight"),
                parts[0].contiguous()?,
            );
            out.insert(
                format!("{base}.experts.switch_glu.up_proj.weight"),
                parts[1].contiguous()?,
            );
            continue;
        }
        if let Some(base) = k.strip_suffix(".experts.down_proj") {
            out.insert(format!("{base}.experts.switch_glu.down_proj.weight"), v);
            continue;
        }
        out.insert(k, v);
    }
    Ok(out)
}

// ---- Loading: one place that knows the Gemma-4 parameter names and shapes,
// used by the monolith and by every generated model.

use crate::weights::Weights;

/// `layers.{i}.` norms.
pub fn load_norms(w: &mut Weights, layer: usize, hidden: i32) -> LayerNorms {
    let mut norm = |n: &str| w.param(&format!("layers.{layer}.{n}.weight"), &[hidden]);
    LayerNorms {
        input: norm("input_layernorm"),
        post_attention: norm("post_attention_layernorm"),
        pre_feedforward: norm("pre_feedforward_layernorm"),
        post_feedforward: norm("post_feedforward_layernorm"),
    }
}

/// `layers.{i}.self_attn` without K/V projections (every layer has these).
pub fn load_attention(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    s: AttentionShape,
) -> AttentionWeights {
    let p = format!("layers.{layer}.self_attn");
    let q_out = s.n_heads * s.head_dim;
    AttentionWeights {
        q_proj: w.linear(&format!("{p}.q_proj"), q_out, hidden),
        o_proj: w.linear(&format!("{p}.o_proj"), hidden, q_out),
        q_norm: w.param(&format!("{p}.q_norm.weight"), &[s.head_dim]),
        kv: None,
    }
}

/// K/V projections of a layer that owns its K/V (`v_proj` absent with k_eq_v).
pub fn load_kv(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    s: AttentionShape,
    k_eq_v: bool,
) -> KvWeights {
    let p = format!("layers.{layer}.self_attn");
    let out = s.n_kv_heads * s.head_dim;
    KvWeights {
        k_proj: w.linear(&format!("{p}.k_proj"), out, hidden),
        v_proj: (!k_eq_v).then(|| w.linear(&format!("{p}.v_proj"), out, hidden)),
        k_norm: w.param(&format!("{p}.k_norm.weight"), &[s.head_dim]),
    }
}

/// `layers.{i}.mlp` of the given width.
pub fn load_mlp(w: &mut Weights, layer: usize, hidden: i32, width: i32) -> Mlp {
    let p = format!("layers.{layer}.mlp");
    Mlp {
        gate_proj: w.linear(&format!("{p}.gate_proj"), width, hidden),
        up_proj: w.linear(&format!("{p}.up_proj"), width, hidden),
        down_proj: w.linear(&format!("{p}.down_proj"), hidden, width),
    }
}

/// Router, experts and the three extra norms of an MoE layer.
#[allow(clippy::too_many_arguments)]
pub fn load_moe(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    experts: i32,
    top_k: i32,
    width: i32,
    eps: f32,
) -> MoeBlock {
    let p = format!("layers.{layer}");
    let sw = format!("{p}.experts.switch_glu");
    let norm = |w: &mut Weights, n: &str| w.param(&format!("{p}.{n}.weight"), &[hidden]);
    MoeBlock {
        pre_feedforward_2: norm(w, "pre_feedforward_layernorm_2"),
        post_feedforward_1: norm(w, "post_feedforward_layernorm_1"),
        post_feedforward_2: norm(w, "post_feedforward_layernorm_2"),
        router: Router {
            proj: w.linear(&format!("{p}.router.proj"), experts, hidden),
            scale: w.param(&format!("{p}.router.scale"), &[hidden]),
            per_expert_scale: w.param(&format!("{p}.router.per_expert_scale"), &[experts]),
            top_k,
            hidden,
            eps,
        },
        experts: SwitchGlu {
            gate_proj: w.switch_linear(&format!("{sw}.gate_proj"), experts, width, hidden),
            up_proj: w.switch_linear(&format!("{sw}.up_proj"), experts, width, hidden),
            down_proj: w.switch_linear(&format!("{sw}.down_proj"), experts, hidden, width),
        },
    }
}

/// The per-layer-input gate of layer `i`.
pub fn load_ple_gate(w: &mut Weights, layer: usize, hidden: i32, width: i32) -> PleGate {
    let p = format!("layers.{layer}");
    PleGate {
        gate: w.linear(&format!("{p}.per_layer_input_gate"), width, hidden),
        projection: w.linear(&format!("{p}.per_layer_projection"), hidden, width),
        post_norm: w.param(&format!("{p}.post_per_layer_input_norm.weight"), &[hidden]),
    }
}

/// `layers.{i}.layer_scalar`.
pub fn load_layer_scalar(w: &mut Weights, layer: usize) -> Array {
    w.param(&format!("layers.{layer}.layer_scalar"), &[1])
}

/// Model-level per-layer-input parameters.
#[derive(Debug, Clone)]
pub struct PerLayerInputs {
    pub embed: Embedding,
    pub model_projection: Linear,
    pub projection_norm: Array,
}

impl PerLayerInputs {
    /// [`Linear::pretranspose`] on the projection (generated models).
    pub fn pretranspose(&mut self) {
        self.model_projection.pretranspose();
    }
}

pub fn load_per_layer_inputs(
    w: &mut Weights,
    layers: i32,
    width: i32,
    vocab: i32,
    hidden: i32,
) -> PerLayerInputs {
    PerLayerInputs {
        embed: w.embedding("embed_tokens_per_layer", vocab, layers * width),
        model_projection: w.linear("per_layer_model_projection", layers * width, hidden),
        projection_norm: w.param("per_layer_projection_norm.weight", &[width]),
    }
}

/// The mask of one layer type, from the cache of that type's first layer,
/// before any cache update (`_make_masks`).
pub fn mask_for(cache: &LayerCache, n: i32, window: i32) -> Result<Mask> {
    match cache {
        LayerCache::Full(c) => Ok(c.make_mask(n)),
        LayerCache::Sliding(c) => c.make_mask(n, window),
        LayerCache::Quantized(c) => Ok(c.make_mask(n)),
    }
}

/// Dense feed-forward half (no MoE): `h + post_ff_norm(mlp(pre_ff_norm(h)))`.
pub fn feed_forward_dense(h: &Array, norms: &LayerNorms, mlp: &Mlp, eps: f32) -> Result<Array> {
    feed_forward(h, norms, mlp, None, eps)
}

/// MoE feed-forward half: dense MLP and routed experts in parallel.
pub fn feed_forward_moe(
    h: &Array,
    norms: &LayerNorms,
    mlp: &Mlp,
    moe: &MoeBlock,
    eps: f32,
) -> Result<Array> {
    feed_forward(h, norms, mlp, Some(moe), eps)
}
