//! Qwen3.5 / Qwen3.6 (`qwen3_5.py`) as mlx-lm 0.32.2 runs it: a hybrid stack
//! in which layer `i` is a Gated DeltaNet linear-attention layer when
//! `(i + 1) % full_attention_interval != 0` and a gated full-attention layer
//! otherwise (mlx-lm ignores the config's `layer_types`). Full layers are
//! `Qwen3NextAttention`: `q_proj` of `2 * heads * head_dim` (queries and an
//! output gate per head), q/k RMSNorm per head, a partial `nn.RoPE` of
//! `int(head_dim * partial_rotary_factor)` dims, SDPA with `head_dim ** -0.5`,
//! `o_proj(output * sigmoid(gate))`. Every layer is pre-norm with a SwiGLU
//! MLP (the dense form: `num_experts == 0`).
//!
//! Everything family-specific on the spec side lives here: the document, its
//! validation, the lowering to the block IR, the config.json view, the YAML
//! writer, the reduction to tiny variants and the config.json importer. The
//! document is also Qwen3-Next's (`qwen3_next.rs`, a child module, as the
//! Gemma parent's variants are): what differs per module is a
//! `Qwen35Variant`, Qwen3.5's being `QWEN3_5`.

pub(crate) mod qwen3_next;

use crate::dense::{DenseAttention, DenseMlp, DenseModel};
use crate::diag::{FieldPath, Issue};
use crate::layout_reader::{Layout, Section, Text, QUANTIZATION};
use crate::model::*;
use crate::model_family::{KvConfig, ModelFamily};
use crate::reader::{first_quantization, imported_identity, rope_type, ImportedSpec, Reader};
use crate::reduce::{last_key, reduce_key, set_named, sizes_named, Reducible, Size};
use crate::validate::{self, ranges};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

fn p(s: &str) -> FieldPath {
    FieldPath::parse(s)
}

/// A full Qwen3.5 spec (`identity.family: qwen3_5`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (qwen3_5 family)")]
pub struct Qwen35Spec {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: Identity,
    pub model: DenseModel,
    pub layers: Qwen35Layers,
    /// The gated full-attention layers.
    pub attention: DenseAttention,
    pub rope: Qwen35Rope,
    pub linear_attention: Qwen35LinearAttention,
    /// The dense SwiGLU MLP of every layer, or null with `moe`.
    #[serde(deserialize_with = "explicit")]
    pub mlp: Option<DenseMlp>,
    /// Routed experts and a shared expert on every layer (`num_experts > 0`),
    /// or null for the dense form.
    #[serde(deserialize_with = "explicit")]
    pub moe: Option<Qwen35Moe>,
    /// Weight quantization as the mlx config's `quantization` dict, or null.
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
}

/// The layer stack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Qwen35Layers {
    /// `num_hidden_layers`.
    pub num_hidden_layers: u32,
    /// `full_attention_interval`: layer i is full attention when
    /// `(i + 1) % interval == 0`, Gated DeltaNet otherwise.
    pub full_attention_interval: u32,
}

/// RoPE of the full layers: `nn.RoPE(int(head_dim * partial_rotary_factor),
/// traditional=False, base=rope_theta)` (`rope_parameters` of type default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Qwen35Rope {
    /// `rope_parameters.rope_theta` (the base).
    pub rope_theta: f64,
    /// `rope_parameters.partial_rotary_factor`: the rotated share of head_dim.
    pub partial_rotary_factor: f64,
}

/// The Gated DeltaNet layers (`linear_*` of config.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Qwen35LinearAttention {
    /// `linear_num_key_heads`.
    pub linear_num_key_heads: u32,
    /// `linear_num_value_heads` (a multiple of the key heads).
    pub linear_num_value_heads: u32,
    /// `linear_key_head_dim`.
    pub linear_key_head_dim: u32,
    /// `linear_value_head_dim`.
    pub linear_value_head_dim: u32,
    /// `linear_conv_kernel_dim`: width of the depthwise causal conv1d.
    pub linear_conv_kernel_dim: u32,
}

