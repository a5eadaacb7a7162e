//! Quantization: mlx's weight quantization as a spec writes it (also the
//! `quantization` section of spec documents, hence serde and the schema),
//! the per-module resolution the IR applies (`ModelIr::quant_for`), and the
//! per-layer KV-cache quantization the caches carry.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// Bits mlx supports for affine quantization (weights and KV cache).
pub const AFFINE_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes mlx supports for affine quantization.
pub const AFFINE_GROUPS: [u32; 3] = [32, 64, 128];

/// mlx quantization mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QuantMode {
    /// Integer affine (scales and biases): bits 2,3,4,5,6,8; group 32, 64, 128.
    Affine,
    /// Microscaling fp4: bits 4, group 32.
    Mxfp4,
    /// Microscaling fp8: bits 8, group 32.
    Mxfp8,
    /// NVIDIA fp4: bits 4, group 16.
    Nvfp4,
}

impl QuantMode {
    /// The mlx spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Mxfp8 => "mxfp8",
            QuantMode::Nvfp4 => "nvfp4",
        }
    }
}

/// Parameters of one quantized module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuantParams {
    /// Bits per weight.
    pub bits: u32,
    /// Weights per scale group (along the input dimension).
    pub group_size: u32,
    /// Quantization mode.
    pub mode: QuantMode,
}

/// Weight quantization: what mlx-lm's convert writes under `quantization`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Quantization {
    /// Applies to every quantizable module (Linear, Embedding, SwitchLinear) whose input
    /// dimension is divisible by its group size and that has no override.
    pub default: QuantParams,
    /// Per-module entries keyed by full mlx module path
    /// (`language_model.model.layers.0.router.proj`): params, or `false` to keep the
    /// module unquantized. An explicit entry always wins. Write `{}` when there are none.
    pub overrides: BTreeMap<String, QuantOverride>,
}

/// One per-module quantization entry: `false` or params.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum QuantOverride {
    /// `false`: not quantized.
    Skip(bool),
    /// Quantized with these params.
    Params(QuantParams),
}

impl QuantOverride {
    /// The params, or None for `false`.
    pub fn params(&self) -> Option<QuantParams> {
        match self {
            QuantOverride::Skip(_) => None,
            QuantOverride::Params(p) => Some(*p),
        }
    }
}

impl<'de> Deserialize<'de> for QuantOverride {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = QuantOverride;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`false` or a mapping {bits, group_size, mode}")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<QuantOverride, E> {
                if v {
                    Err(E::custom(
                        "`true` is not allowed here: write the params {bits, group_size, mode}",
                    ))
                } else {
                    Ok(QuantOverride::Skip(false))
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<QuantOverride, A::Error> {
                QuantParams::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(QuantOverride::Params)
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for QuantOverride {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "QuantOverride".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let params = generator.subschema_for::<QuantParams>();
        schemars::json_schema!({
            "description": "`false` (keep unquantized) or params {bits, group_size, mode}.",
            "anyOf": [ { "const": false }, params ]
        })
    }
}

/// Per-layer KV-cache quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvQuant {
    pub bits: u32,
    pub group_size: u32,
}

/// What kind of quantizable module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleKind {
    Linear,
    Embedding,
    /// Expert weights `[experts, out, in]` (`SwitchLinear`).
    SwitchLinear,
    /// Per-head weights `[heads, out, in]` (`MultiLinear`).
    MultiLinear,
}

/// One module mlx's `nn.quantize` can quantize, with its weight shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantizableModule {
    /// Full mlx module path.
    pub path: String,
    pub kind: ModuleKind,
    /// `weight.shape[-1]`: the quantized (grouped) dimension.
    pub in_dim: u64,
    /// `weight.shape[-2]`.
    pub out_dim: u64,
    /// Experts (SwitchLinear) or 1.
    pub count: u64,
}

/// Weight quantization with mlx-lm's per-module resolution.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightQuant {
    pub default: QuantParams,
    /// Explicit per-path entries: `None` is `false`.
    pub overrides: BTreeMap<String, Option<QuantParams>>,
}

impl WeightQuant {
    /// The spec's `quantization` with `false` entries as `None`.
    pub fn of(q: &Quantization) -> Self {
        WeightQuant {
            default: q.default,
            overrides: q
                .overrides
                .iter()
                .map(|(k, v)| (k.clone(), v.params()))
                .collect(),
        }
    }
}
