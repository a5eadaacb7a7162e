//! The monolith: one generic model that reads the block IR
//! ([`ModelIr`]) at run time and branches on it per layer, for every family.
//! It calls the same runtime blocks ([`archgen_runtime::blocks`]) as the
//! generated models, so it is their reference.

use std::collections::HashMap;

use archgen_ir::RopeKind;
use archgen_ir::{self as ir, KvSource, LayerScalar, ModelIr, Window};
use archgen_runtime::attention::Mask;
use archgen_runtime::blocks::{
    self as b, AttentionShape, AttentionWeights, Head, LayerNorms, PerLayerInputs, PleGate,
    SharedKv,
};
use archgen_runtime::cache::{
    KvCache, LayerCache, MixedKvCache, QuantizedKvCache, RotatingKvCache,
};
use archgen_runtime::deltanet::{self, ArraysCache, DeltaNetShape, MixerCache};
use archgen_runtime::feed_forward::FeedForward;
use archgen_runtime::layers::{Embedding, Linear};
use archgen_runtime::mla;
use archgen_runtime::mlx_rs::error::Exception;
use archgen_runtime::model::{CausalLm, ModelError, Readout};
use archgen_runtime::ops::Result;
use archgen_runtime::rope::{Pairs, Rope, YarnScaling};
use archgen_runtime::short_conv;
use archgen_runtime::weights::Weights;
use archgen_runtime::Array;

struct Layer {
    mixer: LayerMixer,
    norms: Norms,
    ffn: FeedForward,
    ple: Option<PleGate>,
    layer_scalar: Option<Array>,
    residual: LayerResidual,
}

/// How a layer's branches join the residual stream (IR `Residual`), with
/// the factor ([`b::residual_scale`]) a scaled form reads.
enum LayerResidual {
    Plain,
    Scaled(Array),
    ClippedInFloat16,
}

impl LayerResidual {
    /// `Err` for a scaled form without its factor, which the IR never makes.
    fn of(r: ir::Residual) -> std::result::Result<Self, &'static str> {
        match (r, r.factor()) {
            (ir::Residual::Plain, _) => Ok(LayerResidual::Plain),
            (ir::Residual::DepthScaled { .. } | ir::Residual::Scaled { .. }, Some(f)) => {
                Ok(LayerResidual::Scaled(b::residual_scale(f)))
            }
            (ir::Residual::DepthScaled { .. } | ir::Residual::Scaled { .. }, None) => {
                Err("a scaled residual without its factor")
            }
            (ir::Residual::ClippedInFloat16, _) => Ok(LayerResidual::ClippedInFloat16),
        }
    }

    /// The form the runtime blocks add in.
    fn form(&self) -> b::Residual<'_> {
        match self {
            LayerResidual::Plain => b::Residual::Plain,
            LayerResidual::Scaled(factor) => b::Residual::Scaled(factor),
            LayerResidual::ClippedInFloat16 => b::Residual::ClippedInFloat16,
        }
    }
}

/// A layer's RMSNorms, by IR `NormArrangement`: with a norm before the mixer
/// (pre-norm, sandwich) or after the mixer and the MLP only (post-norm).
enum Norms {
    AroundMixer(LayerNorms),
    Post(b::PostNorms),
}

impl Norms {
    /// The mixer's input: `h` after the norm before the mixer, or `h` itself
    /// in a post-norm layer.
    fn mixer_input(&self, h: &Array, eps: f32) -> Result<Array> {
        match self {
            Norms::AroundMixer(n) => archgen_runtime::ops::rms_norm(h, Some(n.input()), eps),
            Norms::Post(_) => Ok(h.clone()),
        }
    }
}

/// A layer's sequence mixer, by IR `Mixer` (and the attention's output gate).
// One per layer, built once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum LayerMixer {
    Attention {
        window: Window,
        kv: KvSource,
        attn: AttentionWeights,
        shape: AttentionShape,
        rope: Rope,
    },
    /// Attention with `OutputGate::SigmoidPerHead` (`Qwen3NextAttention`).
    GatedAttention {
        attn: deltanet::GatedAttention,
        shape: AttentionShape,
        rope: Rope,
    },
    GatedDeltaNet(deltanet::GatedDeltaNet),
    /// A gated short convolution (lfm2's `ShortConv`).
    ShortConv(short_conv::ShortConv),
    /// Multi-head latent attention (deepseek_v3's `DeepseekV3Attention`).
    LatentAttention {
        attn: mla::LatentAttention,
        shape: mla::LatentShape,
        rope: Rope,
    },
    /// Attention with one `qkv_proj` (IR `QkvProjection::Fused`): K/V of its
    /// own, no bias, no q/k norm.
    FusedQkvAttention {
        window: Window,
        cache: ir::KvCache,
        attn: b::FusedQkvAttention,
        shape: AttentionShape,
        rope: Rope,
    },
}

