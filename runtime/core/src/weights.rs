//! Checkpoint loading from an mlx-community style directory: config.json plus
//! `model.safetensors` or sharded `model-0000x-of-0000y.safetensors` (with or
//! without the index), then (after the monolith crate's sanitize, which
//! applies the block IR's rules) handed out by module path with shape checks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};

use crate::distributed::{self, Group, Split};
use crate::layers::{Embedding, Linear, MultiLinear, QuantForm, Quantized, SwitchLinear};

/// The module path of an untied head, relative to the text model.
pub const HEAD_MODULE: &str = "lm_head";

fn split_name(s: Split) -> &'static str {
    match s {
        Split::AllToSharded => "all-to-sharded",
        Split::ShardedToAll => "sharded-to-all",
        Split::Segmented { .. } => "all-to-sharded by segments",
        Split::Vector => "split in N",
        Split::RepeatedHeads { .. } => "heads repeated, then all-to-sharded",
    }
}

/// A loading error that names the file, tensor or field, and says what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(pub String);

/// The dtypes a floating-point parameter may be stored in.
const FLOAT: &[Dtype] = &[Dtype::Bfloat16, Dtype::Float16, Dtype::Float32];

fn err<T>(msg: impl Into<String>) -> Result<T, LoadError> {
    Err(LoadError(msg.into()))
}

/// The raw checkpoint: its config.json and every tensor, keyed as mlx-lm's
/// model tree names them after sanitize.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: serde_json::Value,
    pub tensors: HashMap<String, Array>,
}

/// A load-progress callback: `(bytes read, bytes in all)`.
pub type LoadProgress = Box<dyn FnMut(u64, u64)>;

thread_local! {
    /// The callback [`with_load_progress`] installs for loads on this thread.
    static LOAD_PROGRESS: std::cell::RefCell<Option<LoadProgress>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with `progress` installed for this thread: every
/// [`read_checkpoint`] inside it behaves as [`read_checkpoint_with_progress`]
/// with that callback. A scoped hook rather than a parameter, so that the
/// loaders between the CLI and this function (the monolith's `read_dir`)
/// keep their signatures.
pub fn with_load_progress<R>(progress: LoadProgress, f: impl FnOnce() -> R) -> R {
    /// Uninstalls the callback however `f` ends.
    struct Uninstall;
    impl Drop for Uninstall {
        fn drop(&mut self) {
            LOAD_PROGRESS.with_borrow_mut(|p| *p = None);
        }
    }
    LOAD_PROGRESS.with_borrow_mut(|p| *p = Some(progress));
    let _uninstall = Uninstall;
    f()
}

/// Reads config.json and all weight files of `dir`. The tensors stay lazy
/// (MLX reads their data when they are first evaluated), unless a
/// [`with_load_progress`] callback is installed on this thread.
pub fn read_checkpoint(dir: &Path) -> Result<Checkpoint, LoadError> {
    let mut installed = LOAD_PROGRESS.with_borrow_mut(Option::take);
    let result = match installed.as_mut() {
        Some(progress) => read_checkpoint_with_progress(dir, Some(progress.as_mut())),
        None => read_checkpoint_with_progress(dir, None),
    };
    LOAD_PROGRESS.with_borrow_mut(|p| *p = installed);
    result
}

/// [`read_checkpoint`], and with `progress` it reads every tensor's data now
/// (evaluating it) and reports `(bytes read, bytes in all)` after each one;
/// the total is the weight files' size, reached when the last file is done.
/// The bytes are the same either way; only when they are read moves.
pub fn read_checkpoint_with_progress(
    dir: &Path,
    mut progress: Option<&mut dyn FnMut(u64, u64)>,
) -> Result<Checkpoint, LoadError> {
    if !dir.is_dir() {
        return err(format!(
            "{}: not a directory; pass a model directory holding config.json and *.safetensors",
            dir.display()
        ));
    }
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .or_else(|e| err(format!("{}: cannot read: {e}", config_path.display())))?;
    let config: serde_json::Value = serde_json::from_str(&text).or_else(|e| {
        err(format!(
            "{}:{}:{}: invalid JSON: {e}",
            config_path.display(),
            e.line(),
            e.column()
        ))
    })?;
    let files = weight_files(dir)?;
    let sizes: Vec<u64> = files
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
        .collect();
    let total: u64 = sizes.iter().sum();
    let mut files_done = 0u64;
    let mut tensors = HashMap::new();
    for (i, file) in files.iter().enumerate() {
        if files.len() > 1 && progress.is_none() {
            eprintln!(
                "archgen: loading {} ({}/{})",
                file.file_name().unwrap_or_default().to_string_lossy(),
                i + 1,
                files.len()
            );
        }
        check_safetensors_header(file)?;
        let loaded = Array::load_safetensors(file)
            .or_else(|e| err(format!("{}: cannot load safetensors: {e}", file.display())))?;
        let mut file_done = 0u64;
        for (name, array) in loaded {
            if let Some(report) = progress.as_mut() {
                array.eval().or_else(|e| {
                    err(format!(
                        "{}: cannot read tensor '{name}': {e}",
                        file.display()
                    ))
                })?;
                file_done += array.nbytes() as u64;
                report((files_done + file_done).min(total), total);
            }
            if tensors.insert(name.clone(), array).is_some() {
                return err(format!(
                    "{}: tensor '{name}' also appears in another weight file",
                    file.display()
                ));
            }
        }
        files_done += sizes[i];
        if let Some(report) = progress.as_mut() {
            report(files_done, total);
        }
    }
    Ok(Checkpoint {
        dir: dir.to_path_buf(),
        config,
        tensors,
    })
}

/// The weight files: those the index names, or else every `model*.safetensors`
/// (what mlx-lm globs), sorted so loading order is deterministic.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index)
            .or_else(|e| err(format!("{}: cannot read: {e}", index.display())))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .or_else(|e| err(format!("{}: invalid JSON: {e}", index.display())))?;
        let Some(map) = value.get("weight_map").and_then(|m| m.as_object()) else {
            return err(format!("{}: no \"weight_map\" object", index.display()));
        };
        let names: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        let mut files = Vec::new();
        for name in names {
            let path = dir.join(name);
            if !path.is_file() {
                return err(format!(
                    "{}: weight_map names '{name}', which is missing from {}",
                    index.display(),
                    dir.display()
                ));
            }
            files.push(path);
        }
        if !files.is_empty() {
            return Ok(files);
        }
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .or_else(|e| err(format!("{}: cannot list: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("model") && name.ends_with(".safetensors")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return err(format!("{}: no model*.safetensors files", dir.display()));
    }
    Ok(files)
}

/// Largest safetensors header read (the JSON before the data); real
/// checkpoints stay far below this, even with thousands of tensors.
pub const MAX_SAFETENSORS_HEADER: u64 = 100 << 20;

/// The element size of a safetensors dtype string that MLX loads, or `None`
/// for one it does not (MLX rejects F64, F8_E5M2, ...).
fn safetensors_dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "C64" => 8,
        _ => return None,
    })
}

