//! A checkpoint's chat template, rendered as transformers'
//! `apply_chat_template(..., tokenize=False)` renders it.
//!
//! transformers compiles the template in a Jinja2 sandbox with
//! `trim_blocks=True, lstrip_blocks=True` (and the default
//! `keep_trailing_newline=False`), adds `raise_exception`, `strftime_now` and a
//! `tojson` that is Python's `json.dumps(ensure_ascii=False)`, and renders with
//! `messages`, `tools=None`, `documents=None`, `add_generation_prompt` and the
//! tokenizer's named special tokens (`bos_token`, `eos_token`, ...) as strings.
//! This module gives minijinja the same environment: Python string methods
//! come from minijinja-contrib's pycompat, and printed values take Python's
//! spelling (`None`, `True`, `['a']`) where minijinja's would differ.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::Serialize;

/// The named special tokens transformers always exposes to templates
/// (`SPECIAL_TOKENS_ATTRIBUTES`), in its order.
const NAMED_SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// One chat turn as templates see it: `{"role": ..., "content": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A compiled chat template with the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `(name, token)` pairs, e.g. `("bos_token", "<bos>")`.
    special_tokens: Vec<(String, String)>,
    /// Where the template came from, for error messages.
    origin: String,
    /// The template's text (what it teaches, e.g. its tool-call markup).
    source: String,
    /// The variables the template reads and does not set itself, found once
    /// when it is compiled.
    reads: std::collections::HashSet<String>,
}

