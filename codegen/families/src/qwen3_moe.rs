//! Qwen3-MoE (`qwen3_moe.py`) as mlx-lm 0.32.2 runs it: Qwen3's attention (q/k
//! RMSNorm per head, plain RoPE), pre-norm layers, and a feed-forward half that is
//! either routed SwiGLU experts (`Qwen3MoeSparseMoeBlock`: softmax over every expert,
//! top-k of the probabilities, optional renormalization, `SwitchGLU`) or a dense SwiGLU
//! MLP, by `mlp_only_layers` and `decoder_sparse_step`.
//!
//! Everything family-specific on the spec side lives here: the document, its
//! validation, the lowering to the block IR, the config.json view, the YAML writer,
//! the reduction to tiny variants and the config.json importer.

use crate::dense::{DenseAttention, DenseLayers, DenseMlp, DenseModel};
use crate::dense_sections::RequiredSizes;
use crate::diag::{FieldPath, Issue};
use crate::layout_reader::{Layout, Section, QUANTIZATION};
use crate::model::*;
use crate::model_family::ModelFamily;
use crate::reader::{imported_identity, top_quantization, ImportedSpec, Reader};
use crate::reduce::{last_key, mlp_width, reduce_key, set_named, sizes_named, Reducible, Size};
use crate::validate::{self, ranges};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

fn p(s: &str) -> FieldPath {
    FieldPath::parse(s)
}

/// A full Qwen3-MoE spec (`identity.family: qwen3_moe`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (qwen3_moe family)")]
pub struct Qwen3MoeSpec {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: Identity,
    pub model: DenseModel,
    pub layers: DenseLayers,
    pub attention: DenseAttention,
    pub rope: Qwen3MoeRope,
    /// The dense SwiGLU MLP of the layers that are not MoE.
    pub mlp: DenseMlp,
    pub moe: Qwen3MoeExperts,
    /// Weight quantization as the mlx config's `quantization` dict, or null.
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
}

/// RoPE: `nn.RoPE(head_dim, traditional=False, base=rope_theta)` (mlx-lm's qwen3_moe
/// accepts `rope_scaling` and does not read it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Qwen3MoeRope {
    /// `rope_theta` (the base).
    pub rope_theta: f64,
}

/// The routed experts and which layers have them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Qwen3MoeExperts {
    /// `num_experts` (at least 1; 0 would make every layer dense).
    pub num_experts: u32,
    /// `num_experts_per_tok`: the top-k each token is routed to.
    pub num_experts_per_tok: u32,
    /// `moe_intermediate_size`: the SwiGLU width of each expert.
    pub moe_intermediate_size: u32,
    /// `norm_topk_prob`: renormalize the k chosen probabilities to sum to 1.
    pub norm_topk_prob: bool,
    /// `decoder_sparse_step`: layer i is MoE when `(i + 1) % step == 0` (and it is not
    /// in `mlp_only_layers`).
    pub decoder_sparse_step: u32,
    /// `mlp_only_layers`: layers that keep the dense MLP.
    pub mlp_only_layers: Vec<u32>,
}

crate::reduce::derived_form! {
    /// A derived Qwen3-MoE spec file: a declared reduction of a Qwen3-MoE spec.
    file Qwen3MoeDerivedSpecFile titled "archgen architecture spec (derived qwen3_moe form)" for Qwen3MoeSpec;

    /// How a derived Qwen3-MoE spec is made from its parent.
    derive Qwen3MoeDerive {}

    /// The reduced sizes of a Qwen3-MoE spec; everything else (norm_topk_prob,
    /// decoder_sparse_step, mlp_only_layers) is inherited.
    reduce Qwen3MoeReduce {
        pub intermediate_size: u32,
        pub num_experts: u32,
        pub num_experts_per_tok: u32,
        pub moe_intermediate_size: u32,
    }
}

// ---------------------------------------------------------------- layers

/// Whether layer `i` is MoE, by `Qwen3MoeDecoderLayer.__init__`:
/// `i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0`.
pub(crate) fn is_moe_layer(spec: &Qwen3MoeSpec, i: u32) -> bool {
    let m = &spec.moe;
    !m.mlp_only_layers.contains(&i)
        && m.num_experts > 0
        && m.decoder_sparse_step > 0
        && (i + 1) % m.decoder_sparse_step == 0
}

// ---------------------------------------------------------------- validation

