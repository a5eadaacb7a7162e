//! Embeddings of an embedding checkpoint (e.g. Qwen3-Embedding): the final
//! norm's output (the LM head's input, mlx-lm's `model.model(inputs)`),
//! pooled and normalised in MLX in the model's compute dtype. `archgen
//! embed` and the server's POST /v1/embeddings both run [`embed_one`].
//!
//! How to pool and whether to normalise come from the checkpoint's
//! sentence-transformers files when it has them (modules.json, the Pooling
//! module's config.json, a Normalize module); a checkpoint without
//! modules.json gets last-token pooling and L2 normalisation (what
//! Qwen3-Embedding's model card prescribes), and every command says so.

use std::path::{Path, PathBuf};

use archgen_runtime::device::release_buffer_pool;
use archgen_runtime::mlx_rs::linalg::{norm_l2, NormOptions};
use archgen_runtime::mlx_rs::ops::indexing::TryIndexOp;
use archgen_runtime::mlx_rs::{Array, Axes, Dtype};
use archgen_runtime::model::{CausalLm, ModelTask, Readout};
use serde::{Deserialize, Serialize};

use crate::args::{EmbedArgs, EmbedFormat};
use crate::checkpoint::{load_tokenizer, with_model};
use crate::tokens::{check_ids, mlx};
use crate::ui::Ui;

/// Which hidden state of a sequence becomes its embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The last token's (sentence-transformers' `pooling_mode_lasttoken`).
    LastToken,
}

/// What the pooled hidden state is divided by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Normalization {
    /// Its L2 norm: `x / mx.linalg.norm(x, axis=-1, keepdims=True)`.
    L2,
    /// Nothing (modules.json lists no Normalize module).
    None,
}

/// Where the pooling and normalisation were read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadOrigin {
    /// The checkpoint's modules.json and its Pooling module's config.json.
    SentenceTransformers { pooling_config: PathBuf },
    /// The checkpoint has no modules.json: last-token pooling and L2
    /// normalisation by default.
    Default,
}

/// How hidden states become embeddings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingHead {
    pub pooling: Pooling,
    pub normalization: Normalization,
    pub origin: HeadOrigin,
}

/// One entry of sentence-transformers' modules.json.
#[derive(Deserialize)]
struct ModuleEntry {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// The modules of a sentence-transformers pipeline this runtime knows.
enum Module {
    Transformer,
    Pooling,
    Normalize,
}

impl Module {
    fn of(kind: &str) -> Option<Module> {
        match kind.rsplit('.').next().unwrap_or(kind) {
            "Transformer" => Some(Module::Transformer),
            "Pooling" => Some(Module::Pooling),
            "Normalize" => Some(Module::Normalize),
            _ => None,
        }
    }
}

/// The pooling modes of sentence-transformers' Pooling config.json.
const POOLING_MODES: [&str; 6] = [
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
];

impl EmbeddingHead {
    /// Reads `model`'s modules.json (and its Pooling module's config.json)
    /// when there is one; else the default head (last token, L2).
    pub fn read(model: &Path) -> Result<EmbeddingHead, String> {
        let modules_file = model.join("modules.json");
        if !modules_file.exists() {
            return Ok(EmbeddingHead {
                pooling: Pooling::LastToken,
                normalization: Normalization::L2,
                origin: HeadOrigin::Default,
            });
        }
        let text = std::fs::read_to_string(&modules_file)
            .map_err(|e| format!("cannot read {}: {e}", modules_file.display()))?;
        let modules: Vec<ModuleEntry> = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{}: expected a list of {{\"path\", \"type\"}} modules: {e}",
                modules_file.display()
            )
        })?;
        let mut pooling = None;
        let mut normalization = Normalization::None;
        for (i, entry) in modules.iter().enumerate() {
            match Module::of(&entry.kind) {
                Some(Module::Transformer) => {}
                Some(Module::Normalize) => normalization = Normalization::L2,
                Some(Module::Pooling) => {
                    let file = model.join(&entry.path).join("config.json");
                    pooling = Some((read_pooling(&file)?, file));
                }
                None => {
                    return Err(format!(
                        "{}: module {i} is {}, which this runtime does not run (it runs \
                         Transformer, Pooling with pooling_mode_lasttoken, and Normalize)",
                        modules_file.display(),
                        entry.kind
                    ))
                }
            }
        }
        let Some((pooling, pooling_config)) = pooling else {
            return Err(format!(
                "{}: no Pooling module: the checkpoint gives token embeddings, not one per input",
                modules_file.display()
            ));
        };
        Ok(EmbeddingHead {
            pooling,
            normalization,
            origin: HeadOrigin::SentenceTransformers { pooling_config },
        })
    }

