//! gpt-oss (`gpt_oss.py`) as mlx-lm 0.32.2 runs it: pre-norm layers whose
//! attention has biases on all four projections and a learned sink logit per
//! head (fast SDPA's `sinks`), sliding-window and full layers as `layer_types`
//! lists them, and routed experts in place of the MLP (`MLPBlock`: a biased
//! `router`, top-k of its logits, a precise softmax over the k, SwitchGLU
//! experts with biases and the compiled clamped `swiglu_oai`). The head is an
//! `lm_head` of its own always (the module never ties it).

use crate::dense::{check_dense_sizes, DenseAttention, DenseLayers, DenseMlp, DenseModel};
use crate::diag::{FieldPath, Issue};
use crate::layout_reader::{Layout, Section, QUANTIZATION};
use crate::model::*;
use crate::reduce::{last_key, reduce_key, set_named, sizes_named, Reducible, Size};
use crate::validate;
use crate::yarn::YarnScaling;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod attention_layers;
mod import;
pub use attention_layers::{GptOssAttentionLayers, GptOssLayerType};
pub(crate) use import::FAMILY;

/// A full gpt-oss spec (`identity.family: gpt_oss`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (gpt_oss family)")]
pub struct GptOssSpec {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: Identity,
    /// `tie_word_embeddings` must be false (gpt_oss.py always builds
    /// `lm_head`); `max_position_embeddings` is informational (the module
    /// does not read it).
    pub model: DenseModel,
    pub layers: DenseLayers,
    pub attention: DenseAttention,
    pub attention_layers: GptOssAttentionLayers,
    pub rope: GptOssRope,
    /// `intermediate_size`: the SwiGLU width of each expert.
    pub mlp: DenseMlp,
    pub moe: GptOssExperts,
    /// Weight quantization as the mlx config's `quantization` dict, or null.
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
}

/// RoPE: `initialize_rope(head_dim, rope_theta, traditional=False,
/// scaling_config=rope_scaling)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GptOssRope {
    /// `rope_theta` (the base).
    pub rope_theta: f64,
    /// `rope_scaling` of type `yarn` (rope_utils' `YarnRoPE`), or null for
    /// plain `nn.RoPE`.
    pub scaling: Option<GptOssYarn>,
}

crate::yarn::yarn_section! {
    /// A `yarn` `rope_scaling` entry with every field `YarnRoPE` reads (a
    /// config.json without one takes `YarnRoPE`'s default, noted at import).
    pub struct GptOssYarn {
        /// `factor` (gpt-oss-20b: 32).
        factor,
        /// `mscale_all_dim` (default 0).
        mscale_all_dim,
    }
}

/// The routed experts of every layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GptOssExperts {
    /// `num_local_experts`.
    pub num_local_experts: u32,
    /// `num_experts_per_tok`: the top-k each token is routed to.
    pub num_experts_per_tok: u32,
}

crate::reduce::derived_form! {
    /// A derived gpt-oss spec file: a declared reduction of a gpt_oss spec.
    file GptOssDerivedSpecFile titled "archgen architecture spec (derived gpt_oss form)" for GptOssSpec;

    /// How a derived gpt_oss spec is made from its parent.
    derive GptOssDerive {}

    /// The reduced sizes of a gpt_oss spec; `layer_types` keeps the parent's
    /// first `num_hidden_layers` entries, every other field is inherited.
    reduce GptOssReduce {
        pub intermediate_size: u32,
        pub num_local_experts: u32,
        pub num_experts_per_tok: u32,
        pub sliding_window: u32,
    }
}

/// All semantic errors of a gpt_oss spec (full-spec field paths).
pub(crate) fn check(spec: &GptOssSpec) -> Vec<Issue> {
    let mut c = validate::Checker::for_document(spec, Family::GptOss, &LAYOUT);
    let mt = spec.identity.source.model_type;
    if mt != ConfigModelType::GptOss {
        let hint = "the model_type of a gpt-oss checkpoint is gpt_oss";
        c.foreign_model_type(mt, "gpt_oss", "gpt_oss", hint);
    }
    let (m, a, layers, e) = (&spec.model, &spec.attention, &spec.layers, &spec.moe);
    let width = "SwiGLU width of each expert";
    let mut ok = check_dense_sizes(&mut c, m, layers, a, &spec.mlp, width);
    let hints = [
        "routed experts per layer (gpt-oss-20b: 32)",
        "experts each token is routed to (gpt-oss-20b: 4)",
    ];
    let experts = ("moe.num_local_experts", e.num_local_experts);
    ok &= c.expert_counts(experts, e.num_experts_per_tok, hints);
    if ok {
        ok = c.top_k_of_experts(e.num_experts_per_tok, e.num_local_experts);
    }
    ok &= spec
        .attention_layers
        .check(&mut c, layers.num_hidden_layers);
    c.own_lm_head(m.tie_word_embeddings, "gpt_oss.py");
    c.eps(m.rms_norm_eps, "gpt-oss-20b uses 1.0e-5");
    ok &= c.head_geometry(a.head_dim, a.num_attention_heads, a.num_key_value_heads);
    c.rope_theta(spec.rope.rope_theta, "the RoPE base, e.g. 150000.0");
    if let Some(y) = &spec.rope.scaling {
        let hint =
            "YaRN's scaling (gpt-oss-20b: factor 32, original 4096, beta_fast 32, beta_slow 1)";
        ok &= y.check(
            &mut c,
            [hint; 4],
            "YarnRoPE's mscale terms (defaults 1 and 0)",
        );
    }
    c.finish(ok, spec.quantization.as_ref(), || lower(spec))
}

