//! DeepSeek-V3 (`deepseek_v3.py`, also Kimi-K2's `kimi_k2`, which mlx-lm
//! remaps to it) as mlx-lm 0.32.2 runs it: pre-norm layers of multi-head
//! latent attention (queries through `q_lora_rank` or one `q_proj`, keys and
//! values through a normed latent of `kv_lora_rank` and one shared RoPE key
//! of `qk_rope_head_dim`, traditional YaRN RoPE, the attention scale with
//! YaRN's `mscale_all_dim` correction), the dense SwiGLU MLP for the first
//! `first_k_dense_replace` layers and `noaux_tc`-routed experts with shared
//! experts after them (the [`NoauxTcExperts`] section glm4_moe reads too),
//! and an lm_head of its own always.

use crate::dense::{DenseLayers, DenseMlp, DenseModel};
use crate::diag::{FieldPath, Issue};
use crate::layout_reader::{Layout, Text};
use crate::model::*;
use crate::model_family::ModelFamily;
use crate::noaux_tc::NoauxTcExperts;
use crate::reader::{first_quantization, imported_identity, rope_type, ImportedSpec, Reader};
use crate::validate::limits::*;
use crate::{validate, Sections};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// A full DeepSeek-V3 spec (`identity.family: deepseek_v3`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (deepseek_v3 family)")]
pub struct DeepseekV3Spec {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: Identity,
    /// `tie_word_embeddings` must be false: deepseek_v3.py always builds `lm_head`.
    pub model: DenseModel,
    pub layers: DenseLayers,
    pub attention: LatentAttentionSizes,
    pub rope: DeepseekV3Rope,
    /// The dense SwiGLU MLP of the first `first_k_dense_replace` layers.
    pub mlp: DenseMlp,
    pub moe: NoauxTcExperts,
    /// Weight quantization as the mlx config's `quantization` dict, or null.
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
}

/// The sizes of `DeepseekV3Attention`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LatentAttentionSizes {
    /// `num_attention_heads`.
    pub num_attention_heads: u32,
    /// `q_lora_rank`: the queries' low-rank width (`q_a_proj`, `q_a_layernorm`,
    /// `q_b_proj`), or null for one `q_proj`.
    #[serde(deserialize_with = "explicit")]
    pub q_lora_rank: Option<u32>,
    /// `kv_lora_rank`: the latent's width (the cache holds it per token).
    pub kv_lora_rank: u32,
    /// `qk_nope_head_dim`: the query/key dims without RoPE.
    pub qk_nope_head_dim: u32,
    /// `qk_rope_head_dim`: the rotated dims (one key head shared by all).
    pub qk_rope_head_dim: u32,
    /// `v_head_dim`.
    pub v_head_dim: u32,
}

/// RoPE: `initialize_rope(qk_rope_head_dim, rope_theta, traditional=True,
/// scaling)` with a YaRN scaling (the only form archgen runs here).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeepseekV3Rope {
    /// `rope_theta` (the base).
    pub rope_theta: f64,
    /// `rope_scaling` of type `yarn` (or `deepseek_yarn`).
    pub scaling: YarnRopeScaling,
}

/// A `yarn` `rope_scaling` entry as `initialize_rope` passes it to
/// `YarnRoPE` (mlx-lm's defaults where a config leaves a key out).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct YarnRopeScaling {
    /// `factor`: the context extension.
    pub factor: f64,
    /// `original_max_position_embeddings` (default 4096).
    pub original_max_position_embeddings: f64,
    /// `beta_fast` (default 32).
    pub beta_fast: f64,
    /// `beta_slow` (default 1).
    pub beta_slow: f64,
    /// `mscale` (default 1).
    pub mscale: f64,
    /// `mscale_all_dim` (default 0): also corrects the attention scale.
    pub mscale_all_dim: f64,
}

impl YarnRopeScaling {
    /// The IR's RoPE kind for a base of `theta`.
    fn kind(&self, theta: f64) -> crate::ir::RopeKind {
        crate::ir::RopeKind::Yarn {
            theta: theta as f32,
            factor: self.factor,
            original_max_position_embeddings: self.original_max_position_embeddings,
            beta_fast: self.beta_fast,
            beta_slow: self.beta_slow,
            mscale: self.mscale,
            mscale_all_dim: self.mscale_all_dim,
        }
    }

