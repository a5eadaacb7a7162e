//! Line comments in emitted function bodies. `quote!` drops `//` comments
//! and a doc comment on a statement is a lint warning, so a comment is
//! emitted as a marker statement, `__comment!("text");`, which survives
//! syn and prettyplease as one line of its own. Then [`markers_to_comments`]
//! turns each such line into `// text` for the checked-in file, and
//! [`strip_markers`] removes the markers from the tokens `specialize!`
//! expands to (no such macro exists to run them).

use proc_macro2::{Delimiter, Group, Literal, TokenStream, TokenTree};
use quote::quote;

/// The marker macro's name: no runtime or user macro is called this.
const MARKER: &str = "__comment";

/// A `// text` line at this point of a function body. The text is one line
/// without quotes or backslashes, so the formatted marker holds it verbatim.
/// Only between statements of a body that has several: in a block that is
/// otherwise one expression, the marker would change how it is laid out.
pub(crate) fn comment(text: &str) -> TokenStream {
    debug_assert!(
        !text.contains(['"', '\\', '\n']),
        "a comment the post-pass cannot read back: {text}"
    );
    let text = Literal::string(text);
    let name = crate::model::ident(MARKER);
    quote! { #name!(#text); }
}

/// The formatted file with every marker turned into `// text`, at the
/// marker's indentation. prettyplease writes a marker on one line, or, when
/// that is too long, as `__comment!(`, the quoted text, `);` on three.
pub(crate) fn markers_to_comments(formatted: &str) -> String {
    let one_line = format!("{MARKER}!(\"");
    let opening = format!("{MARKER}!(");
    let lines: Vec<&str> = formatted.lines().collect();
    let mut out = String::with_capacity(formatted.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let single = body
            .strip_prefix(one_line.as_str())
            .and_then(|rest| rest.strip_suffix("\");"));
        let split = || {
            let text = lines.get(i + 1)?.trim();
            let close = lines.get(i + 2)?.trim();
            (body == opening && close == ");")
                .then(|| text.strip_prefix('"')?.strip_suffix('"'))
                .flatten()
        };
        let (text, taken) = match single {
            Some(text) => (Some(text), 1),
            None => match split() {
                Some(text) => (Some(text), 3),
                None => (None, 1),
            },
        };
        match text {
            Some(text) => {
                out.push_str(indent);
                out.push_str("// ");
                out.push_str(text);
            }
            None => out.push_str(line),
        }
        out.push('\n');
        i += taken;
    }
    out
}

/// The tokens without their comment markers (each `__comment ! (..) ;`).
pub(crate) fn strip_markers(tokens: TokenStream) -> TokenStream {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut out = Vec::with_capacity(trees.len());
    let mut i = 0;
    while i < trees.len() {
        if is_marker(&trees[i..]) {
            i += 4;
            continue;
        }
        out.push(match &trees[i] {
            TokenTree::Group(g) => {
                let mut inner = Group::new(g.delimiter(), strip_markers(g.stream()));
                inner.set_span(g.span());
                TokenTree::Group(inner)
            }
            other => other.clone(),
        });
        i += 1;
    }
    out.into_iter().collect()
}

fn is_marker(trees: &[TokenTree]) -> bool {
    match trees {
        [TokenTree::Ident(name), TokenTree::Punct(bang), TokenTree::Group(args), TokenTree::Punct(semi), ..] => {
            name == MARKER
                && bang.as_char() == '!'
                && args.delimiter() == Delimiter::Parenthesis
                && semi.as_char() == ';'
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: &str = "a = self.self_attn(x, mask, cache): q/k/v projections, q/k RMSNorm per head, RoPE, cache update, scaled_dot_product_attention, o_proj";

    fn body() -> TokenStream {
        let note = comment("h = h + self.post_attention_layernorm(r), `finish`");
        let long = comment(LONG);
        quote! {
            fn f(h: i32) -> i32 {
                #note
                let h = h + 1;
                #long
                h
            }
        }
    }

    #[test]
    fn a_marker_becomes_a_comment_line_at_its_indentation() {
        let formatted = crate::format_rust(body()).unwrap();
        let file = markers_to_comments(&formatted);
        assert!(
            file.contains(
                "    // h = h + self.post_attention_layernorm(r), `finish`\n    let h = h + 1;"
            ),
            "{file}"
        );
        assert!(file.contains(&format!("    // {LONG}\n    h\n")), "{file}");
        assert!(!file.contains(MARKER), "{file}");
    }

    #[test]
    fn stripped_tokens_format_as_the_file_without_its_comment_lines() {
        let stripped = crate::format_rust(strip_markers(body())).unwrap();
        let file = markers_to_comments(&crate::format_rust(body()).unwrap());
        let without: String = file
            .lines()
            .filter(|l| !l.trim_start().starts_with("// "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(stripped, without);
        assert!(!stripped.contains(MARKER));
    }
}
