//! `#[derive(Flat)]`: the flattening of a weight structure into the inputs
//! of a compiled decode block (`archgen_runtime`'s `flat::Flat`), written
//! from the struct's fields instead of by hand.
//!
//! `put` appends the struct-level key values (`#[flat(key(expr, ...))]`,
//! each cast to `i64`; `self` is the struct) and then the arrays of every
//! plain field in declaration order; `take` rebuilds the struct from the
//! traced inputs in the same order. Two field attributes cover the fields
//! that do not travel as arrays:
//!
//! * `#[flat(copied)]`: a plain value (already part of the key) copied from
//!   the template;
//! * `#[flat(elsewhere = expr)]`: weights the block does not read (used
//!   outside it), rebuilt as `expr`.
//!
//! The derive is for use inside `archgen-runtime` only: the impl names
//! `crate::flat::{Flat, Packed}`.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::quote;
use syn::punctuated::Punctuated;
use syn::{parse_macro_input, Data, DeriveInput, Expr, Fields, Ident, Token};

#[proc_macro_derive(Flat, attributes(flat))]
pub fn derive_flat(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match flat_impl(&input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// How one field travels through a block.
enum FieldRole {
    /// Its arrays are traced inputs (the field is itself `Flat`).
    Arrays,
    /// Copied from the template.
    Copied,
    /// Rebuilt as this expression.
    Elsewhere(Expr),
}

fn flat_impl(input: &DeriveInput) -> syn::Result<TokenStream2> {
    let name = &input.ident;
    let fields = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(f) => &f.named,
            Fields::Unnamed(_) | Fields::Unit => {
                return Err(syn::Error::new_spanned(
                    name,
                    "#[derive(Flat)] needs a struct with named fields; write `Flat` by hand for others",
                ))
            }
        },
        Data::Enum(_) | Data::Union(_) => {
            return Err(syn::Error::new_spanned(
                name,
                "#[derive(Flat)] is for structs; an enum's variants need their own key tags, write `Flat` by hand",
            ))
        }
    };
    let mut keys: Vec<Expr> = Vec::new();
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("flat")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("key") {
                let content;
                syn::parenthesized!(content in meta.input);
                keys.extend(Punctuated::<Expr, Token![,]>::parse_terminated(&content)?);
                Ok(())
            } else {
                Err(meta.error("expected `key(expr, ...)` on the struct"))
            }
        })?;
    }
    let mut arrays: Vec<&Ident> = Vec::new();
    let mut copied: Vec<&Ident> = Vec::new();
    let mut elsewhere: Vec<(&Ident, Expr)> = Vec::new();
    for field in fields {
        let Some(ident) = field.ident.as_ref() else {
            return Err(syn::Error::new_spanned(
                field,
                "a named field without a name",
            ));
        };
        let mut role = FieldRole::Arrays;
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("flat")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("copied") {
                    role = FieldRole::Copied;
                    Ok(())
                } else if meta.path.is_ident("elsewhere") {
                    role = FieldRole::Elsewhere(meta.value()?.parse()?);
                    Ok(())
                } else {
                    Err(meta.error("expected `copied` or `elsewhere = expr` on a field"))
                }
            })?;
        }
        match role {
            FieldRole::Arrays => arrays.push(ident),
            FieldRole::Copied => copied.push(ident),
            FieldRole::Elsewhere(e) => elsewhere.push((ident, e)),
        }
    }
    let put_keys = (!keys.is_empty()).then(|| quote! { p.key.extend([#(#keys as i64),*]); });
    let (other, other_values): (Vec<_>, Vec<_>) = elsewhere.into_iter().unzip();
    Ok(quote! {
        impl crate::flat::Flat for #name {
            fn put(&self, p: &mut crate::flat::Packed) {
                #put_keys
                #(crate::flat::Flat::put(&self.#arrays, p);)*
            }
            fn take(&self, it: &mut std::slice::Iter<'_, crate::Array>) -> Self {
                #(let #arrays = crate::flat::Flat::take(&self.#arrays, it);)*
                #name {
                    #(#arrays,)*
                    #(#copied: self.#copied,)*
                    #(#other: #other_values,)*
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::flat_impl;

    fn expand(src: &str) -> Result<String, String> {
        let input = syn::parse_str(src).map_err(|e| e.to_string())?;
        flat_impl(&input)
            .map(|t| t.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn keys_then_arrays_in_field_order_and_the_rest_rebuilt() {
        let out = expand(
            "#[flat(key(self.top_k, self.eps.to_bits()))]
             struct Router {
                 proj: Linear,
                 #[flat(copied)] top_k: i32,
                 scale: Array,
                 #[flat(elsewhere = None)] kv: Option<KvWeights>,
                 #[flat(copied)] eps: f32,
             }",
        )
        .unwrap();
        let put =
            out.find("p . key . extend ([self . top_k as i64 , self . eps . to_bits () as i64])");
        let (proj, scale) = (
            out.find("put (& self . proj"),
            out.find("put (& self . scale"),
        );
        assert!(put.is_some() && proj > put && scale > proj, "{out}");
        assert!(
            !out.contains("put (& self . top_k") && !out.contains("put (& self . kv"),
            "{out}"
        );
        for field in ["top_k : self . top_k", "eps : self . eps", "kv : None"] {
            assert!(out.contains(field), "{field} missing: {out}");
        }
    }

    #[test]
    fn a_struct_without_keys_puts_no_key() {
        let out = expand("struct SparseMoe { router: R, experts: E }").unwrap();
        assert!(!out.contains("p . key"), "{out}");
    }

    #[test]
    fn enums_and_unknown_attributes_are_refused_with_what_to_do() {
        let e = expand("enum Tables { A(Array) }").unwrap_err();
        assert!(e.contains("write `Flat` by hand"), "{e}");
        let e = expand("struct S { #[flat(skipped)] a: Array }").unwrap_err();
        assert!(e.contains("expected `copied` or `elsewhere = expr`"), "{e}");
        let e = expand("#[flat(keys(self.a))] struct S { a: Array }").unwrap_err();
        assert!(e.contains("expected `key(expr, ...)`"), "{e}");
    }
}
