//! The `moe` section of the families whose experts are routed by `noaux_tc`
//! (mlx-lm's compiled `group_expert_select`: sigmoid scores, a float32
//! correction bias for the choice, group-limited top-k, the uncorrected scores
//! renormalized and scaled) and joined by ungated shared experts, after
//! `first_k_dense_replace` dense layers. glm4_moe reads it; DeepSeek-V3's
//! `ModelArgs` has the same fields. Written once: the section, its checks, its
//! lowering to IR `FeedForward::MoeAndSharedExperts`, its config.json fields,
//! its import and its reduced sizes.

use crate::dense_sections::DenseMlp;
use crate::diag::FieldPath;
use crate::ir::{self, FeedForward};
use crate::layout_reader::Section;
use crate::reader::Reader;
use crate::reduce::Size;
use crate::validate::{limits::*, Checker};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The routed and shared experts and which layers have them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoauxTcExperts {
    /// `n_routed_experts`.
    pub n_routed_experts: u32,
    /// `num_experts_per_tok`: the top-k each token is routed to.
    pub num_experts_per_tok: u32,
    /// `moe_intermediate_size`: the SwiGLU width of each expert.
    pub moe_intermediate_size: u32,
    /// `n_shared_experts`: the shared experts are one SwiGLU MLP
    /// `moe_intermediate_size * n_shared_experts` wide.
    pub n_shared_experts: u32,
    /// `first_k_dense_replace`: layers below this index keep the dense MLP.
    pub first_k_dense_replace: u32,
    /// `n_group`: the experts split into this many groups (1: no group limit).
    pub n_group: u32,
    /// `topk_group`: the groups (ranked by the sum of their two best scores)
    /// whose experts stay eligible.
    pub topk_group: u32,
    /// `routed_scaling_factor`: the chosen weights are multiplied by it.
    pub routed_scaling_factor: f64,
    /// `norm_topk_prob`: the chosen weights renormalized to sum to 1 (when top-k > 1).
    pub norm_topk_prob: bool,
}

/// The `moe` section of the layouts that read it, with the texts of the
/// messages about it.
pub(crate) const MOE: Section = Section::described::<NoauxTcExperts>(
    "moe",
    "a mapping {n_routed_experts, num_experts_per_tok, moe_intermediate_size, \
     n_shared_experts, first_k_dense_replace, n_group, topk_group, routed_scaling_factor, \
     norm_topk_prob}",
    "the routed and shared experts",
);

/// The dense `mlp` section beside it: the width of the first
/// `first_k_dense_replace` layers.
pub(crate) const DENSE_MLP: Section = Section::hinted::<DenseMlp>(
    "mlp",
    "SwiGLU width of the first_k_dense_replace dense layers",
);

impl NoauxTcExperts {
    /// Every rule of the section (`moe.*` paths) for a stack of `layers`;
    /// returns whether its sizes hold.
    pub(crate) fn check(&self, c: &mut Checker, layers: u32) -> bool {
        let e = self;
        let mut ok = true;
        for (path, v, max, hint) in [
            (
                "n_routed_experts",
                e.n_routed_experts,
                MAX_EXPERTS,
                "routed experts (GLM-4.5-Air: 128)",
            ),
            (
                "num_experts_per_tok",
                e.num_experts_per_tok,
                MAX_EXPERTS,
                "experts per token (8)",
            ),
            (
                "moe_intermediate_size",
                e.moe_intermediate_size,
                MAX_INTERMEDIATE,
                "expert width",
            ),
            (
                "n_shared_experts",
                e.n_shared_experts,
                MAX_EXPERTS,
                "shared experts (GLM-4.5-Air: 1)",
            ),
            (
                "n_group",
                e.n_group,
                MAX_EXPERTS,
                "expert groups (1: no group limit)",
            ),
            (
                "topk_group",
                e.topk_group,
                MAX_EXPERTS,
                "groups whose experts stay eligible",
            ),
        ] {
            ok &= c.range(&format!("moe.{path}"), v, max, hint);
        }
        let factor = e.routed_scaling_factor;
        ok &= c.positive_finite("moe.routed_scaling_factor", factor, "GLM-4.5-Air: 1.0");
        if !ok || !c.top_k_of_experts(e.num_experts_per_tok, e.n_routed_experts) {
            return false;
        }
        let (g, k, dense) = (e.n_group, e.topk_group, e.first_k_dense_replace);
        let per_group = e.n_routed_experts / g;
        let rules = [
            (
                dense >= layers,
                "first_k_dense_replace",
                format!("{dense} of {layers} layers dense leaves no MoE layer"),
                "fewer than num_hidden_layers",
                "a model without MoE layers is a dense model, not this form",
            ),
            (
                e.n_routed_experts % g != 0,
                "n_group",
                format!(
                    "{} experts do not split into {g} groups",
                    e.n_routed_experts
                ),
                "a divisor of n_routed_experts",
                "group_expert_select unflattens the scores into (n_group, -1)",
            ),
            (
                g > 1 && per_group < 2,
                "n_group",
                format!("{per_group} expert per group"),
                "at least 2 experts per group",
                "a group's score is the sum of its two best experts (mx.topk(scores, 2))",
            ),
            (
                k > g || (g > 1 && k == g),
                "topk_group",
                format!("{k} of {g} groups"),
                "fewer than n_group (1 when n_group is 1)",
                "n_group - topk_group groups are masked; to mask none write n_group: 1",
            ),
        ];
        for (bad, field, found, expected, hint) in rules {
            if bad {
                ok = false;
                c.err(
                    FieldPath::parse(&format!("moe.{field}")),
                    found,
                    expected,
                    hint,
                );
            }
        }
        ok
    }

