//! config.json → spec → `to_hf_json` round-trips every field, with mlx-lm's defaults.

use archgen_families::import::{from_config_json, AppliedDefault};
use archgen_families::*;
use archgen_ir::{
    Attention, HeadWeight, KvCache, KvQuant, KvSource, ModelIr, ModulePrefix, QkNorm, RopeKind,
    SanitizeRule, Window,
};
use serde_json::{json, Value};

/// Layer `i`'s attention.
fn attention(model: &ModelIr, i: usize) -> &Attention {
    model.layers[i].attention().expect("an attention layer")
}

/// The first layer without K/V of its own (the layer count when none).
fn first_kv_shared(model: &ModelIr) -> usize {
    model
        .layers
        .iter()
        .position(|l| l.attention().is_some_and(|a| !a.owns_kv()))
        .unwrap_or(model.layers.len())
}

/// Every attention layer attends over every earlier position (no sliding window).
fn all_full(model: &ModelIr) -> bool {
    model
        .layers
        .iter()
        .filter_map(|l| l.attention())
        .all(|a| a.window == Window::Full)
}

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/import/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const FIELDS: [&str; 25] = [
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_global_key_value_heads",
    "head_dim",
    "global_head_dim",
    "sliding_window",
    "layer_types",
    "num_kv_shared_layers",
    "hidden_size_per_layer_input",
    "vocab_size",
    "vocab_size_per_layer_input",
    "use_double_wide_mlp",
    "enable_moe_block",
    "num_experts",
    "top_k_experts",
    "moe_intermediate_size",
    "attention_k_eq_v",
    "final_logit_softcapping",
    "rms_norm_eps",
    "tie_word_embeddings",
    "rope_parameters",
    "max_position_embeddings",
];

/// `fields` (the `model_type` and `num_hidden_layers` among them) over a
/// small config: 64 wide, an MLP of 128, 4 attention heads over 2 K/V heads
/// and a vocabulary of 512.
fn small_config(fields: Value) -> Value {
    let mut config = json!({
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512
    });
    for (field, value) in fields.as_object().expect("the fields as an object") {
        config[field.as_str()] = value.clone();
    }
    config
}

/// `config` with each `(field, value)` set (a null value written as null).
fn with(config: &Value, fields: &[(&str, Value)]) -> Value {
    let mut edited = config.clone();
    for (field, value) in fields {
        edited[*field] = value.clone();
    }
    edited
}

/// `config` without `fields`.
fn without(config: &Value, fields: &[&str]) -> Value {
    let mut edited = config.clone();
    for field in fields {
        edited
            .as_object_mut()
            .expect("a config object")
            .remove(*field);
    }
    edited
}

/// The problems `config` is refused with, as one text; a config that imports
/// fails the test.
fn refusal(config: &Value) -> String {
    match from_config_json(config, None, "bad") {
        Ok(_) => panic!("imported, but a refusal was expected:\n{config:#}"),
        Err(e) => e.to_string(),
    }
}

/// The fields `applied` lists, in order.
fn listed(applied: &[AppliedDefault]) -> Vec<&str> {
    applied.iter().map(|d| d.field.as_str()).collect()
}

/// The fields `applied` lists with the values they took, in order.
fn listed_values(applied: &[AppliedDefault]) -> Vec<(&str, &Value)> {
    applied
        .iter()
        .map(|d| (d.field.as_str(), &d.value))
        .collect()
}

/// Fails unless every one of `fields` is listed in `applied`.
fn assert_listed(applied: &[AppliedDefault], fields: &[&str]) {
    let listed = listed(applied);
    for field in fields {
        assert!(listed.contains(field), "{field} not listed in {listed:?}");
    }
}

/// Fails unless `text` says every one of `needles`.
fn assert_says(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle} missing in:\n{text}");
    }
}

/// Fails unless `config` without each of `fields`, one at a time, is refused
/// naming the field and saying every one of `also`.
fn assert_each_required(config: &Value, fields: &[&str], also: &[&str]) {
    for field in fields {
        let text = refusal(&without(config, &[field]));
        assert_says(&text, &[field]);
        assert_says(&text, also);
    }
}

/// Fails unless `config` with each `(field, value)`, one at a time, is
/// refused naming the field and saying the case's needle.
fn assert_each_refused(config: &Value, cases: &[(&str, Value, &str)]) {
    for (field, value, needle) in cases {
        let text = refusal(&with(config, &[(field, value.clone())]));
        assert_says(&text, &[field, needle]);
    }
}

/// Fails unless `config` is refused with a kv_config.json (the family has no
/// KV-cache quantization).
fn assert_kv_config_refused(config: &Value) {
    let kv = json!([{"layer_idx": 0, "bits": 8, "group_size": 64}]);
    assert!(from_config_json(config, Some(&kv), "bad").is_err());
}

/// Which layers run routed experts.
fn expert_layers(model: &ModelIr) -> Vec<bool> {
    model.layers.iter().map(|l| l.moe().is_some()).collect()
}

/// Imports, checks that YAML and the HF view round-trip, returns the HF view.
fn import_and_round_trip(
    config: &Value,
    kv: Option<&Value>,
    name: &str,
) -> (Spec, Vec<AppliedDefault>, Value) {
    let (spec, applied) = from_config_json(config, kv, name).unwrap_or_else(|e| panic!("{e}"));
    // The YAML file we would write parses back to the same spec.
    let yaml = to_yaml(&spec);
    assert_eq!(
        parse_str(&yaml, "imported.yaml").unwrap_or_else(|d| panic!("{d}\n{yaml}")),
        spec
    );
    // The HF view, imported again as a flat gemma4_text config, gives the same spec.
    let hf = to_hf_json(&spec);
    let mut flat = hf.clone();
    if spec.as_gemma4().is_some() {
        flat["model_type"] = json!("gemma4_text");
    }
    let (again, _) = from_config_json(&flat, None, name).unwrap_or_else(|e| panic!("{e}"));
    let mut expected = spec.clone();
    expected.identity_mut().source.repo = None;
    if let Some(g) = expected.as_gemma4_mut() {
        g.identity.source.model_type = ConfigModelType::Gemma4Text;
        g.kv_quantization = None;
    }
    // Override paths are kept verbatim (they name the original module tree).
    assert_eq!(again, expected);
    // Stable output.
    assert_eq!(
        serde_json::to_string(&hf).unwrap(),
        serde_json::to_string(&to_hf_json(&spec)).unwrap()
    );
    (spec, applied, hf)
}

/// [`import_and_round_trip`] of `config` under `name`, without a
/// kv_config.json; fails unless the spec is of `family`.
fn import_as(config: &Value, family: Family, name: &str) -> (Spec, Vec<AppliedDefault>, Value) {
    let imported = import_and_round_trip(config, None, name);
    assert_eq!(imported.0.family(), family, "{name}");
    imported
}

/// specs/: the checked-in specs, and in configs/ the config.json files they
/// were imported from.
const SPECS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../specs");

