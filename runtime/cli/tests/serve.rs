//! `archgen serve`, `archgen chat` and `archgen generate --chat` end to end on
//! a tiny Qwen3 checkpoint (`archgen init`) with a byte-level BPE tokenizer
//! trained by the test (the tokenizers Python package) and the Qwen3 chat
//! template fixture.
//!
//! The server is started on an ephemeral loopback port and checked with curl
//! (raw HTTP: status codes, SSE framing, error bodies) and with the official
//! openai Python client (tests/python/openai_client_check.py: completions and
//! chat, streamed and not, stop, seed, usage, 400s). The greedy and seeded
//! texts the server gives must equal `archgen generate`'s for the same token
//! ids, and `archgen chat`'s replies must equal the server's for the same
//! conversation. Every wait is bounded; the server is killed at the end.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use archgen_tests::{repo_root, run_python};
use serde_json::json;

const ARCHGEN: &str = env!("CARGO_BIN_EXE_archgen");

/// Runs archgen with `stdin`, killed after `limit`; returns (exit ok, stdout, stderr).
fn archgen(args: &[&str], stdin: &str, limit: Duration) -> (bool, String, String) {
    let mut child = Command::new(ARCHGEN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).map(|_| s)
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).map(|_| s)
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("archgen {args:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.success(),
        out.join().unwrap().unwrap(),
        err.join().unwrap().unwrap(),
    )
}

/// A running `archgen serve`, killed when dropped (also when a check fails).
struct Server {
    child: Child,
    base: String,
    /// The server's stderr lines after the one with its address.
    log: mpsc::Receiver<String>,
    /// Its stderr lines up to the one with its address (its start notes).
    startup: Vec<String>,
}

impl Server {
    /// The JSON request-log lines written so far.
    fn request_logs(&self) -> Vec<serde_json::Value> {
        self.log
            .try_iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(&line).ok())
            .filter(|v| v["log"] == "request")
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(model: &Path, extra: &[&str]) -> Server {
    start_server_with_env(model, extra, &[])
}

/// [`start_server`] with variables set in the server's environment.
fn start_server_with_env(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let mut child = Command::new(ARCHGEN)
        .args(["serve", "--model", model.to_str().unwrap()])
        .args(["--port", "0"])
        // Loopback unless the test picks the address.
        .args(match extra.contains(&"--host") {
            true => &[][..],
            false => &["--host", "127.0.0.1"][..],
        })
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Forward the server's log lines; the first one with the address says
    // it is ready. The reader keeps draining so the pipe never fills.
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[server] {line}");
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut startup = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.split_once("http://").map(|(_, r)| r) {
                    let addr = rest.split('/').next().unwrap().to_string();
                    startup.push(line);
                    return Server {
                        child,
                        base: format!("http://{addr}"),
                        log: rx,
                        startup,
                    };
                }
                startup.push(line);
            }
            Err(_) => {
                let exit = child.try_wait();
                let _ = child.kill();
                let _ = child.wait();
                panic!("the server did not report its address in time (exit: {exit:?})")
            }
        }
    }
}

/// One curl request, bounded; returns (HTTP status, body).
fn curl(server: &Server, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let (status, _, body) = curl_with(server, method, path, body, &[]);
    (status, body)
}

/// [`curl`] with extra request headers ("Name: value"); returns (HTTP
/// status, the response's headers with lowercase names, body).
fn curl_with(
    server: &Server,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[&str],
) -> (u16, Vec<(String, String)>, String) {
    let url = format!("{}{path}", server.base);
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-N",
        "-i",
        "--max-time",
        "120",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]);
    for header in headers {
        cmd.args(["-H", header]);
    }
    if body.is_some() {
        cmd.args([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "@-",
        ]);
    }
    cmd.arg(&url);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("curl runs (setup.sh installs it)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(body.unwrap_or("").as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "curl {method} {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (response, status) = text.rsplit_once('\n').unwrap();
    // A long body is sent after an interim "100 Continue" head: skip it.
    let mut rest = response;
    let (head, body) = loop {
        let (head, body) = rest
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no header block in: {response}"));
        match head.split(' ').nth(1) {
            Some("100") => rest = body,
            _ => break (head, body),
        }
    };
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status.parse().unwrap(), headers, body.to_string())
}

/// The value of response header `name` (lowercase), if given.
fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The OpenAI-style error message of a 400.
fn error_message(status: u16, body: &str) -> String {
    assert_eq!(status, 400, "expected 400, got {status}: {body}");
    let v = json(body);
    assert_eq!(v["error"]["type"], "invalid_request_error", "{body}");
    v["error"]["message"].as_str().unwrap().to_string()
}

fn tiny_chat_model(root: &Path) -> PathBuf {
    tiny_chat_model_of(root, "qwen3-0.6b-tiny", "qwen3-tiny")
}

/// [`tiny_chat_model`] of another tiny spec (vocabulary 512), in `root/dir`
/// (the served model's name).
fn tiny_chat_model_of(root: &Path, spec_name: &str, dir: &str) -> PathBuf {
    tiny_chat_model_with(root, spec_name, dir, "qwen3.jinja")
}

/// [`tiny_chat_model_of`] with another fixture chat template.
fn tiny_chat_model_with(root: &Path, spec_name: &str, dir: &str, template: &str) -> PathBuf {
    let (model, made) = tiny_chat_model_adding(root, spec_name, dir, template, &[]);
    assert_eq!(made["vocab_size"], 512, "{made}");
    model
}

/// `archgen init` of a spec at `model`, with `extra` flags.
fn init_tiny(spec_name: &str, model: &Path, extra: &[&str]) {
    let spec = repo_root().join(format!("specs/{spec_name}.yaml"));
    let mut args = vec![
        "init",
        "--spec",
        spec.to_str().unwrap(),
        "--out",
        model.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (ok, _, err) = archgen(&args, "", Duration::from_secs(300));
    assert!(ok, "init failed: {err}");
}

/// `archgen init` of a tiny spec in `root/dir`, and a chat tokenizer with a
/// fixture template whose vocabulary ends in `added` (each piece one added
/// token); returns the model and what make_chat_tokenizer.py printed.
fn tiny_chat_model_adding(
    root: &Path,
    spec_name: &str,
    dir: &str,
    template: &str,
    added: &[&str],
) -> (PathBuf, serde_json::Value) {
    let model = root.join(dir);
    init_tiny(spec_name, &model, &[]);
    let template = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat_templates")
        .join(template);
    let mut args = vec![model.clone().into_os_string(), template.into_os_string()];
    if !added.is_empty() {
        let file = root.join(format!("{dir}.added.json"));
        std::fs::write(&file, serde_json::to_string(added).unwrap()).unwrap();
        args.push(file.into_os_string());
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let made = run_python("make_chat_tokenizer.py", &args);
    (model, json(&made))
}

/// Token ids for the comparisons with `archgen generate`.
const PROMPT_IDS: &str = "1,274,261,201,379,362,2,201,1,77,300";

#[test]
fn serves_the_openai_api_and_matches_generate_and_chat() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let model_s = model.to_str().unwrap();
    // One sequence at a time: each answer is what `archgen generate` gives.
    let server = start_server(&model, &["--max-batch", "1"]);

    // curl: the three endpoints, and what the server refuses.
    let (status, body) = curl(&server, "GET", "/v1/models", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["data"][0]["id"], "qwen3-tiny");

    let (status, body) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "Hello there", "max_tokens": 5, "temperature": 0}"#),
    );
    assert_eq!(status, 200, "{body}");
    let v = json(&body);
    let usage = &v["usage"];
    assert!(usage["completion_tokens"].as_u64().unwrap() <= 5, "{body}");
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        )
    );

    let (status, body) = curl(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(
            r#"{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "stream": true}"#,
        ),
    );
    assert_eq!(status, 200, "{body}");
    let events: Vec<&str> = body
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .collect();
    assert!(events.iter().all(|e| e.starts_with("data: ")), "{body}");
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{body}");
    let first = json(events[0].strip_prefix("data: ").unwrap());
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");

    let bad = [
        (r#"{"prompt": "x", "max_tokens": "#, "not valid JSON"),
        (
            r#"{"prompt": "x", "max_tokens": "many"}"#,
            "max_tokens: expected an unsigned integer, got a string",
        ),
        (r#"{"max_tokens": 3}"#, "missing field `prompt`"),
        (r#"{"prompt": "x", "top_p": 0}"#, "top_p"),
        (
            r#"{"prompt": [1, 2, 99999]}"#,
            "out of the vocabulary (size 512)",
        ),
        (
            r#"{"prompt": "x", "max_tokens": 40960}"#,
            "maximum context length is 40960",
        ),
    ];
    for (request, expected) in bad {
        let (status, body) = curl(&server, "POST", "/v1/completions", Some(request));
        let message = error_message(status, &body);
        assert!(
            message.contains(expected),
            "{request}: '{expected}' not in: {message}"
        );
    }
    // A prompt longer than the context (max_position_embeddings).
    let too_long = format!(
        r#"{{"prompt": [{}], "max_tokens": 1}}"#,
        vec!["7"; 40961].join(",")
    );
    let (status, body) = curl(&server, "POST", "/v1/completions", Some(&too_long));
    let message = error_message(status, &body);
    assert!(message.contains("40961 in the prompt"), "{message}");
    let (status, body) = curl(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(r#"{"messages": "hi"}"#),
    );
    assert!(error_message(status, &body).contains("messages: expected a list of messages"));
    let (status, _) = curl(&server, "GET", "/v2/nothing", None);
    assert_eq!(status, 404);
    // Still serving after every refusal.
    let (status, body) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "Hello there", "max_tokens": 5, "temperature": 0}"#),
    );
    assert_eq!(status, 200, "{body}");

    // The openai client: every API feature, plus texts to compare.
    let base = format!("{}/v1", server.base);
    let out = run_python(
        "openai_client_check.py",
        &[base.as_ref(), model.as_os_str(), PROMPT_IDS.as_ref()],
    );
    let texts = json(out.lines().last().unwrap());
    drop(server);

    // Greedy and seeded: the server's text is `archgen generate`'s.
    let generate = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            model_s,
            "--prompt-ids",
            PROMPT_IDS,
            "--max-tokens",
            "10",
        ];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = archgen(&args, "", Duration::from_secs(300));
        assert!(ok, "{stderr}");
        stdout
    };
    assert_eq!(
        generate(&[]),
        format!("{}\n", texts["greedy_ids"].as_str().unwrap())
    );
    assert_eq!(
        generate(&["--temp", "3.0", "--top-p", "0.95", "--seed", "7"]),
        format!("{}\n", texts["seeded_ids"].as_str().unwrap())
    );

    // `archgen chat` replies as the server does to the same conversation,
    // and `generate --chat` is its first turn.
    let turns: Vec<&str> = texts["chat_turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let (ok, stdout, stderr) = archgen(
        &["chat", "--model", model_s, "--max-tokens", "6"],
        "hello\ntell me more\n/exit\nnever read\n",
        Duration::from_secs(300),
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, format!("{}\n{}\n", turns[0], turns[1]));
    let (ok, stdout, stderr) = archgen(
        &[
            "generate",
            "--chat",
            "--model",
            model_s,
            "--prompt",
            "hello",
            "--max-tokens",
            "6",
        ],
        "",
        Duration::from_secs(300),
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, format!("{}\n", turns[0]));
    // `--chat-template-args` gives the template its variables: this
    // tokenizer has no reasoning markers, so `enable_thinking` is false by
    // default (Qwen3's template then closes an empty reasoning block) and
    // true only when asked; `chat` renders its turns the same way.
    let prompt_tokens = |stderr: &str| -> usize {
        let at = stderr.find("prompt ").expect("a prompt note") + "prompt ".len();
        stderr[at..].split(' ').next().unwrap().parse().unwrap()
    };
    let thinking = ["--chat-template-args", r#"{"enable_thinking": true}"#];
    let with_args = |command: &str, extra: &[&str], stdin: &str| {
        let mut args = vec![command, "--model", model_s, "--max-tokens", "6"];
        args.extend_from_slice(extra);
        archgen(&args, stdin, Duration::from_secs(300))
    };
    let (ok, _, default_err) = with_args("generate", &["--chat", "--prompt", "hello"], "");
    assert!(ok, "{default_err}");
    let mut extra = vec!["--chat", "--prompt", "hello"];
    extra.extend_from_slice(&thinking);
    let (ok, generated, thinking_err) = with_args("generate", &extra, "");
    assert!(ok, "{thinking_err}");
    assert!(
        prompt_tokens(&thinking_err) < prompt_tokens(&default_err),
        "{thinking_err}\n{default_err}"
    );
    let (ok, chatted, stderr) = with_args("chat", &thinking, "hello\n");
    assert!(ok, "{stderr}");
    assert_eq!(chatted, generated);
    let (ok, _, stderr) = with_args("chat", &["--chat-template-args", "[1]"], "hello\n");
    assert!(!ok && stderr.contains("expected a JSON object"), "{stderr}");
    // End of input ends a chat too.
    let (ok, stdout, stderr) = archgen(
        &["chat", "--model", model_s, "--max-tokens", "6"],
        "hello\n",
        Duration::from_secs(300),
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, format!("{}\n", turns[0]));

    // A conversation longer than the context is refused, and the chat goes on.
    let short = root.path().join("short-context");
    std::fs::create_dir(&short).unwrap();
    for entry in std::fs::read_dir(&model).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), short.join(entry.file_name())).unwrap();
    }
    let mut config = json(&std::fs::read_to_string(short.join("config.json")).unwrap());
    // Room for a short turn, whose prompt closes an empty reasoning block
    // (this tokenizer has no reasoning markers: `enable_thinking` false).
    config["max_position_embeddings"] = 48.into();
    std::fs::write(short.join("config.json"), config.to_string()).unwrap();
    let (ok, stdout, stderr) = archgen(
        &[
            "chat",
            "--model",
            short.to_str().unwrap(),
            "--max-tokens",
            "6",
        ],
        &format!("{}\nhello\n", "fox ".repeat(60)),
        Duration::from_secs(300),
    );
    assert!(ok, "{stderr}");
    assert!(stderr.contains("the model's context is 48"), "{stderr}");
    assert_eq!(
        stdout,
        format!("{}\n", turns[0]),
        "the next turn starts afresh"
    );
}