    /// The config.json entry.
    fn config_json(&self) -> Value {
        json!({
            "type": "yarn",
            "factor": self.factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
            "beta_fast": self.beta_fast,
            "beta_slow": self.beta_slow,
            "mscale": self.mscale,
            "mscale_all_dim": self.mscale_all_dim,
        })
    }
}

/// `DeepseekV3Attention.scale`: `q_head_dim ** -0.5`, then `scale * s * s`
/// with `s = 0.1 * mscale_all_dim * log(factor) + 1` where `mscale_all_dim`
/// is not 0 and the factor is above 1 (Python floats).
fn attention_scale(a: &LatentAttentionSizes, y: &YarnRopeScaling) -> f64 {
    let q_head_dim = f64::from(a.qk_nope_head_dim + a.qk_rope_head_dim);
    let scale = q_head_dim.powf(-0.5);
    if y.mscale_all_dim != 0.0 && y.factor > 1.0 {
        let s = 0.1 * y.mscale_all_dim * y.factor.ln() + 1.0;
        scale * s * s
    } else {
        scale
    }
}

fn p(path: &str) -> FieldPath {
    FieldPath::parse(path)
}

/// All semantic errors of a deepseek_v3 spec (full-spec field paths).
pub(crate) fn check(spec: &DeepseekV3Spec) -> Vec<Issue> {
    let mut c = validate::Checker::default();
    c.header(spec.format_version, &spec.identity);
    c.family_is(&spec.identity, Family::DeepseekV3, "deepseek-v3");
    let mt = spec.identity.source.model_type;
    if mt.family() != Family::DeepseekV3 {
        let hint = "the model_type of a DeepSeek-V3 checkpoint is deepseek_v3 (Kimi-K2: kimi_k2)";
        c.foreign_model_type(mt, "deepseek_v3", "deepseek_v3 or kimi_k2", hint);
    }
    let (m, a) = (&spec.model, &spec.attention);
    let mut ok = true;
    ok &= c.range(
        "model.hidden_size",
        m.hidden_size,
        MAX_HIDDEN,
        "the model width",
    );
    ok &= c.range(
        "model.vocab_size",
        m.vocab_size,
        MAX_VOCAB,
        "rows of embed_tokens",
    );
    ok &= c.range(
        "model.max_position_embeddings",
        m.max_position_embeddings,
        MAX_POSITIONS,
        "`max_position_embeddings` from config.json",
    );
    ok &= c.range(
        "layers.num_hidden_layers",
        spec.layers.num_hidden_layers,
        MAX_LAYERS,
        "the number of decoder layers",
    );
    ok &= c.range(
        "attention.num_attention_heads",
        a.num_attention_heads,
        MAX_HEADS,
        "query heads (DeepSeek-V3: 128)",
    );
    for (path, v, max, hint) in [
        (
            "attention.kv_lora_rank",
            a.kv_lora_rank,
            MAX_HIDDEN,
            "the latent's width (DeepSeek-V3: 512)",
        ),
        (
            "attention.qk_nope_head_dim",
            a.qk_nope_head_dim,
            MAX_HEAD_DIM,
            "query/key dims without RoPE (128)",
        ),
        (
            "attention.v_head_dim",
            a.v_head_dim,
            MAX_HEAD_DIM,
            "value dims per head (128)",
        ),
    ] {
        ok &= c.range(path, v, max, hint);
    }
    ok &= c.range(
        "attention.qk_rope_head_dim",
        a.qk_rope_head_dim,
        MAX_HEAD_DIM,
        "the rotated dims (64)",
    );
    ok &= c.even_head_dim("attention.qk_rope_head_dim", a.qk_rope_head_dim);
    if let Some(r) = a.q_lora_rank {
        ok &= c.range(
            "attention.q_lora_rank",
            r,
            MAX_HIDDEN,
            "the queries' low rank (1536)",
        );
    }
    ok &= c.range(
        "mlp.intermediate_size",
        spec.mlp.intermediate_size,
        MAX_INTERMEDIATE,
        "SwiGLU width of the first_k_dense_replace dense layers",
    );
    ok &= spec.moe.check(&mut c, spec.layers.num_hidden_layers);
    let y = &spec.rope.scaling;
    for (path, v, hint) in [
        (
            "rope.scaling.factor",
            y.factor,
            "the context extension (DeepSeek-V3: 40)",
        ),
        (
            "rope.scaling.original_max_position_embeddings",
            y.original_max_position_embeddings,
            "the pre-extension context (4096)",
        ),
        ("rope.scaling.beta_fast", y.beta_fast, "32"),
        ("rope.scaling.beta_slow", y.beta_slow, "1"),
    ] {
        ok &= c.positive_finite(path, v, hint);
    }
    for (path, v) in [
        ("rope.scaling.mscale", y.mscale),
        ("rope.scaling.mscale_all_dim", y.mscale_all_dim),
    ] {
        if !v.is_finite() {
            ok = false;
            c.err(
                p(path),
                format!("{v}"),
                "a finite number",
                "DeepSeek-V3: 1.0",
            );
        }
    }
    if m.tie_word_embeddings {
        c.err(
            p("model.tie_word_embeddings"),
            "true",
            "false",
            "deepseek_v3.py always builds its own lm_head and never ties it to the embedding",
        );
    }
    c.eps(m.rms_norm_eps, "DeepSeek-V3 uses 1.0e-6");
    c.rope_theta(spec.rope.rope_theta, "the RoPE base, e.g. 10000.0");
    c.finish(ok, spec.quantization.as_ref(), || lower(spec))
}

