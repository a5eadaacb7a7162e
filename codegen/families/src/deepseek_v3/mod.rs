//! DeepSeek-V3 (`deepseek_v3.py`, also Kimi-K2's `kimi_k2`, which mlx-lm
//! remaps to it) as mlx-lm 0.32.2 runs it: pre-norm layers of multi-head
//! latent attention (queries through `q_lora_rank` or one `q_proj`, keys and
//! values through a normed latent of `kv_lora_rank` and one shared RoPE key
//! of `qk_rope_head_dim`, traditional YaRN RoPE, the attention scale with
//! YaRN's `mscale_all_dim` correction), the dense SwiGLU MLP for the first
//! `first_k_dense_replace` layers and `noaux_tc`-routed experts with shared
//! experts after them (the [`NoauxTcExperts`] section glm4_moe reads too),
//! and an lm_head of its own always.

use crate::dense::{check_model_sizes, DenseLayers, DenseMlp, DenseModel};
use crate::diag::Issue;
use crate::layout_reader::{Layout, Section, QUANTIZATION};
use crate::model::*;
use crate::noaux_tc::NoauxTcExperts;
use crate::validate::limits::*;
use crate::validate::{self, ranges};
use crate::yarn::YarnScaling;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod import;
pub(crate) use import::FAMILY;

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

crate::yarn::yarn_section! {
    /// A `yarn` `rope_scaling` entry as `initialize_rope` passes it to
    /// `YarnRoPE` (mlx-lm's defaults where a config leaves a key out).
    pub struct YarnRopeScaling {
        /// `factor`: the context extension.
        factor,
        /// `mscale_all_dim` (default 0): also corrects the attention scale.
        mscale_all_dim,
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

/// All semantic errors of a deepseek_v3 spec (full-spec field paths).
pub(crate) fn check(spec: &DeepseekV3Spec) -> Vec<Issue> {
    let mut c = validate::Checker::for_document(spec, Family::DeepseekV3, &LAYOUT);
    let mt = spec.identity.source.model_type;
    if mt.family() != Family::DeepseekV3 {
        let hint = "the model_type of a DeepSeek-V3 checkpoint is deepseek_v3 (Kimi-K2: kimi_k2)";
        c.foreign_model_type(mt, "deepseek_v3", "deepseek_v3 or kimi_k2", hint);
    }
    let (m, a) = (&spec.model, &spec.attention);
    let mut ok = check_model_sizes(&mut c, m, spec.layers.num_hidden_layers);
    ok &= ranges! { c;
        "attention.num_attention_heads": a.num_attention_heads => MAX_HEADS, "query heads (DeepSeek-V3: 128)";
        "attention.kv_lora_rank": a.kv_lora_rank => MAX_HIDDEN, "the latent's width (DeepSeek-V3: 512)";
        "attention.qk_nope_head_dim": a.qk_nope_head_dim => MAX_HEAD_DIM, "query/key dims without RoPE (128)";
        "attention.v_head_dim": a.v_head_dim => MAX_HEAD_DIM, "value dims per head (128)";
    };
    let rotated = "the rotated dims (64)";
    ok &= c.rotated_head_dim("attention.qk_rope_head_dim", a.qk_rope_head_dim, rotated);
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
    let hints = [
        "the context extension (DeepSeek-V3: 40)",
        "the pre-extension context (4096)",
        "32",
        "1",
    ];
    ok &= spec.rope.scaling.check(&mut c, hints, "DeepSeek-V3: 1.0");
    c.own_lm_head(m.tie_word_embeddings, "deepseek_v3.py");
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
    plain_model_ir(
        spec,
        // Model.sanitize: fp8 / packed int4 refused (converted by mlx-lm
        // first), per-expert weights stacked, kv_b_proj split, the MTP
        // layer after the stack dropped.
        vec![
            SanitizeRule::RefuseFp8AndPackedInt4,
            SanitizeRule::StackExperts,
            SanitizeRule::SplitKvBProj,
            SanitizeRule::DropLayerPastStack,
            SanitizeRule::DropRotaryTables,
        ],
        ShardOracle::MlxLm,
        layers,
        false, // its own lm_head
    )
}

/// The spec with config.json field names (impl_document! adds `quantization`).
pub(crate) fn config_fields(spec: &DeepseekV3Spec) -> Value {
    let a = &spec.attention;
    let mut own = json!({
        "q_lora_rank": a.q_lora_rank,
        "kv_lora_rank": a.kv_lora_rank,
        "qk_nope_head_dim": a.qk_nope_head_dim,
        "qk_rope_head_dim": a.qk_rope_head_dim,
        "v_head_dim": a.v_head_dim,
        "attention_bias": false,
        "intermediate_size": spec.mlp.intermediate_size,
        "rope_theta": spec.rope.rope_theta,
        "rope_scaling": spec.rope.scaling.config_json("type"),
        "moe_layer_freq": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
    });
    spec.moe.add_config_fields(&mut own);
    // Every head has its own keys and values (the latent expands to them).
    let heads = (a.num_attention_heads, a.num_attention_heads);
    let layers = spec.layers.num_hidden_layers;
    crate::hf::model_stack_json(&spec.identity, layers, &spec.model, heads, own)
}

/// How a deepseek_v3 document is read (see [`crate::layout_reader`]).
pub(crate) const LAYOUT: Layout = Layout {
    family: "deepseek_v3",
    anchor: "deepseek-v3",
    head: crate::layout_reader::HEAD,
    sections: &[
        Section::hinted::<DenseModel>("model", ""),
        Section::hinted::<DenseLayers>("layers", ""),
        Section::described::<LatentAttentionSizes>("attention", "a mapping {num_attention_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim}", "the latent attention's sizes"),
        Section::described::<DeepseekV3Rope>("rope", "a mapping {rope_theta, scaling: {factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim}}", "the RoPE base and its YaRN scaling"),
        crate::noaux_tc::DENSE_MLP,
        crate::noaux_tc::MOE,
        QUANTIZATION,
    ],
    texts: &[],
};

crate::document::impl_document!(DeepseekV3Spec, check);
