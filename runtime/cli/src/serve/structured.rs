//! Structured output of /v1/chat/completions: `response_format` (one JSON
//! object, or a JSON value valid against a schema) and `tool_choice`
//! ("required", or a named function: one tool call the tool parser reads),
//! each turned into an output grammar ([`crate::constrained`]) that masks
//! the sampler's tokens.
//!
//! Everything a client can get wrong is refused here with a 400 naming the
//! field: a function not among `tools`, a tool without a name, a schema
//! llguidance cannot compile (its message, under
//! `response_format.json_schema.schema` or `tools[i].function.parameters`).

use serde_json::{json, Value};

use super::error::ApiError;
use super::gemma4_call_grammar::gemma4_call_grammar;
use super::tools::ToolFormat;
use crate::constrained::{
    hermes_call_grammar, json_grammar, json_object_grammar, CallableTool, GrammarCompiler,
    TokenConstraint,
};

/// What `response_format` asks of the answer.
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// One JSON object.
    JsonObject,
    /// One JSON value valid against this schema (`json_schema.schema`).
    JsonSchema(Value),
}

const RESPONSE_FORMAT_VALUES: &str = "give {\"type\": \"text\"}, {\"type\": \"json_object\"} or \
     {\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}";

impl ResponseFormat {
    /// The request's `response_format` (absent: text). `json_schema`'s
    /// `name` is required (as OpenAI requires it), `description` and
    /// `strict` are accepted (the schema is enforced either way).
    pub fn of_request(format: Option<&Value>) -> Result<Self, ApiError> {
        let bad = |path: &str, message: String| {
            ApiError::bad_request(format!("{path}: {message}"), Some(path))
        };
        let Some(format) = format else {
            return Ok(ResponseFormat::Text);
        };
        let Some(object) = format.as_object() else {
            return Err(bad(
                "response_format",
                format!("expected an object; {RESPONSE_FORMAT_VALUES}"),
            ));
        };
        match object.get("type").and_then(Value::as_str) {
            Some("text") => Ok(ResponseFormat::Text),
            Some("json_object") => Ok(ResponseFormat::JsonObject),
            Some("json_schema") => {
                let Some(spec) = object.get("json_schema").and_then(Value::as_object) else {
                    return Err(bad(
                        "response_format.json_schema",
                        "expected an object like {\"name\": ..., \"schema\": {...}}".into(),
                    ));
                };
                if !spec.get("name").is_some_and(Value::is_string) {
                    return Err(bad(
                        "response_format.json_schema.name",
                        "expected the schema's name (a string)".into(),
                    ));
                }
                match spec.get("schema") {
                    Some(schema @ Value::Object(_)) => {
                        Ok(ResponseFormat::JsonSchema(schema.clone()))
                    }
                    Some(_) => Err(bad(
                        "response_format.json_schema.schema",
                        "expected a JSON schema object".into(),
                    )),
                    None => Err(bad(
                        "response_format.json_schema.schema",
                        "give the JSON schema the answer must follow".into(),
                    )),
                }
            }
            Some(other) => Err(bad(
                "response_format.type",
                format!("\"{other}\" is not a response format; {RESPONSE_FORMAT_VALUES}"),
            )),
            None => Err(bad(
                "response_format.type",
                format!("expected a string; {RESPONSE_FORMAT_VALUES}"),
            )),
        }
    }
}

/// What `tool_choice` asks of the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Text or tool calls, as the model writes (the default).
    Auto,
    /// Text only: the model is not told of the tools.
    None,
    /// One call of one of the tools.
    Required,
    /// One call of this function.
    Function(String),
}

const TOOL_CHOICE_VALUES: &str =
    "give \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";

