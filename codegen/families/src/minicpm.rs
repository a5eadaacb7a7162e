//! MiniCPM (`minicpm.py`) as mlx-lm 0.32.2 runs it: Llama's stack (RMSNorm → GQA
//! attention with RoPE → residual → RMSNorm → SwiGLU MLP → residual, no q/k norms,
//! no biases, `head_dim = hidden_size // num_attention_heads`) with three scales:
//! the embedding times `scale_emb`, each residual branch times
//! `scale_depth / num_hidden_layers**0.5`, and the final hidden state divided by
//! `hidden_size / dim_model_base` before an untied `lm_head` (copied from the
//! embedding by `sanitize` when the checkpoint has none).
//!
//! mlx-lm 0.32.2 cannot load a tied MiniCPM (`tie_word_embeddings: true`): its
//! `sanitize` always adds `lm_head.weight`, which a tied model lacks, and the strict
//! load fails. This layout refuses it the same way.
//!
//! Everything family-specific on the spec side lives here: the document, its
//! validation, the lowering to the block IR, the config.json view, the YAML writer,
//! the reduction to tiny variants and the config.json importer.

use crate::dense::{DenseAttention, DenseLayers, DenseMlp, DenseModel};
use crate::dense_sections::RequiredSizes;
use crate::diag::{FieldPath, Issue};
use crate::layout_reader::{Layout, Section, Text, QUANTIZATION};
use crate::model::*;
use crate::model_family::ModelFamily;
use crate::reader::{imported_identity, rope_type, top_quantization, ImportedSpec, Reader};
use crate::reduce::{mlp_width, Reducible, Size};
use crate::validate;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

fn p(s: &str) -> FieldPath {
    FieldPath::parse(s)
}

/// A full MiniCPM spec (`identity.family: minicpm`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (minicpm family)")]
pub struct MiniCpmSpec {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: Identity,
    /// `tie_word_embeddings` must be false (mlx-lm 0.32.2 cannot load a tied MiniCPM).
    pub model: DenseModel,
    pub layers: DenseLayers,
    /// `head_dim` must equal `hidden_size / num_attention_heads` (minicpm.py has no
    /// head_dim field).
    pub attention: DenseAttention,
    pub rope: MiniCpmRope,
    pub mlp: DenseMlp,
    pub scales: MiniCpmScales,
    /// Weight quantization as the mlx config's `quantization` dict, or null.
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
}

/// RoPE: `initialize_rope(head_dim, rope_theta, rope_traditional, rope_scaling)` with
/// `rope_scaling` null (plain `nn.RoPE`); scaled forms are not supported for MiniCPM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MiniCpmRope {
    /// `rope_traditional`.
    pub traditional: bool,
    /// `rope_theta` (the base; mlx-lm's default is 1000000.0).
    pub rope_theta: f64,
}

/// MiniCPM's three scales (muP-style).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MiniCpmScales {
    /// `scale_emb`: the token embedding is multiplied by it (MiniCPM-2B: 12).
    pub scale_emb: f64,
    /// `scale_depth`: each residual branch is multiplied by
    /// `scale_depth / num_hidden_layers**0.5` (MiniCPM-2B: 1.4).
    pub scale_depth: f64,
    /// `dim_model_base`: the final hidden state is divided by
    /// `hidden_size / dim_model_base` before `lm_head` (MiniCPM-2B: 256).
    pub dim_model_base: u32,
}

crate::reduce::derived_form! {
    /// A derived MiniCPM spec file: a declared reduction of a MiniCPM spec.
    file MiniCpmDerivedSpecFile titled "archgen architecture spec (derived minicpm form)" for MiniCpmSpec;

    /// How a derived MiniCPM spec is made from its parent.
    derive MiniCpmDerive {}

    /// The reduced sizes of a MiniCPM spec; everything else (the scales, RoPE) is
    /// inherited. The residual factor follows the reduced `num_hidden_layers`, as mlx-lm
    /// computes it from the config it loads.
    reduce MiniCpmReduce {
        pub intermediate_size: u32,
    }
}

// ---------------------------------------------------------------- validation

