//! MLX's own distributed backends (ring over TCP, NCCL on CUDA, MPI), safely:
//! a [`Group`] from `mlx_distributed_init` by backend name, its rank and
//! size, and the two collectives tensor parallelism needs, [`all_sum`] and
//! [`all_gather`]. mlx-rs 0.33 has no distributed API; this wraps mlx-sys
//! 0.7's `mlx_distributed_*` (mlx-c 0.7) over mlx-rs `Array` handles. All
//! communication is MLX's: there is no transport of ours.
//!
//! The backends read their setup from the environment that `mlx.launch` (and
//! `archgen launch`) writes: `MLX_RANK`, and for ring `MLX_HOSTFILE` (a JSON
//! list of `"ip:port"` lists, one per rank), for NCCL `MLX_WORLD_SIZE`,
//! `NCCL_HOST_IP`, `NCCL_PORT`.
//!
//! Errors are results, never panics: a backend that is not built into this
//! libmlx, or that cannot connect, gives MLX's own message.

use std::ffi::CString;
use std::sync::{Arc, OnceLock};

use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};

use crate::mlx_c::with_captured_error;
use crate::ops::Result;

/// The backends MLX 0.32 knows, by the name `mlx_distributed_init` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// TCP sockets between CPU processes (`MLX_HOSTFILE`, `MLX_RANK`).
    Ring,
    /// NVIDIA's collectives, one process per GPU (CUDA builds of libmlx only).
    Nccl,
    /// An MPI library found at run time (`MLX_MPI_LIBNAME`).
    Mpi,
}

impl Backend {
    /// The name MLX knows the backend by.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::Nccl => "nccl",
            Backend::Mpi => "mpi",
        }
    }

    /// The backend of a name, as `--backend` spells it.
    pub fn parse(name: &str) -> std::result::Result<Backend, String> {
        match name {
            "ring" => Ok(Backend::Ring),
            "nccl" => Ok(Backend::Nccl),
            "mpi" => Ok(Backend::Mpi),
            other => Err(format!(
                "unknown distributed backend '{other}': expected one of ring, nccl, mpi"
            )),
        }
    }

    /// Whether this libmlx was built with the backend (NCCL only in CUDA
    /// builds; MPI needs its library at run time).
    pub fn is_available(self) -> bool {
        let name = CString::new(self.name()).expect("backend names have no NUL");
        unsafe { mlx_sys::mlx_distributed_is_available(name.as_ptr()) }
    }
}

/// Owns one `mlx_distributed_group` (a C++ `Group`, a shared pointer to the
/// backend's communicator).
struct RawGroup(mlx_sys::mlx_distributed_group);

// SAFETY: the C++ Group is an immutable handle (a shared_ptr to the
// backend); MLX itself hands the same group to its scheduler threads.
unsafe impl Send for RawGroup {}
unsafe impl Sync for RawGroup {}

impl Drop for RawGroup {
    fn drop(&mut self) {
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.0);
        }
    }
}

/// A distributed group: this process's rank among `size` processes.
#[derive(Clone)]
pub struct Group {
    raw: Arc<RawGroup>,
    rank: i32,
    size: i32,
    backend: Backend,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Group({} rank {} of {})",
            self.backend.name(),
            self.rank,
            self.size
        )
    }
}

/// How one linear module is split over the ranks (mlx nn `shard_linear`;
/// the runtime mirror of the plan's `tensor_parallel::Split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Rows of the weight, scales, biases and bias: `AllToShardedLinear`.
    AllToSharded,
    /// Columns of the weight, scales and biases; the block sums the partial
    /// products over ranks ([`sharded_to_all`]): `ShardedToAllLinear`.
    ShardedToAll,
    /// Axis 0 cut at `at` into three segments, each split over the ranks,
    /// this rank's parts concatenated (mlx `_shard` with `segments`:
    /// qwen3_5's `in_proj_qkv` and `conv1d`, q, k and v side by side).
    Segmented { at: [i32; 2] },
    /// A parameter vector split over the ranks along axis 0 (qwen3_5's
    /// `dt_bias`, `A_log`); named by its full tensor path.
    Vector,
    /// Rows grouped by `heads` heads, each head repeated `times` times in
    /// place, then all-to-sharded (qwen3_5's K/V when there are fewer KV
    /// heads than ranks: `repeat_kv_layer_inplace`).
    RepeatedHeads { heads: i32, times: i32 },
}

/// The group this process's model is sharded over, set when a loader is
/// given a split ([`crate::weights::Weights::shard`]). One process runs one
/// tensor-parallel group: every sharded-to-all projection of the blocks
/// (`o_proj`, `down_proj`) sums over it, and the CPU decode path's compiled
/// blocks (`decode`) stay off (they stack Q/K/V by the full head counts and
/// do not trace the all_sum).
static GROUP: OnceLock<Group> = OnceLock::new();

/// Whether this process's model is sharded over more than one rank.
pub fn tensor_parallel() -> bool {
    GROUP.get().is_some_and(|g| g.size > 1)
}

/// The group models of this process are sharded over, if any.
pub fn sharding_group() -> Option<&'static Group> {
    GROUP.get()
}