const TEMPLATE_NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source` in transformers' environment.
    pub fn new(
        source: String,
        special_tokens: Vec<(String, String)>,
        origin: String,
    ) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        // Jinja2's from_string never autoescapes.
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_filter("trim", trim);
        env.add_filter("string", |v: Value| Value::from(python_str(&v)));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| format!("{origin}: the chat template does not compile: {e:#}"))?;
        let reads = env
            .get_template(TEMPLATE_NAME)
            .expect("added above")
            .undeclared_variables(false);
        Ok(ChatTemplate {
            env,
            special_tokens,
            origin,
            source,
            reads,
        })
    }

    /// The template's Jinja text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template reads the variable `name` (one it does not set
    /// itself), so that giving it can change the prompt.
    pub fn reads_variable(&self, name: &str) -> bool {
        self.reads.contains(name)
    }

    /// The checkpoint's chat template: `DIR/chat_template.jinja` when present
    /// (it takes priority, as in transformers), else `chat_template` in
    /// `DIR/tokenizer_config.json`. `Ok(None)` when there is neither.
    pub fn load(dir: &Path) -> Result<Option<Self>, String> {
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            read_json(&config_path)?
        } else {
            serde_json::Value::Object(Default::default())
        };
        let jinja_path = dir.join("chat_template.jinja");
        let (source, origin) = if jinja_path.is_file() {
            let text = std::fs::read_to_string(&jinja_path)
                .map_err(|e| format!("cannot read {}: {e}", jinja_path.display()))?;
            (text, jinja_path.display().to_string())
        } else {
            match template_in_config(&config, &config_path)? {
                Some(text) => (text, format!("{} (chat_template)", config_path.display())),
                None => return Ok(None),
            }
        };
        let special_tokens = special_tokens(dir, &config, &config_path)?;
        Self::new(source, special_tokens, origin).map(Some)
    }

    /// Renders `messages` (a list of message maps, as transformers takes
    /// them) with extra template variables (like `enable_thinking`), which
    /// override the special tokens of the same name as transformers' kwargs do.
    pub fn render_values(
        &self,
        messages: Value,
        add_generation_prompt: bool,
        extra: &[(String, Value)],
    ) -> Result<String, String> {
        self.render_with_tools(messages, Value::from(()), add_generation_prompt, extra)
    }

    /// `render_values` with `tools`: the list of tool (function) schemas, as
    /// `apply_chat_template(messages, tools=...)` passes it (None for none).
    pub fn render_with_tools(
        &self,
        messages: Value,
        tools: Value,
        add_generation_prompt: bool,
        extra: &[(String, Value)],
    ) -> Result<String, String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .expect("added in new()");
        let mut context: Vec<(String, Value)> = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        context.extend(extra.iter().cloned());
        context.push(("messages".into(), normalize_messages(messages)?));
        context.push(("tools".into(), tools));
        context.push(("documents".into(), Value::from(())));
        context.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        let context: Value = context.into_iter().collect();
        template.render(context).map_err(|e| {
            format!(
                "{}: the chat template failed: {}",
                self.origin,
                describe(&e)
            )
        })
    }
}

/// Messages as transformers hands them to the template: each a map, with
/// the keys whose value is None dropped (templates handle a missing
/// `content` or `tool_calls`, not a None one).
fn normalize_messages(messages: Value) -> Result<Value, String> {
    let items = messages
        .try_iter()
        .map_err(|_| "messages must be a list of maps".to_string())?;
    let mut out = Vec::new();
    for (i, message) in items.enumerate() {
        if message.kind() != ValueKind::Map {
            return Err(format!(
                "messages[{i}] must be a map with role and content, not {}",
                message.kind()
            ));
        }
        let keys: Vec<Value> = message
            .try_iter()
            .map_err(|e| format!("messages[{i}]: {e}"))?
            .collect();
        let kept: Value = keys
            .into_iter()
            .filter_map(|k| {
                let v = message.get_item(&k).unwrap_or_default();
                (!v.is_none()).then_some((k, v))
            })
            .collect();
        out.push(kept);
    }
    Ok(Value::from(out))
}

/// A template error: `raise_exception`'s message as the template wrote it,
/// anything else with its line.
fn describe(e: &Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) if e.name().is_some() => {
            let line = e.line().map(|l| format!(" (line {l})")).unwrap_or_default();
            format!("{detail}{line}")
        }
        _ => format!("{e:#}"),
    }
}

/// A JSON file, with `file:line:col` in a parse error (config.json,
/// generation_config.json, tokenizer_config.json).
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}:{}:{}: invalid JSON: {e}",
            path.display(),
            e.line(),
            e.column()
        )
    })
}

/// `chat_template` in tokenizer_config.json: a string, or (an older form)
/// a list of `{"name", "template"}` of which transformers uses "default".
fn template_in_config(config: &serde_json::Value, path: &Path) -> Result<Option<String>, String> {
    match config.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(items)) => {
            let named = items.iter().find(|item| {
                item.get("name").and_then(|n| n.as_str()) == Some("default")
            });
            match named.and_then(|item| item.get("template")).and_then(|t| t.as_str()) {
                Some(t) => Ok(Some(t.to_string())),
                None => Err(format!(
                    "{}: chat_template is a list of named templates without a \"default\" one; \
                     add {{\"name\": \"default\", \"template\": ...}}",
                    path.display()
                )),
            }
        }
        Some(_) => Err(format!(
            "{}: chat_template must be a string (a Jinja template) or a list of {{\"name\", \"template\"}}",
            path.display()
        )),
    }
}

/// A special token's text: a string, or an AddedToken object's `content`.
fn token_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}

/// The special tokens transformers passes to the template: the named ones
/// from tokenizer_config.json (overridden by a legacy special_tokens_map.json
/// when the config has no `added_tokens_decoder`, as transformers does), then
/// model-specific ones (`extra_special_tokens` given as a map, and any other
/// top-level `*_token` string such as Gemma 3's `boi_token`).
fn special_tokens(
    dir: &Path,
    config: &serde_json::Value,
    config_path: &Path,
) -> Result<Vec<(String, String)>, String> {
    let mut merged = config.as_object().cloned().unwrap_or_default();
    let legacy: PathBuf = dir.join("special_tokens_map.json");
    if !merged.contains_key("added_tokens_decoder") && legacy.is_file() {
        if let serde_json::Value::Object(map) = read_json(&legacy)? {
            merged.extend(map);
        }
    }
    let mut out = Vec::new();
    for name in NAMED_SPECIAL_TOKENS {
        match merged.get(name) {
            None | Some(serde_json::Value::Null) => {}
            Some(v) => match token_text(v) {
                Some(t) => out.push((name.to_string(), t)),
                None => {
                    return Err(format!(
                        "{}: {name} must be a string or an object with \"content\"",
                        config_path.display()
                    ))
                }
            },
        }
    }
    if let Some(serde_json::Value::Object(extra)) = merged.get("extra_special_tokens") {
        for (name, v) in extra {
            if let Some(t) = token_text(v) {
                out.push((name.clone(), t));
            }
        }
    }
    for (name, v) in &merged {
        let is_extra_named = name.ends_with("_token")
            && !NAMED_SPECIAL_TOKENS.contains(&name.as_str())
            && !out.iter().any(|(n, _)| n == name);
        if let (true, serde_json::Value::String(t)) = (is_extra_named, v) {
            out.push((name.clone(), t.clone()));
        }
    }
    Ok(out)
}

/// Jinja2's `trim`: Python's `str(value).strip(chars)`, so a list's text is
/// its Python repr.
fn trim(value: Value, chars: Option<String>) -> Value {
    let text = python_str(&value);
    let trimmed = match &chars {
        Some(chars) => text.trim_matches(|c| chars.contains(c)),
        None => text.trim(),
    };
    Value::from(trimmed)
}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: local time, as Python's `datetime.now().strftime`.
fn strftime_now(format: String) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: '{format}' is not a valid strftime format"),
        ));
    }
    Ok(Value::from(
        chrono::Local::now()
            .format_with_items(items.into_iter())
            .to_string(),
    ))
}

/// Prints values as Jinja2 under Python does: `None`, `True`/`False`, and
/// Python's repr for lists and dicts.
fn python_formatter(
    out: &mut minijinja::Output,
    _state: &minijinja::State,
    value: &Value,
) -> Result<(), Error> {
    let text = match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => return write!(out, "{value}").map_err(Error::from),
        _ => python_str(value),
    };
    out.write_str(&text).map_err(Error::from)
}

/// Python's `str()` of a value (a string is itself).
fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        _ => python_repr(value),
    }
}

/// Python's `repr()` of a value.
fn python_repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => "None".into(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => match f64::try_from(value.clone()) {
            Ok(f) if value.as_i64().is_none() => python_float(f),
            _ => value.to_string(),
        },
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            let quote = if s.contains('\'') && !s.contains('"') {
                '"'
            } else {
                '\''
            };
            let mut r = String::new();
            r.push(quote);
            for c in s.chars() {
                match c {
                    '\\' => r.push_str("\\\\"),
                    '\n' => r.push_str("\\n"),
                    '\r' => r.push_str("\\r"),
                    '\t' => r.push_str("\\t"),
                    c if c == quote => {
                        r.push('\\');
                        r.push(c);
                    }
                    c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                        let _ = write!(r, "\\x{:02x}", c as u32);
                    }
                    c => r.push(c),
                }
            }
            r.push(quote);
            r
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> = value
                .try_iter()
                .map(|it| it.map(|v| python_repr(&v)).collect())
                .unwrap_or_default();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = value
                .try_iter()
                .map(|it| {
                    it.map(|k| {
                        let v = value.get_item(&k).unwrap_or_default();
                        format!("{}: {}", python_repr(&k), python_repr(&v))
                    })
                    .collect()
                })
                .unwrap_or_default();
            format!("{{{}}}", items.join(", "))
        }
        _ => value.to_string(),
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional
/// for exponents in [-4, 16), else `d.ddde+XX`.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.25e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            s + ".0"
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// Python's `json.dumps` float: repr, with NaN/Infinity spelled as JSON5.
fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        python_float(f)
    }
}

/// How `tojson` lays JSON out: Python's `json.dumps` options.
struct JsonStyle {
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, each overridable by a
/// keyword argument.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.kind(), v.as_i64()) {
            (ValueKind::Number, Some(n)) => Some(" ".repeat(n.max(0) as usize)),
            (ValueKind::String, _) => Some(v.as_str().unwrap_or_default().to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let separators: Option<Value> = kwargs.get("separators")?;
    let (item_separator, key_separator) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|p| p.as_str().map(String::from))
                .collect::<Option<_>>()
                .unwrap_or_default();
            match parts.as_slice() {
                [item, key] => (item.clone(), key.clone()),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
        // Python's default: ", " without indent, "," with one.
        _ if indent.is_some() => (",".into(), ": ".into()),
        _ => (", ".into(), ": ".into()),
    };
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, &value, &style, 0)?;
    Ok(Value::from(out))
}

fn write_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A map key as json.dumps turns it into a string.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Number => Ok(python_repr(key)),
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "tojson: keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

fn newline_indent(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match value.as_i64() {
            Some(_) => out.push_str(&value.to_string()),
            None => match f64::try_from(value.clone()) {
                Ok(f) => out.push_str(&json_float(f)),
                Err(_) => out.push_str(&value.to_string()),
            },
        },
        ValueKind::String => {
            write_json_string(out, value.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline_indent(out, style, depth + 1);
                write_json(out, item, style, depth + 1)?;
            }
            newline_indent(out, style, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline_indent(out, style, depth + 1);
                write_json_string(out, key, style.ensure_ascii);
                out.push_str(&style.key_separator);
                write_json(out, item, style, depth + 1)?;
            }
            newline_indent(out, style, depth);
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Every fixture template (tests/fixtures/chat_templates: Gemma 2, 3 and
    //! 4, Qwen2.5, Qwen3, Llama 3 and 3.2, and a probe of Python-isms) rendered
    //! here and by transformers' `apply_chat_template(tokenize=False)` in the
    //! venv (one Python process for all cases) must agree byte for byte, and a
    //! template that raises must raise in both. gemma4.jinja is the
    //! template of Google's Gemma-4 instruction-tuned checkpoints as
    //! llama.cpp keeps it (models/templates/gemma4.jinja, commit 75f1ba7),
    //! byte for byte: its macros, namespaces and `dictsort` over tool schemas
    //! are what a request's `tools` goes through.

    use super::*;
    use serde_json::json;

    fn fixture(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/chat_templates")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// A WordLevel tokenizer.json that knows `specials` (transformers loads
    /// the directory with AutoTokenizer, which needs one).
    fn write_tokenizer(dir: &Path, specials: &[&str]) {
        use tokenizers::models::wordlevel::WordLevel;
        use tokenizers::Tokenizer;
        let mut vocab: Vec<String> = vec!["<unk>".into(), "hello".into()];
        vocab.extend(specials.iter().map(|s| s.to_string()));
        vocab.dedup();
        let model = WordLevel::builder()
            .vocab(
                vocab
                    .into_iter()
                    .enumerate()
                    .map(|(i, w)| (w, i as u32))
                    .collect(),
            )
            .unk_token("<unk>".into())
            .build()
            .unwrap();
        Tokenizer::new(model)
            .save(dir.join("tokenizer.json"), false)
            .unwrap();
    }

    struct Family {
        dir: &'static str,
        template: &'static str,
        /// tokenizer_config.json without chat_template.
        config: serde_json::Value,
        /// Ship the template as chat_template.jinja (with a decoy in the
        /// config, which must lose).
        as_jinja_file: bool,
    }

    fn added(content: &str) -> serde_json::Value {
        json!({"__type": "AddedToken", "content": content, "lstrip": false,
               "normalized": false, "rstrip": false, "single_word": false})
    }

    fn families() -> Vec<Family> {
        vec![
            Family {
                dir: "gemma2",
                template: "gemma2.jinja",
                config: json!({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}),
                as_jinja_file: false,
            },
            Family {
                dir: "gemma3",
                template: "gemma3.jinja",
                config: json!({"bos_token": added("<bos>"), "eos_token": added("<eos>"),
                               "pad_token": "<pad>", "boi_token": "<start_of_image>"}),
                as_jinja_file: true,
            },
            Family {
                dir: "qwen2.5",
                template: "qwen2.5.jinja",
                config: json!({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
                as_jinja_file: false,
            },
            Family {
                dir: "qwen3",
                template: "qwen3.jinja",
                config: json!({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
                as_jinja_file: true,
            },
            Family {
                dir: "llama3",
                template: "llama3.jinja",
                config: json!({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
                as_jinja_file: false,
            },
            Family {
                dir: "llama3.2",
                template: "llama3.2.jinja",
                config: json!({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
                as_jinja_file: false,
            },
            Family {
                dir: "gemma4",
                template: "gemma4.jinja",
                config: json!({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
                as_jinja_file: true,
            },
            Family {
                dir: "probe",
                template: "probe.jinja",
                config: json!({"bos_token": "<s>", "eos_token": added("</s>"), "pad_token": "<pad>",
                               "extra_special_tokens": {"image_token": "<img>"}, "audio_token": "<aud>"}),
                as_jinja_file: false,
            },
        ]
    }

    /// Conversations as JSON text, so that each map keeps the key order
    /// written here (Python dicts keep it; so must archgen).
    fn conversations() -> Vec<(&'static str, &'static str)> {
        vec![
            ("hello", r#"[{"role": "user", "content": "Hello!"}]"#),
            (
                "multi",
                r#"[
                {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "  Tell me a joke.\n"}]"#,
            ),
            (
                "system",
                r#"[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": " Hello. "},
                {"role": "user", "content": "Tell me a joke."}]"#,
            ),
            (
                "unicode",
                r#"[
                {"content": "Réponds en français. \"Quotes\" & <tags> {braces}", "role": "system"},
                {"role": "user", "content": "Grüße, 世界! 👋\ttab\\backslash\u0001"}]"#,
            ),
            (
                "thinking",
                r#"[
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
                {"role": "user", "content": "and 3+3?"},
                {"role": "assistant", "content": "<think>\nsame again\n</think>\n\n6", "reasoning_content": null}]"#,
            ),
            (
                "tools",
                r#"[
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                    "name": "get_weather",
                    "arguments": {"units": "celsius", "city": "Paris", "days": [1, 2], "ratio": 0.5,
                                  "big": 1e20, "small": 1.5e-7, "ok": true, "note": null, "é": "ü\"\n"}}}]},
                {"role": "tool", "content": "{\"temp\": 21}"},
                {"role": "user", "content": "Thanks"}]"#,
            ),
            (
                // Tools declared as the server passes an OpenAI request's
                // `tools` (nested objects, enums, arrays, a type list), with
                // a history that calls one and hears back.
                "declared_tools",
                r#"[
                {"role": "system", "content": "Use the tools."},
                {"role": "user", "content": "Weather in Paris and Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                    "name": "get_weather", "arguments": {"city": "Paris", "days": 2, "units": "celsius"}}}]},
                {"role": "tool", "content": "{\"temp\": 21}"},
                {"role": "assistant", "content": "<|channel>thought\nOslo next<channel|>Paris: 21."},
                {"role": "user", "content": "And Oslo?"}]"#,
            ),
            (
                "parts",
                r#"[
                {"role": "user", "content": [{"type": "text", "text": " Look: "}, {"type": "image"}]}]"#,
            ),
            (
                "not_alternating",
                r#"[
                {"role": "user", "content": "one"},
                {"role": "user", "content": "two"}]"#,
            ),
        ]
    }

    /// An OpenAI request's `tools`, shaped to reach each branch of the
    /// Gemma-4 template's declaration macros (nested object, enum, array of
    /// objects, a type list, nullable) and the others' `tojson`.
    fn declared_tools() -> serde_json::Value {
        json!([
            {"type": "function", "function": {
                "name": "get_weather", "description": "The weather in a city.",
                "parameters": {"type": "object", "required": ["city"], "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": ["integer", "null"], "nullable": true},
                    "where": {"type": "object", "description": "Coordinates",
                              "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                              "required": ["lat"]},
                    "stops": {"type": "array", "items": {"type": "object",
                              "properties": {"name": {"type": "string"}}, "required": ["name"]}}}}}},
            {"type": "function", "function": {
                "name": "now", "description": "The time.",
                "parameters": {"type": "object", "properties": {}}}}
        ])
    }

    #[test]
    fn templates_render_as_transformers_does() {
        let root = tempfile::tempdir().unwrap();
        let mut cases = Vec::new();
        for family in families() {
            let dir = root.path().join(family.dir);
            std::fs::create_dir(&dir).unwrap();
            let template = fixture(family.template);
            let mut config = family.config.clone();
            if family.as_jinja_file {
                std::fs::write(dir.join("chat_template.jinja"), &template).unwrap();
                config["chat_template"] = json!("DECOY {{ messages }}");
            } else {
                config["chat_template"] = json!(template);
            }
            std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
            let specials: Vec<&str> = [
                "<bos>",
                "<eos>",
                "<pad>",
                "<|im_end|>",
                "<|endoftext|>",
                "<s>",
                "</s>",
            ]
            .to_vec();
            write_tokenizer(&dir, &specials);
            for (name, messages) in conversations() {
                for add_generation_prompt in [true, false] {
                    let kwargs = match (family.dir, name) {
                        ("qwen3", "multi") => json!({"enable_thinking": false}),
                        ("gemma4", "multi") => json!({"enable_thinking": true}),
                        (_, "declared_tools") => json!({"tools": declared_tools()}),
                        _ => json!({}),
                    };
                    cases.push((
                        family.dir,
                        name,
                        dir.clone(),
                        messages,
                        add_generation_prompt,
                        kwargs,
                    ));
                }
            }
        }
        // Written by hand so that the messages reach Python in their order.
        let request: Vec<String> = cases
            .iter()
            .map(|(_, _, dir, messages, agp, kwargs)| {
                format!(
                    r#"{{"dir": {}, "messages": {messages}, "add_generation_prompt": {agp}, "kwargs": {kwargs}}}"#,
                    json!(dir)
                )
            })
            .collect();
        let request_path = root.path().join("cases.json");
        std::fs::write(&request_path, format!("[{}]", request.join(",\n"))).unwrap();
        let out = archgen_tests::run_python("chat_template_oracle.py", &[request_path.as_os_str()]);
        let expected: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        assert_eq!(expected.len(), cases.len());

        let mut rendered = 0;
        let mut raised = 0;
        let mut failures = Vec::new();
        for ((family, name, dir, messages, agp, kwargs), want) in cases.iter().zip(&expected) {
            let template = ChatTemplate::load(dir).unwrap().expect("a template");
            // Through serde_json's text so that map order stays as written.
            let messages: Value = serde_json::from_str(messages).unwrap();
            // `tools` goes where the server puts a request's tools; the
            // rest are extra template variables.
            let tools = kwargs
                .get("tools")
                .map_or(Value::from(()), Value::from_serialize);
            let extra: Vec<(String, Value)> = kwargs
                .as_object()
                .unwrap()
                .iter()
                .filter(|(k, _)| k.as_str() != "tools")
                .map(|(k, v)| (k.clone(), Value::from_serialize(v)))
                .collect();
            let got = template.render_with_tools(messages, tools, *agp, &extra);
            let what = format!("{family} / {name} / add_generation_prompt={agp}");
            match (want.get("text").and_then(|t| t.as_str()), got) {
                (Some(want), Ok(got)) if got == want => rendered += 1,
                (Some(want), Ok(got)) => failures.push(format!(
                    "{what}: differs from transformers\n  archgen: {got:?}\n  python:  {want:?}"
                )),
                (None, Err(e)) => {
                    let python = want["error"].as_str().unwrap();
                    // raise_exception's message reaches the user in both.
                    let message = python.split_once(": ").map(|(_, m)| m).unwrap_or(python);
                    if python.starts_with("TemplateError") && !e.contains(message) {
                        failures.push(format!("{what}: expected '{message}' in: {e}"));
                    }
                    raised += 1;
                }
                (Some(_), Err(e)) => failures.push(format!(
                    "{what}: transformers renders it, archgen fails: {e}"
                )),
                (None, Ok(got)) => failures.push(format!(
                    "{what}: transformers fails ({}), archgen renders:\n{got}",
                    want["error"]
                )),
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} cases differ:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
        eprintln!("{rendered} renders equal to transformers, {raised} refusals in both");
        // Most cases render; the alternation and system-role checks refuse.
        assert!(
            rendered >= 80 && raised >= 6,
            "{rendered} rendered, {raised} raised"
        );
    }
}
