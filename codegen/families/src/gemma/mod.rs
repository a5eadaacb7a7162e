//! The Gemma-2 layout (`gemma2.py`) as mlx-lm 0.32.2 runs it, and the families
//! written as a difference from it: the document, its validation, the lowering
//! to the block IR, the config.json view, the YAML writer, the reduction to tiny
//! variants and the config.json importer, each reading the family's
//! [`GemmaVariant`] (Gemma-2's, [`gemma2::GEMMA2`], is the parent).
//!
//! mlx-lm's gemma2 is a stack of sandwich-normed layers with `(1 + w)` RMSNorm weights,
//! written-out attention (queries pre-scaled by `query_pre_attn_scalar ** -0.5`, scores
//! soft-capped, a precise softmax), a GeLU-approx MLP, an embedding scaled by
//! `sqrt(hidden)`, a head always tied to the embedding, and an eager softcap of the
//! logits. It has no sliding window: every layer attends over the full causal context
//! with a plain `KVCache` (the Hugging Face config's `sliding_window` is not read).

mod gemma2;
mod gemma3_text;

use crate::dense::{DenseDerivedSpecFile, DenseReduce};
use crate::dense_sections::RequiredSizes;
use crate::diag::{FieldPath, Issue};
use crate::ir::{AttentionScale, EmbedScale, QkNorm, Residual, SanitizeRule};
use crate::layout_reader::Layout;
use crate::model::*;
use crate::model_family::{KvConfig, ModelFamily};
use crate::reader::{imported_identity, top_quantization, ImportError, ImportedSpec, Reader};
use crate::reduce::{last_key, mlp_width, reduce_key, DerivedForm, Reducible, Size, StackSections};
use crate::validate;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

fn p(s: &str) -> FieldPath {
    FieldPath::parse(s)
}

/// A family of the Gemma-2 layout: what its mlx-lm module does, as facts and
/// hooks the shared code reads. Gemma-2's ([`gemma2::GEMMA2`]) is the parent;
/// another family is written as `GemmaVariant { .., ..GEMMA2 }`.
pub(crate) struct GemmaVariant {
    pub(crate) family: Family,
    /// The config.json `model_type`s its module reads, each with how its
    /// checkpoint holds the text model.
    pub(crate) model_types: &'static [(ConfigModelType, Packaging)],
    /// How its document is read (the texts name its fields).
    pub(crate) layout: Layout,
    // The lowering's facts.
    pub(crate) qk_norm: QkNorm,
    /// SDPA's scale from `query_pre_attn_scalar`, as the module computes it.
    pub(crate) attention_scale: fn(f64) -> AttentionScale,
    /// What the embedding is multiplied by, from `hidden_size`.
    pub(crate) embed_scale: fn(u32) -> EmbedScale,
    /// The module's `sanitize`, as rules.
    pub(crate) sanitize: &'static [SanitizeRule],
    /// How the decoder layer adds its branches to the residual stream.
    pub(crate) residual: Residual,
    /// The module's `ModelArgs` defaults.
    pub(crate) defaults: ConfigDefaults,
    /// The module's `ModelArgs` defaults of the sizes (none where it has
    /// none: each is then required).
    pub(crate) size_defaults: &'static [(&'static str, SizeDefault)],
    // What the module reads beyond Gemma-2's fields, and what it drops.
    pub(crate) softcaps: Softcaps,
    pub(crate) layering: Layering,
    pub(crate) rope: RopeBases,
    /// Why `tie_word_embeddings: false` is refused at import.
    pub(crate) untied_head: &'static str,
}

/// How a `model_type`'s checkpoint holds the text model.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Packaging {
    /// config.json is the text model's own and its tensors are `model.*`.
    Flat,
    /// A multimodal wrapper (`gemma3.py`): the text model's config under
    /// `text_config`, its tensors under `language_model.` beside a vision
    /// tower and a projector, which its `sanitize` drops.
    Wrapped(WrapperArgs),
}

/// What a wrapper's `ModelArgs.__post_init__` writes into `text_config`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WrapperArgs {
    /// The wrapper's own `vocab_size` default; its value (given or default)
    /// overwrites `text_config`'s.
    pub(crate) vocab_size: u32,
    /// `num_attention_heads` where `text_config` has none.
    pub(crate) num_attention_heads: u32,
    /// `num_key_value_heads` where `text_config` has none.
    pub(crate) num_key_value_heads: u32,
}

/// A `ModelArgs` default of a size field, as config.json would spell it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SizeDefault {
    Uint(u32),
    Float(f64),
}

impl SizeDefault {
    fn to_json(self) -> Value {
        match self {
            SizeDefault::Uint(n) => json!(n),
            SizeDefault::Float(x) => json!(x),
        }
    }
}

