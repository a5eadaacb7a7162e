//! Semantic validation of a resolved spec: the [`Checker`] and the checks every
//! family shares (header, sizes, names, weight quantization against the IR).
//! Each family's own checks live with it (Gemma-4's in `gemma4/validate.rs`).
//! Every check adds an `Issue` and goes on, so all errors of a file are reported
//! together. Checks that need the resolved per-layer structure run only once the
//! bounds checks pass, so absurd sizes never allocate.

use crate::diag::{FieldPath, Issue};
use crate::document::Document;
use crate::ir::ModelIr;
use crate::layout_reader::Layout;
use crate::model::*;

/// Upper bounds: far above any released model, low enough that shape math fits in i32.
pub mod limits {
    pub const MAX_LAYERS: u32 = 1024;
    pub const MAX_HIDDEN: u32 = 65_536;
    pub const MAX_VOCAB: u32 = 1 << 22;
    pub const MAX_HEADS: u32 = 1024;
    pub const MAX_HEAD_DIM: u32 = 4096;
    pub const MAX_INTERMEDIATE: u32 = 1 << 20;
    pub const MAX_EXPERTS: u32 = 4096;
    pub const MAX_WINDOW: u32 = 1 << 24;
    pub const MAX_POSITIONS: u32 = 1 << 24;
    pub const MAX_PLE_WIDTH: u32 = 65_536;
}
use limits::*;

/// [`Checker::range`] over a table of rows `"field.path": value => max, "what it
/// is";`, each checked in order (every row reports its own issue); true when all
/// hold. A table rather than calls, so that each bound reads on one line.
macro_rules! ranges {
    ($checker:expr; $($path:literal: $value:expr => $max:expr, $meaning:expr;)+) => {{
        let mut all_hold = true;
        $(all_hold &= $checker.range($path, $value, $max, $meaning);)+
        all_hold
    }};
}
pub(crate) use ranges;

use crate::ir::{AFFINE_BITS, AFFINE_GROUPS};

fn p(s: &str) -> FieldPath {
    FieldPath::parse(s)
}

/// Collects issues; the checks every family's layout shares live here once.
#[derive(Default)]
pub(crate) struct Checker {
    pub(crate) issues: Vec<Issue>,
}