impl ToolChoice {
    /// The request's `tool_choice` (absent: "auto"), checked against its
    /// `tools`.
    pub fn of_request(choice: Option<&Value>, tools: Option<&[Value]>) -> Result<Self, ApiError> {
        let bad = |path: &str, message: String| {
            ApiError::bad_request(format!("{path}: {message}"), Some(path))
        };
        let choice = match choice {
            None => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return Err(bad(
                        "tool_choice",
                        format!("\"{other}\" is not a tool choice; {TOOL_CHOICE_VALUES}"),
                    ))
                }
            },
            Some(Value::Object(object)) => {
                match object.get("type").and_then(Value::as_str) {
                    Some("function") => {}
                    _ => {
                        return Err(bad(
                            "tool_choice.type",
                            "expected \"function\" (the one kind of tool served)".into(),
                        ))
                    }
                }
                let name = object
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        bad(
                            "tool_choice.function.name",
                            "expected the name of one of tools' functions (a string)".into(),
                        )
                    })?;
                ToolChoice::Function(name.to_string())
            }
            Some(_) => {
                return Err(bad(
                    "tool_choice",
                    format!("expected a string or an object; {TOOL_CHOICE_VALUES}"),
                ))
            }
        };
        match (&choice, tools) {
            (ToolChoice::Auto | ToolChoice::None, _) => Ok(choice),
            (ToolChoice::Required | ToolChoice::Function(_), None) => Err(bad(
                "tool_choice",
                "asks for a tool call, and the request gives no tools; give tools or leave \
                 tool_choice out"
                    .into(),
            )),
            (ToolChoice::Required | ToolChoice::Function(_), Some([])) => Err(bad(
                "tool_choice",
                "asks for a tool call, and tools is an empty list; give tools or leave \
                 tool_choice out"
                    .into(),
            )),
            (ToolChoice::Required, Some(_)) => Ok(choice),
            (ToolChoice::Function(name), Some(tools)) => {
                let names: Vec<&str> = tools.iter().filter_map(function_name).collect();
                match names.contains(&name.as_str()) {
                    true => Ok(choice),
                    false => Err(bad(
                        "tool_choice.function.name",
                        format!(
                            "\"{name}\" is not a function of tools ({}); name one of them",
                            names
                                .iter()
                                .map(|n| format!("\"{n}\""))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )),
                }
            }
        }
    }
}

/// A tool's `function.name`.
fn function_name(tool: &Value) -> Option<&str> {
    tool.get("function")?.get("name")?.as_str()
}

/// The tools a constrained call may name (all of them for "required", the
/// named one otherwise), each with its `parameters` schema (none given: no
/// arguments, `{}`), and each one's index in `tools`.
fn callable_tools(
    tools: &[Value],
    choice: &ToolChoice,
) -> Result<Vec<(usize, CallableTool)>, ApiError> {
    let mut callable = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let Some(name) = function_name(tool) else {
            let path = format!("tools[{i}].function.name");
            return Err(ApiError::bad_request(
                format!("{path}: a tool needs its function's name (a string)"),
                Some(&path),
            ));
        };
        let wanted = match choice {
            ToolChoice::Function(chosen) => chosen == name,
            ToolChoice::Required => true,
            ToolChoice::Auto | ToolChoice::None => false,
        };
        if !wanted {
            continue;
        }
        let parameters = match tool["function"].get("parameters") {
            None | Some(Value::Null) => {
                json!({"type": "object", "properties": {}, "additionalProperties": false})
            }
            Some(schema @ Value::Object(_)) => schema.clone(),
            Some(_) => {
                let path = format!("tools[{i}].function.parameters");
                return Err(ApiError::bad_request(
                    format!("{path}: expected a JSON schema object"),
                    Some(&path),
                ));
            }
        };
        callable.push((
            i,
            CallableTool {
                name: name.to_string(),
                parameters,
            },
        ));
    }
    Ok(callable)
}

/// The grammar an answer must follow, if any, and what a compile error of
/// it is blamed on.
pub enum OutputShape {
    /// One JSON object (`{"type": "json_object"}`).
    JsonObject,
    /// One JSON value valid against the schema (`json_schema`).
    JsonSchema(Value),
    /// One tool call in the chat template's markup, of one of these tools
    /// (with their indices in `tools`).
    ToolCall(ToolFormat, Vec<(usize, CallableTool)>),
}

