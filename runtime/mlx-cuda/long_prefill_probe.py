"""Where a long prompt's time to first token goes in `archgen serve` on the
GPU, against `mlx_lm.server`: the question left by the second H200 serve run
(docs/benchmarks.md), where archgen's 12k-token prompt took 9.0 s to its
first token after the load levels, against 1.7 s on the first machine and
mlx-lm's 2.3 s.

usage: long_prefill_probe.py --archgen BIN --model DIR --out DIR [--tokens 12000]

For each server configuration in turn (archgen as served, archgen with
ARCHGEN_EAGER_DECODE=1, i.e. without the compiled one-token blocks, and
mlx_lm.server), on a fresh server:
  cold     a 12k-token prompt, alone, first request after a 4-token warm-up
  warm     another 12k-token prompt (other words: no prompt-cache hit)
  levels   16 then 64 concurrent short chats (the shapes a serve run makes)
  after    a third 12k-token prompt, alone
  probe    a fourth, with a short request sent 1 s after it (the serve
           benchmark's probe, where the 9-10 s first tokens were seen)
  again    a fifth, alone
Each 12k request records its time to first token and total, and the GPU
memory in use after it (nvidia-smi). Writes OUT/long_prefill.json and each
server's log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests/python"))

import serve_bench as sb  # noqa: E402


def gpu_memory_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def long_request(port: int, text: str, timeout: float) -> dict:
    r = sb.chat(port, text, 4, timeout)
    return {
        "ok": r.ok,
        "error": r.error,
        "ttft_s": (r.chunk_times[0] - r.start) if r.chunk_times else None,
        "total_s": (r.end - r.start) if r.end else None,
        "gpu_mib": gpu_memory_mib(),
    }


def with_probe(port: int, text: str, timeout: float, delay: float = 1.0) -> dict:
    """The serve benchmark's probe: the long prompt, and `delay` seconds
    later a short request, which joins while the long one is in prefill."""
    box: dict = {}
    thread, _ = sb.in_background(lambda: box.setdefault("long", long_request(port, text, timeout)))
    time.sleep(delay)
    r = sb.chat(port, sb.SHORT, 24, timeout)
    thread.join(timeout + 5)
    return {"long": box.get("long"), "short_s": (r.end - r.start) if r.ok else None, "short_error": r.error}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archgen", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=12_000)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--configs", nargs="+", default=["archgen", "archgen-eager", "mlx-lm"],
                    choices=["archgen", "archgen-eager", "mlx-lm"])
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    # Three prompts of the same length that share no prefix past the chat
    # template's first tokens, so none is served from the prompt cache.
    base = sb.long_text(tokenizer, args.tokens)
    words = base.split()
    prompts = [" ".join(words[k:] + words[:k]) for k in (0, 7, 13, 17, 19)]

    results = {}
    for name in args.configs:
        port = sb.free_port()
        env = dict(os.environ)
        if name.startswith("archgen"):
            argv = [args.archgen, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
                    "--max-batch", "32", "--prefill-step", "2048"]
            if name == "archgen-eager":
                env["ARCHGEN_EAGER_DECODE"] = "1"
        else:
            argv = [sb.PYTHON, "-m", "mlx_lm.server", "--model", args.model, "--host", "127.0.0.1",
                    "--port", str(port), "--prefill-step-size", "2048"]
        t = time.perf_counter()
        server = sb.Server(name, argv, port, out_dir / f"{name}.log", env)
        row: dict = {"start_s": time.perf_counter() - t, "gpu_mib_idle": gpu_memory_mib()}
        try:
            sb.chat(port, sb.SHORT, 4, args.timeout)
            row["cold"] = long_request(port, prompts[0], args.timeout)
            print(f"{name}: cold {row['cold']}", file=sys.stderr)
            row["warm"] = long_request(port, prompts[1], args.timeout)
            print(f"{name}: warm {row['warm']}", file=sys.stderr)
            row["levels"] = []
            for clients in (16, 64):
                level = sb.load_level(port, clients, clients, 16, args.timeout, 30)
                row["levels"].append({"clients": clients, "tokens_per_s": level["tokens_per_s"],
                                      "failed": level["failed"], "gpu_mib": gpu_memory_mib()})
                print(f"{name}: {clients} clients {level['tokens_per_s']:.1f} tok/s", file=sys.stderr)
            row["after"] = long_request(port, prompts[2], args.timeout)
            print(f"{name}: after levels {row['after']}", file=sys.stderr)
            row["with_probe"] = with_probe(port, prompts[3], args.timeout)
            print(f"{name}: with a short request 1 s in {row['with_probe']}", file=sys.stderr)
            row["alone_again"] = long_request(port, prompts[4], args.timeout)
            print(f"{name}: alone again {row['alone_again']}", file=sys.stderr)
        finally:
            server.close()
        results[name] = row
    (out_dir / "long_prefill.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