impl GemmaVariant {
    /// How a checkpoint of `model_type` holds the text model (`Flat` for a
    /// type the variant does not read: `check` refuses those).
    pub(crate) fn packaging(&self, model_type: ConfigModelType) -> Packaging {
        self.model_types
            .iter()
            .find(|(t, _)| *t == model_type)
            .map_or(Packaging::Flat, |&(_, packaging)| packaging)
    }

    /// The `model_type` of the text model itself (a wrapper's `text_config`).
    fn text_model_type(&self) -> ConfigModelType {
        self.model_types
            .iter()
            .find(|(_, packaging)| matches!(packaging, Packaging::Flat))
            .map_or(self.model_types[0].0, |&(t, _)| t)
    }
}

/// Whether the module soft-caps the scores and the logits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Softcaps {
    /// `tanh(x / c) * c` on both, unconditionally: both required and
    /// positive, with these `ModelArgs` defaults (attention, logits).
    Applied { attention: f64, logits: f64 },
    /// Neither: both null in a spec, ignored in config.json.
    Absent,
}

/// Which layers attend over a sliding window.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Layering {
    /// Every layer full attention with a `KVCache`; `sliding_window` and
    /// `sliding_window_pattern` are not read.
    AllFull,
    /// Layer `i` is full when `i % pattern == pattern - 1` (a `KVCache`), else
    /// it attends over the last `sliding_window` positions (a
    /// `RotatingKVCache`): the `ModelArgs` defaults of the two.
    SlidingPattern { window: u32, pattern: u32 },
}

/// Which RoPE bases the module reads.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RopeBases {
    /// `rope_theta` on every layer; `rope_traditional` read.
    One,
    /// `rope_local_base_freq` (this default) on sliding layers, `rope_theta`
    /// and `rope_scaling` on full ones; `traditional=False` always.
    LocalAndGlobal { local_base_default: f64 },
}

/// `ModelArgs` defaults of the fields a Gemma module reads.
pub(crate) struct ConfigDefaults {
    pub(crate) rope_theta: f64,
    pub(crate) query_pre_attn_scalar: f64,
    /// `max_position_embeddings` when config.json has none, and why.
    pub(crate) max_position_embeddings: (u32, &'static str),
}

/// Every family of the layout, in the order their model types were added.
const VARIANTS: [&GemmaVariant; 2] = [&gemma2::GEMMA2, &gemma3_text::GEMMA3_TEXT];

/// The variant of `family`, if it has the Gemma-2 layout (a document
/// declaring it is read with the variant's layout).
pub(crate) fn variant_of(family: Family) -> Option<&'static GemmaVariant> {
    VARIANTS.into_iter().find(|v| v.family == family)
}

impl Gemma2Spec {
    /// The family the document is read as: `check` refuses a family without a
    /// variant, so a loaded spec has one; one built in code reads as Gemma-2.
    pub(crate) fn variant(&self) -> &'static GemmaVariant {
        variant_of(self.identity.family).unwrap_or(&gemma2::GEMMA2)
    }
}

/// A full Gemma-2 spec (`identity.family: gemma2`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (gemma2)")]
pub struct Gemma2Spec {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: Identity,
    pub model: Gemma2Model,
    pub layers: Gemma2Layers,
    pub attention: Gemma2Attention,
    pub rope: Gemma2Rope,
    pub mlp: Gemma2Mlp,
    /// Weight quantization as the mlx config's `quantization` dict, or null.
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
}

/// Model-wide dimensions and numerics. The head is always the tied embedding
/// (mlx-lm's gemma2 has no `lm_head` and no `tie_word_embeddings` field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gemma2Model {
    /// `hidden_size`.
    pub hidden_size: u32,
    /// `vocab_size`.
    pub vocab_size: u32,
    /// `rms_norm_eps` of every RMSNorm (each applies `1 + weight`).
    pub rms_norm_eps: f64,
    /// `final_logit_softcapping`: `tanh(logits / c) * c`, eager (mlx-lm default 30.0);
    /// null where the module has no softcap (gemma3_text).
    #[serde(deserialize_with = "explicit")]
    pub final_logit_softcapping: Option<f64>,
    /// `max_position_embeddings` (informational: mlx-lm's gemma2 does not read it).
    pub max_position_embeddings: u32,
}

/// The decoder stack: every layer is full (causal) attention with a plain KV cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gemma2Layers {
    /// `num_hidden_layers`.
    pub num_hidden_layers: u32,
    /// gemma3_text only (required there): `sliding_window`, the positions a
    /// sliding layer sees (its `RotatingKVCache`'s size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<u32>,
    /// gemma3_text only (required there): layer `i` is full attention when
    /// `i % sliding_window_pattern == sliding_window_pattern - 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_pattern: Option<u32>,
}

