//! Device and decode policy: which path one-token steps take on MLX's
//! default device, and the switches that choose it. It sits at the bottom of
//! the runtime (it imports nothing of this crate) so that the blocks that
//! change form with the device (RoPE's tables, one-token attention) and the
//! compiled decode blocks above them all read one answer.

/// How one-token steps of generated models run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The eager blocks, as prefill runs them: with `gpu_decode` off
    /// (`ARCHGEN_GPU_DECODE=0`) on a GPU, on Metal unless it is on, and
    /// everywhere with `eager_decode` (`ARCHGEN_EAGER_DECODE=1`).
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

/// The choices behind [`path`], [`gpu_blocks`] and [`one_token_sdpa`],
/// fixed for the process at the first one-token step. A front end sets them
/// once with [`set_decode_choices`] before it runs a model (archgen's
/// levers, runtime/cli/src/levers.rs); without that they are read from the
/// environment variables named here ([`DecodeChoices::from_env`]), so a
/// library user or a benchmark worker keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeChoices {
    /// [`Path::Eager`] everywhere (`ARCHGEN_EAGER_DECODE=1`).
    pub eager_decode: bool,
    /// [`Path::NativeFastOps`] on a GPU (`ARCHGEN_GPU_DECODE=1`, `=0` off).
    pub gpu_decode: bool,
    /// [`Path::NativeFastOps`] on the CPU too (`ARCHGEN_GPU_DECODE=cpu-too`).
    pub gpu_decode_on_cpu: bool,
    /// Which blocks [`Path::NativeFastOps`] compiles (`ARCHGEN_GPU_DECODE_BLOCKS`).
    pub gpu_blocks: GpuBlocks,
    /// Grouped one-token attention on a GPU too (`ARCHGEN_GPU_ONE_TOKEN_SDPA=1`).
    pub gpu_one_token_sdpa: bool,
    /// On the GPU path, a layer's separate projections read as one stacked
    /// matmul: Q/K/V, and gate/up (`ARCHGEN_GPU_STACKED_PROJECTIONS=1`;
    /// [`stacked_projections`]).
    pub gpu_stacked_projections: bool,
    /// On CUDA's GPU path, one custom kernel per layer for the per-head
    /// Q/K/V norms and RoPE of a one-token step
    /// (`ARCHGEN_CUDA_HEAD_NORM_ROPE=1`; [`head_norm_rope_kernel`]).
    pub cuda_head_norm_rope: bool,
    /// On the CPU, a Gated DeltaNet's prompt of several tokens runs the
    /// chunkwise form of its recurrence (`ARCHGEN_DELTANET_CHUNKED_PREFILL=1`;
    /// [`chunked_delta_rule`]).
    pub deltanet_chunked_prefill: bool,
}

pub const EAGER_DECODE_VAR: &str = "ARCHGEN_EAGER_DECODE";
pub const GPU_DECODE_VAR: &str = "ARCHGEN_GPU_DECODE";
pub const GPU_DECODE_BLOCKS_VAR: &str = "ARCHGEN_GPU_DECODE_BLOCKS";
pub const GPU_ONE_TOKEN_SDPA_VAR: &str = "ARCHGEN_GPU_ONE_TOKEN_SDPA";
pub const GPU_STACKED_PROJECTIONS_VAR: &str = "ARCHGEN_GPU_STACKED_PROJECTIONS";
pub const CUDA_HEAD_NORM_ROPE_VAR: &str = "ARCHGEN_CUDA_HEAD_NORM_ROPE";
pub const KEEP_BUFFER_POOL_VAR: &str = "ARCHGEN_KEEP_BUFFER_POOL";
pub const DELTANET_CHUNKED_PREFILL_VAR: &str = "ARCHGEN_DELTANET_CHUNKED_PREFILL";