/// Validates a safetensors file before handing it to MLX, so a truncated or
/// corrupt file is a clear error rather than an abort or a failure deep inside
/// a lazy evaluation: the header length fits the file and a bound, the header
/// is a JSON object of tensors with known dtypes, shapes whose byte size is
/// their offset range, and ranges that tile the data section exactly.
pub fn check_safetensors_header(path: &Path) -> Result<(), LoadError> {
    use std::io::Read;
    let what = |m: String| LoadError(format!("{}: corrupt safetensors file: {m}", path.display()));
    let mut f = std::fs::File::open(path).map_err(|e| what(e.to_string()))?;
    let size = f.metadata().map_err(|e| what(e.to_string()))?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|_| {
        what(format!(
            "expected an 8-byte header length, found a {size}-byte file"
        ))
    })?;
    let n = u64::from_le_bytes(len);
    if n > size - 8 {
        return Err(what(format!(
            "header length {n} exceeds the {} bytes after the length field (truncated, or not a safetensors file)",
            size - 8
        )));
    }
    if n > MAX_SAFETENSORS_HEADER {
        return Err(what(format!(
            "header length {n} exceeds the limit of {MAX_SAFETENSORS_HEADER} bytes"
        )));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|e| what(e.to_string()))?;
    let header: serde_json::Value = serde_json::from_slice(&header).map_err(|e| {
        what(format!(
            "header is not valid JSON (header byte {}): {e}",
            e.column()
        ))
    })?;
    let Some(entries) = header.as_object() else {
        return Err(what(format!(
            "expected a JSON object as header, found {}",
            json_kind(&header)
        )));
    };
    let data_len = size - 8 - n;
    let mut ranges: Vec<(u64, u64, &str)> = Vec::with_capacity(entries.len());
    for (name, info) in entries {
        if name == "__metadata__" {
            // MLX writes `null` when there is no metadata.
            if !info.is_object() && !info.is_null() {
                return Err(what(format!(
                    "__metadata__: expected an object, found {}",
                    json_kind(info)
                )));
            }
            continue;
        }
        let t = |m: String| what(format!("tensor '{name}': {m}"));
        let dtype = info
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| t("no \"dtype\" string".into()))?;
        let elem = safetensors_dtype_size(dtype).ok_or_else(|| {
            t(format!(
                "expected a dtype MLX loads (BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, C64, F8_E4M3), found \"{dtype}\""
            ))
        })?;
        let shape = info
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| t("no \"shape\" array".into()))?;
        let mut count: u64 = 1;
        let mut dims = Vec::with_capacity(shape.len());
        for d in shape {
            let d = d
                .as_u64()
                .filter(|d| *d <= i32::MAX as u64)
                .ok_or_else(|| {
                    t(format!(
                        "expected shape dimensions in 0..={}, found {d}",
                        i32::MAX
                    ))
                })?;
            dims.push(d);
            count = count
                .checked_mul(d)
                .ok_or_else(|| t(format!("shape {dims:?}... overflows")))?;
        }
        let offsets = info
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .filter(|o| o.len() == 2)
            .and_then(|o| Some((o[0].as_u64()?, o[1].as_u64()?)))
            .ok_or_else(|| t("no \"data_offsets\" [begin, end] pair".into()))?;
        let (begin, end) = offsets;
        if end < begin {
            return Err(t(format!("data_offsets [{begin}, {end}] run backwards")));
        }
        if end > data_len {
            return Err(t(format!(
                "ends at byte {end} but the data section has {data_len} bytes (truncated?)"
            )));
        }
        let bytes = count
            .checked_mul(elem)
            .ok_or_else(|| t(format!("shape {dims:?} overflows")))?;
        if end - begin != bytes {
            return Err(t(format!(
                "expected {bytes} bytes for {dtype} {dims:?}, found data_offsets [{begin}, {end}] ({} bytes)",
                end - begin
            )));
        }
        ranges.push((begin, end, name));
    }
    ranges.sort();
    let mut at = 0;
    for (begin, end, name) in ranges {
        if begin != at {
            return Err(what(format!(
                "tensor '{name}': expected its data to start at byte {at} (tensors must tile the data section), found {begin}"
            )));
        }
        at = end;
    }
    if at != data_len {
        return Err(what(format!(
            "expected the tensors to cover the {data_len}-byte data section, found {at} bytes covered"
        )));
    }
    Ok(())
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Hands out tensors by module path and records which were used, so missing,
/// unexpected and mis-shaped tensors are all named.
pub struct Weights {
    tensors: HashMap<String, Array>,
    used: BTreeSet<String>,
    /// Per-module quantization from config.json `quantization`: a default
    /// and per-path overrides (`None` = explicitly unquantized).
    quant_default: Option<QuantEntry>,
    quant_overrides: BTreeMap<String, Option<QuantEntry>>,
    errors: Vec<String>,
    /// This rank's split of the modules, when the model is sharded
    /// ([`Weights::shard`]).
    sharding: Option<Sharding>,
    /// Every tensor handed to the model (this rank's part), by name:
    /// [`Weights::finish`] reads them all in one evaluation.
    handed: Vec<(String, Array)>,
}

