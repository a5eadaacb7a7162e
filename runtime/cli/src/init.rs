//! `archgen init`: a random-weight checkpoint with a spec's exact structure,
//! written with MLX on the default device (so a large one is made on the GPU
//! where there is one). Weights are normal with std 1/sqrt(fan_in); norm
//! weights, layer scalars and router scales are uniform in [0.5, 1.5), so a
//! missed multiply changes the output. Modules the spec quantizes are packed
//! with mlx's affine quantize, as mlx-lm's convert does.

use std::collections::BTreeMap;

use archgen_ir::{KvCache, KvSource};
use archgen_ir::{ModuleKind, QuantMode};
use archgen_runtime::mlx_rs::{self, Array, Dtype};

use std::io::{IsTerminal, Write};

use archgen_families::render::Style;

use crate::args::{InitArgs, MessageFormat, WeightDtype};
use crate::ui::Ui;

fn mlx<T>(r: Result<T, mlx_rs::error::Exception>) -> Result<T, String> {
    r.map_err(|e| format!("MLX: {e}"))
}

fn dtype_of(dtype: WeightDtype) -> Dtype {
    match dtype {
        WeightDtype::Bfloat16 => Dtype::Bfloat16,
        WeightDtype::Float16 => Dtype::Float16,
        WeightDtype::Float32 => Dtype::Float32,
    }
}

/// Spec errors in the excerpt form (colour on a terminal), or as JSON lines
/// on stdout with a one-line summary for the error.
fn spec_errors(diags: &archgen_families::Diagnostics, format: MessageFormat) -> String {
    match format {
        MessageFormat::Human => {
            let style = if std::io::stderr().is_terminal() {
                Style::Color
            } else {
                Style::Plain
            };
            diags.render_excerpts(style)
        }
        MessageFormat::Json => {
            let mut out = std::io::stdout().lock();
            for v in diags.to_json() {
                let _ = writeln!(out, "{v}");
            }
            let n = diags.len();
            format!(
                "{n} spec error{} (JSON on stdout)",
                if n == 1 { "" } else { "s" }
            )
        }
    }
}

