//! The model file of every spec, read from the plan's block IR: constants,
//! one struct per layer kind with its load and forward written out (each
//! line commented in mlx-lm's terms, `composition.rs`), and the model over
//! its layers as data plus loops (`layout.rs`), every branch resolved at
//! generation time. Nothing here asks which family a model is;
//! each IR fact maps onto the runtime block that runs it
//! (`archgen_runtime::blocks`).

use archgen_ir::RopeKind;
use archgen_ir::{
    Activation, Attention, DeltaNet, EmbedScale, FeedForward, GatedNorm, HeadWeight, InProj,
    KvCache, KvSource, Layer, LayerInput, LayerScalar, LogitScale, Mixer, ModelIr, Moe,
    NormArrangement, NormWeight, OutputGate, ProjectionBias, QkNorm, Residual, Router, Scores,
    SharedExpert, ShortConv, Softcap, SoftcapForm, StateCache, TopKProbs, ValueNorm, Values,
    Window,
};
use archgen_ir::{GateUpProjection, GatedMlp, QkvProjection};
use archgen_ir::{LatentAttention, LatentQuery, RopeForm};
use archgen_plan::{rope_parameters, LayerKind, Plan, RopeNumber};
use proc_macro2::{Ident, Literal, TokenStream};
use quote::quote;

use crate::comments::comment;
use crate::composition::{Composition, ForwardLines};
use crate::layout::{layout_tokens, Layout};
use crate::tokens::{ident, lit_f32, lit_i32, rope_context, window_name, windows};
use crate::words;

/// Whether the model's one-token steps run through the compiled decode
/// blocks (`decode.rs`) in rows [B, hidden], with RoPE tables made once per
/// step for every layer: when every layer is a plain attention layer. A
/// hybrid model's Gated DeltaNet and gated attention layers take their own
/// compiled blocks from the layer, in [B, 1, hidden] (each gated attention
/// layer makes its step's tables).
fn compiled_decode(ir: &ModelIr) -> bool {
    ir.layers.iter().all(steps_with_tables)
}

/// Whether the model's one-token steps make RoPE tables for its windows:
/// when some plain attention layer runs the compiled decode blocks. A
/// hybrid model (LFM2's short convs beside attention) makes them too, and
/// its attention layers take the blocks in [B, 1, hidden] while the others
/// run their own.
fn step_tables(ir: &ModelIr) -> bool {
    ir.layers.iter().any(steps_with_tables)
}

/// Whether a layer's one-token step is `decode::step` with its window's
/// RoPE tables: a plain attention layer that reaches `decode`.
fn steps_with_tables(l: &Layer) -> bool {
    reaches_decode(l)
        && match &l.mixer {
            Mixer::Attention(_) => true,
            Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) | Mixer::LatentAttention(_) => false,
        }
}

/// Whether a layer kind's forward calls `decode`: plain attention (one
/// output, separate q/k/v projections) and Gated DeltaNet kinds do; gated
/// attention and fused-qkv kinds have no compiled block for their mixer,
/// and post-norm kinds none for their norms (`decode`'s blocks put the norm
/// before the mixer), so they run their one-token steps eagerly.
fn reaches_decode(l: &Layer) -> bool {
    let norm_before_mixer = match l.norms.arrangement {
        NormArrangement::PreNorm | NormArrangement::Sandwich => true,
        NormArrangement::PostNorm => false,
    };
    norm_before_mixer
        && match &l.mixer {
            Mixer::Attention(a) => plain_attention(a),
            Mixer::GatedDeltaNet(_) => true,
            // No compiled block for a short conv or a latent attention:
            // their steps run eagerly.
            Mixer::ShortConv(_) | Mixer::LatentAttention(_) => false,
        }
}

/// Whether an attention layer runs through the plain kind, whose one-token
/// steps take the compiled decode blocks: no output gate, and separate
/// q/k/v projections (the blocks stack or view those; a fused `qkv_proj`
/// layer runs its own kind, eager throughout).
fn plain_attention(a: &Attention) -> bool {
    match (a.output_gate, a.projection) {
        (OutputGate::None, QkvProjection::Separate) => true,
        (OutputGate::SigmoidPerHead, _) | (OutputGate::None, QkvProjection::Fused) => false,
    }
}

