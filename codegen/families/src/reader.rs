//! Reading a config.json as mlx-lm 0.32.2 reads it: the [`Reader`] every
//! family's importer uses (each field by mlx-lm's rules, every default
//! applied reported as an [`AppliedDefault`], every problem collected into one
//! [`ImportError`]) and mlx's `quantization` dict. The importers themselves
//! live with their families; `import` dispatches by `model_type`.

use crate::model::*;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt;

/// A value the importer filled in or changed, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedDefault {
    /// config.json field (e.g. `text_config.num_kv_shared_layers`).
    pub field: String,
    /// The value used.
    pub value: Value,
    /// Why (`absent: mlx-lm 0.32.2 default`, or a normalisation).
    pub reason: String,
}

impl fmt::Display for AppliedDefault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {} ({})", self.field, self.value, self.reason)
    }
}

/// Why a config could not be imported: every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportError {
    pub problems: Vec<String>,
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.problems {
            writeln!(f, "{p}")?;
        }
        write!(f, "{} problem(s)", self.problems.len())
    }
}

impl std::error::Error for ImportError {}

pub(crate) const ABSENT: &str = "absent: mlx-lm 0.32.2 default";

pub(crate) struct Reader<'a> {
    pub(crate) obj: &'a Map<String, Value>,
    pub(crate) prefix: &'a str,
    pub(crate) applied: Vec<AppliedDefault>,
    pub(crate) problems: Vec<String>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(obj: &'a Map<String, Value>, prefix: &'a str) -> Self {
        Reader {
            obj,
            prefix,
            applied: Vec::new(),
            problems: Vec::new(),
        }
    }
    /// What was applied and what went wrong.
    pub(crate) fn finish(self) -> (Vec<AppliedDefault>, Vec<String>) {
        (self.applied, self.problems)
    }
    /// What was applied, or every problem found: where an importer stops
    /// reading and starts building its spec.
    pub(crate) fn finish_ok(self) -> Result<Vec<AppliedDefault>, ImportError> {
        if self.problems.is_empty() {
            Ok(self.applied)
        } else {
            Err(ImportError {
                problems: self.problems,
            })
        }
    }
    /// Takes over another reader's notes and problems.
    pub(crate) fn absorb(&mut self, other: Reader) {
        self.applied.extend(other.applied);
        self.problems.extend(other.problems);
    }
    /// An integer mlx-lm has no default for.
    pub(crate) fn required_uint(&mut self, k: &str) -> u32 {
        match self.get(k).cloned() {
            Some(v) => self.uint_of(k, &v),
            None => {
                self.problem(k, "missing (mlx-lm has no default for it)");
                0
            }
        }
    }
    /// Integers mlx-lm has no defaults for, read in the order given (the
    /// order their problems are reported in).
    pub(crate) fn required_uints<const N: usize>(&mut self, keys: [&str; N]) -> [u32; N] {
        keys.map(|k| self.required_uint(k))
    }
    /// A number mlx-lm has no default for.
    pub(crate) fn required_float(&mut self, k: &str) -> f64 {
        match self.get(k).cloned() {
            Some(v) => v.as_f64().unwrap_or_else(|| {
                self.problem(k, &format!("expected a number, found {v}"));
                0.0
            }),
            None => {
                self.problem(k, "missing (mlx-lm has no default for it)");
                0.0
            }
        }
    }
    /// A boolean mlx-lm has no default for.
    pub(crate) fn required_bool(&mut self, k: &str) -> bool {
        match self.get(k).cloned() {
            Some(Value::Bool(b)) => b,
            Some(v) => {
                self.problem(k, &format!("expected true or false, found {v}"));
                false
            }
            None => {
                self.problem(k, "missing (mlx-lm has no default for it)");
                false
            }
        }
    }
    fn field(&self, k: &str) -> String {
        format!("{}{k}", self.prefix)
    }
    pub(crate) fn note(&mut self, k: &str, v: Value, reason: &str) {
        let field = self.field(k);
        self.applied.push(AppliedDefault {
            field,
            value: v,
            reason: reason.to_string(),
        });
    }
    pub(crate) fn problem(&mut self, k: &str, msg: &str) {
        let f = self.field(k);
        self.problems.push(format!("{f}: {msg}"));
    }
    /// Present (and not null) value.
    pub(crate) fn get(&self, k: &str) -> Option<&Value> {
        self.obj.get(k).filter(|v| !v.is_null())
    }
    pub(crate) fn uint_of(&mut self, k: &str, v: &Value) -> u32 {
        match v.as_u64().and_then(|x| u32::try_from(x).ok()) {
            Some(x) => x,
            None => {
                self.problem(k, &format!("expected a non-negative integer, found {v}"));
                0
            }
        }
    }
    /// Integer with an mlx default; null is a problem (mlx would fail on it).
    pub(crate) fn uint(&mut self, k: &str, default: u32) -> u32 {
        match self.obj.get(k) {
            None => {
                self.note(k, json!(default), ABSENT);
                default
            }
            Some(Value::Null) => {
                self.problem(k, "null, but mlx-lm needs an integer here");
                default
            }
            Some(v) => {
                let v = v.clone();
                self.uint_of(k, &v)
            }
        }
    }
    /// Optional integer where null/0 means "off"; `default` when absent.
    pub(crate) fn opt_uint(&mut self, k: &str, default: Option<u32>) -> Option<u32> {
        match self.obj.get(k) {
            None => {
                self.note(k, json!(default), ABSENT);
                default
            }
            Some(Value::Null) => None,
            Some(v) => {
                let v = v.clone();
                Some(self.uint_of(k, &v))
            }
        }
    }
    pub(crate) fn float(&mut self, k: &str, default: f64) -> f64 {
        match self.obj.get(k) {
            None => {
                self.note(k, json!(default), ABSENT);
                default
            }
            Some(v) => match v.as_f64() {
                Some(x) => x,
                None => {
                    self.problem(k, &format!("expected a number, found {v}"));
                    default
                }
            },
        }
    }
    /// `head_dim` as written, else `hidden_size // num_attention_heads` (0
    /// without heads), noted with `absent_reason`.
    pub(crate) fn head_dim_or_quotient(
        &mut self,
        hidden_size: u32,
        num_heads: u32,
        absent_reason: &str,
    ) -> u32 {
        match self.get("head_dim").cloned() {
            Some(v) => self.uint_of("head_dim", &v),
            None => self.quotient_head_dim(hidden_size, num_heads, absent_reason),
        }
    }
    /// The `head_dim` of a module without such a field (`module.py` always
    /// uses `hidden_size // num_attention_heads`), noted with why: a written
    /// one is ignored.
    pub(crate) fn head_dim_of_module_without_it(
        &mut self,
        hidden_size: u32,
        num_heads: u32,
        module: &str,
    ) -> u32 {
        let reason = match self.get("head_dim") {
            Some(_) => format!(
                "ignored as written: mlx-lm's {module}.py always uses hidden_size // num_attention_heads"
            ),
            None => format!("{module}.py has no head_dim field: hidden_size // num_attention_heads"),
        };
        self.quotient_head_dim(hidden_size, num_heads, &reason)
    }
    /// `hidden_size // num_attention_heads` (0 without heads), noted as the
    /// `head_dim` used, with `reason`.
    fn quotient_head_dim(&mut self, hidden_size: u32, num_heads: u32, reason: &str) -> u32 {
        let head_dim = hidden_size.checked_div(num_heads).unwrap_or(0);
        self.note("head_dim", json!(head_dim), reason);
        head_dim
    }
    pub(crate) fn boolean(&mut self, k: &str, default: bool) -> bool {
        match self.obj.get(k) {
            None => {
                self.note(k, json!(default), ABSENT);
                default
            }
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                let v = v.clone();
                self.problem(k, &format!("expected true or false, found {v}"));
                default
            }
        }
    }
}

