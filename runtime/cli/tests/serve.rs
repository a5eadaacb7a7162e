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
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(model: &Path) -> Server {
    let mut child = Command::new(ARCHGEN)
        .args(["serve", "--model", model.to_str().unwrap()])
        .args(["--host", "127.0.0.1", "--port", "0"])
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
    let mut server = Server {
        child,
        base: String::new(),
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.split_once("http://").map(|(_, r)| r) {
                    let addr = rest.split('/').next().unwrap();
                    server.base = format!("http://{addr}");
                    return server;
                }
            }
            Err(_) => panic!(
                "the server did not report its address in time (exit: {:?})",
                server.child.try_wait()
            ),
        }
    }
}

/// One curl request, bounded; returns (HTTP status, body).
fn curl(server: &Server, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let url = format!("{}{path}", server.base);
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-N",
        "--max-time",
        "120",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]);
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
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.parse().unwrap(), body.to_string())
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
    let model = root.join("qwen3-tiny");
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
    assert!(ok, "init failed: {err}");
    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates/qwen3.jinja");
    let made = run_python(
        "make_chat_tokenizer.py",
        &[model.as_os_str(), template.as_os_str()],
    );
    assert_eq!(json(&made)["vocab_size"], 512, "{made}");
    model
}

/// Token ids for the comparisons with `archgen generate`.
const PROMPT_IDS: &str = "1,274,261,201,379,362,2,201,1,77,300";

#[test]
fn serves_the_openai_api_and_matches_generate_and_chat() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(root.path());
    let model_s = model.to_str().unwrap();
    let server = start_server(&model);

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
            "does not fit the API",
        ),
        (
            r#"{"prompt": "x", "frobnicate": 1}"#,
            "unknown field `frobnicate`",
        ),
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
    assert!(error_message(status, &body).contains("does not fit the API"));
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
    config["max_position_embeddings"] = 32.into();
    std::fs::write(short.join("config.json"), config.to_string()).unwrap();
    let (ok, stdout, stderr) = archgen(
        &[
            "chat",
            "--model",
            short.to_str().unwrap(),
            "--max-tokens",
            "6",
        ],
        &format!("{}\nhello\n", "fox ".repeat(40)),
        Duration::from_secs(300),
    );
    assert!(ok, "{stderr}");
    assert!(stderr.contains("the model's context is 32"), "{stderr}");
    assert_eq!(
        stdout,
        format!("{}\n", turns[0]),
        "the next turn starts afresh"
    );
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
