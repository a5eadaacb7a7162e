//! What every family's config.json view shares (the fields of the dense-built
//! sections, the `quantization` dict, sorted keys), and a spec's content hash.

use crate::dense_sections::{DenseAttention, DenseModel};
use crate::model::*;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// The mlx config `quantization` dict: `{bits, group_size, mode, <path>: {...} | false}`.
pub(crate) fn quantization_json(q: &Quantization) -> Value {
    let mut m = Map::new();
    m.insert("bits".into(), json!(q.default.bits));
    m.insert("group_size".into(), json!(q.default.group_size));
    m.insert("mode".into(), json!(q.default.mode.as_str()));
    for (path, ov) in &q.overrides {
        let v = match ov {
            QuantOverride::Skip(_) => Value::Bool(false),
            QuantOverride::Params(p) => json!({
                "bits": p.bits,
                "group_size": p.group_size,
                "mode": p.mode.as_str(),
            }),
        };
        m.insert(path.clone(), v);
    }
    Value::Object(m)
}

/// A document built on the dense `model`, `layers` and `attention` sections;
/// each implements it with [`impl_dense_view`].
pub(crate) trait DenseView {
    /// The identity, `layers.num_hidden_layers`, `model` and `attention`.
    fn dense_sections(&self) -> (&Identity, u32, &DenseModel, &DenseAttention);
}

/// Implements [`DenseView`] for documents whose `model` is a [`DenseModel`],
/// `attention` a [`DenseAttention`] and `layers` has `num_hidden_layers`.
macro_rules! impl_dense_view {
    ($($spec:ty),+) => {$(
        impl $crate::hf::DenseView for $spec {
            fn dense_sections(
                &self,
            ) -> (
                &$crate::model::Identity,
                u32,
                &$crate::dense_sections::DenseModel,
                &$crate::dense_sections::DenseAttention,
            ) {
                (
                    &self.identity,
                    self.layers.num_hidden_layers,
                    &self.model,
                    &self.attention,
                )
            }
        }
    )+};
}
pub(crate) use impl_dense_view;

/// The config.json fields of the sections the dense-built layouts share, as every
/// such mlx-lm module reads them, and the family's `own` fields. `head_dim` is
/// left to the family: several modules have no such field (it is
/// `hidden_size // num_attention_heads`).
pub(crate) fn dense_stack_json(spec: &impl DenseView, own: Value) -> Value {
    let (identity, num_hidden_layers, m, a) = spec.dense_sections();
    let heads = (a.num_attention_heads, a.num_key_value_heads);
    model_stack_json(identity, num_hidden_layers, m, heads, own)
}

/// The config.json fields of a dense `model` section, the layer count and the
/// (query, K/V) `heads` of a stack whose attention is its own section, and the
/// family's `own` fields.
pub(crate) fn model_stack_json(
    identity: &Identity,
    num_hidden_layers: u32,
    m: &DenseModel,
    (num_attention_heads, num_key_value_heads): (u32, u32),
    own: Value,
) -> Value {
    let mut v = json!({
        "model_type": identity.source.model_type.as_str(),
        "hidden_size": m.hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "rms_norm_eps": m.rms_norm_eps,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "tie_word_embeddings": m.tie_word_embeddings,
    });
    if let (Value::Object(v), Value::Object(own)) = (&mut v, own) {
        v.extend(own);
    }
    v
}

/// A family's config.json view, finished the same way for every family: the
/// `quantization` dict when the spec has one, keys sorted.
/// A config field that checkpoints write as an integer when it is whole
/// (Gemma's `query_pre_attn_scalar: 256`): transformers' config classes
/// check its type, so `256.0` is refused by tools that read the config
/// through them (mlx_lm.server's tokenizer loading).
pub(crate) fn whole_as_integer(x: f64) -> Value {
    match x.fract() == 0.0 && x.abs() < 9.0e15 {
        true => Value::from(x as i64),
        false => Value::from(x),
    }
}

pub(crate) fn config_view(mut v: Value, q: Option<&Quantization>) -> Value {
    if let Some(q) = q {
        v["quantization"] = quantization_json(q);
    }
    canonical(&v)
}

/// The config.json mlx-lm loads to exactly the architecture of the view `v`:
/// the view without `quantization` (a checkpoint writer adds what it packed).
pub(crate) fn without_quantization(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("quantization");
    }
    v
}

/// A copy with every object's keys in sorted order (independent of serde_json's
/// `preserve_order` feature).
pub(crate) fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), canonical(&m[k]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// SHA-256 (lowercase hex) of the spec's canonical JSON: sorted keys, no whitespace.
/// Stable across runs, platforms and field order in the YAML file.
pub fn spec_hash(spec: &crate::Spec) -> String {
    let value = serde_json::to_value(spec).unwrap_or(Value::Null);
    let text = serde_json::to_string(&canonical(&value)).unwrap_or_default();
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