/// All semantic errors of a MiniCPM spec (full-spec field paths).
pub(crate) fn check(spec: &MiniCpmSpec) -> Vec<Issue> {
    use validate::limits::*;
    let mut c = validate::Checker::for_document(spec, Family::MiniCpm, &LAYOUT);
    let hint = "the model_type of a MiniCPM checkpoint is minicpm";
    c.model_type_is(&spec.identity, ConfigModelType::MiniCpm, hint);
    let (m, a, s) = (&spec.model, &spec.attention, &spec.scales);
    let mut ok =
        crate::dense::check_dense_sizes(&mut c, m, &spec.layers, a, &spec.mlp, "SwiGLU width");
    ok &= c.range(
        "scales.dim_model_base",
        s.dim_model_base,
        MAX_HIDDEN,
        "the base width of the logit scale (MiniCPM-2B: 256)",
    );
    if m.tie_word_embeddings {
        c.err(
            p("model.tie_word_embeddings"),
            "true, but mlx-lm 0.32.2 cannot load a tied MiniCPM: its sanitize always adds lm_head.weight, which a tied model lacks, and the strict load fails",
            "false",
            "write false: the head is lm_head, taken from embed_tokens when the checkpoint has none (as minicpm.sanitize does)",
        );
    }
    c.eps(m.rms_norm_eps, "MiniCPM-2B uses 1.0e-5");
    ok = crate::dense::check_heads(&mut c, m, a, ok, Some(Family::MiniCpm.as_str()));
    c.rope_theta(spec.rope.rope_theta, "the RoPE base, e.g. 10000.0");
    c.positive_finite(
        "scales.scale_emb",
        s.scale_emb,
        "the embedding multiplier, MiniCPM-2B: 12.0",
    );
    c.positive_finite(
        "scales.scale_depth",
        s.scale_depth,
        "the residual multiplier before / sqrt(num_hidden_layers), MiniCPM-2B: 1.4",
    );
    c.finish(ok, spec.quantization.as_ref(), || lower(spec))
}

// ---------------------------------------------------------------- lowering

/// The IR of a valid MiniCPM spec: Llama's pre-norm layers (no q/k norms, no
/// biases, plain RoPE, `head_dim ** -0.5`, SwiGLU), the embedding times `scale_emb`
/// (`EmbedScale::Constant`), both residual branches times
/// `scale_depth / num_hidden_layers**0.5` (`Residual::DepthScaled`), and the final
/// hidden state divided by `hidden_size / dim_model_base` (`LogitScale::DivideBy`,
/// the Python float of an int / int true division) before the untied `lm_head`.
pub(crate) fn lower(spec: &MiniCpmSpec) -> crate::ir::ModelIr {
    use crate::ir::*;
    use crate::ir_parts::*;
    let a = &spec.attention;
    let head_dim = a.head_dim as usize;
    let n_layers = spec.layers.num_hidden_layers as usize;
    let layers = (0..n_layers)
        .map(|i| {
            layer(
                i,
                direct_norms(NormArrangement::PreNorm),
                Mixer::Attention(full_attention(
                    a.num_attention_heads,
                    a.num_key_value_heads,
                    a.head_dim,
                    plain_rope(spec.rope.rope_theta, spec.rope.traditional, head_dim),
                )),
                FeedForward::Mlp(swiglu(spec.mlp.intermediate_size)),
                Residual::DepthScaled {
                    scale_depth: spec.scales.scale_depth,
                    num_hidden_layers: n_layers,
                },
            )
        })
        .collect();
    model_ir(
        spec,
        ModelParts {
            prefix: ModulePrefix::Model,
            // minicpm.sanitize: lm_head.weight from embed_tokens.weight when absent.
            sanitize: vec![SanitizeRule::CopyEmbeddingToHead],
            // minicpm.py has no shard().
            sharding: whole_head_sharding(ShardOracle::Absent),
            embedding: scaled_embedding(EmbedScale::Constant(spec.scales.scale_emb)),
            layers,
            head: Head {
                // `check` refuses a tied MiniCPM (mlx-lm cannot load one).
                weight: HeadWeight::Untied,
                logit_softcap: None,
                norm: NormWeight::Direct,
                logit_scale: LogitScale::DivideBy(
                    f64::from(spec.model.hidden_size) / f64::from(spec.scales.dim_model_base),
                ),
            },
        },
    )
}

// ---------------------------------------------------------------- config.json view

/// The spec with config.json field names (flat, as minicpm configs are), no
/// `head_dim` (minicpm.py derives it); impl_document! adds `quantization` and
/// sorts the keys.
pub(crate) fn config_fields(spec: &MiniCpmSpec) -> Value {
    let s = &spec.scales;
    // minicpm.py has no head_dim field (hidden_size // heads, checked).
    crate::hf::dense_stack_json(
        spec,
        json!({
            "intermediate_size": spec.mlp.intermediate_size,
            "rope_theta": spec.rope.rope_theta,
            "rope_traditional": spec.rope.traditional,
            "rope_scaling": Value::Null,
            "scale_emb": s.scale_emb,
            "scale_depth": s.scale_depth,
            "dim_model_base": s.dim_model_base,
        }),
    )
}

// ---------------------------------------------------------------- parsing

