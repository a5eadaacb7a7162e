//! Corrupted copies of a tiny valid checkpoint, one per fault, shared by the
//! loader tests (tests/checkpoint_faults.rs) and the CLI tests
//! (runtime/cli/tests/faults.rs). Safetensors files are rewritten here in
//! plain Rust, so building a fault costs a file copy.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::run_python;

/// Which valid checkpoint a fault starts from.
#[derive(Clone, Copy, Debug)]
pub enum Base {
    /// e2b-tiny-bf16: unquantized, PLE, KV sharing.
    Bf16,
    /// e2b-tiny-q4: 4-bit, group size 32.
    Q4,
}

/// One corruption and the pieces its error message must contain.
pub struct Fault {
    pub name: &'static str,
    pub base: Base,
    pub corrupt: fn(&Path),
    pub expect: &'static [&'static str],
}

/// The two tiny valid checkpoints (one Python run builds both), in a
/// temporary directory removed when this value drops.
pub struct Bases {
    dir: tempfile::TempDir,
}

impl Bases {
    pub fn build() -> Bases {
        let dir = tempfile::tempdir().unwrap();
        run_python(
            "run_oracle.py",
            &[
                "--cases-out".as_ref(),
                dir.path().as_os_str(),
                "--only".as_ref(),
                "e2b-tiny-bf16,e2b-tiny-q4".as_ref(),
            ],
        );
        Bases { dir }
    }

    pub fn dir(&self, base: Base) -> PathBuf {
        self.dir
            .path()
            .join(match base {
                Base::Bf16 => "e2b-tiny-bf16",
                Base::Q4 => "e2b-tiny-q4",
            })
            .join("model")
    }

    /// A fresh copy of the fault's base checkpoint under `into`, corrupted.
    pub fn make(&self, fault: &Fault, into: &Path) -> PathBuf {
        let dir = into.join(fault.name);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(self.dir(fault.base)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        (fault.corrupt)(&dir);
        dir
    }
}

/// A safetensors file as header entries plus each tensor's bytes.
pub struct SafeTensors {
    pub metadata: Option<Value>,
    /// (name, dtype, shape, bytes), in file order.
    pub tensors: Vec<(String, String, Vec<u64>, Vec<u8>)>,
}

impl SafeTensors {
    pub fn read(path: &Path) -> Self {
        let bytes = std::fs::read(path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Map<String, Value> =
            serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let data = &bytes[8 + n..];
        let mut metadata = None;
        let mut tensors = Vec::new();
        for (name, info) in header {
            if name == "__metadata__" {
                metadata = Some(info);
                continue;
            }
            let o = &info["data_offsets"];
            let (b, e) = (o[0].as_u64().unwrap(), o[1].as_u64().unwrap());
            tensors.push((
                name,
                info["dtype"].as_str().unwrap().to_string(),
                serde_json::from_value(info["shape"].clone()).unwrap(),
                data[b as usize..e as usize].to_vec(),
            ));
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        SafeTensors { metadata, tensors }
    }

    /// Writes the file with offsets recomputed (contiguous, in order).
    pub fn write(&self, path: &Path) {
        let mut header = serde_json::Map::new();
        if let Some(m) = &self.metadata {
            header.insert("__metadata__".into(), m.clone());
        }
        let mut at = 0;
        for (name, dtype, shape, bytes) in &self.tensors {
            header.insert(
                name.clone(),
                json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + bytes.len()]}),
            );
            at += bytes.len();
        }
        let header = serde_json::to_vec(&Value::Object(header)).unwrap();
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header);
        for t in &self.tensors {
            out.extend(&t.3);
        }
        std::fs::write(path, out).unwrap();
    }

    pub fn get_mut(&mut self, name: &str) -> &mut (String, String, Vec<u64>, Vec<u8>) {
        self.tensors
            .iter_mut()
            .find(|t| t.0 == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }
}

const NORM: &str = "language_model.model.layers.0.input_layernorm.weight";
const Q_PROJ: &str = "language_model.model.layers.0.self_attn.q_proj.weight";

fn edit_tensors(dir: &Path, f: impl FnOnce(&mut SafeTensors)) {
    let path = dir.join("model.safetensors");
    let mut st = SafeTensors::read(&path);
    f(&mut st);
    st.write(&path);
}

