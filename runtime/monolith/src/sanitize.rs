//! mlx-lm's `sanitize` as the IR's [`SanitizeRule`]s list it, then the
//! `model.` prefix removed: names come out relative to the text model
//! (`embed_tokens.weight`, `layers.3.mlp.up_proj.weight`, `lm_head.weight`),
//! as the runtime loaders read them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use archgen_runtime::mlx_rs;
use archgen_runtime::ops::Result;
use archgen_runtime::Array;
use archgen_spec::ir::{HeadWeight, KvSource, ModelIr, SanitizeRule};

/// Towers of multimodal wrappers, dropped with [`SanitizeRule::UnwrapMultimodal`].
const TOWERS: [&str; 6] = [
    "vision_tower",
    "multi_modal_projector",
    "audio_tower",
    "embed_audio",
    "embed_vision",
    "vision_embedder",
];

/// Activation ranges, dropped with [`SanitizeRule::DropActivationRanges`].
const RANGES: [&str; 4] = ["input_max", "input_min", "output_max", "output_min"];

/// K/V tensors of a KV-sharing layer, dropped with [`SanitizeRule::DropSharedKv`].
const KV_TENSORS: [&str; 3] = [
    ".self_attn.k_proj",
    ".self_attn.v_proj",
    ".self_attn.k_norm",
];

/// The layer index in a tensor name (`...layers.12.mlp...` → 12).
fn layer_of(name: &str) -> Option<usize> {
    name.split("layers.")
        .nth(1)
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse().ok())
}

/// The wrapper renames: `model.language_model.X` → `model.X`, towers gone.
fn unwrap_multimodal(k: &str) -> Option<String> {
    let starts_with_model = k.starts_with("model.");
    let k = k.strip_prefix("model.").unwrap_or(k).to_string();
    if TOWERS.iter().any(|t| k.starts_with(t)) {
        return None;
    }
    let k = if starts_with_model && k.starts_with("language_model") {
        k.replacen("language_model.", "language_model.model.", 1)
    } else {
        k
    };
    Some(match k.strip_prefix("language_model.") {
        Some(rest) => rest.to_string(),
        None => k,
    })
}