/// All semantic errors of a Qwen3-MoE spec (full-spec field paths).
pub(crate) fn check(spec: &Qwen3MoeSpec) -> Vec<Issue> {
    use validate::limits::*;
    let mut c = validate::Checker::for_document(spec, Family::Qwen3Moe, &LAYOUT);
    let hint = "the model_type of a Qwen3-MoE checkpoint is qwen3_moe";
    c.model_type_is(&spec.identity, ConfigModelType::Qwen3Moe, hint);
    let (m, a, e) = (&spec.model, &spec.attention, &spec.moe);
    let mut ok = crate::dense::check_dense_sizes(
        &mut c,
        m,
        &spec.layers,
        a,
        &spec.mlp,
        "SwiGLU width of the dense layers",
    );
    let hints = [
        "routed experts per MoE layer (Qwen3-30B-A3B: 128)",
        "experts each token is routed to (Qwen3-30B-A3B: 8)",
    ];
    let experts = ("moe.num_experts", e.num_experts);
    ok &= c.expert_counts(experts, e.num_experts_per_tok, hints);
    ok &= ranges! { c;
        "moe.moe_intermediate_size": e.moe_intermediate_size => MAX_INTERMEDIATE, "SwiGLU width of each expert";
        "moe.decoder_sparse_step": e.decoder_sparse_step => MAX_LAYERS, "every step-th layer is MoE (1: every layer)";
    };
    if ok {
        ok = c.top_k_of_experts(e.num_experts_per_tok, e.num_experts);
    }
    let n = spec.layers.num_hidden_layers;
    let mut seen = std::collections::BTreeSet::new();
    for (j, &l) in e.mlp_only_layers.iter().enumerate() {
        let path = p("moe.mlp_only_layers").index(j);
        if l >= n {
            ok = false;
            c.err(
                path,
                format!("layer {l} does not exist ({n} layers)"),
                format!("a layer index in 0..{n}"),
                "mlp_only_layers lists the layers that keep the dense MLP",
            );
        } else if !seen.insert(l) {
            ok = false;
            c.err(
                path,
                format!("layer {l} is listed twice"),
                "each layer at most once",
                "remove the repeated index",
            );
        }
    }
    if ok && (0..n).all(|i| !is_moe_layer(spec, i)) {
        c.err(
            p("moe.mlp_only_layers"),
            "no layer is MoE (every layer is in mlp_only_layers or off the decoder_sparse_step)",
            "at least one MoE layer",
            "a model without MoE layers is a dense qwen3 model: write it with family qwen3",
        );
    }
    c.eps(m.rms_norm_eps, "Qwen3-MoE uses 1.0e-6");
    ok &= c.head_geometry(a.head_dim, a.num_attention_heads, a.num_key_value_heads);
    c.rope_theta(spec.rope.rope_theta, "the RoPE base, e.g. 1000000.0");
    c.finish(ok, spec.quantization.as_ref(), || lower(spec))
}

// ---------------------------------------------------------------- lowering

/// The IR of a valid Qwen3-MoE spec: Qwen3's pre-norm attention layers (q/k RMSNorm
/// per head, plain RoPE, `head_dim ** -0.5`), each with routed SwiGLU experts
/// (`FeedForward::Moe`, softmax-then-top-k router) or, on `mlp_only_layers` and
/// off the `decoder_sparse_step`, a dense SwiGLU MLP.
pub(crate) fn lower(spec: &Qwen3MoeSpec) -> crate::ir::ModelIr {
    use crate::ir::*;
    use crate::ir_parts::*;
    let a = &spec.attention;
    let head_dim = a.head_dim as usize;
    let e = &spec.moe;
    let layers = (0..spec.layers.num_hidden_layers)
        .map(|i| {
            plain_layer(
                i as usize,
                direct_norms(NormArrangement::PreNorm),
                Mixer::Attention(Attention {
                    qk_norm: QkNorm::RmsPerHead,
                    ..full_attention(
                        a.num_attention_heads,
                        a.num_key_value_heads,
                        a.head_dim,
                        plain_rope(spec.rope.rope_theta, false, head_dim),
                    )
                }),
                if is_moe_layer(spec, i) {
                    FeedForward::Moe(softmax_topk_experts(
                        e.num_experts,
                        e.num_experts_per_tok,
                        e.moe_intermediate_size,
                        e.norm_topk_prob,
                    ))
                } else {
                    FeedForward::Mlp(swiglu(spec.mlp.intermediate_size))
                },
            )
        })
        .collect();
    plain_model_ir(
        spec,
        // Qwen3MoeModel.sanitize: the tied head popped, per-expert HF weights stacked.
        vec![SanitizeRule::DropTiedHead, SanitizeRule::StackExperts],
        // qwen3_moe.py's shard().
        ShardOracle::MlxLm,
        layers,
        spec.model.tie_word_embeddings,
    )
}

// ---------------------------------------------------------------- config.json view

/// The spec with config.json field names (flat, as qwen3_moe configs are)
/// (impl_document! adds `quantization` and sorts the keys).
pub(crate) fn config_fields(spec: &Qwen3MoeSpec) -> Value {
    let e = &spec.moe;
    crate::hf::dense_stack_json(
        spec,
        json!({
            "intermediate_size": spec.mlp.intermediate_size,
            "head_dim": spec.attention.head_dim,
            "rope_theta": spec.rope.rope_theta,
            "rope_scaling": Value::Null,
            "num_experts": e.num_experts,
            "num_experts_per_tok": e.num_experts_per_tok,
            "moe_intermediate_size": e.moe_intermediate_size,
            "norm_topk_prob": e.norm_topk_prob,
            "decoder_sparse_step": e.decoder_sparse_step,
            "mlp_only_layers": e.mlp_only_layers,
        }),
    )
}

