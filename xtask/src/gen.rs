//! `cargo xtask gen`: specs -> generated/ (model files, plan files, registry),
//! `--check` (byte-compare, writes nothing) and `diff [BASE]` (per-model
//! summary of what a change does to plans and code, for review).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use archgen_plan::Plan;

use crate::cli::GenArgs;
use crate::report::Reporter;
use crate::root::repo_root;

/// Every file the generator owns, keyed by repository-relative path.
type Outputs = BTreeMap<String, String>;

fn spec_plan(path: &Path, reporter: &Reporter) -> Result<Plan, String> {
    let spec = archgen_families::load(path).map_err(|d| reporter.spec_errors(&d))?;
    let rel = path
        .strip_prefix(repo_root())
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/");
    Ok(archgen_plan::plan(&spec, &rel))
}

fn model_path(name: &str) -> String {
    format!("generated/src/{}.rs", archgen_emit::module_name(name))
}

fn plan_path(name: &str) -> String {
    format!("generated/plans/{name}.plan.md")
}

/// A progress bar over models (`gen --all`); each model counts twice, once
/// planned and once emitted.
type Bar<'a> = Option<&'a indicatif::ProgressBar>;

/// Plans of all specs, or an error listing every spec that failed.
fn all_plans(reporter: &Reporter, bar: Bar) -> Result<Vec<Plan>, String> {
    let mut plans = Vec::new();
    let mut errors = Vec::new();
    for path in crate::spec::all_specs()? {
        if let Some(bar) = bar {
            bar.set_message(format!("planning {}", path.display()));
            bar.inc(1);
        }
        match spec_plan(&path, reporter) {
            Ok(p) => plans.push(p),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(plans)
    } else {
        Err(errors.join("\n"))
    }
}

fn outputs_for(plans: &[Plan], registry_plans: &[Plan], bar: Bar) -> Result<Outputs, String> {
    let mut out = Outputs::new();
    let mut errors = Vec::new();
    for p in plans {
        if let Some(bar) = bar {
            bar.set_message(format!("emitting {}", p.name));
            bar.inc(1);
        }
        match archgen_emit::model_file(p) {
            Ok(text) => {
                out.insert(model_path(&p.name), text);
            }
            Err(e) => errors.push(format!("{}: {e}", p.spec_path)),
        }
        match archgen_emit::plan_file(p) {
            Ok(text) => {
                out.insert(plan_path(&p.name), text);
            }
            Err(e) => errors.push(format!("{}: {e}", p.spec_path)),
        }
    }
    match archgen_emit::registry_file(registry_plans) {
        Ok(text) => {
            out.insert("generated/src/lib.rs".into(), text);
        }
        Err(e) => errors.push(e),
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors.join("\n"))
    }
}

/// Generator-owned files on disk now (model files, plan files, lib.rs).
fn files_on_disk() -> Vec<String> {
    let mut found = Vec::new();
    for (dir, ext) in [("generated/src", "rs"), ("generated/plans", "md")] {
        let Ok(entries) = std::fs::read_dir(repo_root().join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == ext) {
                found.push(format!(
                    "{dir}/{}",
                    p.file_name().unwrap().to_string_lossy()
                ));
            }
        }
    }
    found.sort();
    found
}

/// Writes every output into a staging directory first (outside generated/,
/// same file system), and only then renames them all into place. An error or
/// a kill while staging leaves generated/ exactly as it was; the rename phase
/// is a few renames long. A staging directory left by a killed run is removed
/// by the next one.
pub fn write_all(outputs: &Outputs, remove: &[String]) -> Result<(), String> {
    let root = repo_root();
    clean_stale_staging(&root);
    let staging = root.join(format!(".gen-staging-{}", std::process::id()));
    let result = stage_and_commit(&root, &staging, outputs, remove);
    let _ = std::fs::remove_dir_all(&staging);
    result
}

