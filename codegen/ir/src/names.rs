//! The one map from IR blocks to checkpoint tensor names (mlx-community
//! layout: what mlx-lm's `sanitize` leaves, under the checkpoint's module
//! prefix). The tensor contract of the plan, the quantization rules, the
//! parameter count and `archgen init` read it; the loader's renames are the
//! IR's [`crate::SanitizeRule`]s.

use crate::*;

impl ModulePrefix {
    /// Prefix of the text model's modules.
    pub fn modules(self) -> &'static str {
        match self {
            ModulePrefix::Model => "model.",
            ModulePrefix::LanguageModel => "language_model.model.",
        }
    }
    /// Path of the untied head.
    pub fn lm_head(self) -> &'static str {
        match self {
            ModulePrefix::Model => "lm_head",
            ModulePrefix::LanguageModel => "language_model.lm_head",
        }
    }
}

/// The RMSNorms around a layer's mixer and feed-forward half, by arrangement:
/// `(before mixer, after mixer, before ffn, after ffn)` module names.
pub fn layer_norm_names(a: NormArrangement) -> &'static [&'static str] {
    match a {
        // mlx-lm's pre-norm blocks call the norm before the MLP
        // `post_attention_layernorm`.
        NormArrangement::PreNorm => &["input_layernorm", "post_attention_layernorm"],
        NormArrangement::Sandwich => &[
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ],
        NormArrangement::PostNorm => &["post_attention_layernorm", "post_feedforward_layernorm"],
    }
}

/// LFM2's module names (lfm2.py) and the names the shared blocks load them
/// by, as `.name.` segments of a tensor name ([`SanitizeRule::RenameLfm2Modules`]).
pub const LFM2_MODULES: [(&str, &str); 9] = [
    (".operator_norm.", ".input_layernorm."),
    (".ffn_norm.", ".post_attention_layernorm."),
    (".feed_forward.w1.", ".mlp.gate_proj."),
    (".feed_forward.w3.", ".mlp.up_proj."),
    (".feed_forward.w2.", ".mlp.down_proj."),
    (".self_attn.out_proj.", ".self_attn.o_proj."),
    (".self_attn.q_layernorm.", ".self_attn.q_norm."),
    (".self_attn.k_layernorm.", ".self_attn.k_norm."),
    (".embedding_norm.", ".norm."),
];

/// `name` with its first `from` segment of `pairs` replaced by the paired
/// `to`. Tensor and module names alike: `name` is matched as `.{name}.`, so
/// `embedding_norm.weight` and the module path `model.layers.0.feed_forward.w2`
/// match too.
fn renamed(name: &str, pairs: impl Iterator<Item = (&'static str, &'static str)>) -> String {
    let dotted = format!(".{name}.");
    let mut pairs = pairs;
    match pairs.find(|(from, _)| dotted.contains(from)) {
        Some((from, to)) => {
            let out = dotted.replacen(from, to, 1);
            out[1..out.len() - 1].to_string()
        }
        None => name.to_string(),
    }
}

/// An LFM2 checkpoint's tensor name read as the shared blocks' name.
pub fn lfm2_shared_name(name: &str) -> String {
    renamed(name, LFM2_MODULES.into_iter())
}

/// A contract name of an LFM2 model as mlx-lm's checkpoint spells it.
pub fn lfm2_checkpoint_name(name: &str) -> String {
    renamed(name, LFM2_MODULES.into_iter().map(|(a, b)| (b, a)))
}

/// The extra norms of the MoE branch of [`FeedForward::MlpAndMoe`].
pub const MOE_BRANCH_NORMS: [&str; 3] = [
    "pre_feedforward_layernorm_2",
    "post_feedforward_layernorm_1",
    "post_feedforward_layernorm_2",
];

/// The attention projections of `a` that have a bias, with the bias length
/// (`{name}.bias`; only projections the layer has; `o_proj`'s is the model's
/// width, `hidden`).
pub fn attention_biases(a: &Attention, hidden: u64) -> Vec<(&'static str, u64)> {
    match a.bias {
        ProjectionBias::None => Vec::new(),
        ProjectionBias::QueryKeyValue | ProjectionBias::QueryKeyValueOutput => {
            let q = (a.n_heads * a.head_dim) as u64;
            let kv = (a.n_kv_heads * a.head_dim) as u64;
            let mut v = vec![("q_proj", q)];
            if let KvSource::Own { values, .. } = a.kv {
                v.push(("k_proj", kv));
                match values {
                    Values::Projected => v.push(("v_proj", kv)),
                    Values::SameAsKeys => {}
                }
            }
            match a.bias {
                ProjectionBias::QueryKeyValueOutput => v.push(("o_proj", hidden)),
                ProjectionBias::None | ProjectionBias::QueryKeyValue => {}
            }
            v
        }
    }
}