fn mode_defaults(mode: QuantMode) -> (u32, u32) {
    // (group_size, bits) of mx.quantize when the entry omits them.
    match mode {
        QuantMode::Affine => (64, 4),
        QuantMode::Mxfp4 => (32, 4),
        QuantMode::Nvfp4 => (16, 4),
        QuantMode::Mxfp8 => (32, 8),
    }
}

fn parse_mode(s: &str) -> Option<QuantMode> {
    match s {
        "affine" => Some(QuantMode::Affine),
        "mxfp4" => Some(QuantMode::Mxfp4),
        "mxfp8" => Some(QuantMode::Mxfp8),
        "nvfp4" => Some(QuantMode::Nvfp4),
        _ => None,
    }
}

/// The weight quantization of a config.json: the first of `candidates` (a value
/// and the config.json field it is read from, in the family's order of
/// preference) that is present and not null, read as [`read_quantization`].
/// The `mode` of the quantization dict at `field`: absent is affine (listed
/// with `absent_reason`, since mlx-lm's default and `to_quantized`'s differ in
/// why), an unknown name is a problem and None.
fn quant_mode(
    r: &mut Reader,
    field: &str,
    mode: Option<&Value>,
    absent_reason: &str,
) -> Option<QuantMode> {
    let Some(v) = mode else {
        r.applied.push(AppliedDefault {
            field: format!("{field}.mode"),
            value: json!("affine"),
            reason: absent_reason.into(),
        });
        return Some(QuantMode::Affine);
    };
    let parsed = v.as_str().and_then(parse_mode);
    if parsed.is_none() {
        r.problems
            .push(format!("{field}.mode: unknown quantization mode {v}"));
    }
    parsed
}

