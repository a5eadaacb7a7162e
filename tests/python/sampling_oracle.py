"""mlx-lm 0.32.2's seeded sampling of one prompt: `generate_step` with
`make_sampler` and `make_logits_processors`, after `mx.random.seed(seed)`
(what `mlx_lm.generate` and a seeded `mlx_lm.server` request run). The
reference `archgen generate --seed` is compared with, token for token.

Usage: sampling_oracle.py MODEL_DIR JOB.json

JOB.json:
    {"prompt": [ids...], "max_tokens": N,
     "cases": [{"seed": 7, "temp": 0.8, "top_p": 1.0, "min_p": 0.0,
                "min_tokens_to_keep": 1, "top_k": 0,
                "logit_bias": {"17": 3.0} | null,
                "repetition_penalty": null | F, "repetition_context_size": 20,
                "presence_penalty": null | F, "presence_context_size": 20,
                "frequency_penalty": null | F, "frequency_context_size": 20},
               ...]}
Missing keys take make_sampler's and make_logits_processors's defaults
(except top_p, whose default here is 1.0, archgen's: both mean no top-p).

Prints {"tokens": [[ids of case 0], [ids of case 1], ...]}: N tokens each
(generate_step does not stop at EOS).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_logits import load  # noqa: E402  (compat.apply() inside)

from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.sample_utils import make_logits_processors, make_sampler  # noqa: E402


def run_case(model, prompt: list[int], max_tokens: int, case: dict) -> list[int]:
    sampler = make_sampler(
        temp=float(case.get("temp", 0.0)),
        top_p=float(case.get("top_p", 1.0)),
        min_p=float(case.get("min_p", 0.0)),
        min_tokens_to_keep=int(case.get("min_tokens_to_keep", 1)),
        top_k=int(case.get("top_k", 0)),
    )
    bias = case.get("logit_bias")
    processors = make_logits_processors(
        logit_bias={int(k): float(v) for k, v in bias.items()} if bias else None,
        repetition_penalty=case.get("repetition_penalty"),
        repetition_context_size=int(case.get("repetition_context_size", 20)),
        presence_penalty=case.get("presence_penalty"),
        presence_context_size=int(case.get("presence_context_size", 20)),
        frequency_penalty=case.get("frequency_penalty"),
        frequency_context_size=int(case.get("frequency_context_size", 20)),
    )
    # The seed goes last, right before the generation draws from it.
    mx.random.seed(int(case["seed"]))
    steps = generate_step(
        mx.array(prompt, dtype=mx.int32),
        model,
        max_tokens=max_tokens,
        sampler=sampler,
        logits_processors=processors,
    )
    tokens = [int(token) for token, _ in steps]
    if len(tokens) != max_tokens:
        raise SystemExit(f"sampling_oracle.py: {len(tokens)} tokens, asked for {max_tokens}")
    return tokens


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    model_dir, job_path = map(Path, sys.argv[1:])
    job = json.loads(job_path.read_text())
    model = load(model_dir)
    tokens = [
        run_case(model, job["prompt"], int(job["max_tokens"]), case) for case in job["cases"]
    ]
    print(json.dumps({"tokens": tokens}))


if __name__ == "__main__":
    main()
