//! archgen-families: the model families archgen runs, as mlx-lm 0.32.2 runs them
//! (Gemma-4, Gemma-2, the dense Llama-shaped families, Qwen3-MoE, MiniCPM, Qwen3.5):
//! each family's YAML spec layout, its validation, its lowering to the block IR
//! (archgen-ir) and its config.json import.
//!
//! * [`load`] / [`parse_str`] read a spec file (full or derived), validate it and return
//!   the resolved [`Spec`] (one layout per family), or every error in the file as located [`Diagnostics`].
//! * [`Spec::lower`] gives the block IR ([`archgen_ir::ModelIr`], its own crate): what
//!   everything downstream reads, with per-module quantization
//!   ([`archgen_ir::ModelIr::quant_for`]) and the parameter count.
//! * [`import::from_config_json`] turns an mlx-lm / Hugging Face `config.json` into a spec
//!   with mlx-lm's defaults, listing the defaults it applied.
//! * [`to_hf_json`] prints a spec with config.json `text_config` names; [`spec_hash`] is a
//!   stable content hash; [`to_yaml`] writes a spec file; [`json_schema`] is the editor
//!   schema.
//!
//! The format is documented in `docs/spec-format.md`. This crate never depends on MLX.
//!
//! # Example
//!
//! ```
//! let yaml = r#"
//! format_version: 1
//! identity:
//!   name: tiny-qwen3
//!   family: qwen3
//!   source: {repo: null, revision: null, model_type: qwen3}
//! model:
//!   hidden_size: 64
//!   vocab_size: 512
//!   rms_norm_eps: 1.0e-6
//!   tie_word_embeddings: true
//!   max_position_embeddings: 4096
//! layers:
//!   num_hidden_layers: 2
//! attention:
//!   num_attention_heads: 4
//!   num_key_value_heads: 2
//!   head_dim: 16
//! rope:
//!   traditional: false
//!   rope_theta: 1000000.0
//!   scaling: null
//! mlp:
//!   intermediate_size: 128
//! quantization: null
//! "#;
//! // `load(path)` reads a file; the name must equal the file name without `.yaml`.
//! let spec = archgen_families::parse_str(yaml, "specs/tiny-qwen3.yaml")
//!     .map_err(|diagnostics| diagnostics.to_string())?;
//! let ir = spec.lower();
//! assert_eq!((ir.layers.len(), ir.hidden_size), (2, 64));
//!
//! // A required field left out is an error at its line and column.
//! let broken = yaml.replace("  head_dim: 16\n", "");
//! let error = archgen_families::parse_str(&broken, "specs/tiny-qwen3.yaml").unwrap_err();
//! assert!(error.to_string().contains("head_dim"), "{error}");
//! # Ok::<(), String>(())
//! ```

mod deepseek_v3;
mod dense;
mod dense_sections;
mod derive;
mod diag;
mod document;
mod gemma;
mod gemma4;
mod glm4_moe;
mod gpt_oss;
mod hf;
mod hints;
pub mod import;
mod ir_parts;
mod layout_reader;
mod lfm2;
mod minicpm;
mod mixed_kv;
mod model;
mod model_family;
mod noaux_tc;
mod qwen3_5;
mod qwen3_moe;
mod reader;
mod reduce;
mod registry;
mod validate;
mod yaml;
mod yaml_writer;
mod yarn;

// Diagnostics for people (source excerpts) and tools (JSON).
pub mod render;