pub(crate) fn sanitize(
    tensors: HashMap<String, Array>,
    ir: &ModelIr,
) -> Result<HashMap<String, Array>> {
    let rules = &ir.checkpoint.sanitize;
    let has = |r: SanitizeRule| rules.contains(&r);
    let shared: BTreeSet<usize> = ir
        .layers
        .iter()
        .filter(|l| matches!(l.attention().kv, KvSource::Shared { .. }))
        .map(|l| l.index)
        .collect();
    let tied = match ir.head.weight {
        HeadWeight::TiedEmbedding => true,
        HeadWeight::Untied => false,
    };
    let mut out = HashMap::new();
    // StackExperts: (layer prefix, projection) -> expert index -> weight.
    let mut per_expert: BTreeMap<(String, String), BTreeMap<usize, Array>> = BTreeMap::new();
    for (k, v) in tensors {
        let k = if has(SanitizeRule::UnwrapMultimodal) {
            match unwrap_multimodal(&k) {
                Some(k) => k,
                None => continue,
            }
        } else {
            k
        };
        if has(SanitizeRule::DropRotaryTables) && k.contains("self_attn.rotary_emb") {
            continue;
        }
        if has(SanitizeRule::DropActivationRanges) && RANGES.iter().any(|r| k.contains(r)) {
            continue;
        }
        if has(SanitizeRule::DropSharedKv)
            && KV_TENSORS.iter().any(|s| k.contains(s))
            && layer_of(&k).is_some_and(|i| shared.contains(&i))
        {
            continue;
        }
        if has(SanitizeRule::DropTiedHead) && tied && k == "lm_head.weight" {
            continue;
        }
        let k = k.strip_prefix("model.").map(str::to_string).unwrap_or(k);
        if has(SanitizeRule::SplitExpertsGateUp) {
            if let Some(base) = k.strip_suffix(".experts.gate_up_proj") {
                let parts = v.split_equal(2, -2)?;
                out.insert(
                    format!("{base}.experts.switch_glu.gate_proj.weight"),
                    parts[0].contiguous()?,
                );
                out.insert(
                    format!("{base}.experts.switch_glu.up_proj.weight"),
                    parts[1].contiguous()?,
                );
                continue;
            }
            if let Some(base) = k.strip_suffix(".experts.down_proj") {
                out.insert(format!("{base}.experts.switch_glu.down_proj.weight"), v);
                continue;
            }
        }
        if has(SanitizeRule::StackExperts) {
            if let Some((base, expert, proj)) = per_expert_name(&k) {
                per_expert
                    .entry((base, proj))
                    .or_default()
                    .insert(expert, v);
                continue;
            }
        }
        out.insert(k, v);
    }
    if has(SanitizeRule::CopyEmbeddingToHead) && !out.contains_key("lm_head.weight") {
        // minicpm.sanitize copies `model.embed_tokens.weight` alone. From a
        // quantized embedding that is packed uint32 data without scales, which
        // mlx-lm then fails to load into the float lm_head: refuse it here.
        if out.contains_key("embed_tokens.scales") {
            return Err(refused(
                "lm_head.weight is absent and embed_tokens is quantized: mlx-lm's minicpm sanitize would copy only the packed embed_tokens.weight (no scales) into lm_head, which it then cannot load; write lm_head's quantized tensors into the checkpoint".to_string(),
            ));
        }
        let embed = out.get("embed_tokens.weight").cloned().ok_or_else(|| {
            refused(
                "lm_head.weight and embed_tokens.weight are both absent: minicpm's head is taken from the embedding when it has none".to_string(),
            )
        })?;
        out.insert("lm_head.weight".to_string(), embed);
    }
    for ((base, proj), experts) in per_expert {
        let name = |e: usize| format!("{base}.experts.{e}.{proj}.weight");
        let want = layer_of(&base)
            .and_then(|i| ir.layers.get(i))
            .and_then(|l| l.moe())
            .map(|m| m.num_experts)
            .ok_or_else(|| {
                refused(format!(
                    "`{}`: per-expert weights on a layer without routed experts",
                    name(*experts.keys().next().unwrap_or(&0))
                ))
            })?;
        if let Some(e) = (0..want).find(|e| !experts.contains_key(e)) {
            return Err(refused(format!(
                "`{}` is missing: {want} experts are stacked into `{base}.switch_mlp.{proj}.weight`",
                name(e)
            )));
        }
        if let Some(&e) = experts.keys().find(|&&e| e >= want) {
            return Err(refused(format!(
                "`{}`: expert {e} is beyond the config's num_experts ({want})",
                name(e)
            )));
        }
        let parts: Vec<Array> = experts.into_values().collect();
        out.insert(
            format!("{base}.switch_mlp.{proj}.weight"),
            mlx_rs::ops::stack(&parts, 0)?,
        );
    }
    Ok(out)
}

fn refused(what: String) -> archgen_runtime::mlx_rs::error::Exception {
    archgen_runtime::mlx_rs::error::Exception::custom(what)
}

/// `layers.{l}.mlp.experts.{e}.{proj}.weight` → (`layers.{l}.mlp`, e, proj):
/// a Hugging Face per-expert weight, stacked by [`SanitizeRule::StackExperts`]
/// (`Qwen3MoeModel.sanitize`).
fn per_expert_name(k: &str) -> Option<(String, usize, String)> {
    let (base, rest) = k.split_once(".experts.")?;
    if !base.ends_with(".mlp") {
        return None;
    }
    let (expert, rest) = rest.split_once('.')?;
    let proj = rest.strip_suffix(".weight")?;
    match proj {
        "gate_proj" | "up_proj" | "down_proj" => {}
        _ => return None,
    }
    Some((base.to_string(), expert.parse().ok()?, proj.to_string()))
}
