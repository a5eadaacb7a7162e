//! The derived form every family but Gemma-4 reads: `derive: {from, reduce,
//! quantization}` applied to an already loaded, valid parent (Gemma-4's own form,
//! with periods and feature presence, is in [`crate::derive`]; it shares
//! [`check_shrinks`] and [`quant_divisibility`] from here).
//!
//! A family states its form once, as an implementation of [`Reducible`]: which
//! sizes its `reduce` names, how they are applied, and where an issue found on
//! the reduced spec belongs in the derived file. [`read`] does the rest, in the
//! same order for every family: deserialize the file, check that each size
//! shrinks and that the parent's structure is kept (grouped-query attention stays
//! grouped, plus the family's own rules), apply, validate the result like a full
//! spec, and require that a quantized variant quantizes every module.

use crate::diag::{Diagnostics, FieldPath, Issue};
use crate::document::Document;
use crate::ir::QuantizableModule;
use crate::model::{DerivedIdentity, Quantization};
use crate::yaml::Node;
use crate::MixedKv;
use crate::{locate_all, locate_serde, FORMAT_VERSION};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::ops::ControlFlow;

fn p(s: &str) -> FieldPath {
    FieldPath::parse(s)
}

/// One reduced size beside the parent's: `(field under derive.reduce, reduced, parent's)`.
pub(crate) type Size = (&'static str, u32, u32);

/// Declares a struct whose fields start with the attention stack's sizes, in
/// the order every family's `reduce` names them, followed by the given fields:
/// [`Stack`] and each family's `<Family>Reduce` are written with it, so the
/// six sizes are declared once.
macro_rules! with_stack_sizes {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($fields:tt)* }) => {
        $(#[$meta])*
        $vis struct $name {
            pub num_hidden_layers: u32,
            pub hidden_size: u32,
            pub vocab_size: u32,
            pub num_attention_heads: u32,
            pub num_key_value_heads: u32,
            pub head_dim: u32,
            $($fields)*
        }
    };
}
pub(crate) use with_stack_sizes;

