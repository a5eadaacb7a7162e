//! The dense decoder families, as mlx-lm 0.32.2 runs them: Llama (`llama.py`,
//! also Mistral) and the families whose math is Llama's plus a difference,
//! one file each: Qwen3 (q/k RMSNorm per head), Qwen2 (a bias on q, k and v),
//! SmolLM3 (no RoPE on every `no_rope_layer_interval`-th layer), Granite
//! (embedding, attention, residual and logit multipliers), Phi-3 (fused
//! `qkv_proj` and `gate_up_proj`) and OLMo-2 (norms after the mixer and the
//! MLP, q/k norms over the whole projection).
//!
//! All share one document layout ([`DenseSpec`]) and one stack (RMSNorm → GQA
//! attention with RoPE → residual → RMSNorm → SwiGLU MLP → residual). This
//! module holds what they share: the document, its validation, the lowering,
//! the config.json view and importer, the YAML writer and the derived form,
//! each reading the family's [`DenseVariant`]: Llama's ([`llama::LLAMA`]) or a
//! family's difference from it, written as `DenseVariant { .., ..LLAMA }` in
//! the family's own file.

mod granite;
mod llama;
mod olmo2;
mod phi3;
mod qwen2;
mod qwen3;
mod smollm3;

pub use crate::dense_sections::{DenseAttention, DenseLayers, DenseMlp, DenseModel};

pub use granite::GraniteScales;

use crate::dense_sections::RequiredSizes;
use crate::diag::{FieldPath, Issue};
use crate::ir::{
    GateUpProjection, NormArrangement, ProjectionBias, QkNorm, QkvProjection, SanitizeRule,
    ShardOracle,
};
use crate::layout_reader::{Layout, Section, Text, QUANTIZATION};
use crate::model::*;
use crate::model_family::{ConfigJson, ModelFamily};
use crate::reader::{
    imported_identity, rope_type, top_quantization, ImportError, ImportedSpec, Reader, ABSENT,
};
use crate::reduce::{mlp_width, DerivedFile, Reducible, Size, Stack};
use crate::validate;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

fn p(s: &str) -> FieldPath {
    FieldPath::parse(s)
}

/// A full dense-family spec (`identity.family: qwen3 | llama | qwen2`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (dense family: qwen3, llama, qwen2)")]
pub struct DenseSpec {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: Identity,
    pub model: DenseModel,
    pub layers: DenseLayers,
    pub attention: DenseAttention,
    pub rope: DenseRope,
    pub mlp: DenseMlp,
    /// Granite only (required there): its four multipliers. Absent on the other
    /// dense families.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scales: Option<GraniteScales>,
    /// Weight quantization as the mlx config's `quantization` dict, or null.
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
    /// mlx-optiq per-layer mixed-precision KV (`kv_config.json` as `install_mixed_kv`
    /// applies it; tier L2), or null. The one section that may be left out (absent
    /// means null), so specs written before it read unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_kv: Option<crate::MixedKv>,
}

/// A family of the dense layout: what its mlx-lm module does, as facts and
/// hooks that the shared code reads. Llama's ([`llama::LLAMA`]) is the
/// parent; every other family is written as its difference from it.
pub(crate) struct DenseVariant {
    pub(crate) family: Family,
    /// The config.json `model_type`s its module reads.
    pub(crate) model_types: &'static [ConfigModelType],
    // The lowering's facts.
    pub(crate) qk_norm: QkNorm,
    pub(crate) bias: ProjectionBias,
    pub(crate) qkv: QkvProjection,
    pub(crate) gate_up: GateUpProjection,
    pub(crate) arrangement: NormArrangement,
    /// The module's `sanitize`, as rules.
    pub(crate) sanitize: &'static [SanitizeRule],
    /// Whether the module has a `shard()` to compare a sharded run with.
    pub(crate) shard_oracle: ShardOracle,
    // What the spec and config.json hold.
    pub(crate) head_dim: HeadDim,
    pub(crate) rope_traditional: RopeTraditional,
    pub(crate) config: ConfigReading,
    // Checks of the sections only some families have (each family's own
    // rule where it has the section, a refusal where it does not).
    pub(crate) check_no_rope_interval: fn(&DenseSpec, &mut validate::Checker),
    pub(crate) check_scales: fn(&DenseSpec, &mut validate::Checker),
    pub(crate) check_rope_scaling: fn(&DenseSpec, &mut validate::Checker),
    /// Writes the family's own fields into its config.json view.
    pub(crate) hf_own_fields: fn(&DenseSpec, &mut Value),
}

