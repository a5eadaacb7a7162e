//! Reading a family's full document: what every layout but Gemma-4's shares.
//!
//! A layout deserializes whole; when it does not, each top-level section is
//! read alone so that every section's first error is reported, and the
//! messages get the layout's own texts (the shared per-field texts describe
//! the Gemma-4 layout). A family describes its layout once, as a [`Layout`];
//! [`Layout::parse`] does the rest.

use crate::dense_sections::{DenseAttention, DenseLayers, DenseModel};
use crate::diag::{Diagnostics, FieldPath, Issue};
use crate::document::Document;
use crate::model::{Identity, Quantization};
use crate::yaml::Node;
use crate::{locate_all, locate_serde, Sections, Spec};
use serde::de::DeserializeOwned;

/// Reads one top-level section alone (`Sections::check::<T>` or
/// `Sections::check_optional::<T>` for the section's type).
type SectionCheck = fn(&Sections, &str, &mut Vec<Issue>);

/// A top-level section of a layout: its key, how it is read alone, and what the
/// messages about it say.
pub(crate) struct Section {
    key: &'static str,
    read: SectionCheck,
    text: SectionText,
}

/// What the messages about a section say.
enum SectionText {
    /// The shared texts of the dense sections, where `DENSE_TEXTS` has the key.
    Shared,
    /// The shared expected text, and this hint.
    Hint(&'static str),
    /// `(expected, hint)`.
    Own(&'static str, &'static str),
}

impl Section {
    /// Section `key`, of type `T`, described by the shared texts (if any).
    pub(crate) const fn of<T: DeserializeOwned>(key: &'static str) -> Self {
        Self::read(key, Sections::check::<T>, SectionText::Shared)
    }

    /// Section `key`, of type `T`, that may be left out.
    pub(crate) const fn optional<T: DeserializeOwned>(key: &'static str) -> Self {
        Self::read(key, Sections::check_optional::<T>, SectionText::Shared)
    }

    /// A dense section with the shared expected text and the layout's own hint
    /// (empty: the pointer to the layout's docs alone).
    pub(crate) const fn hinted<T: DeserializeOwned>(key: &'static str, hint: &'static str) -> Self {
        Self::read(key, Sections::check::<T>, SectionText::Hint(hint))
    }

    /// Section `key`, of type `T`, with its own texts.
    pub(crate) const fn described<T: DeserializeOwned>(
        key: &'static str,
        expected: &'static str,
        hint: &'static str,
    ) -> Self {
        Self::read(key, Sections::check::<T>, SectionText::Own(expected, hint))
    }

    const fn read(key: &'static str, read: SectionCheck, text: SectionText) -> Self {
        Section { key, read, text }
    }
}

/// `quantization`, the last or next-to-last section of every layout.
pub(crate) const QUANTIZATION: Section = Section::of::<Option<Quantization>>("quantization");

/// The sections every layout opens with.
pub(crate) const HEAD: &[Section] = &[
    Section::of::<u32>("format_version"),
    Section::of::<Identity>("identity"),
];

/// The sections the layouts built from the dense ones open with: [`HEAD`], then
/// the dense `model`, `layers` and `attention`.
pub(crate) const DENSE_HEAD: &[Section] = &[
    Section::of::<u32>("format_version"),
    Section::of::<Identity>("identity"),
    Section::of::<DenseModel>("model"),
    Section::of::<DenseLayers>("layers"),
    Section::of::<DenseAttention>("attention"),
];

/// The texts of the dense sections as most layouts built from them describe
/// them: `(key, expected, hint)`, the hint followed by the layout's section of
/// docs/spec-format.md. A layout's own texts come first.
const DENSE_TEXTS: &[(&str, &str, &str)] = &[
    ("model", "a mapping {hidden_size, vocab_size, rms_norm_eps, tie_word_embeddings, max_position_embeddings}", "model-wide sizes"),
    ("layers", "a mapping {num_hidden_layers}", "every layer is full attention"),
    ("attention", "a mapping {num_attention_heads, num_key_value_heads, head_dim}", "attention geometry"),
    ("mlp", "a mapping {intermediate_size}", "SwiGLU width"),
];

/// A family's document layout, as the reader needs it.
pub(crate) struct Layout {
    /// The family as written in "the {family} spec does not parse".
    pub family: &'static str,
    /// Its section of docs/spec-format.md (`#...`).
    pub anchor: &'static str,
    /// The sections it opens with, shared with other layouts ([`HEAD`] or
    /// [`DENSE_HEAD`]).
    pub head: &'static [Section],
    /// The top-level sections after `head`, in document order.
    pub sections: &'static [Section],
    /// Its texts for the messages about other fields, or that replace a
    /// section's, written whole.
    pub texts: &'static [Text],
}

/// A layout's own text for the messages about the field named `key`.
pub(crate) enum Text {
    /// A missing or mistyped field: `(key, expected, hint)`.
    Field(&'static str, &'static str, &'static str),
    /// A field other layouts have and this one does not read: an
    /// unknown-field error for it gets this hint (and no other text).
    Refused(&'static str, &'static str),
}

impl Layout {
    /// The layout of `family` (documented at `anchor`) that opens with
    /// [`DENSE_HEAD`], then has `sections`, with no texts of its own.
    pub(crate) const fn on_dense_head(
        family: &'static str,
        anchor: &'static str,
        sections: &'static [Section],
    ) -> Layout {
        Layout {
            family,
            anchor,
            head: DENSE_HEAD,
            sections,
            texts: &[],
        }
    }

