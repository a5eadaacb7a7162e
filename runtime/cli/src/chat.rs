//! `archgen chat`: a conversation on stdin. Each line is a user turn; the
//! whole history goes through the checkpoint's chat template every turn and
//! the reply streams to stdout. `/exit` or end of input ends it, `/reset`
//! forgets the history.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use archgen_runtime::model::{CausalLm, ModelTask};
use tokenizers::Tokenizer;

use crate::args::ChatArgs;
use crate::chat_template::{ChatTemplate, Message};
use crate::engine::{self, Flow, Sampling, TextStream};
use crate::sampling::{fresh_seed, SamplingParams, FLAG_NAMES};
use crate::thinking::{self, TemplateArgs, TemplateVariable, ThinkingMarkers};
use crate::ui::Ui;

/// The checkpoint's chat template, or a message that says what is missing.
pub fn load_template(model: &Path) -> Result<ChatTemplate, String> {
    ChatTemplate::load(model)?.ok_or_else(|| {
        format!(
            "{} has no chat template: add chat_template to tokenizer_config.json, or a chat_template.jinja \
             (a base model without one can run `archgen generate --prompt`)",
            model.display()
        )
    })
}

/// The chat template and tokenizer a chat needs, with a message that says
/// which file is missing.
pub fn load_chat_parts(model: &Path) -> Result<(Tokenizer, ChatTemplate), String> {
    if !model.is_dir() {
        return Err(format!("{}: not a directory", model.display()));
    }
    let tokenizer = crate::checkpoint::load_tokenizer(model)?.ok_or_else(|| {
        format!(
            "a chat needs {} (not found)",
            model.join("tokenizer.json").display()
        )
    })?;
    Ok((tokenizer, load_template(model)?))
}

/// The prompt ids of a conversation: the template's text, encoded without
/// adding special tokens (the template writes them, as in transformers'
/// `apply_chat_template(tokenize=True)`).
pub fn encode_chat(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    variables: &[TemplateVariable],
    history: &[Message],
) -> Result<Vec<i32>, String> {
    let text = render_chat(template, variables, history)?;
    let encoding = tokenizer
        .encode(text.as_str(), false)
        .map_err(|e| format!("cannot encode the chat prompt: {e}"))?;
    Ok(encoding.get_ids().iter().map(|&t| t as i32).collect())
}

/// `generate --chat`: `text` as one user turn in the model's chat template.
pub fn one_user_turn(
    model: &Path,
    variables: &[TemplateVariable],
    text: &str,
) -> Result<String, String> {
    let template = load_template(model)?;
    render_chat(&template, variables, &[Message::new("user", text)])
}

/// `--chat-template-args`, read (none given: no variables).
pub fn template_args(flag: Option<&str>) -> Result<TemplateArgs, String> {
    flag.map_or(Ok(TemplateArgs::new()), thinking::parse_template_args)
}

/// The variables `chat` and `generate --chat` render every turn with, as
/// mlx-lm renders them: `--chat-template-args`, and `enable_thinking` set
/// to whether the tokenizer has reasoning markers unless they give it
/// (thinking.rs). Read once per run.
pub fn template_variables(
    tokenizer: &Tokenizer,
    flag: Option<&str>,
) -> Result<Vec<TemplateVariable>, String> {
    let args = template_args(flag)?;
    let has_thinking = ThinkingMarkers::of(tokenizer)?.is_some();
    Ok(thinking::template_variables(has_thinking, &args, None))
}

/// A conversation's text, opening the assistant's turn.
fn render_chat(
    template: &ChatTemplate,
    variables: &[TemplateVariable],
    messages: &[Message],
) -> Result<String, String> {
    template.render_values(minijinja::Value::from_serialize(messages), true, variables)
}