/// Grouped-query attention, written out with a softcap of the scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gemma2Attention {
    /// `num_attention_heads`.
    pub num_attention_heads: u32,
    /// `num_key_value_heads`.
    pub num_key_value_heads: u32,
    /// `head_dim`.
    pub head_dim: u32,
    /// `query_pre_attn_scalar`: queries are multiplied by `1.0 / query_pre_attn_scalar ** 0.5`
    /// (mlx-lm default 144.0).
    pub query_pre_attn_scalar: f64,
    /// `attn_logit_softcapping`: scores become `tanh(s / c) * c` (mlx-lm default 50.0);
    /// null where the module has no softcap (gemma3_text: fused SDPA).
    #[serde(deserialize_with = "explicit")]
    pub attn_logit_softcapping: Option<f64>,
}

/// RoPE: `nn.RoPE(head_dim, traditional, base=rope_theta)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gemma2Rope {
    /// `rope_traditional` (mlx-lm default false).
    pub traditional: bool,
    /// `rope_theta` (mlx-lm default 10000), of the full layers.
    pub rope_theta: f64,
    /// gemma3_text only (required there): `rope_local_base_freq`, the base of
    /// the sliding layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_local_base_freq: Option<f64>,
    /// gemma3_text only: `rope_scaling` of the full layers; absent for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<GemmaRopeScaling>,
}

/// A `rope_scaling` entry a Gemma module applies, by `rope_type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "rope_type", rename_all = "snake_case", deny_unknown_fields)]
pub enum GemmaRopeScaling {
    /// `nn.RoPE(..., scale=1 / factor)` (rope_utils' `linear`).
    Linear {
        /// `factor`: positions are divided by it.
        factor: f64,
    },
}

/// The MLP: `down(gelu_approx(gate(x)) * up(x))`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gemma2Mlp {
    /// `intermediate_size`.
    pub intermediate_size: u32,
}

// ---------------------------------------------------------------- validation

/// All semantic errors of a Gemma-2 spec (full-spec field paths).
pub(crate) fn check(spec: &Gemma2Spec) -> Vec<Issue> {
    let mut c = validate::Checker::default();
    c.header(spec.format_version, &spec.identity);
    let variant = spec.variant();
    let family = variant.family.as_str();
    if spec.identity.family != variant.family {
        c.err(
            p("identity.family"),
            format!("`{}` in a {family} document", spec.identity.family.as_str()),
            family,
            "each family has its own layout (docs/spec-format.md)",
        );
    }
    let mt = spec.identity.source.model_type;
    if !variant.model_types.iter().any(|(t, _)| *t == mt) {
        c.foreign_model_type(
            mt,
            family,
            family,
            &format!("a {family} spec describes a `model_type: {family}` checkpoint"),
        );
    }
    let (m, a) = (&spec.model, &spec.attention);
    let mut ok = c.stack_sizes(
        &spec.stack(),
        (
            m.max_position_embeddings,
            "`max_position_embeddings` from config.json (8192 for Gemma-2)",
        ),
        (spec.mlp.intermediate_size, "GeLU-approx MLP width"),
    );
    c.eps(m.rms_norm_eps, "Gemma-2 uses 1.0e-6");
    ok &= c.head_geometry(a.head_dim, a.num_attention_heads, a.num_key_value_heads);
    c.rope_theta(spec.rope.rope_theta, "the RoPE base; Gemma-2 uses 10000.0");
    c.positive_finite(
        "attention.query_pre_attn_scalar",
        a.query_pre_attn_scalar,
        "queries are multiplied by 1 / sqrt of it; Gemma-2 2b and 9b use 256.0",
    );
    check_softcap(
        &mut c,
        variant,
        "attention.attn_logit_softcapping",
        a.attn_logit_softcapping,
        "mlx-lm divides the scores by it unconditionally; Gemma-2 uses 50.0",
    );
    check_softcap(
        &mut c,
        variant,
        "model.final_logit_softcapping",
        m.final_logit_softcapping,
        "mlx-lm divides the logits by it unconditionally; Gemma-2 uses 30.0",
    );
    ok &= check_layering(&mut c, spec);
    check_rope_bases(&mut c, spec);
    c.finish(ok, spec.quantization.as_ref(), || lower(spec))
}

/// A softcap as the family's module applies it: a positive number, or null.
fn check_softcap(
    c: &mut validate::Checker,
    v: &GemmaVariant,
    path: &str,
    cap: Option<f64>,
    hint: &str,
) {
    let family = v.family.as_str();
    match (v.softcaps, cap) {
        (Softcaps::Applied { .. }, Some(cap)) => {
            c.positive_finite(path, cap, hint);
        }
        (Softcaps::Applied { .. }, None) => c.err(
            p(path),
            format!("null, but mlx-lm's {family} applies this softcap unconditionally"),
            "a positive number",
            hint,
        ),
        (Softcaps::Absent, None) => {}
        (Softcaps::Absent, Some(_)) => c.err(
            p(path),
            format!("a softcap, but mlx-lm's {family} applies none"),
            "null",
            "write null: the module would not apply it (docs/spec-format.md#gemma-3)",
        ),
    }
}