/// The IR of a valid deepseek_v3 spec: pre-norm latent attention layers,
/// each with the `moe` section's feed-forward half for its index.
pub(crate) fn lower(spec: &DeepseekV3Spec) -> crate::ir::ModelIr {
    use crate::ir::*;
    use crate::ir_parts::*;
    let a = &spec.attention;
    let attention = LatentAttention {
        n_heads: a.num_attention_heads as usize,
        query: match a.q_lora_rank {
            None => LatentQuery::Direct,
            Some(rank) => LatentQuery::LowRank {
                rank: rank as usize,
            },
        },
        kv_lora_rank: a.kv_lora_rank as usize,
        qk_nope_head_dim: a.qk_nope_head_dim as usize,
        qk_rope_head_dim: a.qk_rope_head_dim as usize,
        v_head_dim: a.v_head_dim as usize,
        rope: RopeForm {
            kind: spec.rope.scaling.kind(spec.rope.rope_theta),
            traditional: true,
            rotated_dims: a.qk_rope_head_dim as usize,
        },
        scale: attention_scale(a, &spec.rope.scaling),
    };
    let norms = direct_norms(NormArrangement::PreNorm);
    let layers = (0..spec.layers.num_hidden_layers)
        .map(|i| {
            let ffn = spec.moe.ffn(i, spec.mlp.intermediate_size);
            layer(
                i as usize,
                norms,
                Mixer::LatentAttention(attention),
                ffn,
                Residual::Plain,
            )
        })
        .collect();
    model_ir(
        spec,
        ModelParts {
            prefix: ModulePrefix::Model,
            // Model.sanitize: fp8 / packed int4 refused (converted by mlx-lm
            // first), per-expert weights stacked, kv_b_proj split, the MTP
            // layer after the stack dropped.
            sanitize: vec![
                SanitizeRule::RefuseFp8AndPackedInt4,
                SanitizeRule::StackExperts,
                SanitizeRule::SplitKvBProj,
                SanitizeRule::DropLayerPastStack,
                SanitizeRule::DropRotaryTables,
            ],
            sharding: whole_head_sharding(ShardOracle::MlxLm),
            embedding: scaled_embedding(EmbedScale::None),
            layers,
            head: plain_head(false),
        },
    )
}