/// One entry of config.json's `quantization`: bits, group size and mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QuantEntry {
    bits: i32,
    group: i32,
    mode: EntryMode,
}

/// The `mode` of a quantization entry the loader runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryMode {
    /// `affine` (or no `mode`: mlx's default).
    Affine,
    /// `mxfp4`: no biases, uint8 scales.
    Mxfp4,
}

impl QuantEntry {
    /// Reads `bits`, `group_size` and `mode` of `v` (None when `bits` or
    /// `group_size` is missing); a mode the loader does not run is an error
    /// naming the entry.
    fn read(v: &serde_json::Value, at: &str) -> Result<Option<QuantEntry>, String> {
        let int = |k: &str| v.get(k).and_then(|x| x.as_i64()).map(|x| x as i32);
        let mode = match v.get("mode").and_then(|m| m.as_str()) {
            None | Some("affine") => EntryMode::Affine,
            Some("mxfp4") => EntryMode::Mxfp4,
            Some(other) => {
                return Err(format!(
                    "config.json quantization{at}: mode `{other}` is not run by archgen's loader \
                     (affine and mxfp4 are)"
                ))
            }
        };
        Ok(match (int("bits"), int("group_size")) {
            (Some(bits), Some(group)) => Some(QuantEntry { bits, group, mode }),
            _ => None,
        })
    }
}