// The IR this crate lowers every family to; its own crate, so that what reads
// only the IR does not depend on spec parsing.
use archgen_ir as ir;
pub use deepseek_v3::{DeepseekV3Rope, DeepseekV3Spec, LatentAttentionSizes, YarnRopeScaling};
pub use dense::{
    DenseAttention, DenseDerive, DenseDerivedSpecFile, DenseLayers, DenseMlp, DenseModel,
    DenseReduce, DenseRope, DenseSpec, RopeScaling,
};
pub use diag::{Diagnostic, Diagnostics, FieldPath, Seg};
pub use gemma::{
    Gemma2Attention, Gemma2Layers, Gemma2Mlp, Gemma2Model, Gemma2Rope, Gemma2Spec, GemmaRopeScaling,
};
pub use glm4_moe::{
    Glm4MoeAttentionOptions, Glm4MoeDerive, Glm4MoeDerivedSpecFile, Glm4MoeReduce, Glm4MoeRope,
    Glm4MoeSpec,
};
pub use gpt_oss::{
    GptOssAttentionLayers, GptOssDerive, GptOssDerivedSpecFile, GptOssExperts, GptOssLayerType,
    GptOssReduce, GptOssRope, GptOssSpec, GptOssYarn,
};
pub use hf::spec_hash;
pub use lfm2::{
    Lfm2Derive, Lfm2DerivedSpecFile, Lfm2FeedForward, Lfm2Layers, Lfm2Reduce, Lfm2Rope, Lfm2Spec,
};
pub use minicpm::{
    MiniCpmDerive, MiniCpmDerivedSpecFile, MiniCpmReduce, MiniCpmRope, MiniCpmScales, MiniCpmSpec,
};
pub use mixed_kv::{KvBits, MixedKv};
pub use model::*;
pub use noaux_tc::NoauxTcExperts;
pub use qwen3_5::{
    Qwen35Derive, Qwen35DerivedSpecFile, Qwen35Layers, Qwen35LinearAttention, Qwen35Reduce,
    Qwen35Rope, Qwen35Spec,
};
pub use qwen3_moe::{
    Qwen3MoeDerive, Qwen3MoeDerivedSpecFile, Qwen3MoeExperts, Qwen3MoeReduce, Qwen3MoeRope,
    Qwen3MoeSpec,
};
pub use registry::supported_model_types;
pub use validate::limits;
pub use yaml::MAX_SPEC_BYTES;

use diag::Issue;
use document::Document;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use yaml::{Loc, Node};

/// Most levels of `derive.from` followed before giving up.
pub const MAX_DERIVE_DEPTH: usize = 8;

/// A validated spec of any family. Each family has its own document layout (see
/// docs/spec-format.md); all lower to one block IR ([`Spec::lower`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum Spec {
    /// Gemma 4 (`gemma4`, `gemma4_text`).
    Gemma4(Gemma4Spec),
    /// The dense layout: Llama and its variants (`dense/`: qwen3, qwen2,
    /// smollm3, granite, phi3, olmo2; mistral through llama).
    Dense(DenseSpec),
    /// The Gemma layout: Gemma-2 and Gemma 3 text (`gemma/`).
    Gemma2(Gemma2Spec),
    /// Qwen3-MoE.
    Qwen3Moe(Qwen3MoeSpec),
    /// MiniCPM.
    MiniCpm(MiniCpmSpec),
    /// Qwen3.5 / Qwen3.6 (hybrid Gated DeltaNet and gated attention).
    Qwen35(Qwen35Spec),
    /// LFM2 (short convolutions and attention).
    Lfm2(Lfm2Spec),
    /// GLM-4.5 MoE.
    Glm4Moe(Glm4MoeSpec),
    /// DeepSeek-V3 (and Kimi-K2).
    DeepseekV3(DeepseekV3Spec),
    /// gpt-oss.
    GptOss(GptOssSpec),
}

/// `$body` with `$s` bound to the family's document in `$spec`, whichever
/// variant it is: the one list of the variants that reads every family alike.
macro_rules! with_document {
    ($spec:expr, $s:ident => $body:expr) => {
        match $spec {
            Spec::Gemma4($s) => $body,
            Spec::Dense($s) => $body,
            Spec::Gemma2($s) => $body,
            Spec::Qwen3Moe($s) => $body,
            Spec::MiniCpm($s) => $body,
            Spec::Qwen35($s) => $body,
            Spec::Lfm2($s) => $body,
            Spec::Glm4Moe($s) => $body,
            Spec::DeepseekV3($s) => $body,
            Spec::GptOss($s) => $body,
        }
    };
}