impl DecodeChoices {
    /// What runs when nothing is set: the compiled blocks of the device, the
    /// GPU path on CUDA only ([`MEASURED_GPU`]), every block compiled, fused
    /// SDPA on a GPU.
    pub const DEFAULT: DecodeChoices = DecodeChoices {
        eager_decode: false,
        gpu_decode: MEASURED_GPU,
        gpu_decode_on_cpu: false,
        gpu_blocks: GpuBlocks::All,
        gpu_one_token_sdpa: false,
        gpu_stacked_projections: false,
        cuda_head_norm_rope: false,
        deltanet_chunked_prefill: false,
    };

    /// The choices the environment variables make: each switch is on at
    /// `1`, `on` or `true` and off at `0`, `off`, `false` or empty (the
    /// values archgen's lever flags read, [`switch_value`]);
    /// `ARCHGEN_GPU_DECODE=cpu-too` also sets
    /// [`DecodeChoices::gpu_decode_on_cpu`]; `ARCHGEN_GPU_DECODE_BLOCKS` is
    /// `all`, `pre`, `post` or `none`. Any other value is an error naming
    /// the variable.
    pub fn from_env() -> Result<DecodeChoices, String> {
        DecodeChoices::from_vars(|name| std::env::var(name).ok())
    }

    /// [`DecodeChoices::from_env`] over `var` (a variable's value, `None`
    /// when unset).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<DecodeChoices, String> {
        let switch = |name: &str, unset: bool| match var(name) {
            None => Ok(unset),
            Some(raw) => switch_value(&raw).ok_or_else(|| {
                format!("{name}={raw}: expected 1, on or true, or 0, off, false or empty")
            }),
        };
        let gpu_decode_on_cpu = var(GPU_DECODE_VAR).as_deref() == Some("cpu-too");
        let gpu_decode = match gpu_decode_on_cpu {
            true => true,
            false => switch(GPU_DECODE_VAR, MEASURED_GPU)?,
        };
        Ok(DecodeChoices {
            eager_decode: switch(EAGER_DECODE_VAR, false)?,
            gpu_decode,
            gpu_decode_on_cpu,
            gpu_blocks: match var(GPU_DECODE_BLOCKS_VAR).as_deref() {
                None | Some("all") => GpuBlocks::All,
                Some("pre") => GpuBlocks::PreAttention,
                Some("post") => GpuBlocks::PostAttention,
                Some("none") => GpuBlocks::None,
                Some(other) => {
                    return Err(format!(
                        "{GPU_DECODE_BLOCKS_VAR}={other}: expected all, pre, post or none"
                    ))
                }
            },
            gpu_one_token_sdpa: switch(GPU_ONE_TOKEN_SDPA_VAR, false)?,
            gpu_stacked_projections: switch(GPU_STACKED_PROJECTIONS_VAR, false)?,
            cuda_head_norm_rope: switch(CUDA_HEAD_NORM_ROPE_VAR, false)?,
            deltanet_chunked_prefill: switch(DELTANET_CHUNKED_PREFILL_VAR, false)?,
        })
    }
}

/// A switch variable's value: `Some(true)` at `1`, `on` or `true`,
/// `Some(false)` at `0`, `off`, `false` or empty, `None` for anything else.
/// One reading for every reader (the runtime, archgen's levers, the bench
/// worker), so a script that sets `on` gets the same run from each.
pub fn switch_value(raw: &str) -> Option<bool> {
    match raw {
        "1" | "on" | "true" => Some(true),
        "" | "0" | "off" | "false" => Some(false),
        _ => None,
    }
}

static CHOICES: std::sync::OnceLock<DecodeChoices> = std::sync::OnceLock::new();

/// Fixes this process's decode choices. `Err` with the choices in force when
/// they were already fixed (set before, or read by a step that ran): a model
/// that has stepped keeps the blocks it compiled.
pub fn set_decode_choices(choices: DecodeChoices) -> Result<(), DecodeChoices> {
    CHOICES.set(choices)?;
    Ok(())
}

/// This process's decode choices: those set by [`set_decode_choices`], else
/// the environment's. A variable with a value it cannot read is reported on
/// stderr once and the defaults run (a front end reads the variables itself
/// first and refuses such a value: archgen's levers, the bench worker).
pub fn decode_choices() -> DecodeChoices {
    *CHOICES.get_or_init(|| {
        DecodeChoices::from_env().unwrap_or_else(|e| {
            eprintln!("archgen runtime: {e}; running the default decode choices");
            DecodeChoices::DEFAULT
        })
    })
}