/// Which modules are split, and this process's part.
struct Sharding {
    rank: i32,
    size: i32,
    /// Module path (relative to the text model) -> split.
    splits: BTreeMap<String, Split>,
}

/// qwen3_5's `_repeat` of `repeat_kv_layer_inplace`: `p.reshape(heads,
/// rows / heads, ...)`, `mx.repeat(p, times, axis=0)`, reshaped back to
/// `(-1, ...)`: each head's rows `times` times in a row.
fn repeat_heads(p: &Array, heads: i32, times: i32) -> mlx_rs::error::Result<Array> {
    let shape = p.shape();
    let Some((&rows, rest)) = shape.split_first() else {
        return Err(mlx_rs::error::Exception::custom(
            "a scalar has no heads to repeat",
        ));
    };
    if heads <= 0 || rows % heads != 0 {
        return Err(mlx_rs::error::Exception::custom(format!(
            "{rows} rows do not group into {heads} heads"
        )));
    }
    let mut grouped = vec![heads, rows / heads];
    grouped.extend_from_slice(rest);
    let repeated = Array::repeat_axis::<f32>(p.reshape(&grouped)?, times, 0)?;
    let mut back = vec![-1];
    back.extend_from_slice(rest);
    repeated.reshape(&back)
}

impl Weights {
    pub fn new(tensors: HashMap<String, Array>, quantization: Option<&serde_json::Value>) -> Self {
        let mut quant_default = None;
        let mut quant_overrides = BTreeMap::new();
        let mut errors = Vec::new();
        if let Some(q) = quantization.and_then(|q| q.as_object()) {
            let whole = serde_json::Value::Object(q.clone());
            match QuantEntry::read(&whole, "") {
                Ok(entry) => quant_default = entry,
                Err(e) => errors.push(e),
            }
            for (k, v) in q {
                match v {
                    serde_json::Value::Bool(false) => {
                        quant_overrides.insert(k.clone(), None);
                    }
                    serde_json::Value::Object(_) => match QuantEntry::read(v, &format!(".{k}")) {
                        Ok(Some(entry)) => {
                            quant_overrides.insert(k.clone(), Some(entry));
                        }
                        Ok(None) => {}
                        Err(e) => errors.push(e),
                    },
                    _ => {}
                }
            }
        }
        Weights {
            tensors,
            used: BTreeSet::new(),
            quant_default,
            quant_overrides,
            errors,
            sharding: None,
            handed: Vec::new(),
        }
    }

    /// Loads this rank's slices of the `splits` modules from now on (mlx-lm's
    /// `sharded_load`: the model's tensors are loaded lazily and `shard()`
    /// replaces each split weight by its contiguous slice before anything is
    /// evaluated, so only the slice is kept). Callers keep asking for the full
    /// shapes; they are checked against the checkpoint before slicing.
    /// `o_proj` / `down_proj` of the blocks sum over `group` from then on
    /// ([`distributed::sharded_to_all`]).
    pub fn shard(
        &mut self,
        group: &Group,
        splits: impl IntoIterator<Item = (String, Split)>,
    ) -> Result<(), LoadError> {
        distributed::install(group).map_err(|e| LoadError(e.what().to_string()))?;
        let splits: BTreeMap<String, Split> = splits.into_iter().collect();
        // An untied head split over the vocabulary: its logits are
        // gathered (`distributed::gather_vocab`).
        match splits.get(HEAD_MODULE) {
            Some(Split::AllToSharded) => distributed::split_vocab(),
            Some(s) => {
                return Err(LoadError(format!(
                    "module '{HEAD_MODULE}': the head is split over the vocabulary \
                     (all-to-sharded) or not at all, not {}",
                    split_name(*s)
                )))
            }
            None => {}
        }
        self.sharding = Some(Sharding {
            rank: group.rank(),
            size: group.size(),
            splits,
        });
        Ok(())
    }

    /// Over how many ranks module `path` is split: the group's size when
    /// the model is sharded and `path` is one of the split modules, else 1.
    /// A block whose shape is static (a Gated DeltaNet layer's head counts)
    /// divides it by this.
    pub fn parts(&self, path: &str) -> i32 {
        match &self.sharding {
            Some(sh) if sh.splits.contains_key(path) => sh.size,
            Some(_) | None => 1,
        }
    }