impl Spec {
    /// The family's document: what every method below reads through.
    fn document(&self) -> &dyn Document {
        with_document!(self, s => s)
    }
    fn document_mut(&mut self) -> &mut dyn Document {
        with_document!(self, s => s)
    }
    pub fn identity(&self) -> &Identity {
        self.document().identity()
    }
    pub fn identity_mut(&mut self) -> &mut Identity {
        self.document_mut().identity_mut()
    }
    /// `identity.name`.
    pub fn name(&self) -> &str {
        &self.identity().name
    }
    pub fn family(&self) -> Family {
        self.identity().family
    }
    /// The Gemma-4 document, when this is one.
    pub fn as_gemma4(&self) -> Option<&Gemma4Spec> {
        let Spec::Gemma4(s) = self else { return None };
        Some(s)
    }
    pub fn as_gemma4_mut(&mut self) -> Option<&mut Gemma4Spec> {
        let Spec::Gemma4(s) = self else { return None };
        Some(s)
    }
    /// The Gemma-4 document, when this is one, taken out.
    pub(crate) fn into_gemma4(self) -> Option<Gemma4Spec> {
        let Spec::Gemma4(s) = self else { return None };
        Some(s)
    }
    pub fn quantization(&self) -> Option<&Quantization> {
        self.document().quantization()
    }
    /// The spec lowered to the block IR (the spec must be valid, as every
    /// loaded one is): the one description of the model everything
    /// downstream reads.
    pub fn lower(&self) -> ir::ModelIr {
        let mut ir = self.document().lower();
        mixed_kv::apply(&mut ir, self.mixed_kv());
        ir
    }
    /// mlx-optiq per-layer mixed KV (`mixed_kv`), when the spec has it.
    pub fn mixed_kv(&self) -> Option<&MixedKv> {
        self.document().mixed_kv()
    }
    /// Semantic validation of a spec built in code (see [`Gemma4Spec::validate`]).
    pub fn validate(&self) -> Result<(), Diagnostics> {
        in_memory(self.document().check())
    }
}

/// The full-form YAML text of a spec, starting with the schema modeline. Parsing the
/// result gives back an equal spec.
pub fn to_yaml(spec: &Spec) -> String {
    spec.document().to_yaml()
}

/// The resolved spec with config.json field names (what `cargo xtask spec show NAME
/// --json` prints), plus `quantization` (mlx config form) and, for Gemma-4,
/// `kv_quantization` (kv_config.json form) when present. Keys are sorted.
pub fn to_hf_json(spec: &Spec) -> serde_json::Value {
    spec.document().hf_json()
}

/// A config.json for the spec in the layout of its source model type, without
/// quantization (a checkpoint writer adds what it packed). mlx-lm loads it to exactly
/// this architecture.
pub fn to_config_json(spec: &Spec) -> serde_json::Value {
    match spec {
        Spec::Gemma4(s) => gemma4::config_json(s),
        // The other families' config.json is their view as it is, less quantization.
        Spec::Dense(_)
        | Spec::Gemma2(_)
        | Spec::Qwen3Moe(_)
        | Spec::MiniCpm(_)
        | Spec::Qwen35(_)
        | Spec::Lfm2(_)
        | Spec::Glm4Moe(_)
        | Spec::DeepseekV3(_)
        | Spec::GptOss(_) => hf::without_quantization(to_hf_json(spec)),
    }
}

fn in_memory(issues: Vec<Issue>) -> Result<(), Diagnostics> {
    if issues.is_empty() {
        return Ok(());
    }
    Err(Diagnostics(
        issues
            .into_iter()
            .map(|i| Diagnostic {
                file: "<memory>".into(),
                line: 0,
                column: 0,
                path: i.path,
                message: i.message,
                expected: i.expected,
                hint: i.hint,
            })
            .collect(),
    ))
}