impl Checker {
    pub(crate) fn err(
        &mut self,
        path: FieldPath,
        msg: impl Into<String>,
        exp: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.issues.push(Issue::new(path, msg, exp, hint));
    }
    /// A checker that has checked what a document read with `layout` opens
    /// with: its [`Checker::header`], and that it names `family`.
    pub(crate) fn for_document(spec: &dyn Document, family: Family, layout: &Layout) -> Checker {
        let mut c = Checker::default();
        c.header(spec.format_version(), spec.identity());
        c.family_is(spec.identity(), family, layout.anchor);
        c
    }
    /// A document of one family's own layout names that family.
    fn family_is(&mut self, identity: &Identity, family: Family, anchor: &str) {
        if identity.family != family {
            self.err(
                p("identity.family"),
                format!("`{}` is not {}", identity.family.as_str(), family.as_str()),
                family.as_str(),
                format!(
                    "this document has the {} layout (docs/spec-format.md#{anchor})",
                    family.as_str()
                ),
            );
        }
    }
    /// A `model_type` that mlx-lm reads with another module than `module`
    /// (the family's; `expected` lists the model types it reads).
    pub(crate) fn foreign_model_type(
        &mut self,
        mt: ConfigModelType,
        module: &str,
        expected: &str,
        hint: &str,
    ) {
        self.err(
            p("identity.source.model_type"),
            format!(
                "`{}` is read by mlx-lm's {} module, not {module}",
                mt.as_str(),
                mt.family().as_str()
            ),
            expected,
            hint,
        );
    }
    /// A `model_type` other than `expected`, the one model type of the
    /// family (its name is the module's that reads it).
    pub(crate) fn model_type_is(
        &mut self,
        identity: &Identity,
        expected: ConfigModelType,
        hint: &str,
    ) {
        let mt = identity.source.model_type;
        if mt != expected {
            self.foreign_model_type(mt, expected.as_str(), expected.as_str(), hint);
        }
    }
    /// The size limits of the `model` section's (hidden, vocab) and the layer
    /// count `sizes`, in the order every layout reports them; false when one
    /// is off. `positions` describes `max_position_embeddings`.
    pub(crate) fn model_sizes(
        &mut self,
        (hidden_size, vocab_size, num_hidden_layers): (u32, u32, u32),
        (max_position_embeddings, positions): (u32, &str),
    ) -> bool {
        ranges! { self;
            "model.hidden_size": hidden_size => MAX_HIDDEN, "the model width";
            "model.vocab_size": vocab_size => MAX_VOCAB, "rows of embed_tokens";
            "model.max_position_embeddings": max_position_embeddings => MAX_POSITIONS, positions;
            "layers.num_hidden_layers": num_hidden_layers => MAX_LAYERS, "the number of decoder layers";
        }
    }
    /// The size limits of the attention stack and the MLP width, in the order
    /// every layout built like the dense one reports them; false when one is off.
    /// `positions` describes `max_position_embeddings`, `mlp_meaning` the width.
    pub(crate) fn stack_sizes(
        &mut self,
        s: &crate::reduce::Stack,
        positions: (u32, &str),
        (intermediate_size, mlp_meaning): (u32, &str),
    ) -> bool {
        let sizes = (s.hidden_size, s.vocab_size, s.num_hidden_layers);
        let mut ok = self.model_sizes(sizes, positions);
        ok &= ranges! { self;
            "attention.num_attention_heads": s.num_attention_heads => MAX_HEADS, "query heads";
            "attention.num_key_value_heads": s.num_key_value_heads => MAX_HEADS, "KV heads";
            "attention.head_dim": s.head_dim => MAX_HEAD_DIM, "head dimension";
            "mlp.intermediate_size": intermediate_size => MAX_INTERMEDIATE, mlp_meaning;
        };
        ok
    }
    /// Every issue found; when the sizes hold (`sizes_ok`) and nothing else was
    /// found, also the weight quantization's against the model `lower` builds
    /// (only a sane spec may be lowered).
    pub(crate) fn finish(
        mut self,
        sizes_ok: bool,
        quantization: Option<&Quantization>,
        lower: impl FnOnce() -> ModelIr,
    ) -> Vec<Issue> {
        if sizes_ok && self.issues.is_empty() {
            if let Some(q) = quantization {
                check_quantization(q, &lower(), &mut self.issues);
            }
        }
        self.issues
    }
    /// `1 <= v <= max`; returns whether it holds.
    pub(crate) fn range(&mut self, path: &str, v: u32, max: u32, hint: &str) -> bool {
        if v == 0 || v > max {
            self.err(
                p(path),
                format!("{v} is out of range"),
                format!("an integer in 1..={max}"),
                hint,
            );
            false
        } else {
            true
        }
    }
    pub(crate) fn positive_finite(&mut self, path: &str, v: f64, hint: &str) -> bool {
        if !(v.is_finite() && v > 0.0) {
            self.err(
                p(path),
                format!("{v} is not a positive finite number"),
                "a number > 0",
                hint,
            );
            false
        } else {
            true
        }
    }
    /// `format_version`, `identity.name` and `identity.source.repo`.
    pub(crate) fn header(&mut self, format_version: u32, identity: &Identity) {
        if format_version != FORMAT_VERSION {
            self.err(
                p("format_version"),
                format!("format version {format_version} is not supported"),
                format!("{FORMAT_VERSION}"),
                "this archgen reads format_version 1 only",
            );
        }
        check_name(&mut self.issues, &identity.name, &p("identity.name"));
        if let Some(r) = &identity.source.repo {
            if r.trim().is_empty() {
                self.err(
                    p("identity.source.repo"),
                    "empty repo",
                    "`org/name` or null",
                    "write null when the repo is unknown",
                );
            }
        }
    }
    /// `model.rms_norm_eps` in (0, 0.1].
    pub(crate) fn eps(&mut self, eps: f64, hint: &str) {
        if !(eps.is_finite() && eps > 0.0 && eps <= 0.1) {
            self.err(
                p("model.rms_norm_eps"),
                format!("{eps} is not a usable epsilon"),
                "a number in (0, 0.1]",
                hint,
            );
        }
    }
    /// `model.tie_word_embeddings` of a module (`module.py`) that always
    /// builds its own `lm_head`: it must be false.
    pub(crate) fn own_lm_head(&mut self, tie_word_embeddings: bool, module: &str) {
        if tie_word_embeddings {
            self.err(
                p("model.tie_word_embeddings"),
                "true",
                "false",
                format!(
                    "{module} always builds its own lm_head and never ties it to the embedding"
                ),
            );
        }
    }
    /// A head dimension RoPE rotates: in `1..=MAX_HEAD_DIM` and even; returns
    /// whether it is.
    pub(crate) fn rotated_head_dim(&mut self, path: &str, v: u32, hint: &str) -> bool {
        let in_range = self.range(path, v, MAX_HEAD_DIM, hint);
        let even = self.even_head_dim(path, v);
        in_range && even
    }
    /// A head dimension RoPE can rotate (even); returns whether it is.
    pub(crate) fn even_head_dim(&mut self, path: &str, v: u32) -> bool {
        if v % 2 != 0 {
            self.err(
                p(path),
                format!("{v} is odd"),
                "an even head dimension",
                "RoPE rotates pairs of dimensions",
            );
            false
        } else {
            true
        }
    }
    /// `attention.head_dim` even (RoPE rotates pairs) and the KV heads dividing
    /// the query heads, both checked; returns whether both hold.
    pub(crate) fn head_geometry(&mut self, head_dim: u32, heads: u32, kv_heads: u32) -> bool {
        let even = self.even_head_dim("attention.head_dim", head_dim);
        even & self.grouped(heads, kv_heads)
    }
    /// `rope.rope_theta`, the RoPE base every layout names alike: positive and finite.
    pub(crate) fn rope_theta(&mut self, theta: f64, hint: &str) {
        self.positive_finite("rope.rope_theta", theta, hint);
    }
    /// The routed experts' count at `count_path` (`moe.num_experts` or the
    /// family's name for it) and `moe.num_experts_per_tok`, each in
    /// `1..=MAX_EXPERTS`, `hints` saying what each is; returns whether both are.
    pub(crate) fn expert_counts(
        &mut self,
        (count_path, count): (&str, u32),
        top_k: u32,
        [count_hint, top_k_hint]: [&str; 2],
    ) -> bool {
        let count_ok = self.range(count_path, count, MAX_EXPERTS, count_hint);
        let top_k_ok = self.range("moe.num_experts_per_tok", top_k, MAX_EXPERTS, top_k_hint);
        count_ok && top_k_ok
    }
    /// `moe.num_experts_per_tok` against `moe.num_experts`: the router's
    /// argpartition picks k of the experts, so k cannot exceed their number.
    pub(crate) fn top_k_of_experts(&mut self, top_k: u32, num_experts: u32) -> bool {
        if top_k <= num_experts {
            return true;
        }
        self.err(
            FieldPath::parse("moe.num_experts_per_tok"),
            format!("top-{top_k} of {num_experts} experts"),
            format!("at most num_experts ({num_experts})"),
            "argpartition picks k of the experts: k cannot exceed their number",
        );
        false
    }
    /// `attention.num_key_value_heads` divides the query heads; returns whether it does.
    pub(crate) fn grouped(&mut self, heads: u32, kv_heads: u32) -> bool {
        if heads > 0 && kv_heads > 0 && heads % kv_heads != 0 {
            self.err(
                p("attention.num_key_value_heads"),
                format!("{heads} query heads are not divisible by {kv_heads} KV heads"),
                "a divisor of num_attention_heads",
                "grouped-query attention repeats each KV head num_attention_heads / num_key_value_heads times",
            );
            false
        } else {
            true
        }
    }
}

