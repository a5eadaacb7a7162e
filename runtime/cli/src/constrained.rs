//! Constrained decoding: a grammar (a JSON schema, or a tool call's markup
//! around one) compiled by llguidance against the checkpoint's tokenizer,
//! and the token mask it gives at every step.
//!
//! The mask is a logits processor of its own, the last one: after
//! `make_logits_processors`'s (logit bias, penalties), before
//! `logits - logsumexp(logits)` and the sampler chain (crate::sampling).
//! Every token the grammar does not allow next gets -inf; an end-of-sequence
//! token is allowed only where the grammar accepts the text so far. The
//! model's own logits are untouched: the forward pass is the same as
//! without a constraint.
//!
//! The JSON a grammar allows has no free whitespace (llguidance's
//! `whitespace_flexible: false` with fixed separators), so a model cannot
//! spend its token budget on blanks between tokens; a bounded schema
//! (maxLength, enum, number ranges, a fixed set of keys) then closes within
//! a bounded number of tokens. A grammar that cannot close within
//! `max_tokens` ends at `max_tokens` with finish_reason "length", its text
//! cut where it stood.
//!
//! Compiling is bounded by llguidance's [`ParserLimits`] ([`compile_limits`]):
//! a hostile schema fails with llguidance's message instead of stalling the
//! thread that compiles it, and each step's mask has a bounded cost too.

use std::path::Path;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use toktrie_hf_tokenizers::ByteTokenizer;

/// The bounds on one grammar's compile and on each step's mask.
fn compile_limits() -> ParserLimits {
    ParserLimits {
        // Grammar symbols (a few hundred kB of schema).
        max_grammar_size: 100_000,
        // Lexer work to build the grammar's regexes (about 10 ms of work at
        // llguidance's rate of 50k/ms).
        initial_lexer_fuel: 500_000,
        max_lexer_states: 50_000,
        // Each step's mask: at most a few milliseconds of lexer and parser
        // work.
        step_lexer_fuel: 100_000,
        step_max_items: 20_000,
        max_items_in_row: 1_000,
        precompute_large_lexemes: true,
        // The message names the problem, not the whole grammar.
        verbose_errors: false,
    }
}

/// JSON written by a constrained answer: no whitespace outside strings
/// (`,` and `:` as separators). `item` and `key` are the separators.
fn json_layout(item: &str, key: &str) -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": item,
        "key_separator": key,
    })
}

/// `schema` with this server's JSON layout, any layout the client gave in
/// its own `x-guidance` replaced (it could allow unbounded whitespace).
fn with_layout(schema: &Value, item: &str, key: &str) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(object) = &mut schema {
        object.insert("x-guidance".into(), json_layout(item, key));
    }
    schema
}

/// The grammar of one JSON value valid against `schema`, written compactly.
pub fn json_grammar(schema: &Value) -> TopLevelGrammar {
    TopLevelGrammar::from_json_schema(with_layout(schema, ",", ":"))
}

/// The grammar of `{"type": "object"}`: any one JSON object.
pub fn json_object_grammar() -> TopLevelGrammar {
    json_grammar(&json!({"type": "object"}))
}

/// A function a tool call may name, with its `parameters` schema.
pub struct CallableTool {
    pub name: String,
    pub parameters: Value,
}

/// The grammar of one hermes-style tool call, `start` + `{"name": NAME,
/// "arguments": {...}}` + `end`, of one of `tools` with arguments valid
/// against its parameters. Separators are `, ` and `: ` as the chat
/// templates write them (json.dumps' defaults), with no other whitespace.
pub fn hermes_call_grammar(start: &str, end: &str, tools: &[CallableTool]) -> TopLevelGrammar {
    let calls: Vec<Value> = tools
        .iter()
        .map(|tool| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": tool.name},
                    "arguments": tool.parameters,
                },
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = match <[Value; 1]>::try_from(calls) {
        Ok([one]) => one,
        Err(calls) => json!({"anyOf": calls}),
    };
    let schema = with_layout(&schema, ", ", ": ");
    TopLevelGrammar::from_lark(format!(
        "start: {} call {}\ncall: %json {}\n",
        lark_literal(&format!("{start}\n")),
        lark_literal(&format!("\n{end}")),
        schema
    ))
}

/// A Lark string literal of `text` (JSON's escapes, which Lark reads).
pub fn lark_literal(text: &str) -> String {
    Value::from(text).to_string()
}