impl Gemma4Spec {
    /// Semantic validation of a spec built in code. Errors carry field paths but no file
    /// location (line and column 0, file `<memory>`).
    pub fn validate(&self) -> Result<(), Diagnostics> {
        in_memory(gemma4::check(self))
    }
}

/// Reads, validates and resolves the spec at `path`. A derived spec's parent
/// (`derive.from`) is read from the same directory. The spec's `identity.name` must equal
/// the file name without `.yaml`.
pub fn load(path: impl AsRef<Path>) -> Result<Spec, Diagnostics> {
    let mut stack = Vec::new();
    load_inner(path.as_ref(), &mut stack)
}

/// Parses, validates and resolves spec text. `origin` names the source in diagnostics;
/// a derived spec's parent is looked up in `origin`'s directory.
pub fn parse_str(source: &str, origin: &str) -> Result<Spec, Diagnostics> {
    let mut stack = Vec::new();
    let dir = Path::new(origin)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    parse_inner(source.as_bytes(), origin, &dir, &mut stack)
}

/// Either form of spec file; used for the JSON Schema.
#[derive(schemars::JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum SpecDocument {
    Full(Gemma4Spec),
    Dense(dense::DenseSpec),
    Derived(DerivedSpecFile),
    DerivedDense(dense::DenseDerivedSpecFile),
    Gemma2(gemma::Gemma2Spec),
    Qwen3Moe(qwen3_moe::Qwen3MoeSpec),
    DerivedQwen3Moe(qwen3_moe::Qwen3MoeDerivedSpecFile),
    MiniCpm(minicpm::MiniCpmSpec),
    DerivedMiniCpm(minicpm::MiniCpmDerivedSpecFile),
    Qwen35(qwen3_5::Qwen35Spec),
    DerivedQwen35(qwen3_5::Qwen35DerivedSpecFile),
    Lfm2(lfm2::Lfm2Spec),
    DerivedLfm2(lfm2::Lfm2DerivedSpecFile),
    Glm4Moe(glm4_moe::Glm4MoeSpec),
    DerivedGlm4Moe(glm4_moe::Glm4MoeDerivedSpecFile),
    DeepseekV3(deepseek_v3::DeepseekV3Spec),
    GptOss(gpt_oss::GptOssSpec),
    DerivedGptOss(gpt_oss::GptOssDerivedSpecFile),
}

/// The JSON Schema of spec files (both forms), pretty-printed with a final newline.
/// Every property is required, as the parser requires it.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(SpecDocument);
    let mut value = serde_json::to_value(&schema).unwrap_or_default();
    require_all(&mut value);
    let mut s = serde_json::to_string_pretty(&hf::canonical(&value)).unwrap_or_default();
    s.push('\n');
    s
}

/// Sections a full spec may leave out (absent means null), so that the specs written
/// before them still read and keep their `spec_hash`.
const OPTIONAL_SECTIONS: [&str; 1] = ["mixed_kv"];

/// Marks every property of every object schema as required (the parser has no
/// defaults; `null` must be written), except [`OPTIONAL_SECTIONS`].
fn require_all(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Object(props)) = map.get("properties") {
                let mut keys: Vec<serde_json::Value> = props
                    .keys()
                    .filter(|k| !OPTIONAL_SECTIONS.contains(&k.as_str()))
                    .map(|k| serde_json::Value::String(k.clone()))
                    .collect();
                keys.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
                map.insert("required".into(), serde_json::Value::Array(keys));
            }
            for (_, child) in map.iter_mut() {
                require_all(child);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(require_all),
        _ => {}
    }
}

fn single(file: &str, loc: Loc, issue: Issue) -> Diagnostics {
    Diagnostics(vec![located(file, loc, issue)])
}

