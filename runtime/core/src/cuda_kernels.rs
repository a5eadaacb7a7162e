//! Custom CUDA kernels: the L3 levers that run several of MLX's kernels of a
//! one-token step as one kernel of ours, through mlx-c's
//! `mlx_fast_cuda_kernel` (MLX compiles the source with NVRTC once per
//! template set and caches it on disk like its own JIT kernels).
//!
//! A decode step on an H200 launches about 1,300 kernels for gemma4-12b, two
//! thirds of them small ones whose fixed cost sets their time
//! (docs/benchmarks.md, "L3 levers on the H200"). No oracle runs our
//! kernels, so every lever here is L3: its closeness to L1 is measured on the
//! device, never assumed.
//!
//! [`head_norm_rope`]: after a layer's Q/K/V projections of one token per
//! row, the per-head RMSNorms of Q and K, V's scale-free RMSNorm and the
//! RoPE of Q and K (three norms, two rotations and their layout copies) are
//! one kernel. It does what those kernels do, in the order they do it: each
//! head's sum of squares is taken by as many threads, over the same
//! elements, in the same order, as MLX's `rms_norm_small` takes it
//! ([`NormThreads`]), the norm's output is rounded to the model's dtype and
//! multiplied by its weight in that dtype, and the rotation is MLX's
//! `rope_single` in float32 from that rounded value.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, Stream};

use crate::mlx_c::with_captured_error;
use crate::ops::Result;
use crate::rope::{Rope, RopeTables};

/// One token's Q/K/V projections per row, as the layer computed them.
pub enum QkvRows {
    /// One stacked matmul's output `[B, (H + KV + V) * D]`: the query rows,
    /// then the keys', then the values' when the layer has its own
    /// (`own_values`; otherwise V is the keys' projection).
    Stacked { qkv: Array, own_values: bool },
    /// Three matmuls' outputs `[B, H * D]`, `[B, KV * D]`, and the values'
    /// (`None`: V is the keys' projection).
    Separate {
        q: Array,
        k: Array,
        v: Option<Array>,
    },
}

/// The heads' geometry and norms of a layer for [`head_norm_rope`].
#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    /// eps of the q/k/v norms.
    pub eps: f32,
    /// Whether V goes through a scale-free RMSNorm (Gemma-4).
    pub value_norm: bool,
}

/// The largest head the kernel holds in shared memory (4 KiB of float32).
pub const MAX_HEAD_DIM: i32 = 1024;

/// How MLX's CUDA `rms_norm` splits one row of `axis` elements of a dtype
/// of `itemsize` bytes (`dispatch_num_chunks` in its rms_norm.cu, 0.32):
/// `threads` threads, each reading `chunks` runs of 16 bytes
/// (`16 / itemsize` elements), run `c` of thread `t` starting at element
/// `(threads * c + t) * 16 / itemsize`; each thread sums its squares in
/// that order, then the block sums across threads. The kernel takes the same
/// split, so its normalizers are MLX's to the bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NormThreads {
    threads: i32,
    chunks: i32,
}

impl NormThreads {
    /// `None` for rows MLX normalizes with its other kernel (over
    /// `16 / itemsize * 128 * 8` elements).
    fn of(axis: i32, itemsize: i32) -> Option<NormThreads> {
        let reads = 16 / itemsize;
        if axis > reads * 128 * 8 {
            return None;
        }
        let vectors = (axis + reads - 1) / reads;
        let (threads, chunks) = if axis <= reads * 64 {
            (64, 1)
        } else if vectors % 128 == 0 && vectors / 128 <= 8 {
            (128, vectors / 128)
        } else if vectors % 64 == 0 && vectors / 64 <= 8 {
            (64, vectors / 64)
        } else {
            (128, (vectors + 127) / 128)
        };
        Some(NormThreads { threads, chunks })
    }
}

/// Why [`head_norm_rope`] cannot run a layer's step; the caller then runs
/// MLX's kernels as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotEligible {
    /// The model's dtype is not one the kernel is written for.
    Dtype,
    /// A head wider than [`MAX_HEAD_DIM`], or of odd size.
    HeadDim,
    /// A norm weight of another dtype than the projections.
    NormDtype,
    /// RoPE periods that are not float32, or offsets neither one nor one per row.
    Rope,
}