impl LayerMixer {
    /// The attention window, for layers with attention.
    fn window(&self) -> Option<Window> {
        match self {
            LayerMixer::Attention { window, .. } => Some(*window),
            LayerMixer::GatedAttention { .. } | LayerMixer::LatentAttention { .. } => {
                Some(Window::Full)
            }
            LayerMixer::GatedDeltaNet(_) | LayerMixer::ShortConv(_) => None,
            LayerMixer::FusedQkvAttention { window, .. } => Some(*window),
        }
    }
}

/// The runtime shape of an IR Gated DeltaNet.
pub fn delta_net_shape(d: &ir::DeltaNet, hidden: usize, eps: f32) -> DeltaNetShape {
    DeltaNetShape {
        hidden: hidden as i32,
        num_k_heads: d.k_heads as i32,
        num_v_heads: d.v_heads as i32,
        head_k_dim: d.k_head_dim as i32,
        head_v_dim: d.v_head_dim as i32,
        conv_kernel: d.conv_kernel as i32,
        eps,
    }
}

/// The sizes the runtime loads the IR's routed experts with.
fn experts_shape(m: ir::Moe) -> b::ExpertsShape {
    b::ExpertsShape {
        count: m.num_experts as i32,
        top_k: m.top_k as i32,
        width: m.width as i32,
    }
}

/// The generic model of any checkpoint whose spec lowers to the IR.
pub struct Monolith {
    ir: ModelIr,
    embed: Embedding,
    ple: Option<PerLayerInputs>,
    layers: Vec<Layer>,
    norm: Array,
    lm_head: Option<Linear>,
}

/// The runtime shape of an IR latent attention.
pub fn latent_shape(a: &ir::LatentAttention) -> mla::LatentShape {
    mla::LatentShape {
        heads: a.n_heads as i32,
        nope_dim: a.qk_nope_head_dim as i32,
        rope_dim: a.qk_rope_head_dim as i32,
        v_dim: a.v_head_dim as i32,
        kv_lora_rank: a.kv_lora_rank as i32,
        scale: a.scale,
    }
}

/// The runtime RoPE of an IR RoPE form.
pub fn rope_for(a: &ir::Attention) -> Result<Rope> {
    rope_of(a.rope, a.head_dim)
}

