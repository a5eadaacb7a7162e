//! LFM2's config.json importer and its registry entry.

use super::{check, Lfm2FeedForward, Lfm2Layers, Lfm2Rope, Lfm2Spec};
use crate::dense::{DenseAttention, DenseModel};
use crate::model::*;
use crate::model_family::ModelFamily;
use crate::reader::{imported_identity, top_quantization, ImportedSpec, Reader};
use serde_json::{Map, Value};

/// Imports an `lfm2` config.json as mlx-lm 0.32.2's `ModelArgs` reads it: every
/// field without a default is required (`block_ffn_dim_multiplier` may be null);
/// `block_ff_dim` falls back to `intermediate_size`, `rope_theta` (1000000.0) to
/// `rope_parameters.rope_theta`, `full_attn_idxs` to the `full_attention` entries
/// of `layer_types`. `conv_bias` must be false, `block_dim` the hidden size.
/// Quantization override paths are read as the shared blocks' module names.
pub(crate) fn import(top: &Map<String, Value>, name: &str) -> ImportedSpec<Lfm2Spec> {
    let mut r = Reader::new(top, "");
    let hidden_size = r.required_uint("hidden_size");
    let num_heads = r.required_uint("num_attention_heads");
    // Required by ModelArgs; null means as many as the query heads.
    let num_kv = match top.get("num_key_value_heads") {
        Some(Value::Null) => num_heads,
        Some(_) | None => r.required_uint("num_key_value_heads"),
    };
    let ff_key = match r.get("block_ff_dim") {
        Some(_) => "block_ff_dim",
        None => "intermediate_size",
    };
    let block_ff_dim = r.required_uint(ff_key);
    let block_ffn_dim_multiplier = match top.get("block_ffn_dim_multiplier") {
        Some(Value::Null) => None,
        Some(_) | None => Some(r.required_float("block_ffn_dim_multiplier")),
    };
    let theta = top.get("rope_parameters").and_then(|p| p.get("rope_theta"));
    let rope_theta = match theta.and_then(Value::as_f64) {
        Some(theta) => theta,
        None => r.float("rope_theta", 1_000_000.0),
    };
    let types = r.get("layer_types").and_then(Value::as_array).cloned();
    let full_attn_idxs = match (r.get("full_attn_idxs").cloned(), types) {
        (Some(Value::Array(v)), _) => v.iter().map(|i| r.uint_of("full_attn_idxs", i)).collect(),
        (Some(other), _) => {
            let found = format!("expected a list of layer indices, found {other}");
            r.problem("full_attn_idxs", &found);
            Vec::new()
        }
        (None, Some(t)) => (0..t.len() as u32)
            .filter(|&i| t[i as usize] == "full_attention")
            .collect(),
        (None, None) => {
            r.problem(
                "full_attn_idxs",
                "missing, and no layer_types (mlx-lm needs one)",
            );
            Vec::new()
        }
    };
    if r.required_bool("conv_bias") {
        r.problem(
            "conv_bias",
            "true: archgen's short conv has no bias (no LFM2 has one)",
        );
    }
    if r.required_uint("block_dim") != hidden_size {
        r.problem(
            "block_dim",
            "not hidden_size: the MLP reads the residual stream",
        );
    }
    if r.get("tie_word_embeddings") == Some(&Value::Bool(false)) {
        r.problem("tie_word_embeddings", "false: lfm2.py always ties the head");
    }
    let head_dim = r.head_dim_of_module_without_it(hidden_size, num_heads, "lfm2");
    let model = DenseModel {
        hidden_size,
        vocab_size: r.required_uint("vocab_size"),
        rms_norm_eps: r.required_float("norm_eps"),
        tie_word_embeddings: true,
        max_position_embeddings: r.required_uint("max_position_embeddings"),
    };
    let layers = Lfm2Layers {
        num_hidden_layers: r.required_uint("num_hidden_layers"),
        full_attn_idxs,
        conv_l_cache: r.required_uint("conv_L_cache"),
    };
    let feed_forward = Lfm2FeedForward {
        block_ff_dim,
        block_multiple_of: r.required_uint("block_multiple_of"),
        block_ffn_dim_multiplier,
        block_auto_adjust_ff_dim: r.required_bool("block_auto_adjust_ff_dim"),
    };
    // Override paths name the modules as the loader reads them.
    let quantization = top_quantization(top, &mut r).map(|mut q| {
        let paths = std::mem::take(&mut q.overrides).into_iter();
        q.overrides = paths
            .map(|(path, o)| (archgen_ir::names::lfm2_shared_name(&path), o))
            .collect();
        q
    });
    r.build_checked(check, || Lfm2Spec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, Family::Lfm2, ConfigModelType::Lfm2),
        model,
        layers,
        attention: DenseAttention {
            num_attention_heads: num_heads,
            num_key_value_heads: num_kv,
            head_dim,
        },
        rope: Lfm2Rope { rope_theta },
        feed_forward,
        quantization,
    })
}

/// LFM2 in the family registry.
pub(crate) const FAMILY: ModelFamily = crate::model_family::single_family!(Lfm2, import);
