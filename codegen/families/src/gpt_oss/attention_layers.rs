//! gpt-oss's `attention_layers` section: which layers attend over a sliding
//! window and which over everything (`layer_types`), its checks, each layer's
//! IR window and its import.

use crate::diag::FieldPath;
use crate::reader::Reader;
use crate::validate::Checker;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Which layers attend over a sliding window and which over everything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GptOssAttentionLayers {
    /// `sliding_window`: the positions a sliding layer sees (its
    /// `RotatingKVCache(max_size=sliding_window)`).
    pub sliding_window: u32,
    /// `layer_types`, one per layer (config.json without it: sliding, full,
    /// sliding, ... as `GptOssMoeModel` defaults it).
    pub layer_types: Vec<GptOssLayerType>,
}

/// One entry of `layer_types`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum GptOssLayerType {
    /// Attention over the last `sliding_window` positions.
    #[serde(rename = "sliding_attention")]
    Sliding,
    /// Causal attention over every position.
    #[serde(rename = "full_attention")]
    Full,
}

impl GptOssLayerType {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            GptOssLayerType::Sliding => "sliding_attention",
            GptOssLayerType::Full => "full_attention",
        }
    }
}

impl GptOssAttentionLayers {
    /// The section's rules (`attention_layers.*` paths) for a stack of
    /// `num_hidden_layers`; returns whether they hold.
    pub(super) fn check(&self, c: &mut Checker, num_hidden_layers: u32) -> bool {
        let mut ok = c.range(
            "attention_layers.sliding_window",
            self.sliding_window,
            u32::MAX,
            "positions a sliding layer sees (gpt-oss-20b: 128)",
        );
        let n = num_hidden_layers as usize;
        if self.layer_types.len() != n {
            ok = false;
            c.err(
                FieldPath::parse("attention_layers.layer_types"),
                format!("{} entries for {n} layers", self.layer_types.len()),
                format!("one entry per layer ({n})"),
                "list sliding_attention or full_attention for every layer",
            );
        }
        for kind in [GptOssLayerType::Sliding, GptOssLayerType::Full] {
            if !self.layer_types.contains(&kind) {
                ok = false;
                c.err(
                    FieldPath::parse("attention_layers.layer_types"),
                    format!("no {}", kind.as_str()),
                    "at least one sliding_attention and one full_attention layer",
                    "gpt_oss.py builds its masks from the first layer of each kind \
                     (layer_types.index), which fails when a kind is missing",
                );
            }
        }
        ok
    }

    /// The IR window of a layer of type `kind`.
    pub(super) fn window(&self, kind: GptOssLayerType) -> crate::ir::Window {
        match kind {
            GptOssLayerType::Sliding => crate::ir::Window::Sliding(self.sliding_window as usize),
            GptOssLayerType::Full => crate::ir::Window::Full,
        }
    }

    /// `layer_types` as config.json writes it.
    pub(super) fn type_names(&self) -> Vec<&'static str> {
        self.layer_types.iter().map(|t| t.as_str()).collect()
    }
}

/// `layer_types`, or `GptOssMoeModel`'s default: `["sliding_attention",
/// "full_attention"] * (num_hidden_layers // 2)`, which has an entry per layer
/// only for an even count (mlx-lm's `zip` would drop the last layer of an odd
/// one, so that is refused).
pub(super) fn read_layer_types(
    top: &Map<String, Value>,
    n: u32,
    r: &mut Reader,
) -> Vec<GptOssLayerType> {
    match top.get("layer_types") {
        None | Some(Value::Null) if n % 2 == 0 => {
            let pattern = [GptOssLayerType::Sliding, GptOssLayerType::Full];
            let types: Vec<_> = pattern.iter().copied().cycle().take(n as usize).collect();
            let names: Vec<&str> = types.iter().map(|t| t.as_str()).collect();
            r.note(
                "layer_types",
                json!(names),
                "absent: gpt_oss.py alternates sliding and full layers",
            );
            types
        }
        None | Some(Value::Null) => {
            r.problem(
                "layer_types",
                &format!(
                    "missing with an odd num_hidden_layers ({n}): gpt_oss.py's default pattern \
                     covers {} layers; list one type per layer",
                    n - 1
                ),
            );
            Vec::new()
        }
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| match v.as_str() {
                Some("sliding_attention") => Some(GptOssLayerType::Sliding),
                Some("full_attention") => Some(GptOssLayerType::Full),
                _ => {
                    r.problem(
                        "layer_types",
                        &format!("expected sliding_attention or full_attention, found {v}"),
                    );
                    None
                }
            })
            .collect(),
        Some(other) => {
            r.problem(
                "layer_types",
                &format!("expected a list of layer types, found {other}"),
            );
            Vec::new()
        }
    }
}
