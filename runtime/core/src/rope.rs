//! The RoPE forms mlx-lm uses: `base=` (`nn.RoPE`: Gemma-4 sliding layers,
//! Qwen3, unscaled Llama) and `freqs=` (Gemma-4's `ProportionalRoPE` on full
//! layers, `Llama3RoPE`, and `YarnRoPE` with its input scale and either
//! pairing). The two calls differ in the last bits, so each model must use
//! the form mlx-lm uses for it.

use mlx_rs::ops::indexing::{Ellipsis, IntoStrideBy, TryIndexOp};
use mlx_rs::{Array, Dtype};

use crate::flat::Flat;
use crate::ops::Result;

#[derive(Debug, Clone)]
pub enum Rope {
    /// `nn.RoPE(dims, traditional=False, base, scale)`: `scale` 1.0, or
    /// `1 / factor` for rope_utils' `linear` scaling (the positions times it).
    Base { dims: i32, base: f32, scale: f32 },
    /// `ProportionalRoPE`: periods `factor * base**(arange(0, rotated, 2)/dims)`
    /// for the rotated pairs and `inf` (identity) for the rest.
    Freqs { dims: i32, freqs: Array },
    /// `YarnRoPE` ([`YarnTables`]).
    Yarn(YarnTables),
    /// No rotation: smollm3's `NoPE` module, whose `__call__(x, offset)`
    /// returns `x` itself (no op in the graph).
    NoPe,
}

/// `YarnRoPE`: the `freqs=` form with `traditional` as the module was built
/// ([`Pairs`]), the rotated dims first multiplied by `input_scale` (its
/// `mscale`) where that is not 1.
#[derive(Debug, Clone)]
pub struct YarnTables {
    pub dims: i32,
    pub freqs: Array,
    pub input_scale: Option<Array>,
    pub pairs: Pairs,
}

/// Which dims rotate together (`mx.fast.rope`'s `traditional`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pairs {
    /// `traditional=False`: dim `i` with dim `i + dims / 2`.
    Halves,
    /// `traditional=True`: dim `2i` with dim `2i + 1`.
    Interleaved,
}

impl Pairs {
    /// `mx.fast.rope`'s `traditional` argument.
    pub fn traditional(self) -> bool {
        match self {
            Pairs::Halves => false,
            Pairs::Interleaved => true,
        }
    }
}

/// The scaling numbers of `YarnRoPE` as mlx-lm's `initialize_rope` passes
/// them (Python floats; `beta_fast` 32, `beta_slow` 1, `mscale` 1,
/// `mscale_all_dim` 0 where the config leaves them out).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnScaling {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub mscale: f64,
    pub mscale_all_dim: f64,
}

impl YarnScaling {
    /// `yarn_get_mscale(scale, mscale)`: 1 unless the factor scales up.
    fn get_mscale(&self, mscale: f64) -> f64 {
        if self.factor <= 1.0 {
            1.0
        } else {
            0.1 * mscale * self.factor.ln() + 1.0
        }
    }

    /// The module's `mscale`: the ratio of the two `yarn_get_mscale`s.
    pub fn input_scale(&self) -> f64 {
        self.get_mscale(self.mscale) / self.get_mscale(self.mscale_all_dim)
    }

    /// `yarn_find_correction_dim(num_rotations)`, Python's float arithmetic.
    fn correction_dim(&self, dims: i32, base: f64, num_rotations: f64) -> f64 {
        (f64::from(dims)
            * (self.original_max_position_embeddings
                / (num_rotations * 2.0 * std::f64::consts::PI))
                .ln())
            / (2.0 * base.ln())
    }

    /// `yarn_find_correction_range()`: Python's `math.floor` / `math.ceil`
    /// (ints), clamped to `[0, dims - 1]`.
    fn correction_range(&self, dims: i32, base: f64) -> (f64, f64) {
        let low = self.correction_dim(dims, base, self.beta_fast).floor();
        let high = self.correction_dim(dims, base, self.beta_slow).ceil();
        (low.max(0.0), high.min(f64::from(dims - 1)))
    }
}