/// The path of one-token steps on MLX's default device, from
/// [`decode_choices`]:
/// [`Path::CpuFallbacks`] on the CPU; on a GPU [`Path::NativeFastOps`]
/// (by default on CUDA only), or [`Path::Eager`] with `gpu_decode` off;
/// [`Path::Eager`] everywhere with `eager_decode` (paired A/B of the same
/// binary).
///
/// `gpu_decode_on_cpu` takes [`Path::NativeFastOps`] on the CPU as
/// well: a wiring check of the GPU blocks on a machine without one (the CPU
/// then runs MLX's op graphs for the fast ops, compiled with their float
/// constants inlined, so equal bits there are not promised).
pub fn path() -> Path {
    let choices = decode_choices();
    match (choices.eager_decode, on_cpu(), choices.gpu_decode) {
        (true, _, _) => Path::Eager,
        (false, true, _) if choices.gpu_decode_on_cpu => Path::NativeFastOps,
        (false, true, _) => Path::CpuFallbacks,
        (false, false, true) => Path::NativeFastOps,
        (false, false, false) => Path::Eager,
    }
}

/// Whether this build's GPU backend is the one the GPU path was measured on
/// (CUDA, on Linux); on macOS the GPU is Metal, whose compiler was never
/// checked against the eager kernels, so the path stays opt-in there.
pub const MEASURED_GPU: bool = !cfg!(target_os = "macos");

/// Whether MLX's default device is the CPU.
pub(crate) fn on_cpu() -> bool {
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
    decode_choices().gpu_blocks
}

/// Whether a Gated DeltaNet's recurrence over more than one token runs in
/// chunks ([`crate::deltanet::chunked_scan`]): with
/// `deltanet_chunked_prefill` chosen, on the CPU, whose triangular solve it
/// needs (MLX runs that op on the CPU only). Its sums are not mlx-lm's: L3.
pub fn chunked_delta_rule() -> bool {
    decode_choices().deltanet_chunked_prefill && on_cpu()
}

/// Whether one unmasked query token attends through
/// [`crate::attention::sdpa_one_token`] (grouped heads as rows of one
/// matmul) rather than `fast.scaled_dot_product_attention`: on the CPU,
/// whose SDPA fallback it reproduces. On a GPU the fused SDPA kernel or the
/// fallback's broadcast matmuls may pick other kernels than the grouped
/// matmul, so it stays off there unless `gpu_one_token_sdpa` is chosen
/// (an experiment that changes bits there, see docs/parity.md).
pub fn one_token_sdpa() -> bool {
    on_cpu() || decode_choices().gpu_one_token_sdpa
}

/// Whether a generated model's layers stack their separate projections for
/// the GPU path's one-token steps: Q, K and V into one matmul
/// ([`crate::decode::FusedQkv`]) and gate and up into one
/// ([`crate::blocks::GateUp::Stacked`]). A lever (`gpu-stacked-projections`,
/// L3): on a GPU a matmul's kernel, and so its reduction order, is chosen by
/// the output width, so the stacked product is not known to keep each
/// part's bits there. Only where one-token steps take the GPU path and no
/// rank holds a shard (a shard's rows are not the model's heads).
pub fn stacked_projections() -> bool {
    decode_choices().gpu_stacked_projections
        && path() == Path::NativeFastOps
        && !crate::distributed::tensor_parallel()
}

/// How many layers of the models loaded in this process stacked their
/// projections ([`stacked_projections`]), so a run can say what the lever
/// did: some layers cannot stack (a bias, mixed quantization).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StackedCounts {
    pub query_key_value: usize,
    pub gate_up: usize,
}

/// What a lever did once: a layer stacked its projections
/// ([`stacked_projections`]), a one-token step of a K/V-owning layer ran
/// the `cuda-head-norm-rope` kernel or was not covered by it, or a Gated
/// DeltaNet layer ran a prompt in chunks ([`chunked_delta_rule`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LeverOutcome {
    StackedQueryKeyValue = 0,
    StackedGateUp = 1,
    HeadKernelRan = 2,
    HeadKernelNotCovered = 3,
    ChunkedPrefill = 4,
}