    /// This rank's part of tensor `name` when its module is split, as mlx's
    /// `_shard` takes it: `split(weight, N, axis)[rank]`, made contiguous;
    /// the axis is the output rows (`max(ndim - 2, 0)`, the last axis for a
    /// bias) for all-to-sharded, the last axis for sharded-to-all.
    fn local(&mut self, name: &str, a: Array) -> Array {
        let part = self.rank_part(name, a);
        self.handed.push((name.to_string(), part.clone()));
        part
    }

    /// [`Weights::local`]'s part of `a`, not yet recorded as handed out.
    fn rank_part(&mut self, name: &str, a: Array) -> Array {
        let Some(sh) = &self.sharding else {
            return a;
        };
        // A parameter split by its own name (`Split::Vector`), else the
        // tensor of a split module.
        let (module, leaf, split) = match sh.splits.get(name).copied() {
            Some(split) => (name, "", split),
            None => {
                let Some((module, leaf)) = name.rsplit_once('.') else {
                    return a;
                };
                let Some(split) = sh.splits.get(module).copied() else {
                    return a;
                };
                (module, leaf, split)
            }
        };
        let a = match split {
            Split::RepeatedHeads { heads, times } => match repeat_heads(&a, heads, times) {
                Ok(r) => r,
                Err(e) => {
                    self.errors.push(format!(
                        "tensor '{name}': repeating its {heads} heads {times} times (module \
                         '{module}', more ranks than KV heads) failed: {e}"
                    ));
                    return a;
                }
            },
            Split::AllToSharded | Split::ShardedToAll | Split::Segmented { .. } | Split::Vector => {
                a
            }
        };
        let ndim = a.ndim() as i32;
        let axis = match (split, leaf) {
            (Split::Segmented { at }, _) => return self.segmented(name, module, a, at),
            (Split::Vector, _) => 0,
            (Split::AllToSharded | Split::RepeatedHeads { .. }, "bias") => ndim - 1,
            (Split::AllToSharded | Split::RepeatedHeads { .. }, _) => (ndim - 2).max(0),
            (Split::ShardedToAll, "bias") => {
                self.errors.push(format!(
                    "tensor '{name}': a sharded-to-all projection with a bias (mlx adds it after \
                     the all_sum; no runtime block does that yet): run this model on one rank"
                ));
                return a;
            }
            (Split::ShardedToAll, _) => ndim - 1,
        };
        let (rank, size) = (sh.rank, sh.size);
        let n = a.shape()[axis as usize];
        if n % size != 0 {
            self.errors.push(format!(
                "tensor '{name}': axis {axis} has {n} entries, which do not split into {size} \
                 equal parts ({} of module '{module}'); run it on a world size that divides {n}",
                split_name(split)
            ));
            return a;
        }
        let part = a
            .split_equal(size, axis)
            .and_then(|parts| parts[rank as usize].contiguous());
        match part {
            Ok(p) => p,
            Err(e) => {
                self.errors.push(format!(
                    "tensor '{name}': taking rank {rank}'s slice failed: {e}"
                ));
                a
            }
        }
    }

    /// This rank's part of tensor `name` of a module split by segments:
    /// axis 0 cut at `at` into three segments, each split in N, this rank's
    /// parts concatenated and made contiguous (mlx `_shard`:
    /// `contiguous(concatenate([split(part, N)[rank] for part in
    /// split(w, segments)]))`).
    fn segmented(&mut self, name: &str, module: &str, a: Array, at: [i32; 2]) -> Array {
        let Some(sh) = &self.sharding else {
            return a;
        };
        let (rank, size) = (sh.rank, sh.size);
        let n = a.shape().first().copied().unwrap_or(0);
        let bounds = [0, at[0], at[1], n];
        let lengths: Vec<i32> = bounds.windows(2).map(|w| w[1] - w[0]).collect();
        if lengths.iter().any(|&l| l < 0 || l % size != 0) {
            self.errors.push(format!(
                "tensor '{name}': axis 0 has {n} entries, cut at {} and {} into segments of \
                 {lengths:?}, which do not each split into {size} equal parts (all-to-sharded \
                 by segments of module '{module}'); run it on a world size that divides them",
                at[0], at[1]
            ));
            return a;
        }
        let part = a.split_at_indices(&at, 0).and_then(|segments| {
            let mine = segments
                .iter()
                .map(|s| s.split_equal(size, 0).map(|p| p[rank as usize].clone()))
                .collect::<Result<Vec<_>, _>>()?;
            mlx_rs::ops::concatenate(&mine, 0)?.contiguous()
        });
        match part {
            Ok(p) => p,
            Err(e) => {
                self.errors.push(format!(
                    "tensor '{name}': taking rank {rank}'s segments failed: {e}"
                ));
                a
            }
        }
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tensors.keys().cloned().collect();
        v.sort();
        v
    }