// ---------------------------------------------------------------- parsing

/// How a qwen3_moe document is read (see [`crate::layout_reader`]).
pub(crate) const LAYOUT: Layout = Layout::on_dense_head("qwen3_moe", "qwen3-moe", &[
    Section::described::<Qwen3MoeRope>("rope", "a mapping {rope_theta}", "`rope_theta` (qwen3_moe ignores rope_scaling)"),
    Section::hinted::<DenseMlp>("mlp", "SwiGLU width of the dense layers"),
    Section::described::<Qwen3MoeExperts>("moe", "a mapping {num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers}", "the routed experts"),
    QUANTIZATION,
],
);

/// The derived Qwen3-MoE form (see [`crate::reduce`]): the dense form's sizes and
/// the experts'.
impl Reducible for Qwen3MoeSpec {
    fn other_sizes(r: &Qwen3MoeReduce, parent: &Self, _: &mut Vec<Issue>) -> Vec<Size> {
        let mut sizes = mlp_width(r.intermediate_size, parent.mlp.intermediate_size);
        sizes.extend(sizes_named!(r, parent.moe;
            num_experts,
            num_experts_per_tok,
            moe_intermediate_size,
        ));
        sizes
    }
    fn apply(&mut self, r: &Qwen3MoeReduce) {
        self.mlp.intermediate_size = r.intermediate_size;
        set_named!(r, self.moe; num_experts, num_experts_per_tok, moe_intermediate_size);
    }
    /// A size check is on the reduced field of the same name; a reduced size the
    /// parent's structure does not fit (an `mlp_only_layers` entry past the last
    /// layer) points at `num_hidden_layers`.
    fn reduced_field(path: &str) -> Option<FieldPath> {
        let field = last_key(path);
        let field = match field.strip_prefix("mlp_only_layers") {
            Some(_) => "num_hidden_layers",
            None => field.split('[').next().unwrap_or(field),
        };
        Some(reduce_key(field))
    }
}

crate::document::impl_dense_document!(Qwen3MoeSpec, check);

// ---------------------------------------------------------------- import

/// Imports a flat `qwen3_moe` config.json as mlx-lm 0.32.2's `ModelArgs` reads it
/// (`qwen3_moe.py`): every field it reads is required (the dataclass has no defaults
/// but `rope_scaling`, which it accepts and never reads).
pub(crate) fn import(top: &Map<String, Value>, name: &str) -> ImportedSpec<Qwen3MoeSpec> {
    let mut r = Reader::new(top, "");
    let sizes = RequiredSizes::read(&mut r);
    let num_experts = r.required_uint("num_experts");
    let top_k = r.required_uint("num_experts_per_tok");
    let sparse_step = r.required_uint("decoder_sparse_step");
    let mlp_only_layers = match r.get("mlp_only_layers").cloned() {
        None => {
            r.problem(
                "mlp_only_layers",
                "missing (mlx-lm qwen3_moe.py requires it; [] for none)",
            );
            Vec::new()
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| r.uint_of("mlp_only_layers", v))
            .collect(),
        Some(other) => {
            r.problem(
                "mlp_only_layers",
                &format!("expected a list of layer indices, found {other}"),
            );
            Vec::new()
        }
    };
    let moe_width = r.required_uint("moe_intermediate_size");
    let num_kv = r.required_uint("num_key_value_heads");
    let head_dim = r.required_uint("head_dim");
    let rope_theta = r.required_float("rope_theta");
    let tie = r.required_bool("tie_word_embeddings");
    let max_pos = r.required_uint("max_position_embeddings");
    let norm_topk_prob = r.required_bool("norm_topk_prob");
    if r.get("rope_scaling").is_some_and(|v| !v.is_null()) {
        r.note(
            "rope_scaling",
            Value::Null,
            "ignored: mlx-lm 0.32.2 qwen3_moe.py builds nn.RoPE(head_dim, base=rope_theta) without it",
        );
    }
    let quantization = top_quantization(top, &mut r);
    r.build_checked(check, || Qwen3MoeSpec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, Family::Qwen3Moe, ConfigModelType::Qwen3Moe),
        model: sizes.model(tie, max_pos),
        layers: sizes.layers(),
        attention: sizes.attention(num_kv, head_dim),
        rope: Qwen3MoeRope { rope_theta },
        mlp: DenseMlp {
            intermediate_size: sizes.intermediate_size,
        },
        moe: Qwen3MoeExperts {
            num_experts,
            num_experts_per_tok: top_k,
            moe_intermediate_size: moe_width,
            norm_topk_prob,
            decoder_sparse_step: sparse_step,
            mlp_only_layers,
        },
        quantization,
    })
}

/// Qwen3-MoE in the family registry.
pub(crate) const FAMILY: ModelFamily = crate::model_family::single_family!(Qwen3Moe, import);