/// specs/configs/`name`.config.json.
fn published_config(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{SPECS}/configs/{name}.config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The spec of the Gemma-2 layout that `spec` is.
fn gemma2_layout(spec: &Spec) -> &Gemma2Spec {
    match spec {
        Spec::Gemma2(g) => g,
        other => panic!(
            "not a spec of the Gemma-2 layout: {}",
            other.family().as_str()
        ),
    }
}

/// Fails unless `config` is refused with a problem that starts with `start`.
fn assert_refused_with(config: &Value, start: &str) {
    let e = from_config_json(config, None, "x").unwrap_err();
    let problems = &e.problems;
    assert!(
        problems.iter().any(|p| p.starts_with(start)),
        "{problems:?}"
    );
}

#[test]
fn gemma4_wrapper_round_trips_every_field() {
    let config = fixture("gemma4-e2b-shaped.json");
    let (spec, applied, hf) = import_and_round_trip(&config, None, "e2b-shaped");
    let text = &config["text_config"];
    for f in FIELDS {
        let want = match f {
            // Written without partial_rotary_factor/factor in the config; mlx-lm's
            // default RoPE ignores them, proportional defaults factor to 1.0.
            "rope_parameters" => json!({
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional", "factor": 1.0},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
            }),
            _ => text[f].clone(),
        };
        assert_eq!(hf[f], want, "{f}");
    }
    assert_eq!(hf["rope_traditional"], json!(false));
    assert!(hf.get("quantization").is_none() && hf.get("kv_quantization").is_none());
    // Only the factor was defaulted (plus nothing else: every other field is explicit).
    let fields = listed(&applied);
    assert_eq!(
        fields,
        [
            "text_config.rope_traditional",
            "text_config.rope_parameters.full_attention.factor"
        ]
    );
    let model = spec.lower();
    assert_eq!(first_kv_shared(&model), 5);
    assert_eq!(attention(&model, 9).kv_layer(9), 4);
    assert_eq!(model.layers[9].mlp().map(|m| m.width), Some(256));
    assert_eq!(model.module_prefix(), "language_model.model.");
}

#[test]
fn flat_gemma4_text_with_quantization_round_trips() {
    let config = fixture("gemma4-text-moe-q8.json");
    let (spec, applied, hf) = import_and_round_trip(&config, None, "moe-q8");
    for f in FIELDS {
        let want = match f {
            "rope_parameters" => json!({
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional", "factor": 1.0},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
            }),
            // PLE is off (width 0): its vocabulary is dead and shown as
            // mlx-lm's default, an integer as its config classes type it.
            "vocab_size_per_layer_input" => json!(262_144),
            _ => config[f].clone(),
        };
        assert_eq!(hf[f], want, "{f}");
    }
    // Per-module dicts without `mode` are affine (to_quantized's default).
    let mut q = config["quantization"].clone();
    for i in 0..12 {
        q[format!("model.layers.{i}.router.proj")]["mode"] = json!("affine");
    }
    assert_eq!(hf["quantization"], q);
    assert_eq!(
        applied
            .iter()
            .filter(|a| a.field.ends_with(".mode"))
            .count(),
        12
    );
    let a = spec.lower();
    assert_eq!(a.module_prefix(), "model.");
    assert_eq!(
        a.quant_for("model.layers.7.router.proj")
            .map(|q| q.group_size),
        Some(64)
    );
    assert_eq!(
        a.quant_for("model.layers.7.experts.switch_glu.down_proj")
            .map(|q| q.group_size),
        Some(32)
    );
    assert_eq!(
        a.layers[7].moe().map(|m| (m.num_experts, m.top_k, m.width)),
        Some((4, 2, 32))
    );
}

#[test]
fn missing_fields_take_mlx_lm_defaults_and_are_listed() {
    let config = fixture("gemma4-unified-sparse.json");
    let kv = fixture("kv_config.json");
    let (spec, applied, hf) = import_and_round_trip(&config, Some(&kv), "unified-sparse");
    let listed = |f: &str| {
        applied
            .iter()
            .find(|a| a.field == f)
            .map(|a| a.value.clone())
    };
    // gemma4 wrapper: top-level vocab_size default.
    assert_eq!(listed("vocab_size"), Some(json!(262144)));
    assert_eq!(hf["vocab_size"], json!(262144));
    assert_eq!(listed("text_config.global_head_dim"), Some(json!(512)));
    assert_eq!(
        listed("text_config.final_logit_softcapping"),
        Some(json!(30.0))
    );
    assert_eq!(listed("text_config.rms_norm_eps"), Some(json!(1e-6)));
    assert_eq!(listed("text_config.tie_word_embeddings"), Some(json!(true)));
    assert_eq!(
        listed("text_config.max_position_embeddings"),
        Some(json!(131072))
    );
    assert!(listed("text_config.rope_parameters").is_some());
    assert_eq!(listed("kv_config[0].group_size"), Some(json!(64)));
    assert_eq!(
        spec.identity().source.model_type,
        ConfigModelType::Gemma4Unified
    );
    // Legacy quant_method mxfp4 → {4, 32, mxfp4}, read from text_config.quantization_config.
    assert_eq!(
        hf["quantization"],
        json!({"bits": 4, "group_size": 32, "mode": "mxfp4"})
    );
    assert_eq!(
        hf["kv_quantization"],
        json!([{"layer_idx": 5, "bits": 4, "group_size": 32}, {"layer_idx": 11, "bits": 8, "group_size": 64}])
    );
    assert_eq!(
        hf["rope_parameters"]["full_attention"]["partial_rotary_factor"],
        json!(0.25)
    );
    let model = spec.lower();
    assert_eq!(attention(&model, 5).head_dim, 512);
    assert_eq!(attention(&model, 5).n_kv_heads, 1);
    assert!(matches!(
        attention(&model, 11).kv,
        KvSource::Own {
            cache: KvCache::Quantized(KvQuant {
                bits: 8,
                group_size: 64
            }),
            ..
        }
    ));
}

#[test]
fn an_empty_gemma4_config_is_mlx_lms_default_model() {
    // mlx-lm's defaults describe an E2B-like model; the importer must reproduce them.
    let (spec, applied) =
        from_config_json(&json!({"model_type": "gemma4"}), None, "defaults").unwrap();
    assert!(applied.len() > 20);
    let model = spec.lower();
    assert_eq!(
        (
            model.hidden_size,
            model.layers.len(),
            first_kv_shared(&model)
        ),
        (1536, 35, 15)
    );
    assert_eq!(attention(&model, 4).window, Window::Full);
    assert_eq!(model.layers[34].mlp().map(|m| m.width), Some(12288));
    // Same architecture as the checked-in E2B spec, apart from identity: every
    // other fact (per-layer inputs, the softcap) is E2B's, which specs.rs pins.
    let e2b = load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../specs/gemma4-e2b.yaml"
    ))
    .unwrap();
    let mut imported = spec.clone();
    *imported.identity_mut() = e2b.identity().clone();
    assert_eq!(imported, e2b);
}

#[test]
fn normalisations_are_listed() {
    let config = json!({
        "model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 6, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_global_key_value_heads": 1,
        "attention_k_eq_v": false, "head_dim": 16, "global_head_dim": 32, "num_kv_shared_layers": 0,
        "use_double_wide_mlp": true, "hidden_size_per_layer_input": 0, "vocab_size": 512,
        "sliding_window_pattern": 6, "final_logit_softcapping": null
    });
    let (spec, applied) = from_config_json(&config, None, "norm").unwrap();
    let spec = spec.as_gemma4().unwrap();
    assert_eq!(spec.attention.num_global_key_value_heads, None);
    assert!(!spec.mlp.use_double_wide_mlp);
    assert_eq!(spec.model.final_logit_softcapping, None);
    assert_eq!(spec.layers.pattern.len(), 6);
    let fields = listed(&applied);
    assert!(
        fields.contains(&"num_global_key_value_heads")
            && fields.contains(&"use_double_wide_mlp")
            && fields.contains(&"layer_types"),
        "{fields:?}"
    );
}

#[test]
fn import_errors_are_collected() {
    let config = json!({
        "model_type": "gemma4_text", "hidden_size": "wide", "num_hidden_layers": -1,
        "enable_moe_block": true, "layer_types": ["sliding_attention", "local"],
        "rope_parameters": {"sliding_attention": {"rope_type": "yarn"}},
        "quantization": {"bits": 4}
    });
    let e = from_config_json(&config, None, "bad").unwrap_err();
    assert!(e.problems.len() >= 5, "{e}");
    let text = e.to_string();
    for needle in [
        "hidden_size",
        "num_hidden_layers",
        "enable_moe_block",
        "layer_types[1]",
        "yarn",
        "quantization",
    ] {
        assert!(text.contains(needle), "{needle} missing in:\n{text}");
    }
    assert!(from_config_json(&json!({"model_type": "llama"}), None, "x").is_err());
    assert!(from_config_json(&json!([1, 2]), None, "x").is_err());
}

