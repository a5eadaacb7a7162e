//! What each line of a layer kind's forward is, in mlx-lm's terms: the
//! comments of the emitted forward (`x` the normed input, `a` the mixer's
//! output, `h` the residual stream), read from the layer's IR facts.

use crate::comments::comment;
use crate::words;
use archgen_ir::{
    Attention, FeedForward, KvSource, Layer, LayerInput, LayerScalar, Mixer, NormArrangement,
    NormWeight, OutputGate, ProjectionBias, QkvProjection, Residual, Scores, Values,
};
use proc_macro2::TokenStream;
use quote::quote;

/// The lines of one kind's unbatched forward that differ by kind; the
/// input norm (`x`, where the layer has one) is [`Composition::forward_body`]'s.
pub(crate) struct ForwardLines {
    /// The one-token branch through the compiled decode blocks, where the
    /// kind has one (it returns from the forward).
    pub decode: Option<TokenStream>,
    /// The mixer call, binding `a` (and `kv` where the kind yields it).
    pub mixer: TokenStream,
    /// From `finish` to the forward's value.
    pub finish: TokenStream,
}

/// The comments of one kind's forward, in the order its lines run.
pub(crate) struct Composition {
    /// Before the one-token branch: the compiled block runs the same layer.
    pub decode: TokenStream,
    /// Before the norm in front of the mixer; `None` in a post-norm layer,
    /// which has no such norm.
    pub norm: Option<TokenStream>,
    /// Before the mixer call.
    pub mixer: TokenStream,
    /// Before the `finish` call: the residual, feed-forward, residual and
    /// scalar lines that `finish` runs (batched or not).
    pub rest: TokenStream,
}

impl Composition {
    pub fn of(l: &Layer) -> Self {
        let norm = match l.norms.arrangement {
            NormArrangement::PreNorm | NormArrangement::Sandwich => Some(match l.norms.weight {
                NormWeight::Direct => comment("x = self.input_layernorm(h)"),
                NormWeight::OnePlus => {
                    comment("x = self.input_layernorm(h), its weight 1 + w folded at load")
                }
            }),
            NormArrangement::PostNorm => None,
        };
        let input = match l.norms.arrangement {
            NormArrangement::PreNorm | NormArrangement::Sandwich => "x",
            NormArrangement::PostNorm => "h",
        };
        let mixer = match &l.mixer {
            Mixer::Attention(a) => attention_line(a, input),
            Mixer::GatedDeltaNet(_) => format!(
                "a = self.linear_attn({input}, mask, cache): Gated DeltaNet (in projections, conv1d, gated delta rule, gated RMSNorm, out_proj)"
            ),
            Mixer::ShortConv(_) => format!(
                "a = self.conv({input}, mask, cache): short conv (in_proj split in B, C, x; B * x through the depthwise conv1d; out_proj(C * conv))"
            ),
            Mixer::LatentAttention(_) => format!(
                "a = self.self_attn({input}, mask, cache): latent attention (q, the normed latent and the RoPE key; pe_scores as the SDPA mask; one token absorbed through embed_q / unembed_out, more expanded)"
            ),
        };
        let mut rest = vec![comment("finish (shared with the batched forward):")];
        for line in rest_lines(l) {
            rest.push(comment(&format!("  {line}")));
        }
        Composition {
            decode: comment(
                "One token: the whole layer as one compiled decode block (the math below, bit for bit).",
            ),
            norm,
            mixer: comment(&mixer),
            rest: rest.into_iter().collect(),
        }
    }

