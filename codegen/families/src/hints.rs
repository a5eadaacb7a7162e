//! Per-field "expected" and "hint" texts for parse errors.

use crate::diag::{FieldPath, Seg};

/// (field, expected, hint)
const FIELDS: &[(&str, &str, &str)] = &[
    ("format_version", "the integer 1", "the first key of every spec is `format_version: 1`"),
    ("identity", "a mapping {name, family, source}", "who the architecture is; see docs/spec-format.md#identity"),
    ("name", "a spec name such as `gemma4-e2b`", "the name equals the file name without .yaml"),
    ("family", "one of `gemma4`, `qwen3`, `llama`, `gemma2`", "the family fixes the rest of the layout; see docs/spec-format.md"),
    ("source", "a mapping {repo, revision, model_type}", "the checkpoint the architecture comes from"),
    ("repo", "`org/name` or null", "the hub repository of the checkpoint"),
    ("revision", "a commit hash or null", "null when unpinned"),
    ("model_type", "one of `gemma4`, `gemma4_text`, `gemma4_unified` (gemma4), `qwen3`, `llama`, `gemma2`", "the top-level model_type of config.json"),
    ("model", "a mapping {hidden_size, vocab_size, rms_norm_eps, tie_word_embeddings, final_logit_softcapping, max_position_embeddings}", "model-wide sizes; see docs/spec-format.md#model"),
    ("hidden_size", "a positive integer", "`hidden_size` in config.json"),
    ("vocab_size", "a positive integer", "`vocab_size` (the gemma4 wrapper's top-level value wins)"),
    ("rms_norm_eps", "a small positive number such as 1.0e-6", "`rms_norm_eps` in config.json"),
    ("tie_word_embeddings", "true or false", "true: the head reuses embed_tokens"),
    ("final_logit_softcapping", "a positive number or null", "mlx-lm defaults to 30.0 and transformers to none, so write it"),
    ("max_position_embeddings", "a positive integer", "`max_position_embeddings` in config.json"),
    ("layers", "a mapping {num_hidden_layers, pattern, repeat, num_kv_shared_layers}", "the decoder stack; see docs/spec-format.md#layers"),
    ("num_hidden_layers", "a positive integer", "number of decoder layers"),
    ("pattern", "a list of `sliding` / `full`", "one period of layer_types, e.g. [sliding, sliding, sliding, sliding, full]"),
    ("repeat", "a positive integer", "pattern length × repeat = num_hidden_layers"),
    ("num_kv_shared_layers", "an integer >= 0", "mlx-lm defaults to 20 and transformers to 0, so write it"),
    ("attention", "a mapping {num_attention_heads, num_key_value_heads, num_global_key_value_heads, attention_k_eq_v, head_dim, global_head_dim, sliding_window}", "attention geometry; see docs/spec-format.md#attention"),
    ("num_attention_heads", "a positive integer", "query heads"),
    ("num_key_value_heads", "a positive integer dividing num_attention_heads", "KV heads of sliding layers (and of full layers unless k_eq_v)"),
    ("num_global_key_value_heads", "a positive integer or null", "full-layer KV heads, read only with attention_k_eq_v: true"),
    ("attention_k_eq_v", "true or false", "true: full layers have no v_proj"),
    ("head_dim", "an even positive integer", "head dimension of sliding layers"),
    ("global_head_dim", "an even positive integer or null", "head dimension of full layers; null means head_dim"),
    ("sliding_window", "a positive integer", "window of sliding layers"),
    ("rope", "a mapping {traditional, sliding, full}", "RoPE per layer type; see docs/spec-format.md#rope"),
    ("traditional", "true or false", "`rope_traditional`; Gemma-4 uses false"),
    ("sliding", "a rope entry {rope_type, rope_theta, ...}", "`rope_parameters.sliding_attention`"),
    ("full", "a rope entry {rope_type, rope_theta, ...}", "`rope_parameters.full_attention`"),
    ("rope_type", "`default` or `proportional`", "other mlx RoPE types are not used by Gemma-4"),
    ("rope_theta", "a positive number", "the RoPE base"),
    ("partial_rotary_factor", "a number in (0, 1]", "fraction of dimensions that rotate (proportional RoPE)"),
    ("factor", "a positive number", "proportional RoPE frequency factor; 1.0 when the config has none"),
    ("mlp", "a mapping {intermediate_size, use_double_wide_mlp}", "dense MLP; see docs/spec-format.md#mlp"),
    ("intermediate_size", "a positive integer", "dense MLP width"),
    ("use_double_wide_mlp", "true or false", "mlx-lm defaults to true and transformers to false, so write it"),
    ("moe", "null or a mapping {num_experts, top_k_experts, moe_intermediate_size}", "write `moe: null` for dense models"),
    ("num_experts", "a positive integer", "experts per layer"),
    ("top_k_experts", "a positive integer <= num_experts", "experts each token uses"),
    ("moe_intermediate_size", "a positive integer", "expert width"),
    ("per_layer_input", "null or a mapping {hidden_size_per_layer_input, vocab_size_per_layer_input}", "write `per_layer_input: null` when hidden_size_per_layer_input is 0"),
    ("hidden_size_per_layer_input", "a positive integer", "per-layer input width"),
    ("vocab_size_per_layer_input", "a positive integer", "rows of embed_tokens_per_layer"),
    ("quantization", "null or a mapping {default, overrides}", "write `quantization: null` for bf16 weights"),
    ("default", "a mapping {bits, group_size, mode}", "applies to every quantizable module without an override"),
    ("overrides", "a mapping of module path to params {bits, group_size, mode} or false (`{}` when none)", "keys are full mlx module paths"),
    ("bits", "one of 2, 3, 4, 5, 6, 8", "bits per weight"),
    ("group_size", "one of 32, 64, 128 (affine)", "weights per scale"),
    ("mode", "one of `affine`, `mxfp4`, `mxfp8`, `nvfp4`", "mlx quantization mode"),
    ("kv_quantization", "null or a list of {layer_idx, bits, group_size}", "write `kv_quantization: null` when KV caches are not quantized"),
    ("layer_idx", "a layer index", "0-based"),
    ("derive", "a mapping {from, reduce, quantization, kv_quantization}", "a declared reduction of another spec"),
    ("from", "the name of a spec in the same directory", "e.g. gemma4-12b"),
    ("reduce", "null or a mapping of reduced sizes", "see docs/spec-format.md#derived-specs"),
    ("periods", "a positive integer", "periods of the parent's layer pattern to keep"),
    ("query_pre_attn_scalar", "a positive number", "gemma2: queries are multiplied by 1 / sqrt of it"),
    ("attn_logit_softcapping", "a positive number", "gemma2: scores become tanh(s / c) * c"),
];

fn entry(name: &str) -> Option<&'static (&'static str, &'static str, &'static str)> {
    FIELDS.iter().find(|(n, _, _)| *n == name)
}

/// What a field expects.
pub(crate) fn expected_for(name: &str) -> String {
    entry(name).map_or_else(|| "a valid value".to_string(), |e| e.1.to_string())
}

/// What the field a path ends in expects (override keys resolve to their mapping).
pub(crate) fn expected_for_path(path: &FieldPath) -> String {
    expected_for(nearest_field(path))
}

/// The last key of a path that names a spec field (override keys are module paths).
fn nearest_field(path: &FieldPath) -> &str {
    path.0
        .iter()
        .rev()
        .find_map(|s| match s {
            Seg::Key(k) if entry(k).is_some() => Some(k.as_str()),
            _ => None,
        })
        .unwrap_or("")
}

/// A hint for a field path.
pub(crate) fn hint_for(path: &FieldPath) -> String {
    let name = nearest_field(path);
    match entry(name) {
        Some(e) => format!("`{}`: {}", e.0, e.2),
        None => "see docs/spec-format.md".to_string(),
    }
}