/// Every dense (and qwen3_moe) spec in specs/ is exactly what `spec import`
/// makes of the config.json kept beside it in specs/configs/, and round-trips;
/// so are the hybrid ones (qwen3_5, lfm2).
/// Configs without a spec in specs/ are not read here.
#[test]
fn dense_specs_are_their_imported_configs() {
    let mut seen = 0;
    let mut hybrid = Vec::new();
    for e in std::fs::read_dir(format!("{SPECS}/configs")).unwrap() {
        let path = e.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(name) = file.strip_suffix(".config.json") else {
            continue;
        };
        if !std::path::Path::new(&format!("{SPECS}/{name}.yaml")).exists() {
            continue;
        }
        let config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let (spec, _, _) = import_and_round_trip(&config, None, name);
        let checked_in = load(format!("{SPECS}/{name}.yaml")).unwrap();
        assert_eq!(spec, checked_in, "{name}");
        if let Spec::Gemma2(_) = spec {
            continue; // the Gemma-2 layout's own tests, below
        }
        if matches!(
            spec.family(),
            Family::Qwen35 | Family::Lfm2 | Family::Qwen3Next
        ) {
            hybrid.push(name.to_string());
            continue;
        }
        assert!(
            matches!(spec, Spec::Dense(_))
                || spec.family() == Family::Qwen3Moe
                || spec.family() == Family::MiniCpm
                || spec.family() == Family::Glm4Moe
                || spec.family() == Family::DeepseekV3
                || spec.family() == Family::GptOss,
            "{name}"
        );
        seen += 1;
    }
    assert_eq!(
        seen, 18,
        "Qwen3 0.6B/1.7B/4B/8B, Llama-3.2 1B/3B, Qwen2.5 0.5B/7B, Mistral-7B-v0.3, Qwen3-30B-A3B, MiniCPM-2B, SmolLM3-3B, Granite-3.3-2B, Phi-3-mini-4k, OLMo-2-1124-7B, GLM-4.5-Air, DeepSeek-V3, gpt-oss-20b"
    );
    hybrid.sort();
    assert_eq!(
        hybrid,
        [
            "lfm2-1.2b",
            "qwen3-next-80b-a3b",
            "qwen3.5-4b",
            "qwen3.5-9b",
            "qwen3.6-27b",
            "qwen3.6-35b-a3b"
        ]
    );
}

/// qwen3_next: every `ModelArgs` size required, `norm_topk_prob` false when
/// absent, the grouped projections and `model.` prefix in the IR; dense and
/// sparse layers mixed, RoPE scaling and biased attention refused.
#[test]
fn qwen3_next_configs_take_mlx_lm_fields_and_refuse_mixed_layers() {
    use archgen_ir::{InProj, Mixer, ModulePrefix};
    let next = json!({
        "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4,
        "intermediate_size": 96, "num_attention_heads": 4, "linear_num_value_heads": 4,
        "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4, "num_experts": 8, "num_experts_per_tok": 2,
        "decoder_sparse_step": 1, "shared_expert_intermediate_size": 32,
        "mlp_only_layers": [], "moe_intermediate_size": 32, "rms_norm_eps": 1e-6,
        "vocab_size": 512, "num_key_value_heads": 2, "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25, "max_position_embeddings": 4096, "head_dim": 16
    });
    let (spec, applied, hf) = import_as(&next, Family::Qwen3Next, "qwen3-next");
    let fields = listed_values(&applied);
    assert!(
        fields.contains(&("norm_topk_prob", &json!(false))),
        "{fields:?}"
    );
    assert_eq!(hf["intermediate_size"], json!(96));
    assert_eq!(hf["mlp_only_layers"], json!([]));
    assert!(hf.get("rope_parameters").is_none());
    let ir = spec.lower();
    assert_eq!(ir.checkpoint.prefix, ModulePrefix::Model);
    let grouped = |l: &archgen_ir::Layer| match &l.mixer {
        Mixer::GatedDeltaNet(d) => d.in_proj == InProj::GroupedPerKeyHead,
        _ => false,
    };
    let kinds: Vec<bool> = ir.layers.iter().map(grouped).collect();
    assert_eq!(kinds, [true, true, true, false]);

    assert_each_refused(
        &next,
        &[
            ("decoder_sparse_step", json!(2), "only 1"),
            ("mlp_only_layers", json!([0]), "only []"),
            (
                "rope_scaling",
                json!({"type": "yarn"}),
                "only unscaled RoPE",
            ),
            ("attention_bias", json!(true), "no projection biases"),
        ],
    );
    assert_each_required(&next, &["head_dim"], &[]);
}

