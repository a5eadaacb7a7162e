//! Where MLX's CUDA backend keeps the kernels it compiles at run time.
//!
//! MLX compiles many of its CUDA kernels with NVRTC on first use and keeps
//! them in `MLX_PTX_CACHE_DIR`, by default `$TMPDIR/mlx/<version>/ptx`. A
//! machine that clears its temporary directory (a reboot with /tmp on tmpfs,
//! a fresh container) pays the compilation again: about a minute for a
//! 4-bit 12B model on an H200 (docs/benchmarks.md, "Cold start"). So on a
//! machine with an NVIDIA GPU archgen points that variable at a per-user
//! cache, `$XDG_CACHE_HOME/archgen/mlx-kernels/<libmlx version>/<GPU model>`
//! (`~/.cache` without XDG_CACHE_HOME), before MLX reads it. The key holds
//! the GPU model because MLX's own key is its version alone, and a home
//! directory outlives the GPU it was first used with. A caller's own
//! `MLX_PTX_CACHE_DIR` is left as it is. Kernels are compiled from the same
//! source either way, so this changes how long a first run takes, not its
//! bits.

use std::path::{Path, PathBuf};

/// The variable MLX's CUDA backend reads once, at its first compilation.
pub const PTX_CACHE_VAR: &str = "MLX_PTX_CACHE_DIR";

/// Where the NVIDIA driver lists its GPUs, one folder each with an
/// `information` file (`Model:  NVIDIA H200`).
const NVIDIA_GPUS: &str = "/proc/driver/nvidia/gpus";

/// Where this run's compiled CUDA kernels live, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCache {
    /// The caller set `MLX_PTX_CACHE_DIR`: MLX uses it as it is.
    FromEnvironment(PathBuf),
    /// archgen's per-user cache for this libmlx and GPU model.
    Persistent(PathBuf),
    /// No NVIDIA GPU: MLX compiles nothing with NVRTC here.
    NoCudaDevice,
    /// Neither XDG_CACHE_HOME nor HOME names an absolute folder: MLX keeps
    /// its default under the temporary directory.
    NoCacheHome,
}

/// The GPU models the NVIDIA driver lists under `gpus` (sorted, each once);
/// none where the folder does not exist.
pub fn cuda_gpu_models(gpus: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(gpus) else {
        return Vec::new();
    };
    let mut models: Vec<String> = entries
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("information")).ok())
        .filter_map(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("Model:"))
                .map(|m| m.trim().to_string())
        })
        .filter(|m| !m.is_empty())
        .collect();
    models.sort();
    models.dedup();
    models
}

/// The user's cache folder: `$XDG_CACHE_HOME`, else `$HOME/.cache`; only
/// absolute paths count (the XDG rule for a relative value).
pub fn cache_home(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let absolute = |p: PathBuf| p.is_absolute().then_some(p);
    var("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .and_then(|v| absolute(PathBuf::from(v)))
        .or_else(|| {
            var("HOME")
                .filter(|v| !v.is_empty())
                .and_then(|v| absolute(PathBuf::from(v).join(".cache")))
        })
}

/// One path segment from free text: letters, digits, `.`, `_` and `-` kept,
/// every other run of characters one `-`.
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => out.push(c),
            _ if out.ends_with('-') => {}
            _ => out.push('-'),
        }
    }
    out.trim_matches('-').to_string()
}

/// The per-user folder for kernels compiled by `libmlx` for `models`.
pub fn persistent_dir(home: &Path, libmlx: &str, models: &[String]) -> PathBuf {
    home.join("archgen")
        .join("mlx-kernels")
        .join(segment(libmlx))
        .join(segment(&models.join("+")))
}

/// What this process should use, from its environment (`var`), the
/// driver's GPU list and the loaded libmlx's version.
pub fn choose(var: impl Fn(&str) -> Option<String>, gpus: &Path, libmlx: &str) -> KernelCache {
    if let Some(dir) = var(PTX_CACHE_VAR).filter(|v| !v.is_empty()) {
        return KernelCache::FromEnvironment(PathBuf::from(dir));
    }
    let models = cuda_gpu_models(gpus);
    if models.is_empty() {
        return KernelCache::NoCudaDevice;
    }
    match cache_home(var) {
        Some(home) => KernelCache::Persistent(persistent_dir(&home, libmlx, &models)),
        None => KernelCache::NoCacheHome,
    }
}