    /// The head in words, for status notes and errors.
    pub fn describe(&self) -> String {
        let pooling = match self.pooling {
            Pooling::LastToken => "last-token pooling",
        };
        let normalization = match self.normalization {
            Normalization::L2 => "L2 normalisation",
            Normalization::None => "no normalisation",
        };
        let origin = match &self.origin {
            HeadOrigin::SentenceTransformers { pooling_config } => {
                format!("from modules.json and {}", pooling_config.display())
            }
            HeadOrigin::Default => {
                "the default: the checkpoint has no sentence-transformers modules.json".into()
            }
        };
        format!("{pooling}, {normalization} ({origin})")
    }
}

/// The one pooling mode a Pooling config.json turns on, when it is one
/// this runtime runs.
fn read_pooling(file: &Path) -> Result<Pooling, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let config: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not valid JSON: {e}", file.display()))?;
    let on: Vec<&str> = POOLING_MODES
        .into_iter()
        .filter(|mode| config.get(*mode).and_then(serde_json::Value::as_bool) == Some(true))
        .collect();
    match on.as_slice() {
        ["pooling_mode_lasttoken"] => Ok(Pooling::LastToken),
        [] => Err(format!("{}: no pooling_mode_* is true", file.display())),
        [mode] => Err(format!(
            "{}: {mode} is not implemented; this runtime pools the last token only \
             (pooling_mode_lasttoken)",
            file.display()
        )),
        _ => Err(format!(
            "{}: several pooling modes are on ({}); this runtime pools the last token only",
            file.display(),
            on.join(", ")
        )),
    }
}

/// The embedding of one sequence `ids` (checked against the vocabulary):
/// one forward from a fresh cache read out at the final norm, the pooled
/// row, normalised; [1, hidden] in the model's compute dtype, evaluated.
/// The ops and their order are those of the oracle
/// (tests/python/embedding_oracle.py), so the bytes are mlx-lm's.
pub fn embed_one<M: CausalLm>(m: &M, ids: &[i32], head: &EmbeddingHead) -> Result<Array, String> {
    check_ids("input", ids, m.vocab_size())?;
    if ids.is_empty() {
        return Err("an input has no tokens".into());
    }
    let x = Array::from_slice(ids, &[1, ids.len() as i32]);
    let mut cache = m.make_cache();
    let hidden = mlx(m.forward_to(&x, &mut cache, Readout::NormedHidden))?;
    let pooled = match head.pooling {
        Pooling::LastToken => mlx(hidden.try_index((.., -1, ..)))?,
    };
    let embedding = match head.normalization {
        Normalization::L2 => {
            let options = NormOptions {
                axes: Axes::Axis(-1),
                keep_dims: true,
            };
            mlx(pooled.divide(mlx(norm_l2(&pooled, options))?))?
        }
        Normalization::None => pooled,
    };
    mlx(embedding.eval())?;
    // As after a prefill chunk: the forward's buffers go back to the system,
    // so a server does not keep the high-water mark of every input length.
    mlx(release_buffer_pool())?;
    Ok(embedding)
}

/// An embedding's values as f32 (exact: every compute dtype widens to f32
/// without rounding).
pub fn values(embedding: &Array) -> Result<Vec<f32>, String> {
    let wide = mlx(embedding.as_dtype(Dtype::Float32))?;
    mlx(wide.eval())?;
    Ok(wide.as_slice::<f32>().to_vec())
}

/// One embedding in OpenAI's list.
#[derive(Serialize)]
pub struct EmbeddingEntry<T: Serialize> {
    pub object: &'static str,
    pub index: usize,
    pub embedding: T,
}

/// The response body of OpenAI's embeddings API (and `archgen embed`'s
/// JSON).
#[derive(Serialize)]
pub struct EmbeddingList<T: Serialize> {
    pub object: &'static str,
    pub data: Vec<EmbeddingEntry<T>>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Serialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

impl<T: Serialize> EmbeddingList<T> {
    pub fn new(model: String, embeddings: Vec<T>, prompt_tokens: usize) -> Self {
        EmbeddingList {
            object: "list",
            data: embeddings
                .into_iter()
                .enumerate()
                .map(|(index, embedding)| EmbeddingEntry {
                    object: "embedding",
                    index,
                    embedding,
                })
                .collect(),
            model,
            usage: EmbeddingUsage {
                prompt_tokens,
                total_tokens: prompt_tokens,
            },
        }
    }
}

/// `archgen embed`: each text encoded with DIR/tokenizer.json (special
/// tokens added as its post-processor says), one forward each.
pub fn embed(ui: &Ui, args: &EmbedArgs) -> Result<(), String> {
    let texts = match (&args.text, &args.file) {
        (texts, None) if !texts.is_empty() => texts.clone(),
        (texts, Some(file)) if texts.is_empty() => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            text.lines().map(str::to_owned).collect()
        }
        _ => return Err("give --text TEXT (one or more) or --file FILE, exactly one".into()),
    };
    if texts.is_empty() {
        return Err("--file: the file has no lines (one text per line)".into());
    }
    let head = EmbeddingHead::read(&args.model)?;
    ui.note(&format!("embed: {}", head.describe()));
    let tokenizer = load_tokenizer(&args.model)?.ok_or_else(|| {
        format!(
            "embed needs {} (not found) to turn text into tokens",
            args.model.join("tokenizer.json").display()
        )
    })?;
    let mut inputs = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let encoding = tokenizer
            .encode_fast(text.as_str(), true)
            .map_err(|e| format!("text {}: cannot be encoded: {e}", i + 1))?;
        let ids: Vec<i32> = encoding.get_ids().iter().map(|&t| t as i32).collect();
        if ids.is_empty() {
            return Err(format!("text {}: encodes to no tokens", i + 1));
        }
        inputs.push(ids);
    }
    let context = crate::engine::model_context(&args.model)?;
    if let Some((i, ids)) = inputs
        .iter()
        .enumerate()
        .find(|(_, ids)| ids.len() > context.tokens)
    {
        return Err(format!(
            "text {}: {} tokens, more than the model's context of {} ({})",
            i + 1,
            ids.len(),
            context.tokens,
            context.describe()
        ));
    }
    let task = EmbedTask {
        inputs: &inputs,
        head: &head,
        args,
    };
    with_model(
        ui,
        &args.model,
        args.implementation,
        args.require_tier,
        &crate::checkpoint::run_levers(&args.levers, &args.model, args.require_tier)?,
        task,
    )
}

