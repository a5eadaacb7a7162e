#![no_main]
//! Arbitrary bytes as `model.safetensors` next to a fixed valid config.json:
//! `read_checkpoint` must return Ok or Err, never panic or abort, and every
//! tensor it hands out must evaluate (the header check vouches for the data).

use std::sync::OnceLock;

use archgen_runtime::weights::read_checkpoint;

fn dir() -> &'static std::path::Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("archgen-fuzz-st-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("config.json"), r#"{"model_type": "gemma4_text"}"#).unwrap();
        d
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let d = dir();
    std::fs::write(d.join("model.safetensors"), data).unwrap();
    if let Ok(ckpt) = read_checkpoint(d) {
        for a in ckpt.tensors.values() {
            a.eval()
                .expect("a tensor the header check accepted does not load");
        }
    }
});
