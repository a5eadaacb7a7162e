//! A crate outside this workspace (examples/outside-crate) builds with only the
//! documented setup step, runs the model its `specialize!` makes, and writes
//! the same logits bytes as the checked-in generated model under the logits
//! protocol (`archgen logits --impl generated`) on a checkpoint from
//! `archgen init`.
//!
//! The crate is copied to a temporary directory outside the repository, so
//! that this repository's .cargo/config.toml cannot apply; its path
//! dependencies are pointed at this checkout, as a user points them at theirs.
//! Cargo then runs in a scrubbed environment: none of the MLX variables,
//! RUSTC_WRAPPER or CARGO_TARGET_DIR of the environment this test runs in reach
//! it, only what the setup step writes.
//!
//! Its target directory is `<this workspace's target dir>/outside-crate`: on a
//! fresh machine (CI) the build starts from nothing; on a developer's machine a
//! rerun only rebuilds what changed. `ARCHGEN_OUTSIDE_TARGET_DIR` overrides it
//! (an empty directory gives a build from clean).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use archgen_runtime::bytes::array_bytes;
use archgen_runtime::Array;

const SPEC: &str = "gemma4-walkthrough-tiny";
/// Longer than the spec's sliding window (5); decode runs past it too.
const PROMPT: &str = "1,2,3,4,5,6,7,8,9,10,11,12,13,14";
const DECODE_STEPS: &str = "9";

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn check(what: &str, o: Output) -> Output {
    assert!(
        o.status.success(),
        "{what} failed ({}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    o
}

/// The variables a fresh shell on a CI machine or a user's desktop would have:
/// paths, toolchain selection, locale, and network settings for cargo. Anything
/// that could carry this repository's MLX build settings is left out.
fn scrubbed(command: &mut Command) -> &mut Command {
    const KEEP: &[&str] = &[
        "PATH",
        "HOME",
        "USER",
        "TMPDIR",
        "LANG",
        "LC_ALL",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "CARGO_BUILD_JOBS",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
    ];
    let kept: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            KEEP.contains(&k.as_ref())
                || k.starts_with("CARGO_NET_")
                || k.starts_with("CARGO_HTTP_")
                || k.starts_with("CARGO_REGISTRIES_")
        })
        .collect();
    command.env_clear().envs(kept)
}

/// Copies the example crate's sources (not a target/ or .cargo/ left there by
/// a build in place) into `dst`, with its path dependencies made absolute.
fn copy_example(repo: &Path, dst: &Path) {
    let src = repo.join("examples/outside-crate");
    for dir in ["src", "specs"] {
        std::fs::create_dir_all(dst.join(dir)).unwrap();
        for entry in std::fs::read_dir(src.join(dir)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dst.join(dir).join(entry.file_name())).unwrap();
        }
    }
    let manifest = std::fs::read_to_string(src.join("Cargo.toml")).unwrap();
    let relative = "path = \"../../";
    assert_eq!(
        manifest.matches(relative).count(),
        3,
        "examples/outside-crate/Cargo.toml: expected three path dependencies into this repository"
    );
    let absolute = format!("path = \"{}/", repo.display());
    std::fs::write(
        dst.join("Cargo.toml"),
        manifest.replace(relative, &absolute),
    )
    .unwrap();
    // The workspace's lock file: the same crate versions as this workspace, and
    // no registry index lookups (cargo drops the entries the crate does not use).
    std::fs::copy(repo.join("Cargo.lock"), dst.join("Cargo.lock")).unwrap();
}

fn tensors(path: &Path) -> BTreeMap<String, Array> {
    Array::load_safetensors(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect()
}

#[test]
fn outside_crate_builds_with_the_setup_step_and_matches_the_generated_model() {
    let repo = archgen_tests::repo_root();
    let spec = format!("specs/{SPEC}.yaml");
    assert_eq!(
        std::fs::read(repo.join("examples/outside-crate").join(&spec)).unwrap(),
        std::fs::read(repo.join(&spec)).unwrap(),
        "examples/outside-crate/{spec} differs from {spec}: copy it again"
    );
    let archgen = Path::new(env!("CARGO_BIN_EXE_archgen"));
    let target_dir = std::env::var_os("ARCHGEN_OUTSIDE_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            archgen
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .join("outside-crate")
        });

    let tmp = tempfile::tempdir().unwrap();
    let krate = tmp.path().join("outside-crate");
    copy_example(&repo, &krate);

    // The documented step, and nothing else.
    check(
        "runtime/mlx-linux/use-in-crate.sh",
        scrubbed(Command::new("bash").arg(repo.join("runtime/mlx-linux/use-in-crate.sh")))
            .arg(&krate)
            .output()
            .unwrap(),
    );

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    check(
        "cargo build (outside crate)",
        scrubbed(&mut Command::new(&cargo))
            .current_dir(&krate)
            .args(["build", "--quiet", "--target-dir"])
            .arg(&target_dir)
            .output()
            .unwrap(),
    );
    eprintln!(
        "outside crate: cargo build took {:.1} s (target dir {})",
        started.elapsed().as_secs_f64(),
        target_dir.display()
    );

    let ckpt = tmp.path().join("ckpt");
    check(
        "archgen init",
        Command::new(archgen)
            .args(["init", "--seed", "3", "--spec"])
            .arg(repo.join(&spec))
            .arg("--out")
            .arg(&ckpt)
            .output()
            .unwrap(),
    );
    let theirs = tmp.path().join("generated.safetensors");
    let o = check(
        "archgen logits --impl generated",
        Command::new(archgen)
            .arg("logits")
            .arg("--model")
            .arg(&ckpt)
            .args(["--prompt-ids", PROMPT, "--decode-steps", DECODE_STEPS])
            .args(["--impl", "generated", "--out"])
            .arg(&theirs)
            .output()
            .unwrap(),
    );
    let fingerprint = archgen_generated::gemma4_walkthrough_tiny::FINGERPRINT;
    assert!(stderr(&o).contains(fingerprint), "{}", stderr(&o));

    // The binary runs as a user would start it: scrubbed environment, so
    // libmlx.so is found through the rpath the setup step's wrapper wrote.
    let ours = tmp.path().join("outside.safetensors");
    let o = check(
        "outside-crate",
        scrubbed(&mut Command::new(target_dir.join("debug/outside-crate")))
            .arg(&ckpt)
            .args([PROMPT, DECODE_STEPS])
            .arg(&ours)
            .output()
            .unwrap(),
    );
    assert!(
        stderr(&o).contains(&format!("fingerprint {fingerprint}")),
        "the outside crate's specialize! made a different model: {}",
        stderr(&o)
    );

    let (ours, theirs) = (tensors(&ours), tensors(&theirs));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        ["decode_logits", "prefill_logits", "tokens"]
    );
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    for (name, a) in &ours {
        let b = &theirs[name];
        assert_eq!(a.dtype(), b.dtype(), "{name}: dtype");
        assert_eq!(a.shape(), b.shape(), "{name}: shape");
        assert_eq!(
            array_bytes(a).unwrap(),
            array_bytes(b).unwrap(),
            "{name}: the outside crate's bytes differ from the generated model's"
        );
    }
}