/// The sliding-window fields: none, or both with the pattern's rules.
fn check_layering(c: &mut validate::Checker, spec: &Gemma2Spec) -> bool {
    let l = &spec.layers;
    let family = spec.variant().family.as_str();
    let fields = [
        ("layers.sliding_window", l.sliding_window),
        ("layers.sliding_window_pattern", l.sliding_window_pattern),
    ];
    let mut ok = true;
    for (path, value) in fields {
        match (spec.variant().layering, value) {
            (Layering::AllFull, None) => {}
            (Layering::AllFull, Some(_)) => c.err(
                p(path),
                format!("mlx-lm's {family} has no sliding window"),
                "no such field",
                "every layer is full attention with a plain KV cache (docs/spec-format.md#gemma-2)",
            ),
            (Layering::SlidingPattern { .. }, Some(n)) if n > 0 => {}
            (Layering::SlidingPattern { .. }, _) => {
                ok = false;
                c.err(
                    p(path),
                    format!("missing or 0, but every {family} spec states its sliding layers"),
                    "a positive integer (Gemma 3: sliding_window 512, sliding_window_pattern 6)",
                    "write it under `layers` (docs/spec-format.md#gemma-3)",
                );
            }
        }
    }
    if let (true, Some(pattern)) = (ok, l.sliding_window_pattern) {
        if l.num_hidden_layers < pattern {
            ok = false;
            c.err(
                p("layers.num_hidden_layers"),
                format!("{} layers with sliding_window_pattern {pattern}, but mlx-lm's {family} takes the full layers' mask from layer {} (an IndexError below it)", l.num_hidden_layers, pattern - 1),
                format!("at least {pattern} layers"),
                "keep at least one full pattern of layers, or make the pattern shorter",
            );
        }
    }
    ok
}

/// The RoPE fields only some families read.
fn check_rope_bases(c: &mut validate::Checker, spec: &Gemma2Spec) {
    let (r, family) = (&spec.rope, spec.variant().family.as_str());
    match spec.variant().rope {
        RopeBases::One => {
            let own = [
                (
                    "rope.rope_local_base_freq",
                    r.rope_local_base_freq.is_some(),
                ),
                ("rope.scaling", r.scaling.is_some()),
            ];
            for (path, _) in own.into_iter().filter(|(_, present)| *present) {
                c.err(
                    p(path),
                    format!("mlx-lm's {family} does not read it"),
                    "no such field",
                    "every layer has one plain RoPE of base rope_theta (docs/spec-format.md#gemma-2)",
                );
            }
        }
        RopeBases::LocalAndGlobal { .. } => {
            match r.rope_local_base_freq {
                Some(base) => {
                    c.positive_finite("rope.rope_local_base_freq", base, "the sliding layers' RoPE base; Gemma 3 uses 10000.0");
                }
                None => c.err(
                    p("rope.rope_local_base_freq"),
                    format!("missing, but the sliding layers of a {family} spec take their own RoPE base"),
                    "a positive number (Gemma 3: 10000.0)",
                    "write it under `rope` (docs/spec-format.md#gemma-3)",
                ),
            }
            if r.traditional {
                c.err(
                    p("rope.traditional"),
                    format!("true, but mlx-lm's {family} always uses traditional=False"),
                    "false",
                    "the module does not read rope_traditional (docs/spec-format.md#gemma-3)",
                );
            }
            if let Some(GemmaRopeScaling::Linear { factor }) = r.scaling {
                c.positive_finite(
                    "rope.scaling.factor",
                    factor,
                    "positions are divided by it; Gemma 3 4b/12b/27b use 8.0",
                );
            }
        }
    }
}

// ---------------------------------------------------------------- lowering

