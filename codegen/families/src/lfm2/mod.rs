//! LFM2 (`lfm2.py`, mlx-lm 0.32.2): the dense stack whose mixer is a gated short
//! conv except at `full_attn_idxs` (Qwen3's attention, never traditional RoPE); the
//! head is always tied. The dense `model` and `attention` sections, plus the layer
//! pattern, the conv's taps and mlx-lm's `MLP` width rule. No `conv_bias` (false in
//! every LFM2) or `block_dim` (= hidden_size): the importer refuses other values.

use crate::dense::{DenseAttention, DenseModel};
use crate::diag::{FieldPath, Issue};
use crate::layout_reader::{Layout, Section, QUANTIZATION};
use crate::model::*;
use crate::reduce::{Reducible, Size, Stack};
use crate::validate;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod import;
pub(crate) use import::FAMILY;

/// A full LFM2 spec (`identity.family: lfm2`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (lfm2 family)")]
pub struct Lfm2Spec {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: Identity,
    /// `rms_norm_eps` is config.json's `norm_eps`; `tie_word_embeddings` must be
    /// true (lfm2.py's head is always `embed_tokens.as_linear`).
    pub model: DenseModel,
    pub layers: Lfm2Layers,
    /// `head_dim` must equal `hidden_size / num_attention_heads`.
    pub attention: DenseAttention,
    pub rope: Lfm2Rope,
    pub feed_forward: Lfm2FeedForward,
    /// Weight quantization as the mlx config's `quantization` dict, or null.
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
}

/// The decoder stack and which of its layers are attention.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Lfm2Layers {
    /// `num_hidden_layers`.
    pub num_hidden_layers: u32,
    /// `full_attn_idxs`: the attention layers, increasing; every other layer
    /// is a short conv. The first one's cache gives the attention mask.
    pub full_attn_idxs: Vec<u32>,
    /// `conv_L_cache`: the short conv's taps (its state keeps one fewer).
    #[serde(rename = "conv_L_cache")]
    pub conv_l_cache: u32,
}

/// `nn.RoPE(head_dim, base=rope_theta, traditional=False)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Lfm2Rope {
    /// `rope_theta` (mlx-lm's default is 1000000.0).
    pub rope_theta: f64,
}

/// mlx-lm's `MLP(dim=block_dim, ff_dim=block_ff_dim, ...)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Lfm2FeedForward {
    /// `block_ff_dim`: the SwiGLU width, before the adjustment.
    pub block_ff_dim: u32,
    /// `block_multiple_of`: the adjusted width is rounded up to a multiple of it.
    pub block_multiple_of: u32,
    /// `block_ffn_dim_multiplier`: applied in the adjustment when not null.
    #[serde(deserialize_with = "explicit")]
    pub block_ffn_dim_multiplier: Option<f64>,
    /// `block_auto_adjust_ff_dim`: when true the width is `int(2 * ff / 3)`, times
    /// the multiplier (`int`), rounded up to `block_multiple_of`.
    pub block_auto_adjust_ff_dim: bool,
}

impl Lfm2FeedForward {
    /// The SwiGLU width `MLP.__init__` computes (Python floats, `int` truncates).
    pub fn width(&self) -> u64 {
        let ff = u64::from(self.block_ff_dim);
        if !self.block_auto_adjust_ff_dim {
            return ff;
        }
        let ff = (2.0 * ff as f64 / 3.0) as u64;
        let ff = self
            .block_ffn_dim_multiplier
            .map_or(ff, |m| (m * ff as f64) as u64);
        let m = u64::from(self.block_multiple_of.max(1));
        m * ff.div_ceil(m)
    }
}

crate::reduce::derived_form! {
    /// A derived LFM2 spec file: a declared reduction of an LFM2 spec.
    file Lfm2DerivedSpecFile titled "archgen architecture spec (derived lfm2 form)" for Lfm2Spec;

    /// How a derived LFM2 spec is made from its parent.
    derive Lfm2Derive {}

    /// The reduced sizes of an LFM2 spec. The reduced model is the parent's first
    /// `num_hidden_layers` layers: `full_attn_idxs` keeps the indices below it.
    reduce Lfm2Reduce {
        pub block_ff_dim: u32,
        pub block_multiple_of: u32,
    }
}

