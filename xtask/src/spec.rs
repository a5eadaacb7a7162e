//! `cargo xtask spec ...`: check, show, import and schema for the YAML architecture specs.

use archgen_families::{import, Spec};
use archgen_ir::{HeadWeight, KvCache, KvSource, Layer, RopeKind, Values, Window};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::cli::{CheckArgs, ImportArgs, ShowArgs};
use crate::report::Reporter;

pub fn specs_dir() -> PathBuf {
    crate::root::repo_root().join("specs")
}

fn schema_path() -> PathBuf {
    specs_dir().join("schema").join("archgen-spec.schema.json")
}

/// Every `specs/*.yaml`, sorted.
pub fn all_specs() -> Result<Vec<PathBuf>, String> {
    let dir = specs_dir();
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    out.sort();
    Ok(out)
}

/// A path relative to the repository root when it is inside it (stable output).
fn display(path: &Path) -> String {
    let root = crate::root::repo_root();
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// `spec check [PATH...]`: a line per spec on stdout (`ok` or `FAIL`) and
/// every error in the excerpt form on stderr; with `--message-format json`,
/// JSON lines on stdout instead (a `spec` object per spec, its diagnostics,
/// then a `summary`).
pub fn check(args: &CheckArgs) -> Result<(), String> {
    let reporter = Reporter::new(args.format.message_format);
    let paths: Vec<PathBuf> = if args.paths.is_empty() {
        all_specs()?
    } else {
        args.paths.clone()
    };
    let mut failed = 0;
    for path in &paths {
        match archgen_families::load(path) {
            Ok(spec) => {
                let ir = spec.lower();
                let (layers, params) = (ir.layers.len(), ir.param_count());
                let hash = &archgen_families::spec_hash(&spec)[..16];
                if reporter.json() {
                    reporter.emit(&serde_json::json!({
                        "type": "spec", "file": display(path), "status": "ok",
                        "layers": layers, "params": params, "sha256": hash,
                    }));
                } else {
                    println!(
                        "ok    {}  ({} layers, {} params, sha256 {hash})",
                        display(path),
                        layers,
                        params,
                    );
                }
            }
            Err(d) => {
                failed += 1;
                if reporter.json() {
                    reporter.emit(&serde_json::json!({
                        "type": "spec", "file": display(path), "status": "error", "errors": d.len(),
                    }));
                    reporter.spec_errors(&d);
                } else {
                    println!("FAIL  {}", display(path));
                    eprintln!("{}", reporter.spec_errors(&d));
                }
            }
        }
    }
    if reporter.json() {
        reporter.emit(&serde_json::json!({
            "type": "summary", "specs": paths.len(), "failed": failed,
        }));
    }
    if failed == 0 {
        if !reporter.json() {
            println!("{} spec(s) valid", paths.len());
        }
        Ok(())
    } else {
        Err(format!("{failed} of {} spec(s) have errors", paths.len()))
    }
}

fn resolve_name(name: &str) -> PathBuf {
    let p = Path::new(name);
    if p.extension().is_some_and(|e| e == "yaml") || p.components().count() > 1 {
        p.to_path_buf()
    } else {
        specs_dir().join(format!("{name}.yaml"))
    }
}

/// `spec show NAME|PATH [--json]`.
pub fn show(args: &ShowArgs) -> Result<(), String> {
    let reporter = Reporter::new(args.format.message_format);
    let spec =
        archgen_families::load(resolve_name(&args.name)).map_err(|d| reporter.spec_errors(&d))?;
    let text = if args.json {
        let v = archgen_families::to_hf_json(&spec);
        serde_json::to_string_pretty(&v).map_err(|e| e.to_string())? + "\n"
    } else {
        summary(&spec)
    };
    let text = match args.tensor_parallel {
        None => text,
        Some(ranks) => {
            let ir = spec.lower();
            let split = archgen_plan::tensor_parallel::split(&ir, ranks)?;
            format!("{text}\n{}", split.render())
        }
    };
    print_out(&text)
}

/// Prints to stdout; a closed pipe (`| head`) is not an error.
fn print_out(text: &str) -> Result<(), String> {
    use std::io::Write;
    match std::io::stdout().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.to_string()),
        _ => Ok(()),
    }
}

