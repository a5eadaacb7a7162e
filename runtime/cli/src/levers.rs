//! Speed levers: every run-time choice that can change a run's bits or its
//! speed, by name, with its parity tier when on (docs/cli.md, "Levers";
//! docs/parity.md §8). Each lever is one variant of [`Lever`]; its flag
//! (`--NAME VALUE`) on the commands that read it is made from this registry,
//! so a new lever is one more variant and its match arms. `--l1`, `--l2` and
//! `--l3` are aliases for fixed settings of these levers ([`Alias::sets`]).
//!
//! A lever's value comes from, highest first: its flag, the alias given,
//! its environment variable (the variables that chose these paths before
//! the levers existed, kept for scripts and benchmark variants), its
//! default. Defaults are what archgen ran before the levers existed, or
//! what beat that in a paired A/B (an L1 lever only).

use std::fmt;
use std::marker::PhantomData;

use archgen_ir::tier::{Reason, Tier};
use archgen_runtime::batch_session::{ChunkAfterStart, FirstSteps};
use archgen_runtime::device::{self, DecodeChoices, GpuBlocks};
use clap::{Arg, ArgAction, ArgGroup, ArgMatches, ValueEnum};

/// One speed lever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lever {
    EagerDecode,
    GpuDecode,
    GpuDecodeOnCpu,
    GpuDecodeBlocks,
    GpuOneTokenSdpa,
    GpuStackedProjections,
    CudaHeadNormRope,
    DeltanetChunkedPrefill,
    MaxBatch,
    PrefillStep,
    KeepBufferPool,
    FirstTokenInDecodeStep,
    DeferChunkOnStart,
    PrefillStepWhileGenerating,
    CudaGraphCache,
}

/// What a lever's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `on` or `off`.
    Switch,
    /// A whole number in `min..=max`.
    Count { min: u64, max: u64 },
    /// Which blocks the GPU path compiles: `all`, `pre`, `post` or `none`.
    Blocks,
    /// `off`, or a number of tokens in `min..=max`.
    TokensOrOff { min: u64, max: u64 },
}

/// A lever's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    Switch(bool),
    Count(u64),
    Blocks(GpuBlocks),
    /// `None`: off.
    TokensOrOff(Option<u64>),
}

/// The commands that read a lever (a lever's scope), or the levers a
/// command reads (a command's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every command that runs a model: logits, generate, chat, serve, embed.
    Model,
    /// The commands that run continuous batches: `logits` (with `--batch`)
    /// and `serve`.
    Batches,
    /// `serve` alone.
    Serve,
}

impl Scope {
    fn commands(self) -> &'static [&'static str] {
        match self {
            Scope::Model => &["logits", "generate", "chat", "serve", "embed"],
            Scope::Batches => &["logits", "serve"],
            Scope::Serve => &["serve"],
        }
    }
}

/// The blocks choices, in the order `archgen levers` lists them.
const BLOCKS: [GpuBlocks; 4] = [
    GpuBlocks::All,
    GpuBlocks::PreAttention,
    GpuBlocks::PostAttention,
    GpuBlocks::None,
];

fn blocks_name(blocks: GpuBlocks) -> &'static str {
    match blocks {
        GpuBlocks::All => "all",
        GpuBlocks::PreAttention => "pre",
        GpuBlocks::PostAttention => "post",
        GpuBlocks::None => "none",
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Switch(true) => f.write_str("on"),
            Value::Switch(false) => f.write_str("off"),
            Value::Count(n) => write!(f, "{n}"),
            Value::Blocks(b) => f.write_str(blocks_name(*b)),
            Value::TokensOrOff(None) => f.write_str("off"),
            Value::TokensOrOff(Some(n)) => write!(f, "{n}"),
        }
    }
}

impl Lever {
    /// Every lever, in the order `archgen levers` lists them.
    pub const ALL: [Lever; 15] = [
        Lever::EagerDecode,
        Lever::GpuDecode,
        Lever::GpuDecodeOnCpu,
        Lever::GpuDecodeBlocks,
        Lever::GpuOneTokenSdpa,
        Lever::GpuStackedProjections,
        Lever::CudaHeadNormRope,
        Lever::DeltanetChunkedPrefill,
        Lever::MaxBatch,
        Lever::PrefillStep,
        Lever::KeepBufferPool,
        Lever::FirstTokenInDecodeStep,
        Lever::DeferChunkOnStart,
        Lever::PrefillStepWhileGenerating,
        Lever::CudaGraphCache,
    ];

    /// Its place in [`Lever::ALL`].
    const fn index(self) -> usize {
        match self {
            Lever::EagerDecode => 0,
            Lever::GpuDecode => 1,
            Lever::GpuDecodeOnCpu => 2,
            Lever::GpuDecodeBlocks => 3,
            Lever::GpuOneTokenSdpa => 4,
            Lever::GpuStackedProjections => 5,
            Lever::CudaHeadNormRope => 6,
            Lever::DeltanetChunkedPrefill => 7,
            Lever::MaxBatch => 8,
            Lever::PrefillStep => 9,
            Lever::KeepBufferPool => 10,
            Lever::FirstTokenInDecodeStep => 11,
            Lever::DeferChunkOnStart => 12,
            Lever::PrefillStepWhileGenerating => 13,
            Lever::CudaGraphCache => 14,
        }
    }

