//! Dense decoder families: Qwen3 (`qwen3.py`), Llama (`llama.py`, also Mistral),
//! Qwen2 (`qwen2.py`), SmolLM3 (`smollm3.py`) and Granite (`granite.py`) as mlx-lm
//! 0.32.2 runs them. All are the same stack (RMSNorm → GQA attention with RoPE →
//! residual → RMSNorm → SwiGLU MLP → residual); Qwen3 adds a per-head RMSNorm on
//! queries and keys, Qwen2 a bias on the q, k and v projections, SmolLM3 (Llama's
//! `ModelArgs` and `LlamaModel`) drops RoPE on every `no_rope_layer_interval`-th
//! layer, Granite multiplies the embedding, the attention scores, the residual
//! branches and the logits by constants of its config (`scales`), Phi-3
//! (`phi3.py`) projects q/k/v with one `qkv_proj` and gate/up with one
//! `gate_up_proj`, each one matmul then split, and OLMo-2 (`olmo2.py`,
//! Llama's `ModelArgs` fields) puts the norms after the attention and the MLP
//! instead of before them and RMS-normalizes the whole q and k projections.
//! One document layout serves them all; the family fixes what differs.
//!
//! This module holds everything family-specific on the spec side: the document, its
//! validation, the lowering to the block IR, the config.json view, the YAML writer, the
//! reduction to tiny variants and the config.json importer.

pub use crate::dense_sections::{DenseAttention, DenseLayers, DenseMlp, DenseModel};
use crate::diag::{FieldPath, Issue};
use crate::layout::Layout;
use crate::model::*;
use crate::reader::{
    imported_identity, top_quantization, AppliedDefault, ImportError, Reader, ABSENT,
};
use crate::reduce::{mlp_width, DerivedFile, Reducible, Size, Stack};
use crate::{validate, Sections};
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

/// granite.py's multipliers, each a Python float that meets an array as a weak
/// scalar (rounded to the array's dtype).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GraniteScales {
    /// `embedding_multiplier`: `embed_tokens(ids) * embedding_multiplier`.
    pub embedding_multiplier: f64,
    /// `attention_multiplier`: SDPA's `scale` (in place of `head_dim ** -0.5`).
    pub attention_multiplier: f64,
    /// `residual_multiplier`: `h + branch * residual_multiplier` on both branches.
    pub residual_multiplier: f64,
    /// `logits_scaling`: the logits divided by it after the head.
    pub logits_scaling: f64,
}

/// The families this layout serves; every other family has a layout of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DenseFamily {
    Qwen3,
    Llama,
    Qwen2,
    SmolLm3,
    Granite,
    Phi3,
    Olmo2,
}

impl DenseFamily {
    /// The dense family `family` is, or None for a family with a layout of its own.
    pub(crate) fn of(family: Family) -> Option<DenseFamily> {
        match family {
            Family::Qwen3 => Some(DenseFamily::Qwen3),
            Family::Llama => Some(DenseFamily::Llama),
            Family::Qwen2 => Some(DenseFamily::Qwen2),
            Family::SmolLm3 => Some(DenseFamily::SmolLm3),
            Family::Granite => Some(DenseFamily::Granite),
            Family::Phi3 => Some(DenseFamily::Phi3),
            Family::Olmo2 => Some(DenseFamily::Olmo2),
            Family::Gemma4
            | Family::Gemma2
            | Family::Qwen3Moe
            | Family::MiniCpm
            | Family::Qwen35 => None,
        }
    }

    pub(crate) fn family(self) -> Family {
        match self {
            DenseFamily::Qwen3 => Family::Qwen3,
            DenseFamily::Llama => Family::Llama,
            DenseFamily::Qwen2 => Family::Qwen2,
            DenseFamily::SmolLm3 => Family::SmolLm3,
            DenseFamily::Granite => Family::Granite,
            DenseFamily::Phi3 => Family::Phi3,
            DenseFamily::Olmo2 => Family::Olmo2,
        }
    }
}

impl DenseSpec {
    /// The family the document is read as. `check` refuses every family but
    /// qwen3, llama and qwen2, so every loaded or imported spec has one of them;
    /// a spec built in code with another (never validated) reads as Llama, the
    /// plain stack (no q/k norm, no bias).
    pub(crate) fn dense_family(&self) -> DenseFamily {
        DenseFamily::of(self.identity.family).unwrap_or(DenseFamily::Llama)
    }
}