/// qwen3_5: the text config under `text_config` or flat, `TextModelArgs`'s
/// defaults listed, `rope_parameters` read for the base and the partial
/// factor, the layer kinds from `full_attention_interval` (not
/// `layer_types`); the MoE form and biased attention refused.
#[test]
fn qwen3_5_configs_take_mlx_lm_defaults_and_refuse_what_archgen_cannot_run() {
    let flat = small_config(json!({
        "model_type": "qwen3_5", "num_hidden_layers": 8, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "layer_types": ["full_attention"]
    }));
    let (spec, applied, _) = import_and_round_trip(&flat, None, "q35-defaults");
    assert_listed(
        &applied,
        &[
            "head_dim",
            "full_attention_interval",
            "rope_parameters",
            "linear_conv_kernel_dim",
            "rms_norm_eps",
            "tie_word_embeddings",
            "layer_types",
        ],
    );
    let ir = spec.lower();
    let full: Vec<usize> = ir
        .layers
        .iter()
        .filter(|l| l.attention().is_some())
        .map(|l| l.index)
        .collect();
    assert_eq!(full, [3, 7]);
    let a = ir.layers[3].attention().unwrap();
    // head_dim = 64 // 4 = 16; mlx-lm's default factor 0.25 rotates 4 dims.
    assert_eq!((a.head_dim, a.rope.rotated_dims), (16, 4));
    assert_eq!(a.rope.kind, RopeKind::Default { theta: 100000.0 });
    let mut nested = json!({"model_type": "qwen3_5", "text_config": flat.clone()});
    nested["text_config"]["rope_parameters"] =
        json!({"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.5});
    let (spec, _, _) = import_and_round_trip(&nested, None, "q35-nested");
    let ir = spec.lower();
    let a = ir.layers[3].attention().unwrap();
    assert_eq!(a.rope.rotated_dims, 8);
    // num_experts > 0: every layer's MLP becomes routed experts plus a
    // shared expert; intermediate_size is not read.
    let mut moe = flat.clone();
    moe["model_type"] = json!("qwen3_5_moe");
    for (k, v) in [
        ("num_experts", 8),
        ("num_experts_per_tok", 2),
        ("moe_intermediate_size", 32),
        ("shared_expert_intermediate_size", 32),
    ] {
        moe[k] = json!(v);
    }
    moe["mlp_only_layers"] = json!([]);
    let (spec, applied, _) = import_and_round_trip(&moe, None, "q35-moe");
    let fields = listed(&applied);
    assert!(fields.contains(&"norm_topk_prob"), "{fields:?}");
    assert!(fields.contains(&"mlp_only_layers"), "{fields:?}");
    assert!(!fields.contains(&"intermediate_size"), "{fields:?}");
    let ir = spec.lower();
    assert!(ir
        .layers
        .iter()
        .all(|l| matches!(l.ffn, archgen_ir::FeedForward::MoeAndSharedExpert { .. })));
    assert!(ir
        .checkpoint
        .sanitize
        .contains(&archgen_ir::SanitizeRule::SplitSwitchMlpGateUp));
    let e = refusal(&with(&flat, &[("model_type", json!("qwen3_5_moe"))]));
    assert!(e.contains("moe"), "{e}");
    assert_each_refused(
        &flat,
        &[
            ("attention_bias", json!(true), "attention_bias"),
            ("linear_num_value_heads", json!(3), "linear_num_value_heads"),
            (
                "full_attention_interval",
                json!(9),
                "full_attention_interval",
            ),
        ],
    );
    refusal(&with(
        &flat,
        &[(
            "rope_parameters",
            json!({"rope_type": "yarn", "factor": 4.0}),
        )],
    ));
}

/// minicpm: the fields `ModelArgs` has no default for are required; absent
/// rope_theta, rope_traditional and tie_word_embeddings take mlx-lm's
/// defaults (listed), head_dim is always hidden // heads; a tied head and a
/// scaled RoPE are refused with the reason.
#[test]
fn minicpm_configs_take_mlx_lm_defaults_and_refuse_what_mlx_lm_cannot_run() {
    let minicpm = json!({
        "model_type": "minicpm", "hidden_size": 96, "num_hidden_layers": 3,
        "intermediate_size": 192, "num_attention_heads": 6, "num_key_value_heads": 6,
        "rms_norm_eps": 1e-5, "vocab_size": 512, "max_position_embeddings": 4096,
        "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256,
        "rope_scaling": null
    });
    let (spec, applied, hf) = import_as(&minicpm, Family::MiniCpm, "minicpm");
    assert_eq!(
        listed_values(&applied),
        [
            ("rope_theta", &json!(1000000.0)),
            ("rope_traditional", &json!(false)),
            ("tie_word_embeddings", &json!(false)),
            ("head_dim", &json!(16)),
        ]
    );
    assert_eq!(hf["tie_word_embeddings"], json!(false));
    assert!(hf.get("head_dim").is_none(), "minicpm.py has no head_dim");
    let ir = spec.lower();
    assert_eq!(ir.embedding.scale, archgen_ir::EmbedScale::Constant(12.0));
    assert_eq!(ir.head.logit_scale, archgen_ir::LogitScale::DivideBy(0.375));
    assert_eq!(ir.layers[0].residual.factor(), Some(1.4 / 3f64.sqrt()));
    assert_each_required(
        &minicpm,
        &[
            "scale_emb",
            "scale_depth",
            "dim_model_base",
            "num_key_value_heads",
        ],
        &["no default"],
    );
    let text = refusal(&with(&minicpm, &[("tie_word_embeddings", json!(true))]));
    assert!(
        text.contains("tie_word_embeddings") && text.contains("cannot load a tied MiniCPM"),
        "{text}"
    );
    let text = refusal(&with(
        &minicpm,
        &[(
            "rope_scaling",
            json!({"rope_type": "longrope", "long_factor": [1.0]}),
        )],
    ));
    assert!(
        text.contains("`longrope` is not supported for minicpm"),
        "{text}"
    );
    // `default` is plain RoPE, as initialize_rope reads it.
    let mut default = minicpm.clone();
    default["rope_scaling"] = json!({"type": "default"});
    assert!(from_config_json(&default, None, "ok").is_ok());
    assert_kv_config_refused(&minicpm);
}

#[test]
fn dense_configs_take_mlx_lm_defaults_and_refuse_what_archgen_cannot_run() {
    // llama.py: head_dim, num_key_value_heads, rope_theta, tie_word_embeddings default.
    let llama = json!({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "num_attention_heads": 4, "rms_norm_eps": 1e-5,
        "vocab_size": 512, "max_position_embeddings": 2048
    });
    let (spec, applied, _) = import_and_round_trip(&llama, None, "llama-defaults");
    let model = spec.lower();
    let a = attention(&model, 0);
    assert_eq!((a.head_dim, a.n_kv_heads), (16, 4));
    assert!(model.head.weight == HeadWeight::TiedEmbedding && a.qk_norm == QkNorm::None);
    assert_eq!(a.rope.kind, RopeKind::Default { theta: 10000.0 });
    assert_listed(
        &applied,
        &[
            "head_dim",
            "num_key_value_heads",
            "rope_theta",
            "tie_word_embeddings",
        ],
    );
    // llama3 scaling: missing low/high/original take rope_utils.py's defaults.
    let mut scaled = llama.clone();
    scaled["rope_scaling"] = json!({"type": "llama3", "factor": 8.0});
    let (spec, applied, _) = import_and_round_trip(&scaled, None, "llama-scaled");
    assert!(matches!(
        attention(&spec.lower(), 0).rope.kind,
        RopeKind::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings, .. }
            if (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) == (8.0, 1.0, 4.0, 8192.0)
    ));
    assert!(applied
        .iter()
        .any(|d| d.field == "rope_scaling.original_max_position_embeddings"));
    // qwen3.py reads rope_theta from transformers 5's rope_parameters.
    let qwen = small_config(json!({
        "model_type": "qwen3", "num_hidden_layers": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "tie_word_embeddings": false,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}
    }));
    let (spec, _, _) = import_and_round_trip(&qwen, None, "qwen-params");
    let model = spec.lower();
    let a = attention(&model, 0);
    assert_eq!(a.rope.kind, RopeKind::Default { theta: 5000.0 });
    assert!(a.qk_norm == QkNorm::RmsPerHead && model.head.weight == HeadWeight::Untied);
    // What archgen cannot run yet is refused, each problem named.
    let text = refusal(&with(
        &llama,
        &[
            ("attention_bias", json!(true)),
            ("rope_scaling", json!({"rope_type": "yarn", "factor": 4.0})),
            (
                "layer_types",
                json!(["full_attention", "sliding_attention"]),
            ),
        ],
    ));
    assert_says(&text, &["attention_bias", "yarn", "sliding_attention"]);
    let text = refusal(&without(&qwen, &["rope_parameters"]));
    assert!(text.contains("rope_theta"), "{text}");
    assert_kv_config_refused(&qwen);
}

/// qwen2.py's ModelArgs: head_dim is always hidden // heads, the defaults
/// are listed, the sliding-window fields are read as mlx-lm reads them
/// (not at all), and num_key_value_heads has no default.
#[test]
fn qwen2_configs_take_mlx_lm_defaults() {
    let qwen2 = small_config(json!({
        "model_type": "qwen2", "num_hidden_layers": 2, "rms_norm_eps": 1e-6,
        "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1
    }));
    let (spec, applied, _) = import_as(&qwen2, Family::Qwen2, "qwen2-defaults");
    let model = spec.lower();
    let a = attention(&model, 0);
    assert_eq!((a.head_dim, a.n_kv_heads), (16, 2));
    assert!(model.head.weight == HeadWeight::TiedEmbedding && a.qk_norm == QkNorm::None);
    assert!(all_full(&model));
    assert_eq!(model.max_position_embeddings, 32768);
    assert_eq!(a.rope.kind, RopeKind::Default { theta: 1e6 });
    let ir = spec.lower();
    assert_eq!(
        ir.layers[0].attention().unwrap().bias,
        archgen_ir::ProjectionBias::QueryKeyValue
    );
    assert_listed(
        &applied,
        &[
            "head_dim",
            "max_position_embeddings",
            "rope_theta",
            "rope_traditional",
            "tie_word_embeddings",
            "use_sliding_window",
            "sliding_window",
            "max_window_layers",
        ],
    );
    // A head_dim in the config is not read by qwen2.py either.
    let mut written = qwen2.clone();
    written["head_dim"] = json!(32);
    let (spec, _, _) = import_and_round_trip(&written, None, "qwen2-head-dim");
    assert_eq!(attention(&spec.lower(), 0).head_dim, 16);
    let text = refusal(&without(&qwen2, &["num_key_value_heads"]));
    assert!(text.contains("num_key_value_heads: missing"), "{text}");
}

