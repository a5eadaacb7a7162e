//! The plan file reviewers read in a PR: the layer table, the kinds, and every
//! parameter's name, shape and dtype (the contract with the checkpoint).
//!
//! Repeats are folded so the file reads as a summary and a one-field change
//! to a spec shows as a few changed lines: consecutive layers with identical
//! rows share one row (`0-4`), and a per-layer tensor that has the same shape
//! and dtype in several layers is one row naming those layers.

use archgen_ir::GateUpProjection;
use archgen_ir::{
    Activation, Attention, AttentionScale, EmbedScale, FeedForward, GatedMlp, GatedNorm,
    HeadWeight, KvCache, KvSource, Layer, LogitScale, Mixer, NormArrangement, NormWeight, QkNorm,
    RopeForm, Router, Scores, SoftcapForm, StateCache, TopKProbs, ValueNorm, Values, Window,
};
use archgen_ir::{LatentQuery, RopeKind};
use archgen_plan::{rope_parameters, Plan, RopeParameters, GENERATOR_VERSION};
use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

const TEMPLATE: &str = include_str!("../templates/plan.md.j2");

#[derive(Serialize)]
struct Row {
    /// The layers this row stands for, as ranges (`0-4, 6`).
    index: String,
    #[serde(flatten)]
    body: RowBody,
}

/// A layer row but its index: what consecutive layers must share to fold.
#[derive(Serialize, PartialEq)]
struct RowBody {
    kind: String,
    norms: String,
    #[serde(flatten)]
    mixer: MixerCols,
    ffn: String,
}

#[derive(Serialize)]
struct KindRow {
    name: String,
    layers: String,
}

#[derive(Serialize)]
struct ParamRow {
    /// The tensor name; a per-layer tensor's layer index is written `N`.
    name: String,
    /// The layers a per-layer tensor row stands for (empty for the others).
    layers: String,
    shape: String,
    dtype: &'static str,
}

/// The RoPE column: the kind's name and its labelled numbers (plan's
/// [`rope_parameters`], the reading the fingerprint hashes).
fn rope_text(r: RopeForm) -> String {
    let RopeParameters { name, numbers } = rope_parameters(r.kind);
    let numbers: String = numbers
        .iter()
        .map(|(label, n)| format!(" {label}={n}"))
        .collect();
    match r.kind {
        RopeKind::Default { .. }
        | RopeKind::Linear { .. }
        | RopeKind::Llama3 { .. }
        | RopeKind::Yarn { .. } => {
            format!("{name}{numbers}")
        }
        RopeKind::Proportional { .. } => format!("{name}{numbers} ({} dims)", r.rotated_dims),
        RopeKind::NoPe => "none (NoPE)".to_string(),
    }
}

/// How a MoE block picks its experts.
fn router_text(router: Router) -> &'static str {
    match router {
        Router::ScaledTopKSoftmax => "scaled top-k softmax router",
        Router::SoftmaxTopK {
            probs: TopKProbs::Renormalized,
        } => "softmax then top-k, renormalized",
        Router::SoftmaxTopK {
            probs: TopKProbs::AsTaken,
        } => "softmax then top-k",
        Router::SigmoidGroupTopK(_) => "sigmoid + correction bias, group-limited top-k (noaux_tc)",
        Router::TopKPreciseSoftmax => "biased router, top-k then softmax",
    }
}

fn mlp_text(m: GatedMlp) -> String {
    let act = match m.activation {
        Activation::GeluApprox => "GeGLU",
        Activation::GeluApproxThenMultiply => "GELU*up",
        Activation::Silu => "SwiGLU",
        Activation::ClampedSwiglu => "clamped SwiGLU",
    };
    match m.projection {
        GateUpProjection::Separate => format!("{act} {}", m.width),
        GateUpProjection::Fused => format!("{act} {} (fused gate_up_proj)", m.width),
    }
}