/// The MoE feed-forward half (`Qwen3NextSparseMoeBlock`): a softmax-then-top-k
/// router `mlp.gate`, SwiGLU experts `mlp.switch_mlp`, and a shared SwiGLU
/// expert `mlp.shared_expert` scaled by `sigmoid(mlp.shared_expert_gate(x))`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Qwen35Moe {
    /// `num_experts` (at least 1).
    pub num_experts: u32,
    /// `num_experts_per_tok`: the top-k each token is routed to.
    pub num_experts_per_tok: u32,
    /// `moe_intermediate_size`: each expert's SwiGLU width.
    pub moe_intermediate_size: u32,
    /// `shared_expert_intermediate_size`: the shared expert's SwiGLU width.
    pub shared_expert_intermediate_size: u32,
    /// `norm_topk_prob`: renormalize the k chosen probabilities.
    pub norm_topk_prob: bool,
}

crate::reduce::derived_form! {
    /// A derived Qwen3.5 spec file: a declared reduction of a Qwen3.5 spec.
    file Qwen35DerivedSpecFile titled "archgen architecture spec (derived qwen3_5 form)" for Qwen35Spec;

    /// How a derived Qwen3.5 spec is made from its parent.
    derive Qwen35Derive {}

    /// The reduced sizes of a Qwen3.5 spec; everything else (the interval, the
    /// conv kernel, RoPE) is inherited.
    reduce Qwen35Reduce {
        /// The dense MLP's width; null for the MoE form.
        #[serde(deserialize_with = "explicit")]
        pub intermediate_size: Option<u32>,
        pub linear_num_key_heads: u32,
        pub linear_num_value_heads: u32,
        pub linear_key_head_dim: u32,
        pub linear_value_head_dim: u32,
        /// The experts' sizes; null for the dense form.
        #[serde(deserialize_with = "explicit")]
        pub moe: Option<Qwen35MoeReduce>,
    }
}

/// The reduced expert sizes of a Qwen3.5 MoE spec (`norm_topk_prob` is inherited).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Qwen35MoeReduce {
    pub num_experts: u32,
    pub num_experts_per_tok: u32,
    pub moe_intermediate_size: u32,
    pub shared_expert_intermediate_size: u32,
}

// ---------------------------------------------------------------- layers

/// Whether layer `i` is a Gated DeltaNet layer (`DecoderLayer.is_linear`).
pub(crate) fn is_linear_layer(spec: &Qwen35Spec, i: u32) -> bool {
    let n = spec.layers.full_attention_interval;
    n == 0 || (i + 1) % n != 0
}

/// Python's `int(head_dim * partial_rotary_factor)` (truncated, in f64).
fn rotated_dims(spec: &Qwen35Spec) -> u32 {
    (f64::from(spec.attention.head_dim) * spec.rope.partial_rotary_factor) as u32
}

// ---------------------------------------------------------------- variants

/// What a family of the Qwen3.5 layout states beside its document: Qwen3.5's
/// value ([`QWEN3_5`]) is the parent; another module that shares the stack is
/// its difference from it (`qwen3_next.rs`).
pub(crate) struct Qwen35Variant {
    pub family: Family,
    pub layout: Layout,
    /// The model types of this family and, for each, what the module asks of
    /// the spec (qwen3_5_moe: the experts).
    pub check_model_type: fn(&mut validate::Checker, &Qwen35Spec),
    pub feed_forward: FeedForwardSections,
    /// How the Gated DeltaNet projects its input.
    pub in_proj: crate::ir::InProj,
    /// Where the text model sits in the checkpoint.
    pub prefix: crate::ir::ModulePrefix,
    /// The module's `sanitize`, as rules, for this spec.
    pub sanitize: fn(&Qwen35Spec) -> Vec<crate::ir::SanitizeRule>,
    pub sharding: crate::ir::Sharding,
    /// The config.json fields of RoPE and of the feed-forward half, added to
    /// the dense stack's.
    pub config_fields: fn(&Qwen35Spec) -> Value,
}

/// Which of the `mlp` and `moe` sections a spec of the variant writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FeedForwardSections {
    /// One or the other: qwen3_5 builds the MoE block on every layer when
    /// `num_experts > 0`, and reads no dense width then.
    MlpOrMoe,
    /// `mlp` always (its `ModelArgs` requires `intermediate_size`), `moe`
    /// too for the sparse form, whose block then runs on every layer.
    MlpAndOptionalMoe,
}

const VARIANTS: [&Qwen35Variant; 2] = [&QWEN3_5, &qwen3_next::QWEN3_NEXT];

/// The variant of `family`, if it has the Qwen3.5 layout (a document
/// declaring it is read with the variant's layout).
pub(crate) fn variant_of(family: Family) -> Option<&'static Qwen35Variant> {
    VARIANTS.into_iter().find(|v| v.family == family)
}