    /// The lever's name, which is also its flag (`--NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Lever::EagerDecode => "eager-decode",
            Lever::GpuDecode => "gpu-decode",
            Lever::GpuDecodeOnCpu => "gpu-decode-on-cpu",
            Lever::GpuDecodeBlocks => "gpu-decode-blocks",
            Lever::GpuOneTokenSdpa => "gpu-one-token-sdpa",
            Lever::GpuStackedProjections => "gpu-stacked-projections",
            Lever::CudaHeadNormRope => "cuda-head-norm-rope",
            Lever::DeltanetChunkedPrefill => "deltanet-chunked-prefill",
            Lever::MaxBatch => "max-batch",
            Lever::PrefillStep => "prefill-step",
            Lever::KeepBufferPool => "keep-buffer-pool",
            Lever::FirstTokenInDecodeStep => "first-token-in-decode-step",
            Lever::DeferChunkOnStart => "defer-chunk-on-start",
            Lever::PrefillStepWhileGenerating => "prefill-step-while-generating",
            Lever::CudaGraphCache => "cuda-graph-cache",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Lever::EagerDecode => {
                "one-token steps of generated models run the eager blocks, as prefill does \
                 (an A/B of the compiled blocks)"
            }
            Lever::GpuDecode => {
                "on a GPU, one-token steps of generated models run compiled blocks with MLX's \
                 native fast ops (measured bit-exact on CUDA; never run on Metal)"
            }
            Lever::GpuDecodeOnCpu => {
                "the GPU's compiled blocks run on the CPU too (ARCHGEN_GPU_DECODE=cpu-too): a \
                 wiring check without a GPU (equal bits not promised)"
            }
            Lever::GpuDecodeBlocks => {
                "which blocks the GPU path compiles (all, pre, post, none): a bisection aid; \
                 only all is checked against mlx-lm"
            }
            Lever::GpuOneTokenSdpa => {
                "on a GPU, one query token attends as grouped matmuls instead of MLX's fused \
                 SDPA (changes real-width decode bits on CUDA; the CPU always runs it, \
                 reproducing its SDPA fallback)"
            }
            Lever::GpuStackedProjections => {
                "on the GPU path, a generated model's separate Q/K/V projections run as one \
                 stacked matmul in one-token steps, and so do gate and up (prefill reads the \
                 same weights as before; the stacked matmul may change decode bits)"
            }
            Lever::CudaHeadNormRope => {
                "on CUDA's GPU path, a one-token step's per-head Q/K norms, V's norm and the \
                 RoPE of Q and K run as one custom kernel per layer (layers with per-head Q/K \
                 norms: Gemma-4, Qwen3; the kernel's sums may change decode bits)"
            }
            Lever::DeltanetChunkedPrefill => {
                "on the CPU, a Gated DeltaNet layer's prompt of several tokens runs the \
                 chunkwise form of its recurrence (a triangular solve per 64 tokens) instead \
                 of one step per token (Qwen3.5/3.6, Qwen3-Next; other sums than mlx-lm's)"
            }
            Lever::MaxBatch => {
                "serve: sequences in flight at once (prefilling or decoding); more requests \
                 wait in the queue"
            }
            Lever::PrefillStep => {
                "serve: prompt tokens per prefill chunk (one chunk per scheduler step, between \
                 decode steps)"
            }
            Lever::KeepBufferPool => {
                "serve: MLX's buffer pool is kept after each prefill chunk instead of returned \
                 to the system as mlx-lm does, so the steps after it reuse buffers rather than \
                 allocate (still returned every 512 batch steps; values unchanged)"
            }
            Lever::FirstTokenInDecodeStep => {
                "serve and logits --batch: a sequence whose prompt is done runs its last \
                 prompt token in the decode batch's next forward, beside the other sequences' tokens, instead of \
                 in a forward of its own first (one forward fewer each time prompts finish; \
                 the first token is computed in other company than mlx-lm's, so its bits may \
                 differ)"
            }
            Lever::DeferChunkOnStart => {
                "serve: a step in which sequences start generating runs no prefill chunk (at \
                 most every other step), so their first tokens come at the next step instead of \
                 after another prompt's chunk; the chunk runs a step later on the same members \
                 (values unchanged)"
            }
            Lever::PrefillStepWhileGenerating => {
                "serve and logits --batch: while other sequences generate or wait, a prefill \
                 chunk is at most this \
                 many tokens (prefill-step otherwise), so a long prompt's chunk holds them for \
                 less time (a prompt chunked otherwise than mlx-lm chunks it: its bits may differ)"
            }
            Lever::CudaGraphCache => {
                "serve: CUDA graphs MLX's CUDA backend keeps (MLX_CUDA_GRAPH_CACHE_SIZE; \
                 MLX's own default of 400 thrashes under continuous batching); other \
                 backends ignore it"
            }
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            Lever::EagerDecode
            | Lever::GpuDecode
            | Lever::GpuDecodeOnCpu
            | Lever::GpuOneTokenSdpa
            | Lever::GpuStackedProjections
            | Lever::CudaHeadNormRope
            | Lever::DeltanetChunkedPrefill
            | Lever::KeepBufferPool
            | Lever::FirstTokenInDecodeStep
            | Lever::DeferChunkOnStart => Kind::Switch,
            Lever::GpuDecodeBlocks => Kind::Blocks,
            Lever::MaxBatch => Kind::Count { min: 1, max: 4096 },
            Lever::PrefillStep => Kind::Count {
                min: 1,
                max: u64::from(u32::MAX),
            },
            Lever::CudaGraphCache => Kind::Count {
                min: 1,
                max: 1_000_000,
            },
            Lever::PrefillStepWhileGenerating => Kind::TokensOrOff {
                min: 1,
                max: u64::from(u32::MAX),
            },
        }
    }

    pub fn scope(self) -> Scope {
        match self {
            Lever::EagerDecode
            | Lever::GpuDecode
            | Lever::GpuDecodeOnCpu
            | Lever::GpuDecodeBlocks
            | Lever::GpuOneTokenSdpa
            | Lever::GpuStackedProjections
            | Lever::CudaHeadNormRope
            | Lever::DeltanetChunkedPrefill => Scope::Model,
            Lever::FirstTokenInDecodeStep | Lever::PrefillStepWhileGenerating => Scope::Batches,
            Lever::MaxBatch
            | Lever::PrefillStep
            | Lever::KeepBufferPool
            | Lever::DeferChunkOnStart
            | Lever::CudaGraphCache => Scope::Serve,
        }
    }

    /// Whether a command of `command`'s scope reads this lever.
    pub fn read_by(self, command: Scope) -> bool {
        match (self.scope(), command) {
            (Scope::Model, Scope::Model | Scope::Batches | Scope::Serve)
            | (Scope::Batches, Scope::Batches | Scope::Serve)
            | (Scope::Serve, Scope::Serve) => true,
            (Scope::Batches, Scope::Model) | (Scope::Serve, Scope::Model | Scope::Batches) => false,
        }
    }

    /// The tier of a run with this lever on: L1 when mlx-lm's bits stay
    /// (measured where a device has run it), L3 when no oracle reproduces them.
    pub fn tier_when_on(self) -> Tier {
        match self {
            // The eager blocks are mlx-lm's ops; the GPU path was measured
            // byte-identical to them on CUDA (docs/parity.md, "On the GPU").
            Lever::EagerDecode | Lever::GpuDecode => Tier::L1,
            // MLX's op graphs for the fast ops, compiled: equal bits not promised.
            Lever::GpuDecodeOnCpu => Tier::L3,
            // A partial GPU path was last measured before it became L1.
            Lever::GpuDecodeBlocks => Tier::L3,
            // Differs from mlx-lm on real-width Qwen3 and Llama on CUDA.
            Lever::GpuOneTokenSdpa => Tier::L3,
            // The stacked matmul's kernel is chosen by its width: no
            // oracle runs it.
            Lever::GpuStackedProjections => Tier::L3,
            // A kernel of ours: no oracle runs it.
            Lever::CudaHeadNormRope => Tier::L3,
            // Another order of the recurrence's sums: no oracle runs it.
            Lever::DeltanetChunkedPrefill => Tier::L3,
            // A batch layout BatchGenerator never runs: no oracle.
            Lever::FirstTokenInDecodeStep => Tier::L3,
            // A prompt's chunks change size while others generate; no
            // BatchGenerator run chunks it so.
            Lever::PrefillStepWhileGenerating => Tier::L3,
            // mlx-lm's BatchGenerator with the same sizes is the oracle;
            // the graph cache replays the same kernels; a kept pool hands
            // the same kernels other buffers; a deferred chunk is the same
            // forward a step later, as the server's decode-only steps.
            Lever::MaxBatch
            | Lever::PrefillStep
            | Lever::KeepBufferPool
            | Lever::DeferChunkOnStart
            | Lever::CudaGraphCache => Tier::L1,
        }
    }

    /// Whether `value` counts as on: a switch that is on, blocks other than
    /// all, and any number (a count always sets something).
    pub fn is_on(self, value: Value) -> bool {
        match value {
            Value::Switch(on) => on,
            Value::Count(_) => true,
            Value::TokensOrOff(n) => n.is_some(),
            Value::Blocks(b) => b != GpuBlocks::All,
        }
    }

    /// The tier of a run with this lever at `value`.
    pub fn tier(self, value: Value) -> Tier {
        match self.is_on(value) {
            true => self.tier_when_on(),
            false => Tier::L1,
        }
    }

    pub fn default_value(self) -> Value {
        LeverValues::DEFAULT.get(self)
    }

    /// The environment variable that sets this lever when neither its flag
    /// nor an alias does.
    pub fn env_var(self) -> Option<&'static str> {
        match self {
            Lever::EagerDecode => Some(device::EAGER_DECODE_VAR),
            Lever::GpuDecode | Lever::GpuDecodeOnCpu => Some(device::GPU_DECODE_VAR),
            Lever::GpuDecodeBlocks => Some(device::GPU_DECODE_BLOCKS_VAR),
            Lever::GpuOneTokenSdpa => Some(device::GPU_ONE_TOKEN_SDPA_VAR),
            Lever::GpuStackedProjections => Some(device::GPU_STACKED_PROJECTIONS_VAR),
            Lever::CudaHeadNormRope => Some(device::CUDA_HEAD_NORM_ROPE_VAR),
            Lever::DeltanetChunkedPrefill => Some(device::DELTANET_CHUNKED_PREFILL_VAR),
            Lever::KeepBufferPool => Some(device::KEEP_BUFFER_POOL_VAR),
            Lever::FirstTokenInDecodeStep => Some(FIRST_TOKEN_IN_DECODE_STEP_VAR),
            Lever::DeferChunkOnStart => Some(DEFER_CHUNK_ON_START_VAR),
            Lever::PrefillStepWhileGenerating => Some(PREFILL_STEP_WHILE_GENERATING_VAR),
            Lever::MaxBatch | Lever::PrefillStep => None,
            Lever::CudaGraphCache => Some(CUDA_GRAPH_CACHE_VAR),
        }
    }

    /// The value the environment variable's `raw` text gives this lever
    /// (`None`: it says nothing about this lever).
    fn read_env(self, raw: &str) -> Result<Option<Value>, String> {
        let var = self.env_var().unwrap_or_default();
        // The runtime's reading of a switch, so the bench worker and archgen
        // agree on every value.
        let switch = |raw: &str, accepted: &str| {
            device::switch_value(raw).ok_or_else(|| {
                format!(
                    "{var}={raw}: expected {accepted}; or unset it and give --{} on|off",
                    self.name()
                )
            })
        };
        match self {
            Lever::EagerDecode
            | Lever::GpuOneTokenSdpa
            | Lever::GpuStackedProjections
            | Lever::CudaHeadNormRope
            | Lever::DeltanetChunkedPrefill
            | Lever::KeepBufferPool
            | Lever::FirstTokenInDecodeStep
            | Lever::DeferChunkOnStart => switch(raw, "1 or 0").map(|on| Some(Value::Switch(on))),
            Lever::GpuDecode => match raw {
                // The wiring check runs the GPU path, so it is on too.
                "cpu-too" => Ok(Some(Value::Switch(true))),
                other => switch(other, "1, 0 or cpu-too").map(|on| Some(Value::Switch(on))),
            },
            Lever::GpuDecodeOnCpu => match raw {
                "cpu-too" => Ok(Some(Value::Switch(true))),
                // 1 or 0 set gpu-decode alone; a bad value is reported there.
                _ => Ok(None),
            },
            Lever::GpuDecodeBlocks
            | Lever::MaxBatch
            | Lever::PrefillStep
            | Lever::PrefillStepWhileGenerating
            | Lever::CudaGraphCache => self
                .parse(raw)
                .map(Some)
                .map_err(|e| format!("{var}={raw}: {e}")),
        }
    }

    /// Parses a value given on the command line (or a count or blocks
    /// choice from the environment).
    pub fn parse(self, text: &str) -> Result<Value, String> {
        match self.kind() {
            Kind::Switch => match text {
                "on" => Ok(Value::Switch(true)),
                "off" => Ok(Value::Switch(false)),
                other => Err(format!("`{other}` is not on or off")),
            },
            Kind::Count { min, max } => match text.parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(Value::Count(n)),
                _ => Err(format!("`{text}` is not a whole number in {min}..={max}")),
            },
            Kind::Blocks => BLOCKS
                .into_iter()
                .find(|b| blocks_name(*b) == text)
                .map(Value::Blocks)
                .ok_or_else(|| format!("`{text}` is not one of all, pre, post, none")),
            Kind::TokensOrOff { min, max } => match (text, text.parse::<u64>()) {
                ("off", _) => Ok(Value::TokensOrOff(None)),
                (_, Ok(n)) if (min..=max).contains(&n) => Ok(Value::TokensOrOff(Some(n))),
                _ => Err(format!(
                    "`{text}` is not off or a whole number in {min}..={max}"
                )),
            },
        }
    }

    /// The values it takes, as `archgen levers` and `--help` show them.
    pub fn values(self) -> String {
        match self.kind() {
            Kind::Switch => "on|off".into(),
            Kind::Count { min, max } => format!("{min}..={max}"),
            Kind::Blocks => BLOCKS.map(blocks_name).join("|"),
            Kind::TokensOrOff { min, max } => format!("off|{min}..={max}"),
        }
    }

    /// The placeholder of its flag's value in `--help`.
    fn value_name(self) -> &'static str {
        match self {
            Lever::EagerDecode
            | Lever::GpuDecode
            | Lever::GpuDecodeOnCpu
            | Lever::GpuOneTokenSdpa
            | Lever::GpuStackedProjections
            | Lever::CudaHeadNormRope
            | Lever::DeltanetChunkedPrefill
            | Lever::KeepBufferPool
            | Lever::FirstTokenInDecodeStep
            | Lever::DeferChunkOnStart => "on|off",
            Lever::GpuDecodeBlocks => "all|pre|post|none",
            Lever::MaxBatch => "N",
            Lever::PrefillStep => "TOKENS",
            Lever::PrefillStepWhileGenerating => "off|TOKENS",
            Lever::CudaGraphCache => "GRAPHS",
        }
    }

    /// The value an alias gives when it turns the lever off; `None` for a
    /// count, which has no off.
    fn off_value(self) -> Option<Value> {
        match self.kind() {
            Kind::Switch => Some(Value::Switch(false)),
            Kind::Blocks => Some(Value::Blocks(GpuBlocks::All)),
            Kind::TokensOrOff { .. } => Some(Value::TokensOrOff(None)),
            Kind::Count { .. } => None,
        }
    }
}

