//! mlx-c calls made directly, below mlx-rs, where mlx-rs's wrapper builds
//! another graph than mlx's Python binding does for the same Python line,
//! or has no wrapper: each call runs with MLX's error message captured
//! ([`with_captured_error`]) and its result adopted as an owned [`Array`].

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::ops::Range;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};

use crate::ops::Result;

thread_local! {
    static CAPTURED: RefCell<Option<String>> = const { RefCell::new(None) };
}

extern "C" fn capture_error(msg: *const c_char, _data: *mut c_void) {
    let text = if msg.is_null() {
        String::from("(no message)")
    } else {
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    };
    CAPTURED.with(|c| *c.borrow_mut() = Some(text));
}

unsafe extern "C" {
    /// mlx-rs's process-wide MLX error handler (exported unmangled by
    /// mlx-rs 0.33, `error.rs`); restored after each call of ours.
    fn default_mlx_error_handler(msg: *const c_char, data: *mut c_void);
}

/// Runs one mlx-c call with MLX's error message captured here instead of in
/// mlx-rs's private stash, then puts mlx-rs's handler back. (mlx-rs installs
/// its handler lazily on its first op; one op first makes sure the handler
/// we restore is the one it would install.) The handler is process-wide:
/// an MLX error raised on another thread inside this window would lose its
/// message (the calls wrapped here are group init and building a collective,
/// which archgen makes on the one thread that runs the model).
pub(crate) fn with_captured_error(what: &str, call: impl FnOnce() -> i32) -> Result<()> {
    static MLX_RS_HANDLER: std::sync::Once = std::sync::Once::new();
    MLX_RS_HANDLER.call_once(|| {
        let _ = Array::from_int(0).add(Array::from_int(0));
    });
    unsafe { mlx_sys::mlx_set_error_handler(Some(capture_error), std::ptr::null_mut(), None) };
    let status = call();
    unsafe {
        mlx_sys::mlx_set_error_handler(Some(default_mlx_error_handler), std::ptr::null_mut(), None)
    };
    let message = CAPTURED.with(|c| c.borrow_mut().take());
    match status {
        0 => Ok(()),
        _ => Err(Exception::custom(format!(
            "{what}: {}",
            message.unwrap_or_else(|| format!("MLX returned status {status}"))
        ))),
    }
}

/// `dst[..., at.start:at.end, :] = update` (axis 2, `update` [B, H, n, D]
/// with n = `at.len()`), in place of `dst`,
/// as mlx's Python `__setitem__` builds it: one `SliceUpdate` whose update
/// is `update` itself, strides and all.
///
/// mlx-rs's `try_index_mut` first drops the update's leading size-1 axes
/// and then restores them (two `Reshape`s). A reshape of a strided view is
/// a copy, so for a view (the keys of a layer without RoPE, the values split
/// from a fused `qkv_proj`) MLX's CUDA backend then runs the slice update on
/// a contiguous copy where mlx-lm runs it on the view, and the cache's bits
/// differed from mlx-lm's on the GPU (docs/parity.md, "On the GPU"). The CPU
/// gives the same bits either way.
pub fn write_positions(dst: &mut Array, at: Range<i32>, update: &Array) -> Result<()> {
    let (d, u) = (dst.shape(), update.shape());
    let fits = d.len() == 4
        && u.len() == 4
        && d[0] == u[0]
        && d[1] == u[1]
        && d[3] == u[3]
        && u[2] == at.end - at.start
        && at.start >= 0
        && at.end <= d[2];
    if !fits {
        return Err(Exception::custom(format!(
            "cache write: an update {u:?} for positions {at:?} does not fit a buffer {d:?}"
        )));
    }
    let start = [0, 0, at.start, 0];
    let stop = [d[0], d[1], at.end, d[3]];
    let strides = [1i32; 4];
    let stream = Stream::thread_local_or_default();
    *dst = one_array("slice_update", |res| unsafe {
        mlx_sys::mlx_slice_update(
            res,
            dst.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            stream.as_ptr(),
        )
    })?;
    Ok(())
}

/// An mlx-c call that returns one array, its result adopted as owned.
fn one_array(what: &str, call: impl FnOnce(&mut mlx_sys::mlx_array) -> i32) -> Result<Array> {
    let mut res = unsafe { mlx_sys::mlx_array_new() };
    match with_captured_error(what, || call(&mut res)) {
        // SAFETY: on success mlx-c set `res` to a new array we now own.
        Ok(()) => Ok(unsafe { Array::from_ptr(res) }),
        Err(e) => {
            unsafe { mlx_sys::mlx_array_free(res) };
            Err(e)
        }
    }
}

