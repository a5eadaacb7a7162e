//! Derived specs: `derive: {from, reduce, quantization, kv_quantization}`. The parent is
//! loaded, its sizes replaced by `reduce`, and everything structural inherited; then the
//! result is validated like any spec, and checked to keep the parent's structure.

use crate::diag::{Diagnostics, FieldPath, Issue};
use crate::model::*;
use crate::reduce::{self, StackSections};
use crate::yaml::{Loc, Node};
use crate::{
    de_at, locate_all, locate_serde, missing_field, unknown_field, validate, MAX_DERIVE_DEPTH,
};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

const DERIVED_SECTIONS: [&str; 3] = ["format_version", "identity", "derive"];

fn p(s: &str) -> FieldPath {
    FieldPath::parse(s)
}

pub(crate) fn parse_derived(
    value: serde_yaml::Value,
    tree: &Node,
    origin: &str,
    dir: &Path,
    stack: &mut Vec<PathBuf>,
) -> Result<crate::Spec, Diagnostics> {
    if let Some(from) = value
        .get("derive")
        .and_then(|d| d.get("from"))
        .and_then(serde_yaml::Value::as_str)
    {
        let mut bad_name = Vec::new();
        validate::check_name(&mut bad_name, from, &p("derive.from"));
        // Every family but Gemma-4 has its own derived form, read against the
        // loaded parent; Gemma-4's is the generic one below.
        let own_form = parent_family(dir, from, 0).is_some_and(|f| f != Family::Gemma4);
        if bad_name.is_empty() && own_form {
            let from = from.to_string();
            // Each family's derived form, read against its own parent.
            use crate::Spec as S;
            return match load_parent(&from, tree, origin, dir, stack)? {
                S::Dense(parent) => reduce::read(value, tree, origin, &parent).map(S::Dense),
                S::Gemma2(parent) => reduce::read(value, tree, origin, &parent).map(S::Gemma2),
                S::Qwen3Moe(parent) => reduce::read(value, tree, origin, &parent).map(S::Qwen3Moe),
                S::MiniCpm(parent) => reduce::read(value, tree, origin, &parent).map(S::MiniCpm),
                S::Qwen35(parent) => reduce::read(value, tree, origin, &parent).map(S::Qwen35),
                S::Lfm2(parent) => reduce::read(value, tree, origin, &parent).map(S::Lfm2),
                S::Glm4Moe(parent) => reduce::read(value, tree, origin, &parent).map(S::Glm4Moe),
                S::Gemma4(_) => unreachable_family(tree, origin),
                S::DeepseekV3(_) => no_derived_form(tree, origin, "deepseek_v3"),
                S::GptOss(parent) => reduce::read(value, tree, origin, &parent).map(S::GptOss),
            };
        }
    }
    let file: DerivedSpecFile = match serde_path_to_error::deserialize(value.clone()) {
        Ok(f) => f,
        Err(_) => {
            let mut issues = Vec::new();
            let map = value.as_mapping().cloned().unwrap_or_default();
            for (k, _) in map.iter() {
                let key = k.as_str().unwrap_or("");
                if !DERIVED_SECTIONS.contains(&key) {
                    issues.push(unknown_field(&FieldPath::root(), key, &DERIVED_SECTIONS));
                }
            }
            match map.get("format_version") {
                None => issues.push(missing_field(&FieldPath::root(), "format_version")),
                Some(v) => {
                    if let Err(e) = de_at::<u32>(v.clone(), &p("format_version")) {
                        issues.push(e);
                    }
                }
            }
            match map.get("identity") {
                None => issues.push(missing_field(&FieldPath::root(), "identity")),
                Some(v) => {
                    if let Err(e) = de_at::<DerivedIdentity>(v.clone(), &p("identity")) {
                        issues.push(e);
                    }
                }
            }
            if let Some(v) = map.get("derive") {
                if let Err(e) = de_at::<Derive>(v.clone(), &p("derive")) {
                    issues.push(e);
                }
            }
            if issues.is_empty() {
                issues.push(Issue::new(
                    FieldPath::root(),
                    "the derived spec does not parse",
                    "format_version, identity {name}, derive {from, reduce, quantization, kv_quantization}",
                    "see docs/spec-format.md#derived-specs",
                ));
            }
            return Err(locate_serde(tree, origin, issues));
        }
    };

    let mut front = Vec::new();
    if file.format_version != FORMAT_VERSION {
        front.push(Issue::new(
            p("format_version"),
            format!("format version {} is not supported", file.format_version),
            format!("{FORMAT_VERSION}"),
            "this archgen reads format_version 1 only",
        ));
    }
    validate::check_name(&mut front, &file.derive.from, &p("derive.from"));
    if !front.is_empty() {
        return Err(locate_all(tree, origin, front));
    }

    let parent = load_parent(&file.derive.from, tree, origin, dir, stack)?;
    let Some(parent) = parent.into_gemma4() else {
        return unreachable_family(tree, origin);
    };

    let (spec, mut issues) = apply(&parent, &file);
    if issues.is_empty() {
        let resolved_issues = crate::gemma4::check(&spec);
        issues.extend(
            resolved_issues
                .into_iter()
                .map(|i| translate(i, &file, &parent.identity.name)),
        );
    }
    if issues.is_empty() {
        issues.extend(check_quant_divisibility(&spec));
    }
    if issues.is_empty() {
        Ok(crate::Spec::Gemma4(spec))
    } else {
        Err(locate_all(tree, origin, issues))
    }
}