/// model_type mistral is read by llama.py (mlx-lm's MODEL_REMAPPING): the
/// llama family with llama's defaults; without layer_types a sliding_window
/// is listed as ignored (every layer is full attention).
#[test]
fn mistral_configs_are_read_as_llama() {
    let mistral = small_config(json!({
        "model_type": "mistral", "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048, "sliding_window": 4096, "tie_word_embeddings": false
    }));
    let (spec, applied, _) = import_as(&mistral, Family::Llama, "mistral-defaults");
    assert_eq!(spec.identity().source.model_type, ConfigModelType::Mistral);
    let model = spec.lower();
    assert_eq!(attention(&model, 0).head_dim, 16);
    assert!(all_full(&model));
    assert_eq!(
        attention(&model, 0).rope.kind,
        RopeKind::Default { theta: 10000.0 }
    );
    let ignored = applied
        .iter()
        .find(|d| d.field == "sliding_window")
        .expect("sliding_window listed");
    assert!(ignored.reason.contains("ignored"), "{ignored}");
    assert_eq!(to_config_json(&spec)["model_type"], json!("mistral"));
}

/// specs/gemma-2-2b.yaml and gemma-2-9b.yaml are `spec import` of the public
/// config.json values kept in specs/configs/, and round-trip; the Hugging Face
/// sliding-window fields are listed as ignored (mlx-lm's gemma2 has none).
#[test]
fn gemma2_specs_are_their_imported_configs() {
    for name in ["gemma-2-2b", "gemma-2-9b"] {
        let (spec, applied, _) = import_as(&published_config(name), Family::Gemma2, name);
        assert_eq!(
            spec,
            load(format!("{SPECS}/{name}.yaml")).unwrap(),
            "{name}"
        );
        let g = gemma2_layout(&spec);
        assert_eq!(g.attention.query_pre_attn_scalar, 256.0, "{name}");
        let ignored: Vec<&str> = applied
            .iter()
            .filter(|d| d.reason.starts_with("ignored"))
            .map(|d| d.field.as_str())
            .collect();
        assert!(ignored.contains(&"sliding_window"), "{name}: {ignored:?}");
        assert!(all_full(&spec.lower()), "{name}");
    }
}

#[test]
fn gemma2_configs_take_mlx_lm_defaults_and_refuse_what_mlx_lm_cannot_run() {
    let minimal = small_config(json!({
        "model_type": "gemma2", "num_hidden_layers": 2, "head_dim": 16, "rms_norm_eps": 1e-6
    }));
    let (spec, applied, _) = import_and_round_trip(&minimal, None, "gemma2-defaults");
    // mlx-lm's defaults, section by section.
    let g = gemma2_layout(&spec);
    assert_eq!((g.rope.rope_theta, g.rope.traditional), (10000.0, false));
    let attention = (
        g.attention.attn_logit_softcapping,
        g.attention.query_pre_attn_scalar,
    );
    assert_eq!(attention, (Some(50.0), 144.0));
    let model = (
        g.model.final_logit_softcapping,
        g.model.max_position_embeddings,
    );
    assert_eq!(model, (Some(30.0), 8192));
    assert_listed(
        &applied,
        &[
            "rope_theta",
            "rope_traditional",
            "attn_logit_softcapping",
            "final_logit_softcapping",
            "query_pre_attn_scalar",
            "max_position_embeddings",
        ],
    );
    let text = refusal(&with(
        &minimal,
        &[
            ("attn_logit_softcapping", Value::Null),
            ("tie_word_embeddings", json!(false)),
            ("attention_bias", json!(true)),
        ],
    ));
    assert_says(
        &text,
        &[
            "attn_logit_softcapping: null",
            "tie_word_embeddings: false",
            "attention_bias: true",
        ],
    );
    let kv = json!([{"layer_idx": 0, "bits": 4}]);
    let text = from_config_json(&minimal, Some(&kv), "kv")
        .unwrap_err()
        .to_string();
    assert!(text.contains("Gemma-4 only"), "{text}");
}

/// specs/gemma-3-1b.yaml is `spec import` of the config.json kept in
/// specs/configs/ (google/gemma-3-1b-it's values, model_type gemma3_text);
/// mlx-lm's gemma3_text defaults apply to a minimal config, its unread
/// softcaps are noted, and scalings other than linear are refused by name.
#[test]
fn gemma3_text_configs_take_mlx_lm_defaults_and_linear_scaling() {
    let config = published_config("gemma-3-1b");
    let (spec, _, _) = import_as(&config, Family::Gemma3Text, "gemma-3-1b");
    assert_eq!(spec, load(format!("{SPECS}/gemma-3-1b.yaml")).unwrap());

    let minimal = small_config(json!({
        "model_type": "gemma3_text", "num_hidden_layers": 6, "head_dim": 16, "rms_norm_eps": 1e-6,
        "final_logit_softcapping": 30.0
    }));
    let (spec, applied, _) = import_and_round_trip(&minimal, None, "gemma3-defaults");
    let g = gemma2_layout(&spec);
    assert_eq!(
        (
            g.rope.rope_theta,
            g.rope.rope_local_base_freq,
            g.layers.sliding_window,
            g.layers.sliding_window_pattern,
            g.attention.query_pre_attn_scalar,
            g.model.final_logit_softcapping,
            g.model.max_position_embeddings,
        ),
        (1e6, Some(10000.0), Some(512), Some(6), 256.0, None, 32768)
    );
    let softcap = applied
        .iter()
        .find(|d| d.field == "final_logit_softcapping")
        .expect("the unread softcap is listed");
    assert!(softcap.reason.starts_with("ignored"), "{softcap}");

    let linear = with(
        &minimal,
        &[(
            "rope_scaling",
            json!({"rope_type": "linear", "factor": 8.0}),
        )],
    );
    let (spec, _, _) = import_and_round_trip(&linear, None, "gemma3-linear");
    let ir = spec.lower();
    let kinds: Vec<RopeKind> = ir
        .layers
        .iter()
        .map(|l| l.attention().unwrap().rope.kind)
        .collect();
    assert_eq!(kinds[4], RopeKind::Default { theta: 10000.0 });
    assert_eq!(
        kinds[5],
        RopeKind::Linear {
            theta: 1e6,
            factor: 8.0
        }
    );

    let text = refusal(&with(
        &minimal,
        &[("rope_scaling", json!({"type": "yarn", "factor": 8.0}))],
    ));
    assert!(
        text.contains("rope_scaling: rope_type `yarn` is not supported"),
        "{text}"
    );
    let text = refusal(&with(&minimal, &[("sliding_window_pattern", json!(7))]));
    assert!(text.contains("num_hidden_layers"), "{text}");
}

/// The Gemma 3 4b/12b/27b wrapper (`model_type: gemma3`): the text model is
/// read from `text_config` with the wrapper's top-level `vocab_size` (262208
/// when absent) and its 8 / 4 head defaults, then gemma3_text's size
/// defaults, each listed; the IR reads tensors under `language_model` and
/// drops the towers; a missing or non-object `text_config` is refused by name.
#[test]
fn gemma3_wrapper_configs_read_text_config_and_the_wrappers_defaults() {
    let config = published_config("gemma-3-4b");
    let (spec, applied, hf) = import_as(&config, Family::Gemma3Text, "gemma-3-4b");
    assert_eq!(hf["model_type"], json!("gemma3"));
    assert_eq!(hf["text_config"]["model_type"], json!("gemma3_text"));
    let values = listed_values(&applied);
    for (field, value) in [
        ("text_config.vocab_size", json!(262_208)),
        ("text_config.num_attention_heads", json!(8)),
        ("text_config.num_key_value_heads", json!(4)),
        ("text_config.head_dim", json!(256)),
    ] {
        assert!(
            values.iter().any(|(f, v)| *f == field && **v == value),
            "{field} = {value} not listed in {values:?}"
        );
    }
    let ir = spec.lower();
    assert_eq!(
        (ir.vocab_size, ir.hidden_size, ir.layers.len()),
        (262_208, 2560, 34)
    );
    assert_eq!(ir.checkpoint.prefix, ModulePrefix::LanguageModel);
    assert_eq!(ir.checkpoint.sanitize[0], SanitizeRule::UnwrapMultimodal);

    let top_vocab = with(&config, &[("vocab_size", json!(1000))]);
    let (spec, _, _) = import_and_round_trip(&top_vocab, None, "gemma3-top-vocab");
    assert_eq!(spec.lower().vocab_size, 1000);

    let text = refusal(&without(&config, &["text_config"]));
    assert_says(&text, &["text_config", "missing"]);
    let text = refusal(&with(&config, &[("text_config", json!(3))]));
    assert_says(&text, &["text_config", "expected an object"]);
}

