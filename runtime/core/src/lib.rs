//! archgen's one kernel layer on mlx-rs: every model, generated or monolith,
//! calls these blocks, so layer math exists once. The decoder blocks of
//! every family are in `blocks`, parameterised by block-IR facts.
//!
//! A model is anything that implements [`model::CausalLm`]: a generated model
//! (the `archgen-generated` crate), one that `archgen_macros::specialize!`
//! makes in your crate, or the monolith. [`weights`] loads checkpoints;
//! [`protocol::run_logits`] is the logits protocol that parity is defined on.
//!
//! Building it on Linux links the libmlx of archgen's pinned Python wheel:
//! inside archgen's workspace its `.cargo/config.toml` does that; a crate of
//! your own needs one setup step, `runtime/mlx-linux/use-in-crate.sh` (see
//! "Using a spec from your own crate" in docs/adding-a-model.md). On macOS
//! mlx-rs builds MLX with Metal.
//!
//! # Example
//!
//! Greedy decoding with any model, as `archgen logits` runs it:
//!
//! ```no_run
//! use archgen_runtime::model::CausalLm;
//! use archgen_runtime::protocol::run_logits;
//!
//! /// The next `n` greedy tokens after `prompt`.
//! fn continue_greedily<M: CausalLm>(model: &M, prompt: &[i32], n: usize) -> Vec<i32> {
//!     let run = run_logits(model, prompt, n).expect("MLX evaluation");
//!     run.tokens.as_slice::<i32>().to_vec()
//! }
//! ```

pub mod attention;
pub mod batch;
pub mod batch_blocks;
pub mod batch_deltanet;
pub mod batch_kv;
pub mod batch_quant;
pub mod batch_session;
pub mod blocks;
pub mod bytes;
pub mod cache;
pub mod cuda_kernels;
pub mod decode;
pub mod deltanet;
pub mod device;
pub mod distributed;
pub mod feed_forward;
mod flat;
pub mod layers;
pub mod mla;
pub mod mlx_c;
pub mod model;
pub mod moe;
pub mod ops;
pub mod protocol;
pub mod rope;
pub mod seq_cache;
pub mod short_conv;
pub mod weights;

pub use mlx_rs;
pub use mlx_rs::{Array, Dtype};

/// mlx-rs seeds its default random state from Mach's `mach_approximate_time`,
/// which only Apple platforms have; without this symbol any binary that links
/// mlx-rs's unseeded random paths fails to link on Linux. Seeded calls never
/// read it.
#[cfg(not(target_vendor = "apple"))]
#[unsafe(no_mangle)]
pub extern "C" fn mach_approximate_time() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
