"""mlx-lm 0.32.2's side of one GPU parity case, in one fresh process
(runtime/mlx-cuda/gpu_parity.py runs it, twice where archgen differs, to tell
archgen's differences from mlx-lm's own run-to-run ones).

Usage: gpu_oracle.py MODEL_DIR OUT_DIR L N [SCHEDULE.json ...]

Writes OUT_DIR/single.safetensors (the `archgen logits` protocol of
docs/parity.md §2 over the prompt ids (i*37+11) % vocab, i < L, then N greedy
steps: tests/python/oracle_logits.py) and, per schedule, OUT_DIR/batch-NAME
.safetensors (mlx-lm's BatchGenerator over the schedule:
tests/python/batch_oracle.py; NAME is the schedule file's stem). A part that
raises writes OUT_DIR/NAME.error with the exception instead, and the others
still run. The one-sequence protocol runs twice in this process; the second
run goes to OUT_DIR/single-again.safetensors (mlx-lm's CUDA results for
4-bit Gemma-4 have differed within one process: docs/parity.md, "On the GPU").

A Gemma-2 checkpoint with grouped K/V heads batches through mlx-lm's own
attention with the batch mask's missing repeats axis added
(tests/python/batch_oracle.py --gemma2-mask-each-row): mlx-lm's unchanged
module raises a broadcast error there, and archgen masks each row the same
way (docs/parity.md, "Batches", Gemma-2).
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent.parent / "tests/python"))

import mlx.core as mx  # noqa: E402
from batch_oracle import mask_gemma2_batches_each_row, run_schedule  # noqa: E402
from oracle_logits import load, read_kv_config, run_protocol, write  # noqa: E402


def main() -> None:
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    L, N = int(sys.argv[3]), int(sys.argv[4])
    schedules = [Path(p) for p in sys.argv[5:]]
    out.mkdir(parents=True, exist_ok=True)
    model = load(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]
    ids = [(i * 37 + 11) % vocab for i in range(L)]
    for name in ("single", "single-again"):
        try:
            tensors, _ = run_protocol(model, ids, N, read_kv_config(model_dir))
            write(out / f"{name}.safetensors", tensors, ids, N)
        except Exception:  # one part must not hide the others
            (out / f"{name}.error").write_text(traceback.format_exc()[-2000:])
        mx.clear_cache()
    text = config.get("text_config", config)
    if config.get("model_type") == "gemma2" and \
            text["num_key_value_heads"] < text["num_attention_heads"]:
        mask_gemma2_batches_each_row()
    for path in schedules:
        name = f"batch-{path.stem}"
        try:
            tensors = run_schedule(model, json.loads(path.read_text()))
            mx.save_safetensors(str(out / f"{name}.safetensors"), tensors)
        except BaseException as e:  # batch_oracle raises SystemExit on a bad schedule
            if isinstance(e, KeyboardInterrupt):
                raise
            (out / f"{name}.error").write_text(traceback.format_exc()[-2000:])
        mx.clear_cache()


if __name__ == "__main__":
    main()