    fn take(&mut self, name: &str) -> Option<Array> {
        let a = self.tensors.get(name).cloned();
        if a.is_some() {
            self.used.insert(name.to_string());
        } else {
            self.errors.push(format!("missing tensor '{name}'"));
        }
        a
    }

    fn check(&mut self, name: &str, a: &Array, shape: &[i32], dtypes: &[Dtype]) -> bool {
        let mut ok = true;
        if a.shape() != shape {
            self.errors.push(format!(
                "tensor '{name}': expected shape {shape:?}, found {:?}",
                a.shape()
            ));
            ok = false;
        }
        if !dtypes.contains(&a.dtype()) {
            let expected: Vec<String> = dtypes.iter().map(|d| format!("{d:?}")).collect();
            self.errors.push(format!(
                "tensor '{name}': expected dtype {}, found {:?}",
                expected.join(" or "),
                a.dtype()
            ));
            ok = false;
        }
        ok
    }

    fn placeholder() -> Array {
        Array::from_f32(0.0)
    }

    /// A plain parameter (norm weight, layer scalar, router scale): floating point.
    pub fn param(&mut self, name: &str, shape: &[i32]) -> Array {
        match self.take(name) {
            Some(a) => {
                self.check(name, &a, shape, FLOAT);
                self.local(name, a)
            }
            None => Self::placeholder(),
        }
    }

    /// A norm weight the norm applies as `1 + w` (gemma2's
    /// `mx.fast.rms_norm(x, 1.0 + self.weight, eps)`), computed once here:
    /// the same weak-scalar add in the weight's dtype that mlx-lm repeats on
    /// every call ([`crate::ops::one_plus`]), so the norm sees the same bits.
    pub fn param_one_plus(&mut self, name: &str, shape: &[i32]) -> Array {
        let w = self.param(name, shape);
        match crate::ops::one_plus(&w).and_then(|a| a.eval().map(|()| a)) {
            Ok(a) => a,
            Err(e) => {
                self.errors
                    .push(format!("tensor '{name}': computing 1 + weight failed: {e}"));
                w
            }
        }
    }

    /// The quantization that applies to module `path` with input width `in_dims`,
    /// following mlx-lm's load: explicit per-path entry, else quantized iff
    /// `path.scales` exists, with config.json's `quantization` bits and
    /// group size (inferred from the shapes only when config.json has none).
    fn quant_for(&self, path: &str, in_dims: i32) -> Result<Option<QuantEntry>, String> {
        if let Some(o) = self.quant_overrides.get(path) {
            return Ok(*o);
        }
        let Some(scales) = self.tensors.get(&format!("{path}.scales")) else {
            return Ok(None);
        };
        let Some(weight) = self.tensors.get(&format!("{path}.weight")) else {
            return Ok(None);
        };
        if let Some(q) = self.quant_default {
            return Ok(Some(q));
        }
        let groups = *scales.shape().last().unwrap_or(&0);
        let packed = *weight.shape().last().unwrap_or(&0);
        if groups <= 0 || in_dims % groups != 0 {
            return Err(format!(
                "tensor '{path}.scales': {groups} groups do not divide the input width {in_dims}"
            ));
        }
        Ok(Some(QuantEntry {
            bits: (packed * 32) / in_dims,
            group: in_dims / groups,
            mode: EntryMode::Affine,
        }))
    }