/// The IR of a valid spec of the layout, fact for fact from `gemma2.py` (a
/// variant's own facts, for gemma3_text, after the list):
///
/// * every RMSNorm (the four of a layer's sandwich and the final one) applies
///   `1.0 + weight` (`NormWeight::OnePlus`);
/// * the embedding times `hidden_size ** 0.5` (a weak scalar);
/// * attention: no q/k/v norm, `nn.RoPE(head_dim, traditional, base)`, queries times
///   `1.0 / query_pre_attn_scalar ** 0.5`, scores soft-capped and masked with the
///   dtype's minimum, precise softmax (`Scores::Softcapped`); full causal attention on
///   every layer with a plain cache (no `make_cache`: mlx-lm gives each layer a
///   `KVCache`, and `sliding_window` is not a `ModelArgs` field);
/// * the MLP `down(nn.gelu_approx(gate) * up)`: mlx nn compiles `gelu_approx` and
///   multiplies eagerly (`Activation::GeluApproxThenMultiply`), where Gemma-4 compiles
///   both in `geglu`. The CPU gives the same bits either way; MLX's CUDA backend does
///   not (on an H200, Gemma-2 left mlx-lm from the first prefill row while it ran
///   Gemma-4's fused form, docs/parity.md "On the GPU");
/// * the head tied to the embedding, then `tanh(x / c) * c` run eagerly
///   (`SoftcapForm::Eager`, not Gemma-4's compiled `logit_softcap`).
///
/// There is no `sanitize`: mlx-lm loads gemma2 checkpoints strictly, so no rule applies.
///
/// A variant changes what its module does differently: the q/k norm, the attention
/// and embedding scales and the sanitize rules from its [`GemmaVariant`]; without
/// softcaps the scores go through fused SDPA and the logits are not capped; with a
/// sliding-window pattern the sliding layers attend over `sliding_window` with
/// `rope_local_base_freq`, the full ones take `rope_theta` and the linear scaling.
pub(crate) fn lower(spec: &Gemma2Spec) -> crate::ir::ModelIr {
    use crate::ir::*;
    use crate::ir_parts::*;
    let (a, r, variant) = (&spec.attention, &spec.rope, spec.variant());
    let head_dim = a.head_dim as usize;
    // The sliding layers and their window, when the spec has them.
    let sliding = |i: usize| match (
        spec.layers.sliding_window,
        spec.layers.sliding_window_pattern,
    ) {
        (Some(window), Some(pattern)) if (i + 1) % pattern as usize != 0 => Some(window as usize),
        _ => None,
    };
    let rope = |i: usize| match (sliding(i), r.rope_local_base_freq, &r.scaling) {
        (Some(_), Some(local), _) => plain_rope(local, r.traditional, head_dim),
        (_, _, Some(GemmaRopeScaling::Linear { factor })) => RopeForm {
            kind: RopeKind::Linear {
                theta: r.rope_theta as f32,
                factor: *factor,
            },
            traditional: r.traditional,
            rotated_dims: head_dim,
        },
        _ => plain_rope(r.rope_theta, r.traditional, head_dim),
    };
    let layers = (0..spec.layers.num_hidden_layers as usize)
        .map(|i| {
            layer(
                i,
                Norms {
                    arrangement: NormArrangement::Sandwich,
                    weight: NormWeight::OnePlus,
                },
                Mixer::Attention(Attention {
                    scale: (variant.attention_scale)(a.query_pre_attn_scalar),
                    qk_norm: variant.qk_norm,
                    scores: match a.attn_logit_softcapping {
                        Some(cap) => Scores::Softcapped { cap: cap as f32 },
                        None => Scores::FusedSdpa,
                    },
                    window: match sliding(i) {
                        Some(window) => Window::Sliding(window),
                        None => Window::Full,
                    },
                    ..full_attention(
                        a.num_attention_heads,
                        a.num_key_value_heads,
                        a.head_dim,
                        rope(i),
                    )
                }),
                FeedForward::Mlp(GatedMlp {
                    width: spec.mlp.intermediate_size as usize,
                    activation: Activation::GeluApproxThenMultiply,
                    projection: GateUpProjection::Separate,
                }),
                variant.residual,
            )
        })
        .collect();
    let (prefix, sanitize) = match variant.packaging(spec.identity.source.model_type) {
        Packaging::Flat => (ModulePrefix::Model, variant.sanitize.to_vec()),
        Packaging::Wrapped(_) => (
            ModulePrefix::LanguageModel,
            [&[SanitizeRule::UnwrapMultimodal], variant.sanitize].concat(),
        ),
    };
    model_ir(
        spec,
        ModelParts {
            prefix,
            sanitize,
            // gemma2.py and gemma3_text.py have no shard().
            sharding: whole_head_sharding(ShardOracle::Absent),
            embedding: scaled_embedding((variant.embed_scale)(spec.model.hidden_size)),
            layers,
            head: Head {
                weight: HeadWeight::TiedEmbedding,
                logit_softcap: spec.model.final_logit_softcapping.map(|cap| Softcap {
                    cap: cap as f32,
                    form: SoftcapForm::Eager,
                }),
                norm: NormWeight::OnePlus,
                logit_scale: LogitScale::None,
            },
        },
    )
}

// ---------------------------------------------------------------- config.json view

/// The spec with config.json field names: flat, as `gemma2` configs are, or
/// under a wrapper's `text_config` (impl_document! adds `quantization` at the
/// top and sorts the keys).
pub(crate) fn config_fields(spec: &Gemma2Spec) -> Value {
    let variant = spec.variant();
    let model_type = spec.identity.source.model_type;
    let text = text_config_fields(spec, variant.text_model_type());
    match variant.packaging(model_type) {
        Packaging::Flat => text,
        Packaging::Wrapped(_) => json!({
            "model_type": model_type.as_str(),
            "vocab_size": spec.model.vocab_size,
            "text_config": text,
        }),
    }
}

