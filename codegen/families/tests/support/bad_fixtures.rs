//! The bad-spec fixtures (`tests/bad/*.yaml` but the `ok-*` helpers), shared by
//! the test files that walk them.

/// The bad fixtures' file names, sorted. Integration tests run in the package
/// root, so the directory is `tests/bad`.
pub fn bad_fixtures() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("tests/bad")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && !n.starts_with("ok-"))
        .collect();
    names.sort();
    names
}