/// The router's projection module, relative to the layer, where it is an
/// `nn.Linear` (`nn.quantize` visits it); None where the router holds its
/// weight as a plain parameter (glm4_moe's `MoEGate.weight`, never
/// quantized: [`ModelIr::shaped_params`]).
pub fn router_module(r: Router) -> Option<&'static str> {
    match r {
        Router::ScaledTopKSoftmax => Some("router.proj"),
        // Qwen3MoeSparseMoeBlock.gate
        Router::SoftmaxTopK { .. } => Some("mlp.gate"),
        Router::SigmoidGroupTopK(_) => None,
        // gpt_oss's MLPBlock.router
        Router::TopKPreciseSoftmax => Some("mlp.router"),
    }
}

/// The `SwitchGLU` module of the experts, relative to the layer: beside the
/// MLP it is Gemma-4's `experts.switch_glu`, in its place `mlp.switch_mlp`.
pub fn experts_module(f: FeedForward) -> Option<&'static str> {
    match f {
        FeedForward::Mlp(_) => None,
        FeedForward::MlpAndMoe { .. } => Some("experts.switch_glu"),
        FeedForward::Moe(_)
        | FeedForward::MoeAndSharedExpert { .. }
        | FeedForward::MoeAndSharedExperts { .. } => Some("mlp.switch_mlp"),
        FeedForward::BiasedExperts(_) => Some("mlp.experts"),
    }
}

/// A vector parameter (norm weight, bias, scalar, router scale) and its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VectorParam {
    /// Full checkpoint name.
    pub name: String,
    pub len: u64,
}

/// A parameter of more than one dimension outside the quantizable modules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapedParam {
    /// Full checkpoint name.
    pub name: String,
    pub shape: Vec<u64>,
}

