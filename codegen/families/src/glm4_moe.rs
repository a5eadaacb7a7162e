//! GLM-4.5 MoE (`glm4_moe.py`) as mlx-lm 0.32.2 runs it: Qwen3-MoE's stack
//! (the dense `model`, `layers`, `attention` and `mlp` sections, pre-norm
//! layers, SwiGLU experts) with its differences: q/k/v biases and the q/k norms
//! as flags, RoPE over `int(head_dim * partial_rotary_factor)` dims, experts
//! routed by `noaux_tc` with shared experts after `first_k_dense_replace` dense
//! layers (the shared [`NoauxTcExperts`] section), and an lm_head of its own
//! always (the module never ties it).

use crate::dense::{check_dense_sizes, DenseAttention, DenseLayers, DenseMlp, DenseModel};
use crate::diag::{FieldPath, Issue};
use crate::layout_reader::{Layout, Section, QUANTIZATION};
use crate::model::*;
use crate::model_family::ModelFamily;
use crate::noaux_tc::NoauxTcExperts;
use crate::reader::{imported_identity, top_quantization, ImportedSpec, Reader};
use crate::reduce::{last_key, reduce_key, Reducible, Size};
use crate::validate;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// A full GLM-4.5 MoE spec (`identity.family: glm4_moe`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (glm4_moe family)")]
pub struct Glm4MoeSpec {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: Identity,
    /// `tie_word_embeddings` must be false: glm4_moe.py always builds `lm_head`.
    pub model: DenseModel,
    pub layers: DenseLayers,
    pub attention: DenseAttention,
    pub attention_options: Glm4MoeAttentionOptions,
    pub rope: Glm4MoeRope,
    /// The dense SwiGLU MLP of the first `first_k_dense_replace` layers.
    pub mlp: DenseMlp,
    pub moe: NoauxTcExperts,
    /// Weight quantization as the mlx config's `quantization` dict, or null.
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
}

/// What glm4_moe's `Attention` adds to the dense geometry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Glm4MoeAttentionOptions {
    /// `attention_bias`: biases on q_proj, k_proj and v_proj (never o_proj).
    pub attention_bias: bool,
    /// `use_qk_norm`: RMSNorm per head on the queries and keys before RoPE.
    pub use_qk_norm: bool,
}

/// RoPE: `nn.RoPE(int(head_dim * partial_rotary_factor), traditional=False,
/// base=rope_theta)` (`rope_scaling` is accepted and never read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Glm4MoeRope {
    /// `rope_theta` (the base).
    pub rope_theta: f64,
    /// `partial_rotary_factor`: the share of head_dim that rotates.
    pub partial_rotary_factor: f64,
}

crate::reduce::derived_form! {
    /// A derived GLM-4.5 MoE spec file: a declared reduction of a glm4_moe spec.
    file Glm4MoeDerivedSpecFile titled "archgen architecture spec (derived glm4_moe form)" for Glm4MoeSpec;

    /// How a derived glm4_moe spec is made from its parent.
    derive Glm4MoeDerive {}

    /// The reduced sizes of a glm4_moe spec; every other field is inherited.
    reduce Glm4MoeReduce {
        pub intermediate_size: u32,
        pub n_routed_experts: u32,
        pub num_experts_per_tok: u32,
        pub moe_intermediate_size: u32,
    }
}

/// `int(head_dim * partial_rotary_factor)`: Python truncates the float product.
fn rotated_dims(spec: &Glm4MoeSpec) -> u32 {
    (f64::from(spec.attention.head_dim) * spec.rope.partial_rotary_factor) as u32
}

