//! gpt-oss (`gpt_oss.py`) as mlx-lm 0.32.2 runs it: pre-norm layers whose
//! attention has biases on all four projections and a learned sink logit per
//! head (fast SDPA's `sinks`), sliding-window and full layers as `layer_types`
//! lists them, and routed experts in place of the MLP (`MLPBlock`: a biased
//! `router`, top-k of its logits, a precise softmax over the k, SwitchGLU
//! experts with biases and the compiled clamped `swiglu_oai`). The head is an
//! `lm_head` of its own always (the module never ties it).

use crate::dense::{check_dense_sizes, DenseAttention, DenseLayers, DenseMlp, DenseModel};
use crate::diag::{FieldPath, Issue};
use crate::layout_reader::{Layout, Text};
use crate::model::*;
use crate::model_family::ModelFamily;
use crate::reader::{first_quantization, imported_identity, ImportedSpec, Reader};
use crate::reduce::{last_key, reduce_key, sizes_named, Reducible, Size};
use crate::{validate, Sections};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

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

/// Which layers attend over a sliding window and which over everything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GptOssAttentionLayers {
    /// `sliding_window`: the positions a sliding layer sees (its
    /// `RotatingKVCache(max_size=sliding_window)`).
    pub sliding_window: u32,
    /// `layer_types`, one per layer (config.json without it: sliding, full,
    /// sliding, ... as `GptOssMoeModel` defaults it).
    pub layer_types: Vec<GptOssLayerType>,
}

/// One entry of `layer_types`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum GptOssLayerType {
    /// Attention over the last `sliding_window` positions.
    #[serde(rename = "sliding_attention")]
    Sliding,
    /// Causal attention over every position.
    #[serde(rename = "full_attention")]
    Full,
}

impl GptOssLayerType {
    fn as_str(self) -> &'static str {
        match self {
            GptOssLayerType::Sliding => "sliding_attention",
            GptOssLayerType::Full => "full_attention",
        }
    }
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

/// A `yarn` `rope_scaling` entry with every field `YarnRoPE` reads (a
/// config.json without one takes `YarnRoPE`'s default, noted at import).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GptOssYarn {
    /// `factor` (gpt-oss-20b: 32).
    pub factor: f64,
    /// `original_max_position_embeddings` (default 4096).
    pub original_max_position_embeddings: f64,
    /// `beta_fast` (default 32).
    pub beta_fast: f64,
    /// `beta_slow` (default 1).
    pub beta_slow: f64,
    /// `mscale` (default 1).
    pub mscale: f64,
    /// `mscale_all_dim` (default 0).
    pub mscale_all_dim: f64,
}

