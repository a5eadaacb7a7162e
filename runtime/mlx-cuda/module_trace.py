"""Which of mlx-lm's modules a CUDA fault happens in.

Every module class in the loaded model gets a `__call__` that prints the
module's name, evaluates and synchronizes its output, and prints the output's
shape: a fault that kills the process (an illegal memory access aborts it)
leaves the module that started last as the last `start` line. Runs a prefill
of the protocol's prompt ids, then decode steps, through mlx-lm's own cache.

  python3 module_trace.py --model DIR [--prompt-len L] [--decode-steps N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

# The oracle's own load path (tests/python/compat.py: mlx-lm 0.32.2's
# quantized experts call gather_qmm with an argument mlx 0.32.2 lacks).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
import compat  # noqa: E402


def trace_calls(model: nn.Module) -> None:
    names = {id(m): name or "<model>" for name, m in model.named_modules()}
    for cls in {type(m) for _, m in model.named_modules()}:
        original = cls.__call__

        def traced(self, *args, _original=original, **kwargs):
            name = names.get(id(self), type(self).__name__)
            print(f"start {name}", flush=True)
            out = _original(self, *args, **kwargs)
            arrays = [a for a in (out if isinstance(out, tuple) else (out,)) if isinstance(a, mx.array)]
            mx.eval(*arrays)
            mx.synchronize()
            print(f"done  {name} {[tuple(a.shape) for a in arrays]}", flush=True)
            return out

        cls.__call__ = traced


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--decode-steps", type=int, default=2)
    a = ap.parse_args()
    compat.apply()
    model, config = load_model(a.model)
    vocab = config.get("text_config", config)["vocab_size"]
    trace_calls(model)
    cache = make_prompt_cache(model)
    ids = mx.array([[(i * 37 + 11) % vocab for i in range(a.prompt_len)]])
    print(f"== prefill {a.prompt_len}", flush=True)
    logits = model(ids, cache=cache)
    for step in range(a.decode_steps):
        token = mx.argmax(logits[:, -1:, :], axis=-1)
        print(f"== decode step {step}", flush=True)
        logits = model(token, cache=cache)
    mx.eval(logits)
    print("== finished without a fault", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
