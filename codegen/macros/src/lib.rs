//! `archgen_macros::specialize!("specs/my-model.yaml")` expands to the same
//! model code `cargo xtask gen` writes to generated/, so a crate can
//! specialize its own spec without xtask. The path is relative to the calling
//! crate's manifest directory; the expansion depends on the spec file, so
//! editing it recompiles. Put the call inside a module:
//!
//! ```ignore
//! mod my_model {
//!     archgen_macros::specialize!("specs/my-model.yaml");
//! }
//! ```
//! The calling crate must depend on `archgen-runtime`.

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