/// A reviewer's view of a resolved spec, read from its block IR: model facts,
/// one line per layer, modules.
fn summary(spec: &Spec) -> String {
    let ir = spec.lower();
    let n = ir.layers.len();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} ({}, {}, {} params, sha256 {})",
        ir.name,
        spec.family().as_str(),
        ir.checkpoint.model_type.as_str(),
        ir.param_count(),
        &archgen_families::spec_hash(spec)[..16]
    );
    let attention = || ir.layers.iter().filter_map(Layer::attention);
    let first_shared = ir
        .layers
        .iter()
        .position(|l| l.attention().is_some_and(|a| !a.owns_kv()))
        .unwrap_or(n);
    let window = attention()
        .find_map(|a| match a.window {
            Window::Sliding(w) => Some(w),
            Window::Full => None,
        })
        .unwrap_or(0);
    let _ = writeln!(
        o,
        "hidden {}  vocab {}  layers {} (first KV-shared {})  heads {}  window {}  mlp {}",
        ir.hidden_size,
        ir.vocab_size,
        n,
        first_shared,
        attention().next().map_or(0, |a| a.n_heads),
        window,
        width_or_dash(ir.layers.first().and_then(Layer::mlp).map(|m| m.width)),
    );
    let ple = ir
        .embedding
        .per_layer_input
        .map_or("none".to_string(), |p| {
            format!("width {} vocab {}", p.width, p.vocab)
        });
    let moe = ir
        .layers
        .iter()
        .find_map(Layer::moe)
        .map_or("none".to_string(), |m| {
            format!(
                "{} experts top-{} width {}",
                m.num_experts, m.top_k, m.width
            )
        });
    let _ = writeln!(
        o,
        "eps {:e}  softcap {:?}  tied {}  ple {ple}  moe {moe}",
        ir.norm_eps,
        ir.head.logit_softcap.map(|s| s.cap),
        ir.head.weight == HeadWeight::TiedEmbedding,
    );
    let _ = writeln!(
        o,
        "layer type     hd  heads kv  k=v  kv-src  mlp     rope                        kv-quant"
    );
    for l in &ir.layers {
        let mlp = width_or_dash(l.mlp().map(|m| m.width));
        let Some(a) = l.attention() else {
            // A Gated DeltaNet or short-conv layer: no heads of attention, no
            // K/V, no RoPE.
            let kind = match &l.mixer {
                archgen_ir::Mixer::ShortConv(_) => "conv",
                archgen_ir::Mixer::GatedDeltaNet(_) | archgen_ir::Mixer::Attention(_) => "linear",
            };
            let _ = writeln!(
                o,
                "{:>5} {:<8} {:>4} {:>5} {:>3}  {:<4} {:>6}  {:<7} {:<27} -",
                l.index, kind, "-", "-", "-", "-", "-", mlp, "-"
            );
            continue;
        };
        let rope = match a.rope.kind {
            RopeKind::Default { theta } => format!("default θ={theta}"),
            RopeKind::Linear { theta, factor } => format!("linear θ={theta} f={factor}"),
            RopeKind::Proportional {
                theta,
                partial_rotary_factor,
                factor,
            } => format!(
                "prop θ={theta} p={partial_rotary_factor} f={factor} ({})",
                a.rope.rotated_dims
            ),
            RopeKind::Llama3 {
                theta,
                factor,
                low_freq_factor,
                high_freq_factor,
                ..
            } => format!("llama3 θ={theta} f={factor} {low_freq_factor}..{high_freq_factor}"),
            RopeKind::Yarn {
                theta,
                factor,
                original_max_position_embeddings,
                ..
            } => format!("yarn θ={theta} f={factor} orig={original_max_position_embeddings}"),
            RopeKind::NoPe => "none (NoPE)".to_string(),
        };
        // A sharer attends over its donor's K/V: the donor's values and cache.
        let donor = a.kv_layer(l.index);
        let own = match ir
            .layers
            .get(donor)
            .and_then(Layer::attention)
            .map(|d| d.kv)
        {
            Some(KvSource::Own { values, cache }) => Some((values, cache)),
            Some(KvSource::Shared { .. }) | None => None,
        };
        let k_eq_v = matches!(own, Some((Values::SameAsKeys, _)));
        let kvq = match (a.owns_kv(), own.map(|(_, cache)| cache)) {
            (true, Some(KvCache::Quantized(q))) => format!("{}b g{}", q.bits, q.group_size),
            (true, Some(KvCache::QuantizedAfterForward { quant: q, start })) => {
                format!("{}b g{} from {start}", q.bits, q.group_size)
            }
            (true, Some(KvCache::Plain) | None) | (false, _) => "-".to_string(),
        };
        let _ = writeln!(
            o,
            "{:>5} {:<8} {:>4} {:>5} {:>3}  {:<4} {:>6}  {:<7} {:<27} {}",
            l.index,
            match a.window {
                Window::Sliding(_) => "sliding",
                Window::Full => "full",
            },
            a.head_dim,
            a.n_heads,
            a.n_kv_heads,
            if k_eq_v { "yes" } else { "no" },
            if a.owns_kv() {
                "own".to_string()
            } else {
                donor.to_string()
            },
            mlp,
            rope,
            kvq
        );
    }
    if ir.quantization.is_some() {
        let _ = writeln!(o, "quantized modules:");
        for m in ir.quantizable_modules() {
            let q = ir
                .quant_for(&m.path)
                .map_or("bf16 (not quantized)".to_string(), |q| {
                    format!("{}-bit g{} {}", q.bits, q.group_size, q.mode.as_str())
                });
            let _ = writeln!(o, "  {}  [{}x{}]  {q}", m.path, m.out_dim, m.in_dim);
        }
    }
    o
}