pub fn init(ui: &Ui, args: &InitArgs) -> Result<(), String> {
    let (out, seed, dtype) = (args.out.as_path(), args.seed, args.dtype);
    let spec =
        archgen_families::load(&args.spec).map_err(|d| spec_errors(&d, args.message_format))?;
    let ir = spec.lower();
    let dt = dtype_of(dtype);
    let mut tensors: BTreeMap<String, Array> = BTreeMap::new();
    let mut n = 0u64;
    let mut next_key = || {
        n += 1;
        mlx_rs::random::key(seed.wrapping_mul(1_000_003).wrapping_add(n))
    };
    let modules = ir.quantizable_modules();
    // Progress counts the bytes of weight matrices generated, in the weight
    // dtype (before quantization packs them); the vector parameters below
    // are too small to show.
    let elem_bytes: u64 = match dtype {
        WeightDtype::Bfloat16 | WeightDtype::Float16 => 2,
        WeightDtype::Float32 => 4,
    };
    let total: u64 = modules
        .iter()
        .map(|m| {
            let experts = match m.kind {
                ModuleKind::SwitchLinear | ModuleKind::MultiLinear => m.count,
                ModuleKind::Linear | ModuleKind::Embedding => 1,
            };
            elem_bytes * experts * m.out_dim * m.in_dim
        })
        .sum();
    let bar = ui.bytes_bar(&format!("generating {}", spec.name()), total);
    for m in &modules {
        let mut shape = vec![m.out_dim as i32, m.in_dim as i32];
        match m.kind {
            ModuleKind::SwitchLinear | ModuleKind::MultiLinear => shape.insert(0, m.count as i32),
            ModuleKind::Linear | ModuleKind::Embedding => {}
        }
        let std = match m.kind {
            // Scaled by sqrt(hidden) in the forward; keeps tied logits at a few units.
            ModuleKind::Embedding => 0.5f32,
            _ => 1.0 / (m.in_dim as f32).sqrt(),
        };
        let key = mlx(next_key())?;
        let w = mlx(mlx_rs::random::normal::<f32>(&shape, None, None, &key))?;
        let w = mlx(mlx(w.multiply(Array::from_f32(std)))?.as_dtype(dt))?;
        match ir.quant_for(&m.path) {
            Some(q) => match q.mode {
                QuantMode::Affine => {
                    let (wq, scales, biases) = mlx(mlx_rs::ops::quantize(
                        &w,
                        q.group_size as i32,
                        q.bits as i32,
                    ))?;
                    mlx(wq.eval())?;
                    tensors.insert(format!("{}.weight", m.path), wq);
                    tensors.insert(format!("{}.scales", m.path), scales);
                    tensors.insert(format!("{}.biases", m.path), biases);
                }
                // mlx-community's gpt-oss experts: packed weights and uint8
                // scales, no biases.
                QuantMode::Mxfp4 => {
                    let groups = (q.group_size as i32, q.bits as i32);
                    let parts = mlx(archgen_runtime::mlx_c::quantize_with_mode(
                        &w, groups, c"mxfp4",
                    ))?;
                    let [wq, scales] = <[Array; 2]>::try_from(parts).map_err(|p| {
                        format!(
                            "{}: mxfp4 quantize gave {} arrays, expected 2",
                            m.path,
                            p.len()
                        )
                    })?;
                    mlx(wq.eval())?;
                    tensors.insert(format!("{}.weight", m.path), wq);
                    tensors.insert(format!("{}.scales", m.path), scales);
                }
                QuantMode::Mxfp8 | QuantMode::Nvfp4 => {
                    return Err(format!(
                        "{}: quantization mode {} is not written by archgen init (affine and \
                         mxfp4 are); change the spec's quantization for this module",
                        m.path,
                        q.mode.as_str()
                    ))
                }
            },
            None => {
                mlx(w.eval())?;
                tensors.insert(format!("{}.weight", m.path), w);
            }
        }
        if let Some(bar) = &bar {
            bar.inc(elem_bytes * shape.iter().map(|&d| d as u64).product::<u64>());
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // Everything else is a vector parameter (norms, layer scalars, router scales).
    for p in archgen_plan::params(&ir) {
        if tensors.contains_key(&p.name) {
            continue;
        }
        let shape: Vec<i32> = p.shape.iter().map(|&d| d as i32).collect();
        let key = mlx(next_key())?;
        let v = mlx(mlx_rs::random::uniform::<f32, f32>(0.5, 1.5, &shape, &key))?;
        tensors.insert(p.name.clone(), mlx(v.as_dtype(dt))?);
    }
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let mut config = archgen_families::to_config_json(&spec);
    if let Some(q) = archgen_families::to_hf_json(&spec).get("quantization") {
        config["quantization"] = q.clone();
    }
    let text = serde_json::to_string_pretty(&config).expect("JSON of plain values");
    std::fs::write(out.join("config.json"), text + "\n")
        .map_err(|e| format!("cannot write {}: {e}", out.join("config.json").display()))?;
    // Per-layer KV-cache quantization travels as mlx-optiq's kv_config.json,
    // which the loader reads back into the same architecture; mlx-optiq's way of
    // applying it (mixed_kv) adds kv_scheme.json with its quantized_kv_start.
    let mut optiq_start = None;
    let kv: Vec<serde_json::Value> = ir
        .layers
        .iter()
        .filter_map(|l| match l.attention()?.kv {
            KvSource::Own {
                cache: KvCache::Quantized(q),
                ..
            } => Some(serde_json::json!({"layer_idx": l.index, "bits": q.bits, "group_size": q.group_size})),
            KvSource::Own {
                cache: KvCache::QuantizedAfterForward { quant: q, start },
                ..
            } => {
                optiq_start = Some(start);
                Some(serde_json::json!({"layer_idx": l.index, "bits": q.bits, "group_size": q.group_size}))
            }
            KvSource::Own { cache: KvCache::Plain, .. } | KvSource::Shared { .. } => None,
        })
        .collect();
    if let Some(start) = optiq_start {
        let path = out.join(archgen_families::import::KV_SCHEME_FILE);
        let scheme = archgen_families::import::kv_scheme_json(start as u32);
        let text = serde_json::to_string_pretty(&scheme).expect("JSON of plain values");
        std::fs::write(&path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if !kv.is_empty() {
        let text = serde_json::to_string_pretty(&kv).expect("JSON of plain values");
        std::fs::write(out.join("kv_config.json"), text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", out.join("kv_config.json").display()))?;
    }
    // LFM2's checkpoint spells its modules as lfm2.py names them (the
    // contract has the names the loader reads them as).
    if ir
        .checkpoint
        .sanitize
        .contains(&archgen_ir::SanitizeRule::RenameLfm2Modules)
    {
        tensors = tensors
            .into_iter()
            .map(|(k, v)| (archgen_ir::names::lfm2_checkpoint_name(&k), v))
            .collect();
    }
    let path = out.join("model.safetensors");
    let spinner = ui.spinner(&format!("writing {}", path.display()));
    let saved = Array::save_safetensors(tensors.iter(), None, &path);
    if let Some(spinner) = spinner {
        spinner.finish_and_clear();
    }
    saved.map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let bytes: usize = tensors.values().map(|a| a.nbytes()).sum();
    ui.note(&format!(
        "wrote {} ({} tensors, {:.2} GB) and config.json for {}",
        path.display(),
        tensors.len(),
        bytes as f64 / 1e9,
        spec.name()
    ));
    Ok(())
}