struct EmbedTask<'a> {
    inputs: &'a [Vec<i32>],
    head: &'a EmbeddingHead,
    args: &'a EmbedArgs,
}

impl ModelTask for EmbedTask<'_> {
    type Output = Result<(), String>;

    fn run<M: CausalLm>(self, m: &M) -> Self::Output {
        let embeddings = self
            .inputs
            .iter()
            .map(|ids| embed_one(m, ids, self.head))
            .collect::<Result<Vec<Array>, String>>()?;
        let prompt_tokens = self.inputs.iter().map(Vec::len).sum();
        match self.args.format {
            EmbedFormat::Json => {
                let rows = embeddings
                    .iter()
                    .map(values)
                    .collect::<Result<Vec<_>, String>>()?;
                let name = self
                    .args
                    .model
                    .canonicalize()
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .unwrap_or_else(|| self.args.model.display().to_string());
                let list = EmbeddingList::new(name, rows, prompt_tokens);
                let text = serde_json::to_string(&list)
                    .map_err(|e| format!("cannot write the embeddings as JSON: {e}"))?;
                match &self.args.out {
                    Some(out) => std::fs::write(out, text + "\n")
                        .map_err(|e| format!("cannot write {}: {e}", out.display())),
                    None => {
                        println!("{text}");
                        Ok(())
                    }
                }
            }
            EmbedFormat::Safetensors => {
                let Some(out) = &self.args.out else {
                    return Err(
                        "--format safetensors writes a file: give --out FILE.safetensors".into(),
                    );
                };
                let rows: Vec<&Array> = embeddings.iter().collect();
                let all = mlx(archgen_runtime::mlx_rs::ops::concatenate(&rows, 0))?;
                crate::logits::save_atomically(&[("embeddings", &all)], out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    const MODULES: &str = r#"[
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    ]"#;

    #[test]
    fn the_head_comes_from_sentence_transformers_files_or_the_default() {
        let none = dir_with(&[]);
        let head = EmbeddingHead::read(none.path()).unwrap();
        assert_eq!(
            (head.pooling, head.normalization, head.origin),
            (Pooling::LastToken, Normalization::L2, HeadOrigin::Default)
        );
        let last = r#"{"word_embedding_dimension": 64, "pooling_mode_lasttoken": true,
                       "pooling_mode_mean_tokens": false}"#;
        let st = dir_with(&[("modules.json", MODULES), ("1_Pooling/config.json", last)]);
        let head = EmbeddingHead::read(st.path()).unwrap();
        assert_eq!(
            (head.pooling, head.normalization),
            (Pooling::LastToken, Normalization::L2)
        );
        assert!(head.describe().contains("1_Pooling"), "{}", head.describe());
        // No Normalize module: no normalisation.
        let two: String = MODULES.replace(
            r#",
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}"#,
            "",
        );
        let st = dir_with(&[("modules.json", &two), ("1_Pooling/config.json", last)]);
        let head = EmbeddingHead::read(st.path()).unwrap();
        assert_eq!(head.normalization, Normalization::None);
        // Mean pooling is refused, naming the mode.
        let mean = r#"{"pooling_mode_mean_tokens": true}"#;
        let st = dir_with(&[("modules.json", MODULES), ("1_Pooling/config.json", mean)]);
        let e = EmbeddingHead::read(st.path()).unwrap_err();
        assert!(
            e.contains("pooling_mode_mean_tokens is not implemented"),
            "{e}"
        );
        // A module this runtime does not run is refused, naming it.
        let dense = MODULES.replace("models.Normalize", "models.Dense");
        let st = dir_with(&[("modules.json", &dense), ("1_Pooling/config.json", last)]);
        let e = EmbeddingHead::read(st.path()).unwrap_err();
        assert!(e.contains("sentence_transformers.models.Dense"), "{e}");
    }
}