/// Where `head_dim` comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HeadDim {
    /// A config field without a default (qwen3.py).
    Required,
    /// A config field, `hidden_size // num_attention_heads` when absent (llama.py).
    Optional,
    /// Always `hidden_size // num_attention_heads`: the module has no such
    /// field, so a spec's must be that quotient and the view leaves it out.
    HiddenOverHeads,
}

/// Whether the module reads `rope_traditional`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RopeTraditional {
    Read,
    /// Never read (always `traditional=False`); `hint` answers a spec with true.
    AlwaysFalse {
        hint: &'static str,
    },
}

/// How the module's `ModelArgs` reads a config.json beyond the fields every
/// dense module requires.
pub(crate) struct ConfigReading {
    pub(crate) kv_heads: KvHeads,
    pub(crate) max_position_embeddings: ConfigDefault<u32>,
    pub(crate) tie_word_embeddings: ConfigDefault<bool>,
    pub(crate) bias_flags: BiasFlags,
    pub(crate) rope: ConfigRope,
    /// `rope_scaling` (present, an object) as the module reads it.
    pub(crate) read_scaling: fn(&Map<String, Value>, &mut Reader) -> Option<RopeScaling>,
    /// The module's other fields, read after `attention_bias` / `mlp_bias`.
    pub(crate) read_extras: fn(&mut Reader),
    /// The sections only some families have, read after `rope_scaling`.
    pub(crate) read_own_sections: fn(&mut Reader, u32) -> OwnSections,
}

/// A `ModelArgs` field's default.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ConfigDefault<T> {
    /// No default: mlx-lm fails without it.
    Required,
    Value(T),
}

/// `num_key_value_heads`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KvHeads {
    Required,
    /// `num_attention_heads` when absent.
    SameAsHeads,
}

/// `attention_bias` and `mlp_bias`; true is refused where they are read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BiasFlags {
    NotRead,
    /// False when absent.
    Optional,
    Required,
}

/// Where `rope_theta` and `rope_scaling` are read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ConfigRope {
    /// Top-level fields only; `rope_parameters` is noted as ignored.
    Flat(ConfigDefault<f64>),
    /// Top-level fields, else transformers >= 5's `rope_parameters`
    /// (qwen3.py); `rope_theta` is required.
    FlatOrParameters,
}

/// The dense sections only some families have, as read from config.json.
#[derive(Debug, Default)]
pub(crate) struct OwnSections {
    pub(crate) no_rope_layer_interval: Option<u32>,
    pub(crate) scales: Option<GraniteScales>,
}

/// Every family of the layout, in the order their model types were added.
const VARIANTS: [&DenseVariant; 7] = [
    &qwen3::QWEN3,
    &llama::LLAMA,
    &qwen2::QWEN2,
    &smollm3::SMOLLM3,
    &granite::GRANITE,
    &phi3::PHI3,
    &olmo2::OLMO2,
];

/// The variant of `family`, or None for a family with a layout of its own.
fn variant_of(family: Family) -> Option<&'static DenseVariant> {
    VARIANTS.into_iter().find(|v| v.family == family)
}

/// Whether `family` is one of the dense layout's (the others have layouts
/// of their own).
pub(crate) fn is_dense(family: Family) -> bool {
    variant_of(family).is_some()
}

