//! `cargo xtask gen` on a copy of specs/ and generated/: --check catches hand
//! edits and orphans by name; a failure or a kill mid-write leaves generated/
//! exactly as it was; output is the same bytes whatever the working
//! directory, locale or environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// A temp tree with copies of specs/ and generated/.
fn copy_of_repo() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&repo().join("specs"), &t.path().join("specs"));
    copy_dir(&repo().join("generated"), &t.path().join("generated"));
    t
}

/// Every file under `dir` with its bytes.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.insert(
                    p.strip_prefix(base).unwrap().display().to_string(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn xtask(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .env("ARCHGEN_ROOT", root)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const EDITED: &str = "generated/src/gemma4_e2b_tiny.rs";

fn hand_edit(root: &Path) {
    let p = root.join(EDITED);
    let mut s = std::fs::read_to_string(&p).unwrap();
    s.push_str("// a hand edit\n");
    std::fs::write(p, s).unwrap();
}

#[test]
fn check_names_hand_edits_and_orphans() {
    let t = copy_of_repo();
    let ok = xtask(t.path(), &["gen", "--check"], &[]);
    assert!(ok.status.success(), "{}", text(&ok));
    hand_edit(t.path());
    std::fs::write(t.path().join("generated/src/stray.rs"), "pub fn x() {}\n").unwrap();
    let o = xtask(t.path(), &["gen", "--check"], &[]);
    let out = text(&o);
    assert!(!o.status.success());
    assert!(out.contains(&format!("{EDITED} differs")), "{out}");
    assert!(
        out.contains("+// a hand edit") || out.contains("-// a hand edit"),
        "{out}"
    );
    assert!(out.contains("generated/src/stray.rs is orphaned"), "{out}");
    assert!(out.contains("cargo xtask gen --all"), "{out}");
}

#[test]
fn a_failure_while_writing_leaves_generated_untouched() {
    let t = copy_of_repo();
    hand_edit(t.path());
    let before = tree(&t.path().join("generated"));
    let o = xtask(
        t.path(),
        &["gen", "--all"],
        &[("ARCHGEN_GEN_FAIL_AFTER", "5")],
    );
    assert!(
        !o.status.success() && text(&o).contains("injected failure"),
        "{}",
        text(&o)
    );
    assert_eq!(
        tree(&t.path().join("generated")),
        before,
        "generated/ changed"
    );
    assert!(!std::fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(".gen-")));
    // Without the fault the same command does rewrite the edited file.
    assert!(xtask(t.path(), &["gen", "--all"], &[]).status.success());
    assert_ne!(tree(&t.path().join("generated")), before);
    assert!(xtask(t.path(), &["gen", "--check"], &[]).status.success());
}

#[test]
fn a_kill_while_writing_leaves_generated_untouched() {
    let t = copy_of_repo();
    hand_edit(t.path());
    let before = tree(&t.path().join("generated"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["gen", "--all"])
        .env("ARCHGEN_ROOT", t.path())
        .env("ARCHGEN_GEN_PAUSE_MS", "100")
        .spawn()
        .unwrap();
    // Kill once a few files are staged.
    let start = Instant::now();
    loop {
        let staged: usize = std::fs::read_dir(t.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".gen-staging-"))
            .map(|e| tree(&e.path()).len())
            .sum();
        if staged >= 3 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "nothing was staged"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        tree(&t.path().join("generated")),
        before,
        "generated/ changed"
    );
    // The next run cleans the killed run's staging directory.
    assert!(xtask(t.path(), &["gen", "--all"], &[]).status.success());
    assert!(!std::fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(".gen-")));
}

#[test]
fn output_is_the_same_bytes_whatever_the_environment() {
    let a = copy_of_repo();
    let b = copy_of_repo();
    for d in [&a, &b] {
        std::fs::remove_dir_all(d.path().join("generated/src")).unwrap();
        std::fs::remove_dir_all(d.path().join("generated/plans")).unwrap();
    }
    let o = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["gen", "--all"])
        .env("ARCHGEN_ROOT", a.path())
        .current_dir(a.path())
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["gen", "--all"])
        .env("ARCHGEN_ROOT", b.path())
        .current_dir(std::env::temp_dir())
        .env("LC_ALL", "tr_TR.UTF-8")
        .env("LANG", "de_DE.UTF-8")
        .env("TZ", "Asia/Kathmandu")
        .env("RAYON_NUM_THREADS", "7")
        .env("HOME", "/nonexistent")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let (ta, tb) = (
        tree(&a.path().join("generated")),
        tree(&b.path().join("generated")),
    );
    assert_eq!(ta, tb);
    assert_eq!(
        ta,
        tree(&repo().join("generated")),
        "differs from the checked-in generated/"
    );
}
