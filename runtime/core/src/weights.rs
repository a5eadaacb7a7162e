//! Checkpoint loading from an mlx-community style directory: config.json plus
//! `model.safetensors` or sharded `model-0000x-of-0000y.safetensors` (with or
//! without the index), renamed and sanitized the way mlx-lm's gemma4 /
//! gemma4_text `sanitize` does, then handed out by module path with shape checks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};

use crate::layers::{Embedding, Linear, Quantized, SwitchLinear};

/// A loading error that names the file, tensor or field, and says what to do.
#[derive(Debug)]
pub struct LoadError(pub String);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

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

/// Reads config.json and all weight files of `dir`.
pub fn read_checkpoint(dir: &Path) -> Result<Checkpoint, LoadError> {
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
    let mut tensors = HashMap::new();
    for (i, file) in files.iter().enumerate() {
        if files.len() > 1 {
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
        for (name, array) in loaded {
            if tensors.insert(name.clone(), array).is_some() {
                return err(format!(
                    "{}: tensor '{name}' also appears in another weight file",
                    file.display()
                ));
            }
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

/// Validates a safetensors header before handing the file to MLX, so a
/// truncated or corrupt file is a clear error rather than an abort.
fn check_safetensors_header(path: &Path) -> Result<(), LoadError> {
    use std::io::Read;
    let what = |m: String| LoadError(format!("{}: corrupt safetensors file: {m}", path.display()));
    let mut f = std::fs::File::open(path).map_err(|e| what(e.to_string()))?;
    let size = f.metadata().map_err(|e| what(e.to_string()))?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| what("shorter than its 8-byte header length".into()))?;
    let n = u64::from_le_bytes(len);
    if n > size.saturating_sub(8) || n > 100 << 20 {
        return Err(what(format!(
            "header length {n} exceeds the file size {size}"
        )));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|e| what(e.to_string()))?;
    let header: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| what(format!("header is not JSON: {e}")))?;
    let data_len = size - 8 - n;
    for (name, info) in header.as_object().into_iter().flatten() {
        if name == "__metadata__" {
            continue;
        }
        let end = info
            .get("data_offsets")
            .and_then(|o| o.get(1))
            .and_then(|v| v.as_u64())
            .ok_or_else(|| what(format!("tensor '{name}' has no data_offsets")))?;
        if end > data_len {
            return Err(what(format!(
                "tensor '{name}' ends at byte {end} but the data section has {data_len} bytes (truncated?)"
            )));
        }
    }
    Ok(())
}

/// Hands out tensors by module path and records which were used, so missing,
/// unexpected and mis-shaped tensors are all named.
pub struct Weights {
    tensors: HashMap<String, Array>,
    used: BTreeSet<String>,
    /// Per-module quantization from config.json `quantization`: a default
    /// (bits, group) and per-path overrides (`None` = explicitly unquantized).
    quant_default: Option<(i32, i32)>,
    quant_overrides: BTreeMap<String, Option<(i32, i32)>>,
    errors: Vec<String>,
}

impl Weights {
    pub fn new(tensors: HashMap<String, Array>, quantization: Option<&serde_json::Value>) -> Self {
        let mut quant_default = None;
        let mut quant_overrides = BTreeMap::new();
        if let Some(q) = quantization.and_then(|q| q.as_object()) {
            let int = |v: &serde_json::Value, k: &str| {
                v.get(k).and_then(|x| x.as_i64()).map(|x| x as i32)
            };
            let whole = serde_json::Value::Object(q.clone());
            if let (Some(b), Some(g)) = (int(&whole, "bits"), int(&whole, "group_size")) {
                quant_default = Some((b, g));
            }
            for (k, v) in q {
                match v {
                    serde_json::Value::Bool(false) => {
                        quant_overrides.insert(k.clone(), None);
                    }
                    serde_json::Value::Object(_) => {
                        if let (Some(b), Some(g)) = (int(v, "bits"), int(v, "group_size")) {
                            quant_overrides.insert(k.clone(), Some((b, g)));
                        }
                    }
                    _ => {}
                }
            }
        }
        Weights {
            tensors,
            used: BTreeSet::new(),
            quant_default,
            quant_overrides,
            errors: Vec::new(),
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

    fn check(&mut self, name: &str, a: &Array, shape: &[i32], dtype: Option<Dtype>) -> bool {
        let mut ok = true;
        if a.shape() != shape {
            self.errors.push(format!(
                "tensor '{name}': expected shape {shape:?}, found {:?}",
                a.shape()
            ));
            ok = false;
        }
        if let Some(d) = dtype {
            if a.dtype() != d {
                self.errors.push(format!(
                    "tensor '{name}': expected dtype {d:?}, found {:?}",
                    a.dtype()
                ));
                ok = false;
            }
        }
        ok
    }

    fn placeholder() -> Array {
        Array::from_f32(0.0)
    }

    /// A plain parameter (norm weight, layer scalar, router scale).
    pub fn param(&mut self, name: &str, shape: &[i32]) -> Array {
        match self.take(name) {
            Some(a) => {
                self.check(name, &a, shape, None);
                a
            }
            None => Self::placeholder(),
        }
    }

    /// The quantization that applies to module `path` with input width `in_dims`,
    /// following mlx-lm's load: explicit per-path entry, else quantized iff
    /// `path.scales` exists, with group size and bits inferred from the shapes.
    fn quant_for(&self, path: &str, in_dims: i32) -> Result<Option<(i32, i32)>, String> {
        if let Some(o) = self.quant_overrides.get(path) {
            return Ok(*o);
        }
        let Some(scales) = self.tensors.get(&format!("{path}.scales")) else {
            return Ok(None);
        };
        let Some(weight) = self.tensors.get(&format!("{path}.weight")) else {
            return Ok(None);
        };
        let groups = *scales.shape().last().unwrap_or(&0);
        let packed = *weight.shape().last().unwrap_or(&0);
        if groups <= 0 || in_dims % groups != 0 {
            return Err(format!(
                "tensor '{path}.scales': {groups} groups do not divide the input width {in_dims}"
            ));
        }
        let _ = self.quant_default;
        Ok(Some(((packed * 32) / in_dims, in_dims / groups)))
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
                self.check(&wname, &w, &shape, None);
                (w, None)
            }
            Some((bits, group)) => {
                if ![2, 3, 4, 5, 6, 8].contains(&bits) || in_dims % group != 0 {
                    self.errors.push(format!(
                        "module '{path}': quantization bits={bits} group_size={group} does not fit input width {in_dims}"
                    ));
                    return (w, None);
                }
                shape.extend([out, in_dims * bits / 32]);
                self.check(&wname, &w, &shape, Some(Dtype::Uint32));
                let mut sshape = lead.to_vec();
                sshape.extend([out, in_dims / group]);
                let scales = self.param(&format!("{path}.scales"), &sshape);
                let biases = self.param(&format!("{path}.biases"), &sshape);
                (
                    w,
                    Some(Quantized {
                        scales,
                        biases,
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
        Linear { weight, quant }
    }

    /// An embedding table [rows, dims] (dense or quantized).
    pub fn embedding(&mut self, path: &str, rows: i32, dims: i32) -> Embedding {
        let (weight, quant) = self.quantized(path, &[], rows, dims);
        Embedding { weight, quant }
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
        SwitchLinear { weight, quant }
    }

    /// Ends loading: errors for every missing, mis-shaped or unused tensor.
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
        if errors.is_empty() {
            Ok(())
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