/// The text model's config.json fields.
fn text_config_fields(spec: &Gemma2Spec, text_model_type: ConfigModelType) -> Value {
    let mut v = json!({
        "model_type": text_model_type.as_str(),
        "hidden_size": spec.model.hidden_size,
        "num_hidden_layers": spec.layers.num_hidden_layers,
        "intermediate_size": spec.mlp.intermediate_size,
        "num_attention_heads": spec.attention.num_attention_heads,
        "num_key_value_heads": spec.attention.num_key_value_heads,
        "head_dim": spec.attention.head_dim,
        "rms_norm_eps": spec.model.rms_norm_eps,
        "vocab_size": spec.model.vocab_size,
        "max_position_embeddings": spec.model.max_position_embeddings,
        "rope_theta": spec.rope.rope_theta,
        "rope_traditional": spec.rope.traditional,
        "query_pre_attn_scalar": crate::hf::whole_as_integer(spec.attention.query_pre_attn_scalar),
        "attn_logit_softcapping": spec.attention.attn_logit_softcapping,
        "final_logit_softcapping": spec.model.final_logit_softcapping,
    });
    let (l, r) = (&spec.layers, &spec.rope);
    let own = [
        ("sliding_window", l.sliding_window.map(|w| json!(w))),
        ("sliding_window_pattern", l.sliding_window_pattern.map(|n| json!(n))),
        ("rope_local_base_freq", r.rope_local_base_freq.map(|b| json!(b))),
        ("rope_scaling", r.scaling.as_ref().map(|GemmaRopeScaling::Linear { factor }| {
            json!({"rope_type": "linear", "factor": factor})
        })),
    ];
    for (key, value) in own {
        if let Some(value) = value {
            v[key] = value;
        }
    }
    v
}

// ---------------------------------------------------------------- parsing

/// The derived Gemma-2 form is the dense one (`reduce` of the seven sizes; see
/// [`crate::reduce`]).
impl DerivedForm for Gemma2Spec {
    type File = DenseDerivedSpecFile;
    type Reduce = DenseReduce;
}

/// Its `mixed_kv` is not read: Gemma-2 has no mixed KV.
impl Reducible for Gemma2Spec {
    fn refused_in_file(file: &DenseDerivedSpecFile) -> Vec<Issue> {
        match file.derive.mixed_kv {
            None => Vec::new(),
            Some(_) => vec![Issue::new(
                p("derive.mixed_kv"),
                "per-layer mixed KV on a Gemma-2 spec",
                "no `mixed_kv` (or null)",
                "mlx-lm's gemma2 attention cannot read a quantized KV cache (docs/spec-format.md#gemma-2)",
            )],
        }
    }
    fn other_sizes(r: &DenseReduce, parent: &Self, _: &mut Vec<Issue>) -> Vec<Size> {
        mlp_width(r.intermediate_size, parent.mlp.intermediate_size)
    }
    fn apply(&mut self, r: &DenseReduce) {
        self.mlp.intermediate_size = r.intermediate_size;
    }
    /// A check on one of the seven reduced sizes; any other (the scalar, the
    /// softcaps) concerns an inherited field.
    fn reduced_field(path: &str) -> Option<FieldPath> {
        const REDUCED: [&str; 7] = [
            "num_hidden_layers",
            "hidden_size",
            "vocab_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
        ];
        let field = last_key(path);
        REDUCED.contains(&field).then(|| reduce_key(field))
    }
}

crate::reduce::impl_stack_sections!(Gemma2Spec);

crate::document::impl_document!(Gemma2Spec, check);
crate::document::impl_model_sizes!(Gemma2Model);

// ---------------------------------------------------------------- import

