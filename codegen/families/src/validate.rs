//! Semantic validation of a resolved spec. Every check adds an `Issue` and goes on, so
//! all errors of a file are reported together. Checks that need the resolved per-layer
//! structure run only once the bounds checks pass, so absurd sizes never allocate.

use crate::diag::{FieldPath, Issue};
use crate::ir::{Attention, KvSource, Layer, ModelIr, Window};
use crate::model::*;
use std::collections::BTreeSet;

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
    /// A document of one family's own layout names that family.
    pub(crate) fn family_is(&mut self, identity: &Identity, family: Family, anchor: &str) {
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
    /// The size limits of the attention stack and the MLP width, in the order
    /// every layout built like the dense one reports them; false when one is off.
    /// `positions` describes `max_position_embeddings`, `mlp_meaning` the width.
    pub(crate) fn stack_sizes(
        &mut self,
        s: &crate::reduce::Stack,
        (max_position_embeddings, positions): (u32, &str),
        (intermediate_size, mlp_meaning): (u32, &str),
    ) -> bool {
        let mut ok = true;
        ok &= self.range(
            "model.hidden_size",
            s.hidden_size,
            MAX_HIDDEN,
            "the model width",
        );
        ok &= self.range(
            "model.vocab_size",
            s.vocab_size,
            MAX_VOCAB,
            "rows of embed_tokens",
        );
        ok &= self.range(
            "model.max_position_embeddings",
            max_position_embeddings,
            MAX_POSITIONS,
            positions,
        );
        ok &= self.range(
            "layers.num_hidden_layers",
            s.num_hidden_layers,
            MAX_LAYERS,
            "the number of decoder layers",
        );
        ok &= self.range(
            "attention.num_attention_heads",
            s.num_attention_heads,
            MAX_HEADS,
            "query heads",
        );
        ok &= self.range(
            "attention.num_key_value_heads",
            s.num_key_value_heads,
            MAX_HEADS,
            "KV heads",
        );
        ok &= self.range(
            "attention.head_dim",
            s.head_dim,
            MAX_HEAD_DIM,
            "head dimension",
        );
        ok &= self.range(
            "mlp.intermediate_size",
            intermediate_size,
            MAX_INTERMEDIATE,
            mlp_meaning,
        );
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
    if !bits_ok {
        out.push(Issue::new(
            path.key("bits"),
            format!(
                "{} bits is not supported by mlx for mode {}",
                q.bits,
                q.mode.as_str()
            ),
            bits_desc,
            "mlx.core.quantize supports these bit widths only",
        ));
    }
    if !groups_ok {
        out.push(Issue::new(
            path.key("group_size"),
            format!(
                "group size {} is not supported by mlx for mode {}",
                q.group_size,
                q.mode.as_str()
            ),
            groups_desc,
            "mlx.core.quantize supports these group sizes only",
        ));
    }
    out
}

/// All semantic errors of a resolved spec (paths in full-spec coordinates).
pub(crate) fn check(spec: &Gemma4Spec) -> Vec<Issue> {
    let mut c = Checker::default();
    c.header(spec.format_version, &spec.identity);

    if spec.identity.source.model_type.family() != Family::Gemma4 {
        c.err(
            p("identity.source.model_type"),
            format!(
                "`{}` is not a Gemma-4 model type",
                spec.identity.source.model_type.as_str()
            ),
            "one of gemma4, gemma4_text, gemma4_unified",
            "a qwen3 or llama checkpoint needs a spec of that family (`cargo xtask spec import`)",
        );
    }

    // Bounds. `ok` stays true only if everything the structure needs is sane.
    let m = &spec.model;
    let a = &spec.attention;
    let l = &spec.layers;
    let mut ok = true;
    ok &= c.range(
        "model.hidden_size",
        m.hidden_size,
        MAX_HIDDEN,
        "the model width (`hidden_size`)",
    );
    ok &= c.range(
        "model.vocab_size",
        m.vocab_size,
        MAX_VOCAB,
        "rows of embed_tokens (`vocab_size`)",
    );
    c.range(
        "model.max_position_embeddings",
        m.max_position_embeddings,
        MAX_POSITIONS,
        "`max_position_embeddings` from config.json",
    );
    c.eps(m.rms_norm_eps, "Gemma-4 uses 1.0e-6");
    if let Some(s) = m.final_logit_softcapping {
        c.positive_finite(
            "model.final_logit_softcapping",
            s,
            "write null for no softcap; Gemma-4 uses 30.0",
        );
    }
    ok &= c.range(
        "layers.num_hidden_layers",
        l.num_hidden_layers,
        MAX_LAYERS,
        "the number of decoder layers",
    );
    ok &= c.range(
        "layers.repeat",
        l.repeat,
        MAX_LAYERS,
        "how many times `pattern` repeats",
    );
    if l.pattern.is_empty() || l.pattern.len() > MAX_LAYERS as usize {
        c.err(
            p("layers.pattern"),
            format!("pattern has {} entries", l.pattern.len()),
            format!("1..={MAX_LAYERS} layer types"),
            "e.g. [sliding, sliding, sliding, sliding, sliding, full]",
        );
        ok = false;
    }
    if ok {
        let total = l.pattern.len() as u64 * l.repeat as u64;
        if total != l.num_hidden_layers as u64 {
            c.err(
                p("layers.repeat"),
                format!("pattern of {} × repeat {} gives {} layer types, but num_hidden_layers is {}", l.pattern.len(), l.repeat, total, l.num_hidden_layers),
                format!("pattern length × repeat = {}", l.num_hidden_layers),
                "the resolved layer_types list must have exactly num_hidden_layers entries (no truncation)",
            );
            ok = false;
        }
    }
    ok &= c.range(
        "attention.num_attention_heads",
        a.num_attention_heads,
        MAX_HEADS,
        "query heads (`num_attention_heads`)",
    );
    ok &= c.range(
        "attention.num_key_value_heads",
        a.num_key_value_heads,
        MAX_HEADS,
        "KV heads (`num_key_value_heads`)",
    );
    ok &= c.range(
        "attention.head_dim",
        a.head_dim,
        MAX_HEAD_DIM,
        "head dimension of sliding layers",
    );
    ok &= c.even_head_dim("attention.head_dim", a.head_dim);
    if let Some(g) = a.global_head_dim {
        ok &= c.range(
            "attention.global_head_dim",
            g,
            MAX_HEAD_DIM,
            "head dimension of full layers; null means head_dim",
        );
        ok &= c.even_head_dim("attention.global_head_dim", g);
    }
    ok &= c.range(
        "attention.sliding_window",
        a.sliding_window,
        MAX_WINDOW,
        "window of sliding layers (`sliding_window`)",
    );
    ok &= c.grouped(a.num_attention_heads, a.num_key_value_heads);
    match (a.num_global_key_value_heads, a.attention_k_eq_v) {
        (Some(_), false) => c.err(
            p("attention.num_global_key_value_heads"),
            "set, but mlx-lm reads it only when attention_k_eq_v is true",
            "null when attention_k_eq_v is false",
            "write null (full layers then use num_key_value_heads), or set attention_k_eq_v: true",
        ),
        (Some(g), true) => {
            ok &= c.range(
                "attention.num_global_key_value_heads",
                g,
                MAX_HEADS,
                "KV heads of full layers",
            );
            if g > 0 && a.num_attention_heads > 0 && a.num_attention_heads % g != 0 {
                c.err(
                    p("attention.num_global_key_value_heads"),
                    format!("{} query heads are not divisible by {g} global KV heads", a.num_attention_heads),
                    "a divisor of num_attention_heads",
                    "full layers repeat each KV head num_attention_heads / num_global_key_value_heads times",
                );
                ok = false;
            }
        }
        _ => {}
    }
    for (name, r) in [("sliding", &spec.rope.sliding), ("full", &spec.rope.full)] {
        match r {
            RopeParams::Default { rope_theta } => {
                c.positive_finite(
                    &format!("rope.{name}.rope_theta"),
                    *rope_theta,
                    "the RoPE base, e.g. 10000.0",
                );
            }
            RopeParams::Proportional {
                rope_theta,
                partial_rotary_factor,
                factor,
            } => {
                c.positive_finite(
                    &format!("rope.{name}.rope_theta"),
                    *rope_theta,
                    "the RoPE base, e.g. 1000000.0",
                );
                c.positive_finite(
                    &format!("rope.{name}.factor"),
                    *factor,
                    "frequency factor; 1.0 when the config has none",
                );
                if !(partial_rotary_factor.is_finite()
                    && *partial_rotary_factor > 0.0
                    && *partial_rotary_factor <= 1.0)
                {
                    c.err(
                        p(&format!("rope.{name}.partial_rotary_factor")),
                        format!("{partial_rotary_factor} is outside (0, 1]"),
                        "a number in (0, 1]",
                        "the fraction of each head's dimensions that rotate; Gemma-4 full layers use 0.25",
                    );
                } else {
                    let hd = match name {
                        "full" => a.global_head_dim.unwrap_or(a.head_dim),
                        _ => a.head_dim,
                    };
                    if ((hd as f64) * partial_rotary_factor).floor() < 2.0 {
                        c.err(
                            p(&format!("rope.{name}.partial_rotary_factor")),
                            format!("int({hd} × {partial_rotary_factor}) rotates fewer than 2 dimensions"),
                            "a factor that rotates at least one pair",
                            "raise the factor or the head dimension",
                        );
                    }
                }
            }
        }
    }
    ok &= c.range(
        "mlp.intermediate_size",
        spec.mlp.intermediate_size,
        MAX_INTERMEDIATE,
        "dense MLP width (`intermediate_size`)",
    );
    if let Some(moe) = &spec.moe {
        ok &= c.range(
            "moe.num_experts",
            moe.num_experts,
            MAX_EXPERTS,
            "experts per layer",
        );
        ok &= c.range(
            "moe.moe_intermediate_size",
            moe.moe_intermediate_size,
            MAX_INTERMEDIATE,
            "expert GeGLU width",
        );
        if moe.top_k_experts == 0 || moe.top_k_experts > moe.num_experts {
            c.err(
                p("moe.top_k_experts"),
                format!(
                    "top-k {} with {} experts",
                    moe.top_k_experts, moe.num_experts
                ),
                format!("an integer in 1..={}", moe.num_experts),
                "the router picks top_k_experts of num_experts with argpartition",
            );
            ok = false;
        }
    }
    if let Some(ple) = &spec.per_layer_input {
        ok &= c.range(
            "per_layer_input.hidden_size_per_layer_input",
            ple.hidden_size_per_layer_input,
            MAX_PLE_WIDTH,
            "per-layer input width; write per_layer_input: null to disable PLE",
        );
        ok &= c.range(
            "per_layer_input.vocab_size_per_layer_input",
            ple.vocab_size_per_layer_input,
            MAX_VOCAB,
            "rows of embed_tokens_per_layer",
        );
    }

    if !ok {
        return c.issues;
    }

    // Structure.
    let n = l.num_hidden_layers;
    let shared = l.num_kv_shared_layers;
    let types = spec.layer_types();
    if shared > n {
        c.err(
            p("layers.num_kv_shared_layers"),
            format!("{shared} shared layers but only {n} layers"),
            format!("an integer in 0..{n}"),
            "the last num_kv_shared_layers layers reuse K/V of earlier layers",
        );
        return c.issues;
    }
    let first_shared = (n - shared) as usize;
    if shared > 0 {
        let donors: BTreeSet<LayerType> = types[..first_shared].iter().copied().collect();
        let mut missing: Vec<LayerType> = types[first_shared..]
            .iter()
            .copied()
            .filter(|t| !donors.contains(t))
            .collect();
        missing.dedup();
        let missing: BTreeSet<LayerType> = missing.into_iter().collect();
        for t in missing {
            let first = types[first_shared..]
                .iter()
                .position(|x| *x == t)
                .unwrap_or(0)
                + first_shared;
            c.err(
                p("layers.num_kv_shared_layers"),
                format!(
                    "KV-shared layer {first} is {} but no layer before {first_shared} is, so it has no donor",
                    t.hf_name()
                ),
                format!("every type among layers {first_shared}..{n} to occur before layer {first_shared}"),
                "mlx-lm takes K/V from the last non-shared layer of the same type (KeyError otherwise); lower num_kv_shared_layers",
            );
        }
    }
    if spec.mlp.use_double_wide_mlp && (shared == 0 || first_shared == 0) {
        c.err(
            p("mlp.use_double_wide_mlp"),
            "true, but there are no KV-shared layers after a donor, so no layer is double-wide",
            "false when num_kv_shared_layers is 0",
            "mlx-lm doubles the MLP only on layers >= num_hidden_layers - num_kv_shared_layers > 0; write false",
        );
    }
    if !c.issues.is_empty() {
        return c.issues;
    }

    let ir = crate::gemma4::lower(spec);
    if let Some(q) = &spec.quantization {
        check_quantization(q, &ir, &mut c.issues);
    }
    // Every Gemma-4 layer is attention: entry i is layer i's.
    let attention: Vec<&Attention> = ir.layers.iter().filter_map(Layer::attention).collect();
    if let Some(kv) = &spec.kv_quantization {
        // Donor -> the KV-shared layers reading it.
        let mut readers: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (index, a) in attention.iter().enumerate() {
            match a.kv {
                KvSource::Shared { donor } => readers.entry(donor).or_default().push(index),
                KvSource::Own { .. } => {}
            }
        }
        // The layers mlx-lm can run with a QuantizedKVCache.
        let full_quantizable: Vec<usize> = attention
            .iter()
            .enumerate()
            .filter(|(i, a)| a.owns_kv() && a.window == Window::Full && !readers.contains_key(i))
            .map(|(i, _)| i)
            .collect();
        let mut prev: Option<u32> = None;
        for (i, e) in kv.iter().enumerate() {
            let ep = p("kv_quantization").index(i);
            if e.layer_idx >= n {
                c.err(
                    ep.key("layer_idx"),
                    format!("layer {} does not exist", e.layer_idx),
                    format!("a layer index in 0..{n}"),
                    "indices are 0-based",
                );
                continue;
            }
            if let Some(pv) = prev {
                if e.layer_idx <= pv {
                    c.err(
                        ep.key("layer_idx"),
                        format!("layer {} after layer {pv}", e.layer_idx),
                        "entries sorted by layer_idx, each layer once",
                        "sort the list and drop duplicates",
                    );
                }
            }
            prev = Some(e.layer_idx);
            let facts = attention[e.layer_idx as usize];
            if !facts.owns_kv() {
                c.err(
                    ep.key("layer_idx"),
                    format!("layer {} is KV-shared and owns no cache", e.layer_idx),
                    format!("a layer below {first_shared}"),
                    "sharers read their donor's cache; quantize the donor instead",
                );
            } else if matches!(facts.window, Window::Sliding(_)) {
                c.err(
                    ep.key("layer_idx"),
                    format!(
                        "layer {} is a sliding-attention layer (rotating cache)",
                        e.layer_idx
                    ),
                    format!("a full-attention layer ({})", list(&full_quantizable)),
                    "mlx-lm quantizes only the full layers' KVCache: RotatingKVCache.to_quantized raises NotImplementedError (mlx-lm 0.32.2)",
                );
            } else if let Some(sharers) = readers.get(&(e.layer_idx as usize)) {
                c.err(
                    ep.key("layer_idx"),
                    format!(
                        "layer {} is the K/V donor of KV-shared {}",
                        e.layer_idx,
                        list(sharers)
                    ),
                    format!(
                        "a full-attention layer that no KV-shared layer reads ({})",
                        list(&full_quantizable)
                    ),
                    "a sharer has no cache, so mlx-lm's scaled_dot_product_attention takes the unquantized path with the donor's quantized (data, scales, biases) tuples and fails; quantize another full layer or lower num_kv_shared_layers",
                );
            }
            if !AFFINE_BITS.contains(&e.bits) {
                c.err(
                    ep.key("bits"),
                    format!("{} bits", e.bits),
                    "one of 2, 3, 4, 5, 6, 8",
                    "KV caches use mlx affine quantization",
                );
            }
            if !AFFINE_GROUPS.contains(&e.group_size) {
                c.err(
                    ep.key("group_size"),
                    format!("group size {}", e.group_size),
                    "one of 32, 64, 128",
                    "KV caches use mlx affine quantization",
                );
            } else if facts.head_dim as u32 % e.group_size != 0 {
                c.err(
                    ep.key("group_size"),
                    format!(
                        "group size {} does not divide layer {}'s head_dim {}",
                        e.group_size, e.layer_idx, facts.head_dim
                    ),
                    format!("a group size dividing {}", facts.head_dim),
                    "K and V are quantized along the head dimension",
                );
            }
        }
    }
    if let (true, Some(m)) = (c.issues.is_empty(), &spec.mixed_kv) {
        c.issues
            .extend(crate::mixed_kv::check(m, &crate::gemma4::lower(spec)));
    }
    c.issues
}

/// `layers 5, 11` / `layer 5` / `no such layer in this model`.
fn list(layers: &[usize]) -> String {
    match layers {
        [] => "no such layer in this model".to_string(),
        [one] => format!("layer {one}"),
        more => format!(
            "layers {}",
            more.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
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
