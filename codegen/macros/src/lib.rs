//! `archgen_macros::specialize!("specs/my-model.yaml")` expands to the same
//! model code `cargo xtask gen` writes to generated/, so a crate can
//! specialize its own spec without xtask. The path is relative to the calling
//! crate's manifest directory; the expansion depends on the spec file, so
//! editing it recompiles. A spec error is a compile error at the macro call,
//! with the spec's diagnostics.
//!
//! The calling crate must depend on `archgen-runtime` (and, to load checkpoint
//! directories, `archgen-monolith`). On Linux such a crate outside archgen's
//! workspace needs one setup step, `runtime/mlx-linux/use-in-crate.sh`
//! (docs/adding-a-model.md, "Using a spec from your own crate";
//! examples/outside-crate is a whole one).
//!
//! # Example
//!
//! Put the call inside a module; it defines `NAME`, `FINGERPRINT`, `Model`,
//! `Cache` and `load` there, and `Model` implements
//! `archgen_runtime::model::CausalLm`:
//!
//! ```no_run
//! mod my_model {
//!     // In your crate: "specs/my-model.yaml", next to your Cargo.toml.
//!     archgen_macros::specialize!("../../specs/gemma4-walkthrough-tiny.yaml");
//! }
//!
//! use archgen_runtime::model::CausalLm;
//!
//! fn open(weights: archgen_runtime::weights::Weights) -> my_model::Model {
//!     let model = my_model::load(weights).expect("every tensor present, with its shape");
//!     assert_eq!(model.vocab_size(), 384);
//!     model
//! }
//! assert_eq!(my_model::NAME, "gemma4-walkthrough-tiny");
//! ```

use proc_macro::TokenStream;
use quote::quote;

#[proc_macro]
pub fn specialize(input: TokenStream) -> TokenStream {
    let lit = syn::parse_macro_input!(input as syn::LitStr);
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let path = std::path::Path::new(&manifest).join(lit.value());
    match archgen_emit::expand(&path, &lit.value()) {
        Ok(tokens) => {
            let abs = path.display().to_string();
            quote! {
                // Makes cargo rebuild when the spec changes.
                const _: &[u8] = include_bytes!(#abs);
                #tokens
            }
            .into()
        }
        Err(message) => syn::Error::new(lit.span(), message)
            .to_compile_error()
            .into(),
    }
}
