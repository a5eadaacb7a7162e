//! Where the repository is: the one fact every task starts from, kept at the
//! bottom so no task module reaches into another for it.

use std::path::{Path, PathBuf};

/// The repository root (xtask lives one level below it). `ARCHGEN_ROOT`
/// points the spec and gen tasks at another tree (the tests use a copy).
pub fn repo_root() -> PathBuf {
    if let Some(root) = std::env::var_os("ARCHGEN_ROOT") {
        return PathBuf::from(root);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}