/// qwen3_moe: `ModelArgs` has no defaults, so every field it reads is
/// required and none is ever applied; `rope_scaling` is read and ignored.
#[test]
fn qwen3_moe_configs_need_every_field_and_ignore_rope_scaling() {
    let moe = small_config(json!({
        "model_type": "qwen3_moe", "num_hidden_layers": 3, "head_dim": 16, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "tie_word_embeddings": true, "rope_theta": 1000000.0,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "norm_topk_prob": false, "decoder_sparse_step": 1, "mlp_only_layers": [1],
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0}
    }));
    let (spec, applied, hf) = import_as(&moe, Family::Qwen3Moe, "moe");
    let fields = listed(&applied);
    assert_eq!(
        fields,
        ["rope_scaling"],
        "only the ignored rope_scaling is listed"
    );
    assert_eq!(hf["rope_scaling"], Value::Null);
    assert_eq!(expert_layers(&spec.lower()), [true, false, true]);
    assert_each_required(
        &moe,
        &[
            "num_experts",
            "norm_topk_prob",
            "mlp_only_layers",
            "head_dim",
        ],
        &[],
    );
    let text = refusal(&with(
        &moe,
        &[
            ("num_experts_per_tok", json!(9)),
            ("mlp_only_layers", json!([7])),
        ],
    ));
    assert_says(&text, &["top-9 of 8 experts", "layer 7 does not exist"]);
    assert_kv_config_refused(&moe);
}

/// glm4_moe: every `ModelArgs` field required (`rope_scaling` too, null or
/// not, never read), `topk_method` other than `noaux_tc` and a null
/// `n_shared_experts` refused, `scoring_func` listed as ignored, the head
/// never tied, the layers dense below `first_k_dense_replace`.
#[test]
fn glm4_moe_configs_need_every_field_and_refuse_what_mlx_lm_cannot_run() {
    let glm = small_config(json!({
        "model_type": "glm4_moe", "num_hidden_layers": 3, "head_dim": 16, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096, "tie_word_embeddings": false, "rope_theta": 1000000.0,
        "partial_rotary_factor": 0.5, "attention_bias": true, "use_qk_norm": false,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
        "routed_scaling_factor": 2.5, "norm_topk_prob": true,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "scoring_func": "softmax",
        "topk_method": "noaux_tc"
    }));
    let (spec, applied, hf) = import_as(&glm, Family::Glm4Moe, "glm");
    let fields = listed(&applied);
    assert_eq!(fields, ["rope_scaling", "scoring_func"]);
    assert_eq!(hf["rope_scaling"], Value::Null);
    assert_eq!(hf["n_group"], json!(2));
    assert_eq!(expert_layers(&spec.lower()), [false, true, true]);
    assert_each_required(
        &glm,
        &[
            "n_group",
            "routed_scaling_factor",
            "use_qk_norm",
            "rope_scaling",
        ],
        &[],
    );
    let text = refusal(&with(
        &glm,
        &[
            ("topk_method", json!("greedy")),
            ("n_shared_experts", Value::Null),
        ],
    ));
    assert_says(
        &text,
        &["topk_method", "noaux_tc", "n_shared_experts: null"],
    );
    let text = refusal(&with(
        &glm,
        &[
            ("tie_word_embeddings", json!(true)),
            ("first_k_dense_replace", json!(3)),
            ("topk_group", json!(2)),
        ],
    ));
    assert_says(
        &text,
        &[
            "tie_word_embeddings",
            "3 of 3 layers dense",
            "2 of 2 groups",
        ],
    );
    assert_kv_config_refused(&glm);
}

/// deepseek_v3 (and kimi_k2, remapped to it): the latent attention's sizes
/// with mlx-lm's defaults, the YaRN scaling with YarnRoPE's defaults, the
/// scale's mscale_all_dim correction; what archgen cannot run is refused
/// with the field named.
#[test]
fn deepseek_v3_configs_read_latent_attention_and_yarn() {
    let v3 = json!({
        "model_type": "kimi_k2", "hidden_size": 64, "num_hidden_layers": 3,
        "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 512,
        "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16, "v_head_dim": 16,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
        "routed_scaling_factor": 2.5, "norm_topk_prob": true,
        "rope_scaling": {"type": "yarn", "factor": 32.0, "mscale_all_dim": 1.0},
    });
    let (spec, applied, hf) = import_as(&v3, Family::DeepseekV3, "v3");
    let fields: Vec<&str> = applied.iter().map(|d| d.field.as_str()).collect();
    for f in [
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling.original_max_position_embeddings",
        "rope_scaling.beta_fast",
        "rope_scaling.mscale",
    ] {
        assert!(fields.contains(&f), "{f} not among the defaults {fields:?}");
    }
    assert_eq!(hf["q_lora_rank"], Value::Null);
    assert_eq!(hf["model_type"], json!("kimi_k2"));
    let ir = spec.lower();
    let Some(archgen_ir::Mixer::LatentAttention(a)) = ir.layers.first().map(|l| &l.mixer) else {
        panic!("deepseek_v3 layers are latent attention")
    };
    assert_eq!(a.query, archgen_ir::LatentQuery::Direct);
    let s = 0.1 * 32f64.ln() + 1.0;
    assert_eq!(a.scale, 48f64.powf(-0.5) * s * s);
    for (field, value, needle) in [
        ("rope_scaling", Value::Null, "YaRN RoPE only"),
        (
            "rope_scaling",
            json!({"type": "linear", "factor": 2.0}),
            "rope type `linear`",
        ),
        ("moe_layer_freq", json!(2), "moe_layer_freq"),
        ("attention_bias", json!(true), "attention_bias"),
    ] {
        let text = refusal(&with(&v3, &[(field, value)]));
        assert!(text.contains(needle), "{needle} missing in:\n{text}");
    }
}