impl Qwen35Spec {
    /// The variant this spec's `identity.family` names (checked to be one of
    /// this layout when it was read; one built in code reads as Qwen3.5).
    pub(crate) fn variant(&self) -> &'static Qwen35Variant {
        variant_of(self.identity.family).unwrap_or(&QWEN3_5)
    }
}

/// Qwen3.5 / Qwen3.6 (`qwen3_5.py`, `qwen3_5_moe.py`).
pub(crate) const QWEN3_5: Qwen35Variant = Qwen35Variant {
    family: Family::Qwen35,
    layout: LAYOUT,
    check_model_type: |c, spec| {
        let mt = spec.identity.source.model_type;
        match mt {
            ConfigModelType::Qwen35 => {}
            ConfigModelType::Qwen35Moe => {
                if spec.moe.is_none() {
                    c.err(
                        p("moe"),
                        "null, but model_type qwen3_5_moe is the MoE form",
                        "the experts' section {num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size, norm_topk_prob}",
                        "write the experts, or model_type qwen3_5 for the dense form",
                    );
                }
            }
            _ => c.foreign_model_type(
                mt,
                "qwen3_5",
                "qwen3_5 or qwen3_5_moe",
                "the model_type of a Qwen3.5 checkpoint is qwen3_5 (qwen3_5_moe for the MoE form)",
            ),
        }
    },
    feed_forward: FeedForwardSections::MlpOrMoe,
    in_proj: crate::ir::InProj::Split,
    prefix: crate::ir::ModulePrefix::LanguageModel,
    // Model.sanitize (vision dropped, model.language_model moved under
    // language_model.model) and TextModel.sanitize (mtp dropped, the raw conv
    // layout moved, raw norms + 1); qwen3_5_moe's splits the fused HF experts
    // first.
    sanitize: |spec| {
        use crate::ir::SanitizeRule::*;
        let mut rules = vec![DropVisual, UnwrapMultimodal];
        if spec.identity.source.model_type == ConfigModelType::Qwen35Moe {
            rules.push(SplitSwitchMlpGateUp);
        }
        rules.extend([DropMtp, MoveConvAxis, OffsetNormsOfRawCheckpoint]);
        rules
    },
    // qwen3_5.py's shard() (qwen3_5_moe's Model is a qwen3_5 one).
    sharding: crate::ir::Sharding {
        oracle: crate::ir::ShardOracle::MlxLm,
        head: crate::ir::HeadSplit::OverVocabulary,
        kv_heads: crate::ir::KvHeadSplit::RepeatedWhenFewer,
    },
    config_fields: qwen3_5_fields,
};

// ---------------------------------------------------------------- validation

