//! The excerpt form of spec errors (`cargo xtask spec check`, `archgen init`):
//! the plain catalogue text unchanged, with the source line and a caret under
//! the span added between each message line and its hint; and the JSON form.

use std::path::Path;

use archgen_families::render::Style;

#[path = "support/bad_fixtures.rs"]
mod support;
use support::bad_fixtures;

/// Whether `line` is one annotate-snippets drew: `   |`, `12 | source`, `   | ^^^`.
fn is_excerpt_line(line: &str) -> bool {
    let rest = line
        .trim_start()
        .trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start();
    rest == "|" || rest.starts_with("| ")
}

#[test]
fn excerpts_add_lines_and_change_no_text() {
    let mut all = String::new();
    for name in bad_fixtures() {
        let diags = archgen_families::load(Path::new("tests/bad").join(&name)).unwrap_err();
        let plain = diags.to_string();
        let excerpt = diags.render_excerpts(Style::Plain);
        let kept: Vec<&str> = excerpt.lines().filter(|l| !is_excerpt_line(l)).collect();
        assert_eq!(
            kept.join("\n"),
            plain,
            "{name}: the excerpt form changed the text"
        );
        // Every diagnostic on a non-blank line got its source line and a caret.
        let carets = excerpt
            .lines()
            .filter(|l| is_excerpt_line(l) && l.contains('^'))
            .count();
        let source =
            String::from_utf8_lossy(&std::fs::read(Path::new("tests/bad").join(&name)).unwrap())
                .into_owned();
        let on_text = diags
            .iter()
            .filter(|d| {
                source
                    .split('\n')
                    .nth(d.line - 1)
                    .is_some_and(|l| !l.trim().is_empty())
            })
            .count();
        assert_eq!(carets, on_text, "{name}:\n{excerpt}");
        all.push_str(&format!("=== {name}\n{excerpt}\n"));
    }
    insta::with_settings!({ snapshot_path => "bad/snapshots", prepend_module_to_snapshot => false, omit_expression => true }, {
        insta::assert_snapshot!("all-excerpts", all);
    });
}

#[test]
fn the_caret_sits_under_the_offending_token() {
    let diags = archgen_families::load("tests/bad/unknown-field.yaml").unwrap_err();
    let text = diags.render_excerpts(Style::Plain);
    let lines: Vec<&str> = text.lines().collect();
    let source = lines.iter().position(|l| l.starts_with("11 |")).unwrap();
    let (bar, code) = lines[source].split_once('|').unwrap();
    assert_eq!(bar.trim(), "11", "{text}");
    let carets = lines[source + 1].split_once('|').unwrap().1;
    let start = carets.find('^').unwrap();
    let width = carets.matches('^').count();
    assert_eq!(&code[start..start + width], "hiden_size", "{text}");
}

#[test]
fn colour_is_only_added_on_request() {
    let diags = archgen_families::load("tests/bad/odd-head-dim.yaml").unwrap_err();
    assert!(!diags.render_excerpts(Style::Plain).contains('\u{1b}'));
    assert!(diags.render_excerpts(Style::Color).contains('\u{1b}'));
}

#[test]
fn json_objects_carry_the_location_span_and_text() {
    let diags = archgen_families::load("tests/bad/wrong-type.yaml").unwrap_err();
    let json = diags.to_json();
    assert_eq!(json.len(), 1);
    let d = &json[0];
    assert_eq!(d["type"], "diagnostic");
    assert_eq!(d["severity"], "error");
    assert_eq!(d["file"], "tests/bad/wrong-type.yaml");
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(11), Some(16))
    );
    // `"big"` or `big`: the span ends after the value.
    let source = std::fs::read_to_string("tests/bad/wrong-type.yaml").unwrap();
    let line = source.lines().nth(10).unwrap();
    let end = d["end_column"].as_u64().unwrap() as usize;
    let token: String = line.chars().skip(15).take(end - 16).collect();
    assert!(token.contains("big"), "{token:?} in {line:?}");
    assert_eq!(d["path"], "model.hidden_size");
    assert_eq!(d["message"], diags.0[0].message);
    assert_eq!(d["expected"], "a positive integer");
    assert_eq!(d["hint"], diags.0[0].hint);
    assert!(d["rendered"].as_str().unwrap().contains("^^^"));
    // Every fixture's diagnostics serialise, and each object round-trips as one JSON line.
    for name in bad_fixtures() {
        let diags = archgen_families::load(Path::new("tests/bad").join(&name)).unwrap_err();
        for v in diags.to_json() {
            let line = serde_json::to_string(&v).unwrap();
            assert!(!line.contains('\n'), "{name}");
            let back: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(back, v);
        }
    }
}