pub fn chat(ui: &Ui, args: &ChatArgs, params: SamplingParams) -> Result<(), String> {
    let model = args.model.as_path();
    let levers = crate::checkpoint::run_levers(&args.levers, model, args.require_tier)?;
    let (tokenizer, template) = load_chat_parts(model)?;
    let variables = template_variables(&tokenizer, args.chat_template_args.as_deref())?;
    let eos = crate::checkpoint::eos_ids(model)?;
    let context = engine::context_length(model)?;
    let seed = match args.sampling.seed {
        Some(seed) => seed,
        None => fresh_seed()?,
    };
    // Said before the first reply, so a conversation can be replayed.
    ui.note(&format!(
        "chat: seed {seed} (reply N samples with seed {seed} + N)"
    ));
    let task = ChatTask {
        context,
        tokenizer: &tokenizer,
        template: &template,
        variables: &variables,
        eos: &eos,
        system: args.system.as_deref(),
        sampling: Sampling {
            max_tokens: args.max_tokens,
            params,
            seed,
        },
        ui: *ui,
    };
    crate::checkpoint::with_model(
        ui,
        model,
        args.implementation,
        args.require_tier,
        &levers,
        task,
    )
}

struct ChatTask<'a> {
    /// `max_position_embeddings`, when config.json gives it.
    context: Option<usize>,
    tokenizer: &'a Tokenizer,
    template: &'a ChatTemplate,
    /// `--chat-template-args` and `enable_thinking`.
    variables: &'a [TemplateVariable],
    eos: &'a [i32],
    system: Option<&'a str>,
    sampling: Sampling,
    ui: Ui,
}

impl ChatTask<'_> {
    fn fresh_history(&self) -> Vec<Message> {
        self.system
            .map(|s| vec![Message::new("system", s)])
            .unwrap_or_default()
    }
}

impl ModelTask for ChatTask<'_> {
    type Output = Result<(), String>;

    fn run<M: CausalLm>(self, m: &M) -> Self::Output {
        self.sampling
            .params
            .check(m.vocab_size() as usize, &FLAG_NAMES)
            .map_err(|(message, _)| message)?;
        let interactive = std::io::stdin().is_terminal();
        if interactive {
            self.ui.note(
                "chat: type a message; /reset forgets the conversation, /exit or Ctrl-D ends",
            );
        }
        let mut history = self.fresh_history();
        let mut lines = std::io::stdin().lock().lines();
        // Replies so far: reply N samples with seed S + N.
        let mut replies = 0u64;
        loop {
            if interactive {
                eprint!("> ");
                let _ = std::io::stderr().flush();
            }
            let line = match lines.next() {
                None => break,
                Some(line) => line.map_err(|e| format!("cannot read stdin: {e}"))?,
            };
            match line.trim() {
                "/exit" | "/quit" => break,
                "/reset" => {
                    history = self.fresh_history();
                    continue;
                }
                "" => continue,
                _ => {}
            }
            history.push(Message::new("user", &line));
            let prompt = match encode_chat(self.tokenizer, self.template, self.variables, &history)
            {
                Ok(p) => p,
                Err(e) => {
                    // A template that refuses this conversation (e.g. roles
                    // out of order) ends the turn, not the chat.
                    history.pop();
                    eprintln!("archgen: chat: {e}");
                    continue;
                }
            };
            if let Some(context) = self.context.filter(|&c| prompt.len() >= c) {
                history.pop();
                eprintln!(
                    "archgen: chat: the conversation is {} tokens, the model's context is {context} \
                     (max_position_embeddings); /reset starts over",
                    prompt.len()
                );
                continue;
            }
            // A reply ends at the context's end at the latest.
            let room = self.context.map_or(usize::MAX, |c| c - prompt.len());
            let sampling = Sampling {
                seed: self.sampling.seed.wrapping_add(replies),
                max_tokens: self.sampling.max_tokens.min(room),
                params: self.sampling.params.clone(),
            };
            let reply = stream_reply(m, self.tokenizer, self.eos, &prompt, &sampling)?;
            history.push(Message::new("assistant", &reply));
            replies += 1;
        }
        Ok(())
    }
}

/// Generates a reply, printing it as it comes; returns its text.
fn stream_reply<M: CausalLm>(
    m: &M,
    tokenizer: &Tokenizer,
    eos: &[i32],
    prompt: &[i32],
    sampling: &Sampling,
) -> Result<String, String> {
    let mut stream = TextStream::new(tokenizer, &[]);
    let mut reply = String::new();
    let print = |text: &str, reply: &mut String| {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        reply.push_str(text);
    };
    engine::generate(m, prompt, sampling, None, eos, |token| {
        let (text, _) = stream.push(token)?;
        print(&text, &mut reply);
        Ok(Flow::Continue)
    })?;
    let tail = stream.finish()?;
    print(&tail, &mut reply);
    print("\n", &mut String::new());
    Ok(reply)
}