/// The spec with config.json field names (impl_document! adds `quantization`).
pub(crate) fn config_fields(spec: &DeepseekV3Spec) -> Value {
    let (m, a) = (&spec.model, &spec.attention);
    let mut own = json!({
        "hidden_size": m.hidden_size,
        "vocab_size": m.vocab_size,
        "rms_norm_eps": m.rms_norm_eps,
        "tie_word_embeddings": m.tie_word_embeddings,
        "max_position_embeddings": m.max_position_embeddings,
        "num_hidden_layers": spec.layers.num_hidden_layers,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_attention_heads,
        "q_lora_rank": a.q_lora_rank,
        "kv_lora_rank": a.kv_lora_rank,
        "qk_nope_head_dim": a.qk_nope_head_dim,
        "qk_rope_head_dim": a.qk_rope_head_dim,
        "v_head_dim": a.v_head_dim,
        "attention_bias": false,
        "intermediate_size": spec.mlp.intermediate_size,
        "rope_theta": spec.rope.rope_theta,
        "rope_scaling": spec.rope.scaling.config_json(),
        "moe_layer_freq": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "model_type": spec.identity.source.model_type.as_str(),
    });
    spec.moe.add_config_fields(&mut own);
    own
}

/// How a deepseek_v3 document is read (see [`crate::layout_reader`]).
pub(crate) const LAYOUT: Layout = Layout {
    family: "deepseek_v3",
    anchor: "deepseek-v3",
    head: crate::layout_reader::HEAD,
    sections: &[
        ("model", Sections::check::<DenseModel>),
        ("layers", Sections::check::<DenseLayers>),
        ("attention", Sections::check::<LatentAttentionSizes>),
        ("rope", Sections::check::<DeepseekV3Rope>),
        ("mlp", Sections::check::<DenseMlp>),
        ("moe", Sections::check::<NoauxTcExperts>),
        ("quantization", Sections::check::<Option<Quantization>>),
    ],
    texts: &[
        Text::Field("model", "a mapping {hidden_size, vocab_size, rms_norm_eps, tie_word_embeddings, max_position_embeddings}", "see docs/spec-format.md#deepseek-v3"),
        Text::Field("layers", "a mapping {num_hidden_layers}", "see docs/spec-format.md#deepseek-v3"),
        Text::Field("attention", "a mapping {num_attention_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim}", "the latent attention's sizes; see docs/spec-format.md#deepseek-v3"),
        Text::Field("rope", "a mapping {rope_theta, scaling: {factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim}}", "the RoPE base and its YaRN scaling; see docs/spec-format.md#deepseek-v3"),
        Text::Field("mlp", "a mapping {intermediate_size}", "SwiGLU width of the first_k_dense_replace dense layers; see docs/spec-format.md#deepseek-v3"),
        Text::Field("moe", crate::noaux_tc::EXPECTED, "the routed and shared experts; see docs/spec-format.md#deepseek-v3"),
    ],
};

crate::document::impl_document!(DeepseekV3Spec, check);

/// The `rope_scaling` of a deepseek_v3 config: `yarn` (or `deepseek_yarn`)
/// with mlx-lm's `YarnRoPE` defaults for the keys left out; any other type
/// (or none) is refused.
fn read_yarn(r: &mut Reader) -> YarnRopeScaling {
    let fallback = YarnRopeScaling {
        factor: 1.0,
        original_max_position_embeddings: 4096.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        mscale: 1.0,
        mscale_all_dim: 0.0,
    };
    let Some(scaling) = r.get("rope_scaling").and_then(Value::as_object).cloned() else {
        r.problem(
            "rope_scaling",
            "missing or not a mapping: archgen runs deepseek_v3 with its YaRN RoPE only \
             (mlx-lm's nn.RoPE(traditional=True) without scaling is not supported yet)",
        );
        return fallback;
    };
    match rope_type(&scaling) {
        "yarn" | "deepseek_yarn" => {}
        other => {
            r.problem(
                "rope_scaling",
                &format!("rope type `{other}` is not supported for deepseek_v3 (archgen reads yarn only)"),
            );
            return fallback;
        }
    }
    let mut y = Reader::new(&scaling, "rope_scaling.");
    let read = YarnRopeScaling {
        factor: y.required_float("factor"),
        original_max_position_embeddings: y.float("original_max_position_embeddings", 4096.0),
        beta_fast: y.float("beta_fast", 32.0),
        beta_slow: y.float("beta_slow", 1.0),
        mscale: y.float("mscale", 1.0),
        mscale_all_dim: y.float("mscale_all_dim", 0.0),
    };
    r.absorb(y);
    read
}