/// The family of the spec `from` in `dir` (following its own `derive.from`); None when
/// it cannot be read (the Gemma-4 path then reports it).
fn parent_family(dir: &Path, from: &str, depth: usize) -> Option<Family> {
    if depth > MAX_DERIVE_DEPTH {
        return None;
    }
    let path = dir.join(format!("{from}.yaml"));
    let small = std::fs::metadata(&path).is_ok_and(|m| m.len() <= crate::MAX_SPEC_BYTES as u64);
    let value = small
        .then(|| std::fs::read_to_string(&path).ok())
        .flatten()
        .and_then(|t| serde_yaml::from_str::<serde_yaml::Value>(&t).ok())?;
    if let Some(next) = value
        .get("derive")
        .and_then(|d| d.get("from"))
        .and_then(serde_yaml::Value::as_str)
    {
        return parent_family(dir, next, depth + 1);
    }
    value
        .get("identity")
        .and_then(|i| i.get("family"))
        .and_then(|f| serde_yaml::from_value::<Family>(f.clone()).ok())
}

fn unreachable_family<T>(tree: &Node, origin: &str) -> Result<T, Diagnostics> {
    Err(locate_all(
        tree,
        origin,
        vec![Issue::new(
            p("derive.from"),
            "the parent's family changed while it was being read",
            "a parent spec that does not change during the run",
            "run the command again",
        )],
    ))
}

/// A parent whose layout has no derived form yet: its variants are full specs.
fn no_derived_form<T>(tree: &Node, origin: &str, family: &str) -> Result<T, Diagnostics> {
    Err(locate_all(
        tree,
        origin,
        vec![Issue::new(
            p("derive.from"),
            format!("a {family} parent, whose layout has no derived form yet"),
            "a parent of a family with a derived form",
            format!("write the reduced {family} spec in full (see docs/spec-format.md)"),
        )],
    ))
}

/// Loads `derive.from` from the same directory, refusing cycles and deep chains.
fn load_parent(
    from: &str,
    tree: &Node,
    origin: &str,
    dir: &Path,
    stack: &mut Vec<PathBuf>,
) -> Result<crate::Spec, Diagnostics> {
    let parent_path = dir.join(format!("{}.yaml", from));
    let key = std::fs::canonicalize(&parent_path).unwrap_or(parent_path.clone());
    let here = std::fs::canonicalize(origin).unwrap_or_else(|_| PathBuf::from(origin));
    let from_loc = tree.locate(&p("derive.from"));
    let err_at = |loc: Loc, issue: Issue| Diagnostics(vec![crate::located(origin, loc, issue)]);
    if stack.contains(&key) || key == here {
        return Err(err_at(
            from_loc,
            Issue::new(
                p("derive.from"),
                format!(
                    "`{}` derives (directly or not) from this spec: a cycle",
                    from
                ),
                "a chain of derive.from that ends at a full spec",
                "derive from the full spec instead",
            ),
        ));
    }
    if stack.len() >= MAX_DERIVE_DEPTH {
        return Err(err_at(
            from_loc,
            Issue::new(
                p("derive.from"),
                format!("derivation chain deeper than {MAX_DERIVE_DEPTH}"),
                format!("at most {MAX_DERIVE_DEPTH} levels"),
                "derive from a spec nearer the full one",
            ),
        ));
    }
    if !parent_path.is_file() {
        return Err(err_at(
            from_loc,
            Issue::new(
                p("derive.from"),
                format!("no spec `{}` (looked for {})", from, parent_path.display()),
                "the name of a spec in the same directory",
                "check the spelling; `cargo xtask spec check` lists the specs",
            ),
        ));
    }
    stack.push(key);
    let parent = crate::load_inner(&parent_path, stack);
    stack.pop();
    match parent {
        Ok(s) => Ok(s),
        Err(inner) => {
            let mut d = err_at(
                from_loc,
                Issue::new(
                    p("derive.from"),
                    format!(
                        "parent spec `{}` has {} error(s), listed below",
                        from,
                        inner.len()
                    ),
                    "a parent spec that validates",
                    "fix the parent first",
                ),
            );
            d.0.extend(inner.0);
            Err(d)
        }
    }
}