pub(crate) fn first_quantization(
    candidates: &[(Option<&Value>, &str)],
    r: &mut Reader,
) -> Option<Quantization> {
    let (q, field) = candidates
        .iter()
        .find_map(|(v, field)| v.filter(|v| !v.is_null()).map(|v| (v, *field)))?;
    read_quantization(q, field, r)
}

/// The top-level `quantization`, else `quantization_config` (see
/// [`first_quantization`]): where a flat config.json keeps it.
pub(crate) fn top_quantization(top: &Map<String, Value>, r: &mut Reader) -> Option<Quantization> {
    first_quantization(
        &[
            (top.get("quantization"), "quantization"),
            (top.get("quantization_config"), "quantization_config"),
        ],
        r,
    )
}

/// The RoPE kind of a `rope_scaling` or `rope_parameters` entry as
/// rope_utils' `initialize_rope` reads it: `type`, else `rope_type`, else
/// `default`.
pub(crate) fn rope_type(entry: &Map<String, Value>) -> &str {
    entry
        .get("type")
        .or_else(|| entry.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or("default")
}

/// The identity of an imported spec: its source repository is config.json's
/// `_name_or_path` when that reads as a Hub id (`owner/name`, not a local path).
pub(crate) fn imported_identity(
    top: &Map<String, Value>,
    name: &str,
    family: Family,
    model_type: ConfigModelType,
) -> Identity {
    let repo = top
        .get("_name_or_path")
        .and_then(Value::as_str)
        .filter(|s| s.split('/').count() == 2 && !s.starts_with('/') && !s.starts_with('.'))
        .map(str::to_string);
    Identity {
        name: name.to_string(),
        family,
        source: Source {
            repo,
            revision: None,
            model_type,
        },
    }
}

/// Reads a quantization dict (mlx `quantization` form or a legacy `quantization_config`).
pub(crate) fn read_quantization(q: &Value, field: &str, r: &mut Reader) -> Option<Quantization> {
    let Some(obj) = q.as_object() else {
        r.problems
            .push(format!("{field}: expected a mapping, found {q}"));
        return None;
    };
    if let Some(method) = obj.get("quant_method").and_then(Value::as_str) {
        let default = match method {
            "mxfp4" => QuantParams {
                bits: 4,
                group_size: 32,
                mode: QuantMode::Mxfp4,
            },
            "mxfp8" => QuantParams {
                bits: 8,
                group_size: 32,
                mode: QuantMode::Mxfp8,
            },
            "fp8"
                if obj.get("scale_fmt").and_then(Value::as_str) == Some("ue8m0")
                    && obj.get("weight_block_size") == Some(&json!([32, 32])) =>
            {
                QuantParams {
                    bits: 8,
                    group_size: 32,
                    mode: QuantMode::Mxfp8,
                }
            }
            "modelopt" => {
                let settings = obj
                    .get("quantization")
                    .and_then(Value::as_object)
                    .unwrap_or(obj);
                if settings.get("quant_algo").and_then(Value::as_str) != Some("NVFP4") {
                    r.problems.push(format!(
                        "{field}: modelopt quant_algo other than NVFP4 is not supported by mlx-lm"
                    ));
                    return None;
                }
                let gs = settings
                    .get("group_size")
                    .and_then(Value::as_u64)
                    .unwrap_or(16) as u32;
                QuantParams {
                    bits: 4,
                    group_size: gs,
                    mode: QuantMode::Nvfp4,
                }
            }
            other => {
                r.problems.push(format!(
                    "{field}: quant_method `{other}` is not supported by archgen (mxfp4, mxfp8, fp8/ue8m0, modelopt NVFP4 are)"
                ));
                return None;
            }
        };
        r.applied.push(AppliedDefault {
            field: field.to_string(),
            value: json!({"bits": default.bits, "group_size": default.group_size, "mode": default.mode.as_str()}),
            reason: format!("legacy quant_method `{method}` mapped as mlx-lm's load does"),
        });
        return Some(Quantization {
            default,
            overrides: BTreeMap::new(),
        });
    }
    let int = |v: Option<&Value>| {
        v.and_then(Value::as_u64)
            .and_then(|x| u32::try_from(x).ok())
    };
    let mode = quant_mode(r, field, obj.get("mode"), ABSENT)?;
    let (Some(bits), Some(group_size)) = (int(obj.get("bits")), int(obj.get("group_size"))) else {
        r.problems.push(format!(
            "{field}: `bits` and `group_size` are required (mlx-lm reads them unconditionally)"
        ));
        return None;
    };
    let default = QuantParams {
        bits,
        group_size,
        mode,
    };
    let mut overrides = BTreeMap::new();
    for (k, v) in obj {
        if matches!(k.as_str(), "bits" | "group_size" | "mode") {
            continue;
        }
        let f = format!("{field}[\"{k}\"]");
        match v {
            Value::Bool(false) => {
                overrides.insert(k.clone(), QuantOverride::Skip(false));
            }
            Value::Bool(true) => {
                r.applied.push(AppliedDefault {
                    field: f,
                    value: json!({"bits": bits, "group_size": group_size, "mode": mode.as_str()}),
                    reason: "`true` quantizes with the default params (nn.quantize)".into(),
                });
                overrides.insert(k.clone(), QuantOverride::Params(default));
            }
            Value::Object(o) => {
                if let Some(extra) = o
                    .keys()
                    .find(|x| !matches!(x.as_str(), "bits" | "group_size" | "mode"))
                {
                    r.problems
                        .push(format!("{f}: key `{extra}` is not supported"));
                    continue;
                }
                // A per-module dict goes to to_quantized(**d): a missing mode is affine
                // (not the default's mode); missing sizes are mx.quantize's mode defaults.
                let Some(m) =
                    quant_mode(r, &f, o.get("mode"), "absent: to_quantized's default mode")
                else {
                    continue;
                };
                let (dg, db) = mode_defaults(m);
                let gs = int(o.get("group_size")).unwrap_or_else(|| {
                    r.applied.push(AppliedDefault {
                        field: format!("{f}.group_size"),
                        value: json!(dg),
                        reason: "absent: mx.quantize default for the mode".into(),
                    });
                    dg
                });
                let b = int(o.get("bits")).unwrap_or_else(|| {
                    r.applied.push(AppliedDefault {
                        field: format!("{f}.bits"),
                        value: json!(db),
                        reason: "absent: mx.quantize default for the mode".into(),
                    });
                    db
                });
                overrides.insert(
                    k.clone(),
                    QuantOverride::Params(QuantParams {
                        bits: b,
                        group_size: gs,
                        mode: m,
                    }),
                );
            }
            other => r
                .problems
                .push(format!("{f}: expected params or false, found {other}")),
        }
    }
    Some(Quantization { default, overrides })
}

/// mlx-optiq's `kv_config.json` list (`[{layer_idx, bits, group_size}]`), entry by entry.
pub(crate) fn read_kv_config(kv: &Value, r: &mut Reader) -> Option<Vec<KvQuantEntry>> {
    let Some(items) = kv.as_array() else {
        r.problems.push(format!(
            "kv_config: expected a JSON list of {{layer_idx, bits, group_size}}, found {kv}"
        ));
        return None;
    };
    let mut out = Vec::new();
    for (i, e) in items.iter().enumerate() {
        let int = |k: &str| {
            e.get(k)
                .and_then(Value::as_u64)
                .and_then(|x| u32::try_from(x).ok())
        };
        let (Some(layer_idx), Some(bits)) = (int("layer_idx"), int("bits")) else {
            r.problems.push(format!(
                "kv_config[{i}]: `layer_idx` and `bits` are required integers"
            ));
            continue;
        };
        let group_size = int("group_size").unwrap_or_else(|| {
            r.applied.push(AppliedDefault {
                field: format!("kv_config[{i}].group_size"),
                value: json!(64),
                reason: "absent: mlx-optiq default".into(),
            });
            64
        });
        out.push(KvQuantEntry {
            layer_idx,
            bits,
            group_size,
        });
    }
    out.sort_by_key(|e| e.layer_idx);
    Some(out)
}

/// What a family's importer gives: its spec and the defaults it applied, or
/// its problems.
pub(crate) type ImportedSpec<S> = Result<(S, Vec<AppliedDefault>), ImportError>;

impl Reader<'_> {
    /// An importer's last step: the problems read so far are the error; else
    /// the spec `build` makes, refused with every issue its family's `check`
    /// finds.
    pub(crate) fn build_checked<S>(
        self,
        check: impl FnOnce(&S) -> Vec<crate::diag::Issue>,
        build: impl FnOnce() -> S,
    ) -> ImportedSpec<S> {
        let applied = self.finish_ok()?;
        let spec = build();
        let issues = check(&spec);
        checked(spec, issues, applied)
    }
}

/// An importer's result: the spec when its family's checks found nothing, else
/// every issue as one problem line (path, what, what was expected, the hint).
fn checked<S>(
    spec: S,
    issues: Vec<crate::diag::Issue>,
    applied: Vec<AppliedDefault>,
) -> ImportedSpec<S> {
    if issues.is_empty() {
        return Ok((spec, applied));
    }
    Err(ImportError {
        problems: issues
            .into_iter()
            .map(|i| {
                format!(
                    "{}: {} (expected {}); hint: {}",
                    i.path, i.message, i.expected, i.hint
                )
            })
            .collect(),
    })
}