/// MLX's own variable for its CUDA graph cache, read when its backend starts.
pub const CUDA_GRAPH_CACHE_VAR: &str = "MLX_CUDA_GRAPH_CACHE_SIZE";

/// The variable that sets `defer-chunk-on-start` when its flag does not
/// (serving benchmarks run a server with and without it).
pub const DEFER_CHUNK_ON_START_VAR: &str = "ARCHGEN_DEFER_CHUNK_ON_START";

/// The variable that sets `prefill-step-while-generating` when its flag
/// does not (`off` or a number of tokens).
pub const PREFILL_STEP_WHILE_GENERATING_VAR: &str = "ARCHGEN_PREFILL_STEP_WHILE_GENERATING";

/// The variable that turns on `first-token-in-decode-step` when neither its
/// flag nor an alias sets it. The GPU speed table runs its L3 server with
/// every `--l3` lever through its variable (runtime/mlx-cuda/speed_table.py),
/// so every lever `--l3` turns on needs one.
pub const FIRST_TOKEN_IN_DECODE_STEP_VAR: &str = "ARCHGEN_FIRST_TOKEN_IN_DECODE_STEP";

/// A value for every lever, typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeverValues {
    pub eager_decode: bool,
    pub gpu_decode: bool,
    pub gpu_decode_on_cpu: bool,
    pub gpu_decode_blocks: GpuBlocks,
    pub gpu_one_token_sdpa: bool,
    pub gpu_stacked_projections: bool,
    pub cuda_head_norm_rope: bool,
    pub deltanet_chunked_prefill: bool,
    pub max_batch: u64,
    pub prefill_step: u64,
    pub keep_buffer_pool: bool,
    pub first_token_in_decode_step: bool,
    pub defer_chunk_on_start: bool,
    pub prefill_step_while_generating: Option<u64>,
    pub cuda_graph_cache: u64,
}