    /// Layer `i`'s feed-forward half: the dense SwiGLU MLP of `dense_width`
    /// below `first_k_dense_replace`, then the routed and shared experts.
    pub(crate) fn ffn(&self, i: u32, dense_width: u32) -> FeedForward {
        let e = self;
        if i < e.first_k_dense_replace {
            return FeedForward::Mlp(crate::ir_parts::swiglu(dense_width));
        }
        let probs = match e.norm_topk_prob {
            true => ir::TopKProbs::Renormalized,
            false => ir::TopKProbs::AsTaken,
        };
        let router = ir::Router::SigmoidGroupTopK(ir::GroupTopK {
            n_group: e.n_group as usize,
            topk_group: e.topk_group as usize,
            probs,
            routed_scaling_factor: e.routed_scaling_factor,
        });
        FeedForward::MoeAndSharedExperts {
            moe: ir::Moe {
                num_experts: e.n_routed_experts as usize,
                top_k: e.num_experts_per_tok as usize,
                width: e.moe_intermediate_size as usize,
                router,
                activation: ir::Activation::Silu,
            },
            shared: ir::SharedExpert {
                width: (e.moe_intermediate_size * e.n_shared_experts) as usize,
            },
        }
    }

    /// The section's config.json fields, added to `fields`.
    pub(crate) fn add_config_fields(&self, fields: &mut Value) {
        let e = self;
        let own = json!({
            "n_routed_experts": e.n_routed_experts,
            "num_experts_per_tok": e.num_experts_per_tok,
            "moe_intermediate_size": e.moe_intermediate_size,
            "n_shared_experts": e.n_shared_experts,
            "first_k_dense_replace": e.first_k_dense_replace,
            "n_group": e.n_group,
            "topk_group": e.topk_group,
            "routed_scaling_factor": e.routed_scaling_factor,
            "norm_topk_prob": e.norm_topk_prob,
        });
        if let (Value::Object(fields), Value::Object(own)) = (fields, own) {
            fields.extend(own);
        }
    }

    /// The section from a config.json, every field required as the
    /// `ModelArgs` dataclass requires it. `topk_method` must be `noaux_tc`
    /// (`MoEGate` asserts it); `scoring_func` is never read (the gate is a
    /// sigmoid); a null `n_shared_experts` (no shared experts) is refused.
    pub(crate) fn read(top: &Map<String, Value>, r: &mut Reader) -> Self {
        if top.get("n_shared_experts").is_some_and(Value::is_null) {
            r.problem(
                "n_shared_experts",
                "null (no shared experts) is a form archgen does not run; expected a count >= 1",
            );
        }
        match r.get("topk_method").map(Value::as_str) {
            None | Some(Some("noaux_tc")) => {}
            Some(_) => r.problem("topk_method", "expected \"noaux_tc\" (MoEGate asserts it)"),
        }
        if r.get("scoring_func")
            .is_some_and(|v| v.as_str() != Some("sigmoid"))
        {
            let why = "ignored: the gate always scores with a sigmoid";
            r.note("scoring_func", json!("sigmoid"), why);
        }
        NoauxTcExperts {
            n_routed_experts: r.required_uint("n_routed_experts"),
            num_experts_per_tok: r.required_uint("num_experts_per_tok"),
            moe_intermediate_size: r.required_uint("moe_intermediate_size"),
            n_shared_experts: r.required_uint("n_shared_experts"),
            first_k_dense_replace: r.required_uint("first_k_dense_replace"),
            n_group: r.required_uint("n_group"),
            topk_group: r.required_uint("topk_group"),
            routed_scaling_factor: r.required_float("routed_scaling_factor"),
            norm_topk_prob: r.required_bool("norm_topk_prob"),
        }
    }

    /// The sizes a derived form reduces: (experts, top-k, expert width) as
    /// `reduced`, beside this parent's.
    pub(crate) fn sizes(&self, reduced: [u32; 3]) -> Vec<Size> {
        vec![
            ("n_routed_experts", reduced[0], self.n_routed_experts),
            ("num_experts_per_tok", reduced[1], self.num_experts_per_tok),
            (
                "moe_intermediate_size",
                reduced[2],
                self.moe_intermediate_size,
            ),
        ]
    }

    /// Writes the reduced (experts, top-k, expert width) of [`Self::sizes`].
    pub(crate) fn set_sizes(&mut self, reduced: [u32; 3]) {
        [
            self.n_routed_experts,
            self.num_experts_per_tok,
            self.moe_intermediate_size,
        ] = reduced;
    }

    /// The field of a reduction a check on `field` points at: the expert
    /// sizes at themselves, a layer count at `num_hidden_layers`, the groups
    /// at `n_routed_experts`.
    pub(crate) fn reduced_field(field: &str) -> &str {
        match field {
            "first_k_dense_replace" => "num_hidden_layers",
            "n_group" | "topk_group" => "n_routed_experts",
            field => field,
        }
    }
}