/// The queries `[B, H, 1, D]`, keys and values `[B, KV, 1, D]` of one token
/// per row: Q and K normed per head with `q_norm` and `k_norm` (weights
/// `[D]`), V normed without a scale when `shape.value_norm`, Q and K rotated
/// as `rope` says at its offset (one, or one per row). One kernel launch for
/// the whole layer. `Err(NotEligible)` before anything is built when the
/// kernel does not cover the layer.
pub fn head_norm_rope(
    rows: &QkvRows,
    q_norm: &Array,
    k_norm: &Array,
    shape: HeadShape,
    rope: &RopeTables,
) -> Result<std::result::Result<[Array; 3], NotEligible>> {
    let first = match rows {
        QkvRows::Stacked { qkv, .. } => qkv,
        QkvRows::Separate { q, .. } => q,
    };
    let dtype = first.dtype();
    if !matches!(dtype, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32) {
        return Ok(Err(NotEligible::Dtype));
    }
    let d = shape.head_dim;
    if d > MAX_HEAD_DIM || d % 2 != 0 {
        return Ok(Err(NotEligible::HeadDim));
    }
    if q_norm.dtype() != dtype || k_norm.dtype() != dtype {
        return Ok(Err(NotEligible::NormDtype));
    }
    let Some(norm_threads) = NormThreads::of(d, first.item_size() as i32) else {
        return Ok(Err(NotEligible::HeadDim));
    };
    let b = first.shape()[0];
    let rotation = match Rotation::of(rope, b)? {
        Some(r) => r,
        None => return Ok(Err(NotEligible::Rope)),
    };
    let (h, kv) = (shape.n_heads, shape.n_kv_heads);
    let params = kernel_params(shape.eps, rotation.base_log2, rotation.scale)?;
    let (variant, inputs): (Variant, Vec<&Array>) = match rows {
        QkvRows::Stacked { qkv, .. } => (
            Variant::Stacked,
            vec![
                qkv,
                q_norm,
                k_norm,
                &rotation.offset,
                &rotation.periods,
                &params,
            ],
        ),
        QkvRows::Separate { q, k, v } => (
            Variant::Separate,
            vec![
                q,
                k,
                v.as_ref().unwrap_or(k),
                q_norm,
                k_norm,
                &rotation.offset,
                &rotation.periods,
                &params,
            ],
        ),
    };
    let templates = [
        TemplateArg::Dtype("T", dtype),
        TemplateArg::Int("D", d),
        TemplateArg::Int("NT", norm_threads.threads),
        TemplateArg::Int("CHUNKS", norm_threads.chunks),
        TemplateArg::Int("HQ", h),
        TemplateArg::Int("HK", kv),
        TemplateArg::Int("ROT", rotation.dims),
        TemplateArg::Bool("PERIODS", rotation.from_periods),
        TemplateArg::Bool("V_NORM", shape.value_norm),
        TemplateArg::Bool(
            "V_OWN",
            match rows {
                QkvRows::Stacked { own_values, .. } => *own_values,
                QkvRows::Separate { v, .. } => v.is_some(),
            },
        ),
        TemplateArg::Bool("OFFSET_PER_ROW", rotation.per_row),
    ];
    let outputs = [
        (vec![b, h, 1, d], dtype),
        (vec![b, kv, 1, d], dtype),
        (vec![b, kv, 1, d], dtype),
    ];
    let grid = (norm_threads.threads, b * (h + 2 * kv), 1);
    let out = KERNELS.with(|k| -> Result<Vec<Array>> {
        let mut kernels = k.borrow_mut();
        let kernel = match kernels.entry(variant) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(variant.build()?),
        };
        kernel.apply(
            &inputs,
            &outputs,
            grid,
            (norm_threads.threads, 1, 1),
            &templates,
        )
    })?;
    let [q, k, v] = <[Array; 3]>::try_from(out)
        .map_err(|_| Exception::custom("head_norm_rope: the kernel gave other than 3 outputs"))?;
    Ok(Ok([q, k, v]))
}

