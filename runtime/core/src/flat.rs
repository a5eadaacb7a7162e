//! Flattening of weight structures into the inputs of a compiled decode
//! block ([`crate::decode`]): [`Flat::put`] appends a structure's arrays
//! (and what else shapes the traced function to the block's key),
//! [`Flat::take`] rebuilds it from the traced inputs. A struct of weights
//! derives it (`#[derive(Flat)]`, archgen-core-derive); enums and the
//! leaf layers write it by hand. It sits at the bottom of the crate, so the
//! blocks' modules derive it without reaching up into `decode`.

use mlx_rs::Array;

use crate::layers::Linear;

pub(crate) use archgen_core_derive::Flat;

/// A block's inputs flattened to arrays, and the key of everything else the
/// traced function depends on (shapes and dtypes are MLX's own cache key).
pub(crate) struct Packed {
    pub(crate) key: Vec<i64>,
    pub(crate) arrays: Vec<Array>,
}

impl Packed {
    pub(crate) fn new(block: i64) -> Self {
        Packed {
            key: vec![block],
            arrays: Vec::with_capacity(32),
        }
    }

    /// Which variant of an enum follows (`tag`, into the key), then the
    /// arrays of its one payload.
    pub(crate) fn put_variant(&mut self, tag: i64, payload: &impl Flat) {
        self.key.push(tag);
        payload.put(self);
    }
}

/// The stand-in for arrays a rebuilt structure carries but the block does
/// not read (and for templates).
pub(crate) fn placeholder() -> Array {
    Array::from_f32(0.0)
}

/// `t`'s structure with every array a placeholder: the templates kept in
/// `decode`'s compiled blocks must not hold a model's weights after the model is dropped.
pub(crate) fn hollow<T: Flat>(t: &T) -> T {
    let mut p = Packed::new(0);
    t.put(&mut p);
    let stand_ins = vec![placeholder(); p.arrays.len()];
    t.take(&mut stand_ins.iter())
}

pub(crate) fn next(it: &mut std::slice::Iter<'_, Array>) -> Array {
    it.next()
        .expect("compiled decode block: fewer inputs than packed")
        .clone()
}

/// Flattening of weight structures into the compiled block's inputs:
/// `put` appends the arrays (and the structure to the key), `take`
/// rebuilds the structure from the traced inputs, with `self` as template.
pub(crate) trait Flat: Sized {
    fn put(&self, p: &mut Packed);
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self;
}

/// A linear layer a block does not use (`o_proj` before attention): no
/// arrays of its own travel for it.
pub(crate) fn unused_linear() -> Linear {
    Linear {
        weight: placeholder(),
        quant: None,
        weight_t: None,
        bias: None,
    }
}

impl Flat for Array {
    fn put(&self, p: &mut Packed) {
        p.arrays.push(self.clone());
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        next(it)
    }
}

impl<T: Flat> Flat for Option<T> {
    fn put(&self, p: &mut Packed) {
        p.key.push(self.is_some() as i64);
        if let Some(t) = self {
            t.put(p);
        }
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        self.as_ref().map(|t| t.take(it))
    }
}

impl<A: Flat, B: Flat> Flat for (A, B) {
    fn put(&self, p: &mut Packed) {
        self.0.put(p);
        self.1.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let a = self.0.take(it);
        (a, self.1.take(it))
    }
}

impl<A: Flat, B: Flat, C: Flat> Flat for (A, B, C) {
    fn put(&self, p: &mut Packed) {
        self.0.put(p);
        self.1.put(p);
        self.2.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let a = self.0.take(it);
        let b = self.1.take(it);
        (a, b, self.2.take(it))
    }
}