impl DenseSpec {
    /// The family the document is read as. `check` refuses every family
    /// without a variant, so every loaded or imported spec has one; a spec
    /// built in code with another (never validated) reads as Llama, the plain
    /// stack.
    pub(crate) fn variant(&self) -> &'static DenseVariant {
        variant_of(self.identity.family).unwrap_or(&llama::LLAMA)
    }
}

/// RoPE: `rope_theta`, `rope_traditional` and `rope_scaling`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DenseRope {
    /// `rope_traditional` (Llama only; Qwen3 always rotates halves, so false).
    pub traditional: bool,
    /// `rope_theta` (the base).
    pub rope_theta: f64,
    /// `rope_scaling`, or null for plain RoPE.
    #[serde(deserialize_with = "explicit")]
    pub scaling: Option<RopeScaling>,
    /// SmolLM3 only (required there): `no_rope_layer_interval`. Layer `i` has no
    /// RoPE when `(i + 1) % interval == 0` (mlx-lm's `no_rope_layers` default).
    /// Absent on the other dense families.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_rope_layer_interval: Option<u32>,
}

/// A `rope_scaling` entry, by `rope_type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "rope_type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RopeScaling {
    /// `Llama3RoPE` (Llama-3.1/3.2).
    Llama3 {
        /// `factor`: low frequencies are divided by it.
        factor: f64,
        /// `low_freq_factor` (mlx-lm default 1.0).
        low_freq_factor: f64,
        /// `high_freq_factor` (mlx-lm default 4.0).
        high_freq_factor: f64,
        /// `original_max_position_embeddings` (mlx-lm default 8192).
        original_max_position_embeddings: u32,
    },
}

crate::reduce::derived_form! {
    /// A derived dense spec file: a declared reduction of a dense spec.
    file DenseDerivedSpecFile titled "archgen architecture spec (derived dense form)" for DenseSpec;

    /// How a derived dense spec is made from its parent.
    derive DenseDerive {
        /// mlx-optiq per-layer mixed KV of the derived spec (never inherited); may be left
        /// out (absent means null).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub mixed_kv: Option<crate::MixedKv>,
    }

    /// The reduced sizes of a dense spec; everything else is inherited.
    reduce DenseReduce {
        pub intermediate_size: u32,
    }
}

// ---------------------------------------------------------------- validation