/// The mixer's columns of a layer row: (window, K/V, heads, head dim,
/// q/k/v norm, rope, scale, KV quant).
#[derive(Serialize, PartialEq)]
struct MixerCols {
    window: String,
    kv: String,
    heads: String,
    head_dim: String,
    qkv_norm: String,
    rope: String,
    scale: String,
    kv_quant: String,
}

fn row(plan: &Plan, l: &Layer) -> RowBody {
    let norms = match (l.norms.arrangement, l.norms.weight) {
        (NormArrangement::PreNorm, NormWeight::Direct) => "pre",
        (NormArrangement::Sandwich, NormWeight::Direct) => "sandwich",
        (NormArrangement::PreNorm, NormWeight::OnePlus) => "pre (1 + w)",
        (NormArrangement::Sandwich, NormWeight::OnePlus) => "sandwich (1 + w)",
        (NormArrangement::PostNorm, NormWeight::Direct) => "post",
        (NormArrangement::PostNorm, NormWeight::OnePlus) => "post (1 + w)",
    };
    let mut extra = Vec::new();
    if let Some(a) = l.attention() {
        extra.extend(
            crate::words::projection_extras(a)
                .into_iter()
                .map(String::from),
        );
    }
    extra.extend(crate::words::layer_extras(l));
    let norms = std::iter::once(norms.to_string())
        .chain(extra)
        .collect::<Vec<_>>()
        .join(", ");
    let mixer = match &l.mixer {
        Mixer::Attention(a) => attention_cols(a),
        Mixer::GatedDeltaNet(d) => MixerCols {
            window: "linear (Gated DeltaNet)".to_string(),
            kv: match d.cache {
                StateCache::ConvAndRecurrent => "conv + recurrent state".to_string(),
            },
            heads: format!("{}/{} (v/k)", d.v_heads, d.k_heads),
            head_dim: format!("{}/{} (k/v)", d.k_head_dim, d.v_head_dim),
            qkv_norm: format!(
                "q, k (L2); {}",
                match d.norm {
                    GatedNorm::RmsSiluGate => "out: gated RMSNorm",
                }
            ),
            rope: format!("- (conv kernel {})", d.conv_kernel),
            scale: "k_head_dim^-0.5 on q".to_string(),
            kv_quant: "-".to_string(),
        },
        Mixer::LatentAttention(a) => MixerCols {
            window: "full (latent attention)".to_string(),
            kv: format!(
                "latent {} + RoPE key {}",
                a.kv_lora_rank, a.qk_rope_head_dim
            ),
            heads: format!("{}", a.n_heads),
            head_dim: format!(
                "{}+{}/{} (q,k nope+rope / v)",
                a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
            ),
            qkv_norm: match a.query {
                LatentQuery::Direct => "latent: RMSNorm".to_string(),
                LatentQuery::LowRank { rank } => format!("q through {rank}, latent: RMSNorm"),
            },
            rope: rope_text(a.rope),
            scale: format!("{}", a.scale),
            kv_quant: "-".to_string(),
        },
        Mixer::ShortConv(c) => MixerCols {
            window: "short conv (B * x, depthwise conv1d, C *)".to_string(),
            kv: "conv state".to_string(),
            heads: "-".to_string(),
            head_dim: "-".to_string(),
            qkv_norm: "-".to_string(),
            rope: format!("- (conv kernel {})", c.kernel),
            scale: "-".to_string(),
            kv_quant: "-".to_string(),
        },
    };
    RowBody {
        kind: plan.kinds[plan.layer_kind[l.index]].name.clone(),
        norms,
        mixer,
        ffn: ffn_text(l.ffn),
    }
}