// ---------------------------------------------------------------- validation

/// All semantic errors of an LFM2 spec (full-spec field paths).
pub(crate) fn check(spec: &Lfm2Spec) -> Vec<Issue> {
    let mut c = validate::Checker::for_document(spec, Family::Lfm2, &LAYOUT);
    let hint = "an LFM2 checkpoint's model_type is lfm2";
    c.model_type_is(&spec.identity, ConfigModelType::Lfm2, hint);
    let (m, l) = (&spec.model, &spec.layers);
    let (a, f) = (&spec.attention, &spec.feed_forward);
    let width = u32::try_from(f.width()).unwrap_or(u32::MAX);
    let stack = Stack::of(l.num_hidden_layers, m, a);
    let positions = (m.max_position_embeddings, "the context length");
    let mut ok = c.stack_sizes(&stack, positions, (width, "the SwiGLU width MLP computes"));
    if f.block_auto_adjust_ff_dim {
        ok &= c.range(
            "feed_forward.block_multiple_of",
            f.block_multiple_of,
            validate::limits::MAX_INTERMEDIATE,
            "the width is rounded up to a multiple of it (LFM2: 256)",
        );
    }
    if !m.tie_word_embeddings {
        c.err(
            FieldPath::parse("model.tie_word_embeddings"),
            "false, but lfm2.py's head is always embed_tokens.as_linear",
            "true",
            "write true: mlx-lm's lfm2 has no lm_head",
        );
    }
    ok &= c.range("layers.conv_L_cache", l.conv_l_cache, 64, "taps (LFM2: 3)");
    let increasing = l.full_attn_idxs.windows(2).all(|w| w[0] < w[1]);
    let in_stack = l.full_attn_idxs.iter().all(|&i| i < l.num_hidden_layers);
    if l.full_attn_idxs.is_empty() || !increasing || !in_stack {
        c.err(FieldPath::parse("layers.full_attn_idxs"), format!("{:?} with {} layers", l.full_attn_idxs, l.num_hidden_layers), "increasing layer indices below num_hidden_layers, at least one", "the attention layers (LFM2-1.2B: [2, 5, 8, 10, 12, 14]); lfm2.py reads the first one's cache for the mask");
        ok = false;
    }
    c.eps(m.rms_norm_eps, "LFM2 uses 1.0e-5");
    ok = crate::dense::check_heads(&mut c, m, a, ok, Some(Family::Lfm2.as_str()));
    c.rope_theta(spec.rope.rope_theta, "the RoPE base, LFM2: 1000000.0");
    c.finish(ok, spec.quantization.as_ref(), || lower(spec))
}

// ---------------------------------------------------------------- lowering

/// The IR of a valid LFM2 spec: pre-norm SwiGLU layers mixing with a `ShortConv`,
/// or at `full_attn_idxs` attention with per-head q/k RMSNorm; the tied head; the
/// checkpoint's names read as the shared blocks' after lfm2.sanitize's transpose.
pub(crate) fn lower(spec: &Lfm2Spec) -> crate::ir::ModelIr {
    use crate::ir::*;
    use crate::ir_parts::*;
    let (a, l) = (&spec.attention, &spec.layers);
    let rope = plain_rope(spec.rope.rope_theta, false, a.head_dim as usize);
    let width = spec.feed_forward.width() as u32;
    let layers = (0..l.num_hidden_layers)
        .map(|i| {
            let mixer = match l.full_attn_idxs.contains(&i) {
                true => Mixer::Attention(Attention {
                    qk_norm: QkNorm::RmsPerHead,
                    ..full_attention(
                        a.num_attention_heads,
                        a.num_key_value_heads,
                        a.head_dim,
                        rope,
                    )
                }),
                false => Mixer::ShortConv(ShortConv {
                    kernel: l.conv_l_cache as usize,
                }),
            };
            let norms = direct_norms(NormArrangement::PreNorm);
            plain_layer(i as usize, norms, mixer, FeedForward::Mlp(swiglu(width)))
        })
        .collect();
    plain_model_ir(
        spec,
        vec![
            SanitizeRule::TransposeShortConvWeight,
            SanitizeRule::RenameLfm2Modules,
        ],
        // lfm2.py has no shard().
        ShardOracle::Absent,
        layers,
        true, // the embedding is the head
    )
}