impl Rope {
    pub fn base(dims: i32, base: f32) -> Self {
        Rope::base_scaled(dims, base, 1.0)
    }

    /// `nn.RoPE(dims, base=base, scale=scale)` (`scale` the f32 of mlx-lm's
    /// Python float `1 / factor`).
    pub fn base_scaled(dims: i32, base: f32, scale: f32) -> Self {
        Rope::Base { dims, base, scale }
    }

    /// Builds the periods with the same MLX ops, in f32, as mlx-lm does.
    pub fn proportional(dims: i32, rotated_dims: i32, base: f32, factor: f32) -> Result<Self> {
        let periods = Array::from_f32(factor).multiply(&base_periods(base, rotated_dims, dims)?)?;
        let identity =
            mlx_rs::ops::full::<f32>(&[(dims - rotated_dims) / 2], Array::from_f32(f32::INFINITY))?;
        Rope::freqs(dims, mlx_rs::ops::concatenate(&[periods, identity], 0)?)
    }

    /// `Llama3RoPE` (mlx-lm `rope_utils.py`): the frequencies built with the
    /// same MLX ops in f32, each Python float meeting them as a weak f32 scalar
    /// and the Python-side arithmetic done in f64 as Python does it.
    pub fn llama3(
        dims: i32,
        base: f32,
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        old_context_len: f64,
    ) -> Result<Self> {
        let f = |v: f64| Array::from_f32(v as f32);
        let low_freq_wavelen = old_context_len / low_freq_factor;
        let high_freq_wavelen = old_context_len / high_freq_factor;
        let freqs = base_periods(base, dims, dims)?;
        // 2 * mx.pi * freqs: the product of the Python floats first.
        let wavelens = f(2.0 * std::f64::consts::PI).multiply(&freqs)?;
        let freqs = mlx_rs::ops::select(
            &wavelens.gt(f(low_freq_wavelen))?,
            freqs.multiply(f(factor))?,
            &freqs,
        )?;
        let is_medium = wavelens
            .gt(f(high_freq_wavelen))?
            .logical_and(wavelens.lt(f(low_freq_wavelen))?)?;
        let smooth = f(old_context_len)
            .divide(&wavelens)?
            .subtract(f(low_freq_factor))?
            .divide(f(high_freq_factor - low_freq_factor))?;
        let denom = f(1.0).subtract(&smooth)?.divide(f(factor))?.add(&smooth)?;
        let smooth_freqs = freqs.divide(&denom)?;
        Rope::freqs(
            dims,
            mlx_rs::ops::select(&is_medium, &smooth_freqs, &freqs)?,
        )
    }

    /// `YarnRoPE(dims, traditional, base, scaling_factor, ...)` (mlx-lm
    /// `rope_utils.py`): the frequencies built with the same MLX ops in f32,
    /// each Python number meeting them as a weak f32 scalar, the correction
    /// range and `mscale` computed in f64 as Python does.
    pub fn yarn(dims: i32, base: f32, scaling: YarnScaling, pairs: Pairs) -> Result<Self> {
        let f = |v: f64| Array::from_f32(v as f32);
        let (low, mut high) = scaling.correction_range(dims, f64::from(base));
        // yarn_linear_ramp_mask(low, high, dims // 2)
        if low == high {
            high += 0.001;
        }
        let ramp = mlx_rs::ops::arange::<i32, f32>(0, dims / 2, 1)?
            .subtract(f(low))?
            .divide(f(high - low))?;
        let ramp = mlx_rs::ops::clip(&ramp, (f(0.0), f(1.0)))?;
        let freq_mask = f(1.0).subtract(&ramp)?;
        let freq_extra = base_periods(base, dims, dims)?;
        let freq_inter = f(scaling.factor).multiply(&freq_extra)?;
        let blend = freq_inter
            .multiply(&freq_mask)?
            .add(freq_extra.multiply(f(1.0).subtract(&freq_mask)?)?)?;
        let freqs = freq_inter.multiply(&freq_extra)?.divide(&blend)?;
        freqs.eval()?;
        let input_scale = scaling.input_scale();
        Ok(Rope::Yarn(YarnTables {
            dims,
            freqs,
            input_scale: (input_scale != 1.0).then(|| f(input_scale)),
            pairs,
        }))
    }

