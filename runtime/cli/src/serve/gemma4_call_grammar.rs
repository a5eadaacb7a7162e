//! The grammar of one Gemma 4 tool call, `<|tool_call>call:NAME{ARGS}<tool_call|>`,
//! with ARGS valid against the tool's `parameters` schema: what a
//! `tool_choice` "required" or named function holds a Gemma 4 model's
//! answer to.
//!
//! Gemma 4 writes arguments in its own syntax, not JSON (gemma4.py's
//! `_gemma4_args_to_json` reads it, and so does tools.rs): keys are
//! bare words, strings sit between `<|"|>` delimiters, numbers, `true`,
//! `false`, `null`, arrays and objects are written as in JSON, with no
//! whitespace. llguidance's JSON-schema compiler writes JSON, so this module
//! translates the parameters schema into Lark rules of that syntax itself.
//! It covers the schema keywords tool definitions use: `type` (one or a
//! list), `properties` with `required`, `items`, `enum`, `const`,
//! `anyOf`/`oneOf`, `minLength`/`maxLength`, `minItems`, and integer
//! `minimum`/`maximum`. Any other keyword that constrains a value is
//! refused with its path, rather than ignored: the answer must satisfy the
//! whole schema.
//!
//! What the grammar writes, so that the answer always closes: the required
//! properties only, in the order `properties` lists them; strings of at
//! most `maxLength` characters (256 when the schema gives none), none of
//! them `<` (it starts Gemma's string delimiter); integers in their range
//! written out when the range is small.

use llguidance::api::TopLevelGrammar;
use serde_json::{Map, Value};

use super::tools::GEMMA4_QUOTE;
use crate::constrained::{lark_literal, CallableTool};
/// The longest string the grammar writes when the schema gives no
/// `maxLength`.
const DEFAULT_MAX_LENGTH: u64 = 256;
/// Integer ranges up to this many values are written out as alternatives.
const LISTED_INTEGERS: i64 = 64;
/// Keywords that only describe a value: nothing to hold the answer to.
const DESCRIPTIVE: &[&str] = &[
    "type",
    "description",
    "title",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "additionalProperties",
    "strict",
];

/// Where in a tool's parameters a schema could not be translated, and why.
#[derive(Debug, PartialEq, Eq)]
pub struct Untranslatable {
    /// The tool's index in the callable tools.
    pub tool: usize,
    /// The JSON path inside its `parameters` (`.properties.city`).
    pub path: String,
    pub message: String,
}

/// The grammar of one call of one of `tools` between `start` and `end`.
pub fn gemma4_call_grammar(
    start: &str,
    end: &str,
    tools: &[CallableTool],
) -> Result<TopLevelGrammar, Untranslatable> {
    let mut rules = Rules::default();
    let mut calls = Vec::with_capacity(tools.len());
    for (tool, callable) in tools.iter().enumerate() {
        let args = rules
            .object_or_any(&callable.parameters, "")
            .map_err(|(path, message)| Untranslatable {
                tool,
                path,
                message,
            })?;
        calls.push(format!(
            "{} {args}",
            lark_literal(&format!("call:{}", callable.name))
        ));
    }
    let mut lark = format!(
        "start: {} call {}\ncall: {}\n",
        lark_literal(start),
        lark_literal(end),
        calls.join(" | ")
    );
    for rule in &rules.written {
        lark.push_str(rule);
        lark.push('\n');
    }
    Ok(TopLevelGrammar::from_lark(lark))
}

/// `value` as Gemma writes it, as a Lark literal.
fn value_literal(value: &Value) -> Result<String, String> {
    match value {
        Value::String(text) if text.contains('<') => Err(format!(
            "the value {value} holds '<', which Gemma 4's strings cannot be written with here"
        )),
        Value::String(text) => Ok(lark_literal(&format!("{GEMMA4_QUOTE}{text}{GEMMA4_QUOTE}"))),
        Value::Number(_) | Value::Bool(_) | Value::Null => Ok(lark_literal(&value.to_string())),
        Value::Array(_) | Value::Object(_) => Err(format!(
            "an enum or const value {value} that is not a scalar"
        )),
    }
}

/// Lark rules written so far, each named `v{n}`.
#[derive(Default)]
struct Rules {
    written: Vec<String>,
    /// The rule of any value, once written.
    any: Option<String>,
}

type Translated = Result<String, (String, String)>;

impl Rules {
    /// A new rule with `body`; its name.
    fn rule(&mut self, body: String) -> String {
        let name = format!("v{}", self.written.len());
        self.written.push(format!("{name}: {body}"));
        name
    }

