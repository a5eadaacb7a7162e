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
//!
//! MLX writes a compiled kernel's files in place, not atomically: a process
//! stopped mid-write, or two processes compiling the same kernel at once,
//! leave a truncated file that every later run would read ("Binary format
//! ... is not recognized"). A temporary directory forgets such a file at the
//! next reboot; a per-user cache would keep it. So each run works on a
//! private copy ([`StagedKernels`]): MLX reads and writes
//! `<cache>.runs/<pid>-<time>/`, and when the run ends the files it added
//! move into the shared folder by one rename each, which is atomic.

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

/// A run's private copy of the shared kernel folder: MLX compiles into it,
/// and dropping it moves what the run added into the shared folder.
#[derive(Debug)]
pub struct StagedKernels {
    shared: PathBuf,
    staging: PathBuf,
}

/// Files in `dir` and its subfolders, as paths relative to it (sorted).
fn files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        for entry in std::fs::read_dir(dir.join(&rel))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = rel.join(entry.file_name());
            if kind.is_dir() {
                todo.push(path);
            } else if kind.is_file() {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Whether a staging folder's process (its name starts `<pid>-`) is gone.
fn left_by_a_finished_run(name: &str) -> bool {
    match name.split('-').next().map(str::parse::<u32>) {
        Some(Ok(pid)) => !Path::new("/proc").join(pid.to_string()).exists(),
        // Not a folder this code made: left alone.
        _ => false,
    }
}

impl StagedKernels {
    /// The folder of runs' private copies for `shared`: beside it, so a
    /// rename from one to the other stays on one file system.
    fn runs_dir(shared: &Path) -> PathBuf {
        let mut name = shared.file_name().unwrap_or_default().to_os_string();
        name.push(".runs");
        shared.with_file_name(name)
    }

    /// Makes `shared` (if need be) and this run's copy of it, after removing
    /// the copies of runs that ended without handing theirs over (killed).
    pub fn open(shared: &Path) -> std::io::Result<StagedKernels> {
        std::fs::create_dir_all(shared)?;
        let runs = Self::runs_dir(shared);
        std::fs::create_dir_all(&runs)?;
        for entry in std::fs::read_dir(&runs)?.flatten() {
            if left_by_a_finished_run(&entry.file_name().to_string_lossy()) {
                // Best effort: another run may be removing it too.
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let staging = runs.join(format!("{}-{started}", std::process::id()));
        std::fs::create_dir(&staging)?;
        let staged = StagedKernels {
            shared: shared.to_path_buf(),
            staging,
        };
        // Copies, not hard links: MLX may truncate a file it rewrites, and
        // a link would carry that into the shared folder.
        for rel in files_under(shared)? {
            let to = staged.staging.join(&rel);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::copy(shared.join(&rel), to)?;
        }
        Ok(staged)
    }

    /// Where MLX should read and write this run's kernels.
    pub fn dir(&self) -> &Path {
        &self.staging
    }

    /// Moves the files this run added into the shared folder, one rename
    /// each, and removes the run's copy; returns how many moved. A kernel's
    /// PTX or binary moves after its other files (the kernel names), since
    /// MLX takes a kernel as cached when its PTX or binary is there.
    pub fn hand_over(&self) -> std::io::Result<usize> {
        let added = hand_over_order(
            files_under(&self.staging)?
                .into_iter()
                .filter(|rel| !self.shared.join(rel).exists())
                .collect(),
        );
        for rel in &added {
            let to = self.shared.join(rel);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::rename(self.staging.join(rel), to)?;
        }
        std::fs::remove_dir_all(&self.staging)?;
        Ok(added.len())
    }
}

/// The order files move in: a kernel's PTX or binary last, so a run that
/// finds it also finds the kernel names beside it.
fn hand_over_order(mut files: Vec<PathBuf>) -> Vec<PathBuf> {
    let primary = |rel: &PathBuf| {
        matches!(
            rel.extension().and_then(|e| e.to_str()),
            Some("ptx" | "cubin")
        )
    };
    files.sort_by_key(|rel| (primary(rel), rel.clone()));
    files
}

impl Drop for StagedKernels {
    /// At the end of the run (MLX has finished writing): the new kernels go
    /// to the shared folder. A failure costs the next run a compilation, so
    /// it is said, not fatal.
    fn drop(&mut self) {
        if !self.staging.exists() {
            // Handed over already.
            return;
        }
        if let Err(e) = self.hand_over() {
            eprintln!(
                "archgen: CUDA kernel cache: the kernels compiled in {} did not reach {} ({e}); \
                 the next run compiles them again",
                self.staging.display(),
                self.shared.display()
            );
        }
    }
}

/// Sets `MLX_PTX_CACHE_DIR` for this process where [`choose`] says
/// [`KernelCache::Persistent`] and the folder can be made; returns a status
/// note for the run where there is something to say (a GPU machine), and
/// the run's copy of the shared folder, to keep until the run ends.
/// Call it before anything runs on MLX's CUDA backend.
pub fn persist_compiled_kernels() -> (Option<String>, Option<StagedKernels>) {
    let version = match archgen_runtime::device::libmlx_version() {
        Ok(v) => v,
        Err(e) => {
            return (
                Some(format!("CUDA kernel cache: MLX's default ({e})")),
                None,
            )
        }
    };
    let var = |name: &str| std::env::var(name).ok();
    match choose(var, Path::new(NVIDIA_GPUS), &version) {
        KernelCache::NoCudaDevice => (None, None),
        KernelCache::FromEnvironment(dir) => (
            Some(format!(
                "CUDA kernel cache: {} (from {PTX_CACHE_VAR})",
                dir.display()
            )),
            None,
        ),
        KernelCache::NoCacheHome => (
            Some(format!(
                "CUDA kernel cache: MLX's default under the temporary directory \
                 (set XDG_CACHE_HOME or HOME to an absolute path, or {PTX_CACHE_VAR}, to keep it)"
            )),
            None,
        ),
        KernelCache::Persistent(dir) => match StagedKernels::open(&dir) {
            Ok(staged) => {
                // Before any thread of this process reads the environment
                // (the run has not started MLX's work or a runtime yet).
                std::env::set_var(PTX_CACHE_VAR, staged.dir());
                (
                    Some(format!("CUDA kernel cache: {}", dir.display())),
                    Some(staged),
                )
            }
            Err(e) => (
                Some(format!(
                    "CUDA kernel cache: MLX's default under the temporary directory \
                     ({}: {e}; set {PTX_CACHE_VAR} to a writable folder to keep it)",
                    dir.display()
                )),
                None,
            ),
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
    fn a_run_compiles_into_its_own_copy_and_hands_new_kernels_over_at_its_end() {
        let home = tempfile::tempdir().unwrap();
        let shared = home.path().join("0.32.2").join("NVIDIA-H200");
        std::fs::create_dir_all(shared.join("sub")).unwrap();
        std::fs::write(shared.join("old.ptx"), "old kernel").unwrap();
        std::fs::write(shared.join("sub/old.txt"), "old names").unwrap();
        let runs = home.path().join("0.32.2").join("NVIDIA-H200.runs");
        // A folder of a run that was killed (no such process: above Linux's
        // largest pid), and one that is not a run's.
        std::fs::create_dir_all(runs.join("999999999-1")).unwrap();
        std::fs::create_dir_all(runs.join("notes")).unwrap();

        let staged = StagedKernels::open(&shared).unwrap();
        assert!(
            !runs.join("999999999-1").exists(),
            "a killed run's copy stays"
        );
        assert!(runs.join("notes").exists());
        assert!(staged.dir().starts_with(&runs));
        assert_eq!(
            std::fs::read_to_string(staged.dir().join("sub/old.txt")).unwrap(),
            "old names"
        );
        // What MLX writes during the run stays out of the shared folder.
        std::fs::write(staged.dir().join("new.ptx"), "new kernel").unwrap();
        std::fs::write(staged.dir().join("new.txt"), "new names").unwrap();
        std::fs::create_dir_all(staged.dir().join("deeper")).unwrap();
        std::fs::write(staged.dir().join("deeper/k.cubin"), "binary").unwrap();
        assert!(!shared.join("new.ptx").exists());
        let dir = staged.dir().to_path_buf();
        assert_eq!(staged.hand_over().unwrap(), 3);
        assert!(!dir.exists());
        drop(staged);
        for (file, text) in [
            ("old.ptx", "old kernel"),
            ("sub/old.txt", "old names"),
            ("new.ptx", "new kernel"),
            ("new.txt", "new names"),
            ("deeper/k.cubin", "binary"),
        ] {
            assert_eq!(
                std::fs::read_to_string(shared.join(file)).unwrap(),
                text,
                "{file}"
            );
        }

        // Dropping a run's copy hands over too.
        let staged = StagedKernels::open(&shared).unwrap();
        std::fs::write(staged.dir().join("late.ptx"), "late").unwrap();
        drop(staged);
        assert_eq!(
            std::fs::read_to_string(shared.join("late.ptx")).unwrap(),
            "late"
        );
        assert_eq!(
            std::fs::read_dir(&runs).unwrap().count(),
            1,
            "only `notes` is left"
        );
    }

    #[test]
    fn a_kernels_ptx_or_binary_moves_after_its_names() {
        let order = hand_over_order(
            ["a.ptx", "a.txt", "b.cubin", "b.txt", "c.cu"]
                .map(PathBuf::from)
                .to_vec(),
        );
        assert_eq!(
            order,
            ["a.txt", "b.txt", "c.cu", "a.ptx", "b.cubin"].map(PathBuf::from)
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