/// One count per [`LeverOutcome`] (the last one's discriminant + 1).
const LEVER_OUTCOMES_COUNTED: usize = LeverOutcome::ChunkedPrefill as usize + 1;

/// How often each [`LeverOutcome`] happened in this process, read after a
/// run to say what each lever did.
struct LeverTally([std::sync::atomic::AtomicUsize; LEVER_OUTCOMES_COUNTED]);

impl LeverTally {
    const fn new() -> Self {
        LeverTally([const { std::sync::atomic::AtomicUsize::new(0) }; LEVER_OUTCOMES_COUNTED])
    }

    fn add(&self, outcome: LeverOutcome) {
        self.0[outcome as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn of(&self, outcome: LeverOutcome) -> usize {
        self.0[outcome as usize].load(std::sync::atomic::Ordering::Relaxed)
    }
}

static LEVER_OUTCOMES: LeverTally = LeverTally::new();

pub(crate) fn count_outcome(outcome: LeverOutcome) {
    LEVER_OUTCOMES.add(outcome);
}

pub fn stacked_counts() -> StackedCounts {
    StackedCounts {
        query_key_value: LEVER_OUTCOMES.of(LeverOutcome::StackedQueryKeyValue),
        gate_up: LEVER_OUTCOMES.of(LeverOutcome::StackedGateUp),
    }
}

/// Whether one-token steps run a layer's per-head Q/K/V norms and RoPE as
/// one custom kernel ([`crate::cuda_kernels::head_norm_rope`]): the lever
/// `cuda-head-norm-rope` (L3), on the GPU path of a CUDA build only (the
/// kernel is CUDA source; the CPU and Metal refuse custom CUDA kernels),
/// and not under tensor parallelism (a rank's rows are not the model's heads).
pub fn head_norm_rope_kernel() -> bool {
    decode_choices().cuda_head_norm_rope
        && MEASURED_GPU
        && path() == Path::NativeFastOps
        && !on_cpu()
        && !crate::distributed::tensor_parallel()
}

/// How many one-token attention steps of K/V-owning layers ran the
/// `cuda-head-norm-rope` kernel, and how many the kernel did not cover (a
/// norm form, dtype, head size or RoPE it is not written for), so a run can
/// say what the lever did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeadKernelCounts {
    pub ran: usize,
    pub not_covered: usize,
}

pub fn head_kernel_counts() -> HeadKernelCounts {
    HeadKernelCounts {
        ran: LEVER_OUTCOMES.of(LeverOutcome::HeadKernelRan),
        not_covered: LEVER_OUTCOMES.of(LeverOutcome::HeadKernelNotCovered),
    }
}

/// How many Gated DeltaNet layer calls ran a prompt in chunks (the lever
/// `deltanet-chunked-prefill`), so a run can say what the lever did.
pub fn chunked_prefill_count() -> usize {
    LEVER_OUTCOMES.of(LeverOutcome::ChunkedPrefill)
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

/// What a prefill chunk does with MLX's buffer pool once its cache is
/// evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillBufferPool {
    /// Returned to the system after every chunk, as mlx-lm does.
    #[default]
    Released,
    /// Kept for the steps that follow, which then reuse its buffers instead
    /// of allocating new ones (MLX's CUDA allocator makes each new buffer
    /// with `cudaMallocManaged`). The pool is still returned every
    /// [`SEQUENCE_TOKENS_PER_POOL_RELEASE`] or [`BATCH_STEPS_PER_POOL_RELEASE`]
    /// decode steps, and MLX's cache limit bounds it in between. Values are
    /// the same either way.
    Kept,
}

impl PrefillBufferPool {
    /// Called after each prefill chunk's cache is evaluated.
    pub fn after_chunk(self) -> Result<(), mlx_rs::error::Exception> {
        match self {
            PrefillBufferPool::Released => release_buffer_pool(),
            PrefillBufferPool::Kept => Ok(()),
        }
    }
}

/// What MLX's allocator holds, in bytes: arrays alive now (`active`), the
/// buffer pool kept for reuse (`pool`, what [`release_buffer_pool`] returns)
/// and the most arrays held at once so far (`peak`). A server reports them
/// so that a long run can be watched for growth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlxMemory {
    pub active: usize,
    pub pool: usize,
    pub peak: usize,
}