/// All semantic errors of a Qwen3.5 spec (full-spec field paths).
pub(crate) fn check(spec: &Qwen35Spec) -> Vec<Issue> {
    use validate::limits::*;
    let variant = spec.variant();
    let mut c = validate::Checker::for_document(spec, variant.family, &variant.layout);
    (variant.check_model_type)(&mut c, spec);
    let (m, a, la) = (&spec.model, &spec.attention, &spec.linear_attention);
    let mut ok = crate::dense::check_model_sizes(&mut c, m, spec.layers.num_hidden_layers);
    ok &= ranges! { c;
        "layers.full_attention_interval": spec.layers.full_attention_interval => MAX_LAYERS, "every interval-th layer is full attention (Qwen3.5: 4)";
        "attention.num_attention_heads": a.num_attention_heads => MAX_HEADS, "query heads of the full layers";
        "attention.num_key_value_heads": a.num_key_value_heads => MAX_HEADS, "KV heads of the full layers";
        "attention.head_dim": a.head_dim => MAX_HEAD_DIM, "head dimension of the full layers";
    };
    if let Some(mlp) = &spec.mlp {
        ok &= c.range(
            "mlp.intermediate_size",
            mlp.intermediate_size,
            MAX_INTERMEDIATE,
            "SwiGLU width",
        );
    }
    match (&spec.mlp, &spec.moe, variant.feed_forward) {
        (Some(_), None, _) => {}
        (None, Some(e), FeedForwardSections::MlpOrMoe)
        | (Some(_), Some(e), FeedForwardSections::MlpAndOptionalMoe) => {
            let hints = [
                "routed experts per layer (Qwen3.6-35B-A3B: 256)",
                "experts each token is routed to (Qwen3.6-35B-A3B: 8)",
            ];
            let experts = ("moe.num_experts", e.num_experts);
            ok &= c.expert_counts(experts, e.num_experts_per_tok, hints);
            for (field, v, hint) in [
                (
                    "moe_intermediate_size",
                    e.moe_intermediate_size,
                    "SwiGLU width of each expert",
                ),
                (
                    "shared_expert_intermediate_size",
                    e.shared_expert_intermediate_size,
                    "SwiGLU width of the shared expert",
                ),
            ] {
                ok &= c.range(&format!("moe.{field}"), v, MAX_INTERMEDIATE, hint);
            }
            if ok {
                ok = c.top_k_of_experts(e.num_experts_per_tok, e.num_experts);
            }
        }
        (Some(_), Some(_), FeedForwardSections::MlpOrMoe) => {
            ok = false;
            c.err(
                p("mlp"),
                "both a dense mlp and moe are written",
                "null when moe is written",
                "mlx-lm's qwen3_5 builds the MoE block on every layer when num_experts > 0, and no dense MLP",
            );
        }
        (None, None, _) => {
            ok = false;
            c.err(
                p("mlp"),
                "null, and moe is null too",
                "{intermediate_size} for the dense form (or the moe section)",
                "every layer has a feed-forward half",
            );
        }
        (None, Some(_), FeedForwardSections::MlpAndOptionalMoe) => {
            ok = false;
            c.err(
                p("mlp"),
                "null",
                "{intermediate_size}, also beside moe",
                "qwen3_next's ModelArgs requires intermediate_size (the dense MLP of layers the experts skip)",
            );
        }
    }
    for (field, v, hint) in [
        (
            "linear_num_key_heads",
            la.linear_num_key_heads,
            "key heads of the Gated DeltaNet layers (Qwen3.5-4B: 16)",
        ),
        (
            "linear_num_value_heads",
            la.linear_num_value_heads,
            "value heads of the Gated DeltaNet layers (Qwen3.5-4B: 32)",
        ),
        (
            "linear_key_head_dim",
            la.linear_key_head_dim,
            "key head dimension of the Gated DeltaNet layers (Qwen3.5-4B: 128)",
        ),
        (
            "linear_value_head_dim",
            la.linear_value_head_dim,
            "value head dimension of the Gated DeltaNet layers (Qwen3.5-4B: 128)",
        ),
    ] {
        ok &= c.range(
            &format!("linear_attention.{field}"),
            v,
            if field.ends_with("heads") {
                MAX_HEADS
            } else {
                MAX_HEAD_DIM
            },
            hint,
        );
    }
    ok &= c.range(
        "linear_attention.linear_conv_kernel_dim",
        la.linear_conv_kernel_dim,
        64,
        "width of the causal conv1d (Qwen3.5: 4)",
    );
    if ok && la.linear_conv_kernel_dim < 2 {
        ok = false;
        c.err(
            p("linear_attention.linear_conv_kernel_dim"),
            "a conv kernel of 1 keeps no conv state",
            "at least 2",
            "mlx-lm keeps the last kernel - 1 inputs as the conv state (`conv_input[:, -(K-1):]`), which is empty only in name at K = 1",
        );
    }
    if ok && la.linear_num_value_heads % la.linear_num_key_heads != 0 {
        ok = false;
        c.err(
            p("linear_attention.linear_num_value_heads"),
            format!(
                "{} value heads are not a multiple of {} key heads",
                la.linear_num_value_heads, la.linear_num_key_heads
            ),
            "a multiple of linear_num_key_heads",
            "mlx-lm's GatedDeltaNet repeats q and k to the value heads (it refuses other counts)",
        );
    }
    if ok && spec.layers.full_attention_interval > spec.layers.num_hidden_layers {
        ok = false;
        c.err(
            p("layers.full_attention_interval"),
            format!(
                "interval {} with {} layers leaves no full-attention layer",
                spec.layers.full_attention_interval, spec.layers.num_hidden_layers
            ),
            format!(
                "at most num_hidden_layers ({})",
                spec.layers.num_hidden_layers
            ),
            "mlx-lm builds the attention mask from layer interval - 1's cache, which must exist",
        );
    }
    c.eps(m.rms_norm_eps, "Qwen3.5 uses 1.0e-6");
    ok &= c.head_geometry(a.head_dim, a.num_attention_heads, a.num_key_value_heads);
    let factor_ok = c.positive_finite(
        "rope.partial_rotary_factor",
        spec.rope.partial_rotary_factor,
        "the rotated share of head_dim (Qwen3.5: 0.25)",
    );
    if factor_ok {
        let dims = rotated_dims(spec);
        if spec.rope.partial_rotary_factor > 1.0 || dims == 0 || dims % 2 != 0 {
            ok = false;
            c.err(
                p("rope.partial_rotary_factor"),
                format!(
                    "int(head_dim {} x {}) = {dims} rotated dimensions",
                    a.head_dim, spec.rope.partial_rotary_factor
                ),
                "a factor in (0, 1] giving an even, non-zero number of dimensions",
                "RoPE rotates pairs of dimensions within the head",
            );
        }
    } else {
        ok = false;
    }
    c.rope_theta(spec.rope.rope_theta, "the RoPE base, e.g. 10000000.0");
    c.finish(ok, spec.quantization.as_ref(), || lower(spec))
}