/// How a minicpm document is read (see [`crate::layout_reader`]).
pub(crate) const LAYOUT: Layout = Layout::on_dense_head("minicpm", "minicpm", &[
    Section::described::<MiniCpmRope>("rope", "a mapping {traditional, rope_theta}", "`rope_traditional`, `rope_theta` (rope_scaling must be null)"),
    Section::of::<DenseMlp>("mlp"),
    Section::described::<MiniCpmScales>("scales", "a mapping {scale_emb, scale_depth, dim_model_base}", "MiniCPM's embedding, residual and logit scales"),
    QUANTIZATION,
])
.with_texts(&[
    Text::Field("scaling", "`traditional` or `rope_theta` (no scaling)", "MiniCPM's RoPE is plain here: rope_scaling must be null (MiniCPM4's longrope, mlx-lm's SuScaledRoPE, is not supported); see docs/spec-format.md#minicpm"),
]);

/// The derived MiniCPM form (see [`crate::reduce`]): the dense form's sizes.
impl Reducible for MiniCpmSpec {
    fn other_sizes(r: &MiniCpmReduce, parent: &Self, _: &mut Vec<Issue>) -> Vec<Size> {
        mlp_width(r.intermediate_size, parent.mlp.intermediate_size)
    }
    fn apply(&mut self, r: &MiniCpmReduce) {
        self.mlp.intermediate_size = r.intermediate_size;
    }
}

crate::document::impl_dense_document!(MiniCpmSpec, check);

// ---------------------------------------------------------------- import

/// Imports a flat `minicpm` config.json as mlx-lm 0.32.2's `ModelArgs` reads it
/// (`minicpm.py`): `hidden_size`, `dim_model_base`, `num_hidden_layers`,
/// `intermediate_size`, `num_attention_heads`, `rms_norm_eps`, `vocab_size`,
/// `num_key_value_heads`, `scale_depth` and `scale_emb` are required; absent
/// `rope_theta` (1000000.0), `rope_traditional` (false) and `tie_word_embeddings`
/// (false) take its defaults and are listed. `rope_scaling` must be null (or of type
/// `default`), `tie_word_embeddings` false.
pub(crate) fn import(top: &Map<String, Value>, name: &str) -> ImportedSpec<MiniCpmSpec> {
    let mut r = Reader::new(top, "");
    let sizes = RequiredSizes::read(&mut r);
    let dim_model_base = r.required_uint("dim_model_base");
    let num_kv = r.required_uint("num_key_value_heads");
    let scale_depth = r.required_float("scale_depth");
    let scale_emb = r.required_float("scale_emb");
    // ModelArgs defaults max_position_embeddings to None and reads it only for
    // scaled RoPE forms; the layout records it, so it must be written.
    let max_pos = match r.get("max_position_embeddings").cloned() {
        Some(v) => r.uint_of("max_position_embeddings", &v),
        None => {
            r.problem(
                "max_position_embeddings",
                "missing: archgen's minicpm layout records it (mlx-lm defaults it to None and reads it only for scaled RoPE); write the model's context length",
            );
            0
        }
    };
    let rope_theta = r.float("rope_theta", 1_000_000.0);
    let traditional = r.boolean("rope_traditional", false);
    let tie = r.boolean("tie_word_embeddings", false);
    if tie {
        r.problem(
            "tie_word_embeddings",
            "true: mlx-lm 0.32.2 cannot load a tied MiniCPM (its sanitize always adds lm_head.weight, which a tied model lacks, and the strict load fails); set it to false, the head is then lm_head (taken from embed_tokens when the checkpoint has none)",
        );
    }
    let head_dim = r.head_dim_of_module_without_it(
        sizes.hidden_size,
        sizes.num_heads,
        Family::MiniCpm.as_str(),
    );
    if let Some(s) = r.get("rope_scaling").cloned() {
        let kind = s.as_object().map_or("default", rope_type);
        if kind != "default" {
            r.problem(
                "rope_scaling",
                &format!("rope_type `{kind}` is not supported for minicpm (MiniCPM-2B has none; MiniCPM4's longrope is mlx-lm's SuScaledRoPE, which archgen does not have): only null or `default`"),
            );
        }
    }
    let quantization = top_quantization(top, &mut r);
    r.build_checked(check, || MiniCpmSpec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, Family::MiniCpm, ConfigModelType::MiniCpm),
        model: sizes.model(tie, max_pos),
        layers: sizes.layers(),
        attention: sizes.attention(num_kv, head_dim),
        rope: MiniCpmRope {
            traditional,
            rope_theta,
        },
        mlp: DenseMlp {
            intermediate_size: sizes.intermediate_size,
        },
        scales: MiniCpmScales {
            scale_emb,
            scale_depth,
            dim_model_base,
        },
        quantization,
    })
}

/// MiniCPM in the family registry.
pub(crate) const FAMILY: ModelFamily = crate::model_family::single_family!(MiniCpm, import);