/// MLX's memory counters now (`mx.get_active_memory()`,
/// `mx.get_cache_memory()`, `mx.get_peak_memory()`).
pub fn mlx_memory() -> Result<MlxMemory, mlx_rs::error::Exception> {
    Ok(MlxMemory {
        active: mlx_rs::memory::active_memory()?,
        pool: mlx_rs::memory::cache_memory()?,
        peak: mlx_rs::memory::peak_memory()?,
    })
}

/// The version of the libmlx this process loaded (`mx.__version__` of the
/// same library), e.g. `0.32.2`: what MLX keys its own kernel cache by.
pub fn libmlx_version() -> Result<String, mlx_rs::error::Exception> {
    // SAFETY: mlx-c's string API: a fresh string, filled by `mlx_version`,
    // read as a NUL-terminated C string while it lives, then freed once.
    unsafe {
        let mut s = mlx_sys::mlx_string_new();
        let status = mlx_sys::mlx_version(&mut s);
        let text = match status {
            0 => {
                let data = mlx_sys::mlx_string_data(s);
                (!data.is_null()).then(|| {
                    std::ffi::CStr::from_ptr(data)
                        .to_string_lossy()
                        .into_owned()
                })
            }
            _ => None,
        };
        mlx_sys::mlx_string_free(s);
        text.ok_or_else(|| mlx_rs::error::Exception::custom("libmlx did not give its version"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(set: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            set.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_environment_reads_on_and_one_alike_and_refuses_what_it_cannot_read() {
        assert_eq!(
            DecodeChoices::from_vars(vars(&[])),
            Ok(DecodeChoices::DEFAULT)
        );
        // The GPU speed table sets the L3 levers' variables to `on`.
        for on in ["1", "on", "true"] {
            let c = DecodeChoices::from_vars(vars(&[
                (GPU_ONE_TOKEN_SDPA_VAR, on),
                (GPU_STACKED_PROJECTIONS_VAR, on),
                (CUDA_HEAD_NORM_ROPE_VAR, on),
                (DELTANET_CHUNKED_PREFILL_VAR, on),
                (EAGER_DECODE_VAR, on),
            ]))
            .unwrap();
            assert!(
                c.gpu_one_token_sdpa
                    && c.gpu_stacked_projections
                    && c.cuda_head_norm_rope
                    && c.deltanet_chunked_prefill
                    && c.eager_decode,
                "{on}: {c:?}"
            );
        }
        let c = DecodeChoices::from_vars(vars(&[(GPU_DECODE_VAR, "off")])).unwrap();
        assert!(!c.gpu_decode && !c.gpu_decode_on_cpu);
        let c = DecodeChoices::from_vars(vars(&[(GPU_DECODE_VAR, "cpu-too")])).unwrap();
        assert!(c.gpu_decode && c.gpu_decode_on_cpu);
        let c = DecodeChoices::from_vars(vars(&[(GPU_DECODE_BLOCKS_VAR, "post")])).unwrap();
        assert_eq!(c.gpu_blocks, GpuBlocks::PostAttention);
        assert_eq!(
            DecodeChoices::from_vars(vars(&[(CUDA_HEAD_NORM_ROPE_VAR, "yes")])),
            Err("ARCHGEN_CUDA_HEAD_NORM_ROPE=yes: expected 1, on or true, or 0, off, false or empty".into())
        );
        assert_eq!(
            DecodeChoices::from_vars(vars(&[(GPU_DECODE_BLOCKS_VAR, "half")])),
            Err("ARCHGEN_GPU_DECODE_BLOCKS=half: expected all, pre, post or none".into())
        );
    }
}