fn edit_json(path: &Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// Rewrites the raw header bytes (same length, so offsets stay valid).
fn edit_header_bytes(dir: &Path, f: impl FnOnce(&mut [u8])) {
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header = bytes[8..8 + n].to_vec();
    f(&mut header);
    assert_eq!(header.len(), n, "header edits keep the length");
    bytes[8..8 + n].copy_from_slice(&header);
    std::fs::write(&path, bytes).unwrap();
}

fn replace_once(hay: &mut [u8], from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let s = String::from_utf8(hay.to_vec()).unwrap();
    let at = s
        .find(from)
        .unwrap_or_else(|| panic!("no {from} in header"));
    hay[at..at + from.len()].copy_from_slice(to.as_bytes());
}

fn quant_config(dir: &Path, key: &str, value: i64) {
    edit_json(&dir.join("config.json"), |c| {
        c["quantization"][key] = json!(value);
        c["quantization_config"][key] = json!(value);
    });
}

/// Every fault, each with the pieces its error must name.
pub fn faults() -> Vec<Fault> {
    vec![
        Fault {
            name: "missing-tensor",
            base: Base::Bf16,
            corrupt: |d| edit_tensors(d, |st| st.tensors.retain(|t| t.0 != NORM)),
            expect: &["missing tensor 'layers.0.input_layernorm.weight'"],
        },
        Fault {
            name: "unexpected-tensor",
            base: Base::Bf16,
            corrupt: |d| {
                edit_tensors(d, |st| {
                    st.tensors.push((
                        "language_model.model.layers.0.self_attn.bogus.weight".into(),
                        "BF16".into(),
                        vec![4],
                        vec![0; 8],
                    ))
                })
            },
            expect: &["unexpected tensor 'layers.0.self_attn.bogus.weight'"],
        },
        Fault {
            name: "wrong-shape",
            base: Base::Bf16,
            corrupt: |d| {
                edit_tensors(d, |st| {
                    let t = st.get_mut(NORM);
                    t.2 = vec![32];
                    t.3.truncate(64);
                })
            },
            expect: &[
                "tensor 'layers.0.input_layernorm.weight': expected shape [64], found [32]",
            ],
        },
        Fault {
            name: "norm-weight-int32",
            base: Base::Bf16,
            corrupt: |d| {
                edit_tensors(d, |st| {
                    let t = st.get_mut(NORM);
                    t.1 = "I32".into();
                    t.3.extend(vec![0; 128]);
                })
            },
            expect: &[
                "tensor 'layers.0.input_layernorm.weight': expected dtype Bfloat16 or Float16 or Float32, found Int32",
            ],
        },
        Fault {
            name: "quantized-weight-int32",
            base: Base::Q4,
            corrupt: |d| edit_tensors(d, |st| st.get_mut(Q_PROJ).1 = "I32".into()),
            expect: &[
                "tensor 'layers.0.self_attn.q_proj.weight': expected dtype Uint32, found Int32",
            ],
        },
        Fault {
            name: "truncated-file",
            base: Base::Bf16,
            corrupt: |d| {
                let p = d.join("model.safetensors");
                let len = std::fs::metadata(&p).unwrap().len();
                let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
                f.set_len(len / 2).unwrap();
            },
            expect: &[
                "model.safetensors: corrupt safetensors file",
                "but the data section has",
                "(truncated?)",
            ],
        },
        Fault {
            name: "header-garbage-json",
            base: Base::Bf16,
            corrupt: |d| edit_header_bytes(d, |h| h[..6].copy_from_slice(b"{\"a\":[")),
            expect: &[
                "model.safetensors: corrupt safetensors file",
                "header is not valid JSON",
            ],
        },
        Fault {
            name: "header-length-beyond-file",
            base: Base::Bf16,
            corrupt: |d| {
                let p = d.join("model.safetensors");
                let mut b = std::fs::read(&p).unwrap();
                b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
                std::fs::write(&p, b).unwrap();
            },
            expect: &[
                "model.safetensors: corrupt safetensors file",
                "header length 1099511627776 exceeds the",
            ],
        },
        Fault {
            name: "header-unknown-dtype",
            base: Base::Bf16,
            corrupt: |d| edit_header_bytes(d, |h| replace_once(h, "\"BF16\"", "\"BX16\"")),
            expect: &[
                "model.safetensors: corrupt safetensors file: tensor '",
                "expected a dtype MLX loads",
                "found \"BX16\"",
            ],
        },
        Fault {
            name: "header-shape-disagrees-with-offsets",
            base: Base::Bf16,
            corrupt: |d| {
                edit_header_bytes(d, |h| {
                    replace_once(h, "\"shape\":[64]", "\"shape\":[65]")
                })
            },
            expect: &[
                "model.safetensors: corrupt safetensors file: tensor '",
                "expected 130 bytes for BF16 [65], found data_offsets",
                "(128 bytes)",
            ],
        },
        Fault {
            name: "index-names-missing-shard",
            base: Base::Bf16,
            corrupt: |d| {
                edit_json(&d.join("model.safetensors.index.json"), |v| {
                    v["weight_map"][NORM] = json!("model-00002-of-00002.safetensors");
                })
            },
            expect: &[
                "model.safetensors.index.json: weight_map names 'model-00002-of-00002.safetensors', which is missing",
            ],
        },
        Fault {
            name: "config-invalid-json",
            base: Base::Bf16,
            corrupt: |d| {
                // Line 5, `    "model_type": "gemma4",`, loses its colon.
                let p = d.join("config.json");
                let text = std::fs::read_to_string(&p).unwrap();
                let text = text.replacen("\"model_type\": ", "\"model_type\" ", 1);
                std::fs::write(&p, text).unwrap();
            },
            expect: &["config.json:5:18: invalid JSON: expected `:`"],
        },
        Fault {
            name: "config-unsupported-model-type",
            base: Base::Bf16,
            corrupt: |d| edit_json(&d.join("config.json"), |c| c["model_type"] = json!("falcon")),
            expect: &[
                "config.json",
                "model_type: `falcon` is not a supported model",
            ],
        },
        Fault {
            name: "config-hidden-size-contradicts-weights",
            base: Base::Bf16,
            corrupt: |d| {
                edit_json(&d.join("config.json"), |c| {
                    c["text_config"]["hidden_size"] = json!(96)
                })
            },
            expect: &[
                "checkpoint does not match the architecture",
                "tensor 'embed_tokens.weight': expected shape [512, 96], found [512, 64]",
                "tensor 'layers.0.input_layernorm.weight': expected shape [96], found [64]",
            ],
        },
        Fault {
            name: "quant-bits-contradict-packed-weights",
            base: Base::Q4,
            corrupt: |d| quant_config(d, "bits", 8),
            expect: &[
                "tensor 'layers.0.self_attn.q_proj.weight': expected shape [64, 16] for bits=8 group_size=32 (config.json quantization), found [64, 8], which packs 4 bits per weight",
            ],
        },
        Fault {
            name: "quant-group-size-not-dividing",
            base: Base::Q4,
            corrupt: |d| quant_config(d, "group_size", 48),
            expect: &["group_size", "48"],
        },
    ]
}