// ---------------------------------------------------------------- lowering

/// The IR of a valid Qwen3.5 spec: pre-norm layers with a SwiGLU MLP; the
/// mixer a Gated DeltaNet (`Mixer::GatedDeltaNet`, its conv and recurrent
/// state in an `ArraysCache`) or, every `full_attention_interval`-th layer,
/// gated attention (`OutputGate::SigmoidPerHead`, q/k RMSNorm, a partial
/// default RoPE, `head_dim ** -0.5`, a plain KV cache). The Gated DeltaNet's
/// projections, the checkpoint's prefix, sanitize and sharding are the
/// variant's (qwen3_5: mlx-lm's `Model` wrapper, `language_model.model.*`).
pub(crate) fn lower(spec: &Qwen35Spec) -> crate::ir::ModelIr {
    use crate::ir::*;
    use crate::ir_parts::*;
    let (a, la, variant) = (&spec.attention, &spec.linear_attention, spec.variant());
    let ffn = match (&spec.mlp, &spec.moe) {
        (_, Some(e)) => FeedForward::MoeAndSharedExpert {
            moe: softmax_topk_experts(
                e.num_experts,
                e.num_experts_per_tok,
                e.moe_intermediate_size,
                e.norm_topk_prob,
            ),
            shared: SharedExpert {
                width: e.shared_expert_intermediate_size as usize,
            },
        },
        (m, None) => FeedForward::Mlp(swiglu(m.as_ref().map_or(0, |m| m.intermediate_size))),
    };
    let layers = (0..spec.layers.num_hidden_layers)
        .map(|i| {
            plain_layer(
                i as usize,
                direct_norms(NormArrangement::PreNorm),
                if is_linear_layer(spec, i) {
                    Mixer::GatedDeltaNet(DeltaNet {
                        k_heads: la.linear_num_key_heads as usize,
                        v_heads: la.linear_num_value_heads as usize,
                        k_head_dim: la.linear_key_head_dim as usize,
                        v_head_dim: la.linear_value_head_dim as usize,
                        conv_kernel: la.linear_conv_kernel_dim as usize,
                        in_proj: variant.in_proj,
                        norm: GatedNorm::RmsSiluGate,
                        cache: StateCache::ConvAndRecurrent,
                    })
                } else {
                    Mixer::Attention(Attention {
                        qk_norm: QkNorm::RmsPerHead,
                        output_gate: OutputGate::SigmoidPerHead,
                        ..full_attention(
                            a.num_attention_heads,
                            a.num_key_value_heads,
                            a.head_dim,
                            plain_rope(spec.rope.rope_theta, false, rotated_dims(spec) as usize),
                        )
                    })
                },
                ffn,
            )
        })
        .collect();
    model_ir(
        spec,
        ModelParts {
            prefix: variant.prefix,
            sanitize: (variant.sanitize)(spec),
            sharding: variant.sharding,
            embedding: scaled_embedding(EmbedScale::None),
            layers,
            head: plain_head(spec.model.tie_word_embeddings),
        },
    )
}

// ---------------------------------------------------------------- config.json view

/// The spec with config.json field names, flat (mlx-lm reads a flat
/// qwen3_5 config as the text config), RoPE in `rope_parameters` as the
/// public configs write it
/// (impl_document! adds `quantization` and sorts the keys).
pub(crate) fn config_fields(spec: &Qwen35Spec) -> Value {
    let la = &spec.linear_attention;
    let mut own = json!({
        "full_attention_interval": spec.layers.full_attention_interval,
        "head_dim": spec.attention.head_dim,
        "attention_bias": false,
        "linear_num_key_heads": la.linear_num_key_heads,
        "linear_num_value_heads": la.linear_num_value_heads,
        "linear_key_head_dim": la.linear_key_head_dim,
        "linear_value_head_dim": la.linear_value_head_dim,
        "linear_conv_kernel_dim": la.linear_conv_kernel_dim,
    });
    if let (Value::Object(own), Value::Object(variant_own)) =
        (&mut own, (spec.variant().config_fields)(spec))
    {
        own.extend(variant_own);
    }
    crate::hf::dense_stack_json(spec, own)
}