/// What the kernel needs of this step's RoPE.
struct Rotation {
    /// The rotated dims (0: no rotation, [`RopeTables::NoPe`]).
    dims: i32,
    /// Whether the inverse frequencies are `1 / periods` (`fast.rope`'s
    /// `freqs=`) rather than `base ** (-i / (dims / 2))`.
    from_periods: bool,
    /// The periods (float32 `[dims / 2]`), or a placeholder.
    periods: Array,
    /// `log2(base)` as `fast.rope` passes it to its kernel.
    base_log2: f32,
    scale: f32,
    /// int32 `[1]` or `[B]`.
    offset: Array,
    per_row: bool,
}

impl Rotation {
    fn of(t: &RopeTables, rows: i32) -> Result<Option<Rotation>> {
        let placeholder = || constant(Constant::NoPeriods);
        let (rope, offset) = match t {
            RopeTables::Native { rope, offset } => (rope, offset),
            RopeTables::NoPe => {
                return Rotation::none(constant(Constant::ZeroOffset)?, false).map(Some)
            }
            // The CPU path's tables: the kernel runs on CUDA only.
            RopeTables::Fallback(_) => return Ok(None),
        };
        let offset = match offset.dtype() {
            Dtype::Int32 => offset.reshape(&[-1])?,
            _ => offset.as_dtype(Dtype::Int32)?.reshape(&[-1])?,
        };
        let per_row = match offset.size() as i32 {
            1 => false,
            n if n == rows => true,
            _ => return Ok(None),
        };
        Ok(match rope {
            Rope::Base { dims, base, scale } => Some(Rotation {
                dims: *dims,
                from_periods: false,
                periods: placeholder()?,
                // `fast.rope` hands its kernel `std::log2(base)`.
                base_log2: base.log2(),
                scale: *scale,
                offset,
                per_row,
            }),
            Rope::Freqs { dims, freqs } if freqs.dtype() == Dtype::Float32 => Some(Rotation {
                dims: *dims,
                from_periods: true,
                periods: freqs.clone(),
                base_log2: 0.0,
                scale: 1.0,
                offset,
                per_row,
            }),
            Rope::Freqs { .. } => None,
            // YaRN's input scale and interleaved pairs are not the kernel's.
            Rope::Yarn(_) => None,
            Rope::NoPe => Some(Rotation::none(offset, per_row)?),
        })
    }

    /// No rotation (a layer without RoPE): the kernel reads neither the
    /// periods nor the offset.
    fn none(offset: Array, per_row: bool) -> Result<Rotation> {
        Ok(Rotation {
            dims: 0,
            from_periods: false,
            periods: constant(Constant::NoPeriods)?,
            base_log2: 0.0,
            scale: 1.0,
            offset,
            per_row,
        })
    }
}

/// The inputs a rotation without periods or offset still passes (the
/// kernel reads neither): made once and kept on the device, so that a step
/// does not hand the kernel an array fresh from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Constant {
    NoPeriods,
    ZeroOffset,
}

fn constant(which: Constant) -> Result<Array> {
    thread_local! {
        static CONSTANTS: RefCell<HashMap<Constant, Array>> = RefCell::new(HashMap::new());
    }
    CONSTANTS.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(a) = c.get(&which) {
            return Ok(a.clone());
        }
        let a = match which {
            Constant::NoPeriods => Array::from_slice(&[0f32], &[1]),
            Constant::ZeroOffset => Array::from_slice(&[0i32], &[1]),
        };
        a.eval()?;
        c.insert(which, a.clone());
        Ok(a)
    })
}

/// `[eps, log2(base), scale]` as one float32 input, kept per value set so a
/// step does not build it again.
fn kernel_params(eps: f32, base_log2: f32, scale: f32) -> Result<Array> {
    thread_local! {
        static PARAMS: RefCell<HashMap<[u32; 3], Array>> = RefCell::new(HashMap::new());
    }
    let key = [eps.to_bits(), base_log2.to_bits(), scale.to_bits()];
    PARAMS.with(|p| {
        let mut p = p.borrow_mut();
        if let Some(a) = p.get(&key) {
            return Ok(a.clone());
        }
        let a = Array::from_slice(&[eps, base_log2, scale], &[3]);
        a.eval()?;
        p.insert(key, a.clone());
        Ok(a)
    })
}