/// A width, or `-` where the layer (or model) has no dense MLP.
fn width_or_dash(width: Option<usize>) -> String {
    width.map_or("-".to_string(), |w| w.to_string())
}

/// `spec schema [--check]`.
pub fn schema(check: bool) -> Result<(), String> {
    let want = archgen_families::json_schema();
    let path = schema_path();
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if check {
        if have == want {
            println!("{} is up to date", display(&path));
            Ok(())
        } else {
            Err(format!(
                "{} is stale; run `cargo xtask spec schema` and commit the result",
                display(&path)
            ))
        }
    } else if have == want {
        println!("{} unchanged", display(&path));
        Ok(())
    } else {
        write_atomic(&path, &want)?;
        println!("wrote {}", display(&path));
        Ok(())
    }
}

/// Writes through a temporary file in the same directory and a rename.
fn write_atomic(path: &Path, text: &str) -> Result<(), String> {
    let dir = path
        .parent()
        .ok_or_else(|| format!("{} has no directory", path.display()))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("spec");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot move {} into place: {e}", path.display())
    })
}

/// `org/name` and revision from a Hugging Face cache path
/// (`.../models--org--name/snapshots/<rev>`).
fn hub_cache_identity(dir: &Path) -> Option<(String, String)> {
    let rev = dir.file_name()?.to_str()?.to_string();
    let snapshots = dir.parent()?;
    if snapshots.file_name()? != "snapshots" {
        return None;
    }
    let repo_dir = snapshots.parent()?.file_name()?.to_str()?;
    let rest = repo_dir.strip_prefix("models--")?;
    let (org, name) = rest.split_once("--")?;
    Some((format!("{org}/{name}"), rev))
}

fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: invalid JSON: {e}", path.display()))
}