/// smollm3 (llama.py's ModelArgs and stack): llama's defaults, the NoPE
/// layers from `no_rope_layer_interval` (default 4, listed), a
/// `no_rope_layers` list read only to check it is that pattern.
#[test]
fn smollm3_configs_read_the_no_rope_interval() {
    use archgen_ir::{Mixer, RopeForm};
    let smollm3 = small_config(json!({
        "model_type": "smollm3", "num_hidden_layers": 8, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048, "rope_theta": 5000000.0,
        "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]
    }));
    let mut smollm3 = smollm3;
    smollm3["layer_types"] = json!(vec!["full_attention"; 8]);
    let (spec, applied, hf) = import_as(&smollm3, Family::SmolLm3, "smollm3");
    assert_eq!(hf["no_rope_layer_interval"], json!(4));
    assert!(hf.get("no_rope_layers").is_none());
    let fields = listed(&applied);
    assert!(fields.contains(&"no_rope_layer_interval"), "{fields:?}");
    let ir = spec.lower();
    let kinds: Vec<bool> = ir
        .layers
        .iter()
        .map(|l| match &l.mixer {
            Mixer::Attention(a) => matches!(
                a.rope,
                RopeForm {
                    kind: RopeKind::NoPe,
                    ..
                }
            ),
            Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) | Mixer::LatentAttention(_) => {
                panic!("smollm3 has attention only")
            }
        })
        .collect();
    assert_eq!(
        kinds,
        [false, false, false, true, false, false, false, true]
    );
    // Another interval: every other layer without RoPE.
    let mut every_other = smollm3.clone();
    every_other["no_rope_layer_interval"] = json!(2);
    every_other["no_rope_layers"] = json!([1, 0, 1, 0, 1, 0, 1, 0]);
    let (spec, _, _) = import_and_round_trip(&every_other, None, "smollm3-2");
    let model = spec.lower();
    assert_eq!(attention(&model, 1).rope.kind, RopeKind::NoPe);
    assert_eq!(
        attention(&model, 0).rope.kind,
        RopeKind::Default { theta: 5e6 }
    );
    // A list that is not the interval's pattern, or of the wrong length.
    for (list, says) in [
        (
            json!([1, 0, 1, 1, 1, 1, 1, 0]),
            "not the every-4th-layer pattern",
        ),
        (json!([1, 1, 1, 0]), "4 entries for 8 layers"),
    ] {
        let text = refusal(&with(&smollm3, &[("no_rope_layers", list)]));
        assert!(
            text.contains("no_rope_layers") && text.contains(says),
            "{text}"
        );
    }
    let text = refusal(&with(&smollm3, &[("no_rope_layer_interval", json!(0))]));
    assert!(
        text.contains("no_rope_layer_interval: 0 is out of range"),
        "{text}"
    );
}

/// granite: every multiplier required (granite.py has no defaults for
/// them, nor for rope_theta or the bias flags), head_dim hidden // heads,
/// the four scales as IR facts; biases refused.
#[test]
fn granite_configs_take_their_multipliers() {
    use archgen_ir::{AttentionScale, EmbedScale, LogitScale, Residual};
    let granite = small_config(json!({
        "model_type": "granite", "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096, "attention_bias": false, "mlp_bias": false,
        "rope_theta": 10000000.0, "embedding_multiplier": 12.0, "attention_multiplier": 0.015625,
        "residual_multiplier": 0.22, "logits_scaling": 8.0
    }));
    let (spec, applied, hf) = import_as(&granite, Family::Granite, "granite");
    assert_eq!(
        listed_values(&applied),
        [
            ("head_dim", &json!(16)),
            ("tie_word_embeddings", &json!(true)),
        ]
    );
    assert!(hf.get("head_dim").is_none(), "granite.py has no head_dim");
    let ir = spec.lower();
    assert_eq!(ir.embedding.scale, EmbedScale::Constant(12.0));
    assert_eq!(ir.head.logit_scale, LogitScale::DivideLogitsBy(8.0));
    let a = ir.layers[0].attention().unwrap();
    assert_eq!(a.scale, AttentionScale::Constant(0.015625));
    assert_eq!(a.scale.value(a.head_dim), 0.015625);
    assert_eq!(ir.layers[1].residual, Residual::Scaled { multiplier: 0.22 });
    assert_each_required(
        &granite,
        &[
            "embedding_multiplier",
            "attention_multiplier",
            "residual_multiplier",
            "logits_scaling",
            "rope_theta",
            "attention_bias",
            "num_key_value_heads",
        ],
        &["no default"],
    );
    let text = refusal(&with(&granite, &[("mlp_bias", json!(true))]));
    assert!(text.contains("mlp_bias: true"), "{text}");
}

#[test]
fn phi3_configs_fuse_their_projections_and_refuse_su_rope() {
    use archgen_ir::{GateUpProjection, QkvProjection};
    // Phi-3-mini-4k-instruct's fields as published, at a tiny size.
    let phi3 = small_config(json!({
        "model_type": "phi3", "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
        "rope_scaling": null, "rope_theta": 10000.0, "sliding_window": 2047,
        "tie_word_embeddings": false
    }));
    let (spec, applied, hf) = import_as(&phi3, Family::Phi3, "phi3");
    let fields = listed(&applied);
    for noted in [
        "head_dim",
        "sliding_window",
        "original_max_position_embeddings",
    ] {
        assert!(fields.contains(&noted), "{noted} not noted: {fields:?}");
    }
    assert!(hf.get("head_dim").is_none(), "phi3.py has no head_dim");
    let ir = spec.lower();
    for l in &ir.layers {
        assert_eq!(l.attention().unwrap().projection, QkvProjection::Fused);
        assert_eq!(l.mlp().unwrap().projection, GateUpProjection::Fused);
    }
    // phi3.py's defaults: K/V heads = heads, an untied head, max 131072.
    let mut minimal = phi3.clone();
    for field in [
        "num_key_value_heads",
        "tie_word_embeddings",
        "max_position_embeddings",
        "rope_theta",
    ] {
        minimal.as_object_mut().unwrap().remove(field);
    }
    let (spec, _, hf) = import_and_round_trip(&minimal, None, "phi3-defaults");
    assert_eq!(hf["num_key_value_heads"], json!(4));
    assert_eq!(hf["tie_word_embeddings"], json!(false));
    assert_eq!(hf["max_position_embeddings"], json!(131072));
    assert_eq!(spec.lower().layers[0].attention().unwrap().n_kv_heads, 4);
    // What phi3.py's ModelArgs does with rope_scaling: su/longrope and linear
    // run (refused here), without `type` or `long_factor` it raises, another
    // type it drops with a warning.
    let refused = |scaling: Value, says: &str| {
        let text = refusal(&with(&phi3, &[("rope_scaling", scaling)]));
        assert!(
            text.contains("rope_scaling") && text.contains(says),
            "{says}:\n{text}"
        );
    };
    let factors = json!(vec![1.0; 8]);
    refused(
        json!({"type": "longrope", "long_factor": factors, "short_factor": factors}),
        "SuScaledRoPE",
    );
    refused(
        json!({"type": "su", "long_factor": factors, "short_factor": factors}),
        "SuScaledRoPE",
    );
    refused(
        json!({"type": "linear", "long_factor": factors, "factor": 2.0}),
        "linear",
    );
    refused(json!({"type": "longrope"}), "long_factor");
    let mut dropped = phi3.clone();
    dropped["rope_scaling"] = json!({"type": "dynamic", "long_factor": factors});
    let (_, applied, hf) = import_and_round_trip(&dropped, None, "phi3-dropped");
    assert!(applied.iter().any(|d| d.field == "rope_scaling"));
    assert_eq!(hf["rope_scaling"], Value::Null);
    let text = refusal(&with(&phi3, &[("partial_rotary_factor", json!(0.75))]));
    assert!(text.contains("partial_rotary_factor"), "{text}");
}

/// olmo2: llama.py's fields with olmo2.py's defaults (head_dim hidden //
/// heads, tie_word_embeddings true, rope_theta 10000), the post-norm
/// arrangement and whole-projection q/k norms as IR facts; biases refused
/// (they would sit on o_proj and the MLP too).
#[test]
fn olmo2_configs_take_mlx_lm_defaults() {
    use archgen_ir::{HeadWeight, NormArrangement, QkNorm, SanitizeRule};
    let olmo2 = small_config(json!({
        "model_type": "olmo2", "num_hidden_layers": 2, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096
    }));
    let (spec, applied, hf) = import_as(&olmo2, Family::Olmo2, "olmo2");
    let fields = listed_values(&applied);
    for (field, value) in [
        ("head_dim", json!(16)),
        ("tie_word_embeddings", json!(true)),
        ("rope_theta", json!(10000.0)),
    ] {
        assert!(fields.contains(&(field, &value)), "{field} in {fields:?}");
    }
    assert_eq!(hf["model_type"], json!("olmo2"));
    let ir = spec.lower();
    assert_eq!(ir.head.weight, HeadWeight::TiedEmbedding);
    assert_eq!(ir.checkpoint.sanitize, [SanitizeRule::DropRotaryTables]);
    for l in &ir.layers {
        assert_eq!(l.norms.arrangement, NormArrangement::PostNorm);
        assert_eq!(l.attention().unwrap().qk_norm, QkNorm::RmsWholeProjection);
    }
    for flag in ["attention_bias", "mlp_bias"] {
        let text = refusal(&with(&olmo2, &[(flag, json!(true))]));
        assert!(text.contains(&format!("{flag}: true")), "{text}");
    }
}