impl GptOssYarn {
    /// `YarnRoPE`'s keyword defaults, in `initialize_rope`'s key order.
    const DEFAULTS: [(&'static str, f64); 5] = [
        ("original_max_position_embeddings", 4096.0),
        ("beta_fast", 32.0),
        ("beta_slow", 1.0),
        ("mscale", 1.0),
        ("mscale_all_dim", 0.0),
    ];
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

/// The IR window of each layer type.
fn window(kind: GptOssLayerType, sliding_window: u32) -> crate::ir::Window {
    match kind {
        GptOssLayerType::Sliding => crate::ir::Window::Sliding(sliding_window as usize),
        GptOssLayerType::Full => crate::ir::Window::Full,
    }
}

/// All semantic errors of a gpt_oss spec (full-spec field paths).
pub(crate) fn check(spec: &GptOssSpec) -> Vec<Issue> {
    use validate::limits::*;
    let mut c = validate::Checker::default();
    c.header(spec.format_version, &spec.identity);
    c.family_is(&spec.identity, Family::GptOss, "gpt-oss");
    let mt = spec.identity.source.model_type;
    if mt != ConfigModelType::GptOss {
        let hint = "the model_type of a gpt-oss checkpoint is gpt_oss";
        c.foreign_model_type(mt, "gpt_oss", "gpt_oss", hint);
    }
    let (m, a, layers, e) = (&spec.model, &spec.attention, &spec.layers, &spec.moe);
    let width = "SwiGLU width of each expert";
    let mut ok = check_dense_sizes(&mut c, m, layers, a, &spec.mlp, width);
    ok &= c.range(
        "moe.num_local_experts",
        e.num_local_experts,
        MAX_EXPERTS,
        "routed experts per layer (gpt-oss-20b: 32)",
    );
    ok &= c.range(
        "moe.num_experts_per_tok",
        e.num_experts_per_tok,
        MAX_EXPERTS,
        "experts each token is routed to (gpt-oss-20b: 4)",
    );
    if ok {
        ok = c.top_k_of_experts(e.num_experts_per_tok, e.num_local_experts);
    }
    let al = &spec.attention_layers;
    ok &= c.range(
        "attention_layers.sliding_window",
        al.sliding_window,
        u32::MAX,
        "positions a sliding layer sees (gpt-oss-20b: 128)",
    );
    let n = layers.num_hidden_layers as usize;
    if al.layer_types.len() != n {
        ok = false;
        c.err(
            FieldPath::parse("attention_layers.layer_types"),
            format!("{} entries for {n} layers", al.layer_types.len()),
            format!("one entry per layer ({n})"),
            "list sliding_attention or full_attention for every layer",
        );
    }
    for kind in [GptOssLayerType::Sliding, GptOssLayerType::Full] {
        if !al.layer_types.contains(&kind) {
            ok = false;
            c.err(
                FieldPath::parse("attention_layers.layer_types"),
                format!("no {}", kind.as_str()),
                "at least one sliding_attention and one full_attention layer",
                "gpt_oss.py builds its masks from the first layer of each kind \
                 (layer_types.index), which fails when a kind is missing",
            );
        }
    }
    if m.tie_word_embeddings {
        c.err(
            FieldPath::parse("model.tie_word_embeddings"),
            "true",
            "false",
            "gpt_oss.py always builds its own lm_head and never ties it to the embedding",
        );
    }
    c.eps(m.rms_norm_eps, "gpt-oss-20b uses 1.0e-5");
    ok &= c.head_geometry(a.head_dim, a.num_attention_heads, a.num_key_value_heads);
    c.rope_theta(spec.rope.rope_theta, "the RoPE base, e.g. 150000.0");
    if let Some(y) = &spec.rope.scaling {
        let fields = [
            ("factor", y.factor),
            (
                "original_max_position_embeddings",
                y.original_max_position_embeddings,
            ),
            ("beta_fast", y.beta_fast),
            ("beta_slow", y.beta_slow),
        ];
        for (field, v) in fields {
            let path = format!("rope.scaling.{field}");
            c.positive_finite(
                &path,
                v,
                "YaRN's scaling (gpt-oss-20b: factor 32, original 4096, beta_fast 32, beta_slow 1)",
            );
        }
        for (field, v) in [("mscale", y.mscale), ("mscale_all_dim", y.mscale_all_dim)] {
            if !v.is_finite() {
                c.err(
                    FieldPath::parse(&format!("rope.scaling.{field}")),
                    v.to_string(),
                    "a finite number",
                    "YarnRoPE's mscale terms (defaults 1 and 0)",
                );
            }
        }
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
            kind: RopeKind::Yarn {
                theta: spec.rope.rope_theta as f32,
                factor: y.factor,
                original_max_position_embeddings: y.original_max_position_embeddings,
                beta_fast: y.beta_fast,
                beta_slow: y.beta_slow,
                mscale: y.mscale,
                mscale_all_dim: y.mscale_all_dim,
            },
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
    let sliding_window = spec.attention_layers.sliding_window;
    let layers = spec
        .attention_layers
        .layer_types
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let mixer = Mixer::Attention(Attention {
                window: window(kind, sliding_window),
                ..attention.clone()
            });
            let norms = direct_norms(NormArrangement::PreNorm);
            let ffn = FeedForward::BiasedExperts(experts);
            layer(i, norms, mixer, ffn, Residual::Plain)
        })
        .collect();
    model_ir(
        spec,
        ModelParts {
            prefix: ModulePrefix::Model,
            // Model.sanitize returns a checkpoint in mlx-lm's layout as it is.
            sanitize: Vec::new(),
            // gpt_oss.py has a shard(); archgen's split refuses the o_proj
            // bias and the biased experts by name (not split yet).
            sharding: whole_head_sharding(ShardOracle::MlxLm),
            embedding: scaled_embedding(EmbedScale::None),
            layers,
            head: plain_head(false),
        },
    )
}

/// The spec with config.json field names (impl_document! adds `quantization`).
pub(crate) fn config_fields(spec: &GptOssSpec) -> Value {
    let al = &spec.attention_layers;
    let types: Vec<&str> = al.layer_types.iter().map(|t| t.as_str()).collect();
    let own = json!({
        "intermediate_size": spec.mlp.intermediate_size,
        "head_dim": spec.attention.head_dim,
        "sliding_window": al.sliding_window,
        "layer_types": types,
        "rope_theta": spec.rope.rope_theta,
        "rope_scaling": match &spec.rope.scaling {
            None => Value::Null,
            Some(y) => json!({
                "rope_type": "yarn",
                "factor": y.factor,
                "original_max_position_embeddings": y.original_max_position_embeddings,
                "beta_fast": y.beta_fast,
                "beta_slow": y.beta_slow,
                "mscale": y.mscale,
                "mscale_all_dim": y.mscale_all_dim,
            }),
        },
        "num_local_experts": spec.moe.num_local_experts,
        "num_experts_per_tok": spec.moe.num_experts_per_tok,
    });
    crate::hf::dense_stack_json(spec, own)
}

/// How a gpt_oss document is read (see [`crate::layout_reader`]).
pub(crate) const LAYOUT: Layout = Layout {
    family: "gpt_oss",
    anchor: "gpt-oss",
    head: crate::layout_reader::DENSE_HEAD,
    sections: &[
        ("attention_layers", Sections::check::<GptOssAttentionLayers>),
        ("rope", Sections::check::<GptOssRope>),
        ("mlp", Sections::check::<DenseMlp>),
        ("moe", Sections::check::<GptOssExperts>),
        ("quantization", Sections::check::<Option<Quantization>>),
    ],
    texts: &[
        Text::Field(
            "attention_layers",
            "a mapping {sliding_window, layer_types}",
            "the window and each layer's kind; see docs/spec-format.md#gpt-oss",
        ),
        Text::Field(
            "rope",
            "a mapping {rope_theta}",
            "the RoPE base; see docs/spec-format.md#gpt-oss",
        ),
        Text::Field(
            "mlp",
            "a mapping {intermediate_size}",
            "SwiGLU width of each expert; see docs/spec-format.md#gpt-oss",
        ),
        Text::Field(
            "moe",
            "a mapping {num_local_experts, num_experts_per_tok}",
            "the routed experts; see docs/spec-format.md#gpt-oss",
        ),
    ],
};

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
        self.moe.num_local_experts = r.num_local_experts;
        self.moe.num_experts_per_tok = r.num_experts_per_tok;
        self.attention_layers.sliding_window = r.sliding_window;
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

crate::hf::impl_dense_view!(GptOssSpec);
crate::reduce::impl_stack_sections!(GptOssSpec);
crate::document::impl_document!(GptOssSpec, check);

/// Imports a `gpt_oss` config.json as mlx-lm 0.32.2's `ModelArgs` reads it:
/// every field it has a default for may be absent (the default is noted).
pub(crate) fn import(top: &Map<String, Value>, name: &str) -> ImportedSpec<GptOssSpec> {
    let mut r = Reader::new(top, "");
    let num_hidden_layers = r.uint("num_hidden_layers", 36);
    let moe = GptOssExperts {
        num_local_experts: r.uint("num_local_experts", 128),
        num_experts_per_tok: r.uint("num_experts_per_tok", 4),
    };
    let vocab_size = r.uint("vocab_size", 201088);
    let rms_norm_eps = r.float("rms_norm_eps", 1e-5);
    let hidden_size = r.uint("hidden_size", 2880);
    let mlp = DenseMlp {
        intermediate_size: r.uint("intermediate_size", 2880),
    };
    let head_dim = r.uint("head_dim", 64);
    let attention = DenseAttention {
        num_attention_heads: r.uint("num_attention_heads", 64),
        num_key_value_heads: r.uint("num_key_value_heads", 8),
        head_dim,
    };
    let sliding_window = r.uint("sliding_window", 128);
    let rope = GptOssRope {
        rope_theta: r.float("rope_theta", 150000.0),
        scaling: read_yarn(top, &mut r),
    };
    let layer_types = read_layer_types(top, num_hidden_layers, &mut r);
    // Fields gpt_oss.py does not read: the spec's informational and fixed values.
    let tie_word_embeddings = match top.get("tie_word_embeddings") {
        Some(Value::Bool(true)) => {
            r.note(
                "tie_word_embeddings",
                Value::Bool(false),
                "ignored: gpt_oss.py always has its own lm_head",
            );
            false
        }
        _ => false,
    };
    let max_position_embeddings = r.uint("max_position_embeddings", 131072);
    let quantization = match top.get("quantization_config") {
        Some(q) if top.get("quantization").is_none() && !q.is_null() => {
            r.note(
                "quantization_config",
                Value::Null,
                "ignored: the Hugging Face checkpoint's MXFP4 expert blocks; the spec is the \
                 unquantized layout (an mlx conversion writes its own `quantization`)",
            );
            None
        }
        _ => first_quantization(&[(top.get("quantization"), "quantization")], &mut r),
    };
    r.build_checked(check, || GptOssSpec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, Family::GptOss, ConfigModelType::GptOss),
        model: DenseModel {
            hidden_size,
            vocab_size,
            rms_norm_eps,
            tie_word_embeddings,
            max_position_embeddings,
        },
        layers: DenseLayers { num_hidden_layers },
        attention,
        attention_layers: GptOssAttentionLayers {
            sliding_window,
            layer_types,
        },
        rope,
        mlp,
        moe,
        quantization,
    })
}