/// The two forms of the kernel, by how the projections arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Variant {
    /// One input row of Q, K and V's projections; whether V has rows of its
    /// own is the template value `V_OWN`, not another source.
    Stacked,
    Separate,
}

impl Variant {
    fn build(self) -> Result<CudaKernel> {
        let (name, inputs, rows) = match self {
            Variant::Stacked => (
                "archgen_head_norm_rope_stacked",
                &["qkv", "q_norm", "k_norm", "offset", "periods", "params"][..],
                STACKED_ROWS,
            ),
            Variant::Separate => (
                "archgen_head_norm_rope_separate",
                &[
                    "q", "k", "v", "q_norm", "k_norm", "offset", "periods", "params",
                ][..],
                SEPARATE_ROWS,
            ),
        };
        let source = format!("{rows}\n{HEAD_NORM_ROPE_BODY}");
        CudaKernel::new(name, inputs, &["q_out", "k_out", "v_out"], &source, "")
    }
}

/// Where row `b`'s query, key and value projections start, from one stacked
/// matmul's output.
const STACKED_ROWS: &str = r#"
  constexpr int ROW = (HQ + HK + (V_OWN ? HK : 0)) * D;
  const int b = blockIdx.y / (HQ + 2 * HK);
  const T* q_row = qkv + (long long)b * ROW;
  const T* k_row = q_row + HQ * D;
  const T* v_row = V_OWN ? k_row + HK * D : k_row;
"#;

/// The same from three matmuls' outputs (`v` is `k` when V is the keys'
/// projection).
const SEPARATE_ROWS: &str = r#"
  const int b = blockIdx.y / (HQ + 2 * HK);
  const T* q_row = q + (long long)b * HQ * D;
  const T* k_row = k + (long long)b * HK * D;
  const T* v_row = V_OWN ? v + (long long)b * HK * D : k_row;
"#;

/// One block per (row, head) of Q, K and V, of `NT` threads: the head's
/// values in shared memory as float32; the norm as MLX's `rms_norm_small`
/// computes it (thread `t` sums the squares of its `CHUNKS` runs of
/// `16 / sizeof(T)` elements in order, a butterfly sum within each warp, the
/// warps' sums summed the same way; `rsqrt(sum / D + eps)`; the product
/// rounded to T, times the weight in T); then MLX's `rope_single` (float32
/// rotation of the rounded values; `exp2(-d * log2(base))` or `1 / period`
/// per pair, the position times the scale), the unrotated tail copied.
const HEAD_NORM_ROPE_BODY: &str = r#"
  constexpr int N_READS = 16 / sizeof(T);
  const int head = blockIdx.y % (HQ + 2 * HK);
  const int tid = threadIdx.x;
  const T* src;
  T* dst;
  const T* weight = nullptr;
  bool norm;
  bool rotate;
  if (head < HQ) {
    src = q_row + head * D;
    dst = q_out + ((long long)b * HQ + head) * D;
    weight = q_norm;
    norm = true;
    rotate = true;
  } else if (head < HQ + HK) {
    const int j = head - HQ;
    src = k_row + j * D;
    dst = k_out + ((long long)b * HK + j) * D;
    weight = k_norm;
    norm = true;
    rotate = true;
  } else {
    const int j = head - HQ - HK;
    src = v_row + j * D;
    dst = v_out + ((long long)b * HK + j) * D;
    norm = V_NORM;
    rotate = false;
  }
  __shared__ float vals[D];
  __shared__ float partial[32];
  float ss = 0.0f;
  for (int c = 0; c < CHUNKS; c++) {
    const int first = (NT * c + tid) * N_READS;
    for (int j = 0; j < N_READS; j++) {
      const int i = first + j;
      float t = 0.0f;
      if (i < D) {
        t = static_cast<float>(src[i]);
        vals[i] = t;
      }
      ss += t * t;
    }
  }
  // Each thread then writes elements other threads loaded.
  __syncthreads();
  if (norm) {
    for (int o = 16; o > 0; o >>= 1) {
      ss += __shfl_xor_sync(0xffffffff, ss, o);
    }
    if (NT > 32) {
      if ((tid & 31) == 0) {
        partial[tid >> 5] = ss;
      }
      __syncthreads();
      ss = (tid & 31) < (NT >> 5) ? partial[tid & 31] : 0.0f;
      for (int o = 16; o > 0; o >>= 1) {
        ss += __shfl_xor_sync(0xffffffff, ss, o);
      }
    }
    const float inv = rsqrtf(ss / static_cast<float>(D) + params[0]);
    for (int i = tid; i < D; i += NT) {
      const T y = static_cast<T>(vals[i] * inv);
      vals[i] = static_cast<float>(weight != nullptr ? static_cast<T>(weight[i] * y) : y);
    }
  }
  __syncthreads();
  if (rotate && ROT > 0) {
    constexpr int HALF = ROT / 2;
    const int offset_here = OFFSET_PER_ROW ? offset[b] : offset[0];
    const float position = params[2] * static_cast<float>(offset_here);
    for (int i = tid; i < HALF; i += NT) {
      float inv_freq;
      if (PERIODS) {
        inv_freq = 1.0 / periods[i];
      } else {
        const float d = static_cast<float>(i) / static_cast<float>(HALF);
        inv_freq = exp2f(-d * params[1]);
      }
      const float theta = position * inv_freq;
      const float c = cosf(theta);
      const float s = sinf(theta);
      const float x1 = vals[i];
      const float x2 = vals[i + HALF];
      dst[i] = static_cast<T>(x1 * c - x2 * s);
      dst[i + HALF] = static_cast<T>(x1 * s + x2 * c);
    }
    for (int i = ROT + tid; i < D; i += NT) {
      dst[i] = static_cast<T>(vals[i]);
    }
  } else {
    for (int i = tid; i < D; i += NT) {
      dst[i] = static_cast<T>(vals[i]);
    }
  }