fn located(file: &str, loc: Loc, i: Issue) -> Diagnostic {
    Diagnostic {
        file: file.to_string(),
        line: loc.line,
        column: loc.column,
        path: i.path,
        message: i.message,
        expected: i.expected,
        hint: i.hint,
    }
}

pub(crate) fn load_inner(path: &Path, stack: &mut Vec<PathBuf>) -> Result<Spec, Diagnostics> {
    let origin = path.display().to_string();
    let unreadable = |e: std::io::Error, hint: &str| {
        single(
            &origin,
            Loc::START,
            Issue::new(
                FieldPath::root(),
                format!("cannot read the file: {e}"),
                "a readable spec file",
                hint,
            ),
        )
    };
    let meta = std::fs::metadata(path)
        .map_err(|e| unreadable(e, "check the path; specs live in specs/<name>.yaml"))?;
    if meta.len() > MAX_SPEC_BYTES as u64 {
        return Err(single(
            &origin,
            Loc::START,
            Issue::new(
                FieldPath::root(),
                format!("file is {} bytes, over the limit", meta.len()),
                format!("at most {MAX_SPEC_BYTES} bytes"),
                "a spec is a few hundred lines; check that the right file was given",
            ),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| unreadable(e, "check the path and permissions"))?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let spec = parse_inner(&bytes, &origin, &dir, stack)?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if spec.name() != stem {
        // Re-parse the tree only to locate the name.
        let loc = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| yaml::parse_tree(t).ok())
            .map(|t| t.locate(&FieldPath::parse("identity.name")))
            .unwrap_or(Loc::START);
        return Err(single(
            &origin,
            loc,
            Issue::new(
                FieldPath::parse("identity.name"),
                format!("name `{}` differs from the file name `{stem}`", spec.name()),
                format!("`{stem}`"),
                "rename the file or the spec so that specs/<name>.yaml holds identity.name <name>",
            ),
        ));
    }
    Ok(spec)
}

fn parse_inner(
    bytes: &[u8],
    origin: &str,
    dir: &Path,
    stack: &mut Vec<PathBuf>,
) -> Result<Spec, Diagnostics> {
    let fail = |issues: Vec<(Loc, Issue)>| {
        let mut d = Diagnostics(
            issues
                .into_iter()
                .map(|(l, i)| located(origin, l, i))
                .collect(),
        );
        d.sort();
        d
    };
    let text = yaml::check_bytes(bytes).map_err(fail)?;
    let tree = yaml::parse_tree(text).map_err(fail)?;
    let value: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| {
        let loc = e
            .location()
            .map(|l| Loc {
                line: l.line(),
                column: l.column(),
            })
            .unwrap_or(Loc::START);
        single(
            origin,
            loc,
            Issue::new(
                FieldPath::root(),
                format!("YAML error: {e}"),
                "well-formed YAML",
                "check indentation, colons and brackets near this position",
            ),
        )
    })?;
    if tree.has_key("derive") {
        return derive::parse_derived(value, &tree, origin, dir, stack);
    }
    let (tree, family) = (&tree, declared_family(&value));
    if let Some(variant) = family.and_then(gemma::variant_of) {
        return variant.layout.parse(value, tree, origin, Spec::Gemma2);
    }
    if let Some(variant) = family.and_then(qwen3_5::variant_of) {
        return variant.layout.parse(value, tree, origin, Spec::Qwen35);
    }
    match family {
        Some(f) if dense::is_dense(f) => dense::LAYOUT.parse(value, tree, origin, Spec::Dense),
        Some(Family::Qwen3Moe) => qwen3_moe::LAYOUT.parse(value, tree, origin, Spec::Qwen3Moe),
        Some(Family::MiniCpm) => minicpm::LAYOUT.parse(value, tree, origin, Spec::MiniCpm),
        Some(Family::Lfm2) => lfm2::LAYOUT.parse(value, tree, origin, Spec::Lfm2),
        Some(Family::Glm4Moe) => glm4_moe::LAYOUT.parse(value, tree, origin, Spec::Glm4Moe),
        Some(Family::DeepseekV3) => {
            deepseek_v3::LAYOUT.parse(value, tree, origin, Spec::DeepseekV3)
        }
        Some(Family::GptOss) => gpt_oss::LAYOUT.parse(value, tree, origin, Spec::GptOss),
        // Gemma-4's document, read whole (also when the family is not known:
        // the read reports it).
        _ => {
            let spec = deserialize_full(value, tree, origin)?;
            let issues = gemma4::check(&spec);
            if issues.is_empty() {
                Ok(Spec::Gemma4(spec))
            } else {
                Err(locate_all(tree, origin, issues))
            }
        }
    }
}

