//! gpt-oss's config.json importer and its registry entry.

use super::attention_layers::read_layer_types;
use super::{check, GptOssAttentionLayers, GptOssExperts, GptOssRope, GptOssSpec, GptOssYarn};
use crate::dense::{DenseAttention, DenseLayers, DenseMlp, DenseModel};
use crate::model::*;
use crate::model_family::ModelFamily;
use crate::reader::{first_quantization, imported_identity, ImportedSpec, Reader};
use crate::yarn::YarnScaling;
use serde_json::{Map, Value};

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
    let yarn = GptOssYarn::read(entry, r);
    GptOssYarn::note_unread_keys(entry, r);
    Some(yarn)
}

/// gpt_oss in the family registry.
pub(crate) const FAMILY: ModelFamily = crate::model_family::single_family!(GptOss, import);
