//! What every family's YAML writer shares: the schema modeline, floats, the
//! document header (`format_version:` and `identity:`), sections of scalar
//! fields, the dense-built sections and `quantization:`.

use crate::dense_sections::{DenseAttention, DenseLayers, DenseMlp, DenseModel};
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

/// The `model:` section of the layouts built from dense sections.
pub(crate) fn dense_model_yaml(o: &mut String, m: &DenseModel) {
    section_yaml(
        o,
        "model",
        &[
            ("hidden_size", m.hidden_size.to_string()),
            ("vocab_size", m.vocab_size.to_string()),
            ("rms_norm_eps", float(m.rms_norm_eps)),
            ("tie_word_embeddings", m.tie_word_embeddings.to_string()),
            (
                "max_position_embeddings",
                m.max_position_embeddings.to_string(),
            ),
        ],
    );
}

/// The `layers:` section of the layouts built from dense sections.
pub(crate) fn dense_layers_yaml(o: &mut String, l: &DenseLayers) {
    section_yaml(
        o,
        "layers",
        &[("num_hidden_layers", l.num_hidden_layers.to_string())],
    );
}

/// The `attention:` section of the layouts built from dense sections.
pub(crate) fn dense_attention_yaml(o: &mut String, a: &DenseAttention) {
    section_yaml(
        o,
        "attention",
        &[
            ("num_attention_heads", a.num_attention_heads.to_string()),
            ("num_key_value_heads", a.num_key_value_heads.to_string()),
            ("head_dim", a.head_dim.to_string()),
        ],
    );
}

/// The `mlp:` section of the layouts built from dense sections.
pub(crate) fn dense_mlp_yaml(o: &mut String, m: &DenseMlp) {
    section_yaml(
        o,
        "mlp",
        &[("intermediate_size", m.intermediate_size.to_string())],
    );
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