/// All semantic errors of a dense spec (full-spec field paths).
pub(crate) fn check(spec: &DenseSpec) -> Vec<Issue> {
    let mut c = validate::Checker::default();
    c.header(spec.format_version, &spec.identity);
    let family = spec.identity.family;
    if !is_dense(family) {
        c.err(
            p("identity.family"),
            format!("`{}` is not a dense family", family.as_str()),
            "qwen3, llama, qwen2, smollm3, granite or phi3",
            "a Gemma-4 spec has the gemma4 layout (docs/spec-format.md)",
        );
    }
    let variant = spec.variant();
    (variant.check_no_rope_interval)(spec, &mut c);
    (variant.check_scales)(spec, &mut c);
    let mt = spec.identity.source.model_type;
    if mt.family() != family {
        c.foreign_model_type(
            mt,
            family.as_str(),
            family.as_str(),
            "the model_type must be one its family's module reads (qwen3 → qwen3, llama → llama or mistral, qwen2 → qwen2, smollm3 → smollm3, granite → granite, phi3 → phi3)",
        );
    }
    let (m, a) = (&spec.model, &spec.attention);
    let mut ok = check_dense_sizes(&mut c, m, &spec.layers, a, &spec.mlp, "SwiGLU width");
    c.eps(m.rms_norm_eps, "Qwen3 uses 1.0e-6, Llama-3.2 1.0e-5");
    let head_dim_derived = match variant.head_dim {
        HeadDim::HiddenOverHeads => true,
        HeadDim::Required | HeadDim::Optional => false,
    };
    ok = check_heads(&mut c, m, a, ok, head_dim_derived.then(|| family.as_str()));
    match (variant.rope_traditional, spec.rope.traditional) {
        (RopeTraditional::AlwaysFalse { hint }, true) => c.err(
            p("rope.traditional"),
            format!(
                "true, but mlx-lm's {}.py always uses traditional=False",
                family.as_str()
            ),
            "false",
            hint,
        ),
        (RopeTraditional::AlwaysFalse { .. }, false) | (RopeTraditional::Read, _) => {}
    }
    c.rope_theta(spec.rope.rope_theta, "the RoPE base, e.g. 500000.0");
    (variant.check_rope_scaling)(spec, &mut c);
    if let Some(RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    }) = &spec.rope.scaling
    {
        for (name, v) in [
            ("factor", *factor),
            ("low_freq_factor", *low_freq_factor),
            ("high_freq_factor", *high_freq_factor),
        ] {
            c.positive_finite(
                &format!("rope.scaling.{name}"),
                v,
                "Llama-3.2 uses factor 32, low 1, high 4",
            );
        }
        if high_freq_factor <= low_freq_factor {
            c.err(
                p("rope.scaling.high_freq_factor"),
                format!("{high_freq_factor} is not above low_freq_factor {low_freq_factor}"),
                "high_freq_factor > low_freq_factor",
                "the smoothing divides by high_freq_factor - low_freq_factor",
            );
        }
        if *original_max_position_embeddings == 0 {
            c.err(
                p("rope.scaling.original_max_position_embeddings"),
                "0 is out of range",
                "a positive integer",
                "Llama-3 uses 8192",
            );
        }
    }
    if ok && c.issues.is_empty() {
        if let Some(q) = &spec.quantization {
            validate::check_quantization(q, &lower(spec), &mut c.issues);
        }
        if let Some(m) = &spec.mixed_kv {
            c.issues.extend(crate::mixed_kv::check(m, &lower(spec)));
        }
    }
    c.issues
}

/// The size limits of a dense `model` section and the layer count; false
/// when one is off.
pub(crate) fn check_model_sizes(
    c: &mut validate::Checker,
    m: &DenseModel,
    num_hidden_layers: u32,
) -> bool {
    c.model_sizes(
        (m.hidden_size, m.vocab_size, num_hidden_layers),
        (m.max_position_embeddings, MAX_POSITIONS_MEANING),
    )
}

/// What `model.max_position_embeddings` is, in its range message.
const MAX_POSITIONS_MEANING: &str = "`max_position_embeddings` from config.json";

/// The size limits of the sections every layout built on the dense ones
/// shares (`model`, `layers`, `attention`, `mlp`); false when one is off.
pub(crate) fn check_dense_sizes(
    c: &mut validate::Checker,
    m: &DenseModel,
    layers: &DenseLayers,
    a: &DenseAttention,
    mlp: &DenseMlp,
    mlp_meaning: &str,
) -> bool {
    c.stack_sizes(
        &Stack::of(layers.num_hidden_layers, m, a),
        (m.max_position_embeddings, MAX_POSITIONS_MEANING),
        (mlp.intermediate_size, mlp_meaning),
    )
}

/// The heads of the dense attention: an even `head_dim`, the quotient
/// [`check_quotient_head_dim`] when the sizes so far hold (`ok`) and the module
/// (`quotient_of`) has no `head_dim` field, and K/V heads that divide the
/// query heads; whether the sizes still hold.
pub(crate) fn check_heads(
    c: &mut validate::Checker,
    m: &DenseModel,
    a: &DenseAttention,
    ok: bool,
    quotient_of: Option<&str>,
) -> bool {
    let ok = ok & c.even_head_dim("attention.head_dim", a.head_dim);
    if let (true, Some(module)) = (ok, quotient_of) {
        check_quotient_head_dim(c, m, a, module);
    }
    ok & c.grouped(a.num_attention_heads, a.num_key_value_heads)
}