/// Declares the three types of a family's derived form (see [`Reducible`]):
/// the file (`format_version`, `identity`, `derive`), its `derive` section
/// (`from`, `reduce`, `quantization`, then the given fields) and its `reduce`
/// section (the stack's sizes, then the family's own). The doc comments and
/// the file's schema title are the family's; the
/// shared fields carry the same descriptions in every family's schema. The
/// family's spec type (`for`) gets the form as its [`DerivedForm`].
macro_rules! derived_form {
    (
        $(#[$file_meta:meta])* file $file:ident titled $title:literal for $spec:ty;
        $(#[$derive_meta:meta])* derive $derive:ident { $($derive_fields:tt)* }
        $(#[$reduce_meta:meta])* reduce $reduce:ident { $($reduce_fields:tt)* }
    ) => {
        $(#[$file_meta])*
        #[derive(Debug, Clone, PartialEq, ::serde::Serialize, ::serde::Deserialize, ::schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        #[schemars(title = $title)]
        pub struct $file {
            /// Spec format version; must be 1.
            pub format_version: u32,
            pub identity: $crate::model::DerivedIdentity,
            pub derive: $derive,
        }

        $(#[$derive_meta])*
        #[derive(Debug, Clone, PartialEq, ::serde::Serialize, ::serde::Deserialize, ::schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $derive {
            /// Name of the parent spec (`<from>.yaml` in the same directory).
            pub from: String,
            /// Sizes to shrink, or null to keep the parent's sizes.
            #[serde(deserialize_with = "crate::model::explicit")]
            pub reduce: Option<$reduce>,
            /// Weight quantization of the derived spec (never inherited), or null.
            #[serde(deserialize_with = "crate::model::explicit")]
            pub quantization: Option<$crate::model::Quantization>,
            $($derive_fields)*
        }

        $crate::reduce::with_stack_sizes! {
            $(#[$reduce_meta])*
            #[derive(Debug, Clone, PartialEq, ::serde::Serialize, ::serde::Deserialize, ::schemars::JsonSchema)]
            #[serde(deny_unknown_fields)]
            pub struct $reduce { $($reduce_fields)* }
        }

        impl $crate::reduce::DerivedForm for $spec {
            type File = $file;
            type Reduce = $reduce;
        }
    };
}
pub(crate) use derived_form;

with_stack_sizes! {
    /// The attention stack's sizes, which every family's `reduce` names first and in
    /// this order.
    #[derive(Debug, Clone, Copy, Deserialize)]
    pub(crate) struct Stack {}
}

impl Stack {
    /// Each size beside the parent's, in report order.
    fn beside(&self, parent: &Stack) -> [Size; 6] {
        [
            (
                "num_hidden_layers",
                self.num_hidden_layers,
                parent.num_hidden_layers,
            ),
            ("hidden_size", self.hidden_size, parent.hidden_size),
            ("vocab_size", self.vocab_size, parent.vocab_size),
            (
                "num_attention_heads",
                self.num_attention_heads,
                parent.num_attention_heads,
            ),
            (
                "num_key_value_heads",
                self.num_key_value_heads,
                parent.num_key_value_heads,
            ),
            ("head_dim", self.head_dim, parent.head_dim),
        ]
    }

    fn grouped(&self) -> bool {
        self.num_attention_heads != self.num_key_value_heads
    }
}

/// What every family's derived file holds, read from a document that has
/// already deserialized as the family's own file type (`Reducible::File`: strict,
/// and the form the JSON schema names), so that no family repeats accessors for
/// it. `R` is the `derive.reduce` section: the family's own, or the [`Stack`]
/// every family's reduction names (other fields are passed over here).
#[derive(Deserialize)]
pub(crate) struct DerivedFile<R> {
    pub format_version: u32,
    pub identity: DerivedIdentity,
    pub derive: DerivedParts<R>,
}

/// `derive:` of a [`DerivedFile`] (`from` was followed by the caller).
#[derive(Deserialize)]
pub(crate) struct DerivedParts<R> {
    pub reduce: Option<R>,
    pub quantization: Option<Quantization>,
    /// Only some forms have it; their file types (read first) refuse it elsewhere.
    #[serde(default)]
    pub mixed_kv: Option<MixedKv>,
}

/// The types of a family's derived form, implemented by [`derived_form!`] for
/// the spec type it names (a family that reads another's form states it).
pub(crate) trait DerivedForm {
    /// The derived document (`<Family>DerivedSpecFile`, as the JSON schema names it).
    type File: DeserializeOwned;
    /// Its `derive.reduce` section.
    type Reduce: DeserializeOwned;
}

/// A family's derived form, as [`read`] needs it. Implemented by the family's
/// full spec type.
pub(crate) trait Reducible: Clone + Document + StackSections + DerivedForm {
    /// The parent with what a derived file sets rather than inherits: its name and
    /// weight quantization (a form with mixed KV sets that too).
    fn derived(parent: &Self, file: &DerivedFile<Self::Reduce>) -> Self {
        let mut spec = parent.clone();
        spec.identity_mut().name = file.identity.name.clone();
        *spec.quantization_mut() = file.derive.quantization.clone();
        spec
    }
    /// Fields the derived file's form has but this family does not take, each as
    /// an issue (reported before anything else).
    fn refused_in_file(_file: &Self::File) -> Vec<Issue> {
        Vec::new()
    }
    /// The family's other reduced sizes beside the parent's, checked after the
    /// stack's. A reduction whose form does not match the parent's (a dense
    /// width for an MoE parent) is reported in `issues`, before any size.
    fn other_sizes(reduce: &Self::Reduce, parent: &Self, issues: &mut Vec<Issue>) -> Vec<Size>;
    /// The family's structure rules beyond grouped-query attention, reported
    /// after it.
    fn keep_structure(_reduce: &Self::Reduce, _parent: &Self, _issues: &mut Vec<Issue>) {}
    /// Writes the family's own reduced sizes into the spec ([`read`] has
    /// written the stack's, the reduction's first six).
    fn apply(&mut self, reduce: &Self::Reduce);
    /// The `derive.reduce` field an issue at the full-spec `path` belongs to (in a
    /// file with a `reduce` section), or None when it concerns an inherited field.
    /// By default every size check is on a reduced field of the same name.
    fn reduced_field(path: &str) -> Option<FieldPath> {
        Some(reduce_key(last_key(path)))
    }
}

/// A document whose `layers`, `model` and `attention` sections carry the
/// stack's sizes under [`Stack`]'s names, as every layout [`read`] serves
/// does; each implements it with [`impl_stack_sections`].
pub(crate) trait StackSections {
    fn stack(&self) -> Stack;
    fn set_stack(&mut self, stack: &Stack);
}

/// Implements [`StackSections`] for document types, reading and writing
/// `layers.num_hidden_layers`, `model.{hidden_size, vocab_size}` and
/// `attention.{num_attention_heads, num_key_value_heads, head_dim}`.
macro_rules! impl_stack_sections {
    ($($spec:ty),+) => {$(
        impl $crate::reduce::StackSections for $spec {
            fn stack(&self) -> $crate::reduce::Stack {
                $crate::reduce::Stack {
                    num_hidden_layers: self.layers.num_hidden_layers,
                    hidden_size: self.model.hidden_size,
                    vocab_size: self.model.vocab_size,
                    num_attention_heads: self.attention.num_attention_heads,
                    num_key_value_heads: self.attention.num_key_value_heads,
                    head_dim: self.attention.head_dim,
                }
            }
            fn set_stack(&mut self, stack: &$crate::reduce::Stack) {
                self.layers.num_hidden_layers = stack.num_hidden_layers;
                self.model.hidden_size = stack.hidden_size;
                self.model.vocab_size = stack.vocab_size;
                self.attention.num_attention_heads = stack.num_attention_heads;
                self.attention.num_key_value_heads = stack.num_key_value_heads;
                self.attention.head_dim = stack.head_dim;
            }
        }
    )+};
}
pub(crate) use impl_stack_sections;

/// The sizes of fields a reduction and its parent's section share by name,
/// each named as the field (after `prefix`, the section's path, where given):
/// `sizes_named!(r, parent; a, b)` is `[("a", r.a, parent.a), ("b", r.b, parent.b)]`.
macro_rules! sizes_named {
    ($prefix:literal, $reduced:expr, $parent:expr; $($field:ident),+ $(,)?) => {
        [$((concat!($prefix, stringify!($field)), $reduced.$field, $parent.$field)),+]
    };
    ($reduced:expr, $parent:expr; $($field:ident),+ $(,)?) => {
        $crate::reduce::sizes_named!("", $reduced, $parent; $($field),+)
    };
}
pub(crate) use sizes_named;

/// Writes the reduced fields [`sizes_named!`] names into the section that has
/// them by the same names: `set_named!(r, section; a, b)` is
/// `section.a = r.a; section.b = r.b;`.
macro_rules! set_named {
    ($reduced:expr, $section:expr; $($field:ident),+ $(,)?) => {
        $($section.$field = $reduced.$field;)+
    };
}
pub(crate) use set_named;

/// The MLP width as the one size a form reduces beside the stack's.
pub(crate) fn mlp_width(reduced: u32, parent: u32) -> Vec<Size> {
    vec![("intermediate_size", reduced, parent)]
}

/// The last key of a full-spec path as text: `attention.head_dim` → `head_dim`.
pub(crate) fn last_key(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

/// `derive.reduce.<field>`; `field` may be a dotted path (`moe.num_experts`).
pub(crate) fn reduce_key(field: &str) -> FieldPath {
    let mut path = p("derive.reduce");
    path.0.extend(FieldPath::parse(field).0);
    path
}

/// Applies a derived file of `S`'s form to its (already loaded, valid) parent.
pub(crate) fn read<S: Reducible>(
    value: serde_yaml::Value,
    tree: &Node,
    origin: &str,
    parent: &S,
) -> Result<S, Diagnostics> {
    let file: S::File = deserialize(value.clone(), tree, origin)?;
    // The same document, as every form has it; it deserialized strictly above.
    let common: DerivedFile<S::Reduce> = deserialize(value.clone(), tree, origin)?;
    let stack: DerivedFile<Stack> = deserialize(value, tree, origin)?;
    let mut front = S::refused_in_file(&file);
    if common.format_version != FORMAT_VERSION {
        front.insert(
            0,
            Issue::new(
                p("format_version"),
                format!("format version {} is not supported", common.format_version),
                format!("{FORMAT_VERSION}"),
                "this archgen reads format_version 1 only",
            ),
        );
    }
    if !front.is_empty() {
        return Err(locate_all(tree, origin, front));
    }
    let mut spec = S::derived(parent, &common);
    let reduce = common.derive.reduce.as_ref();
    let mut issues = Vec::new();
    if let (Some(r), Some(stack)) = (reduce, stack.derive.reduce) {
        let parent_stack = parent.stack();
        let mut sizes = stack.beside(&parent_stack).to_vec();
        sizes.extend(S::other_sizes(r, parent, &mut issues));
        check_shrinks(&sizes, &mut issues);
        if parent_stack.grouped() && !stack.grouped() {
            issues.push(Issue::new(
                reduce_key("num_key_value_heads"),
                format!(
                    "{} KV heads for {} query heads: not grouped, but the parent is",
                    stack.num_key_value_heads, stack.num_attention_heads
                ),
                "fewer KV heads than query heads",
                "a reduction keeps the parent's structure: GQA stays GQA",
            ));
        }
        S::keep_structure(r, parent, &mut issues);
        spec.set_stack(&stack);
        spec.apply(r);
    }
    if issues.is_empty() {
        let checked = spec.check();
        issues.extend(
            checked
                .into_iter()
                .map(|i| place::<S>(i, reduce.is_some(), &parent.identity().name)),
        );
    }
    if issues.is_empty() {
        if let Some(q) = spec.quantization() {
            issues.extend(quant_divisibility(
                q,
                &spec.lower().quant_skipped_modules(),
                "derived specs must exercise quantization everywhere: pick sizes that are multiples of the group size",
            ));
        }
    }
    if issues.is_empty() {
        Ok(spec)
    } else {
        Err(locate_all(tree, origin, issues))
    }
}

/// `value` as `T`, or its first error located in `tree`.
fn deserialize<T: DeserializeOwned>(
    value: serde_yaml::Value,
    tree: &Node,
    origin: &str,
) -> Result<T, Diagnostics> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        locate_serde(
            tree,
            origin,
            vec![crate::serde_issue(&FieldPath::root(), e)],
        )
    })
}

/// Moves an issue on the reduced spec to the derived file's field: the derived
/// file's own sections keep their place under `derive`, a reduced size goes to
/// its `derive.reduce` field, and anything else was inherited from the parent.
/// (With `reduce: null` every size is the valid parent's, so in practice only the
/// file's own sections have issues then.)
fn place<S: Reducible>(i: Issue, reduced: bool, parent: &str) -> Issue {
    let mut i = match place_own_field(i, &["quantization", "mixed_kv"]) {
        ControlFlow::Break(placed) => return placed,
        ControlFlow::Continue(i) => i,
    };
    let s = i.path.to_string();
    match S::reduced_field(&s).filter(|_| reduced) {
        Some(field) => i.path = field,
        None => {
            i.path = p("derive.from");
            i.message = format!("{} (inherited from `{parent}` at {s})", i.message);
        }
    }
    i
}

/// The first step of placing an issue on a derived spec in the derived file,
/// the same for every form: an issue under a section the file sets itself
/// (`own_sections`) moves under `derive`, one on its name or format version
/// stays where it is (both `Break`, placed). Anything else (a size, an
/// inherited field) is the form's to place (`Continue`).
pub(crate) fn place_own_field(mut i: Issue, own_sections: &[&str]) -> ControlFlow<Issue, Issue> {
    let s = i.path.to_string();
    let under = |section: &&str| {
        s == *section
            || s.starts_with(&format!("{section}."))
            || s.starts_with(&format!("{section}["))
    };
    if own_sections.iter().any(under) {
        let mut path = p("derive");
        path.0.extend(i.path.0);
        i.path = path;
        return ControlFlow::Break(i);
    }
    if s == "identity.name" || s == "format_version" {
        return ControlFlow::Break(i);
    }
    ControlFlow::Continue(i)
}

/// A derived (tiny) spec must quantize every module it declares quantized: no
/// module may be silently skipped for group divisibility. `skipped` lists the
/// modules the default quantization would skip.
pub(crate) fn quant_divisibility(
    q: &Quantization,
    skipped: &[QuantizableModule],
    hint: &str,
) -> Option<Issue> {
    let first = skipped.first()?;
    Some(Issue::new(
        p("derive.quantization.default.group_size"),
        format!(
            "group size {} does not divide the input dimension {} of `{}` ({} module(s) would be left unquantized)",
            q.default.group_size,
            first.in_dim,
            first.path,
            skipped.len()
        ),
        "a group size dividing every quantized module's input dimension",
        hint,
    ))
}

/// A reduction only shrinks: each (field, reduced, parent's) must not grow.
pub(crate) fn check_shrinks(sizes: &[Size], issues: &mut Vec<Issue>) {
    for &(field, v, pv) in sizes {
        if v > pv {
            issues.push(Issue::new(
                reduce_key(field),
                format!("{v} is larger than the parent's {pv}"),
                format!("at most {pv}"),
                "a reduction only shrinks sizes",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    struct Experts {
        num_experts: u32,
        top_k: u32,
    }

    #[test]
    fn sizes_are_named_after_their_fields_under_the_prefix() {
        let (reduced, parent) = (
            Experts {
                num_experts: 4,
                top_k: 2,
            },
            Experts {
                num_experts: 128,
                top_k: 8,
            },
        );
        assert_eq!(
            sizes_named!(reduced, parent; num_experts, top_k),
            [("num_experts", 4, 128), ("top_k", 2, 8)]
        );
        assert_eq!(
            sizes_named!("moe.", reduced, parent; top_k),
            [("moe.top_k", 2, 8)]
        );
    }

    #[test]
    fn set_named_writes_the_named_fields_only() {
        let reduced = Experts {
            num_experts: 4,
            top_k: 2,
        };
        let mut section = Experts {
            num_experts: 128,
            top_k: 8,
        };
        set_named!(reduced, section; top_k);
        assert_eq!((section.num_experts, section.top_k), (128, 2));
    }
}