/// Whether the model's head is split over the vocabulary (qwen3_5's
/// `shard()`): then its logits are gathered ([`gather_vocab`]).
static VOCAB_SPLIT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn split_vocab() {
    VOCAB_SPLIT.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The logits of a head split over the vocabulary, gathered as mlx-lm's
/// `gather_last_axis` does: `all_gather(x.reshape(-1, V/N))`, reshaped to
/// `[N, rows, V/N]`, transposed to `[rows, N, V/N]` and reshaped to
/// `[..., V]` (rank order). Logits of a whole head come back as they are.
pub fn gather_vocab(x: Array) -> Result<Array> {
    let group = match GROUP.get() {
        Some(g) if g.size > 1 && VOCAB_SPLIT.load(std::sync::atomic::Ordering::Relaxed) => g,
        Some(_) | None => return Ok(x),
    };
    let shape = x.shape().to_vec();
    let Some((&size, lead)) = shape.split_last() else {
        return Err(Exception::custom("gathering logits of no axis"));
    };
    let parts = group.all_gather(&x.reshape(&[-1, size])?)?;
    let parts = parts
        .reshape(&[group.size, -1, size])?
        .transpose_axes(&[1, 0, 2])?;
    let mut out = lead.to_vec();
    out.push(group.size * size);
    parts.reshape(&out)
}

pub(crate) fn install(group: &Group) -> Result<()> {
    let installed = GROUP.get_or_init(|| group.clone());
    if Arc::ptr_eq(&installed.raw, &group.raw) {
        Ok(())
    } else {
        Err(Exception::custom(
            "a second distributed group: one process shards its models over one group",
        ))
    }
}

/// The end of a sharded-to-all projection, as `ShardedToAllLinear` runs
/// it: `x @ W_shard.T` (computed by the caller), then `all_sum` over the
/// group. Unsharded runs return `x` as it is. (A bias would be added after
/// the sum; the loader refuses sharded-to-all projections with a bias.)
pub fn sharded_to_all(x: Array) -> Result<Array> {
    match GROUP.get() {
        Some(g) if g.size > 1 => g.all_sum(&x),
        Some(_) | None => Ok(x),
    }
}

impl Group {
    /// `mx.distributed.init(strict=True, backend=...)`: joins the group the
    /// environment describes. Fails with MLX's message when the backend is not
    /// built in or cannot connect (the ring backend gives up after its own
    /// retries when a peer never comes up).
    pub fn init(backend: Backend) -> Result<Group> {
        if !backend.is_available() {
            return Err(Exception::custom(format!(
                "the {} backend is not available in this libmlx ({})",
                backend.name(),
                match backend {
                    Backend::Ring => "the ring backend needs MLX's CPU backend",
                    Backend::Nccl => "NCCL exists only in CUDA builds of MLX (mlx-cuda)",
                    Backend::Mpi => "MLX dlopens libmpi; set MLX_MPI_LIBNAME or install MPI",
                }
            )));
        }
        let name = CString::new(backend.name()).expect("backend names have no NUL");
        let mut raw = unsafe { mlx_sys::mlx_distributed_group_new() };
        let init = with_captured_error(
            &format!("initialising the {} backend", backend.name()),
            || unsafe { mlx_sys::mlx_distributed_init(&mut raw, true, name.as_ptr()) },
        );
        let raw = RawGroup(raw);
        init?;
        if raw.0.ctx.is_null() {
            return Err(Exception::custom(format!(
                "initialising the {} backend gave no group",
                backend.name()
            )));
        }
        let rank = unsafe { mlx_sys::mlx_distributed_group_rank(raw.0) };
        let size = unsafe { mlx_sys::mlx_distributed_group_size(raw.0) };
        if size < 1 || rank < 0 || rank >= size {
            return Err(Exception::custom(format!(
                "the {} backend reported rank {rank} of {size}",
                backend.name()
            )));
        }
        Ok(Group {
            raw: Arc::new(raw),
            rank,
            size,
            backend,
        })
    }

    pub fn rank(&self) -> i32 {
        self.rank
    }

    pub fn size(&self) -> i32 {
        self.size
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    fn collective(
        &self,
        what: &str,
        x: &Array,
        op: unsafe extern "C" fn(
            *mut mlx_sys::mlx_array,
            mlx_sys::mlx_array,
            mlx_sys::mlx_distributed_group,
            mlx_sys::mlx_stream,
        ) -> i32,
    ) -> Result<Array> {
        let stream = Stream::thread_local_or_default();
        let mut res = unsafe { mlx_sys::mlx_array_new() };
        let done = with_captured_error(what, || unsafe {
            op(&mut res, x.as_ptr(), self.raw.0, stream.as_ptr())
        });
        match done {
            // SAFETY: on success mlx-c set `res` to a new array we now own.
            Ok(()) => Ok(unsafe { Array::from_ptr(res) }),
            Err(e) => {
                unsafe { mlx_sys::mlx_array_free(res) };
                Err(e)
            }
        }
    }

    /// `mx.distributed.all_sum(x, group=self)`: the element-wise sum of `x`
    /// over every rank (lazy; communication happens when it is evaluated).
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        self.collective("all_sum", x, mlx_sys::mlx_distributed_all_sum)
    }

    /// `mx.distributed.all_gather(x, group=self)`: every rank's `x`
    /// concatenated along the first axis, rank 0 first.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        self.collective("all_gather", x, mlx_sys::mlx_distributed_all_gather)
    }
}

/// [`Group::all_sum`].
pub fn all_sum(x: &Array, group: &Group) -> Result<Array> {
    group.all_sum(x)
}

/// [`Group::all_gather`].
pub fn all_gather(x: &Array, group: &Group) -> Result<Array> {
    group.all_gather(x)
}