/// Imports a flat config.json of a variant's model type with its module's
/// defaults ([`GemmaVariant::defaults`], the softcaps, the layering and the RoPE
/// bases it reads; below, Gemma-2's). For `gemma2`, mlx-lm 0.32.2's `ModelArgs` defaults
/// (`gemma2.py`): `rope_theta` 10000, `rope_traditional` false,
/// `attn_logit_softcapping` 50.0, `final_logit_softcapping` 30.0,
/// `query_pre_attn_scalar` 144.0. `max_position_embeddings` is not a `ModelArgs`
/// field; it is kept as information (8192 when absent, transformers' default).
///
/// Refused, because mlx-lm's gemma2 could not run such a checkpoint as its config says:
/// a null softcap (mlx-lm divides by it), `tie_word_embeddings: false` (mlx-lm's gemma2
/// has no `lm_head`), `attention_bias: true` (its projections have no bias). Noted and
/// ignored, as mlx-lm ignores them: `sliding_window`, `sliding_window_size`,
/// `cache_implementation`, `layer_types` (every layer is full attention).
///
/// A wrapper's config (`gemma3`) is read as its module reads it: the top-level
/// `vocab_size` and the head counts written into `text_config`, which is then
/// read as the flat text model's config; `quantization` stays at the top.
pub(crate) fn import(
    top: &Map<String, Value>,
    name: &str,
    model_type: ConfigModelType,
    variant: &GemmaVariant,
) -> ImportedSpec<Gemma2Spec> {
    let defaults = &variant.defaults;
    let TextModelFields {
        fields: text,
        prefix,
        filled,
    } = text_model_fields(top, variant.packaging(model_type), variant)?;
    let mut r = Reader::new(&text, prefix);
    for (field, value, why) in filled {
        r.note(field, value, &why);
    }
    // The checks below read the text model's fields; the wrapper's own are
    // read where they are (`vocab_size` above, `quantization` below).
    let (config, top) = (top, &text);
    let sizes = RequiredSizes::read(&mut r);
    let head_dim = r.required_uint("head_dim");
    let num_kv = r.required_uint("num_key_value_heads");
    let rope_theta = r.float("rope_theta", defaults.rope_theta);
    let family = variant.family.as_str();
    let (traditional, rope_local_base_freq, scaling) = match variant.rope {
        RopeBases::One => (r.boolean("rope_traditional", false), None, None),
        RopeBases::LocalAndGlobal { local_base_default } => {
            if let Some(v) = r.get("rope_traditional").cloned() {
                r.note(
                    "rope_traditional",
                    v,
                    &format!("ignored: mlx-lm's {family} always uses traditional=False"),
                );
            }
            let local = r.float("rope_local_base_freq", local_base_default);
            (false, Some(local), read_linear_scaling(&mut r, family))
        }
    };
    let softcap = |r: &mut Reader, k: &str, default: Option<f64>| -> Option<f64> {
        let Some(default) = default else {
            if let Some(v) = r.get(k).cloned() {
                r.note(
                    k,
                    v,
                    &format!("ignored: mlx-lm's {family} applies no softcap"),
                );
            }
            return None;
        };
        if top.get(k).is_some_and(Value::is_null) {
            r.problem(
                k,
                &format!("null: mlx-lm's {family} always applies tanh(x / cap) * cap, so a checkpoint without this softcap cannot run in mlx-lm"),
            );
            return Some(default);
        }
        Some(r.float(k, default))
    };
    let (attn_default, final_default) = match variant.softcaps {
        Softcaps::Applied { attention, logits } => (Some(attention), Some(logits)),
        Softcaps::Absent => (None, None),
    };
    let attn_softcap = softcap(&mut r, "attn_logit_softcapping", attn_default);
    let final_softcap = softcap(&mut r, "final_logit_softcapping", final_default);
    let query_pre_attn_scalar = r.float("query_pre_attn_scalar", defaults.query_pre_attn_scalar);
    let max_pos = match r.get("max_position_embeddings").cloned() {
        Some(v) => r.uint_of("max_position_embeddings", &v),
        None => {
            let (value, why) = defaults.max_position_embeddings;
            r.note("max_position_embeddings", json!(value), why);
            value
        }
    };
    if top.get("tie_word_embeddings") == Some(&Value::Bool(false)) {
        r.problem("tie_word_embeddings", variant.untied_head);
    }
    if top.get("attention_bias") == Some(&Value::Bool(true)) {
        r.problem(
            "attention_bias",
            &format!("true, but mlx-lm's {family} projections have no bias (it would not load the bias tensors)"),
        );
    }
    let (sliding_window, sliding_window_pattern, ignored): (_, _, &[&str]) = match variant.layering
    {
        Layering::AllFull => (
            None,
            None,
            &[
                "sliding_window",
                "sliding_window_size",
                "cache_implementation",
                "layer_types",
            ],
        ),
        Layering::SlidingPattern { window, pattern } => (
            Some(r.uint("sliding_window", window)),
            Some(r.uint("sliding_window_pattern", pattern)),
            &["cache_implementation", "layer_types"],
        ),
    };
    for field in ignored {
        if let Some(v) = r.get(field).cloned() {
            let why = match variant.layering {
                Layering::AllFull => format!("ignored: mlx-lm's {family} has no sliding window; every layer is full attention with a KVCache"),
                Layering::SlidingPattern { .. } => format!("ignored: mlx-lm's {family} makes layer i full when i % sliding_window_pattern == sliding_window_pattern - 1"),
            };
            r.note(field, v, &why);
        }
    }
    let quantization = top_quantization(config, &mut r);
    r.build_checked(check, || Gemma2Spec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(config, name, variant.family, model_type),
        model: Gemma2Model {
            hidden_size: sizes.hidden_size,
            vocab_size: sizes.vocab_size,
            rms_norm_eps: sizes.rms_norm_eps,
            final_logit_softcapping: final_softcap,
            max_position_embeddings: max_pos,
        },
        layers: Gemma2Layers {
            num_hidden_layers: sizes.num_layers,
            sliding_window,
            sliding_window_pattern,
        },
        attention: Gemma2Attention {
            num_attention_heads: sizes.num_heads,
            num_key_value_heads: num_kv,
            head_dim,
            query_pre_attn_scalar,
            attn_logit_softcapping: attn_softcap,
        },
        rope: Gemma2Rope {
            traditional,
            rope_theta,
            rope_local_base_freq,
            scaling,
        },
        mlp: Gemma2Mlp {
            intermediate_size: sizes.intermediate_size,
        },
        quantization,
    })
}

