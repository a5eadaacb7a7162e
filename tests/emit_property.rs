//! Property: every config the importer and validator accept yields a plan
//! whose emitted Rust parses (syn, inside `model_file`), and a sample of the
//! emitted models type-checks against the real runtime. Inputs are random
//! Gemma-4, Qwen3 and Llama configs from a fixed-seed generator
//! (reproducible; no external property-testing crate needed).

use std::process::Command;

use archgen_tests::repo_root;
use serde_json::{json, Value};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[(self.next() % v.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A random, often invalid, Qwen3 or Llama config.
fn random_dense_config(r: &mut Rng) -> Value {
    let llama = r.chance(50);
    let mut c = json!({
        "model_type": if llama { "llama" } else { "qwen3" },
        "hidden_size": r.pick(&[32u64, 48, 64, 96]),
        "num_hidden_layers": 1 + r.next() % 6,
        "intermediate_size": r.pick(&[32u64, 64, 96, 128]),
        "num_attention_heads": r.pick(&[1u64, 2, 3, 4, 6]),
        "num_key_value_heads": r.pick(&[1u64, 2, 3]),
        "head_dim": r.pick(&[8u64, 16, 32, 15]),
        "vocab_size": r.pick(&[128u64, 256, 384]),
        "rms_norm_eps": r.pick(&[1e-6, 1e-5]),
        "max_position_embeddings": 4096,
        "tie_word_embeddings": r.chance(60),
        "rope_theta": r.pick(&[1e4, 5e5, 1e6]),
    });
    if llama && r.chance(60) {
        c["rope_scaling"] = json!({"rope_type": "llama3", "factor": r.pick(&[8.0, 32.0]),
            "low_freq_factor": 1.0, "high_freq_factor": r.pick(&[4.0, 0.5]),
            "original_max_position_embeddings": 8192});
    }
    if r.chance(35) {
        c["quantization"] = json!({"bits": r.pick(&[4u64, 8]), "group_size": r.pick(&[32u64, 64]), "mode": "affine"});
    }
    c
}

/// A random, often invalid, Gemma-4 text config (or, one time in three, a
/// dense one).
fn random_config(r: &mut Rng) -> Value {
    if r.chance(33) {
        return random_dense_config(r);
    }
    let n = 1 + (r.next() % 12) as usize;
    let types: Vec<&str> = (0..n)
        .map(|_| {
            if r.chance(30) {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    let heads = r.pick(&[1u64, 2, 3, 4, 6]);
    let kv = r.pick(&[1u64, 2, 3]);
    let moe = r.chance(25);
    let experts = r.pick(&[2u64, 4, 8]);
    let quant = r.chance(35);
    let mut c = json!({
        "model_type": "gemma4_text",
        "hidden_size": r.pick(&[32u64, 48, 64, 96]),
        "num_hidden_layers": n,
        "intermediate_size": r.pick(&[32u64, 64, 96, 128]),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_global_key_value_heads": if r.chance(50) { json!(r.pick(&[1u64, 2])) } else { Value::Null },
        "attention_k_eq_v": r.chance(40),
        "head_dim": r.pick(&[8u64, 16, 32]),
        "global_head_dim": r.pick(&[16u64, 32, 64]),
        "num_kv_shared_layers": if r.chance(40) { (r.next() % n as u64) as usize } else { 0 },
        "hidden_size_per_layer_input": if r.chance(40) { r.pick(&[8u64, 16]) } else { 0 },
        "vocab_size": r.pick(&[128u64, 256, 384]),
        "vocab_size_per_layer_input": r.pick(&[128u64, 256]),
        "use_double_wide_mlp": r.chance(50),
        "enable_moe_block": moe,
        "num_experts": if moe { json!(experts) } else { Value::Null },
        "top_k_experts": if moe { json!(1 + r.next() % experts) } else { Value::Null },
        "moe_intermediate_size": if moe { json!(r.pick(&[16u64, 32, 64])) } else { Value::Null },
        "sliding_window": r.pick(&[2u64, 4, 8, 16]),
        "layer_types": types,
        "final_logit_softcapping": if r.chance(70) { json!(r.pick(&[30.0, 20.0, 50.5])) } else { Value::Null },
        "tie_word_embeddings": r.chance(70),
        "rms_norm_eps": r.pick(&[1e-6, 1e-5]),
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "rope_theta": r.pick(&[1e6, 5e5]), "partial_rotary_factor": r.pick(&[0.25, 0.5, 1.0])},
            "sliding_attention": {"rope_type": "default", "rope_theta": r.pick(&[1e4, 2e4])},
        },
    });
    if quant {
        c["quantization"] = json!({"bits": r.pick(&[4u64, 8]), "group_size": r.pick(&[32u64, 64]), "mode": "affine"});
    }
    c
}

#[test]
fn every_accepted_spec_emits_parsable_rust_and_a_sample_compiles() {
    let mut r = Rng(0xa5c4_e0de);
    let (mut tried, mut accepted) = (0, Vec::new());
    while tried < 3000 && accepted.len() < 400 {
        tried += 1;
        let config = random_config(&mut r);
        let name = format!("prop-{tried}");
        let Ok((spec, _)) = archgen_families::import::from_config_json(&config, None, &name) else {
            continue;
        };
        // The YAML a user would get must itself load back to the same spec.
        let yaml = archgen_families::to_yaml(&spec);
        let reparsed = archgen_families::parse_str(&yaml, &format!("{name}.yaml"))
            .unwrap_or_else(|d| panic!("{name}: emitted spec YAML does not load:\n{d}\n{yaml}"));
        assert_eq!(
            archgen_families::spec_hash(&reparsed),
            archgen_families::spec_hash(&spec),
            "{name}"
        );
        let plan = archgen_plan::plan(&spec, &format!("specs/{name}.yaml"));
        let file = archgen_emit::model_file(&plan)
            .unwrap_or_else(|e| panic!("{name}: {e}\nconfig: {config}"));
        archgen_emit::plan_file(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        accepted.push((name, plan, file));
    }
    eprintln!(
        "{} of {tried} random configs accepted; all emitted Rust parsed",
        accepted.len()
    );
    assert!(
        accepted.len() >= 100,
        "too few accepted configs ({}) to mean anything",
        accepted.len()
    );

    // A sample, covering MoE, per-layer inputs, KV sharing and quantization,
    // type-checks in a crate of its own against the real runtime.
    let mut sample: Vec<&(String, archgen_plan::Plan, String)> = Vec::new();
    use archgen_ir::{FeedForward, HeadWeight, KvSource, LayerInput, NormArrangement, QkNorm};
    let features: [fn(&archgen_plan::Plan) -> bool; 6] = [
        |p| {
            p.ir.layers
                .iter()
                .any(|l| matches!(l.ffn, FeedForward::MlpAndMoe { .. }))
        },
        |p| {
            p.ir.layers.iter().any(|l| {
                matches!(l.input, LayerInput::Gated { .. })
                    && matches!(l.attention().map(|a| a.kv), Some(KvSource::Shared { .. }))
            })
        },
        |p| p.ir.quantization.is_some(),
        |p| p.ir.head.weight == HeadWeight::Untied && p.ir.head.logit_softcap.is_none(),
        |p| {
            let l = &p.ir.layers[0];
            l.norms.arrangement == NormArrangement::PreNorm
                && l.attention().map(|a| a.qk_norm) == Some(QkNorm::RmsPerHead)
                && p.ir.quantization.is_some()
        },
        |p| {
            let l = &p.ir.layers[0];
            l.norms.arrangement == NormArrangement::PreNorm
                && l.attention().map(|a| a.qk_norm) == Some(QkNorm::None)
                && p.ir.head.weight == HeadWeight::Untied
                && matches!(
                    l.attention().map(|a| a.rope.kind),
                    Some(archgen_ir::RopeKind::Llama3 { .. })
                )
        },
    ];
    for f in features {
        if let Some(c) = accepted.iter().find(|c| f(&c.1)) {
            if !sample.iter().any(|s| s.0 == c.0) {
                sample.push(c);
            }
        }
    }
    assert!(
        sample.len() >= 5,
        "the random configs did not cover the sampled features"
    );
    let krate = tempfile::tempdir().unwrap();
    let src = krate.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut lib = String::new();
    for (name, _, file) in &sample {
        let module = archgen_emit::module_name(name);
        std::fs::write(src.join(format!("{module}.rs")), file).unwrap();
        lib.push_str(&format!("pub mod {module};\n"));
    }
    std::fs::write(src.join("lib.rs"), lib).unwrap();
    let runtime = repo_root().join("runtime/core");
    std::fs::write(
        krate.path().join("Cargo.toml"),
        format!(
            "[package]\nname = \"emit-sample\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[dependencies]\narchgen-runtime = {{ path = {:?} }}\n\n[workspace]\n",
            runtime.display().to_string()
        ),
    )
    .unwrap();
    // Our own target dir, kept between runs, so only the first run builds MLX.
    let target = repo_root().join("target").join("emit-sample");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["check", "--quiet", "--offline", "--lib"])
        .arg("--manifest-path")
        .arg(krate.path().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        // The workspace's .cargo/config.toml (the MLX build glue) applies to
        // crates under the repository only; point this one at the same glue.
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "emitted models do not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "{} emitted models type-check: {:?}",
        sample.len(),
        sample.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
}