/// The shape `response_format` and `tool_choice` ask for: at most one of
/// them may constrain the answer.
pub fn output_shape(
    response_format: ResponseFormat,
    choice: &ToolChoice,
    tools: Option<&[Value]>,
    tool_format: Option<ToolFormat>,
) -> Result<Option<OutputShape>, ApiError> {
    let from_format = match response_format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(OutputShape::JsonObject),
        ResponseFormat::JsonSchema(schema) => Some(OutputShape::JsonSchema(schema)),
    };
    let calls = match (choice, tools) {
        (ToolChoice::Auto | ToolChoice::None, _) | (_, None) => None,
        (ToolChoice::Required | ToolChoice::Function(_), Some(tools)) => {
            let Some(format) = tool_format else {
                return Err(ApiError::bad_request(
                    "tool_choice: a required or named tool call is served for chat \
                     templates that write Qwen's <tool_call> JSON or Gemma 4's \
                     <|tool_call> markup; this model's template writes neither; give \"auto\"",
                    Some("tool_choice"),
                ));
            };
            Some(OutputShape::ToolCall(
                format,
                callable_tools(tools, choice)?,
            ))
        }
    };
    match (from_format, calls) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "response_format: a JSON answer and a required tool call cannot both be \
             the answer; give one of response_format and tool_choice",
            Some("response_format"),
        )),
        (shape, None) | (None, shape) => Ok(shape),
    }
}

impl OutputShape {
    /// The shape's grammar compiled into a fresh constraint; a grammar
    /// llguidance refuses is a 400 naming the schema's field.
    pub fn compile(&self, compiler: &GrammarCompiler) -> Result<TokenConstraint, ApiError> {
        let refused = |path: &str, message: String| {
            ApiError::bad_request(
                format!("{path}: the schema cannot be compiled into a grammar: {message}"),
                Some(path),
            )
        };
        match self {
            OutputShape::JsonObject => compiler
                .compile(json_object_grammar())
                .map_err(|e| refused("response_format", e)),
            OutputShape::JsonSchema(schema) => compiler
                .compile(json_grammar(schema))
                .map_err(|e| refused("response_format.json_schema.schema", e)),
            OutputShape::ToolCall(format, tools) => {
                let callable: Vec<CallableTool> = tools
                    .iter()
                    .map(|(_, t)| CallableTool {
                        name: t.name.clone(),
                        parameters: t.parameters.clone(),
                    })
                    .collect();
                let (start, end) = (format.start(), format.end());
                let grammar = match format {
                    ToolFormat::Hermes => hermes_call_grammar(start, end, &callable),
                    ToolFormat::Gemma4 => {
                        gemma4_call_grammar(start, end, &callable).map_err(|untranslatable| {
                            let (index, _) = &tools[untranslatable.tool];
                            let path = format!(
                                "tools[{index}].function.parameters{}",
                                untranslatable.path
                            );
                            ApiError::bad_request(
                                format!("{path}: {}", untranslatable.message),
                                Some(&path),
                            )
                        })?
                    }
                };
                compiler.compile(grammar).map_err(|whole| {
                    // Blame the first tool whose parameters fail alone.
                    tools
                        .iter()
                        .find_map(|(i, tool)| {
                            compiler
                                .compile(json_grammar(&tool.parameters))
                                .err()
                                .map(|message| {
                                    refused(&format!("tools[{i}].function.parameters"), message)
                                })
                        })
                        .unwrap_or_else(|| refused("tools", whole))
                })
            }
        }
    }