impl LeverValues {
    /// What archgen ran before the levers existed: the runtime's decode
    /// defaults, `serve`'s former flag defaults, and the CUDA graph cache
    /// `serve` set (40,000: at 4,000 the compiled one-token blocks filled it
    /// in a serve benchmark's four load levels and a 12k-token prompt after
    /// them took 10.1 s to its first token where 40,000 gave 1.8 s,
    /// docs/benchmarks.md).
    pub const DEFAULT: LeverValues = LeverValues {
        eager_decode: DecodeChoices::DEFAULT.eager_decode,
        gpu_decode: DecodeChoices::DEFAULT.gpu_decode,
        gpu_decode_on_cpu: DecodeChoices::DEFAULT.gpu_decode_on_cpu,
        gpu_decode_blocks: DecodeChoices::DEFAULT.gpu_blocks,
        gpu_one_token_sdpa: DecodeChoices::DEFAULT.gpu_one_token_sdpa,
        gpu_stacked_projections: DecodeChoices::DEFAULT.gpu_stacked_projections,
        cuda_head_norm_rope: DecodeChoices::DEFAULT.cuda_head_norm_rope,
        deltanet_chunked_prefill: DecodeChoices::DEFAULT.deltanet_chunked_prefill,
        max_batch: 16,
        prefill_step: 2048,
        keep_buffer_pool: false,
        first_token_in_decode_step: false,
        // On since it beat the server without it in a paired A/B on the CPU
        // (a 12k-token prompt in prefill while 8 clients come and go:
        // docs/benchmarks.md); L1 either way.
        defer_chunk_on_start: true,
        prefill_step_while_generating: None,
        cuda_graph_cache: 40_000,
    };

    pub fn get(&self, lever: Lever) -> Value {
        match lever {
            Lever::EagerDecode => Value::Switch(self.eager_decode),
            Lever::GpuDecode => Value::Switch(self.gpu_decode),
            Lever::GpuDecodeOnCpu => Value::Switch(self.gpu_decode_on_cpu),
            Lever::GpuDecodeBlocks => Value::Blocks(self.gpu_decode_blocks),
            Lever::GpuOneTokenSdpa => Value::Switch(self.gpu_one_token_sdpa),
            Lever::GpuStackedProjections => Value::Switch(self.gpu_stacked_projections),
            Lever::CudaHeadNormRope => Value::Switch(self.cuda_head_norm_rope),
            Lever::DeltanetChunkedPrefill => Value::Switch(self.deltanet_chunked_prefill),
            Lever::MaxBatch => Value::Count(self.max_batch),
            Lever::PrefillStep => Value::Count(self.prefill_step),
            Lever::KeepBufferPool => Value::Switch(self.keep_buffer_pool),
            Lever::FirstTokenInDecodeStep => Value::Switch(self.first_token_in_decode_step),
            Lever::DeferChunkOnStart => Value::Switch(self.defer_chunk_on_start),
            Lever::PrefillStepWhileGenerating => {
                Value::TokensOrOff(self.prefill_step_while_generating)
            }
            Lever::CudaGraphCache => Value::Count(self.cuda_graph_cache),
        }
    }

    /// Sets `lever`; an error when `value` is not of the lever's kind.
    pub fn set(&mut self, lever: Lever, value: Value) -> Result<(), String> {
        match (lever, value) {
            (Lever::EagerDecode, Value::Switch(on)) => self.eager_decode = on,
            (Lever::GpuDecode, Value::Switch(on)) => self.gpu_decode = on,
            (Lever::GpuDecodeOnCpu, Value::Switch(on)) => self.gpu_decode_on_cpu = on,
            (Lever::GpuDecodeBlocks, Value::Blocks(b)) => self.gpu_decode_blocks = b,
            (Lever::GpuOneTokenSdpa, Value::Switch(on)) => self.gpu_one_token_sdpa = on,
            (Lever::GpuStackedProjections, Value::Switch(on)) => self.gpu_stacked_projections = on,
            (Lever::CudaHeadNormRope, Value::Switch(on)) => self.cuda_head_norm_rope = on,
            (Lever::DeltanetChunkedPrefill, Value::Switch(on)) => {
                self.deltanet_chunked_prefill = on
            }
            (Lever::MaxBatch, Value::Count(n)) => self.max_batch = n,
            (Lever::PrefillStep, Value::Count(n)) => self.prefill_step = n,
            (Lever::KeepBufferPool, Value::Switch(on)) => self.keep_buffer_pool = on,
            (Lever::FirstTokenInDecodeStep, Value::Switch(on)) => {
                self.first_token_in_decode_step = on
            }
            (Lever::DeferChunkOnStart, Value::Switch(on)) => self.defer_chunk_on_start = on,
            (Lever::PrefillStepWhileGenerating, Value::TokensOrOff(n)) => {
                self.prefill_step_while_generating = n
            }
            (Lever::CudaGraphCache, Value::Count(n)) => self.cuda_graph_cache = n,
            (
                Lever::EagerDecode
                | Lever::GpuDecode
                | Lever::GpuDecodeOnCpu
                | Lever::GpuDecodeBlocks
                | Lever::GpuOneTokenSdpa
                | Lever::GpuStackedProjections
                | Lever::CudaHeadNormRope
                | Lever::DeltanetChunkedPrefill
                | Lever::MaxBatch
                | Lever::PrefillStep
                | Lever::KeepBufferPool
                | Lever::FirstTokenInDecodeStep
                | Lever::DeferChunkOnStart
                | Lever::PrefillStepWhileGenerating
                | Lever::CudaGraphCache,
                _,
            ) => {
                return Err(format!(
                    "lever {} takes {}, not `{value}`",
                    lever.name(),
                    lever.values()
                ))
            }
        }
        Ok(())
    }

