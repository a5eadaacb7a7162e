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
    fn identity(&self) -> &Identity;
    fn identity_mut(&mut self) -> &mut Identity;
    /// Weight quantization (the mlx config's `quantization`), when set.
    fn quantization(&self) -> Option<&Quantization>;
    /// mlx-optiq per-layer mixed KV, on the layouts that have the section.
    fn mixed_kv(&self) -> Option<&MixedKv> {
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
}