fn clean_stale_staging(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(".gen-staging-") {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn stage_and_commit(
    root: &Path,
    staging: &Path,
    outputs: &Outputs,
    remove: &[String],
) -> Result<(), String> {
    let fail_after: Option<usize> = std::env::var("ARCHGEN_GEN_FAIL_AFTER")
        .ok()
        .and_then(|v| v.parse().ok());
    let pause_ms: Option<u64> = std::env::var("ARCHGEN_GEN_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut staged = Vec::new();
    for (n, (rel, text)) in outputs.iter().enumerate() {
        if fail_after == Some(n) {
            // Fault injection for the atomicity test.
            return Err(format!("injected failure before staging {rel}"));
        }
        let tmp = staging.join(rel);
        std::fs::create_dir_all(tmp.parent().unwrap())
            .map_err(|e| format!("cannot create {}: {e}", staging.display()))?;
        std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        staged.push((tmp, root.join(rel)));
        if let Some(ms) = pause_ms {
            // Lets the kill test stop the process mid-staging.
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
    for (_, dest) in &staged {
        let dir = dest.parent().unwrap();
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    for (tmp, dest) in &staged {
        std::fs::rename(tmp, dest)
            .map_err(|e| format!("cannot move {} into place: {e}", dest.display()))?;
    }
    for rel in remove {
        std::fs::remove_file(root.join(rel)).map_err(|e| format!("cannot remove {rel}: {e}"))?;
    }
    Ok(())
}

/// `gen NAME... | --all | --check` (clap makes them exclusive and asks for one).
pub fn run(args: &GenArgs, quiet: bool) -> Result<(), String> {
    let reporter = Reporter::new(args.format.message_format);
    if args.check {
        return check(&reporter);
    }
    if args.all {
        let specs = crate::spec::all_specs()?.len() as u64;
        let bar = crate::report::items_bar(2 * specs, "gen", quiet);
        let planned = all_plans(&reporter, bar.as_ref())
            .and_then(|plans| outputs_for(&plans, &plans, bar.as_ref()).map(|o| (plans, o)));
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        let (plans, outputs) = planned?;
        let orphans: Vec<String> = files_on_disk()
            .into_iter()
            .filter(|f| !outputs.contains_key(f))
            .collect();
        write_all(&outputs, &orphans)?;
        for o in &orphans {
            eprintln!("gen: removed orphaned {o}");
        }
        eprintln!("gen: {} model(s) generated", plans.len());
        return Ok(());
    }
    let names: Vec<&String> = args.names.iter().collect();
    for name in &names {
        let path = crate::spec::specs_dir().join(format!("{name}.yaml"));
        if !path.exists() {
            return Err(format!(
                "no spec {}: import one with `cargo xtask spec import DIR --name {name}`",
                path.display()
            ));
        }
    }
    // The registry lists every spec already generated plus these; each
    // spec is planned once.
    let on_disk = files_on_disk();
    let mut registry = Vec::new();
    for path in crate::spec::all_specs()? {
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        if names.iter().any(|n| **n == stem) || on_disk.contains(&model_path(&stem)) {
            registry.push(spec_plan(&path, &reporter)?);
        }
    }
    let plans: Vec<Plan> = registry
        .iter()
        .filter(|p| names.iter().any(|n| **n == p.name))
        .cloned()
        .collect();
    let outputs = outputs_for(&plans, &registry, None)?;
    write_all(&outputs, &[])?;
    for p in &plans {
        eprintln!(
            "gen: {} -> {}, {}",
            p.spec_path,
            model_path(&p.name),
            plan_path(&p.name)
        );
    }
    Ok(())
}

/// Unified diff of two texts (for --check and diff).
fn unified(path: &str, old: &str, new: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string()
}

/// What `--check` found: empty when generated/ is fresh.
pub fn stale_report(reporter: &Reporter) -> Result<Vec<String>, String> {
    let plans = all_plans(reporter, None)?;
    let expected = outputs_for(&plans, &plans, None)?;
    let mut problems = Vec::new();
    for (rel, text) in &expected {
        match std::fs::read_to_string(repo_root().join(rel)) {
            Ok(actual) if &actual == text => {}
            Ok(actual) => problems.push(format!(
                "{rel} differs from what its spec gives (hand edit or stale):\n{}",
                unified(rel, &actual, text)
            )),
            Err(_) => problems.push(format!("{rel} is missing")),
        }
    }
    for f in files_on_disk() {
        if !expected.contains_key(&f) {
            problems.push(format!("{f} is orphaned: no spec in specs/ generates it"));
        }
    }
    Ok(problems)
}

fn check(reporter: &Reporter) -> Result<(), String> {
    let problems = stale_report(reporter)?;
    if problems.is_empty() {
        eprintln!(
            "gen --check: generated/ is fresh ({} files)",
            files_on_disk().len()
        );
        return Ok(());
    }
    for p in &problems {
        // With --message-format json stdout carries only JSON.
        if reporter.json() {
            eprintln!("{p}");
        } else {
            println!("{p}");
        }
    }
    Err(format!(
        "{} generated file(s) are stale, edited by hand, missing or orphaned; fix with: cargo xtask gen --all",
        problems.len()
    ))
}

fn git_show(base: &str, rel: &str) -> Option<String> {
    let out = Command::new("git")
        .args(["show", &format!("{base}:{rel}")])
        .current_dir(repo_root())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn line_changes(old: &str, new: &str) -> (usize, usize) {
    let d = similar::TextDiff::from_lines(old, new);
    let mut added = 0;
    let mut removed = 0;
    for c in d.iter_all_changes() {
        match c.tag() {
            similar::ChangeTag::Insert => added += 1,
            similar::ChangeTag::Delete => removed += 1,
            similar::ChangeTag::Equal => {}
        }
    }
    (added, removed)
}

/// `cargo xtask diff [BASE]`: per model, plan and code line changes between
/// BASE (a git revision) and the working tree.
pub fn diff(base: &str) -> Result<(), String> {
    let mut names: Vec<String> = files_on_disk()
        .iter()
        .filter_map(|f| {
            f.strip_prefix("generated/plans/")
                .and_then(|f| f.strip_suffix(".plan.md"))
                .map(str::to_string)
        })
        .collect();
    names.sort();
    let mut changed = 0;
    for name in &names {
        let mut parts = Vec::new();
        for (what, rel) in [("plan", plan_path(name)), ("code", model_path(name))] {
            let new = std::fs::read_to_string(repo_root().join(&rel)).unwrap_or_default();
            match git_show(base, &rel) {
                None => parts.push(format!("{what}: new")),
                Some(old) if old == new => {}
                Some(old) => {
                    let (a, r) = line_changes(&old, &new);
                    parts.push(format!("{what}: +{a} -{r}"));
                }
            }
        }
        if !parts.is_empty() {
            changed += 1;
            println!("{name}: {}", parts.join(", "));
        }
    }
    println!("{changed} of {} model(s) changed since {base}", names.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    /// `cargo test` fails when generated/ is stale, hand-edited or orphaned.
    #[test]
    fn generated_files_are_fresh() {
        let problems = super::stale_report(&Default::default()).unwrap();
        assert!(
            problems.is_empty(),
            "generated/ is not what the specs give; run `cargo xtask gen --all`:\n{}",
            problems.join("\n")
        );
    }
}