fn attention_cols(a: &Attention) -> MixerCols {
    let (kv, kv_quant) = match a.kv {
        KvSource::Own { values, cache } => (
            match values {
                Values::Projected => "own".to_string(),
                Values::SameAsKeys => "own, V = K".to_string(),
            },
            match cache {
                KvCache::Plain => "-".to_string(),
                KvCache::Quantized(q) => format!("{}-bit g{}", q.bits, q.group_size),
                KvCache::QuantizedAfterForward { quant, start } => format!(
                    "{}-bit g{} from offset {start} (optiq)",
                    quant.bits, quant.group_size
                ),
            },
        ),
        KvSource::Shared { donor } => (format!("from {donor}"), "-".to_string()),
    };
    let qkv_norm = format!(
        "{}{}",
        match a.qk_norm {
            QkNorm::None => "-",
            QkNorm::RmsPerHead => "q, k",
            QkNorm::RmsPerHeadOnePlus => "q, k (1 + w)",
            QkNorm::RmsWholeProjection => "q, k (whole projection)",
        },
        match a.value_norm {
            ValueNorm::None => "",
            ValueNorm::RmsScaleFree => ", v (no weight)",
        }
    );
    let rope = match (a.rope.kind, a.rope.rotated_dims == a.head_dim) {
        (RopeKind::Default { .. }, false) => {
            format!("{} ({} dims)", rope_text(a.rope), a.rope.rotated_dims)
        }
        _ => rope_text(a.rope),
    };
    MixerCols {
        window: match a.window {
            Window::Full => "full".to_string(),
            Window::Sliding(w) => format!("sliding {w}"),
        },
        kv,
        heads: format!("{}/{}", a.n_heads, a.n_kv_heads),
        head_dim: a.head_dim.to_string(),
        qkv_norm,
        rope,
        scale: format!(
            "{}{}",
            match a.scale {
                AttentionScale::One => "1".to_string(),
                AttentionScale::InvSqrtHeadDim => "head_dim^-0.5".to_string(),
                AttentionScale::InvSqrtQueryPreAttnScalar(s) => format!("{s}^-0.5 on q"),
                AttentionScale::Constant(s) => s.to_string(),
            },
            match a.scores {
                Scores::FusedSdpa => String::new(),
                Scores::Softcapped { cap } => format!(", scores softcapped at {cap}"),
                Scores::FusedSdpaWithSinks => ", sinks".to_string(),
            }
        ),
        kv_quant,
    }
}

fn ffn_text(ffn: FeedForward) -> String {
    match ffn {
        FeedForward::Mlp(m) => mlp_text(m),
        FeedForward::MlpAndMoe { mlp, moe } => format!(
            "{} + MoE {} experts top-{} width {}",
            mlp_text(mlp),
            moe.num_experts,
            moe.top_k,
            moe.width
        ),
        FeedForward::Moe(moe) => format!(
            "MoE {} experts top-{} width {} ({}), no dense MLP",
            moe.num_experts,
            moe.top_k,
            moe.width,
            router_text(moe.router)
        ),
        FeedForward::MoeAndSharedExpert { moe, shared } => format!(
            "MoE {} experts top-{} width {} ({}) + shared expert {} (sigmoid gate), no dense MLP",
            moe.num_experts,
            moe.top_k,
            moe.width,
            router_text(moe.router),
            shared.width
        ),
        FeedForward::MoeAndSharedExperts { moe, shared } => {
            let groups = match moe.router {
                Router::SigmoidGroupTopK(g) => format!(
                    ", groups {} keep {}, {}, scaled by {}",
                    g.n_group,
                    g.topk_group,
                    match g.probs {
                        TopKProbs::Renormalized => "renormalized",
                        TopKProbs::AsTaken => "as taken",
                    },
                    g.routed_scaling_factor
                ),
                Router::ScaledTopKSoftmax
                | Router::SoftmaxTopK { .. }
                | Router::TopKPreciseSoftmax => String::new(),
            };
            format!(
                "MoE {} experts top-{} width {} ({}{}) + shared experts {} (ungated), no dense MLP",
                moe.num_experts,
                moe.top_k,
                moe.width,
                router_text(moe.router),
                groups,
                shared.width
            )
        }
        FeedForward::BiasedExperts(moe) => format!(
            "MoE {} experts top-{} width {} ({}, {:?} activation, biases on every expert projection), no dense MLP",
            moe.num_experts,
            moe.top_k,
            moe.width,
            router_text(moe.router),
            moe.activation
        ),
    }
}

