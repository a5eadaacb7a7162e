//! What every family's config.json view shares (the `quantization` dict, sorted
//! keys), and a spec's content hash.

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