/// `attention.head_dim` of a module without a `head_dim` field (`module.py`
/// always uses `hidden_size // num_attention_heads`): it must be that quotient.
fn check_quotient_head_dim(
    c: &mut validate::Checker,
    m: &DenseModel,
    a: &DenseAttention,
    module: &str,
) {
    if u64::from(a.head_dim) * u64::from(a.num_attention_heads) != u64::from(m.hidden_size) {
        c.err(
            p("attention.head_dim"),
            format!(
                "{} with hidden_size {} and {} heads, but mlx-lm's {module}.py always uses hidden_size // num_attention_heads",
                a.head_dim, m.hidden_size, a.num_attention_heads
            ),
            "hidden_size == head_dim * num_attention_heads",
            format!("{module} has no head_dim field: make hidden_size a multiple of the heads and head_dim the quotient"),
        );
    }
}

// The dense sections' sizes as the reduction reads and writes them (the
// layouts built from dense sections share them).
impl Stack {
    /// The sizes of the sections the dense-built layouts share.
    pub(crate) fn of(num_hidden_layers: u32, m: &DenseModel, a: &DenseAttention) -> Stack {
        Stack {
            num_hidden_layers,
            hidden_size: m.hidden_size,
            vocab_size: m.vocab_size,
            num_attention_heads: a.num_attention_heads,
            num_key_value_heads: a.num_key_value_heads,
            head_dim: a.head_dim,
        }
    }
}

/// Llama's answer to `rope.no_rope_layer_interval`, which only smollm3.py
/// reads: refused where set.
fn refuse_no_rope_interval(spec: &DenseSpec, c: &mut validate::Checker) {
    if spec.rope.no_rope_layer_interval.is_some() {
        c.err(
            p("rope.no_rope_layer_interval"),
            format!(
                "set, but mlx-lm's {}.py rotates every layer",
                spec.identity.family.as_str()
            ),
            "no such field",
            "only smollm3 has layers without RoPE; remove the field",
        );
    }
}

/// Llama's answer to a `scales` section, which only granite.py reads:
/// refused where set.
fn refuse_scales(spec: &DenseSpec, c: &mut validate::Checker) {
    if spec.scales.is_some() {
        c.err(
            p("scales"),
            format!(
                "set, but mlx-lm's {}.py has no multipliers",
                spec.identity.family.as_str()
            ),
            "no such section",
            "only granite scales its embedding, scores, residuals and logits; remove the section",
        );
    }
}

// ---------------------------------------------------------------- lowering

/// The IR of a valid dense spec: Llama's layers (pre-norm, full causal
/// attention at `head_dim ** -0.5`, SwiGLU, no embedding scale) with the
/// family's facts from its [`DenseVariant`], Granite's multipliers from its
/// `scales` and SmolLM3's NoPE layers from its interval.
pub(crate) fn lower(spec: &DenseSpec) -> crate::ir::ModelIr {
    use crate::ir::*;
    use crate::ir_parts::*;
    let a = &spec.attention;
    let head_dim = a.head_dim as usize;
    let theta = spec.rope.rope_theta as f32;
    let kind = match &spec.rope.scaling {
        None => RopeKind::Default { theta },
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => RopeKind::Llama3 {
            theta,
            factor: *factor,
            low_freq_factor: *low_freq_factor,
            high_freq_factor: *high_freq_factor,
            original_max_position_embeddings: *original_max_position_embeddings as f64,
        },
    };
    let variant = spec.variant();
    // Granite's multipliers (a spec built in code without them reads as
    // unscaled; `check` requires them on every loaded granite spec).
    let (embed_scale, scale, residual, logit_scale) = match &spec.scales {
        Some(g) => (
            EmbedScale::Constant(g.embedding_multiplier),
            AttentionScale::Constant(g.attention_multiplier),
            Residual::Scaled {
                multiplier: g.residual_multiplier,
            },
            LogitScale::DivideLogitsBy(g.logits_scaling),
        ),
        None => (
            EmbedScale::None,
            AttentionScale::InvSqrtHeadDim,
            Residual::Plain,
            LogitScale::None,
        ),
    };
    let layers = (0..spec.layers.num_hidden_layers as usize)
        .map(|i| {
            layer(
                i,
                direct_norms(variant.arrangement),
                Mixer::Attention(Attention {
                    bias: variant.bias,
                    qk_norm: variant.qk_norm,
                    scale,
                    projection: variant.qkv,
                    ..full_attention(
                        a.num_attention_heads,
                        a.num_key_value_heads,
                        a.head_dim,
                        // smollm3's `NoPE` layers: the rope module returns its input.
                        RopeForm {
                            kind: if spec.rope.rotates(i) {
                                kind
                            } else {
                                RopeKind::NoPe
                            },
                            traditional: spec.rope.traditional,
                            rotated_dims: head_dim,
                        },
                    )
                }),
                FeedForward::Mlp(GatedMlp {
                    projection: variant.gate_up,
                    ..swiglu(spec.mlp.intermediate_size)
                }),
                residual,
            )
        })
        .collect();
    model_ir(
        spec,
        ModelParts {
            prefix: ModulePrefix::Model,
            sanitize: variant.sanitize.to_vec(),
            sharding: whole_head_sharding(variant.shard_oracle),
            embedding: scaled_embedding(embed_scale),
            layers,
            head: Head {
                logit_scale,
                ..plain_head(spec.model.tie_word_embeddings)
            },
        },
    )
}