/// The IR of a valid gpt_oss spec: pre-norm attention layers (biases on q, k,
/// v and o, sinks in fused SDPA, `1 / sqrt(head_dim)`, the window of the
/// layer's type), each with biased routed experts.
pub(crate) fn lower(spec: &GptOssSpec) -> crate::ir::ModelIr {
    use crate::ir::*;
    use crate::ir_parts::*;
    let a = &spec.attention;
    let rope = match &spec.rope.scaling {
        None => plain_rope(spec.rope.rope_theta, false, a.head_dim as usize),
        Some(y) => RopeForm {
            kind: y.kind(spec.rope.rope_theta),
            traditional: false,
            rotated_dims: a.head_dim as usize,
        },
    };
    let attention = Attention {
        bias: ProjectionBias::QueryKeyValueOutput,
        scores: Scores::FusedSdpaWithSinks,
        // `sm_scale = 1 / math.sqrt(head_dim)`: a Python float (a divide of
        // a square root, not `head_dim ** -0.5`).
        scale: AttentionScale::Constant(1.0 / f64::from(a.head_dim).sqrt()),
        ..full_attention(
            a.num_attention_heads,
            a.num_key_value_heads,
            a.head_dim,
            rope,
        )
    };
    let e = &spec.moe;
    let experts = Moe {
        num_experts: e.num_local_experts as usize,
        top_k: e.num_experts_per_tok as usize,
        width: spec.mlp.intermediate_size as usize,
        router: Router::TopKPreciseSoftmax,
        activation: Activation::ClampedSwiglu,
    };
    let al = &spec.attention_layers;
    let layers = al
        .layer_types
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let mixer = Mixer::Attention(Attention {
                window: al.window(kind),
                ..attention.clone()
            });
            let norms = direct_norms(NormArrangement::PreNorm);
            let ffn = FeedForward::BiasedExperts(experts);
            layer(i, norms, mixer, ffn, Residual::Plain)
        })
        .collect();
    plain_model_ir(
        spec,
        // Model.sanitize returns a checkpoint in mlx-lm's layout as it is.
        Vec::new(),
        // gpt_oss.py has a shard(); archgen's split refuses the o_proj
        // bias and the biased experts by name (not split yet).
        ShardOracle::MlxLm,
        layers,
        false, // its own lm_head
    )
}

/// The spec with config.json field names (impl_document! adds `quantization`).
pub(crate) fn config_fields(spec: &GptOssSpec) -> Value {
    let al = &spec.attention_layers;
    let own = json!({
        "intermediate_size": spec.mlp.intermediate_size,
        "head_dim": spec.attention.head_dim,
        "sliding_window": al.sliding_window,
        "layer_types": al.type_names(),
        "rope_theta": spec.rope.rope_theta,
        "rope_scaling": spec.rope.scaling.map(|y| y.config_json("rope_type")),
        "num_local_experts": spec.moe.num_local_experts,
        "num_experts_per_tok": spec.moe.num_experts_per_tok,
    });
    crate::hf::dense_stack_json(spec, own)
}

/// How a gpt_oss document is read (see [`crate::layout_reader`]).
pub(crate) const LAYOUT: Layout = Layout::on_dense_head(
    "gpt_oss",
    "gpt-oss",
    &[
        Section::described::<GptOssAttentionLayers>(
            "attention_layers",
            "a mapping {sliding_window, layer_types}",
            "the window and each layer's kind",
        ),
        Section::described::<GptOssRope>("rope", "a mapping {rope_theta}", "the RoPE base"),
        Section::hinted::<DenseMlp>("mlp", "SwiGLU width of each expert"),
        Section::described::<GptOssExperts>(
            "moe",
            "a mapping {num_local_experts, num_experts_per_tok}",
            "the routed experts",
        ),
        QUANTIZATION,
    ],
);

/// The derived gpt_oss form: the experts' sizes and the window; the layer
/// types cut to the reduced stack.
impl Reducible for GptOssSpec {
    fn other_sizes(r: &GptOssReduce, parent: &Self, _: &mut Vec<Issue>) -> Vec<Size> {
        let mut sizes = crate::reduce::mlp_width(r.intermediate_size, parent.mlp.intermediate_size);
        sizes.extend(sizes_named!(r, parent.moe; num_local_experts, num_experts_per_tok));
        sizes.extend(sizes_named!(r, parent.attention_layers; sliding_window));
        sizes
    }
    fn apply(&mut self, r: &GptOssReduce) {
        self.mlp.intermediate_size = r.intermediate_size;
        set_named!(r, self.moe; num_local_experts, num_experts_per_tok);
        set_named!(r, self.attention_layers; sliding_window);
        let n = self.layers.num_hidden_layers as usize;
        self.attention_layers.layer_types.truncate(n);
    }
    fn reduced_field(path: &str) -> Option<FieldPath> {
        let field = last_key(path);
        let field = match field {
            "layer_types" => "num_hidden_layers",
            other => other,
        };
        Some(reduce_key(field))
    }
}

crate::document::impl_dense_document!(GptOssSpec, check);