    /// Any Gemma value (a schema of `{}`): strings, numbers, literals,
    /// arrays and objects of any values.
    fn any(&mut self) -> String {
        if let Some(any) = &self.any {
            return any.clone();
        }
        let any = format!("v{}", self.written.len());
        self.any = Some(any.clone());
        let string = self.string(0, DEFAULT_MAX_LENGTH);
        let number = self.number(false);
        self.written.push(format!(
            "{any}: {string} | {number} | \"true\" | \"false\" | \"null\" \
             | \"[\" ({any} (\",\" {any})*)? \"]\" \
             | \"{{\" (/[A-Za-z_][A-Za-z0-9_]{{0,63}}/ \":\" {any} (\",\" /[A-Za-z_][A-Za-z0-9_]{{0,63}}/ \":\" {any})*)? \"}}\""
        ));
        any
    }

    fn string(&mut self, min: u64, max: u64) -> String {
        self.rule(format!(
            "{q} /[^<]{{{min},{max}}}/ {q}",
            q = lark_literal(GEMMA4_QUOTE)
        ))
    }

    fn number(&mut self, integer: bool) -> String {
        match integer {
            true => self.rule("/-?(0|[1-9][0-9]{0,17})/".into()),
            false => {
                self.rule("/-?(0|[1-9][0-9]{0,17})(\\.[0-9]{1,17})?([eE][-+]?[0-9]{1,3})?/".into())
            }
        }
    }

    /// The parameters of a tool: an object schema, or none (no arguments).
    fn object_or_any(&mut self, schema: &Value, path: &str) -> Translated {
        match schema.as_object() {
            Some(object) if object.is_empty() => Ok(self.rule("\"{\" \"}\"".into())),
            _ => self.value(schema, path),
        }
    }

    /// The rule of a value valid against `schema`, at `path`.
    fn value(&mut self, schema: &Value, path: &str) -> Translated {
        let refuse = |message: String| Err((path.to_string(), message));
        let object = match schema {
            Value::Bool(true) => return Ok(self.any()),
            Value::Object(object) => object,
            _ => return refuse(format!("expected a schema object, got {schema}")),
        };
        if let Some(values) = object.get("enum") {
            let Some(values) = values.as_array().filter(|v| !v.is_empty()) else {
                return refuse("enum must be a non-empty list".into());
            };
            let alternatives: Result<Vec<String>, String> =
                values.iter().map(value_literal).collect();
            return match alternatives {
                Ok(alternatives) => Ok(self.rule(alternatives.join(" | "))),
                Err(message) => Err((format!("{path}.enum"), message)),
            };
        }
        if let Some(value) = object.get("const") {
            return match value_literal(value) {
                Ok(one) => Ok(self.rule(one)),
                Err(message) => Err((format!("{path}.const"), message)),
            };
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(options) = object.get(keyword) {
                let Some(options) = options.as_array().filter(|v| !v.is_empty()) else {
                    return refuse(format!("{keyword} must be a non-empty list"));
                };
                let mut alternatives = Vec::with_capacity(options.len());
                for (i, option) in options.iter().enumerate() {
                    alternatives.push(self.value(option, &format!("{path}.{keyword}[{i}]"))?);
                }
                return Ok(self.rule(alternatives.join(" | ")));
            }
        }
        let handled = |keyword: &str| {
            DESCRIPTIVE.contains(&keyword)
                || matches!(
                    keyword,
                    "properties"
                        | "required"
                        | "items"
                        | "minItems"
                        | "minLength"
                        | "maxLength"
                        | "minimum"
                        | "maximum"
                )
        };
        if let Some(keyword) = object.keys().find(|k| !handled(k)) {
            return Err((
                format!("{path}.{keyword}"),
                format!(
                    "{keyword} is not served for Gemma 4's tool-call syntax (served: type, \
                     properties, required, items, enum, const, anyOf, oneOf, minLength, \
                     maxLength, minItems, integer minimum and maximum)"
                ),
            ));
        }
        let types: Vec<&str> = match object.get("type") {
            None => return Ok(self.any()),
            Some(Value::String(one)) => vec![one.as_str()],
            Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
            Some(other) => return refuse(format!("type must be a name or a list, got {other}")),
        };
        let mut alternatives = Vec::with_capacity(types.len());
        for kind in types {
            alternatives.push(self.of_type(kind, object, path)?);
        }
        Ok(self.rule(alternatives.join(" | ")))
    }