/// `rope_scaling` as `initialize_rope` reads it for gpt_oss: null, or a
/// `yarn` entry (its `factor` required, the other keys `YarnRoPE`'s
/// defaults when absent; keys it does not read, as `truncate`, noted).
fn read_yarn(top: &Map<String, Value>, r: &mut Reader) -> Option<GptOssYarn> {
    let entry = match top.get("rope_scaling") {
        None | Some(Value::Null) => return None,
        Some(Value::Object(entry)) => entry,
        Some(other) => {
            r.problem(
                "rope_scaling",
                &format!("expected null or a mapping, found {other}"),
            );
            return None;
        }
    };
    match crate::reader::rope_type(entry) {
        "yarn" => {}
        other => {
            r.problem(
                "rope_scaling.rope_type",
                &format!("{other}: archgen's gpt_oss specs take yarn scaling or none"),
            );
            return None;
        }
    }
    let mut y = Reader::new(entry, "rope_scaling.");
    let factor = y.required_float("factor");
    let [original, beta_fast, beta_slow, mscale, mscale_all_dim] =
        GptOssYarn::DEFAULTS.map(|(key, default)| y.float(key, default));
    for key in entry.keys() {
        let read = ["type", "rope_type", "factor"].contains(&key.as_str())
            || GptOssYarn::DEFAULTS.iter().any(|(k, _)| k == key);
        if !read {
            y.note(
                key,
                Value::Null,
                "ignored: rope_utils' YarnRoPE does not read it",
            );
        }
    }
    r.absorb(y);
    Some(GptOssYarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast,
        beta_slow,
        mscale,
        mscale_all_dim,
    })
}