/// The error `param` of a 400, and its message.
fn error_param(status: u16, body: &str) -> (String, String) {
    let message = error_message(status, body);
    let param = json(body)["error"]["param"]
        .as_str()
        .unwrap_or("")
        .to_string();
    (param, message)
}

/// What clients send beside the fields the server serves: `null` for "not
/// set", fields without effect (accepted), unknown fields (ignored and
/// named back in a header and the log), the sampling fields (served),
/// fields it does not serve (refused unless they ask for the default, naming
/// the field), wrong types (named by JSON path).
#[test]
fn takes_requests_as_clients_send_them() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let server = start_server(&model, &[]);
    let chat = |message_extra: &str, extra: &str| {
        format!(
            r#"{{"messages": [{{"role": "user", "content": "Hi"{message_extra}}}], "max_tokens": 2{extra}}}"#
        )
    };
    let post = |path: &str, body: &str| curl_with(&server, "POST", path, Some(body), &[]);

    // Nulls, fields without effect and default values: served as without them.
    let (status, headers, body) = post(
        "/v1/chat/completions",
        &chat(
            r#", "refusal": null, "tool_calls": null"#,
            r#", "response_format": null, "tools": null, "temperature": null, "stop": null,
               "parallel_tool_calls": true, "metadata": {}, "user": "u1", "store": false,
               "service_tier": "auto", "n": 1, "logit_bias": {}, "top_k": -1,
               "presence_penalty": 0, "model": "anything""#,
        ),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&headers, "x-archgen-ignored-fields"),
        None,
        "{headers:?}"
    );

    // Unknown fields, at the top, in a message and in stream_options: ignored
    // and named, sorted.
    let (status, headers, body) = post(
        "/v1/chat/completions",
        &chat(
            r#", "refusal": "hm""#,
            r#", "response_format": {"type": "text"}, "frobnicate": 1,
               "chat_template_kwargs": {"x": 1}, "stream": true,
               "stream_options": {"include_usage": true, "continuous_usage_stats": true}"#,
        ),
    );
    assert_eq!(status, 200, "{body}");
    let named = "frobnicate,messages[0].refusal,stream_options.continuous_usage_stats";
    assert_eq!(
        header(&headers, "x-archgen-ignored-fields"),
        Some(named),
        "{headers:?}"
    );
    assert!(
        body.contains("\"usage\""),
        "include_usage is served: {body}"
    );
    let (status, headers, body) = post(
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 1, "best_of": 1, "echo": false, "zeta": [1]}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&headers, "x-archgen-ignored-fields"), Some("zeta"));

    // The sampling fields are served: answered, not ignored, with the seed
    // the answer was sampled with.
    for (field, value) in [
        ("logit_bias", r#"{"5": 10}"#),
        ("top_k", "5"),
        ("min_p", "0.1"),
        ("presence_penalty", "0.5"),
        ("frequency_penalty", "-1"),
        ("repetition_penalty", "1.3"),
    ] {
        let (status, headers, body) = post(
            "/v1/chat/completions",
            &chat("", &format!(r#", "{field}": {value}"#)),
        );
        assert_eq!(status, 200, "{field}: {body}");
        assert_eq!(
            header(&headers, "x-archgen-ignored-fields"),
            None,
            "{field}: {headers:?}"
        );
        assert!(
            header(&headers, "x-archgen-seed").is_some_and(|s| s.parse::<u64>().is_ok()),
            "{field}: {headers:?}"
        );
    }

    // reasoning_effort is given to a template that reads it (the reasoning
    // test below); Qwen3's does not, so here it is named as ignored. A
    // value outside OpenAI's is refused, naming the field.
    let (status, headers, body) = post(
        "/v1/chat/completions",
        &chat("", r#", "reasoning_effort": "low", "frobnicate": 1"#),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&headers, "x-archgen-ignored-fields"),
        Some("frobnicate,reasoning_effort")
    );
    let (status, _, body) = post(
        "/v1/chat/completions",
        &chat("", r#", "reasoning_effort": "extreme""#),
    );
    let (param, message) = error_param(status, &body);
    assert_eq!(param, "reasoning_effort", "{body}");
    assert!(message.contains("high"), "{message}");

    // Fields not served, given a value other than the default: refused, named.
    for (field, value) in [
        ("modalities", r#"["text", "audio"]"#),
        ("audio", r#"{"voice": "alloy"}"#),
    ] {
        let (status, _, body) = post(
            "/v1/chat/completions",
            &chat("", &format!(r#", "{field}": {value}"#)),
        );
        let (param, message) = error_param(status, &body);
        assert_eq!(param, field, "{body}");
        assert!(
            message.starts_with(&format!("{field}: ")) && message.contains("is not supported"),
            "{message}"
        );
    }
    // A long refused value is cut short in the message.
    let voice = "a".repeat(2000);
    let (status, _, body) = post(
        "/v1/chat/completions",
        &chat("", &format!(r#", "audio": {{"voice": "{voice}"}}"#)),
    );
    let (param, message) = error_param(status, &body);
    assert_eq!(param, "audio");
    assert!(message.len() < 200, "{message}");
    // A refused request still names what it ignored.
    let (status, headers, body) = post(
        "/v1/completions",
        r#"{"prompt": "Hi", "echo": true, "frobnicate": 1}"#,
    );
    assert_eq!(error_param(status, &body).0, "echo");
    assert_eq!(
        header(&headers, "x-archgen-ignored-fields"),
        Some("frobnicate")
    );

    // Wrong types: the JSON path and the expected type.
    for (request, param, expected) in [
        (
            r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": "ten"}"#.to_string(),
            "max_tokens",
            "max_tokens: expected an unsigned integer, got a string",
        ),
        (
            chat("", r#", "stream": "yes""#),
            "stream",
            "stream: expected a boolean (true or false), got a string",
        ),
        (
            chat("", r#", "temperature": [1]"#),
            "temperature",
            "temperature: expected a number, got a list",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": 7}]}"#.to_string(),
            "messages[1].role",
            "messages[1].role: invalid type: integer `7`, expected a string",
        ),
    ] {
        let (status, _, body) = post("/v1/chat/completions", &request);
        let (got_param, message) = error_param(status, &body);
        assert_eq!(
            (got_param.as_str(), message.as_str()),
            (param, expected),
            "{request}"
        );
    }

    // One model: its object, and OpenAI's 404 for another id.
    let (status, body) = curl(&server, "GET", "/v1/models/qwen3-tiny", None);
    assert_eq!(status, 200, "{body}");
    let listed = json(&curl(&server, "GET", "/v1/models", None).1);
    assert_eq!(json(&body), listed["data"][0]);
    for other in ["gpt-4o", "Qwen/Qwen3-0.6B"] {
        let (status, body) = curl(&server, "GET", &format!("/v1/models/{other}"), None);
        assert_eq!(status, 404, "{body}");
        let error = &json(&body)["error"];
        assert_eq!(error["code"], "model_not_found", "{body}");
        assert!(error["message"].as_str().unwrap().contains(other), "{body}");
    }

    // Tokens as vLLM's /tokenize and /detokenize give them: a text, and a
    // conversation as /v1/chat/completions renders it.
    let (status, body) = curl(
        &server,
        "POST",
        "/tokenize",
        Some(r#"{"prompt": "Hello there"}"#),
    );
    assert_eq!(status, 200, "{body}");
    let tokenized = json(&body);
    let count = tokenized["count"].as_u64().unwrap();
    assert!(count >= 2, "{body}");
    assert_eq!(tokenized["tokens"].as_array().unwrap().len() as u64, count);
    assert_eq!(tokenized["max_model_len"], 40960, "{body}");
    let completed = json(
        &curl(
            &server,
            "POST",
            "/v1/completions",
            Some(r#"{"prompt": "Hello there", "max_tokens": 1}"#),
        )
        .1,
    );
    assert_eq!(completed["usage"]["prompt_tokens"].as_u64(), Some(count));
    let (status, body) = curl(
        &server,
        "POST",
        "/detokenize",
        Some(&json!({"tokens": tokenized["tokens"]}).to_string()),
    );
    assert_eq!(
        (status, json(&body)["prompt"].clone()),
        (200, json!("Hello there"))
    );
    let conversation = r#"[{"role": "user", "content": "Hi"}]"#;
    let (_, body) = curl(
        &server,
        "POST",
        "/tokenize",
        Some(&format!(r#"{{"messages": {conversation}}}"#)),
    );
    let chatted = json(
        &curl(
            &server,
            "POST",
            "/v1/chat/completions",
            Some(&format!(
                r#"{{"messages": {conversation}, "max_tokens": 1}}"#
            )),
        )
        .1,
    );
    assert_eq!(
        json(&body)["count"],
        chatted["usage"]["prompt_tokens"],
        "{body}"
    );
    // An assistant turn's reasoning sent back as `reasoning_content`
    // reaches the template: Qwen3's writes it into the turn, as it writes
    // reasoning left in the content.
    let tokens_of = |assistant: serde_json::Value| {
        let body = json!({"messages": [{"role": "user", "content": "2+2?"}, assistant],
                          "add_generation_prompt": false});
        let (status, body) = curl(&server, "POST", "/tokenize", Some(&body.to_string()));
        assert_eq!(status, 200, "{body}");
        json(&body)["tokens"].clone()
    };
    let inline =
        tokens_of(json!({"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}));
    let apart =
        tokens_of(json!({"role": "assistant", "content": "4", "reasoning_content": "add them"}));
    let without = tokens_of(json!({"role": "assistant", "content": "4"}));
    assert_eq!(apart, inline);
    assert_ne!(apart, without);
    let (status, body) = curl(
        &server,
        "POST",
        "/detokenize",
        Some(r#"{"tokens": [5, 99999]}"#),
    );
    assert_eq!(error_param(status, &body).0, "tokens[1]", "{body}");
    let (status, body) = curl(
        &server,
        "POST",
        "/detokenize",
        Some(r#"{"tokens": [5, -1]}"#),
    );
    assert_eq!(error_param(status, &body).0, "tokens[1]", "{body}");
    let (status, body) = curl(&server, "POST", "/tokenize", Some(r#"{}"#));
    assert!(
        error_message(status, &body).contains("either prompt"),
        "{body}"
    );

    // Log-probabilities keyed by token: the tiny vocabulary holds a token
    // for every byte, and the random model's most likely tokens include
    // bytes of partial characters (each decodes alone to U+FFFD), several
    // at one position. Every entry stays, keyed by its bytes.
    let (status, body) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": [1, 274, 261], "max_tokens": 24, "temperature": 0, "logprobs": 5}"#),
    );
    assert_eq!(status, 200, "{body}");
    let logprobs = &json(&body)["choices"][0]["logprobs"];
    let tops = logprobs["top_logprobs"].as_array().unwrap();
    let mut partial_pairs = 0;
    for (i, top) in tops.iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 5, "position {i}: {top:?}");
        // Greedy: the token is the most likely one, so among the five.
        let token = logprobs["tokens"][i].as_str().unwrap();
        assert!(
            top.contains_key(token),
            "position {i}: {token} not in {top:?}"
        );
        assert!(!top.contains_key("\u{fffd}"), "position {i}: {top:?}");
        if top.keys().filter(|k| k.starts_with("bytes:")).count() >= 2 {
            partial_pairs += 1;
        }
    }
    assert!(
        partial_pairs > 0,
        "no position had two partial-character tokens: {body}"
    );
    let (status, body) = curl(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(
            r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 24,
                "temperature": 0, "logprobs": true, "top_logprobs": 5}"#,
        ),
    );
    assert_eq!(status, 200, "{body}");
    let content = json(&body)["choices"][0]["logprobs"]["content"].clone();
    let mut partial = 0;
    for entry in content.as_array().unwrap() {
        for one in std::iter::once(entry).chain(entry["top_logprobs"].as_array().unwrap()) {
            let label = one["token"].as_str().unwrap();
            let bytes: Vec<u8> = serde_json::from_value(one["bytes"].clone()).unwrap();
            match std::str::from_utf8(&bytes) {
                Ok(text) => assert_eq!(label, text, "{one}"),
                Err(_) => {
                    partial += 1;
                    let escaped: String = bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
                    assert_eq!(label, format!("bytes:{escaped}"), "{one}");
                }
            }
        }
    }
    assert!(partial > 0, "no partial-character token: {body}");

    // The log line of a request with unknown fields warns of them.
    std::thread::sleep(Duration::from_millis(200));
    let logs = server.request_logs();
    assert!(
        logs.iter().any(
            |l| l["warning"] == format!("unknown fields ignored: {named}") && l["status"] == 200
        ),
        "{logs:?}"
    );
}

/// `--api-key` (here from ARCHGEN_API_KEY, which the flag overrides): every
/// route but /health wants the key; the official openai client, driven as
/// frameworks drive it (tests/python/openai_framework_client.py: a wrong
/// key, `models.retrieve`, extra and null fields, `stream_options`, the 400s
/// it reads `param` from), works against it.
#[test]
fn serves_clients_with_an_api_key_as_frameworks_call_it() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let server = start_server_with_env(
        &model,
        &["--api-key", "sk-flag"],
        &[("ARCHGEN_API_KEY", "sk-env")],
    );
    let auth = |key: &str| format!("Authorization: Bearer {key}");
    let (status, _, body) = curl_with(&server, "GET", "/v1/models", None, &[]);
    assert_eq!(status, 401, "{body}");
    let error = &json(&body)["error"];
    assert_eq!(
        (
            error["type"].as_str(),
            error["code"].as_str(),
            &error["param"]
        ),
        (
            Some("invalid_request_error"),
            Some("invalid_api_key"),
            &json!(null)
        ),
        "{body}"
    );
    for (method, path, body) in [
        ("GET", "/metrics", None),
        ("POST", "/tokenize", Some(r#"{"prompt": "Hi"}"#)),
        (
            "POST",
            "/v1/completions",
            Some(r#"{"prompt": "Hi", "max_tokens": 1}"#),
        ),
    ] {
        for key in [None, Some("sk-env"), Some("sk-fla"), Some("sk-flagg")] {
            let headers: Vec<String> = key.map(auth).into_iter().collect();
            let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
            let (status, _, answer) = curl_with(&server, method, path, body, &headers);
            assert_eq!(status, 401, "{path} with {key:?}: {answer}");
        }
        let (status, _, answer) = curl_with(&server, method, path, body, &[&auth("sk-flag")]);
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let (status, _, body) = curl_with(&server, "GET", "/health", None, &[]);
    assert_eq!(status, 200, "{body}");

    let base = format!("{}/v1", server.base);
    let out = run_python(
        "openai_framework_client.py",
        &[base.as_ref(), "sk-flag".as_ref(), "qwen3-tiny".as_ref()],
    );
    let seen = json(out.lines().last().unwrap());
    assert!(seen["text"].is_string(), "{seen}");
}

/// `--allowed-origins`: a browser's preflight from an allowed origin is
/// answered (before the key check: it carries none; the key comes from
/// ARCHGEN_API_KEY here) and its answers carry the origin; another origin
/// gets no CORS header. Without the flag no CORS header is sent and a
/// preflight is a plain 204. A server on every address without a key warns.
#[test]
fn answers_browsers_from_the_allowed_origins_only() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let preflight = |server: &Server, origin: &str| {
        curl_with(
            server,
            "OPTIONS",
            "/v1/chat/completions",
            None,
            &[
                &format!("Origin: {origin}"),
                "Access-Control-Request-Method: POST",
                "Access-Control-Request-Headers: authorization, content-type",
            ],
        )
    };
    let allowed = "http://app.example:3000";
    let server = start_server_with_env(
        &model,
        &[
            "--allowed-origins",
            &format!("http://other.example,{allowed}"),
        ],
        &[("ARCHGEN_API_KEY", "sk-env")],
    );
    let (status, headers, body) = preflight(&server, allowed);
    assert!(status == 200 || status == 204, "{status}: {body}");
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some(allowed)
    );
    let methods = header(&headers, "access-control-allow-methods").unwrap_or("");
    assert!(methods.contains("POST"), "{headers:?}");
    let asked = header(&headers, "access-control-allow-headers").unwrap_or("");
    assert!(asked.contains("authorization"), "{headers:?}");
    let (_, headers, _) = preflight(&server, "http://evil.example");
    assert_eq!(header(&headers, "access-control-allow-origin"), None);
    let unkeyed = |server: &Server| server.startup.iter().any(|l| l.contains("no --api-key"));
    assert!(!unkeyed(&server), "{:?}", server.startup);
    let origin = format!("Origin: {allowed}");
    let (status, headers, body) = curl_with(
        &server,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "Hi", "max_tokens": 1}"#),
        &[&origin, "Authorization: Bearer sk-env"],
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some(allowed)
    );
    let exposed = header(&headers, "access-control-expose-headers").unwrap_or("");
    assert!(exposed.contains("x-archgen-ignored-fields"), "{headers:?}");
    assert!(exposed.contains("x-archgen-seed"), "{headers:?}");
    let (status, headers, _) = curl_with(&server, "GET", "/v1/models", None, &[&origin]);
    assert_eq!(status, 401, "the key is still wanted");
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some(allowed)
    );
    drop(server);

    // On every address and without a key: the server warns at start.
    let server = start_server(&model, &["--host", "0.0.0.0"]);
    assert!(unkeyed(&server), "{:?}", server.startup);
    let (status, headers, body) = preflight(&server, allowed);
    assert_eq!(status, 204, "{body}");
    assert_eq!(header(&headers, "access-control-allow-origin"), None);
    assert_eq!(header(&headers, "allow"), Some("GET, POST, OPTIONS"));
    let (status, headers, _) = curl_with(&server, "GET", "/v1/models", None, &[&origin]);
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "access-control-allow-origin"), None);
}

#[test]
fn chat_and_serve_refuse_a_checkpoint_without_what_they_need() {
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("bare");
    let spec = repo_root().join("specs/qwen3-0.6b-tiny.yaml");
    let (ok, _, err) = archgen(
        &[
            "init",
            "--spec",
            spec.to_str().unwrap(),
            "--out",
            model.to_str().unwrap(),
        ],
        "",
        Duration::from_secs(300),
    );
    assert!(ok, "{err}");
    let model_s = model.to_str().unwrap();
    for args in [
        vec!["chat", "--model", model_s],
        vec!["serve", "--model", model_s, "--port", "0"],
        vec!["generate", "--chat", "--model", model_s, "--prompt", "hi"],
    ] {
        let (ok, _, err) = archgen(&args, "", Duration::from_secs(120));
        assert!(!ok, "{args:?} ran without a tokenizer");
        assert!(
            err.contains("tokenizer.json (not found)"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    // A broken tokenizer.json is named.
    std::fs::write(model.join("tokenizer.json"), "{").unwrap();
    let (ok, _, err) = archgen(&["chat", "--model", model_s], "", Duration::from_secs(120));
    assert!(
        !ok && err.contains("cannot read") && err.contains("tokenizer.json"),
        "{err}"
    );
    // A tokenizer but no chat template.
    let vocab = [("<unk>".to_string(), 0u32), ("hi".to_string(), 1)]
        .into_iter()
        .collect();
    let wordlevel = tokenizers::models::wordlevel::WordLevel::builder()
        .vocab(vocab)
        .unk_token("<unk>".into())
        .build()
        .unwrap();
    tokenizers::Tokenizer::new(wordlevel)
        .save(model.join("tokenizer.json"), false)
        .unwrap();
    for args in [
        vec!["chat", "--model", model_s],
        vec!["generate", "--chat", "--model", model_s, "--prompt", "hi"],
    ] {
        let (ok, _, err) = archgen(&args, "", Duration::from_secs(120));
        assert!(
            !ok && err.contains("has no chat template"),
            "{args:?}: {err}"
        );
    }
}

/// The value of an unlabelled metric in GET /metrics.
/// A chat is fed and cached in mlx-lm's server's segments (its system
/// turns, its user turn, a reasoning tail) and rendered with
/// `enable_thinking` as mlx-lm renders it: the same chats sent to
/// `mlx_lm.server` and to `archgen serve`, one at a time
/// (tests/python/server_segments_check.py), give the same prompt lengths,
/// the same cached-token counts and the same log-probabilities, on a Gated
/// DeltaNet checkpoint whose tokenizer has reasoning markers (its cache
/// cannot be trimmed, so only the stored segment ends are reused) and on a
/// full-attention one whose tokenizer has none. float32 weights, so a
/// prompt fed in other chunks shows in the log-probabilities.
#[test]
fn chats_are_cached_and_computed_in_mlx_lm_servers_segments() {
    let root = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str]); 2] = [
        ("qwen3.5-4b-tiny", &["<think>", "</think>"]),
        ("qwen3-0.6b-tiny", &[]),
    ];
    for (spec_name, added) in cases {
        let model = root.path().join(spec_name);
        init_tiny(spec_name, &model, &["--dtype", "float32"]);
        let template =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates/qwen3.jinja");
        let added_file = root.path().join(format!("{spec_name}.added.json"));
        std::fs::write(&added_file, serde_json::to_string(added).unwrap()).unwrap();
        run_python(
            "make_chat_tokenizer.py",
            &[
                model.as_os_str(),
                template.as_os_str(),
                added_file.as_os_str(),
            ],
        );
        let server = start_server(&model, &[]);
        let out = json(&run_python(
            "server_segments_check.py",
            &[server.base.as_ref(), model.as_os_str()],
        ));
        let (ours, theirs) = (
            out["archgen"].as_array().unwrap(),
            out["mlx_lm"].as_array().unwrap(),
        );
        assert_eq!(ours.len(), theirs.len());
        for (i, (a, m)) in ours.iter().zip(theirs).enumerate() {
            for key in ["prompt_tokens", "cached_tokens", "logprobs"] {
                assert_eq!(a[key], m[key], "{spec_name}, chat {i}: {key}:\n{a}\n{m}");
            }
        }
        // The chats that share the system prompt, or repeat a conversation,
        // were served from the cache.
        let cached: Vec<u64> = ours
            .iter()
            .map(|a| a["cached_tokens"].as_u64().unwrap())
            .collect();
        assert!(
            cached[1] > 0 && cached[2] > cached[1],
            "{spec_name}: {cached:?}"
        );
    }
}

/// Gemma-4's own chat template (tests/fixtures/chat_templates/gemma4.jinja)
/// on a tiny Gemma-4 served in batches: the openai client's `tools=`
/// requests (declared tools, a tool-call history, streaming, `tool_choice`)
/// give the prompts transformers renders with that template, token for token.
#[test]
fn serves_tools_through_gemma4s_chat_template() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model_with(
        root.path(),
        "gemma4-e2b-tiny",
        "gemma4-tiny",
        "gemma4.jinja",
    );
    let server = start_server(&model, &["--max-batch", "4"]);
    let base = format!("{}/v1", server.base);
    let out = run_python(
        "openai_client_check.py",
        &[base.as_ref(), model.as_os_str(), "--tools-only".as_ref()],
    );
    assert_eq!(
        json(out.lines().last().unwrap())["tools"],
        "checked",
        "{out}"
    );
}

/// A model that writes one tool call (tests/python/make_tool_call_model.py:
/// a tiny Qwen3 whose weights chain the call's pieces, each one added token)
/// under each markup archgen parses: Qwen3's hermes `<tool_call>` JSON with
/// the Qwen3 template, Gemma-4's `<|tool_call>call:...` with Gemma-4's. The
/// openai client must get it as `tool_calls`, whole and streamed.
#[test]
fn returns_the_tool_calls_a_model_writes_in_qwen3_and_gemma4_markup() {
    let formats: [(&str, &[&str]); 2] = [
        (
            "qwen3.jinja",
            &[
                "<tool_call>\n",
                r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
                "\n</tool_call>",
            ],
        ),
        (
            "gemma4.jinja",
            &[
                "<|tool_call>",
                r#"call:get_weather{city:<|"|>Paris<|"|>}"#,
                "<tool_call|>",
            ],
        ),
    ];
    for (template, pieces) in formats {
        let root = tempfile::tempdir().unwrap();
        let (model, made) = tiny_chat_model_adding(
            root.path(),
            "qwen3-0.6b-tiny",
            "tool-caller",
            template,
            pieces,
        );
        let ids: Vec<String> = made["added"]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.to_string())
            .collect();
        assert_eq!(ids.len(), pieces.len(), "{made}");
        let ids = ids.join(",");
        run_python(
            "make_tool_call_model.py",
            &[model.as_os_str(), ids.as_ref()],
        );
        let server = start_server(&model, &["--max-batch", "4"]);
        let base = format!("{}/v1", server.base);
        let out = run_python("tool_call_client.py", &[base.as_ref()]);
        assert_eq!(
            json(out.lines().last().unwrap())["tool_calls"],
            "checked",
            "{template}: {out}"
        );
    }
}

/// A model that writes reasoning (make_tool_call_model.py's fixed chain,
/// with `<think>` and `</think>` added to its tokenizer, so the server finds
/// reasoning markers): the reasoning comes back as `reasoning`, apart from
/// the content and the tool calls, whole and streamed, as `mlx_lm.server`
/// returns it (tests/python/reasoning_check.py asks both). Three answers:
/// reasoning then content; the same after a prompt whose template opened
/// the reasoning block (so the answer begins inside it); reasoning ended
/// by a tool call.
#[test]
fn reasoning_is_returned_apart_from_the_content_as_mlx_lm_server_returns_it() {
    const CALL: &str = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
    let qwen3 =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates/qwen3.jinja");
    let root = tempfile::tempdir().unwrap();
    // Qwen3's template with the reasoning block opened in the generation
    // prompt (as thinking-only checkpoints' templates write it).
    let opened = root.path().join("qwen3-opened.jinja");
    let text = std::fs::read_to_string(&qwen3).unwrap();
    let generation_header = r"{{- '<|im_start|>assistant\n' }}";
    assert!(text.contains(generation_header));
    // It also writes `reasoning_effort` into the generation prompt when
    // given, as gpt-oss's template does.
    std::fs::write(
        &opened,
        text.replace(
            generation_header,
            r"{%- if reasoning_effort is defined %}{{- 'Reasoning: ' + reasoning_effort + '\n' }}{%- endif %}{{- '<|im_start|>assistant\n<think>\n' }}",
        ),
    )
    .unwrap();
    let plain: &[&str] = &["<think>", "plan it", "</think>", "The answer"];
    let with_call: &[&str] = &[
        "<think>",
        "plan it",
        "<tool_call>\n",
        CALL,
        "\n</tool_call>",
        "</think>",
    ];
    // (template, added tokens, the chain's pieces (indices into them),
    // tools offered, expected reasoning, content, calls, finish reason)
    type Case<'a> = (
        &'a Path,
        &'a [&'a str],
        &'a [usize],
        bool,
        serde_json::Value,
    );
    let cases: [Case; 3] = [
        (
            &qwen3,
            plain,
            &[0, 1, 2, 3],
            false,
            json!({"reasoning": "plan it", "content": "The answer", "tool_calls": [], "finish_reason": "stop"}),
        ),
        (
            &opened,
            plain,
            &[1, 2, 3],
            false,
            json!({"reasoning": "plan it", "content": "The answer", "tool_calls": [], "finish_reason": "stop"}),
        ),
        (
            &qwen3,
            with_call,
            &[0, 1, 2, 3, 4],
            true,
            json!({"reasoning": "plan it", "content": "", "tool_calls": [["get_weather", {"city": "Paris"}]],
                "finish_reason": "tool_calls"}),
        ),
    ];
    for (i, (template, added, chain, tools, expected)) in cases.into_iter().enumerate() {
        let dir = format!("reasoner-{i}");
        let (model, made) = tiny_chat_model_adding(
            root.path(),
            "qwen3-0.6b-tiny",
            &dir,
            template.to_str().unwrap(),
            added,
        );
        let ids: Vec<String> = chain
            .iter()
            .map(|&k| made["added"][k].to_string())
            .collect();
        run_python(
            "make_tool_call_model.py",
            &[model.as_os_str(), ids.join(",").as_ref()],
        );
        let server = start_server(&model, &[]);
        let mut args = vec![server.base.as_str(), model.to_str().unwrap()];
        if tools {
            args.push("--tools");
        }
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        let out = json(&run_python("reasoning_check.py", &args));
        for (server_name, how) in [
            ("archgen", "whole"),
            ("archgen", "stream"),
            ("mlx_lm", "whole"),
            ("mlx_lm", "stream"),
        ] {
            assert_eq!(
                out[server_name][how], expected,
                "case {i}, {server_name} {how}: {out}"
            );
        }
        // A grammar holds the answer from its first token, so after the
        // prompt that opened a reasoning block its text is content.
        // `reasoning_effort` reaches this template, under the request's own
        // template variables.
        if template == opened.as_path() {
            let prompt_tokens = |extra: serde_json::Value| {
                let mut body =
                    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
                body.as_object_mut()
                    .unwrap()
                    .extend(extra.as_object().unwrap().clone());
                let (status, headers, body) = curl_with(
                    &server,
                    "POST",
                    "/v1/chat/completions",
                    Some(&body.to_string()),
                    &[],
                );
                assert_eq!(status, 200, "{body}");
                assert_eq!(header(&headers, "x-archgen-ignored-fields"), None);
                json(&body)["usage"]["prompt_tokens"].as_u64().unwrap()
            };
            let plain = prompt_tokens(json!({}));
            let low = prompt_tokens(json!({"reasoning_effort": "low"}));
            assert!(low > plain, "{low} {plain}");
            assert_eq!(
                prompt_tokens(json!({"chat_template_kwargs": {"reasoning_effort": "low"}})),
                low
            );
            let long = json!({"reasoning_effort": "high, and think it through step by step"});
            let by_kwargs = prompt_tokens(json!({"chat_template_kwargs": long}));
            assert!(by_kwargs > low, "{by_kwargs} {low}");
            assert_eq!(
                prompt_tokens(json!({"reasoning_effort": "low", "chat_template_kwargs": long})),
                by_kwargs
            );
            let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16,
                              "temperature": 0, "response_format": {"type": "json_object"}});
            let (status, body) = curl(
                &server,
                "POST",
                "/v1/chat/completions",
                Some(&body.to_string()),
            );
            assert_eq!(status, 200, "{body}");
            let message = &json(&body)["choices"][0]["message"];
            assert!(message.get("reasoning").is_none(), "{body}");
            assert!(
                message["content"].as_str().unwrap().starts_with('{'),
                "{body}"
            );
        }
    }
}

fn metric(server: &Server, name: &str) -> f64 {
    let (status, body) = curl(server, "GET", "/metrics", None);
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{body}"))
        .trim()
        .parse()
        .unwrap()
}

/// Polls a metric until `ok` holds (bounded by `limit`).
fn wait_for_metric(server: &Server, name: &str, ok: impl Fn(f64) -> bool, limit: Duration) {
    let start = Instant::now();
    loop {
        let value = metric(server, name);
        if ok(value) {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{name} is still {value} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A request running in the background (curl, bounded by its --max-time);
/// its output lines are timestamped as they arrive. Killed when dropped.
struct Background {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
}

impl Background {
    fn start(server: &Server, path: &str, body: &str) -> Background {
        let mut child = Command::new("curl")
            .args(["-sS", "-N", "--max-time", "120", "-H"])
            .args(["Content-Type: application/json", "--data-binary", "@-"])
            .arg(format!("{}{path}", server.base))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("curl runs");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(body.as_bytes()).unwrap();
        drop(stdin);
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send((Instant::now(), line));
            }
        });
        Background { child, lines }
    }

    /// Closes the connection, as a client that goes away does.
    fn disconnect(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for curl to end; returns the lines with their arrival times.
    fn finish(mut self, limit: Duration) -> Vec<(Instant, String)> {
        let start = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < limit, "a request ran past {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        // curl has exited, but the reader may not have sent its last line
        // yet (a whole answer is one line, sent at EOF): read until the
        // reader hangs up, which it does at EOF.
        let mut lines = Vec::new();
        loop {
            match self.lines.recv_timeout(Duration::from_secs(10)) {
                Ok(line) => lines.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return lines,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("curl ended but its output was not read within 10 s")
                }
            }
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A completions request for `n` prompt token ids (valid for the tiny vocabulary).
fn long_prompt_body(n: usize, max_tokens: usize, stream: bool) -> String {
    let ids: Vec<String> = (0..n).map(|i| (3 + i % 500).to_string()).collect();
    format!(
        r#"{{"prompt": [{}], "max_tokens": {max_tokens}, "temperature": 0, "stream": {stream}}}"#,
        ids.join(",")
    )
}

#[test]
fn schedules_interleaves_bounds_the_queue_and_cancels_dropped_clients() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    // Prefill chunks of 16 tokens: a 3000-token prompt takes about 190 steps
    // (seconds on 2 cores), the short request below about 8.
    let server = start_server(
        &model,
        &[
            "--impl",
            "generated",
            "--max-batch",
            "2",
            "--max-queue",
            "1",
            "--prefill-step",
            "16",
        ],
    );
    let (status, body) = curl(&server, "GET", "/health", None);
    assert_eq!((status, json(&body)["status"].clone()), (200, "ok".into()));
    let short = r#"{"prompt": "Hello there", "max_tokens": 6, "temperature": 0}"#;
    let (status, alone) = curl(&server, "POST", "/v1/completions", Some(short));
    assert_eq!(status, 200, "{alone}");
    let alone_text = json(&alone)["choices"][0]["text"].clone();

    // A short request sent while a long prompt is in prefill completes
    // before the long one's first token, with the text it gets alone.
    let long = Background::start(
        &server,
        "/v1/completions",
        &long_prompt_body(3_000, 20_000, true),
    );
    wait_for_metric(
        &server,
        "archgen_active_sequences",
        |v| v == 1.0,
        Duration::from_secs(60),
    );
    let (status, _) = curl(&server, "GET", "/v1/models", None);
    assert_eq!(status, 200, "/v1/models answers during a prefill");
    let sent = Instant::now();
    let (status, body) = curl(&server, "POST", "/v1/completions", Some(short));
    let short_done = Instant::now();
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["choices"][0]["text"], alone_text);
    let first_long_token = loop {
        let (at, line) = long.lines.recv_timeout(Duration::from_secs(120)).unwrap();
        if line.contains("\"text\":\"") && !line.contains("\"text\":\"\"") {
            break at;
        }
    };
    assert!(
        short_done < first_long_token,
        "the short request ({:?}) waited for the long prompt's prefill",
        short_done - sent
    );

    // The batch is full (the long one and another); one request waits; the
    // next is refused with 429 and an OpenAI-style body.
    let second = Background::start(
        &server,
        "/v1/completions",
        &long_prompt_body(1_000, 20_000, true),
    );
    wait_for_metric(
        &server,
        "archgen_active_sequences",
        |v| v == 2.0,
        Duration::from_secs(60),
    );
    let waiting = Background::start(
        &server,
        "/v1/completions",
        &long_prompt_body(1_000, 20_000, false),
    );
    wait_for_metric(
        &server,
        "archgen_queue_depth",
        |v| v == 1.0,
        Duration::from_secs(60),
    );
    let (status, headers, body) = curl_with(&server, "POST", "/v1/completions", Some(short), &[]);
    assert_eq!(status, 429, "{body}");
    assert_eq!(header(&headers, "retry-after"), Some("1"), "{headers:?}");
    let error = &json(&body)["error"];
    assert_eq!(
        (error["type"].as_str(), error["code"].as_str()),
        (Some("rate_limit_error"), Some("queue_full")),
        "{body}"
    );
    assert!(error["message"].as_str().unwrap().contains("--max-queue"));

    // Clients that go away: two streams, then a non-streamed request once
    // it is running. Each sequence is dropped within a few steps.
    long.disconnect();
    second.disconnect();
    wait_for_metric(
        &server,
        "archgen_queue_depth",
        |v| v == 0.0,
        Duration::from_secs(30),
    );
    wait_for_metric(
        &server,
        "archgen_active_sequences",
        |v| v == 1.0,
        Duration::from_secs(30),
    );
    waiting.disconnect();
    wait_for_metric(
        &server,
        "archgen_active_sequences",
        |v| v == 0.0,
        Duration::from_secs(30),
    );
    assert_eq!(metric(&server, "archgen_cancelled_sequences_total"), 3.0);
    let start = Instant::now();
    let (status, body) = curl(&server, "POST", "/v1/completions", Some(short));
    assert_eq!(status, 200, "{body}");
    assert!(start.elapsed() < Duration::from_secs(15));

    // Operations: the metrics a dashboard reads, one log line per request.
    let (_, text) = curl(&server, "GET", "/metrics", None);
    for name in [
        "archgen_time_to_first_token_seconds_bucket",
        "archgen_queue_wait_seconds_count",
        "archgen_scheduler_step_seconds_count{kind=\"",
        "archgen_inter_token_latency_seconds_count",
        "archgen_requests_total{status=\"429\"} 1",
        "archgen_requests_total{status=\"499\"} 3",
    ] {
        assert!(text.contains(name), "{name} not in:\n{text}");
    }
    assert!(metric(&server, "archgen_generated_tokens_total") >= 18.0);
    // Where the time to first token goes: waiting in the queue, and the
    // model thread's steps, full ones and the decode-only ones that ran
    // while the long prompt was in prefill.
    assert!(metric(&server, "archgen_queue_wait_seconds_count") >= 3.0);
    for kind in ["full", "decode_only"] {
        let name = format!("archgen_scheduler_step_seconds_count{{kind=\"{kind}\"}}");
        assert!(metric(&server, &name) > 0.0, "{name}");
    }
    // And the parts of those steps: every part ran at least once (the long
    // prompt's chunks, the short requests joining and decoding).
    for phase in ["generation", "admission", "joining", "prefill"] {
        let name = format!("archgen_step_phase_seconds_count{{phase=\"{phase}\"}}");
        assert!(metric(&server, &name) > 0.0, "{name}");
    }
    // A step's parts take no longer than the steps (the parts read first:
    // a step's time is recorded before its parts').
    let parts: f64 = ["generation", "admission", "joining", "prefill"]
        .iter()
        .map(|p| {
            metric(
                &server,
                &format!("archgen_step_phase_seconds_sum{{phase=\"{p}\"}}"),
            )
        })
        .sum();
    let steps: f64 = ["full", "decode_only"]
        .iter()
        .map(|k| {
            metric(
                &server,
                &format!("archgen_scheduler_step_seconds_sum{{kind=\"{k}\"}}"),
            )
        })
        .sum();
    assert!(parts <= steps, "parts {parts} s, steps {steps} s");
    // The memory a long run is watched with: the model's weights are MLX
    // arrays, and the process holds at least them.
    let active = metric(&server, "archgen_mlx_active_bytes");
    assert!(active > 0.0, "{text}");
    assert!(metric(&server, "archgen_mlx_peak_bytes") >= active);
    assert!(metric(&server, "archgen_process_resident_bytes") > active);
    assert!(metric(&server, "archgen_mlx_cache_bytes") >= 0.0);
    // The generated qwen3 model batches (its `impl BatchLm`): the server
    // said so.
    assert!(
        server
            .startup
            .iter()
            .any(|l| l.contains("decode as one batched forward")),
        "{:?}",
        server.startup
    );
    std::thread::sleep(Duration::from_millis(200));
    let logs = server.request_logs();
    let statuses: Vec<u64> = logs.iter().map(|l| l["status"].as_u64().unwrap()).collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        3,
        "{logs:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 499).count(),
        3,
        "{logs:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        1,
        "{logs:?}"
    );
    let done = logs.iter().find(|l| l["status"] == 200).unwrap();
    for field in [
        "id",
        "prompt_tokens",
        "completion_tokens",
        "finish_reason",
        "ttft_s",
        "duration_s",
    ] {
        assert!(!done[field].is_null(), "{field} in {done}");
    }
}

#[test]
fn refuses_past_the_context_and_the_ceilings_before_compute_and_drains_on_sigterm() {
    let root = tempfile::tempdir().unwrap();
    // Gemma-4 whose config.json omits max_position_embeddings: the context is
    // mlx-lm's gemma4 default, 131072.
    let model = root.path().join("gemma4-tiny");
    let spec = repo_root().join("specs/gemma4-e2b-tiny.yaml");
    let (ok, _, err) = archgen(
        &[
            "init",
            "--spec",
            spec.to_str().unwrap(),
            "--out",
            model.to_str().unwrap(),
        ],
        "",
        Duration::from_secs(300),
    );
    assert!(ok, "init failed: {err}");
    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates/qwen3.jinja");
    run_python(
        "make_chat_tokenizer.py",
        &[model.as_os_str(), template.as_os_str()],
    );
    let config_path = model.join("config.json");
    let mut config = json(&std::fs::read_to_string(&config_path).unwrap());
    let removed = [
        config
            .as_object_mut()
            .unwrap()
            .remove("max_position_embeddings"),
        config["text_config"]
            .as_object_mut()
            .and_then(|t| t.remove("max_position_embeddings")),
    ];
    assert!(removed.iter().any(Option::is_some), "{config}");
    std::fs::write(&config_path, config.to_string()).unwrap();
    // Chunks of 8 prompt tokens: the request in flight at SIGTERM runs a while.
    let server = start_server(
        &model,
        &[
            "--max-prompt-tokens",
            "1000",
            "--max-tokens",
            "64",
            "--prefill-step",
            "8",
        ],
    );

    let start = Instant::now();
    let (status, body) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(&long_prompt_body(131_073, 1, false)),
    );
    let message = error_message(status, &body);
    assert!(
        message.contains("maximum context length is 131072")
            && message.contains("config.json omits it"),
        "{message}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let (status, body) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(&long_prompt_body(1001, 1, false)),
    );
    assert!(error_message(status, &body).contains("--max-prompt-tokens"));
    let (status, body) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "Hello", "max_tokens": 65}"#),
    );
    assert!(error_message(status, &body).contains("--max-tokens"));
    assert_eq!(
        metric(&server, "archgen_prompt_tokens_total"),
        0.0,
        "nothing was queued"
    );

    // SIGTERM while a stream is in flight: it finishes, the server exits 0.
    let mut server = server;
    let stream = Background::start(
        &server,
        "/v1/completions",
        &long_prompt_body(1000, 64, true),
    );
    wait_for_metric(
        &server,
        "archgen_active_sequences",
        |v| v == 1.0,
        Duration::from_secs(60),
    );
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    // While it drains the server still answers: /health and new requests 503.
    let start = Instant::now();
    let (status, body) = loop {
        let (status, body) = curl(&server, "GET", "/health", None);
        if status != 200 || start.elapsed() > Duration::from_secs(10) {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!((status, json(&body)), (503, json!({"status": "draining"})));
    let (status, body) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "Hello", "max_tokens": 1}"#),
    );
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("shutting down"), "{body}");
    assert_eq!(
        metric(&server, "archgen_active_sequences"),
        1.0,
        "the stream was still running"
    );
    let lines = stream.finish(Duration::from_secs(60));
    let events: Vec<&str> = lines
        .iter()
        .filter_map(|(_, l)| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{lines:?}");
    let last = json(events[events.len() - 2]);
    assert!(
        last["choices"][0]["finish_reason"].is_string(),
        "the stream ended with its finish_reason: {last}"
    );
    let start = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

/// A greedy completions request for token ids: `n` ids from `first` on.
fn ids_body(first: usize, n: usize, max_tokens: usize, stream: bool) -> String {
    let ids: Vec<String> = (0..n)
        .map(|i| (first + 7 * i) % 500 + 3)
        .map(|t| t.to_string())
        .collect();
    format!(
        r#"{{"prompt": [{}], "max_tokens": {max_tokens}, "temperature": 0, "stream": {stream}}}"#,
        ids.join(",")
    )
}

/// The text and finish reason of a whole (not streamed) completion.
fn whole_answer(body: &str) -> (String, String) {
    let v = json(body);
    let choice = &v["choices"][0];
    (
        choice["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{body}"))
            .to_string(),
        choice["finish_reason"]
            .as_str()
            .unwrap_or_else(|| panic!("{body}"))
            .to_string(),
    )
}

/// The text and finish reason of a streamed completion: SSE `data:` lines,
/// each a JSON chunk, ended by `data: [DONE]`.
fn streamed_answer(lines: &[(Instant, String)]) -> (String, String) {
    let data: Vec<&str> = lines
        .iter()
        .filter_map(|(_, l)| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{lines:?}");
    let mut text = String::new();
    let mut finish = String::new();
    for chunk in &data[..data.len() - 1] {
        let v = json(chunk);
        text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}

#[test]
fn batches_concurrent_requests_with_the_monolith_as_they_run_alone() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let model_s = model.to_str().unwrap();
    let server = start_server(&model, &["--impl", "monolith", "--max-batch", "8"]);
    assert!(
        server
            .startup
            .iter()
            .any(|l| l.contains("decode as one batched forward")),
        "no note of the batched path: {:?}",
        server.startup
    );

    // Prompts of different lengths (so the batch pads them differently),
    // each answered alone first.
    let shapes = [(0, 3), (11, 17), (40, 9), (90, 30), (5, 1), (300, 12)];
    let max_tokens = 12;
    let alone: Vec<(String, String)> = shapes
        .iter()
        .map(|&(first, n)| {
            let (status, body) = curl(
                &server,
                "POST",
                "/v1/completions",
                Some(&ids_body(first, n, max_tokens, false)),
            );
            assert_eq!(status, 200, "{body}");
            whole_answer(&body)
        })
        .collect();
    for (text, finish) in &alone {
        assert!(!text.is_empty(), "{alone:?}");
        assert!(finish == "length" || finish == "stop", "{alone:?}");
    }

    // The first prompt alone is also what `archgen generate` gives.
    let ids: Vec<String> = (0..3).map(|i| ((7 * i) % 500 + 3).to_string()).collect();
    let (ok, stdout, stderr) = archgen(
        &[
            "generate",
            "--impl",
            "monolith",
            "--model",
            model_s,
            "--prompt-ids",
            &ids.join(","),
            "--max-tokens",
            &max_tokens.to_string(),
        ],
        "",
        Duration::from_secs(300),
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, format!("{}\n", alone[0].0));

    // A seeded request (its own sampler in the batch) alone: not the
    // greedy answer, so the sampler ran.
    let seeded_body = ids_body(0, 3, max_tokens, false).replace(
        r#""temperature": 0"#,
        r#""temperature": 3.0, "top_p": 0.95, "seed": 7"#,
    );
    let (status, body) = curl(&server, "POST", "/v1/completions", Some(&seeded_body));
    assert_eq!(status, 200, "{body}");
    let seeded_alone = whole_answer(&body);
    assert_ne!(
        seeded_alone, alone[0],
        "temperature 3.0 gave the greedy answer"
    );

    // All at once, half of them streamed, with the seeded one: each answer
    // is its alone answer, complete and well formed, and forwards computed
    // several sequences.
    let batched_extra = |server: &Server| {
        metric(server, "archgen_decode_batch_size_sum")
            - metric(server, "archgen_decode_batch_size_count")
    };
    assert_eq!(batched_extra(&server), 0.0, "one request at a time");
    let running: Vec<(bool, Background)> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(first, n))| {
            let stream = i % 2 == 1;
            let body = ids_body(first, n, max_tokens, stream);
            (stream, Background::start(&server, "/v1/completions", &body))
        })
        .collect();
    let seeded = Background::start(&server, "/v1/completions", &seeded_body);
    for ((stream, request), expected) in running.into_iter().zip(&alone) {
        let lines = request.finish(Duration::from_secs(120));
        let got = match stream {
            true => streamed_answer(&lines),
            false => {
                let body: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
                whole_answer(&body.join("\n"))
            }
        };
        assert_eq!(&got, expected, "streamed: {stream}");
    }
    let lines = seeded.finish(Duration::from_secs(120));
    let body: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(
        whole_answer(&body.join("\n")),
        seeded_alone,
        "seeded, batched"
    );
    assert!(
        batched_extra(&server) > 0.0,
        "no decode forward computed more than one sequence"
    );

    // One batched sequence goes away mid-decode: the others still give
    // their alone answers.
    let long_tokens = 40;
    let survivors = [(2, 5), (60, 21), (170, 2)];
    let survivors_alone: Vec<(String, String)> = survivors
        .iter()
        .map(|&(first, n)| {
            let (status, body) = curl(
                &server,
                "POST",
                "/v1/completions",
                Some(&ids_body(first, n, long_tokens, false)),
            );
            assert_eq!(status, 200, "{body}");
            whole_answer(&body)
        })
        .collect();
    let cancelled_before = metric(&server, "archgen_cancelled_sequences_total");
    let leaving = Background::start(&server, "/v1/completions", &ids_body(33, 8, 20_000, true));
    let running = stream_ids(&server, &survivors, long_tokens);
    // The leaving stream has tokens, so it is in the generation batch.
    loop {
        let (_, line) = leaving.lines.recv_timeout(Duration::from_secs(60)).unwrap();
        if line.contains("\"text\":\"") && !line.contains("\"text\":\"\"") {
            break;
        }
    }
    leaving.disconnect();
    for (request, expected) in running.into_iter().zip(&survivors_alone) {
        let got = streamed_answer(&request.finish(Duration::from_secs(120)));
        assert_eq!(&got, expected);
    }
    wait_for_metric(
        &server,
        "archgen_cancelled_sequences_total",
        |v| v == cancelled_before + 1.0,
        Duration::from_secs(30),
    );
    wait_for_metric(
        &server,
        "archgen_active_sequences",
        |v| v == 0.0,
        Duration::from_secs(30),
    );
    drop(server);

    // A server that keeps MLX's buffer pool after prefill chunks (the
    // keep-buffer-pool lever) gives the same answers to the same requests
    // sent at once: the pool decides where arrays live, not their values.
    // Returns the server, for a caller that reads its metrics after.
    let with_lever = |flags: &[&str], stated: &str, what: &str| -> Server {
        let mut args = vec!["--impl", "monolith", "--max-batch", "8"];
        args.extend_from_slice(flags);
        let server = start_server(&model, &args);
        assert!(
            server.startup.iter().any(|l| l.contains(stated)),
            "{what}: `{stated}` is not stated: {:?}",
            server.startup
        );
        let running = stream_ids(&server, &shapes, max_tokens);
        for (request, expected) in running.into_iter().zip(&alone) {
            let got = streamed_answer(&request.finish(Duration::from_secs(120)));
            assert_eq!(&got, expected, "{what}");
        }
        server
    };
    with_lever(
        &["--keep-buffer-pool"],
        "keep-buffer-pool (from its flag)",
        "with the buffer pool kept",
    );
    // The first-token-in-decode-step lever: a finished prompt's last token
    // runs in the next decode forward. Every request still gets its whole
    // answer, first token included; on this checkpoint on the CPU the rows
    // it shares that forward with leave its values as they were, so the
    // answers are the ones each prompt gets alone.
    with_lever(
        &["--first-token-in-decode-step", "on"],
        "a prompt's last token runs in the next decode forward",
        "with first tokens in the decode step",
    );
    // The defer-chunk-on-start lever, with chunks of 8 tokens so that the
    // 30-token prompt is still in prefill when the short ones start: its
    // chunk waits a step for them (counted), and every answer is the one
    // its prompt gets alone.
    let server = with_lever(
        &["--prefill-step", "8", "--defer-chunk-on-start", "on"],
        "defer-chunk-on-start (from its flag)",
        "with chunks deferred",
    );
    let deferred = metric(&server, "archgen_prefill_chunks_deferred_total");
    assert!(deferred >= 1.0, "no chunk was deferred");
}

/// Streamed completions of [`ids_body`]'s prompts (`(first, n)` each), all
/// sent at once.
fn stream_ids(server: &Server, prompts: &[(usize, usize)], max_tokens: usize) -> Vec<Background> {
    prompts
        .iter()
        .map(|&(first, n)| {
            Background::start(
                server,
                "/v1/completions",
                &ids_body(first, n, max_tokens, true),
            )
        })
        .collect()
}

/// A greedy completions request for exactly these token ids.
fn ids_request(ids: &[i64], max_tokens: usize) -> String {
    json!({"prompt": ids, "max_tokens": max_tokens, "temperature": 0}).to_string()
}

#[test]
fn serves_a_prompt_that_extends_a_finished_one_from_the_prompt_cache() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    // mlx-lm's split of the same requests (tests/python/prompt_cache_oracle.py):
    // request 1 is `prefix` (K tokens G), request 2 `prefix + G + suffix`,
    // request 3 `prefix + suffix` (the stored cache trimmed back to `prefix`).
    let prefix: Vec<i64> = vec![17, 240, 33, 310, 9, 151];
    let suffix: Vec<i64> = vec![88, 402, 61, 7, 230];
    let (k, n) = (3usize, 4usize);
    let case = root.path().join("case.json");
    let case_json = json!({"prefix": prefix, "prefix_decode": k, "suffix": suffix,
                           "decode": n, "trim": k});
    std::fs::write(&case, case_json.to_string()).unwrap();
    let out = root.path().join("oracle.safetensors");
    run_python(
        "prompt_cache_oracle.py",
        &[model.as_os_str(), case.as_os_str(), out.as_os_str()],
    );
    let oracle = json(&std::fs::read_to_string(root.path().join("oracle.json")).unwrap());
    let expected = |key: &str| -> (String, String) {
        let v = &oracle[key];
        (
            v["text"].as_str().unwrap().to_string(),
            v["finish_reason"].as_str().unwrap().to_string(),
        )
    };
    let answer: Vec<i64> = oracle["batch.first"]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect();
    assert_eq!(
        oracle["batch.first"]["finish_reason"], "length",
        "request 1's greedy answer hit an end-of-sequence id; pick another prefix"
    );
    let usage_cached =
        |body: &str| json(body)["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let ask = |server: &Server, ids: &[i64], max_tokens: usize| -> (String, String, Option<u64>) {
        let (status, body) = curl(
            server,
            "POST",
            "/v1/completions",
            Some(&ids_request(ids, max_tokens)),
        );
        assert_eq!(status, 200, "{body}");
        let (text, finish) = whole_answer(&body);
        (text, finish, usage_cached(&body))
    };
    let extended: Vec<i64> = [prefix.clone(), answer.clone(), suffix.clone()].concat();
    let diverging: Vec<i64> = [prefix.clone(), suffix.clone()].concat();

    let server = start_server(&model, &["--impl", "monolith", "--max-batch", "4"]);
    let (text, finish, cached) = ask(&server, &prefix, k);
    assert_eq!((text, finish), expected("batch.first"));
    assert_eq!(cached, Some(0), "nothing was stored before request 1");
    // Request 2 starts from request 1's cache (its prompt and answer).
    let (text, finish, cached) = ask(&server, &extended, n);
    assert_eq!(cached, Some((prefix.len() + k) as u64));
    assert_eq!(
        (text, finish),
        expected("batch.second"),
        "prefix then suffix, as mlx-lm's split"
    );
    // Request 3 shares only `prefix`: a trimmed copy.
    let (text, finish, cached) = ask(&server, &diverging, n);
    assert_eq!(cached, Some(prefix.len() as u64));
    assert_eq!(
        (text, finish),
        expected("batch.trimmed"),
        "trimmed, as mlx-lm's trim_prompt_cache"
    );
    assert_eq!(metric(&server, "archgen_prompt_cache_hits_total"), 2.0);
    assert_eq!(metric(&server, "archgen_prompt_cache_misses_total"), 1.0);
    assert_eq!(
        metric(&server, "archgen_prompt_cache_tokens_total"),
        (2 * prefix.len() + k) as f64
    );
    assert!(metric(&server, "archgen_prompt_cache_bytes") > 0.0);
    // Stored: request 2's sequence replaced request 1's (its prefix);
    // request 3's shares only `prefix` with it.
    assert_eq!(metric(&server, "archgen_prompt_cache_entries"), 2.0);
    let logs = server.request_logs();
    let cached_logged: Vec<u64> = logs
        .iter()
        .map(|l| l["cached_tokens"].as_u64().unwrap_or_else(|| panic!("{l}")))
        .collect();
    assert_eq!(
        cached_logged,
        [0, (prefix.len() + k) as u64, prefix.len() as u64]
    );
    drop(server);

    // A byte budget smaller than one sequence's cache keeps nothing; 0 has
    // no prompt cache at all. Either way request 2 is computed whole, and
    // its answer is the whole-prompt one.
    for budget in ["1000", "0"] {
        let server = start_server(
            &model,
            &[
                "--impl",
                "monolith",
                "--max-batch",
                "4",
                "--prompt-cache-bytes",
                budget,
            ],
        );
        let (text, finish, cached) = ask(&server, &prefix, k);
        assert_eq!((text, finish, cached), {
            let (t, f) = expected("batch.first");
            (t, f, Some(0))
        });
        let (text, finish, cached) = ask(&server, &extended, n);
        assert_eq!(cached, Some(0), "--prompt-cache-bytes {budget}");
        assert_eq!((text, finish), expected("whole"));
        assert_eq!(metric(&server, "archgen_prompt_cache_bytes"), 0.0);
        assert_eq!(metric(&server, "archgen_prompt_cache_hits_total"), 0.0);
        let misses = if budget == "0" { 0.0 } else { 2.0 };
        assert_eq!(metric(&server, "archgen_prompt_cache_misses_total"), misses);
    }
}

/// A request with logits processors (`logit_bias`) or an output grammar
/// runs as a batch of one beside the session; it starts from the prompt
/// cache and stores its caches as a batched request does: its whole
/// sequence when it ends, and a chat's system turns where they end.
#[test]
fn requests_with_processors_or_a_grammar_use_the_prompt_cache() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let server = start_server(&model, &["--max-batch", "4"]);
    let cached = |path: &str, body: serde_json::Value| -> u64 {
        let (status, body) = curl(&server, "POST", path, Some(&body.to_string()));
        assert_eq!(status, 200, "{body}");
        json(&body)["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let prefix: Vec<i64> = vec![17, 240, 33, 310, 9, 151];
    let suffix: Vec<i64> = vec![88, 402, 61, 7, 230];
    let ids = |ids: &[i64]| json!({"prompt": ids, "max_tokens": 3, "temperature": 0, "logit_bias": {"5": 1.5}});
    assert_eq!(cached("/v1/completions", ids(&prefix)), 0);
    // The first request's stored sequence, trimmed back to the prefix.
    let both = [prefix.clone(), suffix].concat();
    assert_eq!(cached("/v1/completions", ids(&both)), prefix.len() as u64);
    // The same prompt again: all of it but the last token.
    assert_eq!(cached("/v1/completions", ids(&both)), both.len() as u64 - 1);
    // Chats held by a grammar: the second starts from the first's system
    // turns.
    let system = "You are a helpful assistant. Answer the question in one sentence.";
    let chat = |question: &str| {
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
               "max_tokens": 4, "temperature": 0, "response_format": {"type": "json_object"}})
    };
    assert_eq!(cached("/v1/chat/completions", chat("Hello there!")), 0);
    let second = cached("/v1/chat/completions", chat("Tell me a joke about a cat."));
    assert!(second >= 10, "the system turns were not reused: {second}");
    assert_eq!(metric(&server, "archgen_prompt_cache_hits_total"), 3.0);
}

#[test]
fn batched_short_request_decodes_between_a_long_prompts_chunks() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    // Chunks of 256: a 2560-token prompt is prefilled in 10 chunks.
    let server = start_server(
        &model,
        &[
            "--impl",
            "monolith",
            "--max-batch",
            "4",
            "--prefill-step",
            "256",
        ],
    );
    let short_tokens = 40;
    let short = ids_body(7, 5, short_tokens, false);
    let (status, body) = curl(&server, "POST", "/v1/completions", Some(&short));
    assert_eq!(status, 200, "{body}");
    let alone = whole_answer(&body);
    assert_eq!(
        alone.1, "length",
        "the short request must run all its tokens"
    );

    // mlx-lm's `BatchGenerator.next()` would give the short request one
    // token per chunk of the long prompt: 40 tokens need more steps than the
    // long prompt's 10 chunks. Decode-only steps between the chunks let it
    // finish while the long prompt is still in prefill, with the answer it
    // gets alone.
    let long = Background::start(
        &server,
        "/v1/completions",
        &long_prompt_body(2_560, 4, true),
    );
    wait_for_metric(
        &server,
        "archgen_active_sequences",
        |v| v == 1.0,
        Duration::from_secs(60),
    );
    let sent = Instant::now();
    let (status, body) = curl(&server, "POST", "/v1/completions", Some(&short));
    let short_done = Instant::now();
    assert_eq!(status, 200, "{body}");
    assert_eq!(whole_answer(&body), alone);
    let first_long_token = loop {
        let (at, line) = long.lines.recv_timeout(Duration::from_secs(300)).unwrap();
        if line.contains("\"text\":\"") && !line.contains("\"text\":\"\"") {
            break at;
        }
    };
    assert!(
        short_done < first_long_token,
        "the short request ({:?}, {short_tokens} tokens) ended after the long prompt's \
         prefill ({:?} after it was sent)",
        short_done - sent,
        first_long_token - sent
    );
    long.finish(Duration::from_secs(120));
}

/// A model with a quantized KV cache batches as any other (archgen's
/// batched `QuantizedKVCache`, or its mixed counterpart): the server says
/// so at start; with `--max-batch 1` each greedy request is a batch of one
/// row, which gives what `archgen generate` gives alone; a short prompt
/// again is served from the prompt cache (a quantized cache extracted from
/// the batch, trimmed and merged back) with the same answer; and requests
/// sent together all complete in forwards of several rows.
fn serves_batched_and_one_row_matches_generate(spec: &str, dir: &str) {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model_of(root.path(), spec, dir);
    let model_s = model.to_str().unwrap();
    let batched_note = |server: &Server| {
        assert!(
            server
                .startup
                .iter()
                .any(|l| l.contains("decode as one batched forward")),
            "no note of the batched path: {:?}",
            server.startup
        );
    };
    let ask = |server: &Server, first: usize, n: usize, max_tokens: usize| -> (String, String) {
        let (status, body) = curl(
            server,
            "POST",
            "/v1/completions",
            Some(&ids_body(first, n, max_tokens, false)),
        );
        assert_eq!(status, 200, "{body}");
        whole_answer(&body)
    };

    let server = start_server(&model, &["--max-batch", "1"]);
    batched_note(&server);
    // Past the sliding window (8) in the prompt and in the answer.
    let max_tokens = 10;
    for (first, n) in [(0, 3), (11, 17)] {
        let (text, _) = ask(&server, first, n, max_tokens);
        let ids: Vec<String> = (0..n)
            .map(|i| ((first + 7 * i) % 500 + 3).to_string())
            .collect();
        let (ok, stdout, stderr) = archgen(
            &[
                "generate",
                "--model",
                model_s,
                "--prompt-ids",
                &ids.join(","),
                "--max-tokens",
                &max_tokens.to_string(),
            ],
            "",
            Duration::from_secs(300),
        );
        assert!(ok, "{stderr}");
        assert_eq!(stdout, format!("{text}\n"), "prompt {ids:?}");
    }
    // 3 + 4 tokens stay inside the sliding window, so the stored cache can
    // be trimmed back to the prompt (a wrapped ring cannot, as in mlx-lm).
    let first_time = ask(&server, 0, 3, 4);
    let hits = metric(&server, "archgen_prompt_cache_hits_total");
    let again = ask(&server, 0, 3, 4);
    assert_eq!(
        metric(&server, "archgen_prompt_cache_hits_total"),
        hits + 1.0,
        "the repeated prompt missed the prompt cache"
    );
    assert_eq!(again, first_time, "the prompt cache changed the answer");
    drop(server);

    let server = start_server(&model, &["--max-batch", "4"]);
    batched_note(&server);
    let shapes = [(0, 3), (40, 9), (90, 30), (5, 1)];
    let running: Vec<Background> = shapes
        .iter()
        .map(|&(first, n)| {
            Background::start(
                &server,
                "/v1/completions",
                &ids_body(first, n, max_tokens, false),
            )
        })
        .collect();
    for request in running {
        let lines = request.finish(Duration::from_secs(120));
        let body: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
        let (text, finish) = whole_answer(&body.join("\n"));
        assert!(!text.is_empty(), "{body:?}");
        assert!(finish == "length" || finish == "stop", "{body:?}");
    }
    assert!(
        metric(&server, "archgen_decode_batch_size_sum")
            > metric(&server, "archgen_decode_batch_size_count"),
        "no decode forward computed more than one sequence"
    );
}

/// gemma4-e4b-tiny-kv: layer 5's cache is 4-bit from the start, beside
/// sliding and KV-shared layers.
#[test]
fn batches_a_quantized_kv_cache_and_one_row_matches_generate() {
    serves_batched_and_one_row_matches_generate("gemma4-e4b-tiny-kv", "gemma4-kv");
}

/// qwen3-0.6b-tiny-mixed-kv: mlx-optiq's mixed KV (8-bit and 4-bit layers
/// beside bf16 ones), converted after the first forward.
#[test]
fn batches_a_mixed_kv_cache_and_one_row_matches_generate() {
    serves_batched_and_one_row_matches_generate("qwen3-0.6b-tiny-mixed-kv", "qwen3-mixed-kv");
}

/// One curl POST, bounded; returns (HTTP status, the x-archgen-seed header
/// if any, body).
fn post_with_seed_header(server: &Server, path: &str, body: &str) -> (u16, Option<u64>, String) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "120",
            "-D",
            "-",
            "-w",
            "\n%{http_code}",
        ])
        .args([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
        ])
        .arg(format!("{}{path}", server.base))
        .output()
        .expect("curl runs (setup.sh installs it)");
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let seed = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        match name.eq_ignore_ascii_case("x-archgen-seed") {
            true => value.trim().parse().ok(),
            false => None,
        }
    });
    let (body, status) = rest.rsplit_once('\n').unwrap();
    (status.parse().unwrap(), seed, body.to_string())
}

