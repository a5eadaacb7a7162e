//! The checked-in JSON Schema is generated from the Rust types and must be fresh.

#[test]
fn checked_in_schema_matches_the_types() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../specs/schema/archgen-spec.schema.json"
    );
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == archgen_families::json_schema(),
        "specs/schema/archgen-spec.schema.json is stale: run `cargo xtask spec schema` and commit it"
    );
}

#[test]
fn schema_requires_every_field() {
    let v: serde_json::Value = serde_json::from_str(&archgen_families::json_schema()).unwrap();
    for (def, must) in [
        ("Gemma4Spec", ["moe", "kv_quantization"]),
        ("DenseSpec", ["rope", "quantization"]),
    ] {
        let spec = &v["$defs"][def];
        let props = spec["properties"].as_object().unwrap();
        let required: Vec<&str> = spec["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        // Every property but `mixed_kv`, the one section a spec may leave out.
        assert!(
            props.contains_key("mixed_kv") && !required.contains(&"mixed_kv"),
            "{def}"
        );
        assert_eq!(props.len(), required.len() + 1, "{def}");
        assert!(must.iter().all(|m| required.contains(m)), "{def}");
        assert_eq!(spec["additionalProperties"], serde_json::json!(false));
    }
}