/// A text model field the importer filled in: its name, its value, why.
type Filled = (&'static str, Value, String);

/// The text model's config.json fields, the prefix they are reported under
/// (`text_config.` in a wrapper) and what the importer filled in.
struct TextModelFields {
    fields: Map<String, Value>,
    prefix: &'static str,
    filled: Vec<Filled>,
}

/// The text model's config.json fields as its module's `ModelArgs` receives
/// them: the file itself, or a wrapper's `text_config` with what the wrapper
/// writes into it; then the module's size defaults where a field is absent.
fn text_model_fields(
    top: &Map<String, Value>,
    packaging: Packaging,
    variant: &GemmaVariant,
) -> Result<TextModelFields, ImportError> {
    let mut filled = Vec::new();
    let (mut text, prefix) = match packaging {
        Packaging::Flat => (top.clone(), ""),
        Packaging::Wrapped(wrapper) => {
            let mut text = match top.get("text_config") {
                Some(Value::Object(t)) => t.clone(),
                Some(other) => {
                    return Err(ImportError {
                        problems: vec![format!("text_config: expected an object, found {other}")],
                    })
                }
                None => {
                    return Err(ImportError {
                        problems: vec![
                            "text_config: missing (mlx-lm's wrapper has no default for it: the language model's config belongs there)".into(),
                        ],
                    })
                }
            };
            let vocab = top.get("vocab_size").cloned();
            let why = match &vocab {
                Some(_) => {
                    "the top-level vocab_size, which mlx-lm's wrapper writes over text_config's"
                }
                None => "absent at the top: mlx-lm's wrapper default, written over text_config's",
            };
            let vocab = vocab.unwrap_or(json!(wrapper.vocab_size));
            if text.get("vocab_size") != Some(&vocab) {
                filled.push(("vocab_size", vocab.clone(), why.to_string()));
            }
            text.insert("vocab_size".into(), vocab);
            for (field, default) in [
                ("num_attention_heads", wrapper.num_attention_heads),
                ("num_key_value_heads", wrapper.num_key_value_heads),
            ] {
                if !text.contains_key(field) {
                    text.insert(field.into(), json!(default));
                    filled.push((
                        field,
                        json!(default),
                        "absent: mlx-lm's wrapper default".into(),
                    ));
                }
            }
            (text, "text_config.")
        }
    };
    let text_model = variant.text_model_type().as_str();
    for &(field, default) in variant.size_defaults {
        if !text.contains_key(field) {
            text.insert(field.into(), default.to_json());
            filled.push((
                field,
                default.to_json(),
                format!("absent: mlx-lm's {text_model} default"),
            ));
        }
    }
    Ok(TextModelFields {
        fields: text,
        prefix,
        filled,
    })
}

/// `rope_scaling` as rope_utils' `initialize_rope` reads it: its `type`, else
/// `rope_type` (`default` when neither); `default` is unscaled, `linear`
/// takes `factor`, any other is refused (archgen has only those here).
fn read_linear_scaling(r: &mut Reader, family: &str) -> Option<GemmaRopeScaling> {
    let scaling = r.get("rope_scaling")?.clone();
    let kind = ["type", "rope_type"]
        .iter()
        .find_map(|k| {
            scaling
                .get(k)
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
        })
        .unwrap_or("default");
    match (kind, scaling.get("factor").and_then(Value::as_f64)) {
        ("default", _) => {
            r.note(
                "rope_scaling",
                scaling,
                "rope_type default: unscaled RoPE, as mlx-lm's initialize_rope makes it",
            );
            None
        }
        ("linear", Some(factor)) => Some(GemmaRopeScaling::Linear { factor }),
        ("linear", None) => {
            r.problem(
                "rope_scaling.factor",
                "missing or not a number, but linear scaling divides the positions by it",
            );
            None
        }
        (other, _) => {
            r.problem("rope_scaling", &format!("rope_type `{other}` is not supported for {family} (archgen reads linear scaling only)"));
            None
        }
    }
}

/// The families of the Gemma-2 layout in the family registry.
pub(crate) const FAMILY: ModelFamily = ModelFamily {
    reads: |t| variant_of(t.family()).is_some(),
    kv_config: KvConfig::Refused("KV-cache quantization is supported for Gemma-4 only (mlx-lm's gemma2 attention cannot read a quantized cache)"),
    import: |c| {
        let variant = variant_of(c.model_type.family()).unwrap_or(&gemma2::GEMMA2);
        import(c.top, c.name, c.model_type, variant).map(|(s, applied)| (crate::Spec::Gemma2(s), applied))
    },
};
