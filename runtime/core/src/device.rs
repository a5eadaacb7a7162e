//! Device and decode policy: which path one-token steps take on MLX's
//! default device, and the switches that choose it. It sits at the bottom of
//! the runtime (it imports nothing of this crate) so that the blocks that
//! change form with the device (RoPE's tables, one-token attention) and the
//! compiled decode blocks above them all read one answer.

/// How one-token steps of generated models run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The eager blocks, as prefill runs them: with `ARCHGEN_GPU_DECODE=0`
    /// on a GPU, on Metal unless `ARCHGEN_GPU_DECODE=1`, and everywhere
    /// with `ARCHGEN_EAGER_DECODE=1`.
    Eager,
    /// The CPU: compiled blocks that reproduce MLX's CPU fallbacks of
    /// `fast.rms_norm` and `fast.rope` op for op (there the fast ops *are*
    /// those op graphs), with the norms' float32 constants as inputs and
    /// RoPE from per-step cos/sin tables ([`crate::rope::Rope::fallback_tables`]).
    CpuFallbacks,
    /// A GPU (MLX's CUDA or Metal backend): compiled blocks in which
    /// `fast.rms_norm`, `fast.rope` and scaled dot-product attention stay
    /// MLX's single primitives with their own kernels, exactly as the eager
    /// blocks call them (their eps, base and scale are kernel arguments, not
    /// source text); only the elementwise glue between them is fused.
    /// The default on CUDA, where an H200 measured it byte-identical to the
    /// eager blocks and to mlx-lm for every family (docs/parity.md, "On the
    /// GPU", lists the cases and how to rerun them with
    /// `runtime/mlx-cuda/parity.sh`); opt-in on Metal, never measured.
    NativeFastOps,
}

/// The path of one-token steps on MLX's default device (the switches are
/// read once):
/// [`Path::CpuFallbacks`] on the CPU; on a GPU [`Path::NativeFastOps`]
/// (on Metal only with `ARCHGEN_GPU_DECODE=1`), or [`Path::Eager`] with
/// `ARCHGEN_GPU_DECODE=0`; [`Path::Eager`] everywhere when
/// `ARCHGEN_EAGER_DECODE=1` (paired A/B of the same binary).
///
/// `ARCHGEN_GPU_DECODE=cpu-too` takes [`Path::NativeFastOps`] on the CPU as
/// well: a wiring check of the GPU blocks on a machine without one (the CPU
/// then runs MLX's op graphs for the fast ops, compiled with their float
/// constants inlined, so equal bits there are not promised).
pub fn path() -> Path {
    static SWITCHES: std::sync::OnceLock<(Option<bool>, Option<bool>, bool)> =
        std::sync::OnceLock::new();
    let (eager, gpu, cpu_too) = *SWITCHES.get_or_init(|| {
        let set = |name: &str| std::env::var_os(name).map(|v| !v.is_empty() && v != "0");
        let cpu_too = std::env::var_os("ARCHGEN_GPU_DECODE").is_some_and(|v| v == "cpu-too");
        (
            set("ARCHGEN_EAGER_DECODE"),
            set("ARCHGEN_GPU_DECODE"),
            cpu_too,
        )
    });
    match (eager, on_cpu(), gpu) {
        (Some(true), _, _) => Path::Eager,
        (_, true, _) if cpu_too => Path::NativeFastOps,
        (_, true, _) => Path::CpuFallbacks,
        (_, false, Some(true)) => Path::NativeFastOps,
        (_, false, None) if MEASURED_GPU => Path::NativeFastOps,
        (_, false, None | Some(false)) => Path::Eager,
    }
}

/// Whether this build's GPU backend is the one the GPU path was measured on
/// (CUDA, on Linux); on macOS the GPU is Metal, whose compiler was never
/// checked against the eager kernels, so the path stays opt-in there.
const MEASURED_GPU: bool = !cfg!(target_os = "macos");

/// Whether MLX's default device is the CPU.
fn on_cpu() -> bool {
    mlx_rs::Device::try_default()
        .and_then(|d| d.get_type())
        .is_ok_and(|t| matches!(t, mlx_rs::DeviceType::Cpu))
}

/// Which blocks [`Path::NativeFastOps`] compiles: a bisection aid for the
/// device (`ARCHGEN_GPU_DECODE_BLOCKS=pre|post|none`; unset: every block).
/// `pre` compiles only the block before attention (norm, projections, RoPE),
/// `post` only the blocks after it; the others run the same ops eagerly, so
/// `none` isolates what the path changes besides fusion (its rows form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuBlocks {
    All,
    PreAttention,
    PostAttention,
    None,
}

pub fn gpu_blocks() -> GpuBlocks {
    static BLOCKS: std::sync::OnceLock<GpuBlocks> = std::sync::OnceLock::new();
    *BLOCKS.get_or_init(
        || match std::env::var("ARCHGEN_GPU_DECODE_BLOCKS").as_deref() {
            Ok("pre") => GpuBlocks::PreAttention,
            Ok("post") => GpuBlocks::PostAttention,
            Ok("none") => GpuBlocks::None,
            _ => GpuBlocks::All,
        },
    )
}

/// Whether one unmasked query token attends through
/// [`crate::attention::sdpa_one_token`] (grouped heads as rows of one
/// matmul) rather than `fast.scaled_dot_product_attention`: on the CPU,
/// whose SDPA fallback it reproduces. On a GPU the fused SDPA kernel or the
/// fallback's broadcast matmuls may pick other kernels than the grouped
/// matmul, so it stays off there unless `ARCHGEN_GPU_ONE_TOKEN_SDPA=1`
/// (an experiment, see docs/benchmarks.md).
pub fn one_token_sdpa() -> bool {
    static GPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    on_cpu()
        || *GPU.get_or_init(|| {
            std::env::var_os("ARCHGEN_GPU_ONE_TOKEN_SDPA").is_some_and(|v| v == "1")
        })
}

/// How often mlx-lm returns MLX's buffer pool to the system while
/// generating: `generate_step` every 256 tokens of one sequence,
/// `BatchGenerator` every 512 steps of its generation batch. Both also
/// return it after every prefill chunk.
pub const SEQUENCE_TOKENS_PER_POOL_RELEASE: usize = 256;
pub const BATCH_STEPS_PER_POOL_RELEASE: usize = 512;

/// `mx.clear_cache()`: the buffers MLX keeps for reuse after the arrays
/// that held them are gone go back to the system. mlx-lm calls it after
/// each prefill chunk and every few hundred decode steps; without it the
/// pool keeps the high-water mark of every shape a server has run (on an
/// H200 after 16 and 64 clients, archgen held 104,681 MiB of GPU memory
/// where mlx-lm held 55,207 MiB; with it, 55,977 MiB). Values are
/// unchanged: it frees only buffers no array holds.
pub fn release_buffer_pool() -> Result<(), mlx_rs::error::Exception> {
    mlx_rs::memory::clear_cache()
}