/// All semantic errors of a glm4_moe spec (full-spec field paths).
pub(crate) fn check(spec: &Glm4MoeSpec) -> Vec<Issue> {
    let mut c = validate::Checker::for_document(spec, Family::Glm4Moe, &LAYOUT);
    let hint = "the model_type of a GLM-4.5 MoE checkpoint is glm4_moe";
    c.model_type_is(&spec.identity, ConfigModelType::Glm4Moe, hint);
    let (m, a, layers) = (&spec.model, &spec.attention, &spec.layers);
    let dense = "SwiGLU width of the first_k_dense_replace dense layers";
    let mut ok = check_dense_sizes(&mut c, m, layers, a, &spec.mlp, dense);
    ok &= spec.moe.check(&mut c, layers.num_hidden_layers);
    let (factor, rotated) = (spec.rope.partial_rotary_factor, rotated_dims(spec));
    if !(factor > 0.0 && factor <= 1.0) || rotated == 0 || rotated % 2 != 0 {
        ok = false;
        c.err(
            FieldPath::parse("rope.partial_rotary_factor"),
            format!("{factor} rotates {rotated} of {} dims", a.head_dim),
            "in (0, 1], rotating an even, non-zero number of dims",
            "int(head_dim * partial_rotary_factor) dims rotate (GLM-4.5-Air: 0.5)",
        );
    }
    c.own_lm_head(m.tie_word_embeddings, "glm4_moe.py");
    c.eps(m.rms_norm_eps, "GLM-4.5-Air uses 1.0e-5");
    ok &= c.head_geometry(a.head_dim, a.num_attention_heads, a.num_key_value_heads);
    c.rope_theta(spec.rope.rope_theta, "the RoPE base, e.g. 1000000.0");
    c.finish(ok, spec.quantization.as_ref(), || lower(spec))
}

/// The IR of a valid glm4_moe spec: pre-norm full-attention layers (q/k/v bias
/// and per-head q/k norms by the flags, partial RoPE, `head_dim ** -0.5`), each
/// with the `moe` section's feed-forward half for its index.
pub(crate) fn lower(spec: &Glm4MoeSpec) -> crate::ir::ModelIr {
    use crate::ir::*;
    use crate::ir_parts::*;
    let (a, o) = (&spec.attention, &spec.attention_options);
    let rope = plain_rope(spec.rope.rope_theta, false, rotated_dims(spec) as usize);
    let (heads, kv_heads) = (a.num_attention_heads, a.num_key_value_heads);
    let attention = Attention {
        bias: match o.attention_bias {
            true => ProjectionBias::QueryKeyValue,
            false => ProjectionBias::None,
        },
        qk_norm: match o.use_qk_norm {
            true => QkNorm::RmsPerHead,
            false => QkNorm::None,
        },
        ..full_attention(heads, kv_heads, a.head_dim, rope)
    };
    let norms = direct_norms(NormArrangement::PreNorm);
    let layers = (0..spec.layers.num_hidden_layers)
        .map(|i| {
            let ffn = spec.moe.ffn(i, spec.mlp.intermediate_size);
            let mixer = Mixer::Attention(attention.clone());
            plain_layer(i as usize, norms, mixer, ffn)
        })
        .collect();
    plain_model_ir(
        spec,
        // Model.sanitize: per-expert weights stacked, the MTP layer dropped.
        vec![SanitizeRule::StackExperts, SanitizeRule::DropLayerPastStack],
        ShardOracle::MlxLm,
        layers,
        false, // its own lm_head
    )
}

/// The spec with config.json field names (impl_document! adds `quantization`).
pub(crate) fn config_fields(spec: &Glm4MoeSpec) -> Value {
    let o = &spec.attention_options;
    let mut own = json!({
        "intermediate_size": spec.mlp.intermediate_size,
        "head_dim": spec.attention.head_dim,
        "attention_bias": o.attention_bias,
        "use_qk_norm": o.use_qk_norm,
        "rope_theta": spec.rope.rope_theta,
        "partial_rotary_factor": spec.rope.partial_rotary_factor,
        "rope_scaling": Value::Null,
    });
    spec.moe.add_config_fields(&mut own);
    crate::hf::dense_stack_json(spec, own)
}

