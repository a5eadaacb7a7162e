"""mlx-lm 0.32.2's embeddings of token-id inputs: the reference `archgen embed
--format safetensors` and POST /v1/embeddings are compared with, byte for
byte.

Usage: embedding_oracle.py MODEL_DIR JOB.json OUT.safetensors

JOB.json:
    {"inputs": [[ids...], ...], "normalize": true}

Each input runs alone: `model.model(ids)` (the trunk and its final norm,
before the LM head; for qwen3 `Qwen3Model.__call__` returns `self.norm(h)`),
then the last token's row (last-token pooling), then, when "normalize" is
true (the default), `x / mx.linalg.norm(x, axis=-1, keepdims=True)`, all in
the model's compute dtype.

Writes:
    embeddings  [N, hidden]  one row per input, in the compute dtype
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_logits import load  # noqa: E402  (compat.apply() inside)


def embed(model, ids: list[int], normalize: bool) -> mx.array:
    hidden = model.model(mx.array([ids], dtype=mx.int32))
    x = hidden[:, -1, :]
    if normalize:
        x = x / mx.linalg.norm(x, axis=-1, keepdims=True)
    return x


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    model_dir, job_file, out = (Path(a) for a in sys.argv[1:])
    job = json.loads(job_file.read_text())
    model = load(model_dir)
    normalize = bool(job.get("normalize", True))
    rows = [embed(model, ids, normalize) for ids in job["inputs"]]
    embeddings = mx.concatenate(rows, axis=0)
    mx.eval(embeddings)
    mx.save_safetensors(str(out), {"embeddings": embeddings})


if __name__ == "__main__":
    main()