// ---------------------------------------------------------------- config.json view

/// lfm2.py's config.json fields (`norm_eps`; no `head_dim` or tie flag: never read).
pub(crate) fn config_fields(spec: &Lfm2Spec) -> Value {
    let f = &spec.feed_forward;
    let mut v = crate::hf::dense_stack_json(
        spec,
        json!({
            "norm_eps": spec.model.rms_norm_eps,
            "full_attn_idxs": spec.layers.full_attn_idxs,
            "rope_theta": spec.rope.rope_theta,
            "conv_L_cache": spec.layers.conv_l_cache,
            "conv_bias": false,
            "block_dim": spec.model.hidden_size,
            "block_ff_dim": f.block_ff_dim,
            "block_multiple_of": f.block_multiple_of,
            "block_ffn_dim_multiplier": f.block_ffn_dim_multiplier,
            "block_auto_adjust_ff_dim": f.block_auto_adjust_ff_dim,
        }),
    );
    if let Value::Object(o) = &mut v {
        o.remove("rms_norm_eps");
        o.remove("tie_word_embeddings");
    }
    v
}

// ---------------------------------------------------------------- parsing

/// How an lfm2 document is read (see [`crate::layout_reader`]).
pub(crate) const LAYOUT: Layout = Layout {
    family: "lfm2",
    anchor: "lfm2",
    head: &[
        Section::of::<u32>("format_version"),
        Section::of::<Identity>("identity"),
        Section::of::<DenseModel>("model"),
        Section::described::<Lfm2Layers>("layers", "a mapping {num_hidden_layers, full_attn_idxs, conv_L_cache}", "the attention layers (the others are short convs) and the convs' taps"),
        Section::of::<DenseAttention>("attention"),
    ],
    sections: &[
        Section::described::<Lfm2Rope>("rope", "a mapping {rope_theta}", "LFM2's RoPE is never traditional"),
        Section::described::<Lfm2FeedForward>("feed_forward", "a mapping {block_ff_dim, block_multiple_of, block_ffn_dim_multiplier, block_auto_adjust_ff_dim}", "mlx-lm's MLP width rule"),
        QUANTIZATION,
    ],
    texts: &[],
};

impl Reducible for Lfm2Spec {
    fn other_sizes(r: &Lfm2Reduce, parent: &Self, _: &mut Vec<Issue>) -> Vec<Size> {
        let f = &parent.feed_forward;
        let (ff, m) = (f.block_ff_dim, (r.block_multiple_of, f.block_multiple_of));
        vec![
            ("block_ff_dim", r.block_ff_dim, ff),
            ("block_multiple_of", m.0, m.1),
        ]
    }
    fn apply(&mut self, r: &Lfm2Reduce) {
        let n = self.layers.num_hidden_layers;
        self.layers.full_attn_idxs.retain(|&i| i < n);
        self.feed_forward.block_ff_dim = r.block_ff_dim;
        self.feed_forward.block_multiple_of = r.block_multiple_of;
    }
    /// The width check's path is the dense `mlp.intermediate_size`.
    fn reduced_field(path: &str) -> Option<FieldPath> {
        let key = match path {
            "mlp.intermediate_size" => "block_ff_dim",
            _ => crate::reduce::last_key(path),
        };
        Some(crate::reduce::reduce_key(key))
    }
}

crate::document::impl_dense_document!(Lfm2Spec, check);