// ---------------------------------------------------------------- config.json view

fn scaling_json(s: &Option<RopeScaling>) -> Value {
    match s {
        None => Value::Null,
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
    }
}

/// The spec with config.json field names (flat, as the dense configs are), as
/// the family's module names them (impl_document! adds `quantization` and sorts the keys).
pub(crate) fn config_fields(spec: &DenseSpec) -> Value {
    let mut v = crate::hf::dense_stack_json(
        spec,
        json!({
            "intermediate_size": spec.mlp.intermediate_size,
            "head_dim": spec.attention.head_dim,
            "rope_theta": spec.rope.rope_theta,
            "rope_scaling": scaling_json(&spec.rope.scaling),
        }),
    );
    let variant = spec.variant();
    match variant.head_dim {
        // No head_dim field (hidden_size // heads, checked).
        HeadDim::HiddenOverHeads => {
            if let Some(o) = v.as_object_mut() {
                o.remove("head_dim");
            }
        }
        HeadDim::Required | HeadDim::Optional => {}
    }
    match variant.rope_traditional {
        RopeTraditional::Read => v["rope_traditional"] = json!(spec.rope.traditional),
        RopeTraditional::AlwaysFalse { .. } => {}
    }
    match variant.config.bias_flags {
        BiasFlags::Optional | BiasFlags::Required => {
            v["attention_bias"] = json!(false);
            v["mlp_bias"] = json!(false);
        }
        BiasFlags::NotRead => {}
    }
    (variant.hf_own_fields)(spec, &mut v);
    v
}

// ---------------------------------------------------------------- parsing

/// How a dense document is read (see [`crate::layout_reader`]).
pub(crate) const LAYOUT: Layout = Layout::on_dense_head("dense", "dense-families", &[
    Section::described::<DenseRope>("rope", "a mapping {traditional, rope_theta, scaling}", "`rope_theta`, `rope_traditional`, `rope_scaling`"),
    Section::of::<DenseMlp>("mlp"),
    Section::optional::<GraniteScales>("scales"),
    QUANTIZATION,
    Section::optional::<crate::MixedKv>("mixed_kv"),
])
.with_texts(&[
    Text::Field("layers", "a mapping {num_hidden_layers}", "every dense layer is full attention; see docs/spec-format.md#dense-families"),
    Text::Field("scaling", "null or {rope_type: llama3, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings}", "`rope_scaling` from config.json; null for plain RoPE"),
]);