/// `identity.family` as written, when it names a known family: it picks the layout
/// the rest of the document is read with.
fn declared_family(value: &serde_yaml::Value) -> Option<Family> {
    let f = value.get("identity")?.get("family")?.clone();
    serde_yaml::from_value(f).ok()
}

pub(crate) fn locate_all(tree: &Node, origin: &str, issues: Vec<Issue>) -> Diagnostics {
    let mut d = Diagnostics(
        issues
            .into_iter()
            .map(|i| {
                let loc = tree.locate(&i.path);
                located(origin, loc, i)
            })
            .collect(),
    );
    d.sort();
    d
}

/// Sections of the full form, in file order.
const FULL_SECTIONS: [&str; 12] = [
    "format_version",
    "identity",
    "model",
    "layers",
    "attention",
    "rope",
    "mlp",
    "moe",
    "per_layer_input",
    "quantization",
    "kv_quantization",
    "mixed_kv",
];

fn deserialize_full(
    value: serde_yaml::Value,
    tree: &Node,
    origin: &str,
) -> Result<Gemma4Spec, Diagnostics> {
    match serde_path_to_error::deserialize::<_, Gemma4Spec>(value.clone()) {
        Ok(spec) => Ok(spec),
        Err(first) => {
            // Deserialize section by section to report every section's first error.
            let (map, mut issues) = Sections::of(&value, &FULL_SECTIONS);
            map.check::<u32>("format_version", &mut issues);
            map.check::<Identity>("identity", &mut issues);
            map.check::<ModelDims>("model", &mut issues);
            map.check::<Layers>("layers", &mut issues);
            map.check::<Attention>("attention", &mut issues);
            map.check::<Rope>("rope", &mut issues);
            map.check::<Mlp>("mlp", &mut issues);
            map.check::<Option<Moe>>("moe", &mut issues);
            map.check::<Option<PerLayerInput>>("per_layer_input", &mut issues);
            map.check::<Option<Quantization>>("quantization", &mut issues);
            map.check::<Option<Vec<KvQuantEntry>>>("kv_quantization", &mut issues);
            map.check_optional::<MixedKv>("mixed_kv", &mut issues);
            if issues.is_empty() {
                issues.push(serde_issue(&FieldPath::root(), first));
            }
            Err(locate_serde(tree, origin, issues))
        }
    }
}

/// The top-level mapping of a document that did not deserialize whole, read
/// section by section so that every section's first error is reported.
pub(crate) struct Sections(serde_yaml::Mapping);

impl Sections {
    /// The mapping, and an issue for every key that is not one of `known`.
    pub(crate) fn of(value: &serde_yaml::Value, known: &[&str]) -> (Self, Vec<Issue>) {
        let map = value.as_mapping().cloned().unwrap_or_default();
        let issues = map
            .iter()
            .map(|(k, _)| k.as_str().unwrap_or(""))
            .filter(|k| !known.contains(k))
            .map(|k| unknown_field(&FieldPath::root(), k, known))
            .collect();
        (Sections(map), issues)
    }