/// `layer_types`, or `GptOssMoeModel`'s default: `["sliding_attention",
/// "full_attention"] * (num_hidden_layers // 2)`, which has an entry per layer
/// only for an even count (mlx-lm's `zip` would drop the last layer of an odd
/// one, so that is refused).
fn read_layer_types(top: &Map<String, Value>, n: u32, r: &mut Reader) -> Vec<GptOssLayerType> {
    match top.get("layer_types") {
        None | Some(Value::Null) if n % 2 == 0 => {
            let pattern = [GptOssLayerType::Sliding, GptOssLayerType::Full];
            let types: Vec<_> = pattern.iter().copied().cycle().take(n as usize).collect();
            let names: Vec<&str> = types.iter().map(|t| t.as_str()).collect();
            r.note(
                "layer_types",
                json!(names),
                "absent: gpt_oss.py alternates sliding and full layers",
            );
            types
        }
        None | Some(Value::Null) => {
            r.problem(
                "layer_types",
                &format!(
                    "missing with an odd num_hidden_layers ({n}): gpt_oss.py's default pattern \
                     covers {} layers; list one type per layer",
                    n - 1
                ),
            );
            Vec::new()
        }
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| match v.as_str() {
                Some("sliding_attention") => Some(GptOssLayerType::Sliding),
                Some("full_attention") => Some(GptOssLayerType::Full),
                _ => {
                    r.problem(
                        "layer_types",
                        &format!("expected sliding_attention or full_attention, found {v}"),
                    );
                    None
                }
            })
            .collect(),
        Some(other) => {
            r.problem(
                "layer_types",
                &format!("expected a list of layer types, found {other}"),
            );
            Vec::new()
        }
    }
}

/// gpt_oss in the family registry.
pub(crate) const FAMILY: ModelFamily = ModelFamily {
    reads: |t| t.family() == crate::Family::GptOss,
    kv_config: crate::model_family::GEMMA4_ONLY,
    import: |c| import(c.top, c.name).map(|(s, applied)| (crate::Spec::GptOss(s), applied)),
};
