//! Hostile spec text is rejected quickly with bounded memory: alias bombs,
//! deep nesting, oversized files, and every bad fixture, each under a second.

use std::time::{Duration, Instant};

#[path = "support/bad_fixtures.rs"]
mod support;
use support::bad_fixtures;

const LIMIT: Duration = Duration::from_secs(1);

/// Parses `text` on a thread with a small (1 MiB) stack, so unbounded
/// recursion shows up here as a crash rather than only on big inputs.
fn rejected_quickly(what: &str, text: String) -> String {
    let t = Instant::now();
    let result = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || archgen_families::parse_str(&text, "hostile.yaml").map(|_| ()))
        .unwrap()
        .join()
        .unwrap_or_else(|_| panic!("{what}: panicked"));
    let took = t.elapsed();
    let d = result.expect_err(what);
    assert!(took < LIMIT, "{what}: took {took:?}");
    d.to_string()
}

#[test]
fn billion_laughs_is_rejected_without_expanding() {
    // 10 levels of 10 aliases each: 10^10 leaves if expanded.
    let mut text = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    let d = rejected_quickly("billion laughs", text);
    assert!(d.contains("a YAML anchor"), "{d}");
    assert!(d.contains("a YAML alias"), "{d}");
}

#[test]
fn deep_flow_nesting_is_rejected() {
    let n = 10_000;
    let text = format!("model: {}{}\n", "[".repeat(n), "]".repeat(n));
    // yaml-rust2's scanner stops flow nesting at its own recursion limit first.
    let d = rejected_quickly("10k nested flow sequences", text);
    assert!(d.contains("recursion limit exceeded"), "{d}");
    let text = format!("model: {}1{}\n", "{a: ".repeat(n), "}".repeat(n));
    rejected_quickly("10k nested flow maps", text);
}

#[test]
fn deep_block_nesting_is_rejected() {
    let n = 10_000;
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&" ".repeat(i));
        text.push_str("a:\n");
    }
    // 10k levels of indentation is ~50 MB; stop below the size limit instead.
    text.truncate(archgen_families::MAX_SPEC_BYTES);
    let text = text[..text.rfind('\n').unwrap() + 1].to_string();
    let d = rejected_quickly("deep block maps", text);
    assert!(d.contains("nesting deeper than 32 levels"), "{d}");
    let text = format!("{}1\n", "- ".repeat(n));
    let d = rejected_quickly("10k nested block sequences", text);
    assert!(d.contains("nesting deeper than 32 levels"), "{d}");
}

#[test]
fn oversized_files_are_rejected_quickly() {
    // Just over the limit, and far over it (a 16 MiB real-looking file).
    let line = "    - {rope_type: default, rope_theta: 10000.0}\n";
    for size in [archgen_families::MAX_SPEC_BYTES + 1, 16 << 20] {
        let text = line.repeat(size / line.len() + 1);
        let d = rejected_quickly("oversized file", text);
        assert!(d.contains("over the limit"), "{d}");
    }
    // Just under the limit: parsed (and rejected as a spec) within the bound.
    let text = format!(
        "format_version: 1\nlist:\n{}",
        "  - 1\n".repeat((archgen_families::MAX_SPEC_BYTES - 100) / 6)
    );
    rejected_quickly("1 MiB list", text);
}

#[test]
fn every_bad_fixture_is_rejected_within_the_bound() {
    for name in bad_fixtures() {
        let path = std::path::Path::new("tests/bad").join(&name);
        let t = Instant::now();
        assert!(archgen_families::load(&path).is_err(), "{name}");
        assert!(t.elapsed() < LIMIT, "{name}: took {:?}", t.elapsed());
    }
}