    /// The request field that asked for this shape.
    pub fn field(&self) -> &'static str {
        match self {
            OutputShape::JsonObject | OutputShape::JsonSchema(_) => "response_format",
            OutputShape::ToolCall(..) => "tool_choice",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}),
            json!({"type": "function", "function": {"name": "now"}}),
        ]
    }

    #[test]
    fn tool_choice_is_read_and_checked_against_the_tools() {
        let tools = tools();
        let read = |v: Value| ToolChoice::of_request(Some(&v), Some(&tools));
        assert_eq!(read(json!("auto")).ok(), Some(ToolChoice::Auto));
        assert_eq!(read(json!("none")).ok(), Some(ToolChoice::None));
        assert_eq!(read(json!("required")).ok(), Some(ToolChoice::Required));
        assert_eq!(
            read(json!({"type": "function", "function": {"name": "now"}})).ok(),
            Some(ToolChoice::Function("now".into()))
        );
        let unknown = read(json!({"type": "function", "function": {"name": "later"}}))
            .err()
            .unwrap();
        assert_eq!(unknown.param.as_deref(), Some("tool_choice.function.name"));
        assert!(
            unknown
                .message
                .contains("\"later\" is not a function of tools")
                && unknown.message.contains("\"get_weather\", \"now\""),
            "{}",
            unknown.message
        );
        let no_tools = ToolChoice::of_request(Some(&json!("required")), None)
            .err()
            .unwrap();
        assert_eq!(no_tools.param.as_deref(), Some("tool_choice"));
        let empty = ToolChoice::of_request(Some(&json!("required")), Some(&[]))
            .err()
            .unwrap();
        assert!(
            empty.message.contains("tools is an empty list"),
            "{}",
            empty.message
        );
        assert!(read(json!("always")).is_err());
        assert!(read(json!({"type": "code"})).is_err());
    }

    #[test]
    fn a_named_call_offers_that_tool_only_and_a_tool_without_parameters_takes_none() {
        let tools = tools();
        let named = callable_tools(&tools, &ToolChoice::Function("now".into()))
            .ok()
            .unwrap();
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].0, 1);
        assert_eq!(
            named[0].1.parameters,
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );
        assert_eq!(
            callable_tools(&tools, &ToolChoice::Required)
                .ok()
                .map(|t| t.len()),
            Some(2)
        );
    }

    #[test]
    fn response_format_errors_name_the_field() {
        let param = |v: Value| {
            ResponseFormat::of_request(Some(&v))
                .err()
                .and_then(|e| e.param)
        };
        assert!(matches!(
            ResponseFormat::of_request(Some(&json!({"type": "json_object"}))),
            Ok(ResponseFormat::JsonObject)
        ));
        assert!(matches!(
            ResponseFormat::of_request(None),
            Ok(ResponseFormat::Text)
        ));
        assert_eq!(param(json!("json")).as_deref(), Some("response_format"));
        assert_eq!(
            param(json!({"type": "xml"})).as_deref(),
            Some("response_format.type")
        );
        assert_eq!(
            param(json!({"type": "json_schema"})).as_deref(),
            Some("response_format.json_schema")
        );
        assert_eq!(
            param(json!({"type": "json_schema", "json_schema": {"schema": {}}})).as_deref(),
            Some("response_format.json_schema.name")
        );
        assert_eq!(
            param(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": true}}))
                .as_deref(),
            Some("response_format.json_schema.schema")
        );
    }

    #[test]
    fn one_shape_at_a_time() {
        let tools = tools();
        let both = output_shape(
            ResponseFormat::JsonObject,
            &ToolChoice::Required,
            Some(&tools),
            Some(ToolFormat::Hermes),
        )
        .err()
        .unwrap();
        assert_eq!(both.param.as_deref(), Some("response_format"));
        // Gemma 4's markup has its own call grammar; a template with no
        // markup archgen reads cannot be held to a call.
        assert!(matches!(
            output_shape(
                ResponseFormat::Text,
                &ToolChoice::Required,
                Some(&tools),
                Some(ToolFormat::Gemma4),
            ),
            Ok(Some(OutputShape::ToolCall(ToolFormat::Gemma4, _)))
        ));
        let unread = output_shape(
            ResponseFormat::Text,
            &ToolChoice::Required,
            Some(&tools),
            None,
        )
        .err()
        .unwrap();
        assert_eq!(unread.param.as_deref(), Some("tool_choice"));
        assert!(matches!(
            output_shape(ResponseFormat::Text, &ToolChoice::Auto, None, None),
            Ok(None)
        ));
    }
}
