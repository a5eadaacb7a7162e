//! mlx-lm's `sanitize` as the IR's [`SanitizeRule`]s list it, then the
//! `model.` prefix removed: names come out relative to the text model
//! (`embed_tokens.weight`, `layers.3.mlp.up_proj.weight`, `lm_head.weight`),
//! as the runtime loaders read them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use archgen_ir::{HeadWeight, KvSource, ModelIr, SanitizeRule};
use archgen_runtime::mlx_rs;
use archgen_runtime::ops::Result;
use archgen_runtime::Array;

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
        .filter(|l| matches!(l.attention().map(|a| a.kv), Some(KvSource::Shared { .. })))
        .map(|l| l.index)
        .collect();
    // A raw Hugging Face checkpoint (Qwen3.5's `has_unsanitized_conv1d`): a
    // conv1d weight whose last dim is not 1, looked for before any rename.
    let raw_conv = |k: &str, v: &Array| {
        k.contains("conv1d.weight") && v.shape().last().is_some_and(|&d| d != 1)
    };
    // qwen3_next's `moe_layers`: per-expert weights, looked for before any rename.
    let per_expert =
        |k: &str| k.starts_with("model.layers.") && k.ends_with(".mlp.experts.0.up_proj.weight");
    let raw_checkpoint = (has(SanitizeRule::OffsetNormsOfRawCheckpoint)
        && tensors.iter().any(|(k, v)| raw_conv(k, v)))
        || (has(SanitizeRule::OffsetNormsOfPerExpertCheckpoint)
            && tensors.keys().any(|k| per_expert(k)));
    let tied = match ir.head.weight {
        HeadWeight::TiedEmbedding => true,
        HeadWeight::Untied => false,
    };
    if has(SanitizeRule::RefuseFp8AndPackedInt4) {
        if let Some(name) = tensors.keys().find(|k| {
            k.ends_with("weight_scale_inv")
                || k.ends_with("weight_packed")
                || k.ends_with("weight_shape")
        }) {
            return Err(refused(format!(
                "tensor '{name}': a block-scaled fp8 or packed int4 checkpoint, which mlx-lm's {} \
                 sanitize converts on load and archgen does not; convert it once with mlx-lm \
                 (mlx_lm.convert) and load the converted checkpoint",
                ir.checkpoint.model_type.as_str()
            )));
        }
    }
    // glm4_moe's `k.startswith(f"model.layers.{num_hidden_layers}")`.
    let past_stack = format!("model.layers.{}", ir.layers.len());
    let mut out = HashMap::new();
    // StackExperts: (layer prefix, projection) -> expert index -> weight.
    let mut per_expert: BTreeMap<(String, String), BTreeMap<usize, Array>> = BTreeMap::new();
    // SplitKvBProj: `...self_attn` -> leaf (weight, scales, biases) -> tensor.
    let mut kv_b_proj: BTreeMap<String, BTreeMap<String, Array>> = BTreeMap::new();
    for (k, v) in tensors {
        if has(SanitizeRule::DropVisual)
            && (k.starts_with("vision_tower") || k.starts_with("model.visual"))
        {
            continue;
        }
        if has(SanitizeRule::DropMtp) && k.contains("mtp.") {
            continue;
        }
        if has(SanitizeRule::DropLayerPastStack) && k.starts_with(&past_stack) {
            continue;
        }
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
        let v = if has(SanitizeRule::MoveConvAxis) && raw_conv(&k, &v) {
            if v.ndim() != 3 {
                return Err(refused(format!(
                    "`{k}`: a conv1d weight [C, 1, K] or [C, K, 1] expected, got shape {:?}",
                    v.shape()
                )));
            }
            // `moveaxis(2, 1)` of a 3-D array is the swap of its last two axes.
            v.swap_axes(1, 2)?
        } else if raw_checkpoint && v.ndim() == 1 && is_offset_norm(&k) {
            v.add(archgen_runtime::ops::scalar_like(1.0, &v))?
        } else {
            v
        };
        let v = if has(SanitizeRule::TransposeShortConvWeight) && k.contains("conv.weight") {
            // lfm2.sanitize: `if param.shape[-1] > param.shape[1]: transpose(0, 2, 1)`.
            if v.ndim() != 3 {
                return Err(refused(format!(
                    "`{k}`: a short-conv weight [C, K, 1] (or Hugging Face's [C, 1, K]) expected, got shape {:?}",
                    v.shape()
                )));
            }
            match v.shape()[2] > v.shape()[1] {
                true => v.transpose_axes(&[0, 2, 1])?,
                false => v,
            }
        } else {
            v
        };
        let k = if has(SanitizeRule::RenameLfm2Modules) {
            archgen_ir::names::lfm2_shared_name(&k)
        } else {
            k
        };
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
        if has(SanitizeRule::SplitSwitchMlpGateUp) {
            if let Some(base) = k.strip_suffix(".mlp.experts.gate_up_proj") {
                // `mid = shape[-2] // 2`: gate the first half, up the second.
                let rows = v.shape().get(v.ndim().wrapping_sub(2)).copied();
                let Some(rows) = rows.filter(|r| r % 2 == 0) else {
                    return Err(refused(format!(
                        "`{k}`: [experts, 2 * width, hidden] expected, got shape {:?}",
                        v.shape()
                    )));
                };
                let parts = v.split_equal(2, -2)?;
                debug_assert_eq!(parts[0].shape()[v.ndim() - 2], rows / 2);
                out.insert(
                    format!("{base}.mlp.switch_mlp.gate_proj.weight"),
                    parts[0].clone(),
                );
                out.insert(
                    format!("{base}.mlp.switch_mlp.up_proj.weight"),
                    parts[1].clone(),
                );
                continue;
            }
            if let Some(base) = k.strip_suffix(".mlp.experts.down_proj") {
                out.insert(format!("{base}.mlp.switch_mlp.down_proj.weight"), v);
                continue;
            }
        }
        if has(SanitizeRule::SplitKvBProj) {
            if let Some((base, leaf)) = k.rsplit_once(".kv_b_proj.") {
                kv_b_proj
                    .entry(base.to_string())
                    .or_default()
                    .insert(leaf.to_string(), v);
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
    for (base, parts) in kv_b_proj {
        split_kv_b_proj(&base, parts, ir, &mut out)?;
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

/// The norms a raw Qwen3.5 checkpoint stores as offsets around 0 (names
/// relative to the text model): mlx-lm's suffixes `.input_layernorm.weight`,
/// `.post_attention_layernorm.weight`, `model.norm.weight`, `.q_norm.weight`,
/// `.k_norm.weight`. The gated norm of the linear layers is not among them.
fn is_offset_norm(k: &str) -> bool {
    k == "norm.weight"
        || [
            ".input_layernorm.weight",
            ".post_attention_layernorm.weight",
            ".q_norm.weight",
            ".k_norm.weight",
        ]
        .iter()
        .any(|s| k.ends_with(s))
}

/// deepseek_v3's `sanitize` of one `{base}.kv_b_proj` ([heads * (nope + v),
/// rank], dense or quantized): dequantized with the bits and group size its
/// shapes give, reshaped to [heads, nope + v, rank], the key half
/// transposed to `embed_q` [heads, rank, nope] and the value half kept as
/// `unembed_out` [heads, v, rank] (both made contiguous), quantized again
/// as they were.
fn split_kv_b_proj(
    base: &str,
    mut parts: BTreeMap<String, Array>,
    ir: &ModelIr,
    out: &mut HashMap<String, Array>,
) -> Result<()> {
    use archgen_runtime::mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
    let latent = layer_of(base)
        .and_then(|i| ir.layers.get(i))
        .and_then(|l| match &l.mixer {
            archgen_ir::Mixer::LatentAttention(a) => Some(*a),
            archgen_ir::Mixer::Attention(_)
            | archgen_ir::Mixer::GatedDeltaNet(_)
            | archgen_ir::Mixer::ShortConv(_) => None,
        })
        .ok_or_else(|| {
            refused(format!(
                "`{base}.kv_b_proj`: a kv_b_proj on a layer without latent attention"
            ))
        })?;
    let weight = parts.remove("weight").ok_or_else(|| {
        refused(format!(
            "`{base}.kv_b_proj.weight` is missing beside its other tensors"
        ))
    })?;
    let rank = latent.kv_lora_rank as i32;
    let quant = match (parts.remove("scales"), parts.remove("biases")) {
        (None, None) => None,
        (Some(scales), Some(biases)) => {
            let packed = *weight.shape().last().unwrap_or(&0);
            let groups = *scales.shape().last().unwrap_or(&0);
            // sanitize's "infer bits and group size".
            let (bits, group) = ((packed * 32) / rank, rank / groups.max(1));
            Some((scales, biases, bits, group))
        }
        _ => {
            return Err(refused(format!(
                "`{base}.kv_b_proj`: scales without biases or biases without scales"
            )))
        }
    };
    if let Some(leaf) = parts.keys().next() {
        return Err(refused(format!(
            "`{base}.kv_b_proj.{leaf}`: kv_b_proj has only weight, scales and biases"
        )));
    }
    let weight = match &quant {
        None => weight,
        Some((scales, biases, bits, group)) => {
            archgen_runtime::mlx_rs::ops::dequantize(&weight, scales, biases, *group, *bits)?
        }
    };
    let (heads, nope) = (latent.n_heads as i32, latent.qk_nope_head_dim as i32);
    let per_head = nope + latent.v_head_dim as i32;
    let w = weight.reshape(&[heads, per_head, -1])?;
    let wk = w
        .try_index((Ellipsis, ..nope, ..))?
        .swap_axes(-1, -2)?
        .contiguous()?;
    let wv = w.try_index((Ellipsis, nope.., ..))?.contiguous()?;
    for (name, w) in [("embed_q", wk), ("unembed_out", wv)] {
        match &quant {
            None => {
                out.insert(format!("{base}.{name}.weight"), w);
            }
            Some((_, _, bits, group)) => {
                let (wq, scales, biases) =
                    archgen_runtime::mlx_rs::ops::quantize(&w, *group, *bits)?;
                out.insert(format!("{base}.{name}.weight"), wq);
                out.insert(format!("{base}.{name}.scales"), scales);
                out.insert(format!("{base}.{name}.biases"), biases);
            }
        }
    }
    Ok(())
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