/// The smallest period of a layer-type list.
fn minimal_period(types: &[LayerType]) -> usize {
    let n = types.len();
    (1..=n)
        .find(|&p| n % p == 0 && types.iter().enumerate().all(|(i, t)| *t == types[i % p]))
        .unwrap_or(n)
}

/// Builds the derived spec; issues are in derived-file coordinates.
fn apply(parent: &Gemma4Spec, file: &DerivedSpecFile) -> (Gemma4Spec, Vec<Issue>) {
    let mut issues = Vec::new();
    let mut spec = parent.clone();
    spec.identity.name = file.identity.name.clone();
    spec.quantization = file.derive.quantization.clone();
    spec.kv_quantization = file.derive.kv_quantization.clone();
    spec.mixed_kv = file.derive.mixed_kv.clone();
    let Some(r) = &file.derive.reduce else {
        return (spec, issues);
    };
    let rp = |f: &str| p("derive.reduce").key(f);
    let types = parent.layer_types();
    let period = minimal_period(&types);
    let parent_periods = (types.len() / period) as u32;

    // Feature presence must match the parent: (feature, whether the parent
    // has it, each reduced size of it and whether the reduction sets it).
    type SetByReduction<'a> = &'a [(&'a str, bool)];
    let features: [(&str, bool, SetByReduction); 4] = [
        (
            "num_global_key_value_heads",
            parent.attention.num_global_key_value_heads.is_some(),
            &[(
                "num_global_key_value_heads",
                r.num_global_key_value_heads.is_some(),
            )],
        ),
        (
            "global_head_dim",
            parent.attention.global_head_dim.is_some(),
            &[("global_head_dim", r.global_head_dim.is_some())],
        ),
        (
            "MoE",
            parent.moe.is_some(),
            &[
                ("num_experts", r.num_experts.is_some()),
                ("top_k_experts", r.top_k_experts.is_some()),
                ("moe_intermediate_size", r.moe_intermediate_size.is_some()),
            ],
        ),
        (
            "per-layer inputs",
            parent.per_layer_input.is_some(),
            &[
                (
                    "hidden_size_per_layer_input",
                    r.hidden_size_per_layer_input.is_some(),
                ),
                (
                    "vocab_size_per_layer_input",
                    r.vocab_size_per_layer_input.is_some(),
                ),
            ],
        ),
    ];
    let pairs = features.iter().flat_map(|&(feature, there, fields)| {
        fields
            .iter()
            .map(move |&(field, here)| (field, here, there, feature))
    });
    for (field, here, there, feature) in pairs {
        if here != there {
            let (msg, exp) = if there {
                (
                    format!("null, but the parent has {feature}"),
                    "a reduced size",
                )
            } else {
                (format!("set, but the parent has no {feature}"), "null")
            };
            issues.push(Issue::new(
                rp(field),
                msg,
                exp,
                "a reduction keeps every feature of the parent and adds none",
            ));
        }
    }
    if r.periods == 0 || r.periods > parent_periods {
        issues.push(Issue::new(
            rp("periods"),
            format!(
                "{} periods, but the parent has {parent_periods} period(s) of {period} layers",
                r.periods
            ),
            format!("an integer in 1..={parent_periods}"),
            "the reduced stack is the parent's layer pattern repeated `periods` times",
        ));
    }
    let pshared = parent.layers.num_kv_shared_layers;
    if (r.num_kv_shared_layers > 0) != (pshared > 0) {
        issues.push(Issue::new(
            rp("num_kv_shared_layers"),
            format!(
                "{} shared layers, but the parent has {pshared}",
                r.num_kv_shared_layers
            ),
            if pshared > 0 {
                "at least 1 (the parent shares KV)"
            } else {
                "0 (the parent does not share KV)"
            },
            "a reduction keeps the donor/sharer structure",
        ));
    } else if r.num_kv_shared_layers as usize % period != pshared as usize % period {
        issues.push(Issue::new(
            rp("num_kv_shared_layers"),
            format!(
                "{} mod {period} = {}, but the parent's {pshared} mod {period} = {}",
                r.num_kv_shared_layers,
                r.num_kv_shared_layers as usize % period,
                pshared as usize % period
            ),
            format!(
                "a count congruent to {} modulo the period {period}",
                pshared as usize % period
            ),
            "the first shared layer must sit at the same place in the pattern as in the parent",
        ));
    } else if pshared > 0
        && (r.periods as usize * period).saturating_sub(r.num_kv_shared_layers as usize) < period
    {
        issues.push(Issue::new(
            rp("num_kv_shared_layers"),
            format!("leaves fewer than one full period ({period} layers) of donors"),
            "at least one period of non-shared layers",
            "every layer type needs a donor before the shared layers",
        ));
    }
    if let (Some(e), Some(k)) = (r.num_experts, r.top_k_experts) {
        if k >= e {
            issues.push(Issue::new(
                rp("top_k_experts"),
                format!("top-k {k} with {e} experts routes to every expert"),
                format!("less than {e}"),
                "keep top_k_experts < num_experts so routing stays selective",
            ));
        }
    }
    let grow: [(&str, u32, u32); 7] = [
        ("hidden_size", r.hidden_size, parent.model.hidden_size),
        ("vocab_size", r.vocab_size, parent.model.vocab_size),
        (
            "num_attention_heads",
            r.num_attention_heads,
            parent.attention.num_attention_heads,
        ),
        (
            "num_key_value_heads",
            r.num_key_value_heads,
            parent.attention.num_key_value_heads,
        ),
        ("head_dim", r.head_dim, parent.attention.head_dim),
        (
            "sliding_window",
            r.sliding_window,
            parent.attention.sliding_window,
        ),
        (
            "intermediate_size",
            r.intermediate_size,
            parent.mlp.intermediate_size,
        ),
    ];
    reduce::check_shrinks(&grow, &mut issues);
    if !issues.is_empty() {
        return (spec, issues);
    }

    spec.layers.pattern = types[..period].to_vec();
    spec.layers.repeat = r.periods;
    spec.layers.num_kv_shared_layers = r.num_kv_shared_layers;
    // The stack's six sizes, written as every other family's derived form writes them.
    spec.set_stack(&reduce::Stack {
        num_hidden_layers: r.periods * period as u32,
        hidden_size: r.hidden_size,
        vocab_size: r.vocab_size,
        num_attention_heads: r.num_attention_heads,
        num_key_value_heads: r.num_key_value_heads,
        head_dim: r.head_dim,
    });
    spec.attention.num_global_key_value_heads = r.num_global_key_value_heads;
    spec.attention.global_head_dim = r.global_head_dim;
    spec.attention.sliding_window = r.sliding_window;
    spec.mlp.intermediate_size = r.intermediate_size;
    if let (Some(moe), Some(e), Some(k), Some(w)) = (
        spec.moe.as_mut(),
        r.num_experts,
        r.top_k_experts,
        r.moe_intermediate_size,
    ) {
        moe.num_experts = e;
        moe.top_k_experts = k;
        moe.moe_intermediate_size = w;
    }
    if let (Some(ple), Some(w), Some(v)) = (
        spec.per_layer_input.as_mut(),
        r.hidden_size_per_layer_input,
        r.vocab_size_per_layer_input,
    ) {
        ple.hidden_size_per_layer_input = w;
        ple.vocab_size_per_layer_input = v;
    }
    (spec, issues)
}

/// Maps an issue on the resolved spec to the derived file's coordinates.
fn translate(i: Issue, file: &DerivedSpecFile, parent: &str) -> Issue {
    let own_sections = ["quantization", "kv_quantization", "mixed_kv"];
    let mut i = match reduce::place_own_field(i, &own_sections) {
        ControlFlow::Break(placed) => return placed,
        ControlFlow::Continue(i) => i,
    };
    let s = i.path.to_string();
    let reduce_field = match s.as_str() {
        "model.hidden_size" => Some("hidden_size"),
        "model.vocab_size" => Some("vocab_size"),
        "layers.num_hidden_layers" | "layers.repeat" | "layers.pattern" => Some("periods"),
        "layers.num_kv_shared_layers" => Some("num_kv_shared_layers"),
        "mlp.intermediate_size" => Some("intermediate_size"),
        "mlp.use_double_wide_mlp" => Some("num_kv_shared_layers"),
        _ => ["attention.", "moe.", "per_layer_input."]
            .iter()
            .find_map(|pre| s.strip_prefix(pre)),
    };
    match (reduce_field, &file.derive.reduce) {
        (Some(f), Some(_)) => {
            i.path = p("derive.reduce").key(f);
        }
        (Some(_), None) => {
            i.path = p("derive.reduce");
            i.message = format!("{} (inherited from `{parent}` at {s})", i.message);
        }
        (None, _) => {
            i.path = p("derive.from");
            i.message = format!("{} (inherited from `{parent}` at {s})", i.message);
        }
    }
    i
}

/// A derived (tiny) spec must quantize every module it declares quantized: no module may
/// be silently skipped for group divisibility.
fn check_quant_divisibility(spec: &Gemma4Spec) -> Option<Issue> {
    let q = spec.quantization.as_ref()?;
    reduce::quant_divisibility(
        q,
        &crate::gemma4::lower(spec).quant_skipped_modules(),
        "derived specs must exercise quantization everywhere: pick reduced sizes that are multiples of the group size, or a smaller group",
    )
}
