//! One family's resolved spec as the rest of the crate handles it: its identity,
//! weight quantization and mixed KV, its checks, its lowering and its writers.
//! Each family implements [`Document`] once, beside its document type; [`Spec`]
//! reaches every family through [`Spec::document`], so a new family adds one arm
//! there rather than one to every method, and the derived form
//! ([`crate::reduce::Reducible`]) reads the same methods.
//!
//! [`Spec`]: crate::Spec
//! [`Spec::document`]: crate::Spec::document

use crate::diag::Issue;
use crate::ir::ModelIr;
use crate::model::{Identity, Quantization};
use crate::MixedKv;
use serde_json::Value;

pub(crate) trait Document {
    /// `format_version`, as written.
    fn format_version(&self) -> u32;
    fn identity(&self) -> &Identity;
    fn identity_mut(&mut self) -> &mut Identity;
    /// Weight quantization (the mlx config's `quantization`), when set.
    fn quantization(&self) -> Option<&Quantization>;
    fn quantization_mut(&mut self) -> &mut Option<Quantization>;
    /// mlx-optiq per-layer mixed KV, on the layouts that have the section.
    fn mixed_kv(&self) -> Option<&MixedKv> {
        None
    }
    /// The `mixed_kv` section to set, on the layouts that have it.
    fn mixed_kv_mut(&mut self) -> Option<&mut Option<MixedKv>> {
        None
    }
    /// All semantic errors (full-spec field paths).
    fn check(&self) -> Vec<Issue>;
    /// The block IR of a valid spec, before mixed KV is applied.
    fn lower(&self) -> ModelIr;
    /// The full-form YAML text, starting with the schema modeline.
    fn to_yaml(&self) -> String;
    /// The config.json view (`spec show --json`), keys sorted.
    fn hf_json(&self) -> Value;
    /// The `model` section's sizes, as the lowering reads them.
    fn model_sizes(&self) -> &dyn ModelSizes;
}

/// Implements [`Document`] for a family's document type: the accessors read
/// the fields every layout has (`identity`, `quantization`; `mixed_kv` where
/// the layout has the section), the rest calls the family module's own `lower`
/// and `config_fields` and the given check. The config.json view is finished
/// here for every family ([`crate::hf::config_view`]: quantization, sorted
/// keys), and the YAML text is [`crate::yaml_writer::document_yaml`] unless the
/// family names its own writer (`yaml = path`). Written once here so that a
/// family states only what differs.
macro_rules! impl_document {
    ($spec:ty, $check:path) => {
        $crate::document::impl_document!(@impl $spec, $check, $crate::yaml_writer::document_yaml, {});
    };
    ($spec:ty, $check:path, with mixed_kv) => {
        $crate::document::impl_document!($spec, $check, with mixed_kv, yaml = $crate::yaml_writer::document_yaml);
    };
    ($spec:ty, $check:path, with mixed_kv, yaml = $yaml:path) => {
        $crate::document::impl_document!(@impl $spec, $check, $yaml, {
            fn mixed_kv(&self) -> Option<&$crate::MixedKv> {
                self.mixed_kv.as_ref()
            }
            fn mixed_kv_mut(&mut self) -> Option<&mut Option<$crate::MixedKv>> {
                Some(&mut self.mixed_kv)
            }
        });
    };
    (@impl $spec:ty, $check:path, $yaml:path, { $($mixed_kv:tt)* }) => {
        impl $crate::document::Document for $spec {
            fn format_version(&self) -> u32 {
                self.format_version
            }
            fn identity(&self) -> &$crate::model::Identity {
                &self.identity
            }
            fn identity_mut(&mut self) -> &mut $crate::model::Identity {
                &mut self.identity
            }
            fn quantization(&self) -> Option<&$crate::model::Quantization> {
                self.quantization.as_ref()
            }
            fn quantization_mut(&mut self) -> &mut Option<$crate::model::Quantization> {
                &mut self.quantization
            }
            $($mixed_kv)*
            fn check(&self) -> Vec<$crate::diag::Issue> {
                $check(self)
            }
            fn lower(&self) -> $crate::ir::ModelIr {
                lower(self)
            }
            fn to_yaml(&self) -> String {
                $yaml(self)
            }
            fn hf_json(&self) -> serde_json::Value {
                $crate::hf::config_view(config_fields(self), self.quantization.as_ref())
            }
            fn model_sizes(&self) -> &dyn $crate::document::ModelSizes {
                &self.model
            }
        }
    };
}
pub(crate) use impl_document;

/// [`impl_document`] for a document built on the dense `model`, `layers` and
/// `attention` sections, with the two views of them the shared code reads
/// ([`crate::hf::DenseView`], [`crate::reduce::StackSections`]).
macro_rules! impl_dense_document {
    ($spec:ty, $check:path $(, $($form:tt)*)?) => {
        $crate::hf::impl_dense_view!($spec);
        $crate::reduce::impl_stack_sections!($spec);
        $crate::document::impl_document!($spec, $check $(, $($form)*)?);
    };
}
pub(crate) use impl_dense_document;

/// The sizes every layout's `model` section names alike; each family's model
/// section implements it with [`impl_model_sizes`].
pub(crate) trait ModelSizes {
    fn hidden_size(&self) -> u32;
    fn vocab_size(&self) -> u32;
    fn max_position_embeddings(&self) -> u32;
    fn rms_norm_eps(&self) -> f64;
}

/// Implements [`ModelSizes`] for `model` sections whose fields carry those names.
macro_rules! impl_model_sizes {
    ($($model:ty),+) => {$(
        impl $crate::document::ModelSizes for $model {
            fn hidden_size(&self) -> u32 {
                self.hidden_size
            }
            fn vocab_size(&self) -> u32 {
                self.vocab_size
            }
            fn max_position_embeddings(&self) -> u32 {
                self.max_position_embeddings
            }
            fn rms_norm_eps(&self) -> f64 {
                self.rms_norm_eps
            }
        }
    )+};
}
pub(crate) use impl_model_sizes;