"#;

thread_local! {
    /// The kernels built so far on this thread (the model's thread), kept
    /// for the process: MLX keys its compiled modules by source and
    /// template values, so building one again would only repeat work.
    static KERNELS: RefCell<HashMap<Variant, CudaKernel>> = RefCell::new(HashMap::new());
}

/// A compile-time constant of a kernel (`constexpr` or `using` in its body).
enum TemplateArg {
    Int(&'static str, i32),
    Bool(&'static str, bool),
    Dtype(&'static str, Dtype),
}

/// An mlx-c custom CUDA kernel handle.
struct CudaKernel {
    raw: mlx_sys::mlx_fast_cuda_kernel,
}

impl CudaKernel {
    fn new(
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
    ) -> Result<CudaKernel> {
        let c = |s: &str| {
            CString::new(s).map_err(|_| Exception::custom("custom kernel text holds a NUL byte"))
        };
        let strings = |names: &[&str]| -> Result<mlx_sys::mlx_vector_string> {
            let v = unsafe { mlx_sys::mlx_vector_string_new() };
            for n in names {
                let n = c(n)?;
                unsafe { mlx_sys::mlx_vector_string_append_value(v, n.as_ptr()) };
            }
            Ok(v)
        };
        let (name, source, header) = (c(name)?, c(source)?, c(header)?);
        let (ins, outs) = (strings(inputs)?, strings(outputs)?);
        let mut raw = None;
        let built = with_captured_error("custom CUDA kernel", || {
            let k = unsafe {
                mlx_sys::mlx_fast_cuda_kernel_new(
                    name.as_ptr(),
                    ins,
                    outs,
                    source.as_ptr(),
                    header.as_ptr(),
                    true,
                    0,
                )
            };
            let ok = !k.ctx.is_null();
            raw = Some(k);
            if ok {
                0
            } else {
                1
            }
        });
        unsafe {
            mlx_sys::mlx_vector_string_free(ins);
            mlx_sys::mlx_vector_string_free(outs);
        }
        built?;
        let raw = raw.ok_or_else(|| Exception::custom("custom CUDA kernel: not built"))?;
        Ok(CudaKernel { raw })
    }

    fn apply(
        &self,
        inputs: &[&Array],
        outputs: &[(Vec<i32>, Dtype)],
        grid: (i32, i32, i32),
        group: (i32, i32, i32),
        templates: &[TemplateArg],
    ) -> Result<Vec<Array>> {
        let config = unsafe { mlx_sys::mlx_fast_cuda_kernel_config_new() };
        let ins = unsafe { mlx_sys::mlx_vector_array_new() };
        let mut outs = unsafe { mlx_sys::mlx_vector_array_new() };
        let names: Vec<CString> = templates
            .iter()
            .map(|t| {
                let n = match t {
                    TemplateArg::Int(n, _) | TemplateArg::Bool(n, _) | TemplateArg::Dtype(n, _) => {
                        n
                    }
                };
                CString::new(*n).unwrap_or_default()
            })
            .collect();
        let stream = Stream::thread_local_or_default();
        let result = with_captured_error("custom CUDA kernel", || unsafe {
            for (shape, dtype) in outputs {
                let status = mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                    config,
                    shape.as_ptr(),
                    shape.len(),
                    *dtype as mlx_sys::mlx_dtype,
                );
                if status != 0 {
                    return status;
                }
            }
            for (t, name) in templates.iter().zip(&names) {
                let status = match t {
                    TemplateArg::Int(_, v) => {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                            config,
                            name.as_ptr(),
                            *v,
                        )
                    }
                    TemplateArg::Bool(_, v) => {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_bool(
                            config,
                            name.as_ptr(),
                            *v,
                        )
                    }
                    TemplateArg::Dtype(_, v) => {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                            config,
                            name.as_ptr(),
                            *v as mlx_sys::mlx_dtype,
                        )
                    }
                };
                if status != 0 {
                    return status;
                }
            }
            let status =
                mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, grid.0, grid.1, grid.2);
            if status != 0 {
                return status;
            }
            let status = mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(
                config, group.0, group.1, group.2,
            );
            if status != 0 {
                return status;
            }
            for a in inputs {
                let status = mlx_sys::mlx_vector_array_append_value(ins, a.as_ptr());
                if status != 0 {
                    return status;
                }
            }
            mlx_sys::mlx_fast_cuda_kernel_apply(&mut outs, self.raw, ins, config, stream.as_ptr())
        });
        let mut arrays = Vec::new();
        if result.is_ok() {
            let n = unsafe { mlx_sys::mlx_vector_array_size(outs) };
            for i in 0..n {
                let mut a = unsafe { mlx_sys::mlx_array_new() };
                let got = unsafe { mlx_sys::mlx_vector_array_get(&mut a, outs, i) };
                // SAFETY: on success mlx-c set `a` to an array we now own.
                match got {
                    0 => arrays.push(unsafe { Array::from_ptr(a) }),
                    _ => unsafe {
                        mlx_sys::mlx_array_free(a);
                    },
                }
            }
        }
        unsafe {
            mlx_sys::mlx_vector_array_free(ins);
            mlx_sys::mlx_vector_array_free(outs);
            mlx_sys::mlx_fast_cuda_kernel_config_free(config);
        }
        result?;
        Ok(arrays)
    }
}