    /// The runtime's decode choices these levers make.
    pub fn decode_choices(&self) -> DecodeChoices {
        DecodeChoices {
            eager_decode: self.eager_decode,
            gpu_decode: self.gpu_decode,
            gpu_decode_on_cpu: self.gpu_decode_on_cpu,
            gpu_blocks: self.gpu_decode_blocks,
            gpu_one_token_sdpa: self.gpu_one_token_sdpa,
            gpu_stacked_projections: self.gpu_stacked_projections,
            cuda_head_norm_rope: self.cuda_head_norm_rope,
            deltanet_chunked_prefill: self.deltanet_chunked_prefill,
        }
    }

    /// Where a batch's finished prompts run their last token
    /// (`first-token-in-decode-step`).
    pub fn first_steps(&self) -> FirstSteps {
        match self.first_token_in_decode_step {
            true => FirstSteps::InGenerationBatch,
            false => FirstSteps::OwnForward,
        }
    }

    /// Whether a step that starts sequences generating feeds a prompt chunk
    /// (`defer-chunk-on-start`).
    pub fn chunk_after_start(&self) -> ChunkAfterStart {
        match self.defer_chunk_on_start {
            true => ChunkAfterStart::NextStep,
            false => ChunkAfterStart::SameStep,
        }
    }

    /// A prompt's chunk cap while others generate
    /// (`prefill-step-while-generating`), as a session takes it.
    pub fn prefill_step_while_generating_tokens(&self) -> Option<usize> {
        self.prefill_step_while_generating
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    }
}

/// A tier alias: a fixed setting of some levers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alias {
    L1,
    L2,
    L3,
}

impl Alias {
    pub const ALL: [Alias; 3] = [Alias::L1, Alias::L2, Alias::L3];

    /// The flag (`--l1`).
    pub fn name(self) -> &'static str {
        match self {
            Alias::L1 => "l1",
            Alias::L2 => "l2",
            Alias::L3 => "l3",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Alias::L1 => "turns off every lever that would lift the run above L1",
            Alias::L2 => {
                "turns off every lever that would lift the run above L2 (no lever is L2: as --l1)"
            }
            Alias::L3 => "turns on the L3 levers made for speed",
        }
    }

    /// The value this alias gives `lever`, `None` when it leaves it alone.
    /// The L1 and L2 aliases turn off every lever above their tier (a unit
    /// test checks that none is missed); `--l3` turns on the L3 levers made
    /// for speed, not the wiring check or the bisection aid.
    pub fn sets(self, lever: Lever) -> Option<Value> {
        match (self, lever) {
            (
                Alias::L1 | Alias::L2,
                Lever::GpuDecodeOnCpu
                | Lever::GpuDecodeBlocks
                | Lever::GpuOneTokenSdpa
                | Lever::GpuStackedProjections
                | Lever::CudaHeadNormRope
                | Lever::DeltanetChunkedPrefill
                | Lever::FirstTokenInDecodeStep
                | Lever::PrefillStepWhileGenerating,
            ) => lever.off_value(),
            (
                Alias::L3,
                Lever::GpuOneTokenSdpa
                | Lever::GpuStackedProjections
                | Lever::CudaHeadNormRope
                | Lever::DeltanetChunkedPrefill
                | Lever::FirstTokenInDecodeStep,
            ) => Some(Value::Switch(true)),
            (
                Alias::L3,
                Lever::GpuDecodeOnCpu | Lever::GpuDecodeBlocks | Lever::PrefillStepWhileGenerating,
            )
            | (
                Alias::L1 | Alias::L2 | Alias::L3,
                Lever::EagerDecode
                | Lever::GpuDecode
                | Lever::MaxBatch
                | Lever::PrefillStep
                | Lever::KeepBufferPool
                | Lever::DeferChunkOnStart
                | Lever::CudaGraphCache,
            ) => None,
        }
    }

    /// `name=value, ...` of what it sets.
    pub fn expansion(self) -> String {
        let set: Vec<String> = Lever::ALL
            .into_iter()
            .filter_map(|l| self.sets(l).map(|v| format!("{}={v}", l.name())))
            .collect();
        set.join(", ")
    }
}

/// Where a lever's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Default,
    Environment(&'static str),
    Alias(Alias),
    Flag,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::Environment(var) => write!(f, "from {var}"),
            Source::Alias(a) => write!(f, "from --{}", a.name()),
            Source::Flag => f.write_str("from its flag"),
        }
    }
}

/// The scope of the command a set of lever flags belongs to.
pub trait CommandScope {
    const SCOPE: Scope;
}

/// generate, chat, embed.
#[derive(Debug, Clone, Copy)]
pub struct ModelCommand;
impl CommandScope for ModelCommand {
    const SCOPE: Scope = Scope::Model;
}

/// logits, which also runs continuous batches (`--batch`).
#[derive(Debug, Clone, Copy)]
pub struct LogitsCommand;
impl CommandScope for LogitsCommand {
    const SCOPE: Scope = Scope::Batches;
}

/// serve.
#[derive(Debug, Clone, Copy)]
pub struct ServeCommand;
impl CommandScope for ServeCommand {
    const SCOPE: Scope = Scope::Serve;
}

/// The lever flags of one command, as given: one `--NAME VALUE` per lever
/// the command reads, and `--l1`, `--l2` or `--l3`.
#[derive(Debug, Clone)]
pub struct LeverFlags<S> {
    pub alias: Option<Alias>,
    /// The levers given by flag, in [`Lever::ALL`]'s order.
    pub given: Vec<(Lever, Value)>,
    scope: PhantomData<S>,
}

