//! A tiny valid checkpoint corrupted one fault at a time: `load_dir` returns
//! an error naming the tensor, field or file with expected vs found, and
//! never panics (nor lets MLX abort on a corrupt file).

use archgen_tests::faults::{faults, Base, Bases};

#[test]
fn the_valid_bases_load() {
    let bases = Bases::build();
    for base in [Base::Bf16, Base::Q4] {
        archgen_monolith::load_dir(&bases.dir(base)).unwrap_or_else(|e| panic!("{base:?}: {e}"));
    }
}

#[test]
fn every_fault_is_a_clear_error() {
    let bases = Bases::build();
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for fault in faults() {
        let dir = bases.make(&fault, tmp.path());
        let result = std::panic::catch_unwind(|| archgen_monolith::load_dir(&dir));
        let message = match result {
            Err(_) => {
                failures.push(format!("{}: panicked", fault.name));
                continue;
            }
            Ok(Ok(_)) => {
                failures.push(format!("{}: loaded", fault.name));
                continue;
            }
            Ok(Err(e)) => e.to_string(),
        };
        println!("{}: {message}\n", fault.name);
        for piece in fault.expect {
            if !message.contains(piece) {
                failures.push(format!("{}: expected '{piece}' in: {message}", fault.name));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
