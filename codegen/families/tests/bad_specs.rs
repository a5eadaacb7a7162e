//! Every `tests/bad/*.yaml` (except `ok-*` helpers) is rejected; the rendered errors are
//! pinned as insta snapshots. Each error names file:line:column, the field path, what
//! was expected and a hint.

use std::path::Path;

#[path = "support/bad_fixtures.rs"]
mod support;
use support::bad_fixtures;

#[test]
fn bad_specs_are_rejected_with_located_messages() {
    // Integration tests run in the package root, so origins are `tests/bad/<name>.yaml`.
    let names = bad_fixtures();
    assert!(names.len() >= 25, "only {} bad specs", names.len());
    for name in &names {
        let path = Path::new("tests/bad").join(name);
        let diags = match archgen_families::load(&path) {
            Ok(_) => panic!("{name} was accepted"),
            Err(d) => d,
        };
        assert!(!diags.is_empty(), "{name}");
        for d in diags.iter() {
            assert!(d.line >= 1 && d.column >= 1, "{name}: {d}");
            assert!(!d.expected.is_empty() && !d.hint.is_empty(), "{name}: {d}");
        }
        let text = diags.to_string();
        assert!(
            text.contains(&format!("tests/bad/{name}:")) || text.contains("tests/bad/"),
            "{name}"
        );
        let stem = name.trim_end_matches(".yaml");
        insta::with_settings!({ snapshot_path => "bad/snapshots", prepend_module_to_snapshot => false, omit_expression => true }, {
            insta::assert_snapshot!(stem, text);
        });
    }
}

#[test]
fn helper_specs_in_the_bad_directory_are_good() {
    archgen_families::load("tests/bad/ok-parent.yaml").unwrap();
    archgen_families::load("tests/bad/ok-derived.yaml").unwrap();
    archgen_families::load("tests/bad/ok-dense-parent.yaml").unwrap();
    archgen_families::load("tests/bad/ok-dense-derived.yaml").unwrap();
    archgen_families::load("tests/bad/ok-qwen3-moe-parent.yaml").unwrap();
    archgen_families::load("tests/bad/ok-qwen3-5-parent.yaml").unwrap();
    archgen_families::load("tests/bad/ok-gemma2-parent.yaml").unwrap();
    archgen_families::load("tests/bad/ok-qwen3-5-moe-parent.yaml").unwrap();
}

#[test]
fn oversized_files_are_rejected_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.yaml");
    std::fs::write(&path, "#".repeat(archgen_families::MAX_SPEC_BYTES + 1)).unwrap();
    let d = archgen_families::load(&path).unwrap_err();
    assert!(d.to_string().contains("over the limit"), "{d}");
    let d =
        archgen_families::parse_str(&"#".repeat(archgen_families::MAX_SPEC_BYTES + 1), "x.yaml")
            .unwrap_err();
    assert!(d.to_string().contains("1:1"), "{d}");
}

#[test]
fn garbage_never_panics() {
    let base = std::fs::read_to_string("tests/bad/ok-parent.yaml").unwrap();
    // Truncate the file at every line and at odd byte offsets: always an error, never a panic.
    for cut in (0..base.len()).step_by(7) {
        if base.is_char_boundary(cut) {
            let _ = archgen_families::parse_str(&base[..cut], "cut.yaml");
        }
    }
    for junk in [
        "[",
        "{",
        ":",
        "- - -",
        "a: [b, {c: d}]",
        "!!binary x",
        "? a\n: b",
        "&a [*a]",
        "\u{feff}x: 1",
        "---\n---\n",
    ] {
        assert!(
            archgen_families::parse_str(junk, "junk.yaml").is_err(),
            "{junk}"
        );
    }
}

/// docs/errors.md lists every bad-spec fixture.
#[test]
fn the_error_catalogue_lists_every_fixture() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad");
    let doc = std::fs::read_to_string(dir.join("../../../../docs/errors.md")).unwrap();
    let (mut missing, mut fixtures) = (Vec::new(), 0);
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(stem) = name.strip_suffix(".yaml") {
            if stem.starts_with("ok-") {
                continue;
            }
            fixtures += 1;
            if !doc.contains(&format!("| `{stem}` |")) {
                missing.push(stem.to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/errors.md does not list: {missing:?}"
    );
    assert!(
        doc.contains(&format!("\n{fixtures} fixtures.\n")),
        "docs/errors.md: its count line should read `{fixtures} fixtures.`"
    );
}