    /// The `freqs=` form from its float32 periods, evaluated once at load.
    fn freqs(dims: i32, freqs: Array) -> Result<Self> {
        debug_assert_eq!(freqs.dtype(), Dtype::Float32);
        freqs.eval()?;
        Ok(Rope::Freqs { dims, freqs })
    }

    /// Applies rope to `x` [B, heads, L, dims] at `offset` (an int32 scalar
    /// array: mlx-lm passes `mx.array(cache.offset)`).
    pub fn apply(&self, x: &Array, offset: &Array) -> Result<Array> {
        match self {
            Rope::Base { dims, base, scale } => {
                mlx_rs::fast::rope_dynamic(x, *dims, false, *base, *scale, offset, None)
            }
            Rope::Freqs { dims, freqs } => {
                mlx_rs::fast::rope_dynamic(x, *dims, false, None, 1.0, offset, freqs)
            }
            Rope::Yarn(y) => {
                let x = scale_rotated(x, y.dims, y.input_scale.as_ref())?;
                let traditional = y.pairs.traditional();
                mlx_rs::fast::rope_dynamic(&x, y.dims, traditional, None, 1.0, offset, &y.freqs)
            }
            Rope::NoPe => Ok(x.clone()),
        }
    }

    /// The positions' scale (`scale` of `mx.fast.rope`).
    fn scale(&self) -> f32 {
        match self {
            Rope::Base { scale, .. } => *scale,
            Rope::Freqs { .. } | Rope::Yarn(_) | Rope::NoPe => 1.0,
        }
    }

    /// The rotation dims (`dims` of `mx.fast.rope`; 0 without rotation).
    pub fn dims(&self) -> i32 {
        match self {
            Rope::Base { dims, .. } | Rope::Freqs { dims, .. } => *dims,
            Rope::Yarn(y) => y.dims,
            Rope::NoPe => 0,
        }
    }

    /// This step's RoPE for the compiled decode blocks (`decode`), by the
    /// decode path MLX's device takes ([`crate::device::path`]): on the GPU
    /// MLX's own `fast.rope` at `offset` ([`RopeTables::Native`]), elsewhere
    /// the cos/sin tables of its CPU fallback ([`Rope::fallback_tables`]).
    pub fn tables(&self, offset: i32, l: i32, dtype: Dtype) -> Result<RopeTables> {
        self.tables_at(&Array::from_int(offset), l, dtype)
    }

    /// [`Rope::tables`] when `step` (a one-token step on the compiled decode
    /// path), else none: the tables a window's layers share in this forward.
    pub fn step_tables(
        &self,
        step: bool,
        offset: i32,
        l: i32,
        dtype: Dtype,
    ) -> Result<Option<RopeTables>> {
        step.then(|| self.tables(offset, l, dtype)).transpose()
    }

    /// [`Rope::tables`] at `offset`, an int32 scalar (one sequence) or a
    /// vector [B] (a batch, one offset per row, as mlx-lm's `BatchKVCache`
    /// passes `cache.offset` to `mx.fast.rope`).
    pub fn tables_at(&self, offset: &Array, l: i32, dtype: Dtype) -> Result<RopeTables> {
        if let Rope::NoPe = self {
            return Ok(RopeTables::NoPe);
        }
        match crate::device::path() {
            crate::device::Path::NativeFastOps => Ok(RopeTables::Native {
                rope: self.clone(),
                offset: offset.clone(),
            }),
            crate::device::Path::CpuFallbacks | crate::device::Path::Eager => {
                self.fallback_tables(offset, l, dtype)
            }
        }
    }