    fn quantized(
        &mut self,
        path: &str,
        lead: &[i32],
        out: i32,
        in_dims: i32,
    ) -> (Array, Option<Quantized>) {
        let wname = format!("{path}.weight");
        let quant = match self.quant_for(path, in_dims) {
            Ok(q) => q,
            Err(e) => {
                self.errors.push(e);
                None
            }
        };
        let Some(w) = self.take(&wname) else {
            return (Self::placeholder(), None);
        };
        let mut shape = lead.to_vec();
        match quant {
            None => {
                shape.extend([out, in_dims]);
                self.check(&wname, &w, &shape, FLOAT);
                (self.local(&wname, w), None)
            }
            Some(QuantEntry { bits, group, mode }) => {
                let fits_mode = match mode {
                    EntryMode::Affine => true,
                    EntryMode::Mxfp4 => bits == 4 && group == 32,
                };
                if !fits_mode {
                    self.errors.push(format!(
                        "module '{path}': mxfp4 quantization is 4 bits in groups of 32, the config says bits={bits} group_size={group}"
                    ));
                    return (w, None);
                }
                if ![2, 3, 4, 5, 6, 8].contains(&bits)
                    || group <= 0
                    || in_dims % group != 0
                    || (in_dims * bits) % 32 != 0
                {
                    self.errors.push(format!(
                        "module '{path}': quantization bits={bits} group_size={group} does not fit input width {in_dims}"
                    ));
                    return (w, None);
                }
                shape.extend([out, in_dims * bits / 32]);
                if w.shape().len() == shape.len()
                    && w.shape()[..shape.len() - 1] == shape[..shape.len() - 1]
                    && w.shape()[shape.len() - 1] != shape[shape.len() - 1]
                {
                    let packed = w.shape()[shape.len() - 1];
                    self.errors.push(format!(
                        "tensor '{wname}': expected shape {shape:?} for bits={bits} group_size={group} (config.json quantization), found {:?}, which packs {} bits per weight",
                        w.shape(),
                        packed as f64 * 32.0 / in_dims as f64
                    ));
                    self.check(&wname, &w, w.shape().to_vec().as_slice(), &[Dtype::Uint32]);
                } else {
                    self.check(&wname, &w, &shape, &[Dtype::Uint32]);
                }
                let mut sshape = lead.to_vec();
                sshape.extend([out, in_dims / group]);
                let (scales, form) = match mode {
                    EntryMode::Affine => {
                        let scales = self.param(&format!("{path}.scales"), &sshape);
                        let biases = self.param(&format!("{path}.biases"), &sshape);
                        (scales, QuantForm::Affine { biases })
                    }
                    EntryMode::Mxfp4 => {
                        let name = format!("{path}.scales");
                        let scales = match self.take(&name) {
                            Some(a) => {
                                self.check(&name, &a, &sshape, &[Dtype::Uint8]);
                                self.local(&name, a)
                            }
                            None => Self::placeholder(),
                        };
                        (scales, QuantForm::Mxfp4)
                    }
                };
                (
                    self.local(&wname, w),
                    Some(Quantized {
                        scales,
                        form,
                        group_size: group,
                        bits,
                    }),
                )
            }
        }
    }

    /// A linear layer [out, in] (dense or quantized).
    pub fn linear(&mut self, path: &str, out: i32, in_dims: i32) -> Linear {
        let (weight, quant) = self.quantized(path, &[], out, in_dims);
        Linear {
            weight,
            quant,
            weight_t: None,
            bias: None,
        }
    }

    /// An embedding table [rows, dims] (dense or quantized).
    pub fn embedding(&mut self, path: &str, rows: i32, dims: i32) -> Embedding {
        let (weight, quant) = self.quantized(path, &[], rows, dims);
        Embedding {
            table: Linear {
                weight,
                quant,
                weight_t: None,
                bias: None,
            },
        }
    }

    /// Per-head weights [heads, out, in] (`MultiLinear`).
    pub fn multi_linear(&mut self, path: &str, heads: i32, out: i32, in_dims: i32) -> MultiLinear {
        let (weight, quant) = self.quantized(path, &[heads], out, in_dims);
        MultiLinear { weight, quant }
    }

    /// Expert weights [experts, out, in].
    pub fn switch_linear(
        &mut self,
        path: &str,
        experts: i32,
        out: i32,
        in_dims: i32,
    ) -> SwitchLinear {
        let (weight, quant) = self.quantized(path, &[experts], out, in_dims);
        SwitchLinear {
            weight,
            quant,
            bias: None,
        }
    }

    /// Drops this loader's reference to every tensor under `prefix` that
    /// was already taken. A model that rearranged some (generated models
    /// stack Q/K/V into one buffer and keep views of it) then frees the
    /// originals now instead of when loading ends, so loading does not peak
    /// at two copies of them. Taken tensors stay taken for [`Weights::finish`].
    pub fn release(&mut self, prefix: &str) {
        let used = &self.used;
        self.tensors
            .retain(|name, _| !(name.starts_with(prefix) && used.contains(name)));
        self.handed.retain(|(name, _)| !name.starts_with(prefix));
    }