/// The derived dense form (see [`crate::reduce`]): the stack's sizes and the MLP width.
impl Reducible for DenseSpec {
    /// The dense form also sets its own mixed KV (never inherited).
    fn derived(parent: &Self, file: &DerivedFile<DenseReduce>) -> Self {
        let mut spec = parent.clone();
        spec.identity.name = file.identity.name.clone();
        spec.quantization = file.derive.quantization.clone();
        spec.mixed_kv = file.derive.mixed_kv.clone();
        spec
    }
    fn other_sizes(r: &DenseReduce, parent: &Self, _: &mut Vec<Issue>) -> Vec<Size> {
        mlp_width(r.intermediate_size, parent.mlp.intermediate_size)
    }
    fn apply(&mut self, r: &DenseReduce) {
        self.mlp.intermediate_size = r.intermediate_size;
    }
}

crate::document::impl_dense_document!(DenseSpec, check, with mixed_kv);

// ---------------------------------------------------------------- import

/// Imports a flat config.json of one of the dense layout's model types with
/// mlx-lm 0.32.2's `ModelArgs` defaults, as `variant` states them (its
/// module, `rope_utils.py`; `mistral` is read by `llama.py`).
pub(crate) fn import(
    top: &Map<String, Value>,
    model_type: ConfigModelType,
    variant: &DenseVariant,
    name: &str,
) -> ImportedSpec<DenseSpec> {
    let module = variant.family.as_str();
    let config = &variant.config;
    let mut r = Reader::new(top, "");
    let sizes = RequiredSizes::read(&mut r);
    let (hidden_size, num_heads) = (sizes.hidden_size, sizes.num_heads);
    let num_kv = match config.kv_heads {
        KvHeads::Required => r.required_uint("num_key_value_heads"),
        KvHeads::SameAsHeads => r.uint("num_key_value_heads", num_heads),
    };
    let head_dim = match variant.head_dim {
        HeadDim::Required => r.required_uint("head_dim"),
        HeadDim::Optional => r.head_dim_or_quotient(
            hidden_size,
            num_heads,
            "absent: mlx-lm uses hidden_size // num_attention_heads",
        ),
        HeadDim::HiddenOverHeads => r.head_dim_of_module_without_it(hidden_size, num_heads, module),
    };
    let max_pos = match config.max_position_embeddings {
        ConfigDefault::Required => r.required_uint("max_position_embeddings"),
        ConfigDefault::Value(d) => r.uint("max_position_embeddings", d),
    };
    let tie = match config.tie_word_embeddings {
        ConfigDefault::Required => r.required_bool("tie_word_embeddings"),
        ConfigDefault::Value(d) => r.boolean("tie_word_embeddings", d),
    };
    let traditional = match variant.rope_traditional {
        RopeTraditional::Read => r.boolean("rope_traditional", false),
        RopeTraditional::AlwaysFalse { .. } => false,
    };
    // A bias would also sit on o_proj and the MLP, which the dense blocks do
    // not have.
    for flag in ["attention_bias", "mlp_bias"] {
        let biased = match config.bias_flags {
            BiasFlags::NotRead => false,
            BiasFlags::Optional => r.boolean(flag, false),
            BiasFlags::Required => r.required_bool(flag),
        };
        if biased {
            r.problem(flag, "true: archgen's dense blocks have no bias terms yet");
        }
    }
    (config.read_extras)(&mut r);
    // rope_theta / rope_scaling, with transformers >= 5's rope_parameters where
    // the module reads it (qwen3.py does; llama.py does not).
    let params = top.get("rope_parameters").filter(|v| !v.is_null()).cloned();
    let theta = match (r.get("rope_theta").cloned(), config.rope) {
        (Some(v), _) => v.as_f64().unwrap_or_else(|| {
            r.problem("rope_theta", &format!("expected a number, found {v}"));
            0.0
        }),
        (None, ConfigRope::FlatOrParameters) => {
            match params
                .as_ref()
                .and_then(|pr| pr.get("rope_theta"))
                .and_then(Value::as_f64)
            {
                Some(t) => {
                    r.note(
                        "rope_theta",
                        json!(t),
                        "absent: read from rope_parameters.rope_theta",
                    );
                    t
                }
                None => {
                    r.problem("rope_theta", "missing (mlx-lm qwen3.py raises without it)");
                    0.0
                }
            }
        }
        (None, ConfigRope::Flat(ConfigDefault::Value(d))) => {
            r.note("rope_theta", json!(d), ABSENT);
            d
        }
        (None, ConfigRope::Flat(ConfigDefault::Required)) => {
            r.required_float("rope_theta");
            0.0
        }
    };
    let scaling_src = match (r.get("rope_scaling").cloned(), config.rope, &params) {
        (Some(s), _, _) => Some(s),
        (None, ConfigRope::FlatOrParameters, Some(pr)) => Some(pr.clone()),
        (None, ConfigRope::FlatOrParameters, None) | (None, ConfigRope::Flat(_), _) => None,
    };
    match (config.rope, &params) {
        (ConfigRope::Flat(_), Some(_)) => r.note(
            "rope_parameters",
            Value::Null,
            &format!("ignored: mlx-lm 0.32.2's {module}.py reads rope_theta / rope_scaling only"),
        ),
        (ConfigRope::Flat(_), None) | (ConfigRope::FlatOrParameters, _) => {}
    }
    let scaling = match scaling_src {
        None => None,
        Some(Value::Object(obj)) => (config.read_scaling)(&obj, &mut r),
        Some(s) => {
            r.problem(
                "rope_scaling",
                &format!("expected an object or null, found {s}"),
            );
            None
        }
    };
    let own = (config.read_own_sections)(&mut r, sizes.num_layers);
    let quantization = top_quantization(top, &mut r);
    r.build_checked(check, || DenseSpec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, variant.family, model_type),
        model: sizes.model(tie, max_pos),
        layers: sizes.layers(),
        attention: sizes.attention(num_kv, head_dim),
        rope: DenseRope {
            traditional,
            rope_theta: theta,
            scaling,
            no_rope_layer_interval: own.no_rope_layer_interval,
        },
        mlp: DenseMlp {
            intermediate_size: sizes.intermediate_size,
        },
        scales: own.scales,
        quantization,
        mixed_kv: None,
    })
}

