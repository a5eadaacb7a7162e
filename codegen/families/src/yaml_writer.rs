//! The YAML writers: the schema modeline, floats, the document header
//! (`format_version:` and `identity:`), sections of scalar fields,
//! `quantization:`, and every layout but Gemma-4's written whole from its
//! serde form ([`document_yaml`]).

use crate::model::*;
use std::fmt::Write;

/// The first line of every spec file: lets editors validate against the schema.
pub const MODELINE: &str = "# yaml-language-server: $schema=schema/archgen-spec.schema.json";

/// A float as YAML: shortest round-trip form, always with a `.` in the mantissa.
pub(crate) fn float(v: f64) -> String {
    let s = format!("{v:?}");
    match s.split_once('e') {
        Some((m, e)) if !m.contains('.') => format!("{m}.0e{e}"),
        _ => s,
    }
}

fn string(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && !matches!(
            s,
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
        )
        && !s.to_ascii_lowercase().starts_with("0x");
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_default()
    }
}

fn qparams(q: &QuantParams) -> String {
    format!(
        "{{bits: {}, group_size: {}, mode: {}}}",
        q.bits,
        q.group_size,
        q.mode.as_str()
    )
}

/// How every full document starts: the modeline, `format_version:` and the
/// `identity:` section.
pub(crate) fn header_yaml(o: &mut String, format_version: u32, id: &Identity) {
    let _ = writeln!(o, "{MODELINE}");
    let _ = writeln!(o, "format_version: {format_version}");
    identity_yaml(o, id);
}

/// A section of scalar fields: `name:`, then `  key: value` per field in order
/// (each value already in its YAML form; see [`float`]).
pub(crate) fn section_yaml(o: &mut String, name: &str, fields: &[(&str, String)]) {
    let _ = writeln!(o, "{name}:");
    for (key, value) in fields {
        let _ = writeln!(o, "  {key}: {value}");
    }
}

/// A spec document as YAML, written from its serde form: the modeline, then
/// every section in the document type's field order (the header's as
/// [`header_yaml`] writes it), `quantization`
/// and `mixed_kv` by their own writers and any other one as a section of
/// scalars ([`section_value_yaml`]). A layout whose sections hold only
/// scalars, flat lists and flow mappings (every layout but Gemma-4's) is
/// written with this alone, so a field added to a section is written
/// without a writer to change.
pub(crate) fn document_yaml<S: serde::Serialize + crate::document::Document>(spec: &S) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{MODELINE}");
    let sections = match serde_yaml::to_value(spec) {
        Ok(serde_yaml::Value::Mapping(sections)) => sections,
        // A document type is a struct of sections, which serde_yaml always
        // writes as a mapping.
        other => unreachable!("a spec document serialized as {other:?}"),
    };
    for (key, value) in &sections {
        match key.as_str() {
            // The header, as header_yaml writes it (both are the first fields).
            Some("format_version") => {
                let _ = writeln!(o, "format_version: {}", flow_yaml(value));
            }
            Some("identity") => identity_yaml(&mut o, spec.identity()),
            Some("quantization") => quantization_yaml(&mut o, spec.quantization()),
            Some("mixed_kv") => crate::mixed_kv::yaml(&mut o, spec.mixed_kv()),
            Some(name) => section_value_yaml(&mut o, name, value),
            None => unreachable!("a struct field name is a string, not {key:?}"),
        }
    }
    o
}

/// One section from its serde form: a mapping as `name:` and a `  key: value`
/// line per field, anything else (null) on the name's line.
fn section_value_yaml(o: &mut String, name: &str, value: &serde_yaml::Value) {
    let serde_yaml::Value::Mapping(fields) = value else {
        let _ = writeln!(o, "{name}: {}", flow_yaml(value));
        return;
    };
    let _ = writeln!(o, "{name}:");
    for (key, value) in fields {
        let _ = writeln!(o, "  {}: {}", flow_yaml(key), flow_yaml(value));
    }
}

/// A value in YAML flow form: floats as [`float`] writes them, lists as
/// `[a, b]`, mappings as `{k: v, ...}` in their serde order.
fn flow_yaml(value: &serde_yaml::Value) -> String {
    use serde_yaml::Value;
    let join = |items: Vec<String>| items.join(", ");
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => float(f),
            _ => n.to_string(),
        },
        Value::String(text) => string(text),
        Value::Sequence(items) => format!("[{}]", join(items.iter().map(flow_yaml).collect())),
        Value::Mapping(entries) => format!(
            "{{{}}}",
            join(
                entries
                    .iter()
                    .map(|(k, v)| format!("{}: {}", flow_yaml(k), flow_yaml(v)))
                    .collect()
            )
        ),
        Value::Tagged(tagged) => format!("!{} {}", tagged.tag, flow_yaml(&tagged.value)),
    }
}

/// The `identity:` section.
fn identity_yaml(o: &mut String, id: &Identity) {
    let _ = writeln!(o, "identity:");
    let _ = writeln!(o, "  name: {}", string(&id.name));
    let _ = writeln!(o, "  family: {}", id.family.as_str());
    let _ = writeln!(o, "  source:");
    // A JSON string is a YAML scalar that reads back as written.
    let quoted_or_null = |text: Option<&str>| {
        text.map_or("null".into(), |t| {
            serde_json::to_string(t).unwrap_or_default()
        })
    };
    let _ = writeln!(o, "    repo: {}", quoted_or_null(id.source.repo.as_deref()));
    let _ = writeln!(
        o,
        "    revision: {}",
        quoted_or_null(id.source.revision.as_deref())
    );
    let _ = writeln!(o, "    model_type: {}", id.source.model_type.as_str());
}

/// The `quantization:` section (null or default + overrides).
pub(crate) fn quantization_yaml(o: &mut String, q: Option<&Quantization>) {
    match q {
        None => o.push_str("quantization: null\n"),
        Some(q) => {
            let _ = writeln!(o, "quantization:");
            let _ = writeln!(o, "  default: {}", qparams(&q.default));
            if q.overrides.is_empty() {
                let _ = writeln!(o, "  overrides: {{}}");
            } else {
                let _ = writeln!(o, "  overrides:");
                for (path, ov) in &q.overrides {
                    let v = match ov {
                        QuantOverride::Skip(_) => "false".to_string(),
                        QuantOverride::Params(p) => qparams(p),
                    };
                    let _ = writeln!(
                        o,
                        "    {}: {v}",
                        serde_json::to_string(path).unwrap_or_default()
                    );
                }
            }
        }
    }
}
