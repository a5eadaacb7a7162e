//! The YaRN `rope_scaling` entry (rope_utils' `YarnRoPE`) of the families that
//! run it (gpt_oss, deepseek_v3): the six fields `YarnRoPE` reads, in
//! `initialize_rope`'s order. Each family declares its section with
//! [`yarn_section!`] (its own schema name and documentation); the section's
//! checks, its IR RoPE kind, its config.json entry and its import are written
//! once here, in [`YarnScaling`].

use crate::diag::FieldPath;
use crate::reader::Reader;
use crate::validate::Checker;
use serde_json::{json, Map, Value};

/// `YarnRoPE`'s keyword defaults: every key but `factor`, in
/// [`YarnScaling::KEYS`] order.
const DEFAULTS: [f64; 5] = [4096.0, 32.0, 1.0, 1.0, 0.0];

/// Declares a family's YaRN section: a struct of the six
/// [`YarnScaling::KEYS`] whose schema carries the family's name and its docs
/// on the section, on `factor` and on `mscale_all_dim` (the other fields read
/// the same in every family), and its [`YarnScaling`] impl.
macro_rules! yarn_section {
    (
        $(#[$section_doc:meta])*
        pub struct $name:ident {
            $(#[$factor_doc:meta])*
            factor,
            $(#[$mscale_all_dim_doc:meta])*
            mscale_all_dim,
        }
    ) => {
        $(#[$section_doc])*
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            serde::Serialize,
            serde::Deserialize,
            schemars::JsonSchema,
        )]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $(#[$factor_doc])*
            pub factor: f64,
            /// `original_max_position_embeddings` (default 4096).
            pub original_max_position_embeddings: f64,
            /// `beta_fast` (default 32).
            pub beta_fast: f64,
            /// `beta_slow` (default 1).
            pub beta_slow: f64,
            /// `mscale` (default 1).
            pub mscale: f64,
            $(#[$mscale_all_dim_doc])*
            pub mscale_all_dim: f64,
        }

        $crate::yarn::yarn_section!(@fields $name:
            factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim
        );
    };
    // The trait's glue, from the field list written once.
    (@fields $name:ident: $($field:ident),+) => {
        impl $crate::yarn::YarnScaling for $name {
            const KEYS: [&'static str; 6] = [$(stringify!($field)),+];
            fn values(&self) -> [f64; 6] {
                [$(self.$field),+]
            }
            fn from_values([$($field),+]: [f64; 6]) -> Self {
                $name { $($field),+ }
            }
            fn kind(&self, theta: f64) -> $crate::ir::RopeKind {
                $crate::ir::RopeKind::Yarn { theta: theta as f32, $($field: self.$field),+ }
            }
        }
    };
}
pub(crate) use yarn_section;

/// A family's YaRN section (see [`yarn_section!`]).
pub(crate) trait YarnScaling: Sized {
    /// The section's keys, in `initialize_rope`'s order.
    const KEYS: [&'static str; 6];
    /// The fields, in [`Self::KEYS`] order.
    fn values(&self) -> [f64; 6];
    /// The section of `values`, in [`Self::KEYS`] order.
    fn from_values(values: [f64; 6]) -> Self;
    /// The IR's RoPE kind for a base of `theta`.
    fn kind(&self, theta: f64) -> crate::ir::RopeKind;

    /// `factor` with `YarnRoPE`'s defaults for the other keys.
    fn with_defaults(factor: f64) -> Self {
        let mut values = [factor; 6];
        values[1..].copy_from_slice(&DEFAULTS);
        Self::from_values(values)
    }

    /// The section's rules (`rope.scaling.*` paths): `factor`,
    /// `original_max_position_embeddings`, `beta_fast` and `beta_slow`
    /// positive, with their `positive_hints`; the mscale terms finite, with
    /// `mscale_hint`. Returns whether they hold.
    fn check(&self, c: &mut Checker, positive_hints: [&str; 4], mscale_hint: &str) -> bool {
        let values = self.values();
        let fields = Self::KEYS.into_iter().zip(values);
        let mut ok = true;
        for ((key, v), hint) in fields.clone().zip(positive_hints) {
            ok &= c.positive_finite(&format!("rope.scaling.{key}"), v, hint);
        }
        for (key, v) in fields.skip(positive_hints.len()) {
            if !v.is_finite() {
                ok = false;
                let path = FieldPath::parse(&format!("rope.scaling.{key}"));
                c.err(path, v.to_string(), "a finite number", mscale_hint);
            }
        }
        ok
    }

    /// The config.json entry, its type `yarn` under `type_key` (`type` or
    /// `rope_type`: `initialize_rope` reads either; each family writes the one
    /// its checkpoints have).
    fn config_json(&self, type_key: &str) -> Value {
        let mut entry = Map::new();
        entry.insert(type_key.to_string(), json!("yarn"));
        for (key, v) in Self::KEYS.into_iter().zip(self.values()) {
            entry.insert(key.to_string(), json!(v));
        }
        Value::Object(entry)
    }

    /// The section from a config.json's `rope_scaling` mapping (its type
    /// already read) as `initialize_rope` passes it to `YarnRoPE`: `factor`
    /// required, the other keys `YarnRoPE`'s defaults where left out (noted).
    fn read(entry: &Map<String, Value>, r: &mut Reader) -> Self {
        let mut y = Reader::new(entry, "rope_scaling.");
        let mut values = [y.required_float("factor"); 6];
        for ((value, key), default) in values[1..].iter_mut().zip(&Self::KEYS[1..]).zip(DEFAULTS) {
            *value = y.float(key, default);
        }
        r.absorb(y);
        Self::from_values(values)
    }

    /// Notes each key of a `rope_scaling` mapping that `YarnRoPE` does not
    /// read (as `truncate`): ignored.
    fn note_unread_keys(entry: &Map<String, Value>, r: &mut Reader) {
        let mut y = Reader::new(entry, "rope_scaling.");
        for key in entry.keys() {
            let read =
                ["type", "rope_type"].contains(&key.as_str()) || Self::KEYS.contains(&key.as_str());
            if !read {
                y.note(
                    key,
                    Value::Null,
                    "ignored: rope_utils' YarnRoPE does not read it",
                );
            }
        }
        r.absorb(y);
    }
}