impl ModelIr {
    /// Prefix of the text model's modules.
    pub fn module_prefix(&self) -> &'static str {
        self.checkpoint.prefix.modules()
    }

    /// Path of the untied head.
    pub fn lm_head_path(&self) -> &'static str {
        self.checkpoint.prefix.lm_head()
    }

    /// Every module `nn.quantize` would visit, in module-tree order, with
    /// weight shapes.
    pub fn quantizable_modules(&self) -> Vec<QuantizableModule> {
        let pre = self.module_prefix();
        let h = self.hidden_size as u64;
        let mut out = Vec::new();
        let mut push = |path: String, kind, in_dim: u64, out_dim: u64, count: u64| {
            out.push(QuantizableModule {
                path,
                kind,
                in_dim,
                out_dim,
                count,
            })
        };
        push(
            format!("{pre}embed_tokens"),
            ModuleKind::Embedding,
            h,
            self.vocab_size as u64,
            1,
        );
        if let Some(ple) = self.embedding.per_layer_input {
            let w = (self.layers.len() * ple.width) as u64;
            push(
                format!("{pre}embed_tokens_per_layer"),
                ModuleKind::Embedding,
                w,
                ple.vocab as u64,
                1,
            );
            push(
                format!("{pre}per_layer_model_projection"),
                ModuleKind::Linear,
                h,
                w,
                1,
            );
        }
        for l in &self.layers {
            let lp = format!("{pre}layers.{}.", l.index);
            match &l.mixer {
                Mixer::Attention(a) => {
                    let q = (a.n_heads * a.head_dim) as u64;
                    let kv = (a.n_kv_heads * a.head_dim) as u64;
                    // An output gate doubles q_proj: per head the queries, then the gate.
                    let q_out = match a.output_gate {
                        OutputGate::None => q,
                        OutputGate::SigmoidPerHead => 2 * q,
                    };
                    match a.projection {
                        QkvProjection::Separate => push(
                            format!("{lp}self_attn.q_proj"),
                            ModuleKind::Linear,
                            h,
                            q_out,
                            1,
                        ),
                        // One matrix of q, k and v's rows (a layer that
                        // owns its K/V with v_proj's rows: the lowering's).
                        QkvProjection::Fused => push(
                            format!("{lp}self_attn.qkv_proj"),
                            ModuleKind::Linear,
                            h,
                            q_out + 2 * kv,
                            1,
                        ),
                    }
                    if let (KvSource::Own { values, .. }, QkvProjection::Separate) =
                        (a.kv, a.projection)
                    {
                        push(
                            format!("{lp}self_attn.k_proj"),
                            ModuleKind::Linear,
                            h,
                            kv,
                            1,
                        );
                        match values {
                            Values::Projected => push(
                                format!("{lp}self_attn.v_proj"),
                                ModuleKind::Linear,
                                h,
                                kv,
                                1,
                            ),
                            Values::SameAsKeys => {}
                        }
                    }
                    push(format!("{lp}self_attn.o_proj"), ModuleKind::Linear, q, h, 1);
                }
                Mixer::GatedDeltaNet(d) => match d.in_proj {
                    InProj::Split => {
                        let la = format!("{lp}linear_attn");
                        let (conv, vd) = (d.conv_dim() as u64, d.value_dim() as u64);
                        let hv = d.v_heads as u64;
                        push(format!("{la}.in_proj_qkv"), ModuleKind::Linear, h, conv, 1);
                        push(format!("{la}.in_proj_z"), ModuleKind::Linear, h, vd, 1);
                        push(format!("{la}.in_proj_b"), ModuleKind::Linear, h, hv, 1);
                        push(format!("{la}.in_proj_a"), ModuleKind::Linear, h, hv, 1);
                        push(format!("{la}.out_proj"), ModuleKind::Linear, vd, h, 1);
                    }
                    InProj::GroupedPerKeyHead => {
                        let la = format!("{lp}linear_attn");
                        let (conv, vd) = (d.conv_dim() as u64, d.value_dim() as u64);
                        let hv = d.v_heads as u64;
                        push(
                            format!("{la}.in_proj_qkvz"),
                            ModuleKind::Linear,
                            h,
                            conv + vd,
                            1,
                        );
                        push(format!("{la}.in_proj_ba"), ModuleKind::Linear, h, 2 * hv, 1);
                        push(format!("{la}.out_proj"), ModuleKind::Linear, vd, h, 1);
                    }
                },
                // `in_proj` gives B, C and x side by side; the conv itself
                // is an `nn.Conv1d`, which `nn.quantize` leaves alone.
                Mixer::ShortConv(_) => {
                    push(format!("{lp}conv.in_proj"), ModuleKind::Linear, h, 3 * h, 1);
                    push(format!("{lp}conv.out_proj"), ModuleKind::Linear, h, h, 1);
                }
                Mixer::LatentAttention(a) => {
                    let sa = format!("{lp}self_attn");
                    let heads = a.n_heads as u64;
                    let (nope, rope) = (a.qk_nope_head_dim as u64, a.qk_rope_head_dim as u64);
                    let (rank, v) = (a.kv_lora_rank as u64, a.v_head_dim as u64);
                    let q = heads * (nope + rope);
                    match a.query {
                        LatentQuery::Direct => {
                            push(format!("{sa}.q_proj"), ModuleKind::Linear, h, q, 1)
                        }
                        LatentQuery::LowRank { rank: r } => {
                            push(format!("{sa}.q_a_proj"), ModuleKind::Linear, h, r as u64, 1);
                            push(format!("{sa}.q_b_proj"), ModuleKind::Linear, r as u64, q, 1);
                        }
                    }
                    push(
                        format!("{sa}.kv_a_proj_with_mqa"),
                        ModuleKind::Linear,
                        h,
                        rank + rope,
                        1,
                    );
                    push(
                        format!("{sa}.embed_q"),
                        ModuleKind::MultiLinear,
                        nope,
                        rank,
                        heads,
                    );
                    push(
                        format!("{sa}.unembed_out"),
                        ModuleKind::MultiLinear,
                        rank,
                        v,
                        heads,
                    );
                    push(format!("{sa}.o_proj"), ModuleKind::Linear, heads * v, h, 1);
                }
            }
            if let Some(m) = l.mlp() {
                let w = m.width as u64;
                match m.projection {
                    GateUpProjection::Separate => {
                        push(format!("{lp}mlp.gate_proj"), ModuleKind::Linear, h, w, 1);
                        push(format!("{lp}mlp.down_proj"), ModuleKind::Linear, w, h, 1);
                        push(format!("{lp}mlp.up_proj"), ModuleKind::Linear, h, w, 1);
                    }
                    GateUpProjection::Fused => {
                        push(
                            format!("{lp}mlp.gate_up_proj"),
                            ModuleKind::Linear,
                            h,
                            2 * w,
                            1,
                        );
                        push(format!("{lp}mlp.down_proj"), ModuleKind::Linear, w, h, 1);
                    }
                }
            }
            if let (Some(moe), Some(experts)) = (l.moe(), experts_module(l.ffn)) {
                let (e, mw) = (moe.num_experts as u64, moe.width as u64);
                if let Some(router) = router_module(moe.router) {
                    push(format!("{lp}{router}"), ModuleKind::Linear, h, e, 1);
                }
                let sw = format!("{lp}{experts}");
                push(
                    format!("{sw}.gate_proj"),
                    ModuleKind::SwitchLinear,
                    h,
                    mw,
                    e,
                );
                push(format!("{sw}.up_proj"), ModuleKind::SwitchLinear, h, mw, e);
                push(
                    format!("{sw}.down_proj"),
                    ModuleKind::SwitchLinear,
                    mw,
                    h,
                    e,
                );
            }
            // The shared expert(s) beside routed experts: their MLP, and
            // the shared expert's own gate where the module has one.
            let shared = match l.ffn {
                FeedForward::MoeAndSharedExpert { shared, .. } => Some((
                    "mlp.shared_expert",
                    shared.width,
                    Some("mlp.shared_expert_gate"),
                )),
                FeedForward::MoeAndSharedExperts { shared, .. } => {
                    Some(("mlp.shared_experts", shared.width, None))
                }
                FeedForward::Mlp(_)
                | FeedForward::MlpAndMoe { .. }
                | FeedForward::Moe(_)
                | FeedForward::BiasedExperts(_) => None,
            };
            if let Some((module, width, gate)) = shared {
                let (sw, se) = (width as u64, format!("{lp}{module}"));
                push(format!("{se}.gate_proj"), ModuleKind::Linear, h, sw, 1);
                push(format!("{se}.down_proj"), ModuleKind::Linear, sw, h, 1);
                push(format!("{se}.up_proj"), ModuleKind::Linear, h, sw, 1);
                if let Some(gate) = gate {
                    push(format!("{lp}{gate}"), ModuleKind::Linear, h, 1, 1);
                }
            }
            match l.input {
                LayerInput::None => {}
                LayerInput::Gated { width } => {
                    let pw = width as u64;
                    push(
                        format!("{lp}per_layer_input_gate"),
                        ModuleKind::Linear,
                        h,
                        pw,
                        1,
                    );
                    push(
                        format!("{lp}per_layer_projection"),
                        ModuleKind::Linear,
                        pw,
                        h,
                        1,
                    );
                }
            }
        }
        match self.head.weight {
            HeadWeight::TiedEmbedding => {}
            HeadWeight::Untied => push(
                self.lm_head_path().to_string(),
                ModuleKind::Linear,
                h,
                self.vocab_size as u64,
                1,
            ),
        }
        out
    }

    /// Every parameter that is not a quantizable module's weight: norm
    /// weights, projection biases, layer scalars, router scales.
    pub fn vector_params(&self) -> Vec<VectorParam> {
        let pre = self.module_prefix();
        let h = self.hidden_size as u64;
        let mut out = Vec::new();
        let mut push = |name: String, len: u64| out.push(VectorParam { name, len });
        if let Some(p) = self.embedding.per_layer_input {
            push(
                format!("{pre}per_layer_projection_norm.weight"),
                p.width as u64,
            );
        }
        for l in &self.layers {
            let lp = format!("{pre}layers.{}.", l.index);
            for n in layer_norm_names(l.norms.arrangement) {
                push(format!("{lp}{n}.weight"), h);
            }
            match &l.mixer {
                Mixer::Attention(a) => {
                    for (name, len) in attention_biases(a, h) {
                        push(format!("{lp}self_attn.{name}.bias"), len);
                    }
                    match a.scores {
                        Scores::FusedSdpaWithSinks => {
                            push(format!("{lp}self_attn.sinks"), a.n_heads as u64)
                        }
                        Scores::FusedSdpa | Scores::Softcapped { .. } => {}
                    }
                    match a.qk_norm {
                        QkNorm::None => {}
                        QkNorm::RmsPerHead | QkNorm::RmsPerHeadOnePlus => {
                            let d = a.head_dim as u64;
                            push(format!("{lp}self_attn.q_norm.weight"), d);
                            if a.owns_kv() {
                                push(format!("{lp}self_attn.k_norm.weight"), d);
                            }
                        }
                        QkNorm::RmsWholeProjection => {
                            let d = a.head_dim as u64;
                            push(format!("{lp}self_attn.q_norm.weight"), a.n_heads as u64 * d);
                            if a.owns_kv() {
                                push(
                                    format!("{lp}self_attn.k_norm.weight"),
                                    a.n_kv_heads as u64 * d,
                                );
                            }
                        }
                    }
                }
                Mixer::GatedDeltaNet(d) => {
                    let la = format!("{lp}linear_attn");
                    push(format!("{la}.dt_bias"), d.v_heads as u64);
                    push(format!("{la}.A_log"), d.v_heads as u64);
                    match d.norm {
                        GatedNorm::RmsSiluGate => {
                            push(format!("{la}.norm.weight"), d.v_head_dim as u64)
                        }
                    }
                }
                Mixer::ShortConv(_) => {}
                Mixer::LatentAttention(a) => {
                    let sa = format!("{lp}self_attn");
                    match a.query {
                        LatentQuery::Direct => {}
                        LatentQuery::LowRank { rank } => {
                            push(format!("{sa}.q_a_layernorm.weight"), rank as u64)
                        }
                    }
                    push(format!("{sa}.kv_a_layernorm.weight"), a.kv_lora_rank as u64);
                }
            }
            if let Some(m) = l.moe() {
                match m.router {
                    Router::ScaledTopKSoftmax => {
                        push(format!("{lp}router.scale"), h);
                        push(format!("{lp}router.per_expert_scale"), m.num_experts as u64);
                    }
                    Router::SoftmaxTopK { .. } => {}
                    // Kept float32 by the module's cast_predicate.
                    Router::SigmoidGroupTopK(_) => push(
                        format!("{lp}mlp.gate.e_score_correction_bias"),
                        m.num_experts as u64,
                    ),
                    Router::TopKPreciseSoftmax => {
                        push(format!("{lp}mlp.router.bias"), m.num_experts as u64)
                    }
                }
            }
            match l.ffn {
                FeedForward::MlpAndMoe { .. } => {
                    for n in MOE_BRANCH_NORMS {
                        push(format!("{lp}{n}.weight"), h);
                    }
                }
                FeedForward::Mlp(_)
                | FeedForward::Moe(_)
                | FeedForward::MoeAndSharedExpert { .. }
                | FeedForward::MoeAndSharedExperts { .. }
                | FeedForward::BiasedExperts(_) => {}
            }
            match l.input {
                LayerInput::None => {}
                LayerInput::Gated { .. } => {
                    push(format!("{lp}post_per_layer_input_norm.weight"), h)
                }
            }
            match l.scalar {
                LayerScalar::None => {}
                LayerScalar::Learned => push(format!("{lp}layer_scalar"), 1),
            }
        }
        push(format!("{pre}norm.weight"), h);
        out
    }

    /// How the module at `module_path` is quantized, by mlx-lm's rules: an
    /// explicit per-path entry wins (params, or `false` → None); otherwise the
    /// default applies, except that convert skips modules whose input
    /// dimension is not divisible by the group size. None for unquantized
    /// models and for paths that are not quantizable modules of this model.
    pub fn quant_for(&self, module_path: &str) -> Option<QuantParams> {
        let q = self.quantization.as_ref()?;
        if let Some(entry) = q.overrides.get(module_path) {
            return *entry;
        }
        let module = self
            .quantizable_modules()
            .into_iter()
            .find(|m| m.path == module_path)?;
        (module.in_dim % q.default.group_size as u64 == 0).then_some(q.default)
    }

    /// Modules the default quantization would skip because their input
    /// dimension is not a multiple of the group size (and that have no
    /// explicit entry).
    pub fn quant_skipped_modules(&self) -> Vec<QuantizableModule> {
        let Some(q) = &self.quantization else {
            return Vec::new();
        };
        self.quantizable_modules()
            .into_iter()
            .filter(|m| {
                !q.overrides.contains_key(&m.path) && m.in_dim % q.default.group_size as u64 != 0
            })
            .collect()
    }

    /// Parameters of more than one dimension that no `nn.quantize` visits
    /// (the depthwise conv weights of Gated DeltaNet and short-conv layers,
    /// `[C, K, 1]`; glm4_moe's router weight `mlp.gate.weight`,
    /// `[experts, hidden]`, a parameter of a plain module).
    pub fn shaped_params(&self) -> Vec<ShapedParam> {
        let pre = self.module_prefix();
        let mut out = Vec::new();
        for l in &self.layers {
            match &l.mixer {
                Mixer::Attention(_) | Mixer::LatentAttention(_) => {}
                Mixer::GatedDeltaNet(d) => out.push(ShapedParam {
                    name: format!("{pre}layers.{}.linear_attn.conv1d.weight", l.index),
                    shape: vec![d.conv_dim() as u64, d.conv_kernel as u64, 1],
                }),
                Mixer::ShortConv(c) => out.push(ShapedParam {
                    name: format!("{pre}layers.{}.conv.conv.weight", l.index),
                    shape: vec![self.hidden_size as u64, c.kernel as u64, 1],
                }),
            }
            if let Some(m) = l.moe() {
                match m.router {
                    Router::ScaledTopKSoftmax
                    | Router::SoftmaxTopK { .. }
                    | Router::TopKPreciseSoftmax => {}
                    Router::SigmoidGroupTopK(_) => out.push(ShapedParam {
                        name: format!("{pre}layers.{}.mlp.gate.weight", l.index),
                        shape: vec![m.num_experts as u64, self.hidden_size as u64],
                    }),
                }
            }
            // gpt_oss's expert biases: `[experts, out]` per projection.
            if let (FeedForward::BiasedExperts(m), Some(experts)) = (l.ffn, experts_module(l.ffn)) {
                let (e, w, h) = (
                    m.num_experts as u64,
                    m.width as u64,
                    self.hidden_size as u64,
                );
                for (proj, out_dim) in [("gate_proj", w), ("up_proj", w), ("down_proj", h)] {
                    out.push(ShapedParam {
                        name: format!("{pre}layers.{}.{experts}.{proj}.bias", l.index),
                        shape: vec![e, out_dim],
                    });
                }
            }
        }
        out
    }

    /// Parameter count of the unquantized model (weights, norms, scalars).
    pub fn param_count(&self) -> u64 {
        let modules: u64 = self
            .quantizable_modules()
            .iter()
            .map(|m| m.in_dim * m.out_dim * m.count)
            .sum();
        let shaped: u64 = self
            .shaped_params()
            .iter()
            .map(|p| p.shape.iter().product::<u64>())
            .sum();
        modules + shaped + self.vector_params().iter().map(|p| p.len).sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every LFM2 module name reads as the shared name and back; other
    /// names, and names that only contain a shared segment's words, pass.
    #[test]
    fn lfm2_names_map_both_ways() {
        let renamed = [
            (
                "model.layers.3.operator_norm.weight",
                "model.layers.3.input_layernorm.weight",
            ),
            (
                "layers.0.ffn_norm.weight",
                "layers.0.post_attention_layernorm.weight",
            ),
            (
                "layers.1.feed_forward.w1.scales",
                "layers.1.mlp.gate_proj.scales",
            ),
            (
                "layers.1.feed_forward.w3.weight",
                "layers.1.mlp.up_proj.weight",
            ),
            (
                "layers.1.feed_forward.w2.biases",
                "layers.1.mlp.down_proj.biases",
            ),
            (
                "layers.2.self_attn.out_proj.weight",
                "layers.2.self_attn.o_proj.weight",
            ),
            (
                "layers.2.self_attn.q_layernorm.weight",
                "layers.2.self_attn.q_norm.weight",
            ),
            (
                "layers.2.self_attn.k_layernorm.weight",
                "layers.2.self_attn.k_norm.weight",
            ),
            ("embedding_norm.weight", "norm.weight"),
            ("model.embedding_norm.weight", "model.norm.weight"),
            (
                "model.layers.0.feed_forward.w2",
                "model.layers.0.mlp.down_proj",
            ),
            (
                "model.layers.2.self_attn.out_proj",
                "model.layers.2.self_attn.o_proj",
            ),
        ];
        // Names LFM2 shares with the other families: each reads as itself.
        let same = [
            "model.embed_tokens.weight",
            "layers.0.conv.in_proj.weight",
            "layers.0.conv.out_proj.weight",
            "layers.0.conv.conv.weight",
            "layers.2.self_attn.q_proj.weight",
        ];
        for (lfm2, shared) in renamed.into_iter().chain(same.map(|n| (n, n))) {
            assert_eq!(lfm2_shared_name(lfm2), shared);
            assert_eq!(lfm2_checkpoint_name(shared), lfm2);
        }
    }
}