/// Layer indices as sorted ranges of consecutive layers: `0-4, 5, 6-10`.
fn layer_ranges(layers: &[usize]) -> String {
    let mut sorted = layers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for l in sorted {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == l => *end = l,
            _ => runs.push((l, l)),
        }
    }
    runs.iter()
        .map(|&(start, end)| match end - start {
            0 => start.to_string(),
            _ => format!("{start}-{end}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Consecutive layers whose rows are identical but for the index share one
/// row.
fn fold_layer_rows(rows: impl Iterator<Item = (usize, RowBody)>) -> Vec<Row> {
    let mut folded: Vec<(Vec<usize>, RowBody)> = Vec::new();
    for (index, body) in rows {
        match folded.last_mut() {
            Some((layers, last))
                if layers.last().is_some_and(|&l| l + 1 == index) && *last == body =>
            {
                layers.push(index)
            }
            _ => folded.push((vec![index], body)),
        }
    }
    folded
        .into_iter()
        .map(|(layers, body)| Row {
            index: layer_ranges(&layers),
            body,
        })
        .collect()
}

/// A tensor name split at its layer index: `("model.layers.", 3,
/// ".mlp.up_proj.weight")`, or `None` for a tensor outside the layers.
fn split_layer_index(name: &str) -> Option<(&str, usize, &str)> {
    const LAYERS: &str = "layers.";
    let at = name.find(LAYERS)? + LAYERS.len();
    let rest = &name[at..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let index = rest[..digits].parse().ok()?;
    rest[digits..]
        .starts_with('.')
        .then(|| (&name[..at], index, &rest[digits..]))
}

/// One row per tensor outside the layers, and one per per-layer tensor
/// template (`layers.N.…`) with one shape and dtype, naming its layers; rows
/// in the order of their first tensor.
fn fold_params(params: &[archgen_plan::Param]) -> Vec<ParamRow> {
    // (name with `N` for the layer, shape, dtype) -> layers, in first-seen order.
    let mut rows: Vec<(String, String, &'static str, Vec<usize>)> = Vec::new();
    for p in params {
        let shape = format!("{:?}", p.shape);
        match split_layer_index(&p.name) {
            None => rows.push((p.name.clone(), shape, p.dtype, Vec::new())),
            Some((before, index, after)) => {
                let name = format!("{before}N{after}");
                match rows.iter_mut().find(|(n, s, d, l)| {
                    *n == name && *s == shape && *d == p.dtype && !l.is_empty()
                }) {
                    Some((_, _, _, layers)) => layers.push(index),
                    None => rows.push((name, shape, p.dtype, vec![index])),
                }
            }
        }
    }
    rows.into_iter()
        .map(|(name, shape, dtype, layers)| ParamRow {
            name,
            layers: match layers.is_empty() {
                true => "-".to_string(),
                false => layer_ranges(&layers),
            },
            shape,
            dtype,
        })
        .collect()
}

pub fn plan_file(plan: &Plan) -> Result<String, String> {
    let ir = &plan.ir;
    let rows = fold_layer_rows(ir.layers.iter().map(|l| (l.index, row(plan, l))));
    let kinds: Vec<KindRow> = plan
        .kinds
        .iter()
        .map(|k| KindRow {
            name: k.name.clone(),
            layers: layer_ranges(&k.layers),
        })
        .collect();
    let params = fold_params(&plan.params);
    let quant = ir.quantization.as_ref().map(|q| {
        format!(
            "{}-bit, group {}, {}",
            q.default.bits,
            q.default.group_size,
            q.default.mode.as_str()
        )
    });
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_keep_trailing_newline(true);
    env.add_template("plan", TEMPLATE)
        .map_err(|e| e.to_string())?;
    let ctx = minijinja::context! {
        name => &plan.name,
        spec => &plan.spec_path,
        spec_hash => &plan.spec_hash,
        fingerprint => &plan.fingerprint,
        generator => GENERATOR_VERSION,
        command => crate::regenerate_command(&plan.name),
        model_type => ir.checkpoint.model_type.as_str(),
        hidden => ir.hidden_size,
        vocab => ir.vocab_size,
        num_layers => ir.layers.len(),
        eps => ir.norm_eps.to_string(),
        embedding => match ir.embedding.scale {
            EmbedScale::None => "unscaled".to_string(),
            EmbedScale::SqrtHidden => "× sqrt(hidden)".to_string(),
            EmbedScale::Constant(c) => format!("× {c}"),
        },
        ple => ir.embedding.per_layer_input.map_or("none".to_string(), |p| format!("width {}, vocab {}", p.width, p.vocab)),
        head => format!("{}{}", match ir.head.weight {
            HeadWeight::TiedEmbedding => "tied to the embedding",
            HeadWeight::Untied => "lm_head",
        }, match ir.head.norm {
            NormWeight::Direct => "",
            NormWeight::OnePlus => "; final norm weight 1 + w",
        }) + &match ir.head.logit_scale {
            LogitScale::None => String::new(),
            LogitScale::DivideBy(d) => format!("; normed hidden state ÷ {d} before it"),
            LogitScale::DivideLogitsBy(d) => format!("; logits ÷ {d}"),
        },
        softcap => ir.head.logit_softcap.map_or("none".to_string(), |c| match c.form {
            SoftcapForm::Compiled => c.cap.to_string(),
            SoftcapForm::Eager => format!("{} (eager)", c.cap),
        }),
        quantization => quant.unwrap_or_else(|| "none".to_string()),
        tier => archgen_ir::tier::tier(ir).to_string(),
        rows => rows,
        kinds => kinds,
        params => params,
        tensor_count => plan.params.len(),
        param_count => ir.param_count(),
    };
    env.get_template("plan")
        .and_then(|t| t.render(ctx))
        .map_err(|e| format!("plan template: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_ranges_fold_consecutive_layers() {
        assert_eq!(layer_ranges(&[0, 1, 2, 3, 4, 6, 8, 9]), "0-4, 6, 8-9");
        assert_eq!(layer_ranges(&[5]), "5");
        assert_eq!(layer_ranges(&[3, 1, 2, 2]), "1-3");
    }

    #[test]
    fn a_layer_index_is_found_only_as_a_whole_segment() {
        assert_eq!(
            split_layer_index("model.layers.12.mlp.up_proj.weight"),
            Some(("model.layers.", 12, ".mlp.up_proj.weight"))
        );
        assert_eq!(split_layer_index("model.norm.weight"), None);
        assert_eq!(split_layer_index("model.layers.x.weight"), None);
        assert_eq!(split_layer_index("model.layers.3"), None);
    }

    fn param(name: &str, shape: &[u64]) -> archgen_plan::Param {
        archgen_plan::Param {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype: "float",
        }
    }

    #[test]
    fn per_layer_tensors_fold_by_shape() {
        let params = [
            param("embed.weight", &[8, 4]),
            param("layers.0.q.weight", &[4, 4]),
            param("layers.1.q.weight", &[4, 4]),
            param("layers.2.q.weight", &[8, 4]),
            param("layers.3.q.weight", &[4, 4]),
        ];
        let rows: Vec<(String, String, String)> = fold_params(&params)
            .into_iter()
            .map(|r| (r.name, r.layers, r.shape))
            .collect();
        let row = |n: &str, l: &str, s: &str| (n.to_string(), l.to_string(), s.to_string());
        assert_eq!(
            rows,
            [
                row("embed.weight", "-", "[8, 4]"),
                row("layers.N.q.weight", "0-1, 3", "[4, 4]"),
                row("layers.N.q.weight", "2", "[8, 4]"),
            ]
        );
    }
}
