//! The `archgen` binary end to end: it runs a tiny checkpoint, and bad input
//! gets one clear message and a non-zero exit, never a panic.

use std::path::Path;
use std::process::{Command, Output};

use archgen_tests::run_python;

fn archgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_archgen"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A clean failure while running: exit 1, an `archgen: error:` line naming
/// `what`, no panic.
fn assert_clean_error(o: &Output, what: &str) {
    assert_error_with_status(o, 1, what);
}

/// A usage error (bad flag value, missing or conflicting flags): exit 2,
/// an `archgen: error:` line naming `what`, no panic.
fn assert_usage_error(o: &Output, what: &str) {
    assert_error_with_status(o, 2, what);
}

fn assert_error_with_status(o: &Output, status: i32, what: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(status), "stderr: {e}");
    assert!(e.contains("archgen: error:"), "stderr: {e}");
    assert!(e.contains(what), "expected '{what}' in: {e}");
    assert!(!e.contains("panicked"), "panic: {e}");
}

fn tiny_model(root: &Path) -> String {
    run_python(
        "run_oracle.py",
        &[
            "--cases-out".as_ref(),
            root.as_os_str(),
            "--only".as_ref(),
            "e2b-tiny-bf16".as_ref(),
        ],
    );
    root.join("e2b-tiny-bf16/model").display().to_string()
}