    /// This layout with `texts` for its messages.
    pub(crate) const fn with_texts(self, texts: &'static [Text]) -> Layout {
        Layout { texts, ..self }
    }

    /// `value` as the layout's document `S`, validated by its family's check,
    /// as the [`Spec`] `wrap` makes of it; or every section's first error
    /// (deserializing), or every issue the check finds, each located in `tree`.
    pub(crate) fn parse<S: DeserializeOwned + Document>(
        &self,
        value: serde_yaml::Value,
        tree: &Node,
        origin: &str,
        wrap: fn(S) -> Spec,
    ) -> Result<Spec, Diagnostics> {
        let spec = match serde_path_to_error::deserialize::<_, S>(value.clone()) {
            Ok(s) => s,
            Err(_) => return Err(locate_serde(tree, origin, self.section_issues(&value))),
        };
        let issues = spec.check();
        if issues.is_empty() {
            Ok(wrap(spec))
        } else {
            Err(locate_all(tree, origin, issues))
        }
    }

    /// `head`, then `sections`: every top-level section, in document order.
    fn all_sections(&self) -> impl Iterator<Item = &Section> {
        self.head.iter().chain(self.sections)
    }

    /// Each section read alone: its first error, with this layout's texts.
    fn section_issues(&self, value: &serde_yaml::Value) -> Vec<Issue> {
        let keys: Vec<&str> = self.all_sections().map(|s| s.key).collect();
        let (map, mut issues) = Sections::of(value, &keys);
        for s in self.all_sections() {
            (s.read)(&map, s.key, &mut issues);
        }
        if issues.is_empty() {
            issues.push(Issue::new(
                FieldPath::root(),
                format!("the {} spec does not parse", self.family),
                format!("the sections {}", keys.join(", ")),
                format!("see docs/spec-format.md#{}", self.anchor),
            ));
        }
        for i in &mut issues {
            self.apply_texts(i);
        }
        issues
    }

    fn apply_texts(&self, i: &mut Issue) {
        let key = i.path.last_key().unwrap_or("").to_string();
        if i.message.starts_with("unknown field") {
            let refusal = self.texts.iter().find_map(|t| match t {
                Text::Refused(k, hint) if *k == key => Some(hint),
                Text::Refused(..) | Text::Field(..) => None,
            });
            if let Some(hint) = refusal {
                i.hint = hint.to_string();
                return;
            }
        }
        let docs = |hint: &str| match hint {
            "" => format!("see docs/spec-format.md#{}", self.anchor),
            hint => format!("{hint}; see docs/spec-format.md#{}", self.anchor),
        };
        let shared = |key: &str| DENSE_TEXTS.iter().find(|(k, _, _)| *k == key);
        let written = || {
            self.texts.iter().find_map(|t| match t {
                Text::Field(k, expected, hint) if *k == key => Some((*expected, hint.to_string())),
                Text::Field(..) | Text::Refused(..) => None,
            })
        };
        let section = || {
            let s = self.all_sections().find(|s| s.key == key)?;
            match s.text {
                SectionText::Shared => None,
                SectionText::Hint(hint) => Some((shared(&key)?.1, docs(hint))),
                SectionText::Own(expected, hint) => Some((expected, docs(hint))),
            }
        };
        let dense = || {
            let (_, expected, hint) = shared(&key)?;
            Some((*expected, docs(hint)))
        };
        if let Some((expected, hint)) = written().or_else(section).or_else(dense) {
            if i.message.starts_with("missing field") {
                i.expected = format!("`{key}` to be written ({expected})");
            } else {
                i.expected = expected.to_string();
            }
            i.hint = hint;
        }
    }
}