/// `spec import MODEL_DIR|CONFIG_JSON --name NAME [--kv-config FILE] [--force] [--out DIR]`.
pub fn import_cmd(args: &ImportArgs) -> Result<(), String> {
    let input = args.input.clone();
    let name = args.name.clone();
    let force = args.force;
    let (config_path, model_dir) = if input.is_dir() {
        (input.join("config.json"), Some(input.clone()))
    } else {
        (input.clone(), input.parent().map(Path::to_path_buf))
    };
    let config = read_json(&config_path)?;
    let kv_path = match args.kv_config.clone() {
        Some(p) => Some(p),
        None => model_dir
            .as_ref()
            .map(|d| d.join("kv_config.json"))
            .filter(|p| p.is_file()),
    };
    let kv_value = match &kv_path {
        Some(p) => {
            println!("reading KV-cache quantization from {}", p.display());
            Some(read_json(p)?)
        }
        None => None,
    };
    // mlx-optiq's way of applying it: --quantized-kv-start, or a kv_scheme.json beside it.
    let scheme_path = kv_path
        .as_ref()
        .and_then(|p| p.parent())
        .map(|d| d.join(import::KV_SCHEME_FILE))
        .filter(|p| p.is_file());
    let optiq_start = match (args.quantized_kv_start, &scheme_path) {
        (Some(n), _) => Some(n),
        (None, Some(p)) => Some(
            import::read_kv_scheme(&read_json(p)?).map_err(|e| format!("{}: {e}", p.display()))?,
        ),
        (None, None) => None,
    };
    if let (Some(_), None) = (optiq_start, &kv_value) {
        return Err("--quantized-kv-start needs a kv_config.json (--kv-config FILE)".into());
    }
    let kv = match (&kv_value, optiq_start) {
        (None, _) => None,
        (Some(v), None) => Some(import::KvConfig::QuantizedCache(v)),
        (Some(v), Some(quantized_kv_start)) => Some(import::KvConfig::OptiqMixed {
            kv_config: v,
            quantized_kv_start,
        }),
    };
    let (mut spec, applied) = import::from_config_json_kv(&config, kv, &name)
        .map_err(|e| format!("{} cannot be imported:\n{e}", config_path.display()))?;
    if let Some((repo, rev)) = model_dir.as_deref().and_then(hub_cache_identity) {
        spec.identity_mut().source.repo = Some(repo);
        spec.identity_mut().source.revision = Some(rev);
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(specs_dir)
        .join(format!("{name}.yaml"));
    if out.exists() && !force {
        return Err(format!(
            "{} exists; pass --force to overwrite it",
            display(&out)
        ));
    }
    let mut text = archgen_families::to_yaml(&spec);
    let header =
        format!(
        "# Imported by `cargo xtask spec import` from {} (model_type {}); {} default(s) applied.\n",
        config_path.file_name().and_then(|n| n.to_str()).unwrap_or("config.json"),
        spec.identity().source.model_type.as_str(),
        applied.len()
    );
    let first_newline = text.find('\n').map_or(0, |i| i + 1);
    text.insert_str(first_newline, &header);
    // What we write must load back to the same spec.
    let back = archgen_families::parse_str(&text, &out.display().to_string())
        .map_err(|d| format!("internal error: the imported spec does not re-parse:\n{d}"))?;
    if back != spec {
        return Err("internal error: the imported spec does not round-trip".into());
    }
    write_atomic(&out, &text)?;
    if applied.is_empty() {
        println!("no defaults applied: every field was in the config");
    } else {
        println!("applied {} default(s) / normalisation(s):", applied.len());
        for a in &applied {
            println!("  {a}");
        }
    }
    println!("wrote {}", display(&out));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_cache_paths_give_repo_and_revision() {
        let p = Path::new("/x/hub/models--google--gemma-4-12B/snapshots/56820d7");
        assert_eq!(
            hub_cache_identity(p),
            Some(("google/gemma-4-12B".into(), "56820d7".into()))
        );
        assert_eq!(hub_cache_identity(Path::new("/x/some/model")), None);
    }

    #[test]
    fn import_writes_atomically_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        std::fs::write(
            &config,
            r#"{"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 5,
                "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
                "head_dim": 16, "global_head_dim": 32, "num_kv_shared_layers": 0,
                "hidden_size_per_layer_input": 0, "vocab_size": 512,
                "use_double_wide_mlp": false, "sliding_window": 8}"#,
        )
        .unwrap();
        let args = |extra: &[&str]| {
            use clap::Parser;
            let mut v: Vec<String> = vec![
                "xtask".into(),
                "spec".into(),
                "import".into(),
                config.display().to_string(),
                "--name".into(),
                "imported".into(),
                "--out".into(),
                dir.path().display().to_string(),
            ];
            v.extend(extra.iter().map(|s| s.to_string()));
            match crate::cli::Cli::try_parse_from(v).unwrap().task {
                crate::cli::Task::Spec {
                    command: crate::cli::SpecCommand::Import(a),
                } => a,
                other => panic!("not spec import: {other:?}"),
            }
        };
        import_cmd(&args(&[])).unwrap();
        let out = dir.path().join("imported.yaml");
        let spec = archgen_families::load(&out).unwrap();
        assert_eq!(spec.lower().hidden_size, 64);
        let err = import_cmd(&args(&[])).unwrap_err();
        assert!(err.contains("--force"), "{err}");
        import_cmd(&args(&["--force"])).unwrap();
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn the_checked_in_schema_is_fresh() {
        schema(true).unwrap();
    }
}
