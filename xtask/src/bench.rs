//! `cargo xtask bench [--quick]`: the performance benchmark (docs/benchmarks.md).
//! The timing itself is the `archgen-bench` binary (runtime/bench), built in
//! release; this task adds the two build-side timings, then runs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::cli::BenchArgs;
use crate::root::repo_root;

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(repo_root());
    c
}

fn ok(what: &str, c: &mut Command) -> Result<(), String> {
    let status = c
        .status()
        .map_err(|e| format!("could not start `{what}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{what}` failed ({status})"))
    }
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &dest)?;
        } else {
            std::fs::copy(e.path(), dest)?;
        }
    }
    Ok(())
}

/// Wall time of `cargo xtask gen --all`, run on a copy of specs/ and
/// generated/ (ARCHGEN_ROOT) so the working tree is not rewritten.
fn time_gen_all() -> Result<f64, String> {
    let tree = target_dir().join("bench-gen-tree");
    let _ = std::fs::remove_dir_all(&tree);
    for dir in ["specs", "generated"] {
        copy_tree(&repo_root().join(dir), &tree.join(dir))
            .map_err(|e| format!("copying {dir}: {e}"))?;
    }
    // Once untimed, so xtask itself is built and the files are warm.
    let gen = || {
        let mut c = cargo();
        c.args(["xtask", "gen", "--all"]).env("ARCHGEN_ROOT", &tree);
        c
    };
    ok("cargo xtask gen --all (warm-up)", &mut gen())?;
    let t = Instant::now();
    ok("cargo xtask gen --all", &mut gen())?;
    Ok(t.elapsed().as_secs_f64())
}

/// `cargo build -p archgen-generated` right after `cargo clean -p
/// archgen-generated`, in its own CARGO_TARGET_DIR (dependencies built there
/// first, untimed).
fn time_clean_compile() -> Result<f64, String> {
    let dir = target_dir().join("bench-build");
    let step = |args: &[&str]| {
        let mut c = cargo();
        c.args(args).env("CARGO_TARGET_DIR", &dir);
        c
    };
    eprintln!(
        "xtask: bench: building archgen-generated's dependencies in {}",
        dir.display()
    );
    ok(
        "cargo build -p archgen-generated (dependencies)",
        &mut step(&["build", "-p", "archgen-generated"]),
    )?;
    ok(
        "cargo clean -p archgen-generated",
        &mut step(&["clean", "-p", "archgen-generated"]),
    )?;
    let t = Instant::now();
    ok(
        "cargo build -p archgen-generated",
        &mut step(&["build", "-p", "archgen-generated"]),
    )?;
    Ok(t.elapsed().as_secs_f64())
}

/// `bench [--quick] [--spec NAME]...`.
pub fn run(args: &BenchArgs, quiet: bool) -> Result<(), String> {
    let (quick, specs) = (args.quick, &args.specs);
    let root = repo_root();
    let cache = target_dir().join("bench-cache");
    std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let mut run_args: Vec<std::ffi::OsString> = vec!["run".into()];
    for s in specs {
        run_args.extend(["--spec".into(), s.into()]);
    }
    if quiet {
        run_args.push("--quiet".into());
    }
    if args.sequential {
        if !quick && specs.is_empty() {
            return Err("bench --sequential measures the earlier way and writes no docs: name the specs with --spec".into());
        }
        run_args.push("--sequential".into());
    }
    if quick {
        run_args.push("--quick".into());
        run_args.extend(["--json".into(), cache.join("quick.json").into()]);
    } else if !specs.is_empty() {
        // A partial run prints its ratios but leaves docs/benchmarks.md alone.
        run_args.extend(["--json".into(), cache.join("partial.json").into()]);
    } else {
        let gen = time_gen_all();
        let compile = time_clean_compile();
        let field = |r: Result<f64, String>| match r {
            Ok(s) => serde_json::json!(s),
            Err(e) => serde_json::json!(format!("not measured: {e}")),
        };
        let extra = serde_json::json!({
            "gen_all_s": field(gen),
            "compile_generated_s": field(compile),
        });
        let extra_path = cache.join("extra.json");
        std::fs::write(&extra_path, extra.to_string()).map_err(|e| e.to_string())?;
        run_args.extend([
            "--json".into(),
            cache.join("results.json").into(),
            "--doc".into(),
            root.join("docs/benchmarks.md").into(),
            "--svg".into(),
            root.join("docs/benchmarks.svg").into(),
            "--extra".into(),
            extra_path.into(),
        ]);
    }
    ok(
        "cargo build --release -p archgen-bench",
        cargo().args(["build", "--release", "-p", "archgen-bench"]),
    )?;
    let bin = target_dir().join("release").join("archgen-bench");
    ok(
        "archgen-bench run",
        Command::new(&bin).args(&run_args).current_dir(&root),
    )
}
