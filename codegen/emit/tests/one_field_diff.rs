//! A change to one field of one spec is a change of a few lines in that
//! model's generated file: layers are a table and loops, so a width or a
//! window is written once, not once per layer and place.

use std::path::Path;

/// The generated file of `specs/{name}.yaml` with `from` replaced by `to`
/// in its text (exactly once).
fn emit_with(name: &str, from: &str, to: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let origin = format!("specs/{name}.yaml");
    let text = std::fs::read_to_string(root.join(&origin)).unwrap();
    assert_eq!(text.matches(from).count(), 1, "{origin}: `{from}` once");
    let text = text.replace(from, to);
    let spec = archgen_families::parse_str(&text, &origin).unwrap_or_else(|d| panic!("{d}"));
    archgen_emit::model_file(&archgen_plan::plan(&spec, &origin)).unwrap()
}

/// Lines removed plus lines added between `a` and `b` (longest common
/// subsequence of lines).
fn changed_lines(a: &str, b: &str) -> usize {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    a.len() + b.len() - 2 * lcs[0][0]
}

/// The spec hash and fingerprint change with any edit: in the header and in
/// `FINGERPRINT` and `SPEC_SHA256`.
const HEADER: usize = 4;

fn assert_small(name: &str, from: &str, to: &str, at_most: usize) {
    let before = emit_with(name, from, from);
    let after = emit_with(name, from, to);
    let changed = changed_lines(&before, &after);
    // Each line changes once in each file: removed and added.
    assert!(
        changed > 2 * HEADER && changed <= 2 * (HEADER + at_most),
        "{name}: `{from}` -> `{to}` changed {changed} lines (removed + added), \
         at most {} expected past the header",
        2 * at_most
    );
}

#[test]
fn the_mlp_width_of_48_layers_is_one_line() {
    // gemma4-12b: 48 layers share one width.
    assert_small(
        "gemma4-12b",
        "intermediate_size: 15360",
        "intermediate_size: 16384",
        1,
    );
}

#[test]
fn the_sliding_window_is_a_few_lines() {
    // The kind's doc, its cache for one sequence and for a batch, and the
    // window's mask in the two forwards.
    assert_small(
        "gemma4-12b",
        "sliding_window: 1024",
        "sliding_window: 512",
        5,
    );
}

#[test]
fn one_layer_fewer_is_a_few_lines() {
    // Its row, the table's length, `LAYERS`, the model's doc and the
    // kind's layer list.
    assert_small(
        "qwen3-8b",
        "num_hidden_layers: 36",
        "num_hidden_layers: 35",
        5,
    );
}