/// The runtime RoPE of `rope` on heads of `head_dim`.
pub fn rope_of(rope: ir::RopeForm, head_dim: usize) -> Result<Rope> {
    let hd = head_dim as i32;
    match rope.kind {
        // `nn.RoPE(dims)`: a partial RoPE rotates fewer dims than head_dim.
        RopeKind::Default { theta } => Ok(Rope::base(rope.rotated_dims as i32, theta)),
        // `scale=1 / factor`: the Python division in f64, passed as f32.
        RopeKind::Linear { theta, factor } => Ok(Rope::base_scaled(
            rope.rotated_dims as i32,
            theta,
            (1.0 / factor) as f32,
        )),
        RopeKind::Proportional { theta, factor, .. } => {
            Rope::proportional(hd, rope.rotated_dims as i32, theta, factor)
        }
        RopeKind::Llama3 {
            theta,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => Rope::llama3(
            hd,
            theta,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        ),
        RopeKind::Yarn {
            theta,
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
        } => Rope::yarn(
            rope.rotated_dims as i32,
            theta,
            YarnScaling {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
            },
            if rope.traditional {
                Pairs::Interleaved
            } else {
                Pairs::Halves
            },
        ),
        RopeKind::NoPe => Ok(Rope::NoPe),
    }
}

/// The runtime attention shape of an IR attention.
pub fn shape_of(a: &ir::Attention, eps: f32) -> AttentionShape {
    AttentionShape {
        n_heads: a.n_heads as i32,
        n_kv_heads: a.n_kv_heads as i32,
        head_dim: a.head_dim as i32,
        eps,
        scale: a.scale.value(a.head_dim),
        value_norm: a.value_norm,
        scores: a.scores,
    }
}

/// The arrangement the runtime loads a layer's norms by: the IR's less
/// post-norm, which has no norm before its mixer (its norms are
/// [`b::PostNorms`]).
pub fn norm_arrangement(n: ir::Norms) -> Option<b::NormArrangement> {
    match n.arrangement {
        ir::NormArrangement::PreNorm => Some(b::NormArrangement::PreNorm),
        ir::NormArrangement::Sandwich => Some(b::NormArrangement::Sandwich),
        ir::NormArrangement::PostNorm => None,
    }
}

impl Monolith {
    /// Builds the model from sanitized weights (names relative to the text
    /// model), checking every tensor's presence and shape.
    pub fn new(ir: ModelIr, mut w: Weights) -> std::result::Result<Self, ModelError> {
        let hidden = ir.hidden_size as i32;
        let eps = ir.norm_eps;
        let n_layers = ir.layers.len() as i32;
        let embed = w.embedding("embed_tokens", ir.vocab_size as i32, hidden);
        let ple = ir.embedding.per_layer_input.map(|p| {
            b::load_per_layer_inputs(&mut w, n_layers, p.width as i32, p.vocab as i32, hidden)
        });
        let mut layers = Vec::with_capacity(ir.layers.len());
        for l in &ir.layers {
            let i = l.index;
            let mixer = match &l.mixer {
                ir::Mixer::Attention(a) => {
                    let shape = shape_of(a, eps);
                    let rope = rope_for(a).map_err(|e| ModelError(e.to_string()))?;
                    match (a.output_gate, a.projection) {
                        (ir::OutputGate::None, ir::QkvProjection::Fused) => {
                            let cache = fused_qkv_cache(a).map_err(|why| {
                                ModelError(format!("{}: layer {i}: {why}", ir.name))
                            })?;
                            LayerMixer::FusedQkvAttention {
                                window: a.window,
                                cache,
                                attn: b::load_fused_qkv_attention(&mut w, i, hidden, shape),
                                shape,
                                rope,
                            }
                        }
                        (ir::OutputGate::None, ir::QkvProjection::Separate) => {
                            let qk = a.qk_norm;
                            let mut attn = b::load_attention(&mut w, i, hidden, shape, qk);
                            attn.kv = match a.kv {
                                KvSource::Own { values: v, .. } => {
                                    Some(b::load_kv(&mut w, i, hidden, shape, qk, v))
                                }
                                KvSource::Shared { .. } => None,
                            };
                            let mut kv = attn.kv.take();
                            b::load_biases(&mut w, i, a.bias, &mut attn, kv.as_mut(), shape);
                            attn.kv = kv;
                            LayerMixer::Attention {
                                window: a.window,
                                kv: a.kv,
                                attn,
                                shape,
                                rope,
                            }
                        }
                        (ir::OutputGate::SigmoidPerHead, _) => {
                            gated_attention_supported(a).map_err(|why| {
                                ModelError(format!("{}: layer {i}: {why}", ir.name))
                            })?;
                            LayerMixer::GatedAttention {
                                attn: deltanet::load_gated_attention(&mut w, i, hidden, shape),
                                shape,
                                rope,
                            }
                        }
                    }
                }
                ir::Mixer::GatedDeltaNet(d) => match (d.in_proj, d.norm, d.cache) {
                    (
                        ir::InProj::Split,
                        ir::GatedNorm::RmsSiluGate,
                        ir::StateCache::ConvAndRecurrent,
                    ) => LayerMixer::GatedDeltaNet(deltanet::load_gated_delta_net(
                        &mut w,
                        i,
                        delta_net_shape(d, ir.hidden_size, eps),
                    )),

                    (
                        ir::InProj::GroupedPerKeyHead,
                        ir::GatedNorm::RmsSiluGate,
                        ir::StateCache::ConvAndRecurrent,
                    ) => LayerMixer::GatedDeltaNet(deltanet::load_grouped_gated_delta_net(
                        &mut w,
                        i,
                        delta_net_shape(d, ir.hidden_size, eps),
                    )),
                },
                ir::Mixer::ShortConv(c) => LayerMixer::ShortConv(short_conv::load_short_conv(
                    &mut w,
                    i,
                    hidden,
                    c.kernel as i32,
                )),
                ir::Mixer::LatentAttention(a) => {
                    let shape = latent_shape(a);
                    let q_lora_rank = match a.query {
                        ir::LatentQuery::Direct => None,
                        ir::LatentQuery::LowRank { rank } => Some(rank as i32),
                    };
                    LayerMixer::LatentAttention {
                        attn: mla::load_latent_attention(
                            &mut w,
                            &format!("layers.{i}.self_attn"),
                            hidden,
                            q_lora_rank,
                            &shape,
                        ),
                        shape,
                        rope: rope_of(a.rope, a.qk_rope_head_dim)
                            .map_err(|e| ModelError(e.to_string()))?,
                    }
                }
            };
            let load_mlp = |m: ir::GatedMlp, w: &mut Weights| {
                b::load_mlp_projected(w, i, hidden, m.width as i32, m.activation, m.projection)
            };
            let ffn = match l.ffn {
                ir::FeedForward::Mlp(m) => FeedForward::Mlp {
                    mlp: load_mlp(m, &mut w),
                    moe: None,
                },
                ir::FeedForward::MlpAndMoe { mlp: m, moe } => match (moe.router, moe.activation) {
                    (ir::Router::ScaledTopKSoftmax, ir::Activation::GeluApprox) => FeedForward::Mlp {
                        mlp: load_mlp(m, &mut w),
                        moe: Some(b::load_moe(
                            &mut w,
                            i,
                            hidden,
                            experts_shape(moe),
                            eps,
                        )),
                    },
                    (
                        ir::Router::ScaledTopKSoftmax,
                        ir::Activation::Silu | ir::Activation::GeluApproxThenMultiply,
                    )
                    | (
                        ir::Router::SoftmaxTopK { .. }
                        | ir::Router::SigmoidGroupTopK(_)
                        | ir::Router::TopKPreciseSoftmax,
                        _,
                    )
                    | (ir::Router::ScaledTopKSoftmax, ir::Activation::ClampedSwiglu) => {
                        return Err(ModelError(format!(
                            "{}: layer {i}: experts beside the MLP run only with Gemma-4's router and GeGLU",
                            ir.name
                        )))
                    }
                },
                ir::FeedForward::MoeAndSharedExpert { moe, shared } => {
                    match (moe.router, moe.activation) {
                        (ir::Router::SoftmaxTopK { probs }, ir::Activation::Silu) => {
                            FeedForward::SharedExpertMoe(deltanet::load_shared_expert_moe(
                                &mut w,
                                i,
                                hidden,
                                experts_shape(moe),
                                shared.width as i32,
                                probs,
                            ))
                        }
                        (
                            ir::Router::SoftmaxTopK { .. },
                            ir::Activation::GeluApprox
                            | ir::Activation::GeluApproxThenMultiply
                            | ir::Activation::ClampedSwiglu,
                        )
                        | (
                            ir::Router::ScaledTopKSoftmax
                            | ir::Router::SigmoidGroupTopK(_)
                            | ir::Router::TopKPreciseSoftmax,
                            _,
                        ) => {
                            return Err(ModelError(format!(
                                "{}: layer {i}: experts with a shared expert run only with the softmax-then-top-k router and SwiGLU",
                                ir.name
                            )))
                        }
                    }
                }
                ir::FeedForward::Moe(moe) => match (moe.router, moe.activation) {
                    (ir::Router::SoftmaxTopK { probs }, ir::Activation::Silu) => {
                        FeedForward::SparseMoe(b::load_sparse_moe(
                            &mut w,
                            i,
                            hidden,
                            experts_shape(moe),
                            probs,
                        ))
                    }
                    (
                        ir::Router::SoftmaxTopK { .. },
                        ir::Activation::GeluApprox
                        | ir::Activation::GeluApproxThenMultiply
                        | ir::Activation::ClampedSwiglu,
                    )
                    | (
                        ir::Router::ScaledTopKSoftmax
                        | ir::Router::SigmoidGroupTopK(_)
                        | ir::Router::TopKPreciseSoftmax,
                        _,
                    ) => {
                        return Err(ModelError(format!(
                            "{}: layer {i}: experts in place of the MLP run only with the softmax-then-top-k router and SwiGLU",
                            ir.name
                        )))
                    }
                },
                ir::FeedForward::MoeAndSharedExperts { moe, shared } => {
                    match (moe.router, moe.activation) {
                        (ir::Router::SigmoidGroupTopK(g), ir::Activation::Silu) => {
                            FeedForward::GroupRoutedMoe(b::load_group_routed_moe(
                                &mut w,
                                i,
                                hidden,
                                experts_shape(moe),
                                shared.width as i32,
                                b::GroupTopK {
                                    top_k: moe.top_k as i32,
                                    n_group: g.n_group as i32,
                                    topk_group: g.topk_group as i32,
                                    probs: g.probs,
                                    routed_scaling_factor: g.routed_scaling_factor,
                                },
                            ))
                        }
                        (
                            ir::Router::SigmoidGroupTopK(_),
                            ir::Activation::GeluApprox
                            | ir::Activation::GeluApproxThenMultiply
                            | ir::Activation::ClampedSwiglu,
                        )
                        | (
                            ir::Router::ScaledTopKSoftmax
                            | ir::Router::SoftmaxTopK { .. }
                            | ir::Router::TopKPreciseSoftmax,
                            _,
                        ) => {
                            return Err(ModelError(format!(
                                "{}: layer {i}: experts with shared experts run only with the sigmoid group router and SwiGLU",
                                ir.name
                            )))
                        }
                    }
                }
                ir::FeedForward::BiasedExperts(moe) => match (moe.router, moe.activation) {
                    (ir::Router::TopKPreciseSoftmax, ir::Activation::ClampedSwiglu) => {
                        FeedForward::BiasedExperts(b::load_biased_experts_moe(
                            &mut w,
                            i,
                            hidden,
                            experts_shape(moe),
                        ))
                    }
                    (
                        ir::Router::TopKPreciseSoftmax,
                        ir::Activation::GeluApprox
                        | ir::Activation::GeluApproxThenMultiply
                        | ir::Activation::Silu,
                    )
                    | (
                        ir::Router::ScaledTopKSoftmax
                        | ir::Router::SoftmaxTopK { .. }
                        | ir::Router::SigmoidGroupTopK(_),
                        _,
                    ) => {
                        return Err(ModelError(format!(
                            "{}: layer {i}: biased experts run only with the top-k softmax router and the clamped SwiGLU",
                            ir.name
                        )))
                    }
                },
            };
            layers.push(Layer {
                mixer,
                norms: match norm_arrangement(l.norms) {
                    Some(a) => Norms::AroundMixer(b::load_norms_weighted(
                        &mut w,
                        i,
                        hidden,
                        a,
                        l.norms.weight,
                    )),
                    None => Norms::Post(b::load_post_norms(&mut w, i, hidden, l.norms.weight)),
                },
                ffn,
                ple: match l.input {
                    ir::LayerInput::None => None,
                    ir::LayerInput::Gated { width } => {
                        Some(b::load_ple_gate(&mut w, i, hidden, width as i32))
                    }
                },
                layer_scalar: match l.scalar {
                    LayerScalar::None => None,
                    LayerScalar::Learned => Some(b::load_layer_scalar(&mut w, i)),
                },
                residual: LayerResidual::of(l.residual)
                    .map_err(|why| ModelError(format!("{}: layer {i}: {why}", ir.name)))?,
            });
        }
        let norm = b::load_norm_weight(&mut w, "norm.weight", hidden, ir.head.norm);
        let lm_head = match ir.head.weight {
            ir::HeadWeight::TiedEmbedding => None,
            ir::HeadWeight::Untied => Some(w.linear("lm_head", ir.vocab_size as i32, hidden)),
        };
        w.finish().map_err(|e| ModelError(e.to_string()))?;
        Ok(Monolith {
            ir,
            embed,
            ple,
            layers,
            norm,
            lm_head,
        })
    }

    /// The IR this model runs.
    pub fn ir(&self) -> &ModelIr {
        &self.ir
    }

    /// The embedded tokens and, for Gemma-4's per-layer inputs, those
    /// inputs of every layer: what a forward starts from, batched or not.
    fn inputs(&self, ids: &Array) -> Result<(Array, Option<Array>)> {
        let ir = &self.ir;
        let hidden = ir.hidden_size as i32;
        let h0 = b::embed(&self.embed, ids, ir.embedding.scale, hidden)?;
        let per_layer = match (&self.ple, ir.embedding.per_layer_input) {
            (Some(p), Some(facts)) => Some(b::per_layer_inputs(
                ids,
                &h0,
                p,
                ir.layers.len() as i32,
                facts.width as i32,
                hidden,
                ir.norm_eps,
            )?),
            _ => None,
        };
        Ok((h0, per_layer))
    }

    /// A layer after its sequence mixer: the mixer's output `a` joins the
    /// residual stream `h`, then the feed-forward, the per-layer input gate
    /// and the layer scalar, as the layer's IR says.
    fn finish_layer(
        &self,
        i: usize,
        layer: &Layer,
        h: &Array,
        a: &Array,
        per_layer: Option<&Array>,
    ) -> Result<Array> {
        let eps = self.ir.norm_eps;
        let norms = match &layer.norms {
            Norms::AroundMixer(n) => n,
            Norms::Post(p) => match (&layer.residual, &layer.ffn) {
                (LayerResidual::Plain, FeedForward::Mlp { mlp, moe: None }) => {
                    let h1 = b::post_norm_attention_residual(h, a, p, eps)?;
                    let h2 = b::post_norm_feed_forward(&h1, p, mlp, eps)?;
                    return self.finish_layer_end(i, layer, &h2, per_layer);
                }
                (LayerResidual::Scaled(_) | LayerResidual::ClippedInFloat16, _)
                | (LayerResidual::Plain, FeedForward::Mlp { moe: Some(_), .. })
                | (
                    LayerResidual::Plain,
                    FeedForward::SparseMoe(_)
                    | FeedForward::SharedExpertMoe(_)
                    | FeedForward::GroupRoutedMoe(_)
                    | FeedForward::BiasedExperts(_),
                ) => {
                    return Err(Exception::custom(format!(
                        "layer {i}: a post-norm layer runs a plain residual and a dense MLP only; no runtime block runs it with scaled or clipped residuals or experts"
                    )))
                }
            },
        };
        let h2 = layer
            .ffn
            .after_mixer(h, a, norms, layer.residual.form(), eps)
            .map_err(|e| Exception::custom(format!("layer {i}: {e}")))?;
        self.finish_layer_end(i, layer, &h2, per_layer)
    }

    /// The end of a layer after its feed-forward half: the per-layer input
    /// gate and the layer scalar.
    fn finish_layer_end(
        &self,
        i: usize,
        layer: &Layer,
        h2: &Array,
        per_layer: Option<&Array>,
    ) -> Result<Array> {
        let eps = self.ir.norm_eps;
        let pli = match (&layer.ple, per_layer) {
            (Some(g), Some(all)) => Some((g, b::per_layer_slice(all, i as i32)?)),
            _ => None,
        };
        b::finish_layer(
            h2,
            pli.as_ref().map(|(g, x)| (*g, x)),
            layer.layer_scalar.as_ref(),
            eps,
        )
    }

    /// The final norm, logit scale, head and softcap.
    fn head(&self, h: &Array) -> Result<Array> {
        let ir = &self.ir;
        let eps = ir.norm_eps;
        let head = match &self.lm_head {
            Some(l) => Head::Untied(l),
            None => Head::Tied(&self.embed),
        };
        let scale = ir.head.logit_scale;
        match ir.head.logit_softcap {
            None => b::logits_scaled(h, &self.norm, head, scale, None, eps),
            Some(ir::Softcap {
                cap,
                form: ir::SoftcapForm::Compiled,
            }) => b::logits_scaled(h, &self.norm, head, scale, Some(cap), eps),
            Some(ir::Softcap {
                cap,
                form: ir::SoftcapForm::Eager,
            }) => archgen_runtime::ops::softcap_eager(
                &b::logits_scaled(h, &self.norm, head, scale, None, eps)?,
                f64::from(cap),
            ),
        }
    }
}

/// The K/V cache of a layer's cache, when it is one.
fn kv_cache(c: Option<&mut MixerCache>) -> Option<&mut LayerCache> {
    match c {
        Some(MixerCache::Kv(c)) => Some(c),
        Some(MixerCache::Arrays(_)) | None => None,
    }
}

/// What the gated attention block (`deltanet::gated_attention`) runs:
/// Qwen3Next's attention and nothing else, so any other fact is refused.
fn gated_attention_supported(a: &ir::Attention) -> std::result::Result<(), String> {
    let own = matches!(
        a.kv,
        KvSource::Own {
            values: ir::Values::Projected,
            cache: ir::KvCache::Plain
        }
    );
    if own
        && a.window == Window::Full
        && a.qk_norm == ir::QkNorm::RmsPerHead
        && a.value_norm == ir::ValueNorm::None
        && a.bias == ir::ProjectionBias::None
        && a.scores == ir::Scores::FusedSdpa
        && !a.rope.traditional
        && a.projection == ir::QkvProjection::Separate
    {
        Ok(())
    } else {
        Err(
            "an output-gated attention runs only as Qwen3Next's (own projected K/V in a plain \
             full cache, q/k RMSNorm, no bias, fused SDPA, non-traditional RoPE, separate \
             q/k/v projections)"
                .to_string(),
        )
    }
}

/// What the fused-QKV block (`blocks::attention_fused_qkv`) runs: K/V of
/// the layer's own with v_proj's rows, no bias, no q/k norm (it has none
/// of their weights); the layer's cache form, or why not.
fn fused_qkv_cache(a: &ir::Attention) -> std::result::Result<ir::KvCache, String> {
    match (a.kv, a.bias, a.qk_norm) {
        (
            KvSource::Own {
                values: ir::Values::Projected,
                cache,
            },
            ir::ProjectionBias::None,
            ir::QkNorm::None,
        ) => Ok(cache),
        _ => Err(
            "a fused qkv_proj runs only on a layer with K/V of its own (V projected), no bias \
             and no q/k norm"
                .to_string(),
        ),
    }
}

impl CausalLm for Monolith {
    type Cache = Vec<Option<MixerCache>>;

    fn vocab_size(&self) -> i32 {
        self.ir.vocab_size as i32
    }

    /// Its batched forward (batch.rs).
    fn batched(&self) -> Option<&dyn archgen_runtime::batch::BatchLm> {
        Some(self)
    }

    /// mlx-lm's `make_cache`: a cache per layer that owns K/V, an
    /// `ArraysCache` per Gated DeltaNet or short-conv layer.
    fn make_cache(&self) -> Self::Cache {
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                LayerMixer::GatedDeltaNet(_) | LayerMixer::ShortConv(_) => {
                    Some(MixerCache::Arrays(ArraysCache::default()))
                }
                LayerMixer::GatedAttention { .. } | LayerMixer::LatentAttention { .. } => {
                    Some(MixerCache::Kv(LayerCache::Full(KvCache::default())))
                }
                LayerMixer::Attention {
                    kv: KvSource::Shared { .. },
                    ..
                } => None,
                LayerMixer::Attention {
                    kv: KvSource::Own { cache, .. },
                    window,
                    ..
                }
                | LayerMixer::FusedQkvAttention { window, cache, .. } => {
                    Some(MixerCache::Kv(match (*window, *cache) {
                        (Window::Sliding(w), _) => {
                            LayerCache::Sliding(RotatingKvCache::new(w as i32, 0))
                        }
                        // `KVCache.to_quantized`'s target (the spec allows it only
                        // on full layers no KV-shared layer reads).
                        (Window::Full, ir::KvCache::Quantized(q)) => LayerCache::Quantized(
                            QuantizedKvCache::new(q.group_size as i32, q.bits as i32),
                        ),
                        (Window::Full, ir::KvCache::Plain) => LayerCache::Full(KvCache::default()),
                        // mlx-optiq's install_mixed_kv (tier L2).
                        (Window::Full, ir::KvCache::QuantizedAfterForward { quant, start }) => {
                            LayerCache::QuantizedAfterForward(MixedKvCache::new(
                                quant.group_size as i32,
                                quant.bits as i32,
                                start as i32,
                            ))
                        }
                    }))
                }
            })
            .collect()
    }

    fn forward_to(&self, ids: &Array, caches: &mut Self::Cache, readout: Readout) -> Result<Array> {
        let eps = self.ir.norm_eps;
        let (h0, per_layer) = self.inputs(ids)?;
        // One mask per window, from the cache of the first layer with that
        // window, before any cache update (`_make_masks`).
        let n = ids.shape()[1];
        // Gated DeltaNet layers of one unpadded sequence get no mask
        // (`create_ssm_mask` is None).
        let mut masks: Vec<(Window, Mask)> = Vec::new();
        for (l, c) in self.layers.iter().zip(caches.iter()) {
            let Some(window) = l.mixer.window() else {
                continue;
            };
            if masks.iter().any(|(w, _)| *w == window) {
                continue;
            }
            let cache = match c {
                Some(MixerCache::Kv(c)) => c,
                Some(MixerCache::Arrays(_)) | None => {
                    return Err(Exception::custom(
                        "the first layer of its window has no K/V cache".to_string(),
                    ))
                }
            };
            let w = match window {
                Window::Full => 0,
                Window::Sliding(w) => w as i32,
            };
            masks.push((window, b::mask_for(cache, n, w)?));
        }
        let mut h = h0;
        let mut shared: HashMap<usize, SharedKv> = HashMap::new();
        let no_mask = Mask::None;
        for (i, layer) in self.layers.iter().enumerate() {
            let mask = match layer.mixer.window() {
                Some(window) => {
                    &masks
                        .iter()
                        .find(|(w, _)| *w == window)
                        .expect("a mask per window")
                        .1
                }
                None => &no_mask,
            };
            let x = layer.norms.mixer_input(&h, eps)?;
            let a = match &layer.mixer {
                LayerMixer::GatedDeltaNet(w) => match caches[i].as_mut() {
                    Some(MixerCache::Arrays(c)) => deltanet::gated_delta_net(&x, w, c)?,
                    Some(MixerCache::Kv(_)) | None => {
                        return Err(Exception::custom(format!(
                            "layer {i}: a Gated DeltaNet layer needs an ArraysCache"
                        )))
                    }
                },
                LayerMixer::ShortConv(w) => match caches[i].as_mut() {
                    Some(MixerCache::Arrays(c)) => short_conv::short_conv(&x, w, c)?,
                    Some(MixerCache::Kv(_)) | None => {
                        return Err(Exception::custom(format!(
                            "layer {i}: a short-conv layer needs an ArraysCache"
                        )))
                    }
                },
                LayerMixer::LatentAttention { attn, shape, rope } => {
                    let cache = kv_cache(caches[i].as_mut()).ok_or_else(|| {
                        Exception::custom(format!(
                            "layer {i}: a latent attention layer needs a K/V cache"
                        ))
                    })?;
                    mla::latent_attention(&x, attn, shape, rope, cache)?
                }
                LayerMixer::GatedAttention { attn, shape, rope } => {
                    let cache = kv_cache(caches[i].as_mut()).ok_or_else(|| {
                        Exception::custom(format!(
                            "layer {i}: a gated attention layer needs a K/V cache"
                        ))
                    })?;
                    deltanet::gated_attention(&x, attn, *shape, rope, cache, mask)?
                }
                LayerMixer::FusedQkvAttention {
                    attn, shape, rope, ..
                } => {
                    let cache = kv_cache(caches[i].as_mut()).ok_or_else(|| {
                        Exception::custom(format!("layer {i}: a fused-QKV layer needs a K/V cache"))
                    })?;
                    let (a, kvs) =
                        b::attention_own_kv(&x, b::OwnQkv::Fused(attn), *shape, rope, cache, mask)?;
                    shared.insert(i, kvs);
                    a
                }
                LayerMixer::Attention {
                    kv: source,
                    attn,
                    shape,
                    rope,
                    ..
                } => match (&attn.kv, kv_cache(caches[i].as_mut()), *source) {
                    (Some(kv), Some(cache), KvSource::Own { .. }) => {
                        let (a, kvs) = b::attention_own_kv(
                            &x,
                            b::OwnQkv::Separate { attn, kv },
                            *shape,
                            rope,
                            cache,
                            mask,
                        )?;
                        shared.insert(i, kvs);
                        a
                    }
                    (_, _, KvSource::Shared { donor }) => {
                        let kvs = shared.get(&donor).ok_or_else(|| {
                            Exception::custom(format!(
                                "layer {i}: donor layer {donor} produced no K/V"
                            ))
                        })?;
                        b::attention_shared_kv(&x, attn, *shape, rope, kvs, mask)?
                    }
                    _ => {
                        return Err(Exception::custom(format!(
                            "layer {i}: owns its K/V but has no K/V weights or cache"
                        )))
                    }
                },
            };
            h = self.finish_layer(i, layer, &h, &a, per_layer.as_ref())?;
        }
        match readout {
            Readout::Logits => self.head(&h),
            Readout::NormedHidden => b::final_norm(&h, &self.norm, eps),
        }
    }
}

mod batch;

/// Loads an mlx-community style checkpoint directory into the monolith
/// ([`archgen_checkpoint::read_dir`]: config.json through the spec importer,
/// the weights through mlx-lm's sanitize rules).
pub fn load_dir(dir: &std::path::Path) -> std::result::Result<Monolith, ModelError> {
    let (arch, weights) = archgen_checkpoint::read_dir(dir)?;
    Monolith::new(arch, weights).map_err(|e| ModelError(format!("{}: {e}", dir.display())))
}