/// How a glm4_moe document is read (see [`crate::layout_reader`]).
pub(crate) const LAYOUT: Layout = Layout::on_dense_head(
    "glm4_moe",
    "glm4-moe",
    &[
        Section::described::<Glm4MoeAttentionOptions>(
            "attention_options",
            "a mapping {attention_bias, use_qk_norm}",
            "q/k/v biases and per-head q/k norms",
        ),
        Section::described::<Glm4MoeRope>(
            "rope",
            "a mapping {rope_theta, partial_rotary_factor}",
            "the RoPE base and the share of head_dim that rotates",
        ),
        crate::noaux_tc::DENSE_MLP,
        crate::noaux_tc::MOE,
        QUANTIZATION,
    ],
);

impl Glm4MoeReduce {
    /// The experts' reduced (experts, top-k, expert width).
    fn experts(&self) -> [u32; 3] {
        [
            self.n_routed_experts,
            self.num_experts_per_tok,
            self.moe_intermediate_size,
        ]
    }
}

/// The derived glm4_moe form: the dense MLP's width and the experts' sizes.
impl Reducible for Glm4MoeSpec {
    fn other_sizes(r: &Glm4MoeReduce, parent: &Self, _: &mut Vec<Issue>) -> Vec<Size> {
        let mut sizes = crate::reduce::mlp_width(r.intermediate_size, parent.mlp.intermediate_size);
        sizes.extend(parent.moe.sizes(r.experts()));
        sizes
    }
    fn apply(&mut self, r: &Glm4MoeReduce) {
        self.mlp.intermediate_size = r.intermediate_size;
        self.moe.set_sizes(r.experts());
    }
    fn reduced_field(path: &str) -> Option<FieldPath> {
        Some(reduce_key(NoauxTcExperts::reduced_field(last_key(path))))
    }
}

crate::document::impl_dense_document!(Glm4MoeSpec, check);

/// Imports a `glm4_moe` config.json as mlx-lm 0.32.2's `ModelArgs` reads it:
/// every field is required, `rope_scaling` too (null or not, it is never read).
pub(crate) fn import(top: &Map<String, Value>, name: &str) -> ImportedSpec<Glm4MoeSpec> {
    let mut r = Reader::new(top, "");
    let model = DenseModel {
        hidden_size: r.required_uint("hidden_size"),
        vocab_size: r.required_uint("vocab_size"),
        rms_norm_eps: r.required_float("rms_norm_eps"),
        tie_word_embeddings: r.required_bool("tie_word_embeddings"),
        max_position_embeddings: r.required_uint("max_position_embeddings"),
    };
    let layers = DenseLayers {
        num_hidden_layers: r.required_uint("num_hidden_layers"),
    };
    let attention = DenseAttention {
        num_attention_heads: r.required_uint("num_attention_heads"),
        num_key_value_heads: r.required_uint("num_key_value_heads"),
        head_dim: r.required_uint("head_dim"),
    };
    let attention_options = Glm4MoeAttentionOptions {
        attention_bias: r.required_bool("attention_bias"),
        use_qk_norm: r.required_bool("use_qk_norm"),
    };
    let rope = Glm4MoeRope {
        rope_theta: r.required_float("rope_theta"),
        partial_rotary_factor: r.required_float("partial_rotary_factor"),
    };
    match top.get("rope_scaling") {
        None => r.problem(
            "rope_scaling",
            "missing (ModelArgs requires it; null for none)",
        ),
        Some(Value::Null) => {}
        Some(_) => r.note(
            "rope_scaling",
            Value::Null,
            "ignored: glm4_moe.py never reads it",
        ),
    }
    let mlp = DenseMlp {
        intermediate_size: r.required_uint("intermediate_size"),
    };
    let moe = NoauxTcExperts::read(top, &mut r);
    let quantization = top_quantization(top, &mut r);
    r.build_checked(check, || Glm4MoeSpec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, Family::Glm4Moe, ConfigModelType::Glm4Moe),
        model,
        layers,
        attention,
        attention_options,
        rope,
        mlp,
        moe,
        quantization,
    })
}

/// glm4_moe in the family registry.
pub(crate) const FAMILY: ModelFamily = crate::model_family::single_family!(Glm4Moe, import);