fn optional_int(value: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int {
        value,
        has_value: true,
    }
}

/// An empty array: mlx-c's "none" for an optional argument.
struct NoArray(mlx_sys::mlx_array);

impl NoArray {
    fn new() -> Self {
        NoArray(unsafe { mlx_sys::mlx_array_new() })
    }
}

impl Drop for NoArray {
    fn drop(&mut self) {
        unsafe { mlx_sys::mlx_array_free(self.0) };
    }
}

/// `mx.quantized_matmul(x, w, scales, None, transpose, group_size, bits,
/// mode=mode)` of a quantization without biases (the microscaling modes:
/// mlx-rs's wrapper always passes "affine").
pub fn quantized_matmul_unbiased(
    x: &Array,
    w: &Array,
    scales: &Array,
    transpose: bool,
    (group_size, bits): (i32, i32),
    mode: &CStr,
) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    let none = NoArray::new();
    one_array("quantized_matmul", |res| unsafe {
        mlx_sys::mlx_quantized_matmul(
            res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            none.0,
            transpose,
            optional_int(group_size),
            optional_int(bits),
            mode.as_ptr(),
            stream.as_ptr(),
        )
    })
}

/// `mx.gather_qmm(x, w, scales, None, rhs_indices=indices, transpose=True,
/// group_size, bits, mode=mode, sorted_indices)` of a quantization without
/// biases (mlx-lm's `QuantizedSwitchLinear` in the microscaling modes).
pub fn gather_qmm_unbiased(
    x: &Array,
    w: &Array,
    scales: &Array,
    indices: &Array,
    (group_size, bits): (i32, i32),
    mode: &CStr,
    sorted: bool,
) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    let (no_biases, no_lhs) = (NoArray::new(), NoArray::new());
    one_array("gather_qmm", |res| unsafe {
        mlx_sys::mlx_gather_qmm(
            res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            no_biases.0,
            no_lhs.0,
            indices.as_ptr(),
            true,
            optional_int(group_size),
            optional_int(bits),
            mode.as_ptr(),
            sorted,
            stream.as_ptr(),
        )
    })
}

/// `mx.dequantize(w, scales, None, group_size, bits, mode=mode)` of a
/// quantization without biases.
pub fn dequantize_unbiased(
    w: &Array,
    scales: &Array,
    (group_size, bits): (i32, i32),
    mode: &CStr,
) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    let (no_biases, no_scale) = (NoArray::new(), NoArray::new());
    let no_dtype = mlx_sys::mlx_optional_dtype {
        value: mlx_sys::mlx_dtype__MLX_FLOAT32,
        has_value: false,
    };
    one_array("dequantize", |res| unsafe {
        mlx_sys::mlx_dequantize(
            res,
            w.as_ptr(),
            scales.as_ptr(),
            no_biases.0,
            optional_int(group_size),
            optional_int(bits),
            mode.as_ptr(),
            no_scale.0,
            no_dtype,
            stream.as_ptr(),
        )
    })
}

/// `mx.quantize(w, group_size, bits, mode=mode)`: the packed weights and
/// the scales, and the biases where the mode has them (affine).
pub fn quantize_with_mode(
    w: &Array,
    (group_size, bits): (i32, i32),
    mode: &CStr,
) -> Result<Vec<Array>> {
    let stream = Stream::thread_local_or_default();
    let no_scale = NoArray::new();
    let mut res = unsafe { mlx_sys::mlx_vector_array_new() };
    let done = with_captured_error("quantize", || unsafe {
        mlx_sys::mlx_quantize(
            &mut res,
            w.as_ptr(),
            optional_int(group_size),
            optional_int(bits),
            mode.as_ptr(),
            no_scale.0,
            stream.as_ptr(),
        )
    });
    let out = done.map(|()| {
        let n = unsafe { mlx_sys::mlx_vector_array_size(res) };
        (0..n)
            .map(|i| {
                let mut a = unsafe { mlx_sys::mlx_array_new() };
                unsafe { mlx_sys::mlx_vector_array_get(&mut a, res, i) };
                // SAFETY: `mlx_vector_array_get` set `a` to a new reference we own.
                unsafe { Array::from_ptr(a) }
            })
            .collect()
    });
    unsafe { mlx_sys::mlx_vector_array_free(res) };
    out
}