#[test]
fn runs_a_tiny_checkpoint_and_rejects_bad_input() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_model(root.path());

    // generate: greedy and seeded sampling both run end to end.
    let o = archgen(&[
        "generate",
        "--model",
        &model,
        "--prompt-ids",
        "2,5,9",
        "--max-tokens",
        "6",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .count(),
        6
    );
    assert!(stderr(&o).contains("tokens/s"), "{}", stderr(&o));
    assert!(!stderr(&o).contains('\r'), "no progress bar on a pipe");
    // -q: the same tokens, nothing on stderr.
    let q = archgen(&[
        "generate",
        "--model",
        &model,
        "--prompt-ids",
        "2,5,9",
        "--max-tokens",
        "6",
        "-q",
    ]);
    assert!(q.status.success(), "{}", stderr(&q));
    assert_eq!(q.stdout, o.stdout);
    assert_eq!(stderr(&q), "");
    let sampled = |seed: &str| {
        let o = archgen(&[
            "generate",
            "--model",
            &model,
            "--prompt-ids",
            "2,5,9",
            "--max-tokens",
            "8",
            "--temp",
            "1.5",
            "--top-p",
            "0.9",
            "--seed",
            seed,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(sampled("7"), sampled("7"), "same seed, same tokens");

    // logits writes the three tensors of the protocol.
    let out = root.path().join("out.safetensors");
    let o = archgen(&[
        "logits",
        "--model",
        &model,
        "--prompt-ids",
        "1,2,3",
        "--decode-steps",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = archgen_runtime::Array::load_safetensors(&out).unwrap();
    assert_eq!(t["prefill_logits"].shape(), &[3, 512]);
    assert_eq!(t["decode_logits"].shape(), &[2, 512]);
    assert_eq!(t["tokens"].shape(), &[2]);

    let out_s = out.to_str().unwrap();
    let base = |extra: &[&str]| {
        let mut v = vec!["logits", "--model", &model, "--out", out_s];
        v.extend_from_slice(extra);
        archgen(&v)
    };
    assert_usage_error(&base(&["--prompt-ids", "1,x,3"]), "item 2 ('x')");
    assert_clean_error(
        &base(&["--prompt-ids", "1,99999"]),
        "out of the vocabulary (size 512)",
    );
    assert_usage_error(
        &base(&["--prompt-ids", "1", "--impl", "fast"]),
        "invalid value 'fast' for '--impl <IMPL>'",
    );
    assert_clean_error(
        &base(&["--prompt-ids", "1", "--impl", "generated"]),
        "--impl generated",
    );
    assert_clean_error(
        &archgen(&[
            "logits",
            "--model",
            "/nonexistent",
            "--prompt-ids",
            "1",
            "--out",
            out_s,
        ]),
        "/nonexistent: not a directory",
    );

    // An unsupported model type in config.json.
    let bad = root.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    std::fs::copy(
        Path::new(&model).join("model.safetensors"),
        bad.join("model.safetensors"),
    )
    .unwrap();
    // A family archgen does not run, and a supported one with an incomplete config.
    for (config, expected) in [
        (r#"{"model_type": "falcon"}"#, "falcon"),
        (r#"{"model_type": "llama"}"#, "hidden_size: missing"),
    ] {
        std::fs::write(bad.join("config.json"), config).unwrap();
        let o = archgen(&[
            "logits",
            "--model",
            bad.to_str().unwrap(),
            "--prompt-ids",
            "1",
            "--out",
            out_s,
        ]);
        assert_clean_error(&o, expected);
    }
}

/// Copies the files of the checkpoint directory `src` into a new `dst`.
fn copy_model(src: &Path, dst: &Path) {
    std::fs::create_dir(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
        }
    }
}

/// The name the test tokenizer gives id `id`.
fn token_name(id: u32) -> String {
    match id {
        0 => "<pad>".into(),
        1 => "<eos>".into(),
        2 => "<bos>".into(),
        3 => "<unk>".into(),
        _ => format!("w{id}"),
    }
}

/// A WordLevel tokenizer over the whole 512-id vocabulary (<pad> <eos> <bos>
/// <unk>, then w4..w511): whitespace pre-tokenizer, a post-processor that
/// prepends <bos>, and no decoder (decoding joins tokens with spaces).
fn write_tokenizer(dir: &Path) {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::{AddedToken, Tokenizer};

    let model = WordLevel::builder()
        .vocab((0..512).map(|i| (token_name(i), i)).collect())
        .unk_token("<unk>".into())
        .build()
        .unwrap();
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Whitespace {}));
    tokenizer.with_post_processor(Some(
        TemplateProcessing::builder()
            .try_single("<bos> $A")
            .unwrap()
            .special_tokens(vec![("<bos>", 2)])
            .build()
            .unwrap(),
    ));
    let specials: Vec<AddedToken> = (0..4)
        .map(|i| AddedToken::from(token_name(i), true))
        .collect();
    tokenizer.add_special_tokens(&specials);
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn text_prompts_stream_text_and_stop_at_eos() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_model(root.path());
    let gen = |dir: &str, extra: &[&str]| {
        let mut v = vec!["generate", "--model", dir, "--max-tokens", "6"];
        v.extend_from_slice(extra);
        archgen(&v)
    };

    // No tokenizer.json: --prompt fails cleanly; --prompt-ids prints ids.
    let o = gen(&model, &["--prompt", "w5 w9"]);
    assert_clean_error(&o, "tokenizer.json");
    assert_clean_error(&o, "--prompt-ids");
    assert_usage_error(
        &gen(&model, &["--prompt", "w5", "--prompt-ids", "2,5"]),
        "not both",
    );
    assert_usage_error(&gen(&model, &[]), "give --prompt TEXT or --prompt-ids");
    let o = gen(&model, &["--prompt-ids", "2,5,9", "--ignore-eos"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: Vec<u32> = stdout(&o)
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 6);
    let expected_text = words(&ids);

    // With tokenizer.json: "w5 w9" encodes to <bos> w5 w9 = 2,5,9, so the
    // decoded text is the same greedy continuation, spelled as words.
    let tok = root.path().join("tok");
    copy_model(Path::new(&model), &tok);
    write_tokenizer(&tok);
    let tok_s = tok.to_str().unwrap();
    let o = gen(tok_s, &["--prompt", "w5 w9", "--ignore-eos"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), expected_text);
    assert!(stderr(&o).contains("prompt 3 tokens"), "{}", stderr(&o));
    assert!(stderr(&o).contains("tokens/s"), "{}", stderr(&o));
    // --prompt-ids with a tokenizer prints text too.
    let o = gen(tok_s, &["--prompt-ids", "2,5,9", "--ignore-eos"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), expected_text);
    // Seeded sampling from text: same seed, same text.
    let sampled = |seed: &str| {
        let o = gen(
            tok_s,
            &[
                "--prompt", "w5 w9", "--temp", "1.5", "--top-p", "0.9", "--seed", seed,
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(!stdout(&o).trim().is_empty(), "{}", stderr(&o));
        stdout(&o)
    };
    assert_eq!(sampled("7"), sampled("7"), "same seed, same text");

    // eos_token_id in config.json = the first greedy token: stops at once.
    let eos = root.path().join("eos");
    copy_model(&tok, &eos);
    let config_path = eos.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["eos_token_id"] = ids[0].into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let eos_s = eos.to_str().unwrap();
    let o = gen(eos_s, &["--prompt", "w5 w9"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "");
    let e = stderr(&o);
    assert!(e.contains("generated 0 tokens"), "{e}");
    assert!(e.contains(&format!("stopped at EOS id {}", ids[0])), "{e}");
    // --ignore-eos runs on.
    let o = gen(eos_s, &["--prompt", "w5 w9", "--ignore-eos"]);
    assert_eq!(stdout(&o).trim(), expected_text, "{}", stderr(&o));

    // A list in generation_config.json: stops at the first listed id.
    let gc = root.path().join("gc");
    copy_model(&tok, &gc);
    let stop = [ids[2], 511];
    std::fs::write(
        gc.join("generation_config.json"),
        format!(r#"{{"eos_token_id": [{}, {}]}}"#, stop[0], stop[1]),
    )
    .unwrap();
    let o = gen(gc.to_str().unwrap(), &["--prompt-ids", "2,5,9"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let n = ids.iter().position(|t| stop.contains(t)).unwrap();
    assert_eq!(stdout(&o).trim(), words(&ids[..n]));
    assert!(
        stderr(&o).contains(&format!("generated {n} tokens")),
        "{}",
        stderr(&o)
    );
}

/// What the test tokenizer decodes `ids` to.
fn words(ids: &[u32]) -> String {
    let words: Vec<String> = ids.iter().map(|&i| token_name(i)).collect();
    words.join(" ")
}

/// `archgen init` writes a checkpoint with a spec's structure that the
/// generated model, the monolith and mlx-lm all load and agree on.
#[test]
fn init_writes_a_checkpoint_every_implementation_runs() {
    let root = tempfile::tempdir().unwrap();
    let repo = archgen_tests::repo_root();
    // e4b-tiny-kv: its KV-cache quantization must travel with the checkpoint,
    // or dispatch finds no generated model for it.
    for spec in [
        "gemma4-e2b-tiny",
        "gemma4-26b-a4b-tiny-q8",
        "gemma4-e4b-tiny-kv",
        "qwen3-8b-tiny",
        "llama-3.2-1b-tiny-q4",
        "qwen3.5-4b-tiny",
        "qwen3.6-35b-a3b-tiny-q4",
        // LFM2's checkpoint names its modules as lfm2.py does.
        "lfm2-1.2b-tiny",
        "glm4-moe-grouped-tiny-q8",
        // Qwen3-Next: `model.*` names, in_proj_qkvz / in_proj_ba (its
        // experts quantized: unquantized ones run only in float32 on the CPU).
        "qwen3-next-80b-a3b-tiny-q4",
        // DeepSeek-V3: per-head `embed_q` / `unembed_out` (MultiLinear),
        // quantized with the rest.
        "deepseek-v3-tiny-q4",
        // gpt-oss as mlx-community ships it: mxfp4 experts (uint8 scales,
        // no biases), the rest 8-bit affine.
        "gpt-oss-20b-tiny-mxfp4-q8",
    ] {
        let dir = root.path().join(spec);
        let o = archgen(&[
            "init",
            "--spec",
            repo.join(format!("specs/{spec}.yaml")).to_str().unwrap(),
            "--out",
            dir.to_str().unwrap(),
            "--seed",
            "9",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        // stderr is a pipe here: no progress bar, just the one note.
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
        assert!(!stderr(&o).contains('\r'), "{}", stderr(&o));
        // --quiet: not even the note.
        if spec == "gemma4-e2b-tiny" {
            let quiet = root.path().join("quiet");
            let o = archgen(&[
                "init",
                "--spec",
                repo.join(format!("specs/{spec}.yaml")).to_str().unwrap(),
                "--out",
                quiet.to_str().unwrap(),
                "--quiet",
            ]);
            assert!(o.status.success(), "{}", stderr(&o));
            assert_eq!(stderr(&o), "");
        }
        let mut outs = Vec::new();
        for imp in ["generated", "monolith"] {
            let out = root.path().join(format!("{spec}-{imp}.safetensors"));
            let o = archgen(&[
                "logits",
                "--model",
                dir.to_str().unwrap(),
                "--prompt-ids",
                "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17",
                "--decode-steps",
                "9",
                "--impl",
                imp,
                "--out",
                out.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{}", stderr(&o));
            outs.push(out);
        }
        let oracle = root.path().join(format!("{spec}-oracle.safetensors"));
        run_python(
            "oracle_logits.py",
            &[
                "--model".as_ref(),
                dir.as_os_str(),
                "--prompt-ids".as_ref(),
                "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17".as_ref(),
                "--decode-steps".as_ref(),
                "9".as_ref(),
                "--out".as_ref(),
                oracle.as_os_str(),
            ],
        );
        let load = |p: &Path| archgen_runtime::Array::load_safetensors(p).unwrap();
        let (g, m, r) = (load(&outs[0]), load(&outs[1]), load(&oracle));
        for k in ["prefill_logits", "decode_logits", "tokens"] {
            let bytes = |t: &std::collections::HashMap<String, archgen_runtime::Array>| {
                archgen_runtime::bytes::array_bytes(&t[k]).unwrap()
            };
            assert_eq!(bytes(&g), bytes(&m), "{spec} {k}: generated != monolith");
            assert_eq!(bytes(&m), bytes(&r), "{spec} {k}: monolith != mlx-lm");
        }
    }
}

/// The progress path of the loader (what a terminal gets): reports rise to the
/// weight files' size, and the tensors hold the same bytes as the lazy load.
#[test]
fn loading_with_progress_reports_bytes_and_reads_the_same_tensors() {
    use archgen_runtime::weights::{read_checkpoint, read_checkpoint_with_progress};
    let root = tempfile::tempdir().unwrap();
    let model = tiny_model(root.path());
    let dir = Path::new(&model);
    let files: u64 = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("model") && n.ends_with(".safetensors")
        })
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let mut reports = Vec::new();
    let mut record = |done: u64, total: u64| reports.push((done, total));
    let eager = read_checkpoint_with_progress(dir, Some(&mut record)).unwrap();
    assert!(reports.len() > 1, "{reports:?}");
    assert!(reports.windows(2).all(|w| w[0].0 <= w[1].0), "{reports:?}");
    assert!(reports.iter().all(|&(d, t)| t == files && d <= t));
    assert_eq!(reports.last(), Some(&(files, files)));
    // The scoped hook the CLI uses: the same reports through read_checkpoint,
    // and none once the scope ends.
    let hooked = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = hooked.clone();
    let via_hook = archgen_runtime::weights::with_load_progress(
        Box::new(move |done, total| sink.borrow_mut().push((done, total))),
        || read_checkpoint(dir).unwrap(),
    );
    // (Tensors come in hash order, so only the count and the end compare.)
    assert_eq!(hooked.borrow().len(), reports.len());
    assert_eq!(hooked.borrow().last(), reports.last());
    assert_eq!(via_hook.tensors.len(), eager.tensors.len());
    let lazy = read_checkpoint(dir).unwrap();
    assert_eq!(
        hooked.borrow().len(),
        reports.len(),
        "the hook outlived its scope"
    );
    assert_eq!(eager.tensors.len(), lazy.tensors.len());
    for (name, a) in &lazy.tensors {
        let bytes = archgen_runtime::bytes::array_bytes;
        assert_eq!(
            bytes(a).unwrap(),
            bytes(&eager.tensors[name]).unwrap(),
            "{name}"
        );
    }
}

/// `logits --batch`: a schedule run as one continuous batch on each
/// implementation writes the bytes mlx-lm's `BatchGenerator` gives
/// (gemma4-e2b-tiny: sliding and full windows, KV-shared layers).
#[test]
fn logits_batch_runs_the_schedule_on_each_implementation() {
    let root = tempfile::tempdir().unwrap();
    let spec = archgen_tests::repo_root().join("specs/gemma4-e2b-tiny.yaml");
    let dir = root.path().join("gemma4-e2b-tiny");
    let o = archgen(&[
        "init",
        "--spec",
        spec.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let schedule = root.path().join("schedule.json");
    std::fs::write(
        &schedule,
        r#"{"prefill_step_size": 4, "sequences": [
            {"prompt": [3, 40, 77, 114, 151, 188, 225], "arrival": 0, "decode": 4},
            {"prompt": [9, 46, 83], "arrival": 0, "decode": 3},
            {"prompt": [5], "arrival": 2, "decode": 3}]}"#,
    )
    .unwrap();
    let oracle = root.path().join("oracle.safetensors");
    run_python(
        "batch_oracle.py",
        &[dir.as_os_str(), schedule.as_os_str(), oracle.as_os_str()],
    );
    let oracle = archgen_runtime::Array::load_safetensors(&oracle).unwrap();
    for (imp, note) in [
        ("generated", "running generated model gemma4-e2b-tiny"),
        ("monolith", "running batched"),
    ] {
        let out = root.path().join(format!("{imp}.safetensors"));
        let o = archgen(&[
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--batch",
            schedule.to_str().unwrap(),
            "--impl",
            imp,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains(note), "{imp}: {}", stderr(&o));
        let ours = archgen_runtime::Array::load_safetensors(&out).unwrap();
        assert_eq!(ours.len(), 9, "{imp}: three tensors per sequence");
        for (key, theirs) in &oracle {
            let bytes =
                |a: &archgen_runtime::Array| archgen_runtime::bytes::array_bytes(a).unwrap();
            assert_eq!(
                (ours[key].shape(), bytes(&ours[key])),
                (theirs.shape(), bytes(theirs)),
                "{imp}: {key} != mlx-lm"
            );
        }
    }
}

/// `archgen embed` on a tiny Qwen3 checkpoint: the embeddings of each
/// implementation are mlx-lm's (tests/python/embedding_oracle.py: the final
/// norm's output, the last token's row, L2-normalised) byte for byte, a
/// one-token input (the compiled decode step's path) among them; the JSON
/// holds the same values; bad input is refused cleanly.
#[test]
fn embed_matches_mlx_lm_byte_for_byte_on_each_implementation() {
    let root = tempfile::tempdir().unwrap();
    let repo = archgen_tests::repo_root();
    let dir = root.path().join("qwen3-embed");
    let o = archgen(&[
        "init",
        "--spec",
        repo.join("specs/qwen3-0.6b-tiny.yaml").to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--seed",
        "5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    write_tokenizer(&dir);
    let model = dir.to_str().unwrap();
    // The tokenizer prepends <bos> (2): "" is the one-token input [2].
    let texts = [
        "w5 w6 w7",
        "",
        "w300 w301 w302 w303 w304 w305 w306 w307 w308 w309",
    ];
    let inputs: Vec<Vec<u32>> = vec![
        vec![2, 5, 6, 7],
        vec![2],
        std::iter::once(2).chain(300..310).collect(),
    ];
    let text_args: Vec<&str> = texts.iter().flat_map(|t| ["--text", *t]).collect();
    let load = |p: &Path| {
        let tensors = archgen_runtime::Array::load_safetensors(p).unwrap();
        archgen_runtime::bytes::array_bytes(&tensors["embeddings"]).unwrap()
    };
    let job = root.path().join("embed.json");
    std::fs::write(&job, serde_json::json!({ "inputs": inputs }).to_string()).unwrap();
    let oracle = root.path().join("oracle.safetensors");
    run_python(
        "embedding_oracle.py",
        &[dir.as_os_str(), job.as_os_str(), oracle.as_os_str()],
    );
    let oracle = load(&oracle);
    for imp in ["generated", "monolith"] {
        let out = root.path().join(format!("{imp}.safetensors"));
        let mut args = vec!["embed", "--model", model, "--impl", imp];
        args.extend(&text_args);
        args.extend(["--format", "safetensors", "--out", out.to_str().unwrap()]);
        let o = archgen(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        // No sentence-transformers files: the default head, and it says so.
        assert!(
            stderr(&o).contains("last-token pooling, L2 normalisation (the default"),
            "{}",
            stderr(&o)
        );
        assert_eq!(load(&out), oracle, "{imp}: embeddings != mlx-lm's");
    }
    // JSON: OpenAI's list, the same values as f32; one text at a time gives
    // the same values as several in one run.
    let mut args = vec!["embed", "--model", model, "--impl", "monolith", "--quiet"];
    args.extend(&text_args);
    let o = archgen(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let list: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(list["object"], "list");
    assert_eq!(list["model"], "qwen3-embed");
    assert_eq!(list["usage"]["prompt_tokens"], 4 + 1 + 11);
    let rows = list["data"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let oracle_bf16: Vec<f32> = oracle
        .chunks(2)
        .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
        .collect();
    let json_values: Vec<f32> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, row)| {
            assert_eq!(row["index"], i);
            assert_eq!(row["object"], "embedding");
            row["embedding"].as_array().unwrap().clone()
        })
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(json_values, oracle_bf16);
    let o = archgen(&["embed", "--model", model, "--text", texts[2], "--quiet"]);
    let alone: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(alone["data"][0]["embedding"], rows[2]["embedding"]);
    // --file: one text per line.
    let file = root.path().join("texts.txt");
    std::fs::write(&file, "w5 w6 w7\n").unwrap();
    let o = archgen(&["embed", "--model", model, "--file", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let from_file: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(from_file["data"][0]["embedding"], rows[0]["embedding"]);

    // Usage errors: nothing to embed, both sources, safetensors without --out.
    assert_usage_error(&archgen(&["embed", "--model", model]), "--text");
    let both = ["embed", "--model", model, "--text", "a", "--file", "f"];
    assert_usage_error(&archgen(&both), "cannot be used with");
    let no_out = [
        "embed",
        "--model",
        model,
        "--text",
        "a",
        "--format",
        "safetensors",
    ];
    assert_usage_error(&archgen(&no_out), "--out");
    // A pooling mode the runtime does not run is refused, naming it.
    let modules = r#"[{"path": "", "type": "sentence_transformers.models.Transformer"},
                      {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]"#;
    std::fs::write(dir.join("modules.json"), modules).unwrap();
    std::fs::create_dir(dir.join("1_Pooling")).unwrap();
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        r#"{"pooling_mode_mean_tokens": true, "pooling_mode_lasttoken": false}"#,
    )
    .unwrap();
    let o = archgen(&["embed", "--model", model, "--text", "w5"]);
    assert_clean_error(&o, "pooling_mode_mean_tokens is not implemented");
    // Last-token pooling without a Normalize module: the pooled row as it is.
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        r#"{"pooling_mode_mean_tokens": false, "pooling_mode_lasttoken": true}"#,
    )
    .unwrap();
    let raw = root.path().join("raw.safetensors");
    let o = archgen(&[
        "embed",
        "--model",
        model,
        "--text",
        "w5 w6 w7",
        "--format",
        "safetensors",
        "--out",
        raw.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no normalisation (from modules.json"),
        "{}",
        stderr(&o)
    );
    let job = root.path().join("raw.json");
    let raw_job = serde_json::json!({ "inputs": [[2, 5, 6, 7]], "normalize": false });
    std::fs::write(&job, raw_job.to_string()).unwrap();
    let oracle_raw = root.path().join("oracle-raw.safetensors");
    run_python(
        "embedding_oracle.py",
        &[dir.as_os_str(), job.as_os_str(), oracle_raw.as_os_str()],
    );
    let raw = load(&raw);
    assert_eq!(raw, load(&oracle_raw), "unnormalised != mlx-lm's");
    assert_ne!(raw[..], oracle[..raw.len()], "the L2 step changed nothing");
}