/// qwen3_5's own config.json fields: RoPE under `rope_parameters`, and the
/// dense width or the experts' sizes.
fn qwen3_5_fields(spec: &Qwen35Spec) -> Value {
    let mut v = json!({
        "rope_parameters": {
            "type": "default",
            "rope_theta": spec.rope.rope_theta,
            "partial_rotary_factor": spec.rope.partial_rotary_factor,
        },
    });
    match (&spec.mlp, &spec.moe) {
        (_, Some(e)) => {
            v["num_experts"] = json!(e.num_experts);
            v["num_experts_per_tok"] = json!(e.num_experts_per_tok);
            v["moe_intermediate_size"] = json!(e.moe_intermediate_size);
            v["shared_expert_intermediate_size"] = json!(e.shared_expert_intermediate_size);
            v["norm_topk_prob"] = json!(e.norm_topk_prob);
        }
        (m, None) => {
            v["num_experts"] = json!(0);
            if let Some(m) = m {
                v["intermediate_size"] = json!(m.intermediate_size);
            }
        }
    }
    v
}

// ---------------------------------------------------------------- parsing

/// How a qwen3_5 document is read (see [`crate::layout_reader`]).
pub(crate) const LAYOUT: Layout = Layout {
    family: "qwen3_5",
    anchor: "qwen35",
    head: crate::layout_reader::HEAD,
    sections: &[
        Section::of::<DenseModel>("model"),
        Section::of::<Qwen35Layers>("layers"),
        Section::of::<DenseAttention>("attention"),
        Section::of::<Qwen35Rope>("rope"),
        Section::of::<Qwen35LinearAttention>("linear_attention"),
        Section::of::<Option<DenseMlp>>("mlp"),
        Section::of::<Option<Qwen35Moe>>("moe"),
        QUANTIZATION,
    ],
    texts: &[
        Text::Field("layers", "a mapping {num_hidden_layers, full_attention_interval}", "which layers are full attention; see docs/spec-format.md#qwen35"),
        Text::Field("attention", "a mapping {num_attention_heads, num_key_value_heads, head_dim}", "geometry of the full-attention layers; see docs/spec-format.md#qwen35"),
        Text::Field("rope", "a mapping {rope_theta, partial_rotary_factor}", "`rope_parameters` of config.json; see docs/spec-format.md#qwen35"),
        Text::Field("linear_attention", "a mapping {linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim}", "the Gated DeltaNet layers; see docs/spec-format.md#qwen35"),
    ],
};