    /// Optional section `name` (absent means null): its first type error.
    pub(crate) fn check_optional<T: DeserializeOwned>(&self, name: &str, issues: &mut Vec<Issue>) {
        if let Some(v) = self.0.get(name) {
            if let Err(e) = de_at::<Option<T>>(v.clone(), &FieldPath::root().key(name)) {
                issues.push(e);
            }
        }
    }

    /// Section `name` missing, or its first type error.
    pub(crate) fn check<T: DeserializeOwned>(&self, name: &str, issues: &mut Vec<Issue>) {
        match self.0.get(name) {
            None => issues.push(missing_field(&FieldPath::root(), name)),
            Some(v) => {
                if let Err(e) = de_at::<T>(v.clone(), &FieldPath::root().key(name)) {
                    issues.push(e);
                }
            }
        }
    }
}

/// Locates serde issues: unknown keys at the key itself, the rest at the value.
pub(crate) fn locate_serde(tree: &Node, origin: &str, issues: Vec<Issue>) -> Diagnostics {
    let mut d = Diagnostics(
        issues
            .into_iter()
            .map(|i| {
                let loc = if i.message.starts_with("unknown field") {
                    tree.locate_key(&i.path)
                        .unwrap_or_else(|| tree.locate(&i.path))
                } else {
                    tree.locate(&i.path)
                };
                located(origin, loc, i)
            })
            .collect(),
    );
    d.sort();
    d
}

pub(crate) fn de_at<T: DeserializeOwned>(v: serde_yaml::Value, at: &FieldPath) -> Result<T, Issue> {
    serde_path_to_error::deserialize::<_, T>(v).map_err(|e| serde_issue(at, e))
}

pub(crate) fn missing_field(parent: &FieldPath, name: &str) -> Issue {
    let path = parent.key(name);
    Issue::new(
        path.clone(),
        format!("missing field `{name}`"),
        format!("`{name}` to be written ({})", hints::expected_for(name)),
        hints::hint_for(&path),
    )
}

pub(crate) fn unknown_field(parent: &FieldPath, name: &str, known: &[&str]) -> Issue {
    Issue::new(
        parent.key(name),
        format!("unknown field `{name}`"),
        format!(
            "one of {}",
            known
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        "check the spelling; docs/spec-format.md lists every field",
    )
}

pub(crate) fn serde_issue(
    at: &FieldPath,
    e: serde_path_to_error::Error<serde_yaml::Error>,
) -> Issue {
    let mut path = at.clone();
    for seg in e.path().iter() {
        match seg {
            serde_path_to_error::Segment::Seq { index } => path.0.push(Seg::Index(*index)),
            serde_path_to_error::Segment::Map { key } => path.0.push(Seg::Key(key.clone())),
            serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => {}
        }
    }
    let msg = e.inner().to_string();
    // serde_yaml appends " at line L column C" for some errors; the tree locates instead.
    let msg = match msg.find(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    };
    if let Some(rest) = msg.strip_prefix("missing field `") {
        let name = rest.trim_end_matches('`');
        return missing_field(&path, name);
    }
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        let name = rest.split('`').next().unwrap_or("");
        if path.last_key() != Some(name) {
            path = path.key(name);
        }
        let expected = rest
            .split_once(", expected ")
            .map(|x| x.1)
            .unwrap_or("a known field");
        return Issue::new(
            path,
            format!("unknown field `{name}`"),
            expected.to_string(),
            "check the spelling; docs/spec-format.md lists every field",
        );
    }
    let (what, expected) = match msg.split_once(", expected ") {
        Some((w, x)) if !matches!(x, "u32" | "f64") => (w.to_string(), x.to_string()),
        Some((w, _)) => (w.to_string(), hints::expected_for_path(&path)),
        None => (msg.clone(), hints::expected_for_path(&path)),
    };
    Issue::new(path.clone(), what, expected, hints::hint_for(&path))
}