/// Imports a `deepseek_v3` (or `kimi_k2`) config.json as mlx-lm 0.32.2's
/// `ModelArgs` reads it.
pub(crate) fn import(
    top: &Map<String, Value>,
    name: &str,
    model_type: ConfigModelType,
) -> ImportedSpec<DeepseekV3Spec> {
    let mut r = Reader::new(top, "");
    let model = DenseModel {
        hidden_size: r.required_uint("hidden_size"),
        vocab_size: r.required_uint("vocab_size"),
        rms_norm_eps: r.float("rms_norm_eps", 1e-6),
        tie_word_embeddings: false,
        max_position_embeddings: r.uint("max_position_embeddings", 2048),
    };
    if top.get("tie_word_embeddings") == Some(&Value::Bool(true)) {
        r.note(
            "tie_word_embeddings",
            Value::Bool(false),
            "ignored: deepseek_v3.py always builds its own lm_head",
        );
    }
    let layers = DenseLayers {
        num_hidden_layers: r.required_uint("num_hidden_layers"),
    };
    let attention = LatentAttentionSizes {
        num_attention_heads: r.required_uint("num_attention_heads"),
        q_lora_rank: match top.get("q_lora_rank") {
            Some(Value::Null) => None,
            _ => Some(r.uint("q_lora_rank", 1536)),
        },
        kv_lora_rank: r.uint("kv_lora_rank", 512),
        qk_nope_head_dim: r.uint("qk_nope_head_dim", 128),
        qk_rope_head_dim: r.uint("qk_rope_head_dim", 64),
        v_head_dim: r.uint("v_head_dim", 128),
    };
    if top.get("attention_bias") == Some(&Value::Bool(true)) {
        r.problem(
            "attention_bias",
            "true: archgen's latent attention has no bias on q_a_proj, kv_a_proj_with_mqa and o_proj yet",
        );
    }
    match top.get("moe_layer_freq").and_then(Value::as_u64) {
        None | Some(1) => {}
        Some(f) => r.problem(
            "moe_layer_freq",
            &format!(
                "{f}: archgen runs experts on every layer from first_k_dense_replace on (1) only"
            ),
        ),
    }
    let rope = DeepseekV3Rope {
        rope_theta: r.float("rope_theta", 10000.0),
        scaling: read_yarn(&mut r),
    };
    let mlp = DenseMlp {
        intermediate_size: r.required_uint("intermediate_size"),
    };
    let moe = NoauxTcExperts::read(top, &mut r);
    // The published checkpoints' `quantization_config` is their own fp8
    // (or packed int4) form, which the loader refuses: noted, not read.
    let quantization = match top.get("quantization_config") {
        Some(q)
            if q.get("quant_method")
                .and_then(Value::as_str)
                .is_some_and(|m| m != "mlx") =>
        {
            r.note(
                "quantization_config",
                q.clone(),
                "ignored: the checkpoint's own fp8 / packed int4 form, which archgen does not \
                 load; convert the checkpoint with mlx-lm first",
            );
            first_quantization(&[(top.get("quantization"), "quantization")], &mut r)
        }
        _ => crate::reader::top_quantization(top, &mut r),
    };
    r.build_checked(check, || DeepseekV3Spec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, Family::DeepseekV3, model_type),
        model,
        layers,
        attention,
        rope,
        mlp,
        moe,
        quantization,
    })
}

/// deepseek_v3 in the family registry.
pub(crate) const FAMILY: ModelFamily = ModelFamily {
    reads: |t| t.family() == crate::Family::DeepseekV3,
    kv_config: crate::model_family::GEMMA4_ONLY,
    import: |c| {
        import(c.top, c.name, c.model_type)
            .map(|(s, applied)| (crate::Spec::DeepseekV3(s), applied))
    },
};
