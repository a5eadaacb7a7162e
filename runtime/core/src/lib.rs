//! archgen's one kernel layer on mlx-rs: every model, generated or monolith,
//! calls these blocks, so layer math exists once. The decoder blocks of
//! every family are in `blocks`, parameterised by block-IR facts.

pub mod attention;
pub mod blocks;
pub mod bytes;
pub mod cache;
pub mod decode;
pub mod layers;
pub mod model;
pub mod moe;
pub mod ops;
pub mod protocol;
pub mod rope;
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
