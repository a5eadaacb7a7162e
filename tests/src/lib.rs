//! Shared helpers for archgen's integration tests: the project venv (Python
//! oracle) and byte comparison.

pub mod faults;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The project venv's Python, which loads the same libmlx as the Rust build.
/// Panics with the setup command when the venv is missing: a test that needs
/// the oracle must not silently pass without it.
pub fn venv_python() -> PathBuf {
    let venv = std::env::var_os("ARCHGEN_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv"));
    let python = venv.join("bin").join("python");
    assert!(
        python.exists(),
        "no Python at {}: run `cargo xtask setup` first",
        python.display()
    );
    python
}

/// Runs a script from tests/python with the venv's Python; panics with its
/// output when it fails.
pub fn run_python(script: &str, args: &[&std::ffi::OsStr]) -> String {
    let path = repo_root().join("tests").join("python").join(script);
    let out = Command::new(venv_python())
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("could not start {}: {e}", path.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} failed ({}):\n{}\n{}",
        path.display(),
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A copy of the checkpoint in `src` at `dst`: its config.json, and its
/// tensors (every safetensors file of `src`) after `edit`, in one
/// model.safetensors.
pub fn rewrite_checkpoint(
    src: &Path,
    dst: &Path,
    edit: impl FnOnce(&mut std::collections::HashMap<String, archgen_runtime::Array>),
) {
    use archgen_runtime::Array;
    std::fs::create_dir_all(dst).unwrap();
    std::fs::copy(src.join("config.json"), dst.join("config.json")).unwrap();
    let mut tensors = std::collections::HashMap::new();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            tensors.extend(Array::load_safetensors(&p).unwrap());
        }
    }
    edit(&mut tensors);
    Array::save_safetensors(
        tensors.iter().map(|(k, a)| (k.as_str(), a)),
        None,
        dst.join("model.safetensors"),
    )
    .unwrap();
}

/// [`rewrite_checkpoint`] with every element of the tensor `name` set to
/// `value`, in the tensor's dtype: a checkpoint that drives a model to a
/// numeric edge (an overflow) the random weights never reach. Panics when
/// the tensor is absent.
pub fn with_tensor_filled(src: &Path, dst: &Path, name: &str, value: f32) {
    use archgen_runtime::Array;
    rewrite_checkpoint(src, dst, |tensors| {
        let old = tensors
            .get(name)
            .unwrap_or_else(|| panic!("{}: no tensor {name}", src.display()));
        let filled = archgen_runtime::mlx_rs::ops::full::<f32>(old.shape(), Array::from_f32(value))
            .unwrap()
            .as_dtype(old.dtype())
            .unwrap();
        tensors.insert(name.to_string(), filled);
    });
}

/// Panics with `what` unless every value of `a` is finite (an empty array
/// is).
pub fn assert_finite(a: &archgen_runtime::Array, what: &str) {
    let values = a.as_dtype(archgen_runtime::mlx_rs::Dtype::Float32).unwrap();
    values.eval().unwrap();
    assert!(
        values.size() == 0 || values.as_slice::<f32>().iter().all(|v| v.is_finite()),
        "{what}: not finite"
    );
}

/// config.json for a spec (see `archgen_families::to_config_json`).
pub fn config_for(spec: &archgen_families::Spec) -> serde_json::Value {
    archgen_families::to_config_json(spec)
}

/// The window of the model's sliding-attention layers, when it has any.
pub fn sliding_window(ir: &archgen_ir::ModelIr) -> Option<usize> {
    ir.layers
        .iter()
        .filter_map(archgen_ir::Layer::attention)
        .find_map(|a| match a.window {
            archgen_ir::Window::Sliding(w) => Some(w),
            archgen_ir::Window::Full => None,
        })
}

/// Whether any layer routes tokens to experts (unquantized experts run only
/// in float32 on MLX's CPU backend).
pub fn has_experts(ir: &archgen_ir::ModelIr) -> bool {
    ir.layers.iter().any(|l| l.moe().is_some())
}

/// The layers with mlx's quantized KV cache (a spec's `kv_quantization`), as
/// the oracle scripts' `kv_quant` reads them: layer index -> `[bits, group_size]`.
/// mlx-optiq's mixed KV is not one of them: the jobs carry it on their own.
pub fn quantized_kv_layers(ir: &archgen_ir::ModelIr) -> serde_json::Map<String, serde_json::Value> {
    ir.layers
        .iter()
        .filter_map(|l| match l.attention()?.kv {
            archgen_ir::KvSource::Own {
                cache: archgen_ir::KvCache::Quantized(q),
                ..
            } => Some((
                l.index.to_string(),
                serde_json::json!([q.bits, q.group_size]),
            )),
            archgen_ir::KvSource::Own {
                cache:
                    archgen_ir::KvCache::Plain | archgen_ir::KvCache::QuantizedAfterForward { .. },
                ..
            }
            | archgen_ir::KvSource::Shared { .. } => None,
        })
        .collect()
}