    /// A kind's unbatched forward body, each line after the comment saying
    /// what it is: the one-token branch, the input norm, the mixer, then
    /// `finish` (residual, feed-forward, residual, scalar).
    pub fn forward_body(&self, lines: ForwardLines) -> TokenStream {
        let ForwardLines {
            decode: decode_branch,
            mixer: mixer_line,
            finish,
        } = lines;
        let Composition {
            decode,
            norm,
            mixer,
            rest,
        } = self;
        let decode = decode_branch.map(|branch| quote! { #decode #branch });
        let norm = norm.as_ref().map(|comment| {
            quote! {
                #comment
                let x = rms_norm(h, Some(self.norms.input()), EPS)?;
            }
        });
        quote! {
            #decode
            #norm
            #mixer
            #mixer_line
            #rest
            #finish
        }
    }
}

/// The mixer line of an attention layer.
fn attention_line(a: &Attention, input: &str) -> String {
    let mut steps: Vec<String> = Vec::new();
    let source = match a.kv {
        KvSource::Own { values, .. } => {
            steps.push(match (a.projection, values) {
                (QkvProjection::Fused, _) => "one qkv_proj split into q, k, v".to_string(),
                (QkvProjection::Separate, Values::Projected) => "q/k/v projections".to_string(),
                (QkvProjection::Separate, Values::SameAsKeys) => {
                    "q/k projections, values = keys (no v_proj)".to_string()
                }
            });
            "cache"
        }
        KvSource::Shared { .. } => {
            steps.push("q projection".to_string());
            "shared_kv"
        }
    };
    match a.bias {
        ProjectionBias::None => {}
        ProjectionBias::QueryKeyValue => steps.push("with bias".to_string()),
        ProjectionBias::QueryKeyValueOutput => steps.push("with bias (o_proj too)".to_string()),
    }
    steps.extend(words::qk_norm(a.qk_norm).map(String::from));
    steps.push(words::no_rope(a.rope.kind).unwrap_or("RoPE").to_string());
    steps.push(match a.kv {
        KvSource::Own { .. } => "cache update".to_string(),
        KvSource::Shared { .. } => "the keys and values its donor layer computed".to_string(),
    });
    steps.push(match a.scores {
        Scores::FusedSdpa => "scaled_dot_product_attention".to_string(),
        Scores::Softcapped { cap } => format!("scores softcapped at {cap}, softmax"),
        Scores::FusedSdpaWithSinks => "scaled_dot_product_attention with sinks".to_string(),
    });
    match a.output_gate {
        OutputGate::None => {}
        OutputGate::SigmoidPerHead => steps.push("times sigmoid(gate)".to_string()),
    }
    steps.push("o_proj".to_string());
    format!(
        "a = self.self_attn({input}, mask, {source}): {}",
        steps.join(", ")
    )
}

/// The lines `finish` runs: residual, feed-forward, residual, scalar.
fn rest_lines(l: &Layer) -> Vec<String> {
    // `h` plus a branch, in the layer's residual form.
    let add = |branch: String| match l.residual {
        Residual::Plain => format!("h = h + {branch}"),
        Residual::Scaled { .. } => format!("h = h + {branch} * residual_multiplier"),
        Residual::DepthScaled { .. } => {
            format!("h = h + {branch} * (scale_depth / sqrt(num_hidden_layers))")
        }
        Residual::ClippedInFloat16 => format!("h = clip_residual(h, {branch})"),
    };
    let ffn = "self.mlp";
    // What `self.mlp` is when it is not a dense MLP.
    let experts = match l.ffn {
        FeedForward::Mlp(_) | FeedForward::MlpAndMoe { .. } => String::new(),
        FeedForward::Moe(m) => format!(
            ", self.mlp: {} routed experts, top-{}",
            m.num_experts, m.top_k
        ),
        FeedForward::MoeAndSharedExpert { moe, .. } => format!(
            ", self.mlp: {} routed experts, top-{}, and a shared expert",
            moe.num_experts, moe.top_k
        ),
        FeedForward::MoeAndSharedExperts { moe, .. } => format!(
            ", self.mlp: {} routed experts, top-{}, and shared experts",
            moe.num_experts, moe.top_k
        ),
        FeedForward::BiasedExperts(m) => format!(
            ", self.mlp: {} routed experts with biases, top-{}, clamped SwiGLU",
            m.num_experts, m.top_k
        ),
    };
    let mut lines = Vec::new();
    match (l.norms.arrangement, l.ffn) {
        (NormArrangement::PreNorm, _) => {
            lines.push(add("a".to_string()));
            let f = add(format!("{ffn}(self.post_attention_layernorm(h))"));
            lines.push(format!("{f}{experts}"));
        }
        (NormArrangement::Sandwich, FeedForward::MlpAndMoe { .. }) => {
            lines.push(add("self.post_attention_layernorm(a)".to_string()));
            lines.push("h1 = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(h)))".to_string());
            lines.push("h2 = self.post_feedforward_layernorm_2(self.experts(self.pre_feedforward_layernorm_2(h), *self.router(h)))".to_string());
            lines.push(add("self.post_feedforward_layernorm(h1 + h2)".to_string()));
        }
        (
            NormArrangement::Sandwich,
            FeedForward::Mlp(_)
            | FeedForward::Moe(_)
            | FeedForward::MoeAndSharedExpert { .. }
            | FeedForward::MoeAndSharedExperts { .. }
            | FeedForward::BiasedExperts(_),
        ) => {
            lines.push(add("self.post_attention_layernorm(a)".to_string()));
            let f = add(format!(
                "self.post_feedforward_layernorm({ffn}(self.pre_feedforward_layernorm(h)))"
            ));
            lines.push(format!("{f}{experts}"));
        }
        (NormArrangement::PostNorm, _) => {
            lines.push(add("self.post_attention_layernorm(a)".to_string()));
            let f = add(format!("self.post_feedforward_layernorm({ffn}(h))"));
            lines.push(format!("{f}{experts}"));
        }
    }
    match l.input {
        LayerInput::None => {}
        LayerInput::Gated { .. } => lines.push(
            "h = h + self.post_per_layer_input_norm(self.per_layer_projection(gelu(self.per_layer_input_gate(h)) * per_layer_input))"
                .to_string(),
        ),
    }
    match l.scalar {
        LayerScalar::None => {}
        LayerScalar::Learned => lines.push("h = h * self.layer_scalar".to_string()),
    }
    lines
}