/// The sampling fields: a request with every one of them gives `archgen
/// generate`'s text for the same settings, alone and beside batched
/// requests; a request without a seed reports the fresh one it used in the
/// x-archgen-seed header and its log line, and that seed replays it; a
/// value out of range is a 400 naming its field.
#[test]
fn sampling_fields_report_and_replay_the_seed() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let server = start_server(&model, &[]);
    let fields = r#""prompt": [5, 6, 7, 5, 6, 7], "max_tokens": 8, "temperature": 1.0,
        "top_p": 0.95, "top_k": 40, "min_p": 0.02, "repetition_penalty": 1.3,
        "repetition_context_size": 5, "presence_penalty": 0.5, "frequency_penalty": 0.25,
        "frequency_context_size": 9, "logit_bias": {"11": 2.0, "12": -100}"#;
    let (status, fresh, body) =
        post_with_seed_header(&server, "/v1/completions", &format!("{{{fields}}}"));
    assert_eq!(status, 200, "{body}");
    let seed = fresh.expect("no x-archgen-seed header");
    // The log line is written when the request's state is dropped, which
    // can be just after the client has its answer.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut logged = server.request_logs();
    while logged.last().is_none_or(|l| l["seed"] != seed) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        logged = server.request_logs();
    }
    assert_eq!(logged.last().unwrap()["seed"], seed, "{logged:?}");
    let (status, echoed, replay) = post_with_seed_header(
        &server,
        "/v1/completions",
        &format!(r#"{{{fields}, "seed": {seed}}}"#),
    );
    assert_eq!((status, echoed), (200, Some(seed)), "{replay}");
    assert_eq!(
        whole_answer(&replay).0,
        whole_answer(&body).0,
        "seed {seed} did not replay the request"
    );
    let (_, other, _) = post_with_seed_header(&server, "/v1/completions", &format!("{{{fields}}}"));
    assert_ne!(
        other,
        Some(seed),
        "two requests without a seed got the same one"
    );

    // `n` choices: choice i is the request with seed + i, whole and
    // streamed, and the usage counts the prompt once.
    let with_n = |n: i64, seed: u64, stream: bool| {
        format!(r#"{{{fields}, "seed": {seed}, "n": {n}, "stream": {stream}}}"#)
    };
    let (status, several) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(&with_n(3, seed, false)),
    );
    assert_eq!(status, 200, "{several}");
    let whole = json(&several);
    let choices = whole["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{several}");
    let mut texts = Vec::new();
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i, "{several}");
        let alone_body = with_n(1, seed.wrapping_add(i as u64), false);
        let (status, alone) = curl(&server, "POST", "/v1/completions", Some(&alone_body));
        assert_eq!(status, 200, "{alone}");
        assert_eq!(
            choice["text"],
            json(&alone)["choices"][0]["text"],
            "choice {i}"
        );
        texts.push(choice["text"].as_str().unwrap().to_string());
    }
    assert_eq!(whole["usage"]["prompt_tokens"], 6, "{several}");
    let (status, events) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(&with_n(3, seed, true)),
    );
    assert_eq!(status, 200, "{events}");
    let data: Vec<&str> = events
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{events}");
    let mut streamed = vec![String::new(); 3];
    let mut finished = [0; 3];
    for chunk in &data[..data.len() - 1] {
        for choice in json(chunk)["choices"].as_array().unwrap() {
            let i = choice["index"].as_u64().unwrap() as usize;
            streamed[i].push_str(choice["text"].as_str().unwrap_or(""));
            finished[i] += usize::from(choice["finish_reason"].is_string());
        }
    }
    assert_eq!(streamed, texts, "streamed choices");
    assert_eq!(finished, [1, 1, 1], "{events}");
    for n in [0, 17] {
        let (status, refused) = curl(
            &server,
            "POST",
            "/v1/completions",
            Some(&with_n(n, seed, false)),
        );
        let (param, message) = error_param(status, &refused);
        assert_eq!(param, "n", "{refused}");
        assert!(message.starts_with("n: "), "{message}");
    }

    // With logits processors a request runs as a batch of one beside the
    // session: its text is `archgen generate`'s for the same settings and
    // seed (which tests/sampling.rs holds to mlx-lm's generate_step), alone
    // and while batched requests run.
    let seed_s = seed.to_string();
    let (ok, generated, stderr) = archgen(
        &[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt-ids",
            "5,6,7,5,6,7",
            "--max-tokens",
            "8",
            "--temp",
            "1.0",
            "--top-p",
            "0.95",
            "--top-k",
            "40",
            "--min-p",
            "0.02",
            "--repetition-penalty",
            "1.3",
            "--repetition-context-size",
            "5",
            "--presence-penalty",
            "0.5",
            "--frequency-penalty",
            "0.25",
            "--frequency-context-size",
            "9",
            "--logit-bias",
            "11=2.0,12=-100",
            "--seed",
            &seed_s,
        ],
        "",
        Duration::from_secs(300),
    );
    assert!(ok, "{stderr}");
    let text = whole_answer(&body).0;
    assert_eq!(generated, format!("{text}\n"), "serve != generate");
    let seeded = format!(r#"{{{fields}, "seed": {seed}}}"#);
    let greedy = ids_body(0, 9, 8, false);
    let running: Vec<Background> = [&seeded, &greedy, &seeded]
        .iter()
        .map(|body| Background::start(&server, "/v1/completions", body))
        .collect();
    let answers: Vec<String> = running
        .into_iter()
        .map(|r| {
            let lines = r.finish(Duration::from_secs(120));
            let body: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
            whole_answer(&body.join("\n")).0
        })
        .collect();
    assert_eq!(answers[0], text, "beside a batch");
    assert_eq!(answers[2], text, "beside a batch");

    for (extra, field) in [
        (r#""top_k": 512"#, "top_k"),
        (r#""top_k": -2"#, "top_k"),
        (r#""min_p": 1.5"#, "min_p"),
        (r#""top_p": 1.01"#, "top_p"),
        (r#""temperature": -0.5"#, "temperature"),
        (r#""repetition_penalty": -1"#, "repetition_penalty"),
        (r#""presence_penalty": 2.5"#, "presence_penalty"),
        (r#""frequency_penalty": -3"#, "frequency_penalty"),
        (r#""presence_context_size": 0"#, "presence_context_size"),
        (r#""logit_bias": {"x": 1}"#, "logit_bias"),
        (r#""logit_bias": {"600": 1}"#, "logit_bias"),
        (r#""logit_bias": {"5": 101}"#, "logit_bias"),
        (r#""logit_bias": {"5": "up"}"#, "logit_bias"),
    ] {
        let request = format!(r#"{{"prompt": [5, 6], "max_tokens": 2, {extra}}}"#);
        let (status, body) = curl(&server, "POST", "/v1/completions", Some(&request));
        let message = error_message(status, &body);
        assert!(message.starts_with(field), "{extra}: {message}");
        assert_eq!(json(&body)["error"]["param"], field, "{extra}: {body}");
    }
}

/// Gemma-2 with grouped-query attention (gemma-2-2b-tiny: 4 heads, 2 K/V
/// heads), three concurrent chat requests: mlx-lm 0.32.2's gemma2 cannot
/// mask such a batch (a broadcast error, 500s in a server that passes it
/// through); archgen masks each row with its own mask and states the
/// batches' tier (L3, docs/parity.md "Batches", Gemma-2).
#[test]
fn serves_concurrent_gemma2_grouped_query_requests_in_one_batch() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model_of(root.path(), "gemma-2-2b-tiny", "gemma2-tiny");
    let server = start_server(&model, &["--max-batch", "4"]);
    assert!(
        server.startup.iter().any(|l| l.contains("parity tier L3")
            && l.contains("batches of several sequences without an oracle")),
        "{:?}",
        server.startup
    );
    let questions = ["Hi", "Why is the sky blue?", "Name three colours."];
    let running: Vec<Background> = questions
        .iter()
        .map(|q| {
            let body = serde_json::json!({
                "messages": [{"role": "user", "content": q}],
                "max_tokens": 12,
                "temperature": 0,
            });
            Background::start(&server, "/v1/chat/completions", &body.to_string())
        })
        .collect();
    for request in running {
        let lines = request.finish(Duration::from_secs(120));
        let body: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
        let body = body.join("\n");
        let reply = json(&body);
        assert!(
            reply["choices"][0]["message"]["content"].is_string(),
            "{body}"
        );
        let finish = reply["choices"][0]["finish_reason"].as_str();
        assert!(matches!(finish, Some("length" | "stop")), "{body}");
    }
    assert!(
        metric(&server, "archgen_decode_batch_size_sum")
            > metric(&server, "archgen_decode_batch_size_count"),
        "no decode forward computed more than one sequence"
    );
}

/// A chat answer, whole or streamed (SSE chunks put together): its content,
/// its tool calls as (name, arguments JSON text), and its finish reason.
fn chat_answer(body: &str, streamed: bool) -> (String, Vec<(String, String)>, String) {
    let calls_of = |calls: &serde_json::Value| -> Vec<(String, String)> {
        calls
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let f = &c["function"];
                (
                    f["name"].as_str().unwrap_or_else(|| panic!("{c}")).into(),
                    f["arguments"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{c}"))
                        .into(),
                )
            })
            .collect()
    };
    if !streamed {
        let v = json(body);
        let choice = &v["choices"][0];
        let content = choice["message"]["content"].as_str().unwrap_or("");
        let finish = choice["finish_reason"]
            .as_str()
            .unwrap_or_else(|| panic!("{body}"));
        return (
            content.into(),
            calls_of(&choice["message"]["tool_calls"]),
            finish.into(),
        );
    }
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    let (mut content, mut calls, mut finish) = (String::new(), Vec::new(), String::new());
    for chunk in &data[..data.len() - 1] {
        let delta = &json(chunk)["choices"][0];
        content.push_str(delta["delta"]["content"].as_str().unwrap_or(""));
        calls.extend(calls_of(&delta["delta"]["tool_calls"]));
        if let Some(f) = delta["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (content, calls, finish)
}

/// The bounded schema of the structured-output test: a required string of
/// at most 8 characters, an integer in [0, 9] and an enum. Checks `value`
/// against it field by field.
fn check_bounded(value: &serde_json::Value, what: &str) {
    let object = value
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object: {value}"));
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["color", "digit", "name"], "{what}: {value}");
    let name = value["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: {value}"));
    assert!(name.chars().count() <= 8, "{what}: name too long: {value}");
    let digit = value["digit"]
        .as_i64()
        .unwrap_or_else(|| panic!("{what}: {value}"));
    assert!((0..=9).contains(&digit), "{what}: {value}");
    assert!(
        ["red", "green", "blue"].contains(&value["color"].as_str().unwrap_or("")),
        "{what}: {value}"
    );
}

/// Structured output on a random-weight model: `response_format`
/// json_object and a bounded json_schema give JSON that parses and
/// validates, `tool_choice` "required" and a named function give one
/// parseable call of the right function with valid arguments, whole and
/// streamed, each closing well within `max_tokens` (finish "stop" or
/// "tool_calls"); a schema llguidance refuses, and a function not among the
/// tools, are 400s naming the field's path.
#[test]
fn constrains_answers_to_json_schemas_and_required_tool_calls() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let server = start_server(&model, &["--max-batch", "4"]);
    let chat = |seed: u64, stream: bool, extra: &str| {
        format!(
            r#"{{"messages": [{{"role": "user", "content": "Hello"}}], "max_tokens": 200, "seed": {seed}, "stream": {stream}{extra}}}"#
        )
    };
    let post = |body: &str| curl(&server, "POST", "/v1/chat/completions", Some(body));
    let bounded = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "digit": {"type": "integer", "minimum": 0, "maximum": 9}, "color": {"enum": ["red", "green", "blue"]}}, "required": ["name", "digit", "color"], "additionalProperties": false}"#;
    let tools = r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["city", "days"], "additionalProperties": false}}}, {"type": "function", "function": {"name": "now"}}]"#;
    for stream in [false, true] {
        for seed in [1, 2] {
            let what = format!("seed {seed}, stream {stream}");
            // One JSON object.
            let (status, body) = post(&chat(
                seed,
                stream,
                r#", "response_format": {"type": "json_object"}"#,
            ));
            assert_eq!(status, 200, "{body}");
            let (content, _, finish) = chat_answer(&body, stream);
            assert_eq!(finish, "stop", "json_object, {what}: {body}");
            assert!(json(&content).is_object(), "json_object, {what}: {content}");
            // JSON valid against a bounded schema.
            let (status, body) = post(&chat(
                seed,
                stream,
                &format!(
                    r#", "response_format": {{"type": "json_schema", "json_schema": {{"name": "pick", "schema": {bounded}, "strict": true}}}}"#
                ),
            ));
            assert_eq!(status, 200, "{body}");
            let (content, _, finish) = chat_answer(&body, stream);
            assert_eq!(finish, "stop", "json_schema, {what}: {body}");
            check_bounded(&json(&content), &format!("json_schema, {what}"));
            // A call of one of the tools.
            let (status, body) = post(&chat(
                seed,
                stream,
                &format!(r#", "tools": {tools}, "tool_choice": "required""#),
            ));
            assert_eq!(status, 200, "{body}");
            let (content, calls, finish) = chat_answer(&body, stream);
            assert_eq!(finish, "tool_calls", "required, {what}: {body}");
            assert_eq!(content, "", "required, {what}: {body}");
            assert_eq!(calls.len(), 1, "required, {what}: {body}");
            let arguments = json(&calls[0].1);
            match calls[0].0.as_str() {
                "now" => assert_eq!(arguments, json!({}), "{what}"),
                "get_weather" => {
                    assert!(arguments["city"].as_str().unwrap().chars().count() <= 8);
                    assert!((1..=3).contains(&arguments["days"].as_i64().unwrap()));
                }
                other => panic!("required, {what}: called {other}: {body}"),
            }
            // A call of the named function.
            let (status, body) = post(&chat(
                seed,
                stream,
                &format!(
                    r#", "tools": {tools}, "tool_choice": {{"type": "function", "function": {{"name": "get_weather"}}}}"#
                ),
            ));
            assert_eq!(status, 200, "{body}");
            let (_, calls, finish) = chat_answer(&body, stream);
            assert_eq!(finish, "tool_calls", "named, {what}: {body}");
            assert_eq!(calls.len(), 1, "named, {what}: {body}");
            assert_eq!(calls[0].0, "get_weather", "named, {what}: {body}");
            let arguments = json(&calls[0].1);
            assert!(arguments["city"].as_str().unwrap().chars().count() <= 8);
            assert!((1..=3).contains(&arguments["days"].as_i64().unwrap()));
        }
    }
    // Log-probabilities of a constrained answer are those of the masked
    // distribution: every alternative listed is a possible token (a number,
    // never the -inf of a token the grammar rules out).
    let (status, body) = post(&chat(
        1,
        false,
        &format!(
            r#", "logprobs": true, "top_logprobs": 3, "response_format": {{"type": "json_schema", "json_schema": {{"name": "pick", "schema": {bounded}}}}}"#
        ),
    ));
    assert_eq!(status, 200, "{body}");
    let v = json(&body);
    let entries = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!entries.is_empty(), "{body}");
    for entry in entries {
        assert!(entry["logprob"].is_number(), "{entry}");
        let top = entry["top_logprobs"].as_array().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{entry}");
        assert!(top.iter().all(|t| t["logprob"].is_number()), "{entry}");
    }
    // A grammar that cannot close within max_tokens: cut, finish "length".
    let (status, body) = post(
        r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "long", "schema": {"type": "string", "minLength": 20}}}}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (content, _, finish) = chat_answer(&body, false);
    assert_eq!(finish, "length", "{body}");
    assert!(content.starts_with('"'), "{body}");
    // What is refused, and where.
    let refused = [
        (
            r#", "response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "string", "minLength": 5, "maxLength": 2}}}"#.to_string(),
            "response_format.json_schema.schema",
            "minLength (5) is greater than maxLength (2)",
        ),
        (
            r#", "response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "strin"}}}"#.to_string(),
            "response_format.json_schema.schema",
            "strin",
        ),
        (
            format!(
                r#", "tools": {tools}, "tool_choice": {{"type": "function", "function": {{"name": "later"}}}}"#
            ),
            "tool_choice.function.name",
            "\"later\" is not a function of tools (\"get_weather\", \"now\")",
        ),
        (
            r#", "tool_choice": "required""#.to_string(),
            "tool_choice",
            "gives no tools",
        ),
        (
            r#", "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "(a|b"}}}}}], "tool_choice": "required""#.to_string(),
            "tools[0].function.parameters",
            "unclosed group",
        ),
        (
            format!(
                r#", "tools": {tools}, "tool_choice": "required", "response_format": {{"type": "json_object"}}"#
            ),
            "response_format",
            "give one of response_format and tool_choice",
        ),
    ];
    for (extra, param, expected) in refused {
        let (status, body) = post(&chat(1, false, &extra));
        let (got, message) = error_param(status, &body);
        assert_eq!(got, param, "{extra}: {body}");
        assert!(
            message.starts_with(&format!("{param}: ")) && message.contains(expected),
            "{extra}: '{expected}' not in: {message}"
        );
    }
    // A hostile schema (hundreds of kB of enums) is refused by the compile
    // bounds, and the server still answers.
    let properties: Vec<String> = (0..300)
        .map(|i| {
            let values: Vec<String> = (0..200).map(|j| format!("\"v{i}_{j}\"")).collect();
            format!(r#""k{i}": {{"enum": [{}]}}"#, values.join(","))
        })
        .collect();
    let hostile = format!(
        r#", "response_format": {{"type": "json_schema", "json_schema": {{"name": "big", "schema": {{"type": "object", "properties": {{{}}}}}}}}}"#,
        properties.join(",")
    );
    let (status, body) = post(&chat(1, false, &hostile));
    let (param, message) = error_param(status, &body);
    assert_eq!(param, "response_format.json_schema.schema", "{message}");
    assert!(message.contains("too big"), "{message}");
    let (status, body) = post(&chat(1, false, r#", "response_format": {"type": "text"}"#));
    assert_eq!(status, 200, "{body}");
}

/// `archgen generate --json-schema FILE` and `--json-object`: the printed
/// text is JSON valid against the schema (greedy and sampled); a schema
/// llguidance refuses, or a file that is not JSON, is an error naming the
/// flag and the file.
#[test]
fn generate_holds_its_output_to_a_json_schema() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let schema = root.path().join("pick.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "digit": {"type": "integer", "minimum": 0, "maximum": 9}, "color": {"enum": ["red", "green", "blue"]}}, "required": ["name", "digit", "color"], "additionalProperties": false}"#,
    )
    .unwrap();
    let (model_s, schema_s) = (model.to_str().unwrap(), schema.to_str().unwrap());
    let generate = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            model_s,
            "--prompt",
            "Hello",
            "--max-tokens",
            "100",
        ];
        args.extend_from_slice(extra);
        archgen(&args, "", Duration::from_secs(300))
    };
    for sampling in [&["--temp", "0"][..], &["--temp", "1", "--seed", "7"][..]] {
        let (ok, out, err) = generate(&[&["--json-schema", schema_s][..], sampling].concat());
        assert!(ok, "{sampling:?}: {err}");
        check_bounded(&json(out.trim()), &format!("generate {sampling:?}"));
        let (ok, out, err) = generate(&[&["--json-object"][..], sampling].concat());
        assert!(ok, "{sampling:?}: {err}");
        assert!(json(out.trim()).is_object(), "{sampling:?}: {out}");
    }
    let bad = root.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"type": "string", "minLength": 5, "maxLength": 2}"#,
    )
    .unwrap();
    let (ok, _, err) = generate(&["--json-schema", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "--json-schema {}: the schema cannot be compiled",
            bad.display()
        )) && err.contains("minLength (5) is greater than maxLength (2)"),
        "{err}"
    );
    std::fs::write(&bad, "[1,").unwrap();
    let (ok, _, err) = generate(&["--json-schema", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("the schema is not JSON"), "{err}");
}

/// The f32 values of little-endian bytes.
fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// POST /v1/embeddings: text and token-id inputs, one or a list, as float
/// and base64, each embedding mlx-lm's (tests/python/embedding_oracle.py)
/// value for value, a list's the same as each input's alone; bad input gets
/// a 400 naming the JSON path before any compute; generation still runs
/// beside it; a head the runtime does not run gets a 501, generation still
/// served.
#[test]
fn serves_embeddings_as_mlx_lm_computes_them() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let server = start_server(&model, &["--max-prompt-tokens", "40"]);
    assert!(
        server
            .startup
            .iter()
            .any(|l| l.contains("/v1/embeddings: last-token pooling, L2 normalisation")),
        "{:?}",
        server.startup
    );
    let post =
        |body: serde_json::Value| curl(&server, "POST", "/v1/embeddings", Some(&body.to_string()));
    let texts = ["hello world", "the quick brown fox"];
    let tokens: Vec<Vec<u64>> = texts
        .iter()
        .map(|t| {
            let (status, body) = curl(
                &server,
                "POST",
                "/tokenize",
                Some(&json!({ "prompt": t }).to_string()),
            );
            assert_eq!(status, 200, "{body}");
            serde_json::from_value(json(&body)["tokens"].clone()).unwrap()
        })
        .collect();
    let ids = vec![7u64, 300, 41, 9];
    let inputs = vec![tokens[0].clone(), tokens[1].clone(), ids.clone(), vec![5]];
    let job = root.path().join("embed.json");
    std::fs::write(&job, json!({ "inputs": inputs }).to_string()).unwrap();
    let oracle = root.path().join("oracle.safetensors");
    run_python(
        "embedding_oracle.py",
        &[model.as_os_str(), job.as_os_str(), oracle.as_os_str()],
    );
    let oracle = archgen_runtime::Array::load_safetensors(&oracle).unwrap();
    let oracle = oracle["embeddings"]
        .as_dtype(archgen_runtime::Dtype::Float32)
        .unwrap();
    let oracle: Vec<f32> = oracle.as_slice::<f32>().to_vec();
    let hidden = oracle.len() / inputs.len();
    let expected: Vec<&[f32]> = oracle.chunks(hidden).collect();
    let floats = |row: &serde_json::Value| -> Vec<f32> {
        row["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect()
    };

    // One string, float (the default); `model` and `user` accepted.
    let (status, body) = post(json!({"input": texts[0], "model": "qwen3-tiny", "user": "u1"}));
    assert_eq!(status, 200, "{body}");
    let one = json(&body);
    assert_eq!(one["object"], "list");
    assert_eq!(one["model"], "qwen3-tiny");
    assert_eq!(one["data"][0]["object"], "embedding");
    assert_eq!(one["data"][0]["index"], 0);
    assert_eq!(floats(&one["data"][0]), expected[0]);
    assert_eq!(one["usage"]["prompt_tokens"], tokens[0].len());
    assert_eq!(one["usage"]["total_tokens"], tokens[0].len());

    // A list of strings, as base64 (little-endian f32 bytes).
    let (status, body) = post(json!({"input": texts, "encoding_format": "base64"}));
    assert_eq!(status, 200, "{body}");
    let listed = json(&body);
    for (i, row) in listed["data"].as_array().unwrap().iter().enumerate() {
        assert_eq!(row["index"], i);
        let bytes = base64::decode(row["embedding"].as_str().unwrap()).unwrap();
        assert_eq!(f32s(&bytes), expected[i], "input[{i}]");
    }
    assert_eq!(
        listed["usage"]["prompt_tokens"],
        tokens[0].len() + tokens[1].len()
    );

    // Token ids: one list, and a list of lists (a one-token input among them).
    let (status, body) = post(json!({"input": ids, "dimensions": hidden}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(floats(&json(&body)["data"][0]), expected[2]);
    let (status, body) = post(json!({"input": [ids, [5]]}));
    assert_eq!(status, 200, "{body}");
    let data = json(&body)["data"].clone();
    assert_eq!(floats(&data[0]), expected[2]);
    assert_eq!(floats(&data[1]), expected[3]);

    // A completion and a one-input embedding request sent while a long
    // embedding request (256 inputs of 40 tokens: 256 forwards) runs are
    // answered first: the model thread runs one embedding input between two
    // generation steps, round robin among the embedding requests.
    // Every answered request has its log line (written as its answer
    // leaves); embeddings have no seed.
    std::thread::sleep(Duration::from_millis(300));
    let logs = server.request_logs();
    assert_eq!(logs.len(), 4, "{logs:?}");
    let embedded = logs
        .iter()
        .filter(|l| l["endpoint"] == "/v1/embeddings" && l["status"] == 200);
    assert!(embedded.clone().all(|l| l["seed"].is_null()), "{logs:?}");
    assert_eq!(embedded.count(), 4, "{logs:?}");
    let heavy: Vec<Vec<u64>> = (0..256u64)
        .map(|i| (0..40).map(|j| 10 + (i * 7 + j) % 400).collect())
        .collect();
    let heavy_body = json!({ "input": heavy }).to_string();
    let base = server.base.clone();
    let started = Instant::now();
    let embedding = std::thread::spawn(move || {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "120",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .args([
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "@-",
            ])
            .arg(format!("{base}/v1/embeddings"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(heavy_body.as_bytes())?;
                child.wait_with_output()
            })
            .unwrap();
        (String::from_utf8(out.stdout).unwrap(), started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    let (status, body) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": "hello", "max_tokens": 3}).to_string()),
    );
    let completed_after = started.elapsed();
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(json!({"input": [5, 6, 7]}));
    assert_eq!(status, 200, "{body}");
    let short_after = started.elapsed();
    let (embedding_status, embedded_after) = embedding.join().unwrap();
    assert_eq!(embedding_status, "200");
    eprintln!(
        "completion answered after {completed_after:?}, the short embedding after \
         {short_after:?}, the long one after {embedded_after:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let order: Vec<(String, u64)> = server
        .request_logs()
        .iter()
        .map(|l| {
            let endpoint = l["endpoint"].as_str().unwrap().to_string();
            (endpoint, l["prompt_tokens"].as_u64().unwrap())
        })
        .collect();
    let completion_tokens = order.first().map_or(0, |(_, n)| *n);
    let expected = [
        ("/v1/completions".to_string(), completion_tokens),
        ("/v1/embeddings".to_string(), 3),
        ("/v1/embeddings".to_string(), 256 * 40),
    ];
    assert_eq!(order, expected, "answer order");

    // Bad input: a 400 naming the path, before any compute.
    let too_many: Vec<&str> = vec!["a"; 257];
    let long: Vec<u64> = (10..51).collect();
    let cases = [
        (json!({"input": []}), "input", "an empty list"),
        (json!({"input": {"text": "a"}}), "input", "got an object"),
        (json!({"input": too_many}), "input", "more than the 256"),
        (json!({"input": ["a", 3]}), "input[1]", "got the number 3"),
        (
            json!({"input": [[1, 2], [3, "x"]]}),
            "input[1][1]",
            "got a string",
        ),
        (json!({"input": [1, 512]}), "input[1]", "from 0 to 511"),
        (json!({"input": [[1], []]}), "input[1]", "no tokens"),
        (
            json!({"input": [long]}),
            "input[0]",
            "41 tokens, more than the 40",
        ),
        (
            json!({"input": "a", "dimensions": 8}),
            "dimensions",
            "full 64 dimensions",
        ),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
            "unknown variant",
        ),
        (
            json!({"input": "a", "dimensions": "x"}),
            "dimensions",
            "an unsigned integer",
        ),
        (json!({"model": "qwen3-tiny"}), "", "missing field `input`"),
    ];
    let refusals = cases.len();
    for (body, param, expected) in cases {
        let (status, answer) = post(body.clone());
        let (got_param, message) = error_param(status, &answer);
        assert_eq!(got_param, param, "{body}: {answer}");
        assert!(message.contains(expected), "{body}: {message}");
    }
    // Each refusal has its log line.
    std::thread::sleep(Duration::from_millis(300));
    let logs = server.request_logs();
    let refused = logs
        .iter()
        .filter(|l| l["endpoint"] == "/v1/embeddings" && l["status"] == 400);
    assert_eq!(refused.count(), refusals, "{logs:?}");
    drop(server);

    // A checkpoint whose sentence-transformers head the runtime does not run
    // (mean pooling) is still served; /v1/embeddings answers 501 with why.
    std::fs::write(
        model.join("modules.json"),
        r#"[{"path": "", "type": "sentence_transformers.models.Transformer"},
            {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]"#,
    )
    .unwrap();
    std::fs::create_dir(model.join("1_Pooling")).unwrap();
    std::fs::write(
        model.join("1_Pooling/config.json"),
        r#"{"pooling_mode_mean_tokens": true}"#,
    )
    .unwrap();
    let server = start_server(&model, &[]);
    assert!(
        server
            .startup
            .iter()
            .any(|l| l.contains("/v1/embeddings will answer 501")),
        "{:?}",
        server.startup
    );
    let (status, body) = curl(&server, "POST", "/v1/embeddings", Some(r#"{"input": "a"}"#));
    assert_eq!(status, 501, "{body}");
    let message = json(&body)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("pooling_mode_mean_tokens is not implemented"),
        "{message}"
    );
    let (status, body) = curl(
        &server,
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": "hello", "max_tokens": 2}).to_string()),
    );
    assert_eq!(status, 200, "{body}");
}