    /// Ends loading: errors for every missing, mis-shaped or unused tensor;
    /// without any, it reads every tensor handed to the model now, in one
    /// evaluation, as mlx-lm's `load_model` ends with
    /// `mx.eval(model.parameters())`. Otherwise the first forward pass
    /// reads the weights inside its own graph: the same bytes on the CPU,
    /// but on CUDA its kernels then run beside the weights' uploads, which
    /// mlx-lm's never do (docs/parity.md, "On the GPU").
    pub fn finish(self) -> Result<(), LoadError> {
        let mut errors = self.errors;
        let mut unused: Vec<&String> = self
            .tensors
            .keys()
            .filter(|k| !self.used.contains(*k))
            .collect();
        unused.sort();
        for k in unused {
            errors.push(format!(
                "unexpected tensor '{k}' (the architecture has no such parameter)"
            ));
        }
        // The checkpoint's own tensors are dropped first: where a model
        // holds derived ones (a rank's slices, stacked experts), only what
        // it holds stays after the evaluation, as in mlx-lm's sharded load.
        drop(self.tensors);
        if errors.is_empty() {
            mlx_rs::transforms::eval(self.handed.iter().map(|(_, a)| a))
                .or_else(|e| err(format!("reading the checkpoint's tensors failed: {e}")))
        } else {
            let n = errors.len();
            let shown: Vec<String> = errors.into_iter().take(20).collect();
            err(format!(
                "checkpoint does not match the architecture ({n} problem{}):\n  {}{}",
                if n == 1 { "" } else { "s" },
                shown.join("\n  "),
                if n > 20 {
                    format!("\n  ... and {} more", n - 20)
                } else {
                    String::new()
                }
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_safetensors_header;

    /// Checks a file of `header` JSON plus `data` bytes (or raw `bytes`).
    fn check(bytes: &[u8]) -> Result<(), String> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("archgen-st-{}-{n}.safetensors", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let r = check_safetensors_header(&path).map_err(|e| e.0);
        let _ = std::fs::remove_file(&path);
        r
    }

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend(header.as_bytes());
        b.extend(vec![0u8; data]);
        b
    }

    fn fails(bytes: &[u8], what: &str) {
        let e = check(bytes).expect_err(what);
        assert!(e.contains(what), "expected '{what}' in: {e}");
    }

    #[test]
    fn valid_headers_pass() {
        check(&file(r#"{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"U32","shape":[],"data_offsets":[12,16]},"__metadata__":{"format":"mlx"}}"#, 16)).unwrap();
        check(&file("{}", 0)).unwrap();
        check(&file(
            r#"{"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#,
            0,
        ))
        .unwrap();
    }

    #[test]
    fn corrupt_headers_are_named() {
        fails(b"", "expected an 8-byte header length, found a 0-byte file");
        fails(&[1, 0, 0], "found a 3-byte file");
        fails(
            &file("[]", 0),
            "expected a JSON object as header, found an array",
        );
        fails(&file("{\"a\":", 0), "header is not valid JSON");
        fails(
            &file(r#"{"__metadata__":1}"#, 0),
            "__metadata__: expected an object",
        );
        // One tensor `t` with the given info, in a file of that many data bytes.
        #[rustfmt::skip]
        let tensor_cases: &[(&str, usize, &str)] = &[
            (r#"{"shape":[1],"data_offsets":[0,4]}"#, 4, "tensor 't': no \"dtype\" string"),
            (r#"{"dtype":"F64","shape":[1],"data_offsets":[0,8]}"#, 8, "found \"F64\""),
            (r#"{"dtype":"F32","data_offsets":[0,4]}"#, 4, "no \"shape\" array"),
            (r#"{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}"#, 4, "found -1"),
            (r#"{"dtype":"U8","shape":[2147483648],"data_offsets":[0,4]}"#, 4, "found 2147483648"),
            (r#"{"dtype":"U8","shape":[2147483647,2147483647,2147483647],"data_offsets":[0,4]}"#, 4, "overflows"),
            (r#"{"dtype":"F32","shape":[1]}"#, 4, "no \"data_offsets\" [begin, end] pair"),
            (r#"{"dtype":"F32","shape":[1],"data_offsets":[4,0]}"#, 4, "run backwards"),
            (r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#, 4, "(truncated?)"),
            (r#"{"dtype":"F32","shape":[2],"data_offsets":[0,4]}"#, 4, "expected 8 bytes for F32 [2]"),
            (r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#, 6, "found 4 bytes covered"),
            (r#"{"dtype":"F32","shape":[1],"data_offsets":[2,6]}"#, 6, "expected its data to start at byte 0"),
        ];
        for &(info, data, expected) in tensor_cases {
            fails(&file(&format!("{{\"t\":{info}}}"), data), expected);
        }
        let overlap = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        fails(
            &file(overlap, 8),
            "tensor 'b': expected its data to start at byte 8",
        );
        let mut huge = file("{}", 0);
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        fails(&huge, "header length 18446744073709551615 exceeds");
    }
}