/// `rope_scaling` as `initialize_rope` reads it: `type` or `rope_type`.
fn read_scaling(obj: &Map<String, Value>, r: &mut Reader) -> Option<RopeScaling> {
    match rope_type(obj) {
        "default" => None,
        "llama3" => {
            let mut sr = Reader::new(obj, "rope_scaling.");
            let factor = sr.required_float("factor");
            let low = sr.float("low_freq_factor", 1.0);
            let high = sr.float("high_freq_factor", 4.0);
            let original = sr.uint("original_max_position_embeddings", 8192);
            r.absorb(sr);
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: original,
            })
        }
        other => {
            r.problem(
                "rope_scaling",
                &format!("rope_type `{other}` is not supported yet (default and llama3 are)"),
            );
            None
        }
    }
}

/// The families of the dense layout in the family registry: the model types
/// of every variant.
pub(crate) const FAMILY: ModelFamily = ModelFamily {
    reads: |t| VARIANTS.iter().any(|v| v.model_types.contains(&t)),
    kv_config: crate::model_family::GEMMA4_ONLY,
    import: import_config,
};

/// A dense config.json, imported with the variant of its model type's family.
fn import_config(c: &ConfigJson) -> crate::model_family::Imported {
    let Some(variant) = variant_of(c.model_type.family()) else {
        return Err(ImportError {
            problems: vec![format!(
                "model_type: `{}` is not read by the dense layout",
                c.model_type.as_str()
            )],
        });
    };
    import(c.top, c.model_type, variant, c.name)
        .map(|(s, applied)| (crate::Spec::Dense(s), applied))
}