/// Loading a layer's dense MLP: `load_mlp` with separate gate and up
/// projections, `load_mlp_projected` with one `gate_up_proj`.
fn mlp_load_tokens(m: GatedMlp) -> TokenStream {
    let act = activation_tokens(m.activation);
    match m.projection {
        GateUpProjection::Separate => quote! { b::load_mlp(w, i, HIDDEN, mlp_width, #act) },
        GateUpProjection::Fused => quote! {
            b::load_mlp_projected(w, i, HIDDEN, mlp_width, #act, b::GateUpProjection::Fused)
        },
    }
}

fn window_words(w: Window) -> String {
    match w {
        Window::Full => "full attention".to_string(),
        Window::Sliding(n) => format!("sliding-window attention ({n})"),
    }
}

/// Loading a layer's norms: stored weights, or `1 + w` folded at load (a
/// post-norm layer's are `b::PostNorms`, the others' `b::LayerNorms`).
fn norms_load_tokens(l: &Layer) -> TokenStream {
    let arrangement = match l.norms.arrangement {
        NormArrangement::PreNorm => quote! { b::NormArrangement::PreNorm },
        NormArrangement::Sandwich => quote! { b::NormArrangement::Sandwich },
        NormArrangement::PostNorm => {
            let weight = match l.norms.weight {
                NormWeight::Direct => quote! { b::NormWeight::Direct },
                NormWeight::OnePlus => quote! { b::NormWeight::OnePlus },
            };
            return quote! { b::load_post_norms(w, i, HIDDEN, #weight) };
        }
    };
    match l.norms.weight {
        NormWeight::Direct => quote! { b::load_norms(w, i, HIDDEN, #arrangement) },
        NormWeight::OnePlus => {
            quote! { b::load_norms_weighted(w, i, HIDDEN, #arrangement, b::NormWeight::OnePlus) }
        }
    }
}

fn qk_tokens(a: &Attention) -> TokenStream {
    match a.qk_norm {
        QkNorm::None => quote! { b::QkNorm::None },
        QkNorm::RmsPerHead => quote! { b::QkNorm::RmsPerHead },
        QkNorm::RmsPerHeadOnePlus => quote! { b::QkNorm::RmsPerHeadOnePlus },
        QkNorm::RmsWholeProjection => quote! { b::QkNorm::RmsWholeProjection },
    }
}

fn activation_tokens(a: Activation) -> TokenStream {
    match a {
        Activation::GeluApprox => quote! { b::Activation::GeluApprox },
        Activation::GeluApproxThenMultiply => quote! { b::Activation::GeluApproxThenMultiply },
        Activation::Silu => quote! { b::Activation::Silu },
        Activation::ClampedSwiglu => quote! { b::Activation::ClampedSwiglu },
    }
}

/// The attention shape constant of a kind.
fn shape_tokens(a: &Attention) -> Result<TokenStream, String> {
    let (h, kv, hd) = (
        lit_i32(a.n_heads)?,
        lit_i32(a.n_kv_heads)?,
        lit_i32(a.head_dim)?,
    );
    let scale = lit_f32(a.scale.value(a.head_dim));
    let value_norm = match a.value_norm {
        ValueNorm::None => quote! { b::ValueNorm::None },
        ValueNorm::RmsScaleFree => quote! { b::ValueNorm::RmsScaleFree },
    };
    let scores = match a.scores {
        Scores::FusedSdpa => quote! { b::Scores::FusedSdpa },
        Scores::Softcapped { cap } => {
            let cap = lit_f32(cap);
            quote! { b::Scores::Softcapped { cap: #cap } }
        }
        Scores::FusedSdpaWithSinks => quote! { b::Scores::FusedSdpaWithSinks },
    };
    Ok(quote! {
        AttentionShape { n_heads: #h, n_kv_heads: #kv, head_dim: #hd, eps: EPS, scale: #scale, value_norm: #value_norm, scores: #scores }
    })
}

/// What a kind's doc comment says about it.
fn kind_doc(l: &Layer, layers: &[usize]) -> String {
    // A run of consecutive layers reads as its ends.
    let consecutive = layers.windows(2).all(|p| p[1] == p[0] + 1);
    let list = match (layers.first(), layers.last()) {
        (Some(first), Some(last)) if consecutive && layers.len() > 2 => {
            format!("{first} to {last}")
        }
        _ => layers
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let mut parts = vec![match &l.mixer {
        Mixer::Attention(a) => window_words(a.window),
        Mixer::GatedDeltaNet(d) => format!(
            "Gated DeltaNet linear attention ({} key / {} value heads, conv kernel {}; conv and recurrent state)",
            d.k_heads, d.v_heads, d.conv_kernel
        ),
        Mixer::ShortConv(c) => format!(
            "gated short convolution (conv kernel {}; conv state)",
            c.kernel
        ),
        Mixer::LatentAttention(a) => format!(
            "multi-head latent attention ({} heads, latent {}, RoPE key {}; cache of the latent and the RoPE key)",
            a.n_heads, a.kv_lora_rank, a.qk_rope_head_dim
        ),
    }];
    parts.push(match l.norms.arrangement {
        NormArrangement::PreNorm => "pre-norm".to_string(),
        NormArrangement::Sandwich => "sandwich norms".to_string(),
        NormArrangement::PostNorm => "post-norm (after attention and MLP only)".to_string(),
    });
    match l.norms.weight {
        NormWeight::Direct => {}
        NormWeight::OnePlus => parts.push("norm weights 1 + w".to_string()),
    }
    if let Some(a) = l.attention() {
        attention_doc(a, &mut parts);
    }
    let mlp = |act: Activation| match act {
        Activation::GeluApprox => "GeGLU MLP",
        Activation::GeluApproxThenMultiply => "GELU-then-multiply MLP",
        Activation::Silu => "SwiGLU MLP",
        Activation::ClampedSwiglu => "clamped-SwiGLU MLP",
    };
    let fused = |m: GatedMlp| match m.projection {
        GateUpProjection::Separate => "",
        GateUpProjection::Fused => " (one fused gate_up_proj, split)",
    };
    parts.push(match l.ffn {
        FeedForward::Mlp(m) => format!("{}{}", mlp(m.activation), fused(m)),
        FeedForward::MlpAndMoe { mlp: m, .. } => {
            format!("{}{} + routed experts", mlp(m.activation), fused(m))
        }
        FeedForward::Moe(m) => format!(
            "{} routed experts (top-{}) in place of the MLP",
            m.num_experts, m.top_k
        ),
        FeedForward::MoeAndSharedExpert { moe, shared } => format!(
            "{} routed experts (top-{}) and a shared expert of width {} in place of the MLP",
            moe.num_experts, moe.top_k, shared.width
        ),
        FeedForward::MoeAndSharedExperts { moe, shared } => format!(
            "{} sigmoid-routed experts (top-{}) and ungated shared experts of width {} in place of the MLP",
            moe.num_experts, moe.top_k, shared.width
        ),
        FeedForward::BiasedExperts(m) => format!(
            "{} routed experts (top-{}) with biases and the clamped SwiGLU in place of the MLP",
            m.num_experts, m.top_k
        ),
    });
    parts.extend(words::layer_extras(l));
    format!(
        " {} {list}: {}.",
        if layers.len() == 1 { "Layer" } else { "Layers" },
        parts.join(", ")
    )
}

/// The attention facts of a kind's doc comment.
fn attention_doc(a: &Attention, parts: &mut Vec<String>) {
    parts.extend(words::no_rope(a.rope.kind).map(String::from));
    match a.scores {
        Scores::FusedSdpa => {}
        Scores::Softcapped { cap } => {
            parts.push(format!("written-out attention, scores softcapped at {cap}"))
        }
        Scores::FusedSdpaWithSinks => parts.push("attention sinks".to_string()),
    }
    parts.push(match a.kv {
        KvSource::Own {
            values: Values::Projected,
            ..
        } => "computes its own K/V".to_string(),
        KvSource::Own {
            values: Values::SameAsKeys,
            ..
        } => "computes its own K/V (V = K projection, no v_proj)".to_string(),
        KvSource::Shared { .. } => "reads a donor's K/V".to_string(),
    });
    parts.extend(words::projection_extras(a).into_iter().map(String::from));
    parts.extend(words::qk_norm(a.qk_norm).map(String::from));
    // Qwen3.5's gated attention rotates part of each head.
    match a.output_gate {
        OutputGate::None => {}
        OutputGate::SigmoidPerHead => parts.push(format!(
            "RoPE on {} of {} dims",
            a.rope.rotated_dims, a.head_dim
        )),
    }
}

/// The feed-forward half of a layer kind, held as the runtime's one
/// `FeedForward` (field `ffn`): its load and the load function's signature,
/// which takes `mlp_width` where the layer has a dense MLP (`LAYOUT` passes
/// it then). The rest (the field, its pretranspose, the decode blocks'
/// `&self.ffn`, the finish through `FeedForward::after_mixer`) reads the
/// same for every variant.
struct FfnLoad {
    load: TokenStream,
    signature: TokenStream,
}

/// [`FfnLoad`] of every IR feed-forward form a runtime block runs; the
/// mixers' own kinds refuse the forms their decode blocks do not take.
fn feed_forward_load(l: &Layer, kind: &str) -> Result<FfnLoad, String> {
    match l.ffn {
        FeedForward::Mlp(m) => {
            let mlp = mlp_load_tokens(m);
            Ok(with_mlp(
                quote! { ffn: FeedForward::Mlp { mlp: #mlp, moe: None }, },
            ))
        }
        FeedForward::MlpAndMoe { mlp, moe } => match (moe.router, moe.activation) {
            (Router::ScaledTopKSoftmax, Activation::GeluApprox) => {
                let (mlp, experts) = (mlp_load_tokens(mlp), sizes(moe)?);
                Ok(with_mlp(quote! {
                    ffn: FeedForward::Mlp { mlp: #mlp, moe: Some(b::load_moe(w, i, HIDDEN, #experts, EPS)) },
                }))
            }
            (
                Router::ScaledTopKSoftmax,
                Activation::Silu | Activation::GeluApproxThenMultiply | Activation::ClampedSwiglu,
            )
            | (
                Router::SoftmaxTopK { .. }
                | Router::SigmoidGroupTopK(_)
                | Router::TopKPreciseSoftmax,
                _,
            ) => Err(format!(
                "layer kind {kind}: experts beside the MLP run only with Gemma-4's router and GeGLU"
            )),
        },
        FeedForward::Moe(m) => routed_experts_load(m, kind),
        FeedForward::MoeAndSharedExpert { moe, shared } => shared_expert_load(moe, shared, kind),
        FeedForward::MoeAndSharedExperts { moe, shared } => shared_experts_load(moe, shared, kind),
        FeedForward::BiasedExperts(m) => biased_experts_load(m, kind),
    }
}

/// The loader of a layer that loads a dense MLP (its width a parameter).
fn with_mlp(load: TokenStream) -> FfnLoad {
    FfnLoad {
        load,
        signature: quote! { w: &mut Weights, i: usize, mlp_width: i32 },
    }
}

/// The loader of a layer whose routed experts take the MLP's place.
fn experts_only(load: TokenStream) -> FfnLoad {
    FfnLoad {
        load,
        signature: quote! { w: &mut Weights, i: usize },
    }
}

fn probs_tokens(probs: TopKProbs) -> TokenStream {
    match probs {
        TopKProbs::Renormalized => quote! { b::TopKProbs::Renormalized },
        TopKProbs::AsTaken => quote! { b::TopKProbs::AsTaken },
    }
}

/// The sizes routed experts load with.
fn sizes(m: Moe) -> Result<TokenStream, String> {
    let (count, top_k, width) = (
        lit_i32(m.num_experts)?,
        lit_i32(m.top_k)?,
        lit_i32(m.width)?,
    );
    Ok(quote! { b::ExpertsShape { count: #count, top_k: #top_k, width: #width } })
}

/// The top-k probabilities of routed experts that run only behind the
/// softmax-then-top-k router with SwiGLU (`what` they are, in the error).
fn softmax_top_k_swiglu(m: Moe, kind: &str, what: &str) -> Result<TopKProbs, String> {
    match (m.router, m.activation) {
        (Router::SoftmaxTopK { probs }, Activation::Silu) => Ok(probs),
        (
            Router::SoftmaxTopK { .. },
            Activation::GeluApprox | Activation::GeluApproxThenMultiply | Activation::ClampedSwiglu,
        )
        | (
            Router::ScaledTopKSoftmax | Router::SigmoidGroupTopK(_) | Router::TopKPreciseSoftmax,
            _,
        ) => Err(format!(
            "layer kind {kind}: {what} run only with the softmax-then-top-k router and SwiGLU"
        )),
    }
}

/// Routed experts in place of the MLP (Qwen3-MoE).
fn routed_experts_load(m: Moe, kind: &str) -> Result<FfnLoad, String> {
    let probs = softmax_top_k_swiglu(m, kind, "experts in place of the MLP")?;
    let (experts, probs) = (sizes(m)?, probs_tokens(probs));
    Ok(experts_only(quote! {
        ffn: FeedForward::SparseMoe(b::load_sparse_moe(w, i, HIDDEN, #experts, #probs)),
    }))
}

/// Routed experts with a gated shared expert (Qwen3.5/3.6 MoE, Qwen3-Next).
fn shared_expert_load(moe: Moe, shared: SharedExpert, kind: &str) -> Result<FfnLoad, String> {
    let probs = softmax_top_k_swiglu(moe, kind, "experts with a shared expert")?;
    let (experts, sw) = (sizes(moe)?, lit_i32(shared.width)?);
    let probs = probs_tokens(probs);
    Ok(experts_only(quote! {
        ffn: FeedForward::SharedExpertMoe(deltanet::load_shared_expert_moe(w, i, HIDDEN, #experts, #sw, #probs)),
    }))
}

/// Routed experts behind the sigmoid group router with shared experts
/// (GLM-4.5 MoE, DeepSeek-V3).
fn shared_experts_load(moe: Moe, shared: SharedExpert, kind: &str) -> Result<FfnLoad, String> {
    match (moe.router, moe.activation) {
        (Router::SigmoidGroupTopK(g), Activation::Silu) => {
            let (experts, sw) = (sizes(moe)?, lit_i32(shared.width)?);
            let (top_k, n_group, topk_group) =
                (lit_i32(moe.top_k)?, lit_i32(g.n_group)?, lit_i32(g.topk_group)?);
            let (probs, scaling) = (probs_tokens(g.probs), g.routed_scaling_factor);
            Ok(experts_only(quote! {
                ffn: FeedForward::GroupRoutedMoe(b::load_group_routed_moe(w, i, HIDDEN, #experts, #sw, b::GroupTopK {
                    top_k: #top_k, n_group: #n_group, topk_group: #topk_group, probs: #probs, routed_scaling_factor: #scaling,
                })),
            }))
        }
        (
            Router::SigmoidGroupTopK(_),
            Activation::GeluApprox | Activation::GeluApproxThenMultiply | Activation::ClampedSwiglu,
        )
        | (
            Router::ScaledTopKSoftmax
            | Router::SoftmaxTopK { .. }
            | Router::TopKPreciseSoftmax,
            _,
        ) => Err(format!(
            "layer kind {kind}: experts with shared experts run only with the sigmoid group router and SwiGLU"
        )),
    }
}

/// Routed experts with biases (gpt-oss).
fn biased_experts_load(m: Moe, kind: &str) -> Result<FfnLoad, String> {
    match (m.router, m.activation) {
        (Router::TopKPreciseSoftmax, Activation::ClampedSwiglu) => {
            let experts = sizes(m)?;
            Ok(experts_only(quote! {
                ffn: FeedForward::BiasedExperts(b::load_biased_experts_moe(w, i, HIDDEN, #experts)),
            }))
        }
        (
            Router::TopKPreciseSoftmax,
            Activation::GeluApprox | Activation::GeluApproxThenMultiply | Activation::Silu,
        )
        | (
            Router::ScaledTopKSoftmax
            | Router::SoftmaxTopK { .. }
            | Router::SigmoidGroupTopK(_),
            _,
        ) => Err(format!(
            "layer kind {kind}: biased experts run only with the top-k softmax router and the clamped SwiGLU"
        )),
    }
}

/// [`feed_forward_load`] of a hybrid, fused-qkv or latent attention layer
/// kind, whose blocks take a dense MLP or routed experts with shared experts
/// (gated or not), and nothing after it.
fn hybrid_ffn(l: &Layer, kind: &str) -> Result<FfnLoad, String> {
    let unsupported = |what: &str| {
        Err(format!(
            "layer kind {kind}: {what} beside a Gated DeltaNet, gated, fused-qkv or latent attention is not supported yet"
        ))
    };
    match l.norms.arrangement {
        NormArrangement::PreNorm | NormArrangement::Sandwich => {}
        NormArrangement::PostNorm => return unsupported("post-norm"),
    }
    match (l.input, l.scalar) {
        (LayerInput::None, LayerScalar::None) => {}
        (LayerInput::Gated { .. }, _) => return unsupported("a per-layer input gate"),
        (_, LayerScalar::Learned) => return unsupported("a layer scalar"),
    }
    match l.residual {
        Residual::Plain => {}
        Residual::DepthScaled { .. } | Residual::Scaled { .. } | Residual::ClippedInFloat16 => {
            return unsupported("scaled or clipped residual branches")
        }
    }
    match l.ffn {
        FeedForward::Mlp(_)
        | FeedForward::MoeAndSharedExpert { .. }
        | FeedForward::MoeAndSharedExperts { .. } => feed_forward_load(l, kind),
        FeedForward::MlpAndMoe { .. } | FeedForward::Moe(_) => {
            unsupported("routed experts without a shared expert")
        }
        FeedForward::BiasedExperts(_) => unsupported("routed experts with biases"),
    }
}

/// What the kinds holding their mixer beside the runtime's `FeedForward`
/// (Gated DeltaNet, gated attention, one `qkv_proj`) write alike: the
/// struct (the layer's norms, the mixer as `field: ty`, `ffn`), `load` (the
/// mixer by `mixer_load`, everything pretransposed) and `finish`. These
/// kinds have no per-layer input gate, layer scalar or scaled residuals
/// ([`hybrid_ffn`] refuses them).
struct MixerKindParts {
    name: Ident,
    definition: TokenStream,
    load: TokenStream,
    finish: TokenStream,
}

impl MixerKindParts {
    /// The kind's struct and impl: `shape` its `SHAPE` constant, `methods`
    /// its forwards.
    fn with(self, shape: TokenStream, methods: TokenStream) -> TokenStream {
        let MixerKindParts {
            name,
            definition,
            load,
            finish,
        } = self;
        quote! {
            #definition

            impl #name {
                #shape

                #load

                #methods

                #finish
            }
        }
    }
}

fn mixer_kind_parts(
    kind: &LayerKind,
    field: &str,
    ty: TokenStream,
    mixer_load: TokenStream,
) -> Result<MixerKindParts, String> {
    let l = &kind.key.0;
    let (name, field) = (ident(&kind.name), ident(field));
    let doc = kind_doc(l, &kind.layers);
    let norms_load = norms_load_tokens(l);
    let FfnLoad {
        load: ffn_load,
        signature,
    } = hybrid_ffn(l, &kind.name)?;
    Ok(MixerKindParts {
        definition: quote! {
            #[doc = #doc]
            struct #name {
                norms: b::LayerNorms,
                #field: #ty,
                ffn: FeedForward,
            }
        },
        load: quote! {
            fn load(#signature) -> Self {
                let mut layer = Self {
                    norms: #norms_load,
                    #field: #mixer_load,
                    #ffn_load
                };
                layer.#field.pretranspose();
                layer.ffn.pretranspose();
                layer
            }
        },
        finish: finish_tokens(None, quote! { b::Residual::Plain }, quote! { None, None }),
        name,
    })
}

/// `finish`, the layer after its mixer's output `a` (batched or not): the
/// mixer residual and the feed-forward half (`FeedForward::after_mixer`,
/// its branches added in the `residual` form), then the
/// per-layer input gate (`ple_arg` its argument) and the layer scalar.
fn finish_tokens(
    ple_arg: Option<TokenStream>,
    residual: TokenStream,
    layer_end: TokenStream,
) -> TokenStream {
    quote! {
        /// The layer after its mixer's output `a`, batched or not.
        fn finish(&self, h: &Array, a: Array #ple_arg) -> Result<Array> {
            let h = self.ffn.after_mixer(h, &a, &self.norms, #residual, EPS)?;
            b::finish_layer(&h, #layer_end, EPS)
        }
    }
}

/// A Gated DeltaNet layer kind: its weights, and a forward that runs the
/// eager blocks for prefill (the recurrence is a loop of one compiled step
/// per token, as mlx-lm's `gated_delta_ops`) and the compiled decode block
/// `decode::delta_net` for one-token steps.
fn delta_net_kind_tokens(kind: &LayerKind, d: &DeltaNet) -> Result<TokenStream, String> {
    let l = &kind.key.0;
    let load = match (d.in_proj, d.norm, d.cache) {
        (InProj::Split, GatedNorm::RmsSiluGate, StateCache::ConvAndRecurrent) => {
            quote! { deltanet::load_gated_delta_net(w, i, Self::SHAPE) }
        }
        (InProj::GroupedPerKeyHead, GatedNorm::RmsSiluGate, StateCache::ConvAndRecurrent) => {
            quote! { deltanet::load_grouped_gated_delta_net(w, i, Self::SHAPE) }
        }
    };
    let parts = mixer_kind_parts(kind, "mixer", quote! { deltanet::GatedDeltaNet }, load)?;
    let [kh, vh, kd, vd, conv] = [
        d.k_heads,
        d.v_heads,
        d.k_head_dim,
        d.v_head_dim,
        d.conv_kernel,
    ]
    .map(lit_i32);
    let (kh, vh, kd, vd, conv) = (kh?, vh?, kd?, vd?, conv?);
    let body = Composition::of(l).forward_body(ForwardLines {
        decode: Some(quote! {
            if h.shape()[1] == 1 && decode::enabled() {
                return decode::delta_net(h, &self.decode_layer(), cache);
            }
        }),
        mixer: quote! { let a = deltanet::gated_delta_net(&x, &self.mixer, cache)?; },
        finish: quote! { self.finish(h, a) },
    });
    let shape = quote! {
        const SHAPE: deltanet::DeltaNetShape = deltanet::DeltaNetShape {
            hidden: HIDDEN, num_k_heads: #kh, num_v_heads: #vh, head_k_dim: #kd,
            head_v_dim: #vd, conv_kernel: #conv, eps: EPS,
        };
    };
    let methods = quote! {
        /// One-token steps through the compiled decode block (where
        /// `decode` is enabled), prefill through the eager blocks.
        fn forward(&self, h: &Array, cache: &mut deltanet::ArraysCache) -> Result<Array> {
            #body
        }

        /// B sequences in one forward (mlx-lm's `BatchGenerator`): the
        /// batched recurrence over a merged `ArraysCache`, each row's
        /// padding masked; a one-token step with no row padded through
        /// the compiled decode block, B rows at once.
        fn forward_batch(&self, h: &Array, cache: &mut BatchArraysCache, mask: Option<&Array>) -> Result<Array> {
            if let Some(h) = batch_blocks::delta_net_step(h, &self.decode_layer(), cache)? {
                return Ok(h);
            }
            let x = rms_norm(h, Some(self.norms.input()), EPS)?;
            let a = gated_delta_net_batch(&x, &self.mixer, cache, mask)?;
            self.finish(h, a)
        }

        /// The layer as the compiled decode block reads it.
        fn decode_layer(&self) -> decode::DeltaNetLayer<'_> {
            decode::DeltaNetLayer { norms: &self.norms, mixer: &self.mixer, ffn: &self.ffn, eps: EPS }
        }
    };
    Ok(parts.with(shape, methods))
}

/// A short-conv layer kind (lfm2's `ShortConv`): its weights, and forwards
/// that run the eager blocks for every step (no compiled decode block).
fn short_conv_kind_tokens(kind: &LayerKind, c: &ShortConv) -> Result<TokenStream, String> {
    let l = &kind.key.0;
    let parts = mixer_kind_parts(
        kind,
        "mixer",
        quote! { short_conv::ShortConv },
        quote! { short_conv::load_short_conv(w, i, HIDDEN, Self::KERNEL) },
    )?;
    let kernel = lit_i32(c.kernel)?;
    let body = Composition::of(l).forward_body(ForwardLines {
        decode: None,
        mixer: quote! { let a = short_conv::short_conv(&x, &self.mixer, cache)?; },
        finish: quote! { self.finish(h, a) },
    });
    let shape = quote! {
        /// `conv_L_cache`: the conv's taps.
        const KERNEL: i32 = #kernel;
    };
    let methods = quote! {
        /// Prefill and one-token steps alike, through the eager blocks.
        fn forward(&self, h: &Array, cache: &mut deltanet::ArraysCache) -> Result<Array> {
            #body
        }

        /// B sequences in one forward (mlx-lm's `BatchGenerator`): the conv
        /// over a merged `ArraysCache`, each row's padding masked.
        fn forward_batch(&self, h: &Array, cache: &mut BatchArraysCache, mask: Option<&Array>) -> Result<Array> {
            let x = rms_norm(h, Some(self.norms.input()), EPS)?;
            let a = short_conv::short_conv_batch(&x, &self.mixer, cache, mask)?;
            self.finish(h, a)
        }
    };
    Ok(parts.with(shape, methods))
}

/// A latent attention layer kind (`DeepseekV3Attention`): the eager blocks
/// for prefill and one-token steps alike, the model's latent RoPE passed in.
fn latent_attention_kind_tokens(
    kind: &LayerKind,
    a: &LatentAttention,
) -> Result<TokenStream, String> {
    let l = &kind.key.0;
    let parts = mixer_kind_parts(
        kind,
        "attn",
        quote! { mla::LatentAttention },
        quote! { mla::load_latent_attention(w, &format!("layers.{i}.self_attn"), HIDDEN, Self::Q_LORA_RANK, &Self::SHAPE) },
    )?;
    let (heads, nope, rope, v, rank) = (
        lit_i32(a.n_heads)?,
        lit_i32(a.qk_nope_head_dim)?,
        lit_i32(a.qk_rope_head_dim)?,
        lit_i32(a.v_head_dim)?,
        lit_i32(a.kv_lora_rank)?,
    );
    let scale = Literal::f64_suffixed(a.scale);
    let q_lora = match a.query {
        LatentQuery::Direct => quote! { None },
        LatentQuery::LowRank { rank } => {
            let r = lit_i32(rank)?;
            quote! { Some(#r) }
        }
    };
    let body = Composition::of(l).forward_body(ForwardLines {
        decode: None,
        mixer: quote! { let a = mla::latent_attention(&x, &self.attn, &Self::SHAPE, rope, cache)?; },
        finish: quote! { self.finish(h, a) },
    });
    let shape = quote! {
        /// The heads, the query/key dims without and with RoPE, the value
        /// dims, the latent's width and the module's scale (a Python float).
        const SHAPE: mla::LatentShape = mla::LatentShape {
            heads: #heads,
            nope_dim: #nope,
            rope_dim: #rope,
            v_dim: #v,
            kv_lora_rank: #rank,
            scale: #scale,
        };
        /// `q_lora_rank` (None: one `q_proj`).
        const Q_LORA_RANK: Option<i32> = #q_lora;
    };
    let methods = quote! {
        /// Prefill and one-token steps alike, through the eager blocks; the
        /// mask (an array for more than one token) from its cache.
        fn forward(&self, h: &Array, rope: &Rope, cache: &mut LayerCache) -> Result<Array> {
            #body
        }

        /// B sequences in one forward (mlx-lm's `BatchGenerator`): RoPE at
        /// each row's offset, the latent and the RoPE key in a merged K/V
        /// cache, the left-padded mask from it before its update.
        fn forward_batch(&self, h: &Array, rope: &Rope, cache: &mut BatchLayerCache) -> Result<Array> {
            let x = rms_norm(h, Some(self.norms.input()), EPS)?;
            let mask = batch_blocks::window_mask(cache, h.shape()[1], 0)?;
            let a = batch_blocks::latent_attention(&x, &self.attn, &Self::SHAPE, rope, cache, &mask)?;
            self.finish(h, a)
        }
    };
    Ok(parts.with(shape, methods))
}

/// Whether the attention computes its own K/V with V projected (the only
/// form the gated and fused-qkv kinds' blocks take).
fn owns_projected_kv(a: &Attention) -> bool {
    match a.kv {
        KvSource::Own { values, .. } => match values {
            Values::Projected => true,
            Values::SameAsKeys => false,
        },
        KvSource::Shared { .. } => false,
    }
}

/// What the attention kinds held by [`MixerKindParts`] (gated attention,
/// one `qkv_proj`) build alike before their forwards: the parts, the
/// `SHAPE` constant and the forward's comments.
struct AttentionKindParts {
    parts: MixerKindParts,
    shape: TokenStream,
    /// `forward_batch`: the norm, the batched attention block, `finish`.
    forward_batch: TokenStream,
    composition: Composition,
}

impl AttentionKindParts {
    /// The kind's struct and impl, `forward` its unbatched forward.
    fn with_forward(self, forward: TokenStream) -> TokenStream {
        let AttentionKindParts {
            parts,
            shape,
            forward_batch,
            composition: _,
        } = self;
        parts.with(
            shape,
            quote! {
                #forward

                #forward_batch
            },
        )
    }
}

/// What a kind's forwards return: the hidden state, or beside it the K/V
/// the layer computed (a model with donor layers threads it to readers).
#[derive(Clone, Copy)]
enum KindOutput {
    Hidden,
    HiddenAndKv,
}

/// What an attention kind's `forward_batch` runs: the eager batched
/// `block` and what it returns, after a one-token `step` through the
/// compiled decode blocks where the kind has them.
struct BatchForward {
    block: TokenStream,
    output: KindOutput,
    step: Option<TokenStream>,
}

/// [`AttentionKindParts`] of an attention kind whose blocks run only the
/// attention forms for which `supported` holds; `unsupported` says which
/// forms those are when it does not. `batch` is what its `forward_batch`
/// runs.
fn attention_kind_parts(
    kind: &LayerKind,
    a: &Attention,
    ty: TokenStream,
    mixer_load: TokenStream,
    batch: BatchForward,
    supported: bool,
    unsupported: &str,
) -> Result<AttentionKindParts, String> {
    let BatchForward {
        block: batch_block,
        output,
        step,
    } = batch;
    let parts = mixer_kind_parts(kind, "attn", ty, mixer_load)?;
    if !supported {
        return Err(format!("layer kind {}: {unsupported}", kind.name));
    }
    let shape = shape_tokens(a)?;
    let batch_doc: &[&str] = match step {
        Some(_) => &[
            " B sequences in one forward (mlx-lm's `BatchGenerator`): RoPE",
            " at each row's offset, a merged K/V cache; a one-token step",
            " through the compiled decode blocks, B rows at once, where",
            " the runtime takes them (`batch_blocks::gated_step_tables`).",
        ],
        None => &[
            " B sequences in one forward (mlx-lm's `BatchGenerator`): RoPE",
            " at each row's offset, a merged K/V cache.",
        ],
    };
    let (returns, binding, result) = match output {
        KindOutput::Hidden => (quote! { Array }, quote! { a }, quote! { self.finish(h, a) }),
        KindOutput::HiddenAndKv => (
            quote! { (Array, b::SharedKv) },
            quote! { (a, kv) },
            quote! { Ok((self.finish(h, a)?, kv)) },
        ),
    };
    Ok(AttentionKindParts {
        parts,
        shape: quote! {
            const SHAPE: AttentionShape = #shape;
        },
        forward_batch: quote! {
            #(#[doc = #batch_doc])*
            fn forward_batch(&self, h: &Array, at: &WindowStep, cache: &mut BatchLayerCache) -> Result<#returns> {
                #step
                let x = rms_norm(h, Some(self.norms.input()), EPS)?;
                let #binding = #batch_block(&x, &self.attn, Self::SHAPE, at.rope, cache, at.mask)?;
                #result
            }
        },
        composition: Composition::of(&kind.key.0),
    })
}

/// A gated full-attention layer kind (`Qwen3NextAttention`): eager blocks
/// for prefill, `decode::gated_attention` for one-token steps.
fn gated_attention_kind_tokens(kind: &LayerKind, a: &Attention) -> Result<TokenStream, String> {
    let supported = owns_projected_kv(a)
        && a.window == Window::Full
        && a.qk_norm == QkNorm::RmsPerHead
        && a.value_norm == ValueNorm::None
        && a.bias == ProjectionBias::None
        && a.scores == Scores::FusedSdpa
        && !a.rope.traditional
        && a.projection == QkvProjection::Separate;
    // A batch's one-token step takes the compiled decode blocks, B rows at
    // once, where the runtime says so (the CPU); longer steps the eager
    // batched block.
    let batched = BatchForward {
        block: quote! { batch_blocks::gated_attention },
        output: KindOutput::Hidden,
        step: Some(quote! {
            if let Some(tables) = batch_blocks::gated_step_tables(at.rope, cache, h.shape()[1], h.dtype())? {
                return decode::gated_attention(h, &self.decode_layer(), &tables, cache, at.mask);
            }
        }),
    };
    let kind_parts = attention_kind_parts(
        kind,
        a,
        quote! { deltanet::GatedAttention },
        quote! { deltanet::load_gated_attention(w, i, HIDDEN, Self::SHAPE) },
        batched,
        supported,
        "an output-gated attention runs only as Qwen3Next's (own projected K/V, full window, q/k RMSNorm, no bias, fused SDPA, non-traditional RoPE, separate q/k/v projections)",
    )?;
    let body = kind_parts.composition.forward_body(ForwardLines {
        decode: Some(quote! {
            if h.shape()[1] == 1 && decode::enabled() {
                let tables = at.rope.tables(cache.offset(), 1, h.dtype())?;
                return decode::gated_attention(h, &self.decode_layer(), &tables, cache, at.mask);
            }
        }),
        mixer: quote! {
            let a = deltanet::gated_attention(&x, &self.attn, Self::SHAPE, at.rope, cache, at.mask)?;
        },
        finish: quote! { self.finish(h, a) },
    });
    let forward = quote! {
        /// One-token steps through the compiled decode blocks around
        /// the cache (where `decode` is enabled; this step's RoPE
        /// tables computed here), prefill through the eager blocks.
        fn forward(&self, h: &Array, at: &WindowStep, cache: &mut LayerCache) -> Result<Array> {
            #body
        }

        /// The layer as the compiled decode blocks read it.
        fn decode_layer(&self) -> decode::GatedAttentionLayer<'_> {
            decode::GatedAttentionLayer { norms: &self.norms, attn: &self.attn, ffn: &self.ffn, shape: Self::SHAPE, eps: EPS }
        }
    };
    Ok(kind_parts.with_forward(forward))
}

/// A layer kind with one `qkv_proj` (phi3.py's attention): its own K/V
/// split from one product, run by the eager blocks for every step (the
/// compiled decode blocks take separate projections).
fn fused_qkv_kind_tokens(kind: &LayerKind, a: &Attention) -> Result<TokenStream, String> {
    let supported =
        owns_projected_kv(a) && a.qk_norm == QkNorm::None && a.bias == ProjectionBias::None;
    let kind_parts = attention_kind_parts(
        kind,
        a,
        quote! { b::FusedQkvAttention },
        quote! { b::load_fused_qkv_attention(w, i, HIDDEN, Self::SHAPE) },
        BatchForward {
            block: quote! { batch_blocks::attention_fused_qkv },
            output: KindOutput::HiddenAndKv,
            step: None,
        },
        supported,
        "a fused qkv_proj runs only on a layer with K/V of its own (V projected), no bias and no q/k norm",
    )?;
    let body = kind_parts.composition.forward_body(ForwardLines {
        decode: None,
        mixer: quote! {
            let (a, kv) = b::attention_own_kv(&x, b::OwnQkv::Fused(&self.attn), Self::SHAPE, at.rope, cache, at.mask)?;
        },
        finish: quote! { Ok((self.finish(h, a)?, kv)) },
    });
    let forward = quote! {
        /// Eager for one token too: the compiled decode blocks take
        /// separate q/k/v projections.
        fn forward(&self, h: &Array, at: &WindowStep, cache: &mut LayerCache) -> Result<(Array, b::SharedKv)> {
            #body
        }
    };
    Ok(kind_parts.with_forward(forward))
}

/// Whether the layer's kind holds its feed-forward half as the runtime's
/// `FeedForward` ([`feed_forward_load`]): every kind with its norm before
/// the mixer; the post-norm kind ([`post_norm_kind_tokens`]) holds its MLP
/// beside `PostNorms`.
fn holds_feed_forward(l: &Layer) -> bool {
    match l.norms.arrangement {
        NormArrangement::PreNorm | NormArrangement::Sandwich => true,
        NormArrangement::PostNorm => false,
    }
}

/// The struct and impl of one layer kind.
fn kind_tokens(kind: &LayerKind) -> Result<TokenStream, String> {
    let l = &kind.key.0;
    let a = match &l.mixer {
        Mixer::GatedDeltaNet(d) => return delta_net_kind_tokens(kind, d),
        Mixer::ShortConv(c) => return short_conv_kind_tokens(kind, c),
        Mixer::LatentAttention(a) => return latent_attention_kind_tokens(kind, a),
        Mixer::Attention(a) => match (a.output_gate, a.projection) {
            (OutputGate::None, QkvProjection::Separate) => a,
            (OutputGate::None, QkvProjection::Fused) => return fused_qkv_kind_tokens(kind, a),
            (OutputGate::SigmoidPerHead, _) => return gated_attention_kind_tokens(kind, a),
        },
    };
    match l.norms.arrangement {
        NormArrangement::PreNorm | NormArrangement::Sandwich => {}
        NormArrangement::PostNorm => return post_norm_kind_tokens(kind, a),
    }
    Ok(PlainAttentionKind::of(kind, a)?.tokens())
}

/// The optional parts of a plain attention layer beyond its mixer and
/// feed-forward half: each is a field, its load, and what the forwards and
/// the decode view pass for it.
struct LayerExtras {
    /// The per-layer input gate's width, when the layer takes one.
    ple: Option<Literal>,
    /// Whether the layer ends with a learned scalar.
    scalar: bool,
    /// How the branches join the residual stream.
    residual: ResidualForm,
}

/// A layer kind's residual form (IR `Residual`) as its file writes it: a
/// scaled form keeps its factor (the Python float) for the field's load.
enum ResidualForm {
    Plain,
    Scaled(Literal),
    ClippedInFloat16,
}

impl LayerExtras {
    fn of(kind: &LayerKind) -> Result<Self, String> {
        let l = &kind.key.0;
        let ple = match l.input {
            LayerInput::None => None,
            LayerInput::Gated { width } => Some(lit_i32(width)?),
        };
        let scalar = match l.scalar {
            LayerScalar::None => false,
            LayerScalar::Learned => true,
        };
        // Scaled residual branches: the factor as a field (an array, so the
        // compiled decode block takes it as an input).
        let residual = match l.residual {
            Residual::Plain => ResidualForm::Plain,
            Residual::DepthScaled { .. } | Residual::Scaled { .. } => {
                let f = l
                    .residual
                    .factor()
                    .ok_or_else(|| format!("layer kind {}: no residual factor", kind.name))?;
                ResidualForm::Scaled(Literal::f64_suffixed(f))
            }
            Residual::ClippedInFloat16 => ResidualForm::ClippedInFloat16,
        };
        if let (FeedForward::Moe(_), ResidualForm::Scaled(_) | ResidualForm::ClippedInFloat16) =
            (l.ffn, &residual)
        {
            return Err(format!(
                "layer kind {}: routed experts with scaled or clipped residuals: no runtime block \
                 runs them",
                kind.name
            ));
        }
        Ok(LayerExtras {
            ple,
            scalar,
            residual,
        })
    }

    /// The struct's fields, after the feed-forward half.
    fn fields(&self) -> TokenStream {
        let ple = self.ple.as_ref().map(|_| quote! { ple: b::PleGate, });
        let scalar = self.scalar.then(|| quote! { layer_scalar: Array, });
        let residual = match self.residual {
            ResidualForm::Scaled(_) => Some(quote! { residual: Array, }),
            ResidualForm::Plain | ResidualForm::ClippedInFloat16 => None,
        };
        quote! { #ple #scalar #residual }
    }

    /// `load`'s initializers of those fields.
    fn loads(&self) -> TokenStream {
        let ple = self
            .ple
            .as_ref()
            .map(|pw| quote! { ple: b::load_ple_gate(w, i, HIDDEN, #pw), });
        let scalar = self
            .scalar
            .then(|| quote! { layer_scalar: b::load_layer_scalar(w, i), });
        let residual = match &self.residual {
            ResidualForm::Scaled(f) => Some(quote! { residual: b::residual_scale(#f), }),
            ResidualForm::Plain | ResidualForm::ClippedInFloat16 => None,
        };
        quote! { #ple #scalar #residual }
    }

    fn ple_pretranspose(&self) -> Option<TokenStream> {
        self.ple
            .as_ref()
            .map(|_| quote! { layer.ple.pretranspose(); })
    }

    /// The forwards' per-layer input parameter.
    fn ple_param(&self) -> Option<TokenStream> {
        self.ple.as_ref().map(|_| quote! { , pli: &Array })
    }

    /// The per-layer input passed on to `finish`.
    fn ple_pass(&self) -> Option<TokenStream> {
        self.ple.as_ref().map(|_| quote! { , pli })
    }

    /// The gate and its input, as `finish_layer` and the decode view take them.
    fn ple_use(&self) -> TokenStream {
        match self.ple {
            Some(_) => quote! { Some((&self.ple, pli)) },
            None => quote! { None },
        }
    }

    fn scalar_ref(&self) -> TokenStream {
        if self.scalar {
            quote! { Some(&self.layer_scalar) }
        } else {
            quote! { None }
        }
    }

    /// The per-layer input gate and the layer scalar, as `finish_layer`
    /// takes them.
    fn layer_end(&self) -> TokenStream {
        let (ple_use, scalar_ref) = (self.ple_use(), self.scalar_ref());
        quote! { #ple_use, #scalar_ref }
    }

    /// The residual form as `FeedForward::after_mixer` and the decode view
    /// take it.
    fn residual_form(&self) -> TokenStream {
        match self.residual {
            ResidualForm::Plain => quote! { b::Residual::Plain },
            ResidualForm::Scaled(_) => quote! { b::Residual::Scaled(&self.residual) },
            ResidualForm::ClippedInFloat16 => quote! { b::Residual::ClippedInFloat16 },
        }
    }

    /// `decode_layer`'s signature: the decode view borrows the PLE input for
    /// as long as the layer.
    fn decode_layer_sig(&self) -> TokenStream {
        match self.ple {
            Some(_) => {
                quote! { fn decode_layer<'a>(&'a self, pli: &'a Array) -> decode::Layer<'a> }
            }
            None => quote! { fn decode_layer(&self) -> decode::Layer<'_> },
        }
    }

    fn decode_layer_call(&self) -> TokenStream {
        match self.ple {
            Some(_) => quote! { self.decode_layer(pli) },
            None => quote! { self.decode_layer() },
        }
    }
}

/// The parts of a plain attention kind's struct and load that depend on
/// where its K/V come from: its own projections, or a donor layer's.
struct KvParts {
    /// The struct's K/V fields.
    field: TokenStream,
    /// `load`'s extra parameter (the donor of a reading layer).
    load_param: Option<TokenStream>,
    /// `load`'s initializers of the K/V fields.
    load: TokenStream,
    /// Biases onto the loaded projections.
    bias_load: Option<TokenStream>,
    /// Q/K/V stacked for the decode step, the K/V pretransposed.
    prepare: Option<TokenStream>,
}

impl KvParts {
    /// `own`: the kind's values when it computes its own K/V.
    fn of(a: &Attention, own: Option<&TokenStream>, qk: &TokenStream) -> Self {
        // Biases go onto the loaded projections (before Q/K/V are stacked: a
        // biased layer keeps them separate).
        let bias_load = match a.bias {
            ProjectionBias::None => None,
            ProjectionBias::QueryKeyValue => Some(match own {
                Some(_) => quote! {
                    b::load_biases(w, i, b::ProjectionBias::QueryKeyValue, &mut layer.attn, Some(&mut layer.kv), Self::SHAPE);
                },
                None => quote! {
                    b::load_biases(w, i, b::ProjectionBias::QueryKeyValue, &mut layer.attn, None, Self::SHAPE);
                },
            }),
            ProjectionBias::QueryKeyValueOutput => Some(match own {
                Some(_) => quote! {
                    b::load_biases(w, i, b::ProjectionBias::QueryKeyValueOutput, &mut layer.attn, Some(&mut layer.kv), Self::SHAPE);
                },
                None => quote! {
                    b::load_biases(w, i, b::ProjectionBias::QueryKeyValueOutput, &mut layer.attn, None, Self::SHAPE);
                },
            }),
        };
        match own {
            Some(v) => KvParts {
                field: quote! { kv: b::KvWeights, qkv: Option<decode::FusedQkv>, },
                load_param: None,
                load: quote! { kv: b::load_kv(w, i, HIDDEN, Self::SHAPE, #qk, #v), qkv: None, },
                bias_load,
                prepare: Some(quote! {
                    layer.qkv = decode::FusedQkv::new(&mut layer.attn, &mut layer.kv, Self::SHAPE);
                    w.release(&format!("layers.{i}."));
                    layer.kv.pretranspose();
                }),
            },
            None => KvParts {
                // The layer whose K/V it reads (a per-layer fact: `LAYOUT` gives it).
                field: quote! { donor: usize, },
                load_param: Some(quote! { , donor: usize }),
                load: quote! { donor, },
                bias_load,
                prepare: None,
            },
        }
    }
}

/// The parts of a plain attention kind's forwards that depend on where its
/// K/V come from.
struct KvForward {
    /// `forward`'s cache (or donor K/V) parameter.
    kv_param: TokenStream,
    /// The attention block of `forward`.
    attn: TokenStream,
    /// A one-token step through the compiled decode blocks.
    decode_step: TokenStream,
    /// What the forwards return, and how.
    ret_ty: TokenStream,
    ret: TokenStream,
    /// `forward_batch`'s cache parameter and attention block.
    batch_kv_param: TokenStream,
    batch_attn: TokenStream,
}

impl KvForward {
    fn of(owns_kv: bool, decode_layer_call: &TokenStream) -> Self {
        if owns_kv {
            KvForward {
                kv_param: quote! { cache: &mut LayerCache },
                attn: quote! {
                    let (a, kv) = b::attention_own_kv(&x, b::OwnQkv::separate(&self.attn, &self.kv), Self::SHAPE, at.rope, cache, at.mask)?;
                },
                decode_step: quote! {
                    let kv = decode::KvSource::own(&self.kv, self.qkv.as_ref(), cache);
                    return decode::step(h, &#decode_layer_call, kv, tables, at.mask);
                },
                ret_ty: quote! { (Array, b::SharedKv) },
                ret: quote! { Ok((h, kv)) },
                // The batched forward's cache argument and mixer (`batch_blocks`).
                batch_kv_param: quote! { cache: &mut BatchLayerCache },
                batch_attn: quote! {
                    let (a, kv) = batch_blocks::attention_own_kv(&x, &self.attn, &self.kv, Self::SHAPE, at.rope, cache, at.mask)?;
                },
            }
        } else {
            let kv_param = quote! { shared: &b::SharedKv };
            let attn = quote! {
                let a = b::attention_shared_kv(&x, &self.attn, Self::SHAPE, at.rope, shared, at.mask)?;
            };
            KvForward {
                decode_step: quote! {
                    let kv = decode::KvSource::Shared(shared);
                    return decode::step(h, &#decode_layer_call, kv, tables, at.mask).map(|(h, _)| h);
                },
                ret_ty: quote! { Array },
                ret: quote! { Ok(h) },
                // A layer reading a donor's K/V attends as in one sequence
                // when batched too, the donor's K/V carrying the rows' offsets.
                batch_kv_param: kv_param.clone(),
                batch_attn: attn.clone(),
                kv_param,
                attn,
            }
        }
    }
}

/// A plain attention layer kind (separate q/k/v projections, no output
/// gate, its norm before the mixer): the kind whose one-token steps run
/// through the compiled decode blocks.
struct PlainAttentionKind<'a> {
    kind: &'a LayerKind,
    name: Ident,
    shape: TokenStream,
    qk: TokenStream,
    ffn: FfnLoad,
    extras: LayerExtras,
    kv: KvParts,
    forward: KvForward,
}

impl<'a> PlainAttentionKind<'a> {
    fn of(kind: &'a LayerKind, a: &Attention) -> Result<Self, String> {
        let l = &kind.key.0;
        let shape = shape_tokens(a)?;
        let qk = qk_tokens(a);
        let own = match a.kv {
            KvSource::Own { values, .. } => Some(match values {
                Values::Projected => quote! { b::Values::Projected },
                Values::SameAsKeys => quote! { b::Values::SameAsKeys },
            }),
            KvSource::Shared { .. } => None,
        };
        match l.ffn {
            FeedForward::Mlp(_)
            | FeedForward::MlpAndMoe { .. }
            | FeedForward::Moe(_)
            | FeedForward::MoeAndSharedExperts { .. }
            | FeedForward::BiasedExperts(_) => {}
            FeedForward::MoeAndSharedExpert { .. } => {
                return Err(format!(
                    "layer kind {}: routed experts with a shared expert run only beside a Gated DeltaNet or gated attention",
                    kind.name
                ))
            }
        }
        let ffn = feed_forward_load(l, &kind.name)?;
        let extras = LayerExtras::of(kind)?;
        let kv = KvParts::of(a, own.as_ref(), &qk);
        let forward = KvForward::of(own.is_some(), &extras.decode_layer_call());
        Ok(PlainAttentionKind {
            kind,
            name: ident(&kind.name),
            shape,
            qk,
            ffn,
            extras,
            kv,
            forward,
        })
    }

    /// The kind's struct and impl.
    fn tokens(&self) -> TokenStream {
        let name = &self.name;
        let doc = kind_doc(&self.kind.key.0, &self.kind.layers);
        let (kv_field, extra_fields) = (&self.kv.field, self.extras.fields());
        let shape = &self.shape;
        let load = self.load();
        let decode_layer = self.decode_layer();
        let forwards = self.forwards();
        let finish = finish_tokens(
            self.extras.ple_param(),
            self.extras.residual_form(),
            self.extras.layer_end(),
        );
        quote! {
            #[doc = #doc]
            struct #name {
                norms: b::LayerNorms,
                attn: b::AttentionWeights,
                #kv_field
                ffn: FeedForward,
                #extra_fields
            }

            impl #name {
                const SHAPE: AttentionShape = #shape;

                #load

                #decode_layer

                #forwards

                #finish
            }
        }
    }

    /// `load`: the weights, then each pretransposed for the steps.
    fn load(&self) -> TokenStream {
        let l = &self.kind.key.0;
        let norms_load = norms_load_tokens(l);
        let qk = &self.qk;
        let FfnLoad {
            load: ffn_load,
            signature,
        } = &self.ffn;
        let KvParts {
            load_param,
            load: kv_load,
            bias_load,
            prepare,
            ..
        } = &self.kv;
        let extra_loads = self.extras.loads();
        let ple_pre = self.extras.ple_pretranspose();
        quote! {
            fn load(#signature #load_param) -> Self {
                let mut layer = Self {
                    norms: #norms_load,
                    attn: b::load_attention(w, i, HIDDEN, Self::SHAPE, #qk),
                    #kv_load
                    #ffn_load
                    #extra_loads
                };
                #bias_load
                #prepare
                layer.attn.pretranspose();
                layer.ffn.pretranspose();
                #ple_pre
                layer
            }
        }
    }

    /// `decode_layer`: the layer as a compiled decode step reads it.
    fn decode_layer(&self) -> TokenStream {
        let sig = self.extras.decode_layer_sig();
        let residual = self.extras.residual_form();
        let ple = self.extras.ple_use();
        let scalar = self.extras.scalar_ref();
        quote! {
            /// The layer as a compiled decode step reads it (`decode::step`).
            #sig {
                decode::Layer {
                    norms: &self.norms,
                    attn: &self.attn,
                    ffn: &self.ffn,
                    residual: #residual,
                    ple: #ple,
                    layer_scalar: #scalar,
                    shape: Self::SHAPE,
                    eps: EPS,
                }
            }
        }
    }

    /// `forward` (its lines in the layer's composition) and `forward_batch`.
    fn forwards(&self) -> TokenStream {
        let KvForward {
            kv_param,
            attn,
            decode_step,
            ret_ty,
            ret,
            batch_kv_param,
            batch_attn,
        } = &self.forward;
        let ple_param = self.extras.ple_param();
        let ple_pass = self.extras.ple_pass();
        let body = Composition::of(&self.kind.key.0).forward_body(ForwardLines {
            decode: Some(quote! {
                if let Some(tables) = at.tables {
                    #decode_step
                }
            }),
            mixer: attn.clone(),
            finish: quote! {
                let h = self.finish(h, a #ple_pass)?;
                #ret
            },
        });
        quote! {
            fn forward(&self, h: &Array, at: &WindowStep, #kv_param #ple_param) -> Result<#ret_ty> {
                #body
            }

            /// B sequences in one forward (mlx-lm's `BatchGenerator`); a step of
            /// one token per row takes one sequence's compiled blocks, B rows at once.
            fn forward_batch(&self, h: &Array, at: &WindowStep, #batch_kv_param #ple_param) -> Result<#ret_ty> {
                if let Some(tables) = at.tables {
                    #decode_step
                }
                let x = rms_norm(h, Some(self.norms.input()), EPS)?;
                #batch_attn
                let h = self.finish(h, a #ple_pass)?;
                #ret
            }
        }
    }
}

/// A post-norm attention layer kind (olmo2's `TransformerBlock`): the mixer
/// reads the residual stream itself, its output and the MLP's are normed
/// before they join it. Prefill and one-token steps run the eager blocks.
fn post_norm_kind_tokens(kind: &LayerKind, a: &Attention) -> Result<TokenStream, String> {
    let l = &kind.key.0;
    let unsupported = |what: &str| {
        Err(format!(
            "layer kind {}: {what} in a post-norm layer is not emitted yet (no family has both)",
            kind.name
        ))
    };
    let values = match a.kv {
        KvSource::Own { values, .. } => match values {
            Values::Projected => quote! { b::Values::Projected },
            Values::SameAsKeys => quote! { b::Values::SameAsKeys },
        },
        KvSource::Shared { .. } => return unsupported("K/V read from a donor layer"),
    };
    let act = match l.ffn {
        FeedForward::Mlp(m) => activation_tokens(m.activation),
        FeedForward::MlpAndMoe { .. }
        | FeedForward::Moe(_)
        | FeedForward::MoeAndSharedExpert { .. }
        | FeedForward::MoeAndSharedExperts { .. }
        | FeedForward::BiasedExperts(_) => return unsupported("routed experts"),
    };
    match (l.input, l.scalar, l.residual, a.bias) {
        (LayerInput::None, LayerScalar::None, Residual::Plain, ProjectionBias::None) => {}
        (LayerInput::Gated { .. }, ..) => return unsupported("a per-layer input gate"),
        (_, LayerScalar::Learned, ..) => return unsupported("a layer scalar"),
        (
            _,
            _,
            Residual::DepthScaled { .. } | Residual::Scaled { .. } | Residual::ClippedInFloat16,
            _,
        ) => return unsupported("scaled or clipped residual branches"),
        (.., ProjectionBias::QueryKeyValue | ProjectionBias::QueryKeyValueOutput) => {
            return unsupported("a projection bias")
        }
    }
    let name = ident(&kind.name);
    let doc = kind_doc(l, &kind.layers);
    let shape = shape_tokens(a)?;
    let norms_load = norms_load_tokens(l);
    let qk = qk_tokens(a);
    // A post-norm layer has no input norm: its attention reads `h`.
    let body = Composition::of(l).forward_body(ForwardLines {
        decode: None,
        mixer: quote! {
            let (a, kv) = b::attention_own_kv(h, b::OwnQkv::separate(&self.attn, &self.kv), Self::SHAPE, at.rope, cache, at.mask)?;
        },
        finish: quote! { Ok((self.finish(h, a)?, kv)) },
    });
    Ok(quote! {
        #[doc = #doc]
        struct #name {
            norms: b::PostNorms,
            attn: b::AttentionWeights,
            kv: b::KvWeights,
            mlp: b::Mlp,
        }

        impl #name {
            const SHAPE: AttentionShape = #shape;

            fn load(w: &mut Weights, i: usize, mlp_width: i32) -> Self {
                let mut layer = Self {
                    norms: #norms_load,
                    attn: b::load_attention(w, i, HIDDEN, Self::SHAPE, #qk),
                    kv: b::load_kv(w, i, HIDDEN, Self::SHAPE, #qk, #values),
                    mlp: b::load_mlp(w, i, HIDDEN, mlp_width, #act),
                };
                w.release(&format!("layers.{i}."));
                layer.kv.pretranspose();
                layer.attn.pretranspose();
                layer.mlp.pretranspose();
                layer
            }

            /// `h = x + post_attention_layernorm(self_attn(x))`, then
            /// `out = h + post_feedforward_layernorm(mlp(h))`.
            fn forward(&self, h: &Array, at: &WindowStep, cache: &mut LayerCache) -> Result<(Array, b::SharedKv)> {
                #body
            }

            /// B sequences in one forward (mlx-lm's `BatchGenerator`): RoPE
            /// at each row's offset, a merged K/V cache.
            fn forward_batch(&self, h: &Array, at: &WindowStep, cache: &mut BatchLayerCache) -> Result<(Array, b::SharedKv)> {
                let (a, kv) = batch_blocks::attention_own_kv(h, &self.attn, &self.kv, Self::SHAPE, at.rope, cache, at.mask)?;
                Ok((self.finish(h, a)?, kv))
            }

            /// The layer after its mixer's output `a`, batched or not.
            fn finish(&self, h: &Array, a: Array) -> Result<Array> {
                let h = b::post_norm_attention_residual(h, &a, &self.norms, EPS)?;
                b::post_norm_feed_forward(&h, &self.norms, &self.mlp, EPS)
            }
        }
    })
}

/// The numbers of a RoPE kind as literals, in plan's order
/// ([`rope_parameters`]): f32 or f64 as the plan keeps each.
fn rope_literals(kind: RopeKind) -> Vec<Literal> {
    rope_parameters(kind)
        .numbers
        .into_iter()
        .map(|(_, n)| match n {
            RopeNumber::F32(v) => lit_f32(v),
            RopeNumber::F64(v) => Literal::f64_suffixed(v),
        })
        .collect()
}

fn rope_init(rope: RopeForm, head_dim: usize) -> Result<TokenStream, String> {
    let hd = lit_i32(head_dim)?;
    Ok(match rope.kind {
        RopeKind::Default { theta } => {
            // `nn.RoPE(dims)`: a partial RoPE rotates fewer dims than head_dim.
            let dims = lit_i32(rope.rotated_dims)?;
            let theta = lit_f32(theta);
            quote! { Rope::base(#dims, #theta) }
        }
        RopeKind::Linear { theta, factor } => {
            // `nn.RoPE(dims, base=theta, scale=1 / factor)`: the Python division in f64.
            let dims = lit_i32(rope.rotated_dims)?;
            let (theta, scale) = (lit_f32(theta), lit_f32((1.0 / factor) as f32));
            quote! { Rope::base_scaled(#dims, #theta, #scale) }
        }
        RopeKind::Proportional { theta, factor, .. } => {
            let (theta, factor) = (lit_f32(theta), lit_f32(factor));
            let rotated = lit_i32(rope.rotated_dims)?;
            quote! { Rope::proportional(#hd, #rotated, #theta, #factor).map_err(|e| ModelError(e.to_string()))? }
        }
        RopeKind::Llama3 { .. } => {
            // `Rope::llama3` takes θ and the scaling in plan's order.
            let numbers = rope_literals(rope.kind);
            quote! {
                Rope::llama3(#hd, #(#numbers),*)
                    .map_err(|e| ModelError(e.to_string()))?
            }
        }
        RopeKind::Yarn { .. } => {
            // `YarnRoPE(dims, traditional, base, scaling_factor, ...)`: θ and
            // the scaling (the Python floats `initialize_rope` passes) in
            // plan's order.
            let dims = lit_i32(rope.rotated_dims)?;
            let [theta, factor, original, beta_fast, beta_slow, mscale, mscale_all_dim] =
                <[Literal; 7]>::try_from(rope_literals(rope.kind))
                    .map_err(|n| format!("YaRN RoPE with {} numbers, not 7", n.len()))?;
            let pairs = if rope.traditional {
                quote! { archgen_runtime::rope::Pairs::Interleaved }
            } else {
                quote! { archgen_runtime::rope::Pairs::Halves }
            };
            quote! {
                Rope::yarn(
                    #dims,
                    #theta,
                    archgen_runtime::rope::YarnScaling {
                        factor: #factor,
                        original_max_position_embeddings: #original,
                        beta_fast: #beta_fast,
                        beta_slow: #beta_slow,
                        mscale: #mscale,
                        mscale_all_dim: #mscale_all_dim,
                    },
                    #pairs,
                )
                .map_err(|e| ModelError(e.to_string()))?
            }
        }
        RopeKind::NoPe => quote! { Rope::NoPe },
    })
}

/// A model's batched forward: the imports it needs and `impl BatchLm`.
struct Batched {
    imports: TokenStream,
    item: TokenStream,
}

/// Which batched caches the model's layers make.
struct BatchCacheKinds {
    full: bool,
    sliding: bool,
    delta_net: bool,
    short_conv: bool,
    quantized: bool,
    mixed: bool,
}

impl BatchCacheKinds {
    fn of(ir: &ModelIr) -> Self {
        let mut kinds = BatchCacheKinds {
            full: false,
            sliding: false,
            delta_net: false,
            short_conv: false,
            quantized: false,
            mixed: false,
        };
        for l in &ir.layers {
            match &l.mixer {
                Mixer::GatedDeltaNet(_) => kinds.delta_net = true,
                Mixer::ShortConv(_) => kinds.short_conv = true,
                Mixer::LatentAttention(_) => kinds.full = true,
                Mixer::Attention(a) => match (a.kv, a.window) {
                    (KvSource::Own { .. }, Window::Sliding(_)) => kinds.sliding = true,
                    (
                        KvSource::Own {
                            cache: KvCache::Quantized(_),
                            ..
                        },
                        Window::Full,
                    ) => kinds.quantized = true,
                    (
                        KvSource::Own {
                            cache: KvCache::QuantizedAfterForward { .. },
                            ..
                        },
                        Window::Full,
                    ) => kinds.mixed = true,
                    (
                        KvSource::Own {
                            cache: KvCache::Plain,
                            ..
                        },
                        Window::Full,
                    ) => kinds.full = true,
                    (KvSource::Shared { .. }, _) => {}
                },
            }
        }
        kinds
    }

    /// The batched forward's imports: the batch caches, the batched blocks,
    /// and the batched quantized and Gated DeltaNet pieces where used.
    fn imports(&self) -> TokenStream {
        let cache_imports = [
            self.full.then(|| quote! { BatchKvCache }),
            self.sliding.then(|| quote! { BatchRotatingKvCache }),
        ]
        .into_iter()
        .flatten();
        let quantized_caches = [
            self.quantized.then(|| quote! { BatchQuantizedKvCache }),
            self.mixed.then(|| quote! { BatchMixedKvCache }),
        ]
        .into_iter()
        .flatten();
        let quantized_import = (self.quantized || self.mixed).then(|| {
            quote! { use archgen_runtime::batch_quant::{#(#quantized_caches,)* KvQuantization}; }
        });
        let arrays_import = match (self.delta_net, self.short_conv) {
            (true, _) => Some(
                quote! { use archgen_runtime::batch_deltanet::{gated_delta_net_batch, BatchArraysCache}; },
            ),
            (false, true) => {
                Some(quote! { use archgen_runtime::batch_deltanet::BatchArraysCache; })
            }
            (false, false) => None,
        };
        quote! {
            use archgen_runtime::batch::{BatchCache, BatchLayerCache, BatchLm, #(#cache_imports),*};
            use archgen_runtime::batch_blocks;
            #quantized_import
            #arrays_import
        }
    }
}

/// The batched forward's masks and step contexts, before its layers.
struct BatchWindows {
    /// One mask per window.
    masks: Vec<TokenStream>,
    /// One step context per window and rotation.
    steps_ctx: Vec<TokenStream>,
    /// The contexts' names, in order.
    contexts: Vec<String>,
}

impl BatchWindows {
    // One mask per window from its first layer's cache; one step context
    // per window and rotation. When some plain attention layer has the
    // compiled decode blocks, a step of one token per row takes them as one
    // sequence's step does (RoPE tables at the rows' offsets, read from the
    // window's first cache as its mask is; rows [B, hidden] when every layer
    // has them); otherwise no tables.
    fn of(plan: &Plan) -> Result<Self, String> {
        let ir = &plan.ir;
        let compiled = step_tables(ir);
        let mut windows_setup = BatchWindows {
            masks: Vec::new(),
            steps_ctx: Vec::new(),
            contexts: Vec::new(),
        };
        for w in windows(ir) {
            let wn = window_name(ir, w);
            let mask = ident(&format!("{wn}_mask"));
            let first = first_layer(plan, w)?.layer;
            let size = lit_i32(match w {
                Window::Full => 0,
                Window::Sliding(n) => n,
            })?;
            windows_setup.masks.push(
                quote! { let #mask = batch_blocks::window_mask(cache.layer(#first)?, n, #size)?; },
            );
            for a in ir.layers.iter().filter_map(Layer::attention) {
                let cn = rope_context(ir, a);
                if a.window != w || windows_setup.contexts.contains(&cn) {
                    continue;
                }
                windows_setup
                    .steps_ctx
                    .push(batch_step_context(compiled, &cn, &first, &mask));
                windows_setup.contexts.push(cn);
            }
        }
        Ok(windows_setup)
    }
}

/// One window and rotation's `WindowStep` in `forward_batch`: with RoPE
/// tables at the rows' offsets (from the window's first cache `first`)
/// when the model runs the compiled decode blocks.
fn batch_step_context(compiled: bool, cn: &str, first: &TokenStream, mask: &Ident) -> TokenStream {
    let (rope, ctx) = (ident(&format!("rope_{cn}")), ident(cn));
    if compiled {
        let tables = ident(&format!("{cn}_tables"));
        quote! {
            let #tables = batch_blocks::step_tables(&self.#rope, cache.layer(#first)?, n, h.dtype())?;
            let #ctx = WindowStep::new(&self.#rope, #tables.as_ref(), &#mask);
        }
    } else {
        quote! {
            let #ctx = WindowStep::new(&self.#rope, None, &#mask);
        }
    }
}

/// `impl BatchLm for Model`, as mlx-lm runs the model under
/// `BatchGenerator`: a merged cache per layer that owns K/V (full or
/// sliding) or a Gated DeltaNet state, none for layers reading a donor's
/// K/V; one mask per window from its first layer's cache before any update;
/// each layer's `forward_batch` (input norm, batched mixer, the kind's
/// `finish`); a quantized K/V cache batches as archgen's batched
/// `QuantizedKVCache`, mlx-optiq's mixed KV as its batched mixed cache
/// (`batch_quant`).
fn batch_tokens(
    plan: &Plan,
    layout: &Layout,
    embed: &TokenStream,
    ple_inputs: Option<&TokenStream>,
    logits: &TokenStream,
) -> Result<Batched, String> {
    let ir = &plan.ir;
    let caches = BatchCacheKinds::of(ir);
    let BatchWindows {
        masks,
        steps_ctx,
        contexts,
    } = BatchWindows::of(plan)?;
    let ssm_mask = (caches.delta_net || caches.short_conv)
        .then(|| quote! { let ssm_mask = cache.ssm_mask(n)?; });
    let n_line = (!latent_only(ir)).then(|| quote! { let n = ids.shape()[1]; });
    // The compiled blocks take rows [B, hidden]; a step has tables in
    // every window or in none (all from `step_tables` on the same `n`).
    let (rows_begin, rows_end) = match (compiled_decode(ir), contexts.first()) {
        (true, Some(cn)) => {
            let tables = ident(&format!("{cn}_tables"));
            (
                quote! {
                    let step = #tables.is_some();
                    h = if step { h.reshape(&[-1, HIDDEN])? } else { h };
                },
                quote! { if step { logits.reshape(&[-1, 1, VOCAB]) } else { Ok(logits) } },
            )
        }
        (true, None) | (false, _) => (quote! {}, quote! { Ok(logits) }),
    };
    let batch_caches = &layout.batch_caches;
    let batch_loop = &layout.forward_batch;
    Ok(Batched {
        imports: caches.imports(),
        item: quote! {
            impl BatchLm for Model {
                fn vocab_size(&self) -> i32 {
                    VOCAB
                }

                fn make_batch_cache(&self, n: usize) -> Result<BatchCache> {
                    let no_padding = vec![0; n];
                    Ok(BatchCache { layers: #batch_caches })
                }

                fn forward_batch(&self, ids: &Array, cache: &mut BatchCache) -> Result<Array> {
                    cache.check_layers(LAYERS)?;
                    #n_line
                    let mut h = #embed;
                    #ple_inputs
                    #(#masks)*
                    #ssm_mask
                    #(#steps_ctx)*
                    #rows_begin
                    #batch_loop
                    let logits = #logits;
                    #rows_end
                }
            }
        },
    })
}

/// The model's constants: its identity, then the shapes every block reads.
fn constants_tokens(plan: &Plan) -> Result<TokenStream, String> {
    let ir = &plan.ir;
    let (name, fingerprint, spec_hash) = (&plan.name, &plan.fingerprint, &plan.spec_hash);
    let hidden = lit_i32(ir.hidden_size)?;
    let vocab = lit_i32(ir.vocab_size)?;
    let n_layers = Literal::usize_unsuffixed(ir.layers.len());
    let eps = lit_f32(ir.norm_eps);
    let firsts = windows(ir)
        .into_iter()
        .map(|w| first_layer(plan, w).map(|f| f.consts))
        .collect::<Result<Vec<_>, _>>()?;
    let softcap = logit_softcap_const(ir);
    Ok(quote! {
        pub const NAME: &str = #name;
        pub const FINGERPRINT: &str = #fingerprint;
        pub const SPEC_SHA256: &str = #spec_hash;

        const HIDDEN: i32 = #hidden;
        const VOCAB: i32 = #vocab;
        const LAYERS: usize = #n_layers;
        const EPS: f32 = #eps;
        #(#firsts)*
        #softcap
    })
}

/// The first layer of a window, whose cache its mask (and a batched
/// step's RoPE offsets) are read from, as the forwards name it.
struct FirstLayer {
    /// Its index: `FIRST_<WINDOW>_LAYER`, or `0`.
    layer: TokenStream,
    /// Its cache's position among the K/V caches: `FIRST_<WINDOW>_KV`,
    /// `FIRST_<WINDOW>_LAYER` where the two agree, or `0`.
    kv: TokenStream,
    /// The constants naming what is not 0, each with its doc.
    consts: TokenStream,
}

/// Window `w`'s first layer: a constant names its index, and its cache's
/// position among the K/V caches where that differs, so that no forward
/// reads a bare cache number (layer 0 and the first K/V cache need none).
fn first_layer(plan: &Plan, w: Window) -> Result<FirstLayer, String> {
    let ir = &plan.ir;
    let first = ir
        .layers
        .iter()
        .find(|l| l.attention().is_some_and(|a| a.window == w))
        .map(|l| l.index)
        .ok_or_else(|| format!("{}: window {w:?} has no layer", plan.name))?;
    let kv = crate::layout::kv_ordinal(plan, first);
    let upper = window_name(ir, w).to_uppercase();
    let (layer_name, kv_name) = (
        ident(&format!("FIRST_{upper}_LAYER")),
        ident(&format!("FIRST_{upper}_KV")),
    );
    let words = window_words(w);
    let layer_doc = format!(
        " Layer {first}, the first with {words}: the window's mask is built from its cache."
    );
    let kv_doc = format!(
        " The position of layer {first}'s cache among the K/V caches (one per layer that computes its own K/V)."
    );
    let (layer_lit, kv_lit) = (
        Literal::usize_unsuffixed(first),
        Literal::usize_unsuffixed(kv),
    );
    let layer_const = quote! { #[doc = #layer_doc] const #layer_name: usize = #layer_lit; };
    let kv_const = quote! { #[doc = #kv_doc] const #kv_name: usize = #kv_lit; };
    Ok(match (first, kv) {
        (0, 0) => FirstLayer {
            layer: quote! { 0 },
            kv: quote! { 0 },
            consts: TokenStream::new(),
        },
        (_, 0) => FirstLayer {
            layer: quote! { #layer_name },
            kv: quote! { 0 },
            consts: layer_const,
        },
        (_, _) if first == kv => FirstLayer {
            layer: quote! { #layer_name },
            kv: quote! { #layer_name },
            consts: layer_const,
        },
        (_, _) => FirstLayer {
            layer: quote! { #layer_name },
            kv: quote! { #kv_name },
            consts: quote! { #layer_const #kv_const },
        },
    })
}

/// `LOGIT_SOFTCAP`, the cap of the final logits' softcap, where the model
/// has one (in the type its call takes).
fn logit_softcap_const(ir: &ModelIr) -> Option<TokenStream> {
    let Softcap { cap, form } = ir.head.logit_softcap?;
    let doc = " The final logits' softcap, `tanh(logits / cap) * cap` (`final_logit_softcapping`).";
    Some(match form {
        SoftcapForm::Compiled => {
            let c = lit_f32(cap);
            quote! { #[doc = #doc] const LOGIT_SOFTCAP: f32 = #c; }
        }
        SoftcapForm::Eager => {
            let c = Literal::f64_suffixed(f64::from(cap));
            quote! { #[doc = #doc] const LOGIT_SOFTCAP: f64 = #c; }
        }
    })
}

/// A window's attention layers as its masks and RoPEs read them.
struct WindowRopes<'a> {
    /// The window's first attention layer: its mask reads this layer's cache.
    first: usize,
    first_attention: &'a Attention,
    /// One per rotation: its context's name, the first layer with it and
    /// that layer's attention.
    contexts: Vec<(String, usize, &'a Attention)>,
}

/// The RoPE contexts of window `w`, each rotation once.
fn window_ropes(plan: &Plan, w: Window) -> Result<WindowRopes<'_>, String> {
    let (ir, name) = (&plan.ir, &plan.name);
    let in_window = || {
        ir.layers
            .iter()
            .filter_map(|l| l.attention().map(|a| (l.index, a)))
            .filter(move |(_, a)| a.window == w)
    };
    let (first, a) = in_window()
        .next()
        .ok_or_else(|| format!("{name}: window {w:?} has no layer"))?;
    let mut contexts: Vec<(String, usize, &Attention)> = Vec::new();
    for (i, b) in in_window() {
        let cn = rope_context(ir, b);
        match contexts.iter().find(|(n, _, _)| *n == cn) {
            Some((_, j, a)) if (a.rope, a.head_dim) != (b.rope, b.head_dim) => {
                return Err(format!(
                    "{name}: layers {j} and {i} share a window but not a RoPE; the emitter keeps one RoPE per window"
                ));
            }
            Some(_) => {}
            None => contexts.push((cn, i, b)),
        }
    }
    Ok(WindowRopes {
        first,
        first_attention: a,
        contexts,
    })
}

/// The model's windows and RoPEs as the unbatched forward reads them.
struct WindowSetup {
    /// The model's RoPE fields.
    ropes_struct: Vec<TokenStream>,
    /// `load`'s RoPE initializers.
    ropes_init: Vec<TokenStream>,
    /// `forward_to`'s masks, one per window.
    masks: Vec<TokenStream>,
    /// `forward_to`'s step context per window and rotation.
    steps_ctx: Vec<TokenStream>,
}

impl WindowSetup {
    // One mask per window, one RoPE per window and rotation (every rotating
    // layer of a window rotates the same way, so a step's tables are computed
    // once per window; smollm3's NoPE layers share the window's mask only).
    fn of(plan: &Plan) -> Result<Self, String> {
        let (ir, name) = (&plan.ir, &plan.name);
        let mut setup = WindowSetup {
            ropes_struct: Vec::new(),
            ropes_init: Vec::new(),
            masks: Vec::new(),
            steps_ctx: Vec::new(),
        };
        for w in windows(ir) {
            let wn = window_name(ir, w);
            let WindowRopes {
                first,
                first_attention: a,
                contexts,
            } = window_ropes(plan, w)?;
            let mask = ident(&format!("{wn}_mask"));
            // The window's mask comes from its first layer's cache, before any
            // update (`_make_masks`, `create_attention_mask(h, cache[0])`).
            if !a.owns_kv() {
                return Err(format!(
                    "{name}: layer {first}, the first of its window, has no cache to build the mask from"
                ));
            }
            let first_kv = first_layer(plan, w)?.kv;
            let size = lit_i32(match w {
                Window::Full => 0,
                Window::Sliding(n) => n,
            })?;
            let mask_line =
                quote! { let #mask = b::mask_for(kv_at(&cache.kv, #first_kv, NAME)?, n, #size)?; };
            for (cn, _, a) in &contexts {
                let rope = ident(&format!("rope_{cn}"));
                setup.ropes_struct.push(quote! { #rope: Rope, });
                let init = rope_init(a.rope, a.head_dim)?;
                setup.ropes_init.push(quote! { #rope: #init, });
                if cn == &wn {
                    setup.masks.push(mask_line.clone());
                }
                setup
                    .steps_ctx
                    .push(step_context(step_tables(ir), cn, &rope, &mask));
            }
            if !contexts.iter().any(|(cn, _, _)| cn == &wn) {
                // A window of NoPE layers only: its mask still comes first.
                setup.masks.push(mask_line);
            }
        }
        // Latent attention layers: one RoPE, held by the model (they build
        // their masks from their own caches).
        let mut latent = ir.layers.iter().filter_map(|l| match &l.mixer {
            Mixer::LatentAttention(a) => Some(a),
            Mixer::Attention(_) | Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) => None,
        });
        if let Some(first) = latent.next() {
            if latent.any(|a| a.rope != first.rope || a.qk_rope_head_dim != first.qk_rope_head_dim)
            {
                return Err(format!(
                    "{name}: latent attention layers with different RoPE"
                ));
            }
            let init = rope_init(first.rope, first.qk_rope_head_dim)?;
            setup.ropes_struct.push(quote! { latent_rope: Rope, });
            setup.ropes_init.push(quote! { latent_rope: #init, });
        }
        Ok(setup)
    }
}

/// One window and rotation's `WindowStep` in `forward_to`: with the step's
/// RoPE tables when the model runs the compiled decode blocks.
fn step_context(compiled: bool, cn: &str, rope: &Ident, mask: &Ident) -> TokenStream {
    let tables = ident(&format!("{cn}_tables"));
    let ctx = ident(cn);
    if compiled {
        quote! {
            let #tables = self.#rope.step_tables(step, offset, n, h.dtype())?;
            let #ctx = WindowStep::new(&self.#rope, #tables.as_ref(), &#mask);
        }
    } else {
        quote! {
            let #ctx = WindowStep::new(&self.#rope, None, &#mask);
        }
    }
}

/// The model's per-layer inputs (a table of per-layer embeddings and their
/// projection), when it has them.
#[derive(Default)]
struct PerLayerInputTokens {
    field: Option<TokenStream>,
    load: Option<TokenStream>,
    pretranspose: Option<TokenStream>,
    /// The forwards' computation of every layer's input from the ids.
    inputs: Option<TokenStream>,
}

impl PerLayerInputTokens {
    fn of(ir: &ModelIr) -> Result<Self, String> {
        let Some(p) = ir.embedding.per_layer_input else {
            return Ok(Self::default());
        };
        let (pw, pv) = (lit_i32(p.width)?, lit_i32(p.vocab)?);
        Ok(PerLayerInputTokens {
            field: Some(quote! { per_layer: b::PerLayerInputs, }),
            load: Some(quote! {
                per_layer: b::load_per_layer_inputs(&mut w, LAYERS as i32, #pw, #pv, HIDDEN),
            }),
            pretranspose: Some(quote! { model.per_layer.pretranspose(); }),
            inputs: Some(quote! {
                let per_layer = b::per_layer_inputs(ids, &h, &self.per_layer, LAYERS as i32, #pw, HIDDEN, EPS)?;
            }),
        })
    }
}

fn embed_scale_tokens(ir: &ModelIr) -> TokenStream {
    match ir.embedding.scale {
        EmbedScale::None => quote! { b::EmbedScale::None },
        EmbedScale::SqrtHidden => quote! { b::EmbedScale::SqrtHidden },
        EmbedScale::Constant(c) => {
            let c = Literal::f64_suffixed(c);
            quote! { b::EmbedScale::Constant(#c) }
        }
    }
}

/// The output head: the embedding read back (tied) or its own `lm_head`.
struct HeadTokens {
    field: Option<TokenStream>,
    load: Option<TokenStream>,
    pretranspose: TokenStream,
    /// The head as `b::logits` takes it.
    head: TokenStream,
    import: Option<TokenStream>,
}

impl HeadTokens {
    fn of(ir: &ModelIr) -> Self {
        match ir.head.weight {
            HeadWeight::TiedEmbedding => HeadTokens {
                field: None,
                load: None,
                pretranspose: quote! { model.embed.pretranspose(); },
                head: quote! { b::Head::Tied(&self.embed) },
                import: None,
            },
            HeadWeight::Untied => HeadTokens {
                field: Some(quote! { lm_head: Linear, }),
                load: Some(quote! { lm_head: w.linear("lm_head", VOCAB, HIDDEN), }),
                pretranspose: quote! { model.lm_head.pretranspose(); },
                head: quote! { b::Head::Untied(&self.lm_head) },
                import: Some(quote! { use archgen_runtime::layers::Linear; }),
            },
        }
    }
}

/// The logits from the last hidden state: final norm, head, then the
/// model's logit scale and softcap.
fn logits_tokens(ir: &ModelIr, head: &TokenStream) -> TokenStream {
    // The head with a scale before or after it: `logits_scaled` (models
    // without one keep the plain `logits` call they had).
    let head_call = |softcap: TokenStream| match ir.head.logit_scale {
        LogitScale::None => quote! { b::logits(&h, &self.norm, #head, #softcap, EPS)? },
        LogitScale::DivideBy(d) => {
            let d = Literal::f64_suffixed(d);
            quote! { b::logits_scaled(&h, &self.norm, #head, b::LogitScale::DivideBy(#d), #softcap, EPS)? }
        }
        LogitScale::DivideLogitsBy(d) => {
            let d = Literal::f64_suffixed(d);
            quote! { b::logits_scaled(&h, &self.norm, #head, b::LogitScale::DivideLogitsBy(#d), #softcap, EPS)? }
        }
    };
    match ir.head.logit_softcap {
        None => head_call(quote! { None }),
        // `LOGIT_SOFTCAP` (`logit_softcap_const`) holds the cap.
        Some(Softcap {
            form: SoftcapForm::Compiled,
            ..
        }) => head_call(quote! { Some(LOGIT_SOFTCAP) }),
        Some(Softcap {
            form: SoftcapForm::Eager,
            ..
        }) => {
            let logits = head_call(quote! { None });
            quote! { archgen_runtime::ops::softcap_eager(&#logits, LOGIT_SOFTCAP)? }
        }
    }
}

fn final_norm_load(ir: &ModelIr) -> TokenStream {
    match ir.head.norm {
        NormWeight::Direct => quote! { w.param("norm.weight", &[HIDDEN]) },
        NormWeight::OnePlus => {
            quote! { b::load_norm_weight(&mut w, "norm.weight", HIDDEN, b::NormWeight::OnePlus) }
        }
    }
}

/// The caches of one sequence the model's K/V layers use, for its
/// `use archgen_runtime::cache::{...}`.
fn cache_imports(ir: &ModelIr) -> Vec<TokenStream> {
    let caches = ir
        .layers
        .iter()
        .filter_map(Layer::attention)
        .filter_map(|a| match a.kv {
            KvSource::Own { cache, .. } => Some((a.window, cache)),
            KvSource::Shared { .. } => None,
        });
    let (mut any_sliding, mut any_plain_full, mut any_quantized) = (false, false, false);
    let mut any_mixed = false;
    for c in caches {
        match c {
            (Window::Sliding(_), _) => any_sliding = true,
            (Window::Full, KvCache::Plain) => any_plain_full = true,
            (Window::Full, KvCache::Quantized(_)) => any_quantized = true,
            (Window::Full, KvCache::QuantizedAfterForward { .. }) => any_mixed = true,
        }
    }
    [
        (any_plain_full || any_latent_attention(ir)).then(|| quote! { KvCache }),
        any_mixed.then(|| quote! { MixedKvCache }),
        any_quantized.then(|| quote! { QuantizedKvCache }),
        any_sliding.then(|| quote! { RotatingKvCache }),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Whether some layer runs a `deltanet` block (a Gated DeltaNet, or gated
/// attention).
fn hybrid(ir: &ModelIr) -> bool {
    ir.layers.iter().any(|l| match &l.mixer {
        Mixer::Attention(a) => match a.output_gate {
            OutputGate::None => false,
            OutputGate::SigmoidPerHead => true,
        },
        Mixer::GatedDeltaNet(_) => true,
        Mixer::ShortConv(_) | Mixer::LatentAttention(_) => false,
    })
}

/// Whether every layer is a latent attention: no window masks, RoPE
/// contexts or attention shapes at the model level (each layer builds its
/// mask from its own cache and reads the model's latent RoPE).
fn latent_only(ir: &ModelIr) -> bool {
    ir.layers.iter().all(|l| match &l.mixer {
        Mixer::LatentAttention(_) => true,
        Mixer::Attention(_) | Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) => false,
    })
}

/// Whether some layer is a latent attention (it runs the `mla` blocks with
/// the model's latent RoPE).
fn any_latent_attention(ir: &ModelIr) -> bool {
    ir.layers.iter().any(|l| match &l.mixer {
        Mixer::LatentAttention(_) => true,
        Mixer::Attention(_) | Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) => false,
    })
}

/// Whether some layer is a short conv (it keeps its state in a
/// `deltanet::ArraysCache` and runs the `short_conv` blocks).
fn any_short_conv(ir: &ModelIr) -> bool {
    ir.layers.iter().any(|l| match &l.mixer {
        Mixer::ShortConv(_) => true,
        Mixer::Attention(_) | Mixer::GatedDeltaNet(_) | Mixer::LatentAttention(_) => false,
    })
}

/// `forward_to` around its layers: how the embedding is bound, what runs
/// before the layers, the readout after them, and the `decode` import
/// these need.
struct StepTokens {
    decode_import: Option<TokenStream>,
    embedded: TokenStream,
    begin: TokenStream,
    end: TokenStream,
}

impl StepTokens {
    // The one-token step: through the compiled decode blocks when every
    // layer has them, else the eager blocks as in prefill.
    fn of(ir: &ModelIr, steps_ctx: &[TokenStream], logits: &TokenStream) -> Self {
        if compiled_decode(ir) {
            let tables_note = comment(
                "One token: this step's RoPE tables, one per window, shared by all its layers (Q and K alike).",
            );
            StepTokens {
                decode_import: Some(quote! { use archgen_runtime::decode; }),
                embedded: quote! { h },
                begin: quote! {
                    let offset = kv_at(&cache.kv, 0, NAME)?.offset();
                    let step = n == 1 && decode::enabled();
                    #tables_note
                    #(#steps_ctx)*
                    let mut h = if step { h.reshape(&[-1, HIDDEN])? } else { h };
                },
                end: quote! {
                    let (out, width) = match readout {
                        Readout::Logits => (#logits, VOCAB),
                        Readout::NormedHidden => (b::final_norm(&h, &self.norm, EPS)?, HIDDEN),
                    };
                    if step { out.reshape(&[-1, 1, width]) } else { Ok(out) }
                },
            }
        } else if step_tables(ir) {
            // A hybrid model: the plain attention kinds take this step's
            // tables in [B, 1, hidden], the other kinds their own blocks.
            StepTokens {
                decode_import: Some(quote! { use archgen_runtime::decode; }),
                embedded: quote! { mut h },
                begin: quote! {
                    let offset = kv_at(&cache.kv, 0, NAME)?.offset();
                    let step = n == 1 && decode::enabled();
                    #(#steps_ctx)*
                },
                end: eager_end(logits),
            }
        } else {
            // Gated DeltaNet kinds take their block for their one-token
            // steps; the other kinds run eagerly.
            let plain = ir.layers.iter().any(reaches_decode);
            StepTokens {
                decode_import: plain.then(|| quote! { use archgen_runtime::decode; }),
                embedded: quote! { mut h },
                begin: quote! { #(#steps_ctx)* },
                end: eager_end(logits),
            }
        }
    }
}

/// The readout of a forward whose hidden state kept its [B, L, hidden]
/// shape.
fn eager_end(logits: &TokenStream) -> TokenStream {
    quote! {
        match readout {
            Readout::Logits => {
                let logits = #logits;
                Ok(logits)
            }
            Readout::NormedHidden => b::final_norm(&h, &self.norm, EPS),
        }
    }
}

/// What the model-level items of the file (`Model`, `Cache`, `load`,
/// `impl CausalLm`) are made of.
struct ModelParts<'a> {
    plan: &'a Plan,
    layout: &'a Layout,
    windows: WindowSetup,
    ple: PerLayerInputTokens,
    head: HeadTokens,
    /// The embedding of the ids, as both forwards compute it.
    embed: TokenStream,
    step: StepTokens,
}

impl ModelParts<'_> {
    /// The file's imports: the runtime items the model uses.
    fn imports(&self, batch_imports: &TokenStream) -> TokenStream {
        let ir = &self.plan.ir;
        let cache_imports = cache_imports(ir);
        let decode_import = &self.step.decode_import;
        let deltanet_import = match (hybrid(ir), any_short_conv(ir)) {
            (true, _) => Some(quote! { use archgen_runtime::deltanet; }),
            (false, true) => Some(quote! { use archgen_runtime::{deltanet, short_conv}; }),
            (false, false) => None,
        };
        let feed_forward_import = ir
            .layers
            .iter()
            .any(holds_feed_forward)
            .then(|| quote! { use archgen_runtime::feed_forward::FeedForward; });
        let linear_import = &self.head.import;
        let mla_import = any_latent_attention(ir).then(|| quote! { use archgen_runtime::mla; });
        // A model of latent attention layers alone has no window masks or
        // attention shapes at the model level.
        let (blocks_import, kv_at) = match latent_only(ir) {
            true => (quote! { use archgen_runtime::blocks as b; }, None),
            false => (
                quote! { use archgen_runtime::blocks::{self as b, AttentionShape, WindowStep}; },
                Some(quote! { kv_at, }),
            ),
        };
        // `rms_norm` is the norm before the mixer, which post-norm kinds lack.
        let norm_before_mixer = ir.layers.iter().any(|l| match l.norms.arrangement {
            NormArrangement::PreNorm | NormArrangement::Sandwich => true,
            NormArrangement::PostNorm => false,
        });
        let ops_import = if norm_before_mixer {
            quote! { use archgen_runtime::ops::{rms_norm, Result}; }
        } else {
            quote! { use archgen_runtime::ops::Result; }
        };
        quote! {
            #blocks_import
            #batch_imports
            use archgen_runtime::cache::{#kv_at next_cache, LayerCache, #(#cache_imports),*};
            #decode_import
            #deltanet_import
            #feed_forward_import
            use archgen_runtime::layers::Embedding;
            #mla_import
            #linear_import
            use archgen_runtime::model::{CausalLm, ModelError, Readout};
            #ops_import
            use archgen_runtime::rope::Rope;
            use archgen_runtime::weights::Weights;
            use archgen_runtime::Array;
        }
    }

    /// `Model` and `Cache`.
    fn structs(&self) -> TokenStream {
        let ir = &self.plan.ir;
        let doc_model = format!(
            " The `{}` model: {} layers, hidden size {}.",
            self.plan.name,
            ir.layers.len(),
            ir.hidden_size
        );
        let cache_doc = if hybrid(ir) {
            " The caches of one sequence: a K/V cache per attention layer, an `ArraysCache` (conv and recurrent state) per Gated DeltaNet layer."
        } else if any_short_conv(ir) {
            " The caches of one sequence: a K/V cache per attention layer, an `ArraysCache` (conv state) per short-conv layer."
        } else {
            " The caches of one sequence: one per layer that computes its own K/V."
        };
        let ple_field = &self.ple.field;
        let ropes_struct = &self.windows.ropes_struct;
        let head_field = &self.head.field;
        let cache_fields = &self.layout.cache_fields;
        let layer_type = &self.layout.layer_type;
        quote! {
            #[doc = #doc_model]
            pub struct Model {
                embed: Embedding,
                #ple_field
                #(#ropes_struct)*
                layers: Vec<#layer_type>,
                norm: Array,
                #head_field
            }

            #[doc = #cache_doc]
            pub struct Cache {
                #cache_fields
            }
        }
    }

    /// `load`: every tensor read and checked, then pretransposed.
    fn load_fn(&self) -> TokenStream {
        let ple_load = &self.ple.load;
        let ropes_init = &self.windows.ropes_init;
        let layers_load = &self.layout.load;
        let norm_load = final_norm_load(&self.plan.ir);
        let head_load = &self.head.load;
        let head_pre = &self.head.pretranspose;
        let ple_pre = &self.ple.pretranspose;
        quote! {
            /// Loads the model from sanitized weights; every tensor is checked.
            pub fn load(mut w: Weights) -> std::result::Result<Model, ModelError> {
                let mut model = Model {
                    embed: w.embedding("embed_tokens", VOCAB, HIDDEN),
                    #ple_load
                    #(#ropes_init)*
                    #layers_load
                    norm: #norm_load,
                    #head_load
                };
                w.finish().map_err(|e| ModelError(e.to_string()))?;
                #head_pre
                #ple_pre
                Ok(model)
            }
        }
    }

    /// `impl CausalLm for Model`: its caches and its unbatched forward.
    fn causal_lm_impl(&self) -> TokenStream {
        let make_cache = &self.layout.make_cache;
        let StepTokens {
            embedded,
            begin,
            end,
            ..
        } = &self.step;
        let embed = &self.embed;
        let ple_inputs = &self.ple.inputs;
        let masks = &self.windows.masks;
        let n_line = (!latent_only(&self.plan.ir)).then(|| quote! { let n = ids.shape()[1]; });
        let layers_forward = &self.layout.forward;
        quote! {
            impl CausalLm for Model {
                type Cache = Cache;

                fn vocab_size(&self) -> i32 {
                    VOCAB
                }

                /// Its batched forward (`impl BatchLm` below).
                fn batched(&self) -> Option<&dyn BatchLm> {
                    Some(self)
                }

                fn make_cache(&self) -> Cache {
                    #make_cache
                }

                fn forward_to(&self, ids: &Array, cache: &mut Cache, readout: Readout) -> Result<Array> {
                    #n_line
                    let #embedded = #embed;
                    #ple_inputs
                    #(#masks)*
                    #begin
                    #layers_forward
                    #end
                }
            }
        }
    }
}

/// The whole model module (without the file header).
pub(crate) fn model_tokens(plan: &Plan) -> Result<TokenStream, String> {
    let ir = &plan.ir;
    let name = &plan.name;
    let constants = constants_tokens(plan)?;
    if ir.layers.is_empty() {
        return Err(format!("{name}: a model without layers"));
    }
    let windows = WindowSetup::of(plan)?;
    let kinds: Vec<TokenStream> = plan
        .kinds
        .iter()
        .map(kind_tokens)
        .collect::<Result<_, _>>()?;
    let layout = layout_tokens(plan)?;
    let latent = |l: &Layer| match &l.mixer {
        Mixer::LatentAttention(_) => true,
        Mixer::Attention(_) | Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) => false,
    };
    if !ir
        .layers
        .iter()
        .any(|l| l.attention().is_some_and(Attention::owns_kv) || latent(l))
    {
        return Err(format!("{name}: no layer owns K/V"));
    }
    let ple = PerLayerInputTokens::of(ir)?;
    let embed_scale = embed_scale_tokens(ir);
    let head = HeadTokens::of(ir);
    let logits = logits_tokens(ir, &head.head);
    let step = StepTokens::of(ir, &windows.steps_ctx, &logits);
    let embed = quote! { b::embed(&self.embed, ids, #embed_scale, HIDDEN)? };
    let Batched {
        imports: batch_imports,
        item: batch_impl,
    } = batch_tokens(plan, &layout, &embed, ple.inputs.as_ref(), &logits)?;
    let parts = ModelParts {
        plan,
        layout: &layout,
        windows,
        ple,
        head,
        embed,
        step,
    };
    let imports = parts.imports(&batch_imports);
    let layout_items = &layout.items;
    let structs = parts.structs();
    let load = parts.load_fn();
    let causal_lm = parts.causal_lm_impl();
    Ok(quote! {
        #imports

        #constants

        #(#kinds)*

        #layout_items

        #structs

        #load

        #causal_lm

        #batch_impl
    })
}
