"""Where gemma4-12b-tiny-q4's decode leaves mlx-lm on CUDA (docs/parity.md,
"On the GPU"). Runs on the GPU machine through parity.sh (`probe` step).

On one checkpoint made by `archgen init` (4-bit, group 64):
  * repeat: mlx-lm's protocol three times in one process (fresh, again, and
    after holding a few odd-sized arrays, which moves later buffers), and
    the monolith twice: do the bytes depend on anything but the inputs?
  * eval: mlx-lm with lazily loaded weights and only the logits evaluated
    per step (what `archgen logits` does) instead of load_model's eager
    weights and mx.eval of the cache state.
  * modules: checkpoints in which only one kind of module stays quantized
    (the others dequantized with mx.dequantize, as both loaders then see
    plain weights), monolith against mlx-lm on each.
Prints `probe ...` lines.

Usage: q4_probe.py --archgen BIN --repo DIR --model DIR --work DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--archgen", required=True)
    ap.add_argument("--repo", required=True, type=Path)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(a.repo / "tests/python"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    from oracle_logits import load, run_protocol, write
    from parity import compare

    L, N = 24, 4
    ids = [(i * 37 + 11) % 512 for i in range(L)]
    ids_arg = ",".join(map(str, ids))
    a.work.mkdir(parents=True, exist_ok=True)

    t0 = time.time()

    def progress(what: str) -> None:
        # A run under MLX_USE_CUDA_GRAPHS=0 once printed nothing in 200 s:
        # say how far it got.
        print(f"probe progress: {what} done at {time.time() - t0:.0f} s", flush=True)

    def mono(model: Path, out: Path) -> None:
        r = subprocess.run([a.archgen, "logits", "--model", str(model), "--prompt-ids", ids_arg,
                            "--decode-steps", str(N), "--impl", "monolith", "--out", str(out)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(r.stderr)
        progress(f"monolith -> {out.name}")

    def oracle(model: Path, out: Path) -> None:
        t, _ = run_protocol(load(model), ids, N)
        write(out, t, ids, N)
        progress(f"mlx-lm -> {out.name}")

    w = a.work
    mono(a.model, w / "mono1.safetensors")
    mono(a.model, w / "mono2.safetensors")
    oracle(a.model, w / "lm1.safetensors")
    oracle(a.model, w / "lm2.safetensors")
    hold = [mx.zeros((n,), dtype=mx.bfloat16) for n in (7, 13, 333, 1001, 4099)]
    mx.eval(hold)
    oracle(a.model, w / "lm3.safetensors")
    print("probe repeat mono2/mono1", compare(w / "mono2.safetensors", w / "mono1.safetensors"))
    print("probe repeat mlx-lm again/first", compare(w / "lm2.safetensors", w / "lm1.safetensors"))
    print("probe repeat mlx-lm moved buffers/first", compare(w / "lm3.safetensors", w / "lm1.safetensors"))
    print("probe mono/mlx-lm", compare(w / "mono1.safetensors", w / "lm1.safetensors"))

    # As `archgen logits` evaluates: lazy weights, only the logits.
    model, _ = load_model(a.model, lazy=True)
    cache = make_prompt_cache(model)
    logits = model(mx.array(ids, dtype=mx.int32)[None], cache=cache)[0]
    mx.eval(logits)
    last, rows, toks = logits[-1], [], []
    for _ in range(N):
        tok = int(mx.argmax(last, axis=-1).item())
        toks.append(tok)
        out = model(mx.array([[tok]], dtype=mx.int32), cache=cache)[0, -1]
        mx.eval(out)
        rows.append(out)
        last = out
    write(w / "lm_lazy.safetensors", {"prefill_logits": logits, "decode_logits": mx.stack(rows),
                                      "tokens": mx.array(toks, dtype=mx.int32)}, ids, N)
    print("probe eval lazy-mlx-lm/mlx-lm", compare(w / "lm_lazy.safetensors", w / "lm1.safetensors"))
    print("probe eval mono/lazy-mlx-lm", compare(w / "mono1.safetensors", w / "lm_lazy.safetensors"))

    # One kind of module quantized at a time.
    weights = mx.load(str(a.model / "model.safetensors"))
    config = json.loads((a.model / "config.json").read_text())
    q = config["quantization"]
    kinds = sorted({k.rsplit(".", 2)[-2] for k in weights if k.endswith(".scales")})
    print("probe quantized module kinds:", kinds)
    for keep in ["none"] + kinds:
        d = w / f"only-{keep}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        out = {}
        for k, v in weights.items():
            if k.endswith((".scales", ".biases")):
                continue
            base = k[: -len(".weight")] if k.endswith(".weight") else None
            if base and f"{base}.scales" in weights:
                if base.rsplit(".", 1)[-1] == keep:
                    out[k] = v
                    out[f"{base}.scales"] = weights[f"{base}.scales"]
                    out[f"{base}.biases"] = weights[f"{base}.biases"]
                else:
                    out[k] = mx.dequantize(v, weights[f"{base}.scales"], weights[f"{base}.biases"],
                                           group_size=q["group_size"], bits=q["bits"])
            else:
                out[k] = v
        mx.save_safetensors(str(d / "model.safetensors"), out, metadata={"format": "mlx"})
        (d / "config.json").write_text(json.dumps(config))
        mono(d, d / "mono.safetensors")
        oracle(d, d / "lm.safetensors")
        print(f"probe only {keep} quantized: mono/mlx-lm", compare(d / "mono.safetensors", d / "lm.safetensors"),
              flush=True)


if __name__ == "__main__":
    main()
