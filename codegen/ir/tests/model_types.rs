//! `ConfigModelType` and `Family` come from one table (`families_and_model_types!`):
//! their `as_str`, serde spellings and the family map must agree.

use archgen_ir::{ConfigModelType, Family};

#[test]
fn serde_spelling_is_as_str_for_every_model_type_and_family() {
    for t in ConfigModelType::ALL {
        assert_eq!(serde_json::to_value(t).unwrap(), t.as_str(), "{t:?}");
        let back: ConfigModelType = serde_json::from_value(t.as_str().into()).unwrap();
        assert_eq!(back, t);
        let f = t.family();
        assert_eq!(serde_json::to_value(f).unwrap(), f.as_str(), "{f:?}");
    }
}

#[test]
fn each_family_is_spelled_as_one_of_its_model_types() {
    for t in ConfigModelType::ALL {
        let f = t.family();
        let named: Vec<ConfigModelType> = ConfigModelType::ALL
            .into_iter()
            .filter(|m| m.as_str() == f.as_str())
            .collect();
        assert_eq!(named.len(), 1, "{f:?}");
        assert_eq!(named[0].family(), f, "{f:?}");
    }
    let mut spellings: Vec<&str> = ConfigModelType::ALL.iter().map(|t| t.as_str()).collect();
    spellings.sort_unstable();
    spellings.dedup();
    assert_eq!(spellings.len(), ConfigModelType::ALL.len());
}

#[test]
fn aliases_map_to_their_family() {
    for (t, f) in [
        (ConfigModelType::Gemma4Text, Family::Gemma4),
        (ConfigModelType::Gemma4Unified, Family::Gemma4),
        (ConfigModelType::Mistral, Family::Llama),
        (ConfigModelType::Qwen35Moe, Family::Qwen35),
        (ConfigModelType::Olmo2, Family::Olmo2),
    ] {
        assert_eq!(t.family(), f, "{t:?}");
    }
    // Declaration order: the table's first row first (the count and the last
    // row are the table's, not pinned here, so a new family edits one place).
    assert_eq!(ConfigModelType::ALL[0], ConfigModelType::Gemma4);
}