/// The derived Qwen3.5 form (see [`crate::reduce`]): the attention stack's sizes,
/// the Gated DeltaNet heads', and the dense MLP's width or the experts' sizes,
/// as the parent has one or the other.
impl Reducible for Qwen35Spec {
    fn other_sizes(r: &Qwen35Reduce, parent: &Self, issues: &mut Vec<Issue>) -> Vec<Size> {
        let pl = &parent.linear_attention;
        let mut sizes = sizes_named!(r, pl;
            linear_num_key_heads,
            linear_num_value_heads,
            linear_key_head_dim,
            linear_value_head_dim,
        )
        .to_vec();
        match (r.intermediate_size, &parent.mlp, &r.moe, &parent.moe) {
            (Some(w), Some(pm), None, None) => {
                sizes.push(("intermediate_size", w, pm.intermediate_size));
            }
            (None, None, Some(rm), Some(pe)) => sizes.extend(sizes_named!("moe.", rm, pe;
                num_experts,
                num_experts_per_tok,
                moe_intermediate_size,
                shared_expert_intermediate_size,
            )),
            // qwen3_next's sparse form: the dense width beside the experts.
            (Some(w), Some(pm), Some(rm), Some(pe)) => {
                sizes.push(("intermediate_size", w, pm.intermediate_size));
                sizes.extend(sizes_named!("moe.", rm, pe;
                    num_experts,
                    num_experts_per_tok,
                    moe_intermediate_size,
                    shared_expert_intermediate_size,
                ));
            }
            (_, _, _, Some(_)) => issues.push(Issue::new(
                p("derive.reduce.moe"),
                "the parent is the MoE form",
                "intermediate_size: null and moe: {num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size}",
                "a reduction keeps the parent's structure",
            )),
            (_, _, _, None) => issues.push(Issue::new(
                p("derive.reduce.intermediate_size"),
                "the parent is the dense form",
                "intermediate_size: <width> and moe: null",
                "a reduction keeps the parent's structure",
            )),
        }
        sizes
    }
    /// Value heads repeated over key heads stay repeated.
    fn keep_structure(r: &Qwen35Reduce, parent: &Self, issues: &mut Vec<Issue>) {
        let pl = &parent.linear_attention;
        if pl.linear_num_value_heads != pl.linear_num_key_heads
            && r.linear_num_value_heads == r.linear_num_key_heads
        {
            issues.push(Issue::new(
                reduce_key("linear_num_value_heads"),
                format!(
                    "{} value heads for {} key heads: q and k would not be repeated, but the parent repeats them",
                    r.linear_num_value_heads, r.linear_num_key_heads
                ),
                "more value heads than key heads",
                "a reduction keeps the parent's structure",
            ));
        }
    }
    fn apply(&mut self, r: &Qwen35Reduce) {
        if let (Some(m), Some(w)) = (&mut self.mlp, r.intermediate_size) {
            m.intermediate_size = w;
        }
        if let (Some(e), Some(rm)) = (&mut self.moe, &r.moe) {
            set_named!(rm, e;
                num_experts,
                num_experts_per_tok,
                moe_intermediate_size,
                shared_expert_intermediate_size,
            );
        }
        set_named!(r, self.linear_attention;
            linear_num_key_heads,
            linear_num_value_heads,
            linear_key_head_dim,
            linear_value_head_dim,
        );
    }
    /// A size check is on the reduced field of the same name (the experts' under
    /// `moe`); a reduced size the parent's structure does not fit (an interval past
    /// the last layer, an odd RoPE width) points at the size that made it so.
    fn reduced_field(path: &str) -> Option<FieldPath> {
        let field = match last_key(path) {
            "full_attention_interval" => "num_hidden_layers",
            "partial_rotary_factor" => "head_dim",
            f => f,
        };
        Some(if path.starts_with("moe.") {
            p("derive.reduce.moe").key(field)
        } else {
            reduce_key(field)
        })
    }
}

crate::document::impl_dense_document!(Qwen35Spec, check);

// ---------------------------------------------------------------- import