impl<S: CommandScope> LeverFlags<S> {
    /// The run's levers: flags over the alias over the environment (read
    /// through `env`) over the defaults.
    pub fn resolve_with(&self, env: impl Fn(&str) -> Option<String>) -> Result<RunLevers, String> {
        let mut values = LeverValues::DEFAULT;
        let mut sources = [Source::Default; Lever::ALL.len()];
        for lever in Lever::ALL.into_iter().filter(|l| l.read_by(S::SCOPE)) {
            let given = self
                .given
                .iter()
                .find(|(l, _)| *l == lever)
                .map(|(_, v)| *v);
            let from_alias = self.alias.and_then(|a| a.sets(lever).map(|v| (a, v)));
            let from_env = match lever
                .env_var()
                .and_then(|var| env(var).map(|raw| (var, raw)))
            {
                Some((var, raw)) => lever.read_env(&raw)?.map(|v| (var, v)),
                None => None,
            };
            let (value, source) = match (given, from_alias, from_env) {
                (Some(v), _, _) => (v, Source::Flag),
                (None, Some((a, v)), _) => (v, Source::Alias(a)),
                (None, None, Some((var, v))) => (v, Source::Environment(var)),
                (None, None, None) => continue,
            };
            values.set(lever, value)?;
            sources[lever.index()] = source;
        }
        Ok(RunLevers {
            scope: S::SCOPE,
            values,
            sources,
        })
    }

    /// [`LeverFlags::resolve_with`] this process's environment.
    pub fn resolve(&self) -> Result<RunLevers, String> {
        self.resolve_with(|var| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned()))
    }
}

const ALIAS_GROUP: &str = "tier-alias";

impl<S: CommandScope> clap::Args for LeverFlags<S> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let mut cmd = cmd.next_help_heading("Levers (archgen levers lists them)");
        for lever in Lever::ALL.into_iter().filter(|l| l.read_by(S::SCOPE)) {
            let env = lever
                .env_var()
                .map(|v| format!("; env {v}"))
                .unwrap_or_default();
            let mut arg = Arg::new(lever.name())
                .long(lever.name())
                .value_name(lever.value_name())
                .value_parser(move |text: &str| lever.parse(text))
                .action(ArgAction::Set)
                .help(format!(
                    "{} [{} {}; default {}{env}]",
                    capitalized(lever.description()),
                    lever.tier_when_on(),
                    match lever.kind() {
                        Kind::Switch | Kind::Blocks | Kind::TokensOrOff { .. } => "when on",
                        // A count is always on.
                        Kind::Count { .. } => "at any value",
                    },
                    lever.default_value()
                ));
            if let Kind::Switch = lever.kind() {
                // A bare `--NAME` turns a switch on.
                arg = arg.num_args(0..=1).default_missing_value("on");
            }
            cmd = cmd.arg(arg);
        }
        for alias in Alias::ALL {
            cmd = cmd.arg(
                Arg::new(alias.name())
                    .long(alias.name())
                    .action(ArgAction::SetTrue)
                    .help(format!(
                        "Alias: {} ({}); a lever's own flag overrides it",
                        alias.description(),
                        alias.expansion()
                    )),
            );
        }
        cmd.group(
            ArgGroup::new(ALIAS_GROUP)
                .args(Alias::ALL.map(Alias::name))
                .multiple(false),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl<S: CommandScope> clap::FromArgMatches for LeverFlags<S> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let alias = Alias::ALL.into_iter().find(|a| matches.get_flag(a.name()));
        let given = Lever::ALL
            .into_iter()
            .filter(|l| l.read_by(S::SCOPE))
            .filter_map(|l| matches.get_one::<Value>(l.name()).map(|v| (l, *v)))
            .collect();
        Ok(LeverFlags {
            alias,
            given,
            scope: PhantomData,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The levers of one run: a value and its source for each lever its command
/// reads.
#[derive(Debug, Clone)]
pub struct RunLevers {
    scope: Scope,
    pub values: LeverValues,
    sources: [Source; Lever::ALL.len()],
}

impl RunLevers {
    /// The levers this run reads, with value and source.
    pub fn settings(&self) -> impl Iterator<Item = (Lever, Value, Source)> + '_ {
        Lever::ALL
            .into_iter()
            .filter(|l| l.read_by(self.scope))
            .map(|l| (l, self.values.get(l), self.sources[l.index()]))
    }

    /// The tier reasons of the levers above L1.
    pub fn reasons(&self) -> Vec<Reason> {
        self.settings()
            .filter(|(l, v, _)| l.tier(*v) > Tier::L1)
            .map(|(l, v, _)| Reason::Lever {
                name: l.name(),
                setting: v.to_string(),
                tier: l.tier(v),
            })
            .collect()
    }

    /// `None` when every lever keeps `required`; else why not, naming each
    /// lever above it and where it was set.
    pub fn refusal(&self, required: Tier) -> Option<String> {
        let above: Vec<(Lever, Value, Source)> = self
            .settings()
            .filter(|(l, v, _)| l.tier(*v) > required)
            .collect();
        if above.is_empty() {
            return None;
        }
        let list: Vec<String> = above
            .iter()
            .map(|(l, v, s)| format!("lever {}={v} ({s}) is {}", l.name(), l.tier(*v)))
            .collect();
        let flags: Vec<String> = above
            .iter()
            .map(|(l, _, _)| {
                let off = l.off_value().map_or_else(String::new, |v| format!(" {v}"));
                format!("--{}{off}", l.name())
            })
            .collect();
        let alias = match required {
            Tier::L1 => Alias::L1,
            Tier::L2 => Alias::L2,
            Tier::L3 => Alias::L3,
        };
        let it = match above.len() {
            1 => "it",
            _ => "them",
        };
        Some(format!(
            "{}; turn {it} off ({}; --{} turns off every lever above {required} that \
             no flag sets) or run without --require-tier {required}",
            list.join(", "),
            flags.join(", "),
            alias.name(),
        ))
    }

    /// The status note: `levers on: NAME (SOURCE), NAME=VALUE (SOURCE)`,
    /// or `levers on: none`.
    pub fn note(&self) -> String {
        let on: Vec<String> = self
            .settings()
            .filter(|(l, v, _)| l.is_on(*v))
            .map(|(l, v, s)| match l.kind() {
                Kind::Switch => format!("{} ({s})", l.name()),
                Kind::Count { .. } | Kind::Blocks | Kind::TokensOrOff { .. } => {
                    format!("{}={v} ({s})", l.name())
                }
            })
            .collect();
        match on.is_empty() {
            true => "levers on: none".into(),
            false => format!("levers on: {}", on.join(", ")),
        }
    }
}

/// How `archgen levers` prints (the args' `--format`; here, below the
/// args, so that the args can name it without an import circle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ListFormat {
    /// An aligned table
    Table,
    /// One JSON object: {"levers": [...], "aliases": [...]}
    Json,
}

/// `archgen levers`: the registry and the aliases as a table, or as one
/// JSON object (values spelled as the flags take them).
pub fn list(format: ListFormat) -> String {
    match format {
        ListFormat::Table => table(),
        ListFormat::Json => json().to_string() + "\n",
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Switch => "switch",
        Kind::Count { .. } => "count",
        Kind::Blocks => "choice",
        Kind::TokensOrOff { .. } => "tokens or off",
    }
}

fn table() -> String {
    let rows: Vec<[String; 7]> = Lever::ALL
        .into_iter()
        .map(|l| {
            [
                l.name().to_string(),
                l.tier_when_on().to_string(),
                l.default_value().to_string(),
                l.values(),
                l.env_var().unwrap_or("-").to_string(),
                l.scope().commands().join(","),
                l.description().to_string(),
            ]
        })
        .collect();
    let header = [
        "LEVER",
        "TIER WHEN ON",
        "DEFAULT",
        "VALUES",
        "ENVIRONMENT",
        "COMMANDS",
        "DESCRIPTION",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            match i + 1 == cells.len() {
                true => out.push_str(cell),
                false => out.push_str(&format!("{cell:w$}  ")),
            }
        }
        out + "\n"
    };
    let mut out = line(&header);
    for row in &rows {
        out += &line(&row.each_ref().map(String::as_str));
    }
    out += "\nALIAS  SETS (a lever's own flag overrides it)\n";
    for alias in Alias::ALL {
        out += &format!("--{}   {}\n", alias.name(), alias.expansion());
    }
    out
}

