//! The small token and naming helpers every part of the emitter uses
//! (identifiers, literals, the names of a model's windows), at the bottom
//! so that `model.rs`, `layout.rs` and `comments.rs` all read them from
//! below instead of from each other.

use archgen_ir::{Attention, Layer, ModelIr, RopeKind, Window};
use proc_macro2::{Ident, Literal, Span};

pub(crate) fn ident(s: &str) -> Ident {
    Ident::new(s, Span::call_site())
}

pub(crate) fn lit_i32(v: usize) -> Result<Literal, String> {
    i32::try_from(v)
        .map(Literal::i32_unsuffixed)
        .map_err(|_| format!("{v} does not fit the i32 shapes MLX uses"))
}

pub(crate) fn lit_f32(v: f32) -> Literal {
    Literal::f32_suffixed(v)
}

/// The name of a window in the model: `full`, `sliding` (or `sliding_{n}`
/// when the model has several sliding sizes).
pub(crate) fn window_name(ir: &ModelIr, w: Window) -> String {
    match w {
        Window::Full => "full".to_string(),
        Window::Sliding(n) => {
            let sizes = windows(ir)
                .iter()
                .filter(|w| matches!(w, Window::Sliding(_)))
                .count();
            if sizes > 1 {
                format!("sliding_{n}")
            } else {
                "sliding".to_string()
            }
        }
    }
}

/// The name of a layer's step context (its mask, RoPE and tables): its
/// window's, with `_nope` for a layer that does not rotate (smollm3's NoPE
/// layers read the window's mask but no RoPE).
pub(crate) fn rope_context(ir: &ModelIr, a: &Attention) -> String {
    let wn = window_name(ir, a.window);
    match a.rope.kind {
        RopeKind::NoPe => format!("{wn}_nope"),
        RopeKind::Default { .. }
        | RopeKind::Linear { .. }
        | RopeKind::Proportional { .. }
        | RopeKind::Llama3 { .. }
        | RopeKind::Yarn { .. } => wn,
    }
}

/// The attention windows of the model, in order of first appearance.
pub(crate) fn windows(ir: &ModelIr) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::new();
    for a in ir.layers.iter().filter_map(Layer::attention) {
        if !out.contains(&a.window) {
            out.push(a.window);
        }
    }
    out
}