/// Checks a quantization params entry; `path` names it.
pub(crate) fn check_quant_params(q: &QuantParams, path: &FieldPath) -> Vec<Issue> {
    let mut out = Vec::new();
    let (bits_ok, groups_ok, bits_desc, groups_desc): (bool, bool, &str, &str) = match q.mode {
        QuantMode::Affine => (
            AFFINE_BITS.contains(&q.bits),
            AFFINE_GROUPS.contains(&q.group_size),
            "one of 2, 3, 4, 5, 6, 8",
            "one of 32, 64, 128",
        ),
        QuantMode::Mxfp4 => (q.bits == 4, q.group_size == 32, "4 (mxfp4)", "32 (mxfp4)"),
        QuantMode::Mxfp8 => (q.bits == 8, q.group_size == 32, "8 (mxfp8)", "32 (mxfp8)"),
        QuantMode::Nvfp4 => (q.bits == 4, q.group_size == 16, "4 (nvfp4)", "16 (nvfp4)"),
    };
    for (ok, key, subject, expected, supports) in [
        (
            bits_ok,
            "bits",
            format!("{} bits", q.bits),
            bits_desc,
            "bit widths",
        ),
        (
            groups_ok,
            "group_size",
            format!("group size {}", q.group_size),
            groups_desc,
            "group sizes",
        ),
    ] {
        if !ok {
            out.push(Issue::new(
                path.key(key),
                format!(
                    "{subject} is not supported by mlx for mode {}",
                    q.mode.as_str()
                ),
                expected,
                format!("mlx.core.quantize supports these {supports} only"),
            ));
        }
    }
    out
}

