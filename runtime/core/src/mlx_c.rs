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
    let mut res = unsafe { mlx_sys::mlx_array_new() };
    let done = with_captured_error("slice_update", || unsafe {
        mlx_sys::mlx_slice_update(
            &mut res,
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
    });
    match done {
        // SAFETY: on success mlx-c set `res` to a new array we now own.
        Ok(()) => {
            *dst = unsafe { Array::from_ptr(res) };
            Ok(())
        }
        Err(e) => {
            unsafe { mlx_sys::mlx_array_free(res) };
            Err(e)
        }
    }
}