/// Sets `MLX_PTX_CACHE_DIR` for this process where [`choose`] says
/// [`KernelCache::Persistent`] and the folder can be made; returns a status
/// note for the run where there is something to say (a GPU machine).
/// Call it before anything runs on MLX's CUDA backend.
pub fn persist_compiled_kernels() -> Option<String> {
    let version = match archgen_runtime::device::libmlx_version() {
        Ok(v) => v,
        Err(e) => return Some(format!("CUDA kernel cache: MLX's default ({e})")),
    };
    let var = |name: &str| std::env::var(name).ok();
    match choose(var, Path::new(NVIDIA_GPUS), &version) {
        KernelCache::NoCudaDevice => None,
        KernelCache::FromEnvironment(dir) => Some(format!(
            "CUDA kernel cache: {} (from {PTX_CACHE_VAR})",
            dir.display()
        )),
        KernelCache::NoCacheHome => Some(format!(
            "CUDA kernel cache: MLX's default under the temporary directory \
             (set XDG_CACHE_HOME or HOME to an absolute path, or {PTX_CACHE_VAR}, to keep it)"
        )),
        KernelCache::Persistent(dir) => match std::fs::create_dir_all(&dir) {
            Ok(()) => {
                // Before any thread of this process reads the environment
                // (the run has not started MLX's work or a runtime yet).
                std::env::set_var(PTX_CACHE_VAR, &dir);
                Some(format!("CUDA kernel cache: {}", dir.display()))
            }
            Err(e) => Some(format!(
                "CUDA kernel cache: MLX's default under the temporary directory \
                 ({}: {e}; set {PTX_CACHE_VAR} to a writable folder to keep it)",
                dir.display()
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    /// A driver folder as /proc/driver/nvidia/gpus lays it out.
    fn gpus(models: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (i, m) in models.iter().enumerate() {
            let gpu = dir.path().join(format!("0000:{i:02x}:00.0"));
            std::fs::create_dir_all(&gpu).unwrap();
            std::fs::write(
                gpu.join("information"),
                format!("Model: \t\t {m}\nIRQ:   \t\t 42\nBus Type: \t PCIe\n"),
            )
            .unwrap();
        }
        dir
    }

    #[test]
    fn a_gpu_machine_keeps_kernels_per_libmlx_and_gpu_model() {
        let two = gpus(&["NVIDIA H200", "NVIDIA H200"]);
        let home = env(&[("HOME", "/home/u")]);
        assert_eq!(
            choose(&home, two.path(), "0.32.2"),
            KernelCache::Persistent(PathBuf::from(
                "/home/u/.cache/archgen/mlx-kernels/0.32.2/NVIDIA-H200"
            ))
        );
        let mixed = gpus(&["NVIDIA H200", "NVIDIA A100-SXM4-80GB"]);
        let xdg = env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/var/cache/u")]);
        assert_eq!(
            choose(&xdg, mixed.path(), "0.32.2"),
            KernelCache::Persistent(PathBuf::from(
                "/var/cache/u/archgen/mlx-kernels/0.32.2/NVIDIA-A100-SXM4-80GB-NVIDIA-H200"
            ))
        );
    }

    #[test]
    fn the_callers_variable_and_a_machine_without_cuda_are_left_to_mlx() {
        let one = gpus(&["NVIDIA H200"]);
        let set = env(&[("HOME", "/home/u"), (PTX_CACHE_VAR, "/data/ptx")]);
        assert_eq!(
            choose(&set, one.path(), "0.32.2"),
            KernelCache::FromEnvironment(PathBuf::from("/data/ptx"))
        );
        let none = tempfile::tempdir().unwrap();
        let home = env(&[("HOME", "/home/u")]);
        assert_eq!(
            choose(&home, none.path(), "0.32.2"),
            KernelCache::NoCudaDevice
        );
        assert_eq!(
            choose(&home, &none.path().join("absent"), "0.32.2"),
            KernelCache::NoCudaDevice
        );
        let relative = env(&[("HOME", "home"), ("XDG_CACHE_HOME", "cache")]);
        assert_eq!(
            choose(&relative, one.path(), "0.32.2"),
            KernelCache::NoCacheHome
        );
    }

    #[test]
    fn the_loaded_libmlx_names_its_version() {
        let v = archgen_runtime::device::libmlx_version().unwrap();
        let parts: Vec<&str> = v.split('.').collect();
        assert!(
            parts.len() >= 3 && parts[..3].iter().all(|p| p.parse::<u32>().is_ok()),
            "{v}"
        );
    }
}