#[cfg(test)]
mod tests {
    use super::NormThreads;

    /// The splits MLX's CUDA rms_norm takes (its `dispatch_num_chunks`)
    /// for the head sizes of the families the kernel covers.
    #[test]
    fn norm_threads_split_rows_as_mlx_does() {
        let split = |axis, itemsize| NormThreads::of(axis, itemsize).map(|n| (n.threads, n.chunks));
        // bfloat16 and float16: 8 elements per read.
        assert_eq!(split(64, 2), Some((64, 1)));
        assert_eq!(split(128, 2), Some((64, 1)));
        assert_eq!(split(256, 2), Some((64, 1)));
        assert_eq!(split(512, 2), Some((64, 1)));
        assert_eq!(split(1024, 2), Some((128, 1)));
        assert_eq!(split(576, 2), Some((128, 1)));
        // float32: 4 elements per read.
        assert_eq!(split(128, 4), Some((64, 1)));
        assert_eq!(split(256, 4), Some((64, 1)));
        assert_eq!(split(512, 4), Some((128, 1)));
        assert_eq!(split(1024, 4), Some((128, 2)));
        assert_eq!(split(768, 4), Some((64, 3)));
        // Rows MLX normalizes with its other kernel.
        assert_eq!(split(8193, 2), None);
        assert_eq!(split(4097, 4), None);
    }
}