/// Imports a `qwen3_5` config.json as mlx-lm 0.32.2 reads it: the text
/// config under `text_config` or the whole file when there is none
/// (`ModelArgs.from_dict`), with `TextModelArgs`'s defaults, which are
/// listed. `rope_parameters` (default type only) gives the RoPE base and the
/// partial rotary factor; without it mlx-lm's own default dict applies.
/// The MoE form (`num_experts > 0`) and biased attention are refused.
pub(crate) fn import(
    top: &Map<String, Value>,
    model_type: ConfigModelType,
    name: &str,
) -> ImportedSpec<Qwen35Spec> {
    let (text, prefix) = match top.get("text_config") {
        Some(Value::Object(t)) => (t, "text_config."),
        _ => (top, ""),
    };
    let mut r = Reader::new(text, prefix);
    let hidden_size = r.uint("hidden_size", 4096);
    let num_layers = r.uint("num_hidden_layers", 32);
    let num_heads = r.uint("num_attention_heads", 32);
    let rms_norm_eps = r.float("rms_norm_eps", 1e-6);
    let vocab_size = r.uint("vocab_size", 151936);
    let num_kv = r.uint("num_key_value_heads", 8);
    let max_pos = r.uint("max_position_embeddings", 131072);
    let k_heads = r.uint("linear_num_key_heads", 16);
    let v_heads = r.uint("linear_num_value_heads", 64);
    let k_dim = r.uint("linear_key_head_dim", 192);
    let v_dim = r.uint("linear_value_head_dim", 128);
    let conv = r.uint("linear_conv_kernel_dim", 4);
    let tie = r.boolean("tie_word_embeddings", false);
    if r.boolean("attention_bias", false) {
        r.problem(
            "attention_bias",
            "true is not supported (archgen's gated attention has no projection biases)",
        );
    }
    let head_dim = r.head_dim_or_quotient(
        hidden_size,
        num_heads,
        "absent or null: mlx-lm uses hidden_size // num_attention_heads",
    );
    let interval = r.uint("full_attention_interval", 4);
    // `num_experts > 0` puts the MoE block on every layer, and no dense MLP.
    let num_experts = r.uint("num_experts", 0);
    let (mlp, moe) = if num_experts > 0 {
        let moe = Qwen35Moe {
            num_experts,
            num_experts_per_tok: r.uint("num_experts_per_tok", 0),
            moe_intermediate_size: r.uint("moe_intermediate_size", 0),
            shared_expert_intermediate_size: r.uint("shared_expert_intermediate_size", 0),
            norm_topk_prob: r.boolean("norm_topk_prob", true),
        };
        (None, Some(moe))
    } else {
        let intermediate_size = r.uint("intermediate_size", 14336);
        (Some(DenseMlp { intermediate_size }), None)
    };
    for ignored in ["mlp_only_layers", "decoder_sparse_step"] {
        if let Some(v) = r.get(ignored).cloned() {
            r.note(
                ignored,
                v,
                "ignored: mlx-lm 0.32.2 qwen3_5.py puts the MoE block on every layer when num_experts > 0",
            );
        }
    }
    if r.get("layer_types").is_some() {
        r.note(
            "layer_types",
            Value::Null,
            "ignored: mlx-lm 0.32.2 qwen3_5.py makes layer i full attention iff (i + 1) % full_attention_interval == 0",
        );
    }
    let (rope_theta, partial_rotary_factor) = match text.get("rope_parameters") {
        None => {
            r.note(
                "rope_parameters",
                json!({"type": "default", "rope_theta": 100000, "partial_rotary_factor": 0.25}),
                "absent: mlx-lm's default rope_parameters",
            );
            (100000.0, 0.25)
        }
        Some(Value::Null) => {
            // `if self.rope_parameters:` is false: the dataclass fields stay.
            (
                r.float("rope_theta", 100000.0),
                r.float("partial_rotary_factor", 0.25),
            )
        }
        Some(Value::Object(rp)) => {
            let kind = rope_type(rp);
            if kind != "default" {
                r.problem(
                    "rope_parameters.rope_type",
                    &format!("`{kind}`: only the default RoPE (nn.RoPE) is supported"),
                );
            }
            let mut rr = Reader::new(rp, "");
            let theta = rr.float("rope_theta", 100000.0);
            let factor = rr.float("partial_rotary_factor", 0.25);
            let (applied, problems) = rr.finish();
            for a in applied {
                r.note(&format!("rope_parameters.{}", a.field), a.value, &a.reason);
            }
            for pr in problems {
                r.problem("rope_parameters", &pr);
            }
            (theta, factor)
        }
        Some(other) => {
            r.problem(
                "rope_parameters",
                &format!("expected an object, found {other}"),
            );
            (100000.0, 0.25)
        }
    };
    // `quantization`, else `quantization_config`: top level first, then text_config.
    let quantization = first_quantization(
        &[
            (top.get("quantization"), "quantization"),
            (top.get("quantization_config"), "quantization_config"),
            (text.get("quantization"), "quantization"),
            (text.get("quantization_config"), "quantization_config"),
        ],
        &mut r,
    );
    r.build_checked(check, || Qwen35Spec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, Family::Qwen35, model_type),
        model: DenseModel {
            hidden_size,
            vocab_size,
            rms_norm_eps,
            tie_word_embeddings: tie,
            max_position_embeddings: max_pos,
        },
        layers: Qwen35Layers {
            num_hidden_layers: num_layers,
            full_attention_interval: interval,
        },
        attention: DenseAttention {
            num_attention_heads: num_heads,
            num_key_value_heads: num_kv,
            head_dim,
        },
        rope: Qwen35Rope {
            rope_theta,
            partial_rotary_factor,
        },
        linear_attention: Qwen35LinearAttention {
            linear_num_key_heads: k_heads,
            linear_num_value_heads: v_heads,
            linear_key_head_dim: k_dim,
            linear_value_head_dim: v_dim,
            linear_conv_kernel_dim: conv,
        },
        mlp,
        moe,
        quantization,
    })
}

/// Qwen3.5 / Qwen3.6 (dense and MoE) in the family registry.
pub(crate) const FAMILY: ModelFamily = ModelFamily {
    reads: |t| t.family() == crate::Family::Qwen35,
    kv_config: KvConfig::Refused(
        "KV-cache quantization is not supported for qwen3_5 (its linear layers have no K/V cache)",
    ),
    import: |c| {
        import(c.top, c.model_type, c.name).map(|(s, applied)| (crate::Spec::Qwen35(s), applied))
    },
};