/// Compiles grammars against one checkpoint's tokenizer (built once, on
/// the first constrained request: the token trie of a large vocabulary
/// takes a moment).
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab: usize,
    eos: Vec<u32>,
}

impl GrammarCompiler {
    /// A compiler for the tokenizer in `tokenizer_json`, a model whose
    /// logits have `vocab` entries and which ends a sequence at `eos`.
    pub fn new(tokenizer_json: &Path, vocab: usize, eos: &[i32]) -> Result<Self, String> {
        let cannot = |e: &dyn std::fmt::Display| format!("{}: {e}", tokenizer_json.display());
        let mut tokenizer = ByteTokenizer::from_file(tokenizer_json).map_err(|e| cannot(&e))?;
        let eos: Vec<u32> = eos.iter().filter_map(|&t| u32::try_from(t).ok()).collect();
        let tokens = tokenizer.tokrx_info().vocab_size as usize;
        if let Some(&outside) = eos.iter().find(|&&t| t as usize >= tokens.max(vocab)) {
            return Err(format!(
                "the end-of-sequence id {outside} is outside the vocabulary ({tokens} tokens)"
            ));
        }
        if !eos.is_empty() && eos.iter().all(|&t| (t as usize) < tokens) {
            tokenizer.set_eos_tokens(&eos);
        }
        let env = tokenizer
            .into_tok_env(Some(vocab.max(tokens)))
            .map_err(|e| cannot(&e))?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| cannot(&e))?;
        factory.quiet();
        *factory.limits_mut() = compile_limits();
        Ok(GrammarCompiler {
            factory,
            vocab,
            eos,
        })
    }

    /// A fresh constraint of `grammar`, its first mask computed (so a
    /// grammar that cannot start fails here, before any compute); the
    /// error is llguidance's message.
    pub fn compile(&self, grammar: TopLevelGrammar) -> Result<TokenConstraint, String> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(error);
        }
        matcher.compute_mask().map_err(|e| e.to_string())?;
        Ok(TokenConstraint {
            matcher,
            vocab: self.vocab,
            eos: self.eos.clone(),
        })
    }
}

/// Where a constrained answer stands after a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrammarState {
    /// More tokens may (or must) follow.
    Open,
    /// The grammar is complete and allows nothing more: the answer ends.
    Complete,
}

/// One sequence's grammar state (llguidance's matcher).
pub struct TokenConstraint {
    matcher: Matcher,
    vocab: usize,
    eos: Vec<u32>,
}

impl TokenConstraint {
    /// An independent copy at the same point of the grammar (llguidance's
    /// deep clone): one per choice of a request with `n` > 1.
    pub fn fork(&self) -> Self {
        TokenConstraint {
            matcher: self.matcher.deep_clone(),
            vocab: self.vocab,
            eos: self.eos.clone(),
        }
    }

    /// Which of the `vocab` tokens may come next: the grammar's mask, with
    /// the end-of-sequence tokens allowed exactly when the grammar accepts.
    pub fn allowed(&mut self) -> Result<Vec<bool>, String> {
        let mask = self
            .matcher
            .compute_mask()
            .map_err(|e| format!("the output grammar failed: {e}"))?;
        let accepting = self
            .matcher
            .is_accepting()
            .map_err(|e| format!("the output grammar failed: {e}"))?;
        let mut allowed: Vec<bool> = (0..self.vocab)
            .map(|t| t < mask.len() && mask.is_allowed(t as u32))
            .collect();
        for &eos in &self.eos {
            if let Some(slot) = allowed.get_mut(eos as usize) {
                *slot = accepting;
            }
        }
        match allowed.contains(&true) {
            true => Ok(allowed),
            false => Err("the output grammar allows no token of this model here".into()),
        }
    }

    /// Moves the grammar past `token`, the one just sampled (an
    /// end-of-sequence token ends the answer and is not fed).
    pub fn accept(&mut self, token: i32) -> Result<GrammarState, String> {
        let Ok(token) = u32::try_from(token) else {
            return Err(format!("token {token} is not a token id"));
        };
        if self.eos.contains(&token) {
            return Ok(GrammarState::Complete);
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| format!("the output grammar failed: {e}"))?;
        match self.matcher.is_stopped() {
            true => Ok(GrammarState::Complete),
            false => Ok(GrammarState::Open),
        }
    }
}