    /// The cosines and sines [L, dims / 2] of positions `offset..offset + l`,
    /// with the ops of MLX's RoPE fallback (the CPU path of `mx.fast.rope`):
    /// `positions = (arange(L) + offset) * scale`, inverse frequencies
    /// `exp(arange(0, -dims/2, -1) * (log(base) / (dims/2)))` or `1 / freqs`,
    /// `theta = positions[:, None] * inv_freqs`, `cos` / `sin` (float32),
    /// also cast to `dtype` (the fallback casts to the input's dtype). They
    /// depend on the position only, so one step computes them once per RoPE
    /// form and every layer of that form (Q and K alike) reuses them.
    ///
    /// With one offset per row (`offset` [B]), the fallback broadcasts the
    /// offsets over heads and positions ([B, 1, 1]): the tables are
    /// [B, 1, L, dims / 2], row b holding exactly the scalar tables at
    /// `offset[b]` (the same per-element operations).
    pub fn fallback_tables(&self, offset: &Array, l: i32, dtype: Dtype) -> Result<RopeTables> {
        let half = self.dims() / 2;
        let offset = match offset.ndim() {
            0 => offset.clone(),
            _ => offset.reshape(&[-1, 1, 1])?,
        };
        let positions = mlx_rs::ops::arange::<i32, f32>(0, l, 1)?
            .add(&offset)?
            .multiply(Array::from_f32(self.scale()))?;
        let inv_freqs = match self {
            Rope::Base { base, .. } => mlx_rs::ops::arange::<i32, f32>(0, -half, -1)?
                .multiply(Array::from_f32(base.ln() / half as f32))?
                .exp()?,
            Rope::Freqs { freqs, .. } | Rope::Yarn(YarnTables { freqs, .. }) => {
                freqs.reciprocal()?
            }
            Rope::NoPe => return Ok(RopeTables::NoPe),
        };
        let theta = positions.expand_dims(-1)?.multiply(&inv_freqs)?;
        let (cos, sin) = (theta.cos()?, theta.sin()?);
        let (pairs, input_scale) = match self {
            Rope::Yarn(y) => (y.pairs, y.input_scale.clone()),
            Rope::Base { .. } | Rope::Freqs { .. } | Rope::NoPe => (Pairs::Halves, None),
        };
        Ok(RopeTables::Fallback(CosSin {
            dims: self.dims(),
            pairs,
            input_scale,
            cos_t: cos.as_dtype(dtype)?,
            sin_t: sin.as_dtype(dtype)?,
            cos,
            sin,
        }))
    }
}

/// `x.at[..., :dims].multiply(scale)` (`YarnRoPE`'s input scale): the rotated
/// dims times the Python float as `x`'s dtype, the rest unchanged; `x`
/// itself without a scale.
fn scale_rotated(x: &Array, dims: i32, scale: Option<&Array>) -> Result<Array> {
    let Some(scale) = scale else {
        return Ok(x.clone());
    };
    let scaled = x
        .try_index((Ellipsis, ..dims))?
        .multiply(scale.as_dtype(x.dtype())?)?;
    let last = x.shape()[x.ndim() - 1];
    if dims < last {
        mlx_rs::ops::concatenate(&[scaled, x.try_index((Ellipsis, dims..))?], -1)
    } else {
        Ok(scaled)
    }
}

/// `base ** (mx.arange(0, rotated, 2) / dims)` in float32: the periods of
/// the rotated pairs, as `ProportionalRoPE`, `Llama3RoPE` and `YarnRoPE`
/// build them.
fn base_periods(base: f32, rotated: i32, dims: i32) -> Result<Array> {
    let exponents =
        mlx_rs::ops::arange::<i32, f32>(0, rotated, 2)?.divide(Array::from_f32(dims as f32))?;
    Array::from_f32(base).power(&exponents)
}