/// lfm2: `ModelArgs`' required fields (`block_ffn_dim_multiplier` may be
/// null), `block_ff_dim` from `intermediate_size` and `full_attn_idxs` from
/// `layer_types` when absent, `rope_parameters.rope_theta` over the default;
/// mlx-lm's MLP width rule; a conv bias, another `block_dim` and an untied
/// head refused.
#[test]
fn lfm2_configs_take_mlx_lm_fields_and_width_rule() {
    use archgen_ir::Mixer;
    let lfm2 = json!({
        "model_type": "lfm2", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
        "norm_eps": 1e-5, "conv_bias": false, "conv_L_cache": 3, "block_dim": 64,
        "block_multiple_of": 32, "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": true, "block_ff_dim": 200, "full_attn_idxs": [1, 3]
    });
    let (spec, applied, hf) = import_as(&lfm2, Family::Lfm2, "lfm2");
    let fields = listed_values(&applied);
    assert!(
        fields.contains(&("rope_theta", &json!(1000000.0))),
        "{fields:?}"
    );
    assert_eq!(hf["norm_eps"], json!(1e-5));
    assert!(hf.get("rms_norm_eps").is_none() && hf.get("tie_word_embeddings").is_none());
    let ir = spec.lower();
    // int(2 * 200 / 3) = 133, rounded up to a multiple of 32.
    assert!(ir.layers.iter().all(|l| l.mlp().unwrap().width == 160));
    let attention: Vec<bool> = ir
        .layers
        .iter()
        .map(|l| match &l.mixer {
            Mixer::Attention(_) => true,
            Mixer::ShortConv(c) => {
                assert_eq!(c.kernel, 3);
                false
            }
            Mixer::GatedDeltaNet(_) | Mixer::LatentAttention(_) => {
                panic!("lfm2 has neither Gated DeltaNet nor latent attention")
            }
        })
        .collect();
    assert_eq!(attention, [false, true, false, true]);

    // The other spellings ModelArgs reads.
    let mut other = lfm2.clone();
    let o = other.as_object_mut().unwrap();
    o.remove("full_attn_idxs");
    o.remove("block_ff_dim");
    o.insert(
        "layer_types".into(),
        json!(["conv", "full_attention", "conv", "conv"]),
    );
    o.insert("intermediate_size".into(), json!(96));
    o.insert("block_auto_adjust_ff_dim".into(), json!(false));
    o.insert("block_ffn_dim_multiplier".into(), Value::Null);
    o.insert("rope_parameters".into(), json!({"rope_theta": 5000000.0}));
    let (spec, _, hf) = import_and_round_trip(&other, None, "lfm2-layer-types");
    assert_eq!(hf["full_attn_idxs"], json!([1]));
    assert_eq!(hf["rope_theta"], json!(5000000.0));
    assert_eq!(hf["block_ffn_dim_multiplier"], Value::Null);
    assert!(spec
        .lower()
        .layers
        .iter()
        .all(|l| l.mlp().unwrap().width == 96));

    assert_each_refused(
        &lfm2,
        &[
            ("conv_bias", json!(true), "conv_bias: true"),
            ("block_dim", json!(32), "block_dim: not hidden_size"),
            (
                "tie_word_embeddings",
                json!(false),
                "tie_word_embeddings: false",
            ),
            ("full_attn_idxs", json!([4]), "layers.full_attn_idxs"),
            (
                "full_attn_idxs",
                json!("2,5"),
                "expected a list of layer indices",
            ),
        ],
    );
    // Quantization overrides name lfm2.py's modules; the spec names them as
    // the loader reads them.
    let quantized = with(
        &lfm2,
        &[(
            "quantization",
            json!({
                "group_size": 32, "bits": 4, "mode": "affine",
                "model.layers.0.feed_forward.w2": {"group_size": 32, "bits": 8, "mode": "affine"},
                "model.layers.1.self_attn.out_proj": false,
            }),
        )],
    );
    let (spec, _, _) = import_and_round_trip(&quantized, None, "lfm2-q");
    let paths: Vec<&String> = spec.quantization().unwrap().overrides.keys().collect();
    assert_eq!(
        paths,
        [
            "model.layers.0.mlp.down_proj",
            "model.layers.1.self_attn.o_proj"
        ]
    );
    let text = refusal(&without(&lfm2, &["full_attn_idxs"]));
    assert!(text.contains("full_attn_idxs: missing"), "{text}");
}

#[test]
fn an_unsupported_model_type_is_refused_with_the_registry_list() {
    // Every model type of the families table, in its order: the registry
    // reads them all (its own test), and the message lists what it reads.
    let e = from_config_json(&json!({"model_type": "falcon"}), None, "x").unwrap_err();
    assert_eq!(
        e.problems,
        vec![format!(
            "model_type: `falcon` is not a supported model ({})",
            archgen_ir::ConfigModelType::ALL
                .map(|t| t.as_str())
                .join(", ")
        )]
    );
    let e = from_config_json(&json!({"hidden_size": 8}), None, "x").unwrap_err();
    assert_eq!(
        e.problems,
        vec!["model_type: missing (mlx-lm needs it to pick the model)".to_string()]
    );
    // A family that takes no kv_config.json refuses one before reading the rest.
    let e = from_config_json(&json!({"model_type": "gemma2"}), Some(&json!([])), "x").unwrap_err();
    assert_eq!(
        e.problems,
        vec!["kv_config.json: KV-cache quantization is supported for Gemma-4 only (mlx-lm's gemma2 attention cannot read a quantized cache)".to_string()]
    );
    assert_eq!(supported_model_types(), ConfigModelType::ALL);
}

/// gpt_oss: `layer_types` defaults to sliding and full in turn for an even
/// layer count and is required for an odd one (gpt_oss.py's `zip` would
/// drop the last layer); `rope_scaling` is yarn (its absent keys
/// `YarnRoPE`'s defaults) or null; a Hugging Face `quantization_config` is
/// noted, not read.
#[test]
fn gpt_oss_import_reads_the_module_defaults_and_refuses_what_it_cannot_run() {
    let config = json!({
        "model_type": "gpt_oss",
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 512,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 8,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
        "quantization_config": {"quant_method": "mxfp4"},
    });
    let (spec, applied) = from_config_json(&config, None, "x").unwrap();
    let Spec::GptOss(s) = spec else {
        panic!("not gpt_oss")
    };
    use archgen_families::GptOssLayerType::{Full, Sliding};
    assert_eq!(
        s.attention_layers.layer_types,
        vec![Sliding, Full, Sliding, Full]
    );
    let y = s.rope.scaling.expect("yarn");
    assert_eq!(
        (y.factor, y.original_max_position_embeddings, y.beta_fast),
        (4.0, 4096.0, 32.0)
    );
    assert!(s.quantization.is_none());
    let noted: Vec<&str> = applied.iter().map(|a| a.field.as_str()).collect();
    for field in [
        "layer_types",
        "quantization_config",
        "rope_scaling.beta_slow",
    ] {
        assert!(noted.contains(&field), "{field} not noted in {noted:?}");
    }

    let mut odd = config.clone();
    odd["num_hidden_layers"] = json!(3);
    assert_refused_with(&odd, "layer_types: missing with an odd");
    let mut linear = config.clone();
    linear["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.0});
    assert_refused_with(&linear, "rope_scaling.rope_type: linear");
    let mut one_kind = config;
    one_kind["layer_types"] = json!(vec!["full_attention"; 4]);
    assert!(from_config_json(&one_kind, None, "x").is_err());
}