    fn of_type(&mut self, kind: &str, object: &Map<String, Value>, path: &str) -> Translated {
        let bound = |key: &str| object.get(key).and_then(Value::as_u64);
        match kind {
            "string" => {
                let min = bound("minLength").unwrap_or(0);
                let max = bound("maxLength").unwrap_or(DEFAULT_MAX_LENGTH.max(min));
                match min <= max {
                    true => Ok(self.string(min, max)),
                    false => Err((
                        path.to_string(),
                        format!("minLength ({min}) is greater than maxLength ({max})"),
                    )),
                }
            }
            "integer" => {
                let low = object.get("minimum").and_then(Value::as_i64);
                let high = object.get("maximum").and_then(Value::as_i64);
                match (low, high) {
                    (Some(low), Some(high)) if low > high => Err((
                        path.to_string(),
                        format!("minimum ({low}) is greater than maximum ({high})"),
                    )),
                    (Some(low), Some(high)) if high - low < LISTED_INTEGERS => Ok(self.rule(
                        (low..=high)
                            .map(|n| lark_literal(&n.to_string()))
                            .collect::<Vec<_>>()
                            .join(" | "),
                    )),
                    (None, None) => Ok(self.number(true)),
                    _ => Err((
                        path.to_string(),
                        format!(
                            "an integer range of more than {LISTED_INTEGERS} values, or open on \
                             one side, is not served for Gemma 4's tool-call syntax"
                        ),
                    )),
                }
            }
            "number" if object.contains_key("minimum") || object.contains_key("maximum") => Err((
                path.to_string(),
                "a number range is not served for Gemma 4's tool-call syntax".into(),
            )),
            "number" => Ok(self.number(false)),
            "boolean" => Ok(self.rule("\"true\" | \"false\"".into())),
            "null" => Ok(self.rule("\"null\"".into())),
            "array" => {
                let item = match object.get("items") {
                    None => self.any(),
                    Some(items) => self.value(items, &format!("{path}.items"))?,
                };
                Ok(self.rule(match bound("minItems").unwrap_or(0) {
                    0 => format!("\"[\" ({item} (\",\" {item})*)? \"]\""),
                    _ => format!("\"[\" {item} (\",\" {item})* \"]\""),
                }))
            }
            "object" => self.object(object, path),
            other => Err((path.to_string(), format!("unknown type \"{other}\""))),
        }
    }

    /// `{key:value,...}` of the required properties, in `properties`' order.
    fn object(&mut self, object: &Map<String, Value>, path: &str) -> Translated {
        let required: Vec<&str> = object
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let empty = Map::new();
        let properties = object
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        if let Some(missing) = required
            .iter()
            .find(|name| !properties.contains_key(**name))
        {
            return Err((
                format!("{path}.required"),
                format!("\"{missing}\" is required but not among properties"),
            ));
        }
        let mut fields = Vec::new();
        for (name, schema) in properties {
            if !required.contains(&name.as_str()) {
                continue;
            }
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err((
                    format!("{path}.properties.{name}"),
                    "Gemma 4 writes keys bare: a property name must be letters, digits and _"
                        .into(),
                ));
            }
            let value = self.value(schema, &format!("{path}.properties.{name}"))?;
            fields.push(format!("{} {value}", lark_literal(&format!("{name}:"))));
        }
        Ok(self.rule(format!("\"{{\" {} \"}}\"", fields.join(" \",\" "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, parameters: Value) -> CallableTool {
        CallableTool {
            name: name.into(),
            parameters,
        }
    }

    fn lark(tools: &[CallableTool]) -> String {
        let grammar = gemma4_call_grammar("<|tool_call>", "<tool_call|>", tools).unwrap();
        serde_json::to_value(&grammar).unwrap()["grammars"][0]["lark_grammar"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn writes_the_required_properties_in_gemmas_syntax() {
        let text = lark(&[tool(
            "get_weather",
            json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 3}},
                "required": ["city", "days"]}),
        )]);
        assert!(
            text.starts_with("start: \"<|tool_call>\" call \"<tool_call|>\"\n"),
            "{text}"
        );
        assert!(text.contains("\"call:get_weather\""), "{text}");
        assert!(text.contains("/[^<]{0,8}/"), "{text}");
        assert!(text.contains("\"1\" | \"2\" | \"3\""), "{text}");
        assert!(
            text.contains("\"city:\"") && text.contains("\"days:\""),
            "{text}"
        );
        // Optional properties are not written.
        assert!(!text.contains("unit:"), "{text}");
    }

    #[test]
    fn refuses_what_it_cannot_hold_the_answer_to_with_the_path() {
        let refused = |parameters: Value| {
            gemma4_call_grammar(
                "<s>",
                "</s>",
                &[tool("a", json!({})), tool("f", parameters)],
            )
            .err()
            .unwrap()
        };
        let pattern = refused(json!({"type": "object", "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]+$"}}, "required": ["code"]}));
        assert_eq!(pattern.tool, 1);
        assert_eq!(pattern.path, ".properties.code.pattern");
        let key = refused(json!({"type": "object", "properties": {
            "city-name": {"type": "string"}}, "required": ["city-name"]}));
        assert_eq!(key.path, ".properties.city-name");
        let range = refused(json!({"type": "integer", "minimum": 0}));
        assert!(
            range.message.contains("open on one side"),
            "{}",
            range.message
        );
        let missing = refused(json!({"type": "object", "properties": {}, "required": ["x"]}));
        assert_eq!(missing.path, ".required");
    }
}