/// The tables of MLX's RoPE fallback for one step
/// ([`Rope::fallback_tables`]): float32 `cos(theta)` and `sin(theta)`
/// [L, dims / 2], and the same cast to one activation dtype (`cos_t`,
/// `sin_t`); with the pairing and the input scale of the RoPE they rotate
/// for.
#[derive(Debug, Clone, Flat)]
#[flat(key(self.dims, self.pairs.traditional()))]
pub struct CosSin {
    #[flat(copied)]
    pub dims: i32,
    #[flat(copied)]
    pub pairs: Pairs,
    pub input_scale: Option<Array>,
    pub cos: Array,
    pub sin: Array,
    pub cos_t: Array,
    pub sin_t: Array,
}

/// One step's RoPE for the compiled decode blocks ([`Rope::tables`]).
#[derive(Debug, Clone)]
pub enum RopeTables {
    /// [`Rope::fallback_tables`].
    Fallback(CosSin),
    /// MLX's `fast.rope` of `rope` at `offset` (an int32 scalar array), one
    /// primitive with its own kernel on the GPU, as the eager blocks run it.
    Native { rope: Rope, offset: Array },
    /// [`Rope::NoPe`]: nothing to rotate with, `x` passes unchanged.
    NoPe,
}

impl RopeTables {
    /// The rotation dims.
    pub fn dims(&self) -> i32 {
        match self {
            RopeTables::Fallback(t) => t.dims,
            RopeTables::Native { rope, .. } => rope.dims(),
            RopeTables::NoPe => 0,
        }
    }
}

/// RoPE of `x` [B, heads, L, head_dim] from [`Rope::tables`]. From
/// [`RopeTables::Fallback`], the rest of MLX's fallback, op for op: the
/// tables cast to `x`'s dtype, `x1 * cos - x2 * sin` and
/// `x1 * sin + x2 * cos` with `x1`, `x2` the two halves of the rotated dims
/// ([`Pairs::Halves`]: concatenated, then `x[..., dims:]`) or its even and odd
/// dims ([`Pairs::Interleaved`]: interleaved again, then `x[..., dims:]`);
/// `YarnRoPE`'s input scale first where it has one. It has no transcendental
/// functions and no scalar constants, so it can also run inside a compiled
/// function without changing a bit (see `decode`). From
/// [`RopeTables::Native`], [`Rope::apply`].
pub fn apply_tables(x: &Array, t: &RopeTables) -> Result<Array> {
    let t = match t {
        RopeTables::Native { rope, offset } => return rope.apply(x, offset),
        RopeTables::NoPe => return Ok(x.clone()),
        RopeTables::Fallback(t) => t,
    };
    let dims = t.dims;
    let half = dims / 2;
    let x = &scale_rotated(x, dims, t.input_scale.as_ref())?;
    let (cos, sin) = if t.cos_t.dtype() == x.dtype() {
        (t.cos_t.clone(), t.sin_t.clone())
    } else {
        (t.cos.as_dtype(x.dtype())?, t.sin.as_dtype(x.dtype())?)
    };
    let rotate = |x1: &Array, x2: &Array| -> Result<[Array; 2]> {
        Ok([
            x1.multiply(&cos)?.subtract(x2.multiply(&sin)?)?,
            x1.multiply(&sin)?.add(x2.multiply(&cos)?)?,
        ])
    };
    let rest = (dims < x.shape()[3])
        .then(|| x.try_index((Ellipsis, dims..)))
        .transpose()?;
    let mut outs = match t.pairs {
        Pairs::Halves => rotate(
            &x.try_index((Ellipsis, ..half))?,
            &x.try_index((Ellipsis, half..dims))?,
        )?
        .to_vec(),
        Pairs::Interleaved => {
            let even = x.try_index((Ellipsis, (0..dims).stride_by(2)))?;
            let odd = x.try_index((Ellipsis, (1..dims).stride_by(2)))?;
            let [a, b] = rotate(&even, &odd)?;
            let shape = x.shape();
            vec![
                mlx_rs::ops::concatenate(&[a.expand_dims(-1)?, b.expand_dims(-1)?], -1)?
                    .reshape(&[shape[0], shape[1], shape[2], dims])?,
            ]
        }
    };
    outs.extend(rest);
    mlx_rs::ops::concatenate(&outs, -1)
}