fn json() -> serde_json::Value {
    let levers: Vec<serde_json::Value> = Lever::ALL
        .into_iter()
        .map(|l| {
            serde_json::json!({
                "name": l.name(),
                "description": l.description(),
                "tier_when_on": l.tier_when_on().as_str(),
                "kind": kind_name(l.kind()),
                "values": l.values(),
                "default": l.default_value().to_string(),
                "environment": l.env_var(),
                "commands": l.scope().commands(),
            })
        })
        .collect();
    let aliases: Vec<serde_json::Value> = Alias::ALL
        .into_iter()
        .map(|a| {
            let sets: serde_json::Map<String, serde_json::Value> = Lever::ALL
                .into_iter()
                .filter_map(|l| {
                    a.sets(l)
                        .map(|v| (l.name().to_string(), v.to_string().into()))
                })
                .collect();
            serde_json::json!({
                "flag": format!("--{}", a.name()),
                "description": a.description(),
                "sets": sets,
            })
        })
        .collect();
    serde_json::json!({ "levers": levers, "aliases": aliases })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags<S: CommandScope>(alias: Option<Alias>, given: &[(Lever, Value)]) -> LeverFlags<S> {
        LeverFlags {
            alias,
            given: given.to_vec(),
            scope: PhantomData,
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn the_registry_lists_every_lever_once_in_its_place() {
        for (i, l) in Lever::ALL.into_iter().enumerate() {
            assert_eq!(l.index(), i, "{l:?}");
            assert_eq!(
                l.parse(&l.default_value().to_string()),
                Ok(l.default_value())
            );
        }
        let mut names: Vec<_> = Lever::ALL.map(Lever::name).to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Lever::ALL.len());
    }

    #[test]
    fn the_defaults_are_what_ran_before() {
        let run = flags::<ServeCommand>(None, &[])
            .resolve_with(no_env)
            .unwrap();
        assert_eq!(run.values.decode_choices(), DecodeChoices::DEFAULT);
        assert_eq!(
            (
                run.values.max_batch,
                run.values.prefill_step,
                run.values.cuda_graph_cache
            ),
            (16, 2048, 40_000)
        );
        assert!(run.reasons().is_empty());
        assert!(run.settings().all(|(_, _, s)| s == Source::Default));
    }

    #[test]
    fn the_l1_and_l2_aliases_turn_off_every_lever_above_them() {
        // Every lever on (counts at their largest), then the alias.
        for (alias, tier) in [(Alias::L1, Tier::L1), (Alias::L2, Tier::L2)] {
            let mut run = flags::<ServeCommand>(Some(alias), &[])
                .resolve_with(no_env)
                .unwrap();
            for l in Lever::ALL {
                let on = match l.kind() {
                    Kind::Switch => Value::Switch(true),
                    Kind::Count { max, .. } => Value::Count(max),
                    Kind::Blocks => Value::Blocks(GpuBlocks::None),
                    Kind::TokensOrOff { min, .. } => Value::TokensOrOff(Some(min)),
                };
                run.values.set(l, alias.sets(l).unwrap_or(on)).unwrap();
            }
            assert!(
                run.refusal(tier).is_none(),
                "{alias:?}: {:?}",
                run.refusal(tier)
            );
        }
        assert_eq!(
            Alias::L1.expansion(),
            "gpu-decode-on-cpu=off, gpu-decode-blocks=all, gpu-one-token-sdpa=off, \
             gpu-stacked-projections=off, cuda-head-norm-rope=off, deltanet-chunked-prefill=off, \
             first-token-in-decode-step=off, prefill-step-while-generating=off"
        );
        assert_eq!(
            Alias::L3.expansion(),
            "gpu-one-token-sdpa=on, gpu-stacked-projections=on, cuda-head-norm-rope=on, \
             deltanet-chunked-prefill=on, first-token-in-decode-step=on"
        );
    }

    #[test]
    fn a_tokens_or_off_lever_reads_off_or_a_count_and_is_l3_only_when_set() {
        let l = Lever::PrefillStepWhileGenerating;
        assert_eq!(l.parse("off"), Ok(Value::TokensOrOff(None)));
        assert_eq!(l.parse("256"), Ok(Value::TokensOrOff(Some(256))));
        assert_eq!(
            l.parse("0"),
            Err("`0` is not off or a whole number in 1..=4294967295".into())
        );
        assert!(l.parse("many").is_err());
        assert_eq!(l.tier(Value::TokensOrOff(None)), Tier::L1);
        assert_eq!(l.tier(Value::TokensOrOff(Some(256))), Tier::L3);
        assert_eq!(l.default_value(), Value::TokensOrOff(None));
        let run = flags::<ServeCommand>(None, &[])
            .resolve_with(|v: &str| {
                (v == PREFILL_STEP_WHILE_GENERATING_VAR).then(|| "128".to_string())
            })
            .unwrap();
        assert_eq!(run.values.prefill_step_while_generating, Some(128));
        assert!(run.refusal(Tier::L1).is_some());
        assert!(run
            .note()
            .contains("prefill-step-while-generating=128 (from"));
    }

    #[test]
    fn every_lever_the_l3_alias_turns_on_has_an_environment_variable() {
        // The GPU speed table and the bench worker set the L3 levers through
        // their variables; a lever without one would stop that table.
        for lever in Lever::ALL {
            if Alias::L3.sets(lever).is_some() {
                assert!(lever.env_var().is_some(), "{}", lever.name());
            }
        }
        let run = flags::<ServeCommand>(None, &[])
            .resolve_with(|v: &str| (v == FIRST_TOKEN_IN_DECODE_STEP_VAR).then(|| "1".to_string()))
            .unwrap();
        assert!(run.values.first_token_in_decode_step);
        assert_eq!(
            run.settings()
                .find(|(l, _, _)| *l == Lever::FirstTokenInDecodeStep)
                .map(|(_, _, s)| s),
            Some(Source::Environment(FIRST_TOKEN_IN_DECODE_STEP_VAR))
        );
    }

    #[test]
    fn a_flag_overrides_the_alias_which_overrides_the_environment() {
        let env = |var: &str| match var {
            "ARCHGEN_GPU_ONE_TOKEN_SDPA" => Some("1".to_string()),
            "ARCHGEN_EAGER_DECODE" => Some("1".to_string()),
            _ => None,
        };
        let run = flags::<ModelCommand>(None, &[]).resolve_with(env).unwrap();
        assert!(run.values.gpu_one_token_sdpa && run.values.eager_decode);
        assert_eq!(
            run.reasons(),
            vec![Reason::Lever {
                name: "gpu-one-token-sdpa",
                setting: "on".into(),
                tier: Tier::L3
            }]
        );
        let run = flags::<ModelCommand>(Some(Alias::L1), &[])
            .resolve_with(env)
            .unwrap();
        assert!(!run.values.gpu_one_token_sdpa, "--l1 beats the environment");
        assert!(
            run.values.eager_decode,
            "--l1 leaves eager-decode to the environment"
        );
        let run = flags::<ModelCommand>(
            Some(Alias::L1),
            &[(Lever::GpuOneTokenSdpa, Value::Switch(true))],
        )
        .resolve_with(env)
        .unwrap();
        assert!(run.values.gpu_one_token_sdpa, "the flag beats --l1");
        let e = run.refusal(Tier::L1).unwrap();
        assert!(
            e.starts_with("lever gpu-one-token-sdpa=on (from its flag) is L3"),
            "{e}"
        );
        let run = flags::<ModelCommand>(
            Some(Alias::L3),
            &[(Lever::GpuOneTokenSdpa, Value::Switch(false))],
        )
        .resolve_with(no_env)
        .unwrap();
        let e = run.refusal(Tier::L1).unwrap();
        assert!(
            e.starts_with("lever gpu-stacked-projections=on (from --l3) is L3"),
            "{e}"
        );
        let run = flags::<ModelCommand>(
            Some(Alias::L3),
            &[
                (Lever::GpuOneTokenSdpa, Value::Switch(false)),
                (Lever::GpuStackedProjections, Value::Switch(false)),
            ],
        )
        .resolve_with(no_env)
        .unwrap();
        let e = run.refusal(Tier::L1).unwrap();
        assert!(
            e.starts_with("lever cuda-head-norm-rope=on (from --l3) is L3"),
            "{e}"
        );
        let run = flags::<ModelCommand>(
            Some(Alias::L3),
            &[
                (Lever::GpuOneTokenSdpa, Value::Switch(false)),
                (Lever::GpuStackedProjections, Value::Switch(false)),
                (Lever::CudaHeadNormRope, Value::Switch(false)),
                (Lever::DeltanetChunkedPrefill, Value::Switch(false)),
            ],
        )
        .resolve_with(no_env)
        .unwrap();
        assert!(run.refusal(Tier::L1).is_none());
    }

    #[test]
    fn environment_variables_read_as_before_and_bad_values_are_named() {
        let with = |var: &'static str, raw: &'static str| {
            move |v: &str| (v == var).then(|| raw.to_string())
        };
        let run = flags::<ModelCommand>(None, &[])
            .resolve_with(with("ARCHGEN_GPU_DECODE", "cpu-too"))
            .unwrap();
        assert!(run.values.gpu_decode && run.values.gpu_decode_on_cpu);
        let run = flags::<ModelCommand>(None, &[])
            .resolve_with(with("ARCHGEN_GPU_STACKED_PROJECTIONS", "1"))
            .unwrap();
        assert!(run.values.gpu_stacked_projections);
        let run = flags::<ModelCommand>(None, &[])
            .resolve_with(with("ARCHGEN_GPU_DECODE", "0"))
            .unwrap();
        assert!(!run.values.gpu_decode && !run.values.gpu_decode_on_cpu);
        let run = flags::<ModelCommand>(None, &[])
            .resolve_with(with("ARCHGEN_GPU_DECODE_BLOCKS", "post"))
            .unwrap();
        assert_eq!(run.values.gpu_decode_blocks, GpuBlocks::PostAttention);
        let run = flags::<ServeCommand>(None, &[])
            .resolve_with(with("MLX_CUDA_GRAPH_CACHE_SIZE", "500"))
            .unwrap();
        assert_eq!(run.values.cuda_graph_cache, 500);
        // A serve-only variable does not reach a model command's levers.
        let run = flags::<ModelCommand>(None, &[])
            .resolve_with(with("MLX_CUDA_GRAPH_CACHE_SIZE", "oops"))
            .unwrap();
        assert!(run.settings().all(|(l, _, _)| l != Lever::CudaGraphCache));
        for (var, raw, expected) in [
            (
                "ARCHGEN_EAGER_DECODE",
                "yes",
                "ARCHGEN_EAGER_DECODE=yes: expected 1 or 0",
            ),
            (
                "ARCHGEN_GPU_DECODE",
                "gpu",
                "ARCHGEN_GPU_DECODE=gpu: expected 1, 0 or cpu-too",
            ),
            (
                "ARCHGEN_GPU_STACKED_PROJECTIONS",
                "2",
                "ARCHGEN_GPU_STACKED_PROJECTIONS=2: expected 1 or 0",
            ),
            (
                "ARCHGEN_GPU_DECODE_BLOCKS",
                "mid",
                "ARCHGEN_GPU_DECODE_BLOCKS=mid: `mid` is not one of",
            ),
        ] {
            let e = flags::<ModelCommand>(None, &[])
                .resolve_with(with(var, raw))
                .unwrap_err();
            assert!(e.starts_with(expected), "{e}");
        }
    }

    #[test]
    fn the_note_lists_the_levers_on_and_their_sources() {
        let run = flags::<ModelCommand>(
            Some(Alias::L3),
            &[
                (Lever::GpuDecode, Value::Switch(false)),
                (
                    Lever::GpuDecodeBlocks,
                    Value::Blocks(GpuBlocks::PreAttention),
                ),
            ],
        )
        .resolve_with(no_env)
        .unwrap();
        assert_eq!(
            run.note(),
            "levers on: gpu-decode-blocks=pre (from its flag), gpu-one-token-sdpa (from --l3), \
             gpu-stacked-projections (from --l3), cuda-head-norm-rope (from --l3), \
             deltanet-chunked-prefill (from --l3)"
        );
        let run = flags::<ModelCommand>(None, &[(Lever::GpuDecode, Value::Switch(false))])
            .resolve_with(no_env)
            .unwrap();
        assert_eq!(run.note(), "levers on: none");
    }

    #[test]
    fn values_of_the_wrong_kind_or_range_are_refused() {
        assert!(Lever::MaxBatch.parse("0").is_err());
        assert!(Lever::MaxBatch.parse("4097").is_err());
        assert_eq!(Lever::MaxBatch.parse("4096"), Ok(Value::Count(4096)));
        assert!(Lever::EagerDecode
            .parse("1")
            .unwrap_err()
            .contains("not on or off"));
        let mut values = LeverValues::DEFAULT;
        assert!(values.set(Lever::EagerDecode, Value::Count(1)).is_err());
        assert_eq!(values, LeverValues::DEFAULT);
    }
}
