//! The two RoPE forms mlx-lm uses for Gemma-4. They differ in the last bits, so
//! each layer type must use its own: `base=` on sliding layers (`nn.RoPE`),
//! `freqs=` on full layers (`ProportionalRoPE`).

use mlx_rs::{Array, Dtype};

use crate::ops::Result;

#[derive(Debug, Clone)]
pub enum Rope {
    /// `nn.RoPE(dims, traditional=False, base, scale=1.0)`.
    Base { dims: i32, base: f32 },
    /// `ProportionalRoPE`: periods `factor * base**(arange(0, rotated, 2)/dims)`
    /// for the rotated pairs and `inf` (identity) for the rest.
    Freqs { dims: i32, freqs: Array },
}

impl Rope {
    pub fn base(dims: i32, base: f32) -> Self {
        Rope::Base { dims, base }
    }

    /// Builds the periods with the same MLX ops, in f32, as mlx-lm does.
    pub fn proportional(dims: i32, rotated_dims: i32, base: f32, factor: f32) -> Result<Self> {
        let exponents = mlx_rs::ops::arange::<i32, f32>(0, rotated_dims, 2)?
            .divide(Array::from_f32(dims as f32))?;
        let periods = Array::from_f32(base).power(&exponents)?;
        let periods = Array::from_f32(factor).multiply(&periods)?;
        let identity =
            mlx_rs::ops::full::<f32>(&[(dims - rotated_dims) / 2], Array::from_f32(f32::INFINITY))?;
        let freqs = mlx_rs::ops::concatenate(&[periods, identity], 0)?;
        debug_assert_eq!(freqs.dtype(), Dtype::Float32);
        freqs.eval()?;
        Ok(Rope::Freqs { dims, freqs })
    }

    /// Applies rope to `x` [B, heads, L, dims] at `offset` (an int32 scalar
    /// array: mlx-lm passes `mx.array(cache.offset)`).
    pub fn apply(&self, x: &Array, offset: &Array) -> Result<Array> {
        match self {
            Rope::Base { dims, base } => {
                mlx_rs::fast::rope_dynamic(x, *dims, false, *base, 1.0, offset, None)
            }
            Rope::Freqs { dims, freqs } => {
                mlx_rs::fast::rope_dynamic(x, *dims, false, None, 1.0, offset, freqs)
            }
        }
    }
}