impl DenseRope {
    /// Whether layer `i` rotates its queries and keys: every layer but each
    /// `no_rope_layer_interval`-th (smollm3.py's `ModelArgs.__post_init__`,
    /// `int((i + 1) % no_rope_layer_interval != 0)`).
    pub(crate) fn rotates(&self, i: usize) -> bool {
        match self.no_rope_layer_interval {
            None | Some(0) => true,
            Some(n) => (i + 1) % n as usize != 0,
        }
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
    file DenseDerivedSpecFile titled "archgen architecture spec (derived dense form)";

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
    if !family.is_dense() {
        c.err(
            p("identity.family"),
            format!("`{}` is not a dense family", family.as_str()),
            "qwen3, llama, qwen2, smollm3, granite or phi3",
            "a Gemma-4 spec has the gemma4 layout (docs/spec-format.md)",
        );
    }
    match (spec.dense_family(), spec.rope.no_rope_layer_interval) {
        (DenseFamily::SmolLm3, None) => c.err(
            p("rope.no_rope_layer_interval"),
            "missing, but a smollm3 spec states which layers have no RoPE",
            "a positive integer (SmolLM3-3B: 4)",
            "write `no_rope_layer_interval` under `rope` (mlx-lm's default is 4)",
        ),
        (DenseFamily::SmolLm3, Some(0)) => c.err(
            p("rope.no_rope_layer_interval"),
            "0 is out of range (mlx-lm computes (i + 1) % interval)",
            "a positive integer (SmolLM3-3B: 4)",
            "every n-th layer has no RoPE; 1 would drop it everywhere",
        ),
        (DenseFamily::SmolLm3, Some(_)) | (_, None) => {}
        (
            DenseFamily::Qwen3
            | DenseFamily::Llama
            | DenseFamily::Qwen2
            | DenseFamily::Granite
            | DenseFamily::Phi3
            | DenseFamily::Olmo2,
            Some(_),
        ) => c.err(
            p("rope.no_rope_layer_interval"),
            format!(
                "set, but mlx-lm's {}.py rotates every layer",
                family.as_str()
            ),
            "no such field",
            "only smollm3 has layers without RoPE; remove the field",
        ),
    }
    match (spec.dense_family(), &spec.scales) {
        (DenseFamily::Granite, None) => c.err(
            p("scales"),
            "missing, but a granite spec states its four multipliers",
            "a mapping {embedding_multiplier, attention_multiplier, residual_multiplier, logits_scaling}",
            "copy them from config.json (granite.py has no defaults for them)",
        ),
        (DenseFamily::Granite, Some(g)) => {
            for (name, v) in [
                ("embedding_multiplier", g.embedding_multiplier),
                ("attention_multiplier", g.attention_multiplier),
                ("residual_multiplier", g.residual_multiplier),
                ("logits_scaling", g.logits_scaling),
            ] {
                c.positive_finite(
                    &format!("scales.{name}"),
                    v,
                    "granite-3.3-2b: 12.0, 0.015625, 0.22, 8.0",
                );
            }
        }
        (_, None) => {}
        (
            DenseFamily::Qwen3
            | DenseFamily::Llama
            | DenseFamily::Qwen2
            | DenseFamily::SmolLm3
            | DenseFamily::Phi3
            | DenseFamily::Olmo2,
            Some(_),
        ) => c.err(
            p("scales"),
            format!("set, but mlx-lm's {}.py has no multipliers", family.as_str()),
            "no such section",
            "only granite scales its embedding, scores, residuals and logits; remove the section",
        ),
    }
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
    ok &= c.even_head_dim("attention.head_dim", a.head_dim);
    if ok
        && matches!(family, Family::Qwen2 | Family::Granite | Family::Phi3)
        && u64::from(a.head_dim) * u64::from(a.num_attention_heads) != u64::from(m.hidden_size)
    {
        c.err(
            p("attention.head_dim"),
            format!(
                "{} with hidden_size {} and {} heads, but mlx-lm's {}.py always uses hidden_size // num_attention_heads",
                a.head_dim, m.hidden_size, a.num_attention_heads, family.as_str()
            ),
            "hidden_size == head_dim * num_attention_heads",
            format!("{} has no head_dim field: make hidden_size a multiple of the heads and head_dim the quotient", family.as_str()),
        );
    }
    ok &= c.grouped(a.num_attention_heads, a.num_key_value_heads);
    if matches!(family, Family::Qwen3 | Family::Granite) && spec.rope.traditional {
        c.err(
            p("rope.traditional"),
            format!(
                "true, but mlx-lm's {}.py always uses traditional=False",
                family.as_str()
            ),
            "false",
            match family {
                Family::Granite => "Granite ignores rope_traditional; write false",
                _ => "Qwen3 ignores rope_traditional; write false",
            },
        );
    }
    c.positive_finite(
        "rope.rope_theta",
        spec.rope.rope_theta,
        "the RoPE base, e.g. 500000.0",
    );
    if let (Family::Phi3, Some(RopeScaling::Llama3 { .. })) = (family, &spec.rope.scaling) {
        c.err(
            p("rope.scaling"),
            "llama3 scaling, but mlx-lm's phi3.py reads only su/longrope and linear scaling",
            "null",
            "Phi-3-mini-4k has rope_scaling null; su/longrope (SuScaledRoPE) is not supported yet",
        );
    }
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
        (
            m.max_position_embeddings,
            "`max_position_embeddings` from config.json",
        ),
        (mlp.intermediate_size, mlp_meaning),
    )
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

// ---------------------------------------------------------------- lowering

/// The IR of a valid dense spec: pre-norm layers, full causal attention at
/// `head_dim ** -0.5` (q/k RMSNorm per head for Qwen3, none for Llama),
/// SwiGLU, no embedding scale.
pub(crate) fn lower(spec: &DenseSpec) -> crate::ir::ModelIr {
    use crate::ir::*;
    use crate::ir_parts::{
        full_attention, model_ir, plain_head, swiglu, whole_head_sharding, ModelParts,
    };
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
    let family = spec.dense_family();
    let qk_norm = match family {
        DenseFamily::Qwen3 => QkNorm::RmsPerHead,
        // olmo2.py: `nn.RMSNorm(n_heads * head_dim)` on `q_proj(x)` before the reshape.
        DenseFamily::Olmo2 => QkNorm::RmsWholeProjection,
        DenseFamily::Llama
        | DenseFamily::Qwen2
        | DenseFamily::SmolLm3
        | DenseFamily::Granite
        | DenseFamily::Phi3 => QkNorm::None,
    };
    let bias = match family {
        DenseFamily::Qwen2 => ProjectionBias::QueryKeyValue,
        DenseFamily::Qwen3
        | DenseFamily::Llama
        | DenseFamily::SmolLm3
        | DenseFamily::Granite
        | DenseFamily::Phi3
        | DenseFamily::Olmo2 => ProjectionBias::None,
    };
    // phi3.py's `qkv_proj` and `gate_up_proj`: one matmul each, then split.
    let (qkv, gate_up) = match family {
        DenseFamily::Phi3 => (QkvProjection::Fused, GateUpProjection::Fused),
        DenseFamily::Qwen3
        | DenseFamily::Llama
        | DenseFamily::Qwen2
        | DenseFamily::SmolLm3
        | DenseFamily::Granite
        | DenseFamily::Olmo2 => (QkvProjection::Separate, GateUpProjection::Separate),
    };
    // olmo2.py's `TransformerBlock`: norms after the attention and the MLP only.
    let arrangement = match family {
        DenseFamily::Olmo2 => NormArrangement::PostNorm,
        DenseFamily::Qwen3
        | DenseFamily::Llama
        | DenseFamily::Qwen2
        | DenseFamily::SmolLm3
        | DenseFamily::Granite
        | DenseFamily::Phi3 => NormArrangement::PreNorm,
    };
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
        .map(|i| Layer {
            index: i,
            norms: Norms {
                arrangement,
                weight: NormWeight::Direct,
            },
            mixer: Mixer::Attention(Attention {
                bias,
                qk_norm,
                scale,
                projection: qkv,
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
            ffn: FeedForward::Mlp(GatedMlp {
                projection: gate_up,
                ..swiglu(spec.mlp.intermediate_size)
            }),
            input: LayerInput::None,
            scalar: LayerScalar::None,
            residual,
        })
        .collect();
    model_ir(
        (&spec.identity.name, spec.identity.source.model_type),
        &spec.model,
        spec.quantization.as_ref(),
        ModelParts {
            prefix: ModulePrefix::Model,
            // granite.py's sanitize only pops a tied lm_head (a rotary table
            // in its checkpoint fails mlx-lm's strict load, so it must here too).
            sanitize: match family {
                DenseFamily::Granite => vec![SanitizeRule::DropTiedHead],
                // phi3.py has no sanitize: mlx-lm loads the checkpoint as it is.
                DenseFamily::Phi3 => vec![],
                // olmo2.py's sanitize drops `self_attn.rotary_emb.inv_freq`
                // only; a tied checkpoint with an lm_head fails its strict load.
                DenseFamily::Olmo2 => vec![SanitizeRule::DropRotaryTables],
                DenseFamily::Qwen3
                | DenseFamily::Llama
                | DenseFamily::Qwen2
                | DenseFamily::SmolLm3 => {
                    vec![SanitizeRule::DropRotaryTables, SanitizeRule::DropTiedHead]
                }
            },
            // qwen3.py, llama.py and qwen2.py have a shard() (mistral runs as
            // llama); smollm3.py and granite.py have none, so a sharded run of
            // theirs has no oracle.
            sharding: whole_head_sharding(match family {
                DenseFamily::Qwen3 | DenseFamily::Llama | DenseFamily::Qwen2 => ShardOracle::MlxLm,
                DenseFamily::SmolLm3
                | DenseFamily::Granite
                | DenseFamily::Phi3
                | DenseFamily::Olmo2 => ShardOracle::Absent,
            }),
            embedding: Embedding {
                scale: embed_scale,
                per_layer_input: None,
            },
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

/// The spec with config.json field names (flat, as `qwen3` / `llama` configs are), plus
/// `quantization` when present. Keys sorted.
pub(crate) fn hf_json(spec: &DenseSpec) -> Value {
    let mut v = crate::hf::dense_stack_json(
        spec.identity.source.model_type,
        spec.layers.num_hidden_layers,
        &spec.model,
        &spec.attention,
    );
    crate::hf::extend(
        &mut v,
        json!({
            "intermediate_size": spec.mlp.intermediate_size,
            "head_dim": spec.attention.head_dim,
            "rope_theta": spec.rope.rope_theta,
            "rope_scaling": scaling_json(&spec.rope.scaling),
        }),
    );
    match spec.dense_family() {
        DenseFamily::Llama => {
            v["rope_traditional"] = json!(spec.rope.traditional);
            v["attention_bias"] = json!(false);
            v["mlp_bias"] = json!(false);
        }
        DenseFamily::SmolLm3 => {
            v["rope_traditional"] = json!(spec.rope.traditional);
            v["attention_bias"] = json!(false);
            v["mlp_bias"] = json!(false);
            // No `no_rope_layers`: mlx-lm derives the list from the interval.
            v["no_rope_layer_interval"] = json!(spec.rope.no_rope_layer_interval);
        }
        DenseFamily::Granite => {
            // granite.py has no head_dim field (hidden_size // heads, checked)
            // and no rope_traditional (always false).
            if let Some(o) = v.as_object_mut() {
                o.remove("head_dim");
            }
            v["attention_bias"] = json!(false);
            v["mlp_bias"] = json!(false);
            if let Some(g) = &spec.scales {
                v["embedding_multiplier"] = json!(g.embedding_multiplier);
                v["attention_multiplier"] = json!(g.attention_multiplier);
                v["residual_multiplier"] = json!(g.residual_multiplier);
                v["logits_scaling"] = json!(g.logits_scaling);
            }
        }
        DenseFamily::Qwen2 => {
            // qwen2.py has no head_dim field (hidden_size // heads, checked).
            if let Some(o) = v.as_object_mut() {
                o.remove("head_dim");
            }
            v["rope_traditional"] = json!(spec.rope.traditional);
        }
        DenseFamily::Phi3 => {
            // phi3.py has no head_dim field (hidden_size // heads, checked).
            if let Some(o) = v.as_object_mut() {
                o.remove("head_dim");
            }
            v["rope_traditional"] = json!(spec.rope.traditional);
        }
        DenseFamily::Olmo2 => {
            v["rope_traditional"] = json!(spec.rope.traditional);
            v["attention_bias"] = json!(false);
            v["mlp_bias"] = json!(false);
        }
        DenseFamily::Qwen3 => {}
    }
    crate::hf::config_view(v, spec.quantization.as_ref())
}

// ---------------------------------------------------------------- YAML

/// The full-form YAML text of a dense spec, from its sections' serde form.
pub(crate) fn to_yaml(spec: &DenseSpec) -> String {
    crate::emit::document_yaml(spec, spec.format_version)
}

// ---------------------------------------------------------------- parsing

/// How a dense document is read (see [`crate::layout`]).
pub(crate) const LAYOUT: Layout = Layout {
    family: "dense",
    anchor: "dense-families",
    head: crate::layout::DENSE_HEAD,
    sections: &[
        ("rope", Sections::check::<DenseRope>),
        ("mlp", Sections::check::<DenseMlp>),
        ("scales", Sections::check_optional::<GraniteScales>),
        ("quantization", Sections::check::<Option<Quantization>>),
        ("mixed_kv", Sections::check_optional::<crate::MixedKv>),
    ],
    texts: &[
        ("layers", "a mapping {num_hidden_layers}", "every dense layer is full attention; see docs/spec-format.md#dense-families"),
        ("rope", "a mapping {traditional, rope_theta, scaling}", "`rope_theta`, `rope_traditional`, `rope_scaling`; see docs/spec-format.md#dense-families"),
        ("scaling", "null or {rope_type: llama3, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings}", "`rope_scaling` from config.json; null for plain RoPE"),
    ],
    refused: &[],
};

/// The derived dense form (see [`crate::reduce`]): the stack's sizes and the MLP width.
impl Reducible for DenseSpec {
    type File = DenseDerivedSpecFile;
    type Reduce = DenseReduce;

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

crate::reduce::impl_stack_sections!(DenseSpec);

crate::document::impl_document!(DenseSpec, check, with mixed_kv);

// ---------------------------------------------------------------- import

/// Imports a flat `qwen3` / `llama` / `mistral` / `qwen2` config.json with
/// mlx-lm 0.32.2's `ModelArgs` defaults (`qwen3.py`, `llama.py`, `qwen2.py`,
/// `rope_utils.py`; `mistral` is read by `llama.py`). `family` is
/// `model_type`'s family.
pub(crate) fn import(
    top: &Map<String, Value>,
    model_type: ConfigModelType,
    family: DenseFamily,
    name: &str,
) -> Result<(DenseSpec, Vec<AppliedDefault>), ImportError> {
    // llama.py and qwen2.py read rope_traditional / rope_theta / rope_scaling
    // (never rope_parameters); qwen3.py reads rope_parameters too.
    let reads_rope_parameters = match family {
        DenseFamily::Qwen3 => true,
        DenseFamily::Llama
        | DenseFamily::Qwen2
        | DenseFamily::SmolLm3
        | DenseFamily::Granite
        | DenseFamily::Phi3
        | DenseFamily::Olmo2 => false,
    };
    let mut r = Reader::new(top, "");
    // Fields without a default in ModelArgs: mlx-lm fails without them.
    let hidden_size = r.required_uint("hidden_size");
    let num_layers = r.required_uint("num_hidden_layers");
    let intermediate_size = r.required_uint("intermediate_size");
    let num_heads = r.required_uint("num_attention_heads");
    let rms_norm_eps = r.required_float("rms_norm_eps");
    let vocab_size = r.required_uint("vocab_size");
    let derived_head_dim = |r: &mut Reader, reason: &str| {
        let d = hidden_size.checked_div(num_heads).unwrap_or(0);
        r.note("head_dim", json!(d), reason);
        d
    };
    let (num_kv, head_dim, max_pos, tie) = match family {
        // smollm3.py's ModelArgs is llama.py's plus the NoPE fields; olmo2.py's
        // has llama.py's fields and defaults (tie_word_embeddings True).
        DenseFamily::Llama | DenseFamily::SmolLm3 | DenseFamily::Olmo2 => {
            let kv = r.uint("num_key_value_heads", num_heads);
            let head_dim = match r.get("head_dim").cloned() {
                Some(v) => r.uint_of("head_dim", &v),
                None => derived_head_dim(
                    &mut r,
                    "absent: mlx-lm uses hidden_size // num_attention_heads",
                ),
            };
            let max_pos = r.required_uint("max_position_embeddings");
            let tie = r.boolean("tie_word_embeddings", true);
            (kv, head_dim, max_pos, tie)
        }
        DenseFamily::Qwen2 => {
            let kv = r.required_uint("num_key_value_heads");
            let reason = match r.get("head_dim") {
                Some(_) => "ignored as written: mlx-lm's qwen2.py always uses hidden_size // num_attention_heads",
                None => "qwen2.py has no head_dim field: hidden_size // num_attention_heads",
            };
            let head_dim = derived_head_dim(&mut r, reason);
            let max_pos = r.uint("max_position_embeddings", 32768);
            let tie = r.boolean("tie_word_embeddings", true);
            (kv, head_dim, max_pos, tie)
        }
        DenseFamily::Granite => {
            let kv = r.required_uint("num_key_value_heads");
            let reason = match r.get("head_dim") {
                Some(_) => "ignored as written: mlx-lm's granite.py always uses hidden_size // num_attention_heads",
                None => "granite.py has no head_dim field: hidden_size // num_attention_heads",
            };
            let head_dim = derived_head_dim(&mut r, reason);
            let max_pos = r.required_uint("max_position_embeddings");
            let tie = r.boolean("tie_word_embeddings", true);
            (kv, head_dim, max_pos, tie)
        }
        DenseFamily::Phi3 => {
            let kv = r.uint("num_key_value_heads", num_heads);
            let reason = match r.get("head_dim") {
                Some(_) => "ignored as written: mlx-lm's phi3.py always uses hidden_size // num_attention_heads",
                None => "phi3.py has no head_dim field: hidden_size // num_attention_heads",
            };
            let head_dim = derived_head_dim(&mut r, reason);
            let max_pos = r.uint("max_position_embeddings", 131072);
            let tie = r.boolean("tie_word_embeddings", false);
            (kv, head_dim, max_pos, tie)
        }
        DenseFamily::Qwen3 => (
            r.required_uint("num_key_value_heads"),
            r.required_uint("head_dim"),
            r.required_uint("max_position_embeddings"),
            r.required_bool("tie_word_embeddings"),
        ),
    };
    let mut traditional = false;
    match family {
        DenseFamily::Olmo2 => {
            traditional = r.boolean("rope_traditional", false);
            // olmo2.py's biases would sit on o_proj and the MLP too.
            for flag in ["attention_bias", "mlp_bias"] {
                if r.boolean(flag, false) {
                    r.problem(flag, "true: archgen's dense blocks have no bias terms yet");
                }
            }
        }
        DenseFamily::Llama | DenseFamily::SmolLm3 => {
            traditional = r.boolean("rope_traditional", false);
            for flag in ["attention_bias", "mlp_bias"] {
                if r.boolean(flag, false) {
                    r.problem(flag, "true: archgen's dense blocks have no bias terms yet");
                }
            }
            match r.get("layer_types").and_then(Value::as_array) {
                Some(types) => {
                    if types.iter().any(|t| t.as_str() != Some("full_attention")) {
                        r.problem(
                            "layer_types",
                            "sliding_attention layers are not supported for llama yet (every layer must be full_attention)",
                        );
                    }
                }
                None => {
                    if let Some(w) = r.get("sliding_window").cloned() {
                        r.note(
                            "sliding_window",
                            w,
                            "ignored: without layer_types mlx-lm's llama.py makes every layer full attention",
                        );
                    }
                }
            }
        }
        DenseFamily::Qwen2 => {
            traditional = r.boolean("rope_traditional", false);
            for field in ["use_sliding_window", "sliding_window", "max_window_layers"] {
                if let Some(v) = r.get(field).cloned() {
                    r.note(
                        field,
                        v,
                        "ignored: mlx-lm's qwen2.py has no sliding window (every layer is full attention)",
                    );
                }
            }
        }
        DenseFamily::Granite => {
            // granite.py: both required, and a bias would also sit on o_proj
            // and the MLP, which the dense blocks do not have.
            for flag in ["attention_bias", "mlp_bias"] {
                if r.required_bool(flag) {
                    r.problem(flag, "true: archgen's dense blocks have no bias terms yet");
                }
            }
            if let Some(v) = r.get("rope_traditional").cloned() {
                r.note(
                    "rope_traditional",
                    v,
                    "ignored: mlx-lm's granite.py always uses traditional=False",
                );
            }
        }
        DenseFamily::Phi3 => {
            traditional = r.boolean("rope_traditional", false);
            read_phi3_fields(&mut r);
        }
        DenseFamily::Qwen3 => {}
    }
    // rope_theta / rope_scaling, with transformers >= 5's rope_parameters (qwen3 reads
    // it; llama.py does not).
    let params = top.get("rope_parameters").filter(|v| !v.is_null()).cloned();
    let theta = match (
        r.get("rope_theta").cloned(),
        &params,
        !reads_rope_parameters,
    ) {
        (Some(v), _, _) => v.as_f64().unwrap_or_else(|| {
            r.problem("rope_theta", &format!("expected a number, found {v}"));
            0.0
        }),
        (None, Some(pr), false) => match pr.get("rope_theta").and_then(Value::as_f64) {
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
        },
        (None, None, false) => {
            r.problem("rope_theta", "missing (mlx-lm qwen3.py raises without it)");
            0.0
        }
        (None, _, true) => {
            // llama.py: 10000; qwen2.py: 1000000; granite.py: none.
            let default = match family {
                DenseFamily::Qwen2 => Some(1_000_000.0),
                DenseFamily::Llama
                | DenseFamily::Qwen3
                | DenseFamily::SmolLm3
                | DenseFamily::Phi3
                | DenseFamily::Olmo2 => Some(10000.0),
                DenseFamily::Granite => None,
            };
            match default {
                Some(d) => {
                    r.note("rope_theta", json!(d), ABSENT);
                    d
                }
                None => {
                    r.required_float("rope_theta");
                    0.0
                }
            }
        }
    };
    if !reads_rope_parameters && params.is_some() {
        r.note(
            "rope_parameters",
            Value::Null,
            &format!(
                "ignored: mlx-lm 0.32.2's {}.py reads rope_theta / rope_scaling only",
                family.family().as_str()
            ),
        );
    }
    let scaling_src = match (
        r.get("rope_scaling").cloned(),
        &params,
        !reads_rope_parameters,
    ) {
        (Some(s), _, _) => Some(s),
        (None, Some(pr), false) => Some(pr.clone()),
        _ => None,
    };
    let scaling = match (scaling_src, family) {
        (None, _) => None,
        (Some(s), DenseFamily::Phi3) => read_phi3_scaling(&s, &mut r),
        (
            Some(s),
            DenseFamily::Qwen3
            | DenseFamily::Llama
            | DenseFamily::Qwen2
            | DenseFamily::SmolLm3
            | DenseFamily::Granite
            | DenseFamily::Olmo2,
        ) => read_scaling(&s, &mut r),
    };
    let no_rope_layer_interval = match family {
        DenseFamily::SmolLm3 => Some(read_no_rope_layers(&mut r, num_layers)),
        DenseFamily::Llama
        | DenseFamily::Qwen2
        | DenseFamily::Qwen3
        | DenseFamily::Granite
        | DenseFamily::Phi3
        | DenseFamily::Olmo2 => None,
    };
    // granite.py's multipliers have no defaults.
    let scales = match family {
        DenseFamily::Granite => Some(GraniteScales {
            embedding_multiplier: r.required_float("embedding_multiplier"),
            attention_multiplier: r.required_float("attention_multiplier"),
            residual_multiplier: r.required_float("residual_multiplier"),
            logits_scaling: r.required_float("logits_scaling"),
        }),
        DenseFamily::Llama
        | DenseFamily::Qwen2
        | DenseFamily::Qwen3
        | DenseFamily::SmolLm3
        | DenseFamily::Phi3
        | DenseFamily::Olmo2 => None,
    };
    let quantization = top_quantization(top, &mut r);
    let applied = r.finish_ok()?;
    let spec = DenseSpec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, family.family(), model_type),
        model: DenseModel {
            hidden_size,
            vocab_size,
            rms_norm_eps,
            tie_word_embeddings: tie,
            max_position_embeddings: max_pos,
        },
        layers: DenseLayers {
            num_hidden_layers: num_layers,
        },
        attention: DenseAttention {
            num_attention_heads: num_heads,
            num_key_value_heads: num_kv,
            head_dim,
        },
        rope: DenseRope {
            traditional,
            rope_theta: theta,
            scaling,
            no_rope_layer_interval,
        },
        mlp: DenseMlp { intermediate_size },
        quantization,
        mixed_kv: None,
        scales,
    };
    let issues = check(&spec);
    crate::reader::checked(spec, issues, applied)
}

/// smollm3.py's NoPE layers: `no_rope_layer_interval` (default 4) and, when
/// config.json lists them, `no_rope_layers` (1 = RoPE, 0 = none), which must be
/// the list the interval gives: a spec states the interval only, so another
/// pattern is refused rather than silently replaced.
fn read_no_rope_layers(r: &mut Reader, num_layers: u32) -> u32 {
    let interval = r.uint("no_rope_layer_interval", 4);
    if interval == 0 {
        r.problem(
            "no_rope_layer_interval",
            "0 is out of range (mlx-lm computes (i + 1) % no_rope_layer_interval)",
        );
        return interval;
    }
    let Some(listed) = r.get("no_rope_layers").cloned() else {
        return interval;
    };
    let expected: Vec<Value> = (1..=num_layers)
        .map(|i| json!(u32::from(i % interval != 0)))
        .collect();
    match listed.as_array() {
        Some(list) if *list == expected => {}
        Some(list) if list.len() != num_layers as usize => r.problem(
            "no_rope_layers",
            &format!(
                "{} entries for {num_layers} layers (mlx-lm raises `no_rope_layers` length mismatch)",
                list.len()
            ),
        ),
        _ => r.problem(
            "no_rope_layers",
            &format!(
                "{listed} is not the every-{interval}th-layer pattern of no_rope_layer_interval {interval}; archgen's smollm3 spec states the interval only (drop no_rope_layers or make it match)"
            ),
        ),
    }
    interval
}

/// phi3.py's fields beyond llama's: a partial RoPE is refused (the dense
/// layout rotates the whole head), the window and the long-context sizes noted
/// as what mlx-lm does with them.
fn read_phi3_fields(r: &mut Reader) {
    let factor = r.float("partial_rotary_factor", 1.0);
    if factor != 1.0 {
        r.problem(
            "partial_rotary_factor",
            &format!("{factor}: a partial RoPE (int(head_dim * factor) dims) is not supported for phi3 yet (1.0 is)"),
        );
    }
    if let Some(w) = r.get("sliding_window").cloned() {
        r.note(
            "sliding_window",
            w,
            "ignored: mlx-lm's phi3.py makes every layer full attention",
        );
    }
    if let Some(o) = r.get("original_max_position_embeddings").cloned() {
        r.note(
            "original_max_position_embeddings",
            o,
            "ignored: phi3.py reads it only for su/longrope scaling",
        );
    }
}

/// `rope_scaling` as phi3.py's `ModelArgs.__post_init__` reads it: `type`
/// and `long_factor` required (else mlx-lm raises); `su` / `longrope`
/// (`SuScaledRoPE`) and `linear` are refused until a `RopeKind` runs them; any
/// other type mlx-lm drops with a warning (plain RoPE).
fn read_phi3_scaling(s: &Value, r: &mut Reader) -> Option<RopeScaling> {
    let Some(obj) = s.as_object() else {
        r.problem(
            "rope_scaling",
            &format!("expected an object or null, found {s}"),
        );
        return None;
    };
    let kind = obj.get("type").and_then(Value::as_str);
    match (kind, obj.contains_key("long_factor")) {
        (Some("su" | "longrope"), true) => r.problem(
            "rope_scaling",
            "type `su`/`longrope` (phi3.py's SuScaledRoPE) is not supported yet; Phi-3-mini-4k (rope_scaling null) is",
        ),
        (Some("linear"), true) => r.problem(
            "rope_scaling",
            "type `linear` (nn.RoPE with scale 1 / factor) is not supported for phi3 yet",
        ),
        (Some(other), true) => r.note(
            "rope_scaling",
            s.clone(),
            &format!("ignored: phi3.py warns that type `{other}` is unsupported and sets rope_scaling to None"),
        ),
        (None, _) | (Some(_), false) => r.problem(
            "rope_scaling",
            "must contain `type` and `long_factor` (mlx-lm's phi3.py raises without them)",
        ),
    }
    None
}

/// `rope_scaling` as `initialize_rope` reads it: `type` or `rope_type`.
fn read_scaling(s: &Value, r: &mut Reader) -> Option<RopeScaling> {
    let Some(obj) = s.as_object() else {
        r.problem(
            "rope_scaling",
            &format!("expected an object or null, found {s}"),
        );
        return None;
    };
    let kind = obj
        .get("type")
        .or_else(|| obj.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
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

/// The families of the dense layout in the family registry.
pub(crate) struct DenseFamilies;

impl crate::model_family::ModelFamily for DenseFamilies {
    fn model_types(&self) -> &'static [ConfigModelType] {
        &[
            ConfigModelType::Qwen3,
            ConfigModelType::Llama,
            ConfigModelType::Mistral,
            ConfigModelType::Qwen2,
            ConfigModelType::SmolLm3,
            ConfigModelType::Granite,
            ConfigModelType::Phi3,
            ConfigModelType::Olmo2,
        ]
    }
    fn kv_config_refused(&self) -> Option<&'static str> {
        Some("KV-cache quantization is supported for Gemma-4 only")
    }
    fn import(
        &self,
        c: &crate::model_family::ConfigJson,
    ) -> Result<(crate::Spec, Vec<AppliedDefault>), ImportError> {
        let Some(family) = DenseFamily::of(c.model_type.family()) else {
            return Err(ImportError {
                problems: vec![format!(
                    "model_type: `{}` is not read by the dense layout",
                    c.model_type.as_str()
                )],
            });
        };
        import(c.top, c.model_type, family, c.name)
            .map(|(s, applied)| (crate::Spec::Dense(s), applied))
    }
}