/// Spec names: lowercase ASCII letters, digits, `-`, `_`, `.`; starting with a letter.
pub(crate) fn check_name(out: &mut Vec<Issue>, name: &str, path: &FieldPath) {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c));
    if !ok {
        out.push(Issue::new(
            path.clone(),
            format!("`{name}` is not a valid spec name"),
            "lowercase letters, digits, `-`, `_`, `.`, starting with a letter (at most 100)",
            "the name is also the file name: specs/<name>.yaml",
        ));
    }
}

/// Checks weight quantization against the modules of the model's block IR
/// (any family: the lowering names them as the checkpoint does).
pub(crate) fn check_quantization(q: &Quantization, ir: &ModelIr, issues: &mut Vec<Issue>) {
    let modules = ir.quantizable_modules();
    let prefix = ir.module_prefix();
    let mut c = Checker {
        issues: std::mem::take(issues),
    };
    c.issues
        .extend(check_quant_params(&q.default, &p("quantization.default")));
    for (path, ov) in &q.overrides {
        let opath = p("quantization.overrides").key(path);
        let Some(module) = modules.iter().find(|m| &m.path == path) else {
            c.err(
                opath,
                format!("`{path}` is not a quantizable module of this model"),
                format!("a Linear/Embedding/SwitchLinear path such as `{prefix}layers.0.self_attn.q_proj`"),
                "paths are full mlx module paths; `cargo xtask spec show NAME` lists the modules",
            );
            continue;
        };
        if let QuantOverride::Params(qp) = ov {
            let issues = check_quant_params(qp, &opath);
            let bad = !issues.is_empty();
            c.issues.extend(issues);
            if !bad && module.in_dim % qp.group_size as u64 != 0 {
                c.err(
                    opath.key("group_size"),
                    format!(
                        "group size {} does not divide the module's input dimension {}",
                        qp.group_size, module.in_dim
                    ),
                    format!("a group size dividing {}", module.in_dim),
                    "mlx quantizes along the input dimension in whole groups",
                );
            }
        }
        if let QuantOverride::Skip(true) = ov {
            c.err(
                opath,
                "`true`",
                "`false` or params",
                "write the params explicitly",
            );
        }
    }
    *issues = c.issues;
}
