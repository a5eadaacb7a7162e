"""Sanity checks of the oracle case set itself (not of the Rust side).

  selfcheck.py --cases-dir DIR     (DIR built by run_oracle.py --cases-out DIR)

Checks: oracle shapes/dtypes; finite, non-constant logits; greedy chain
consistency; cases differ; rotating caches really wrapped; the SwitchGLU sort
path runs in some prefill; quantized configs carry the router.proj override
and reload in mlx-lm with the expected module types; and a second build of
one case in fresh processes (the CLI scripts) is byte-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cases import CASES_BY_NAME  # noqa: E402
from oracle_logits import load, read_kv_config, run_protocol  # noqa: E402
from mlx_lm.models import switch_layers  # noqa: E402
from mlx_lm.models.cache import RotatingKVCache  # noqa: E402
from mlx_lm.models.switch_layers import QuantizedSwitchLinear  # noqa: E402

DT = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
FAIL: list[str] = []


def check(ok: bool, msg: str) -> None:
    if not ok:
        FAIL.append(msg)
        print("FAIL", msg)


def tensor_digest(path: Path) -> str:
    h = hashlib.sha256()
    for k, v in sorted(mx.load(str(path)).items()):
        h.update(k.encode() + str(v.dtype).encode() + str(v.shape).encode())
        h.update(bytes(memoryview(v.view(mx.uint8) if v.size else v)))
    return h.hexdigest()


# Count SwitchGLU sorts (indices.size >= 64) per phase.
SORTS = {"n": 0}
_orig_sort = switch_layers._gather_sort


def _counting_sort(x, indices):
    SORTS["n"] += 1
    return _orig_sort(x, indices)


switch_layers._gather_sort = _counting_sort


def check_case(d: Path) -> str:
    cj = json.loads((d / "case.json").read_text())
    name, L, N = cj["name"], len(cj["prompt_ids"]), cj["decode_steps"]
    o = mx.load(str(d / "oracle.safetensors"))
    pre, dec, tok = o["prefill_logits"], o["decode_logits"], o["tokens"]
    cfg = json.loads((d / "model" / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    V = text["vocab_size"]
    check(pre.shape == (L, V) and dec.shape == (N, V) and tok.shape == (N,),
          f"{name}: shapes {pre.shape} {dec.shape} {tok.shape}")
    check(pre.dtype == DT[cj["dtype"]] and dec.dtype == pre.dtype and tok.dtype == mx.int32,
          f"{name}: dtypes {pre.dtype} {dec.dtype} {tok.dtype}")
    allr = np.concatenate([np.array(pre.astype(mx.float32)), np.array(dec.astype(mx.float32))])
    check(bool(np.isfinite(allr).all()), f"{name}: non-finite logits")
    check(bool((allr.std(axis=1) > 0.1).all()), f"{name}: (near-)constant logit row")
    if len(allr) > 1:
        check(len({r.tobytes() for r in allr}) == len(allr), f"{name}: repeated logit rows")
    # Greedy chain: token i = argmax of the previous row (mx.argmax semantics).
    prev = mx.concatenate([pre[-1:], dec[:-1]]) if N else pre[:0]
    check(N == 0 or mx.array_equal(mx.argmax(prev, axis=-1).astype(mx.int32), tok).item(),
          f"{name}: tokens are not the greedy chain")

    # Re-run live with instrumentation (same process, same bits expected).
    model = load(d / "model")
    kv = read_kv_config(d / "model")  # QuantizedKVCache layers, as the runner used
    check((kv is None) == (cj.get("kv_quantization") is None)
          and (kv is None or cj.get("kv_quant_changes_logits") is True),
          f"{name}: kv_config.json / case.json kv_quantization disagree")
    SORTS["n"] = 0
    t, cache = run_protocol(model, cj["prompt_ids"], 0, kv)
    pre_sorts = SORTS["n"]
    check(bytes(memoryview(t["prefill_logits"].view(mx.uint8))) ==
          bytes(memoryview(pre.view(mx.uint8))), f"{name}: live prefill differs from file")
    rot_after_prefill = [c.offset for c in cache if isinstance(c, RotatingKVCache)]
    SORTS["n"] = 0
    t, cache = run_protocol(model, cj["prompt_ids"], N, kv)
    dec_sorts = SORTS["n"] - pre_sorts
    W = text["sliding_window"]
    rot = [c for c in cache if isinstance(c, RotatingKVCache)]
    prefill_wrap = L > W
    decode_wrap = bool(rot) and rot[0].offset > W and not prefill_wrap
    check(all(c.max_size == W for c in rot), f"{name}: rotating cache size != window")

    # Quantization: config + reloaded module types.
    q = cfg.get("quantization")
    qinfo = "-"
    if cj["quantization"]:
        check(q is not None and cfg.get("quantization_config") == q,
              f"{name}: quantization / quantization_config missing or different")
        check(q["bits"] == cj["quantization"]["bits"] and
              q["group_size"] == cj["quantization"]["group_size"], f"{name}: q defaults")
        routers = {k: v for k, v in q.items() if k.endswith("router.proj")}
        if text["enable_moe_block"]:
            check(len(routers) == text["num_hidden_layers"] and
                  all(v == {"group_size": 64, "bits": 8} for v in routers.values()),
                  f"{name}: router.proj overrides {routers}")
        mods = dict(model.named_modules())
        for k, m in mods.items():
            if k.endswith("router.proj"):
                check(isinstance(m, nn.QuantizedLinear) and m.bits == 8 and m.group_size == 64,
                      f"{name}: {k} not 8-bit g64")
        nq = sum(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding,
                                QuantizedSwitchLinear)) for m in mods.values())
        nplain = sum(type(m) in (nn.Linear, nn.Embedding, switch_layers.SwitchLinear)
                     for m in mods.values())
        qinfo = f"{nq} quantized / {nplain} plain, {len(routers)} router overrides"
    else:
        check(q is None, f"{name}: unexpected quantization dict")

    mag = float(np.abs(allr).max())
    return (f"{name:24s} L={L:2d} N={N:2d} |logit|max={mag:6.2f} std={allr.std():5.2f} "
            f"wrap:prefill={prefill_wrap!s:5} decode={decode_wrap!s:5} "
            f"rot_off={rot_after_prefill[:1]}->{rot[0].offset if rot else '-'} "
            f"sorts:prefill={pre_sorts} decode={dec_sorts} q:{qinfo}")


def determinism(root: Path, name: str) -> None:
    """Rebuild one case through the two CLI scripts in fresh processes."""
    c = CASES_BY_NAME[name]
    with tempfile.TemporaryDirectory() as tmp:
        cfgp, out, orc = Path(tmp) / "c.json", Path(tmp) / "m", Path(tmp) / "o.safetensors"
        cfgp.write_text(json.dumps(c.config))
        cmd = [sys.executable, str(HERE / "make_checkpoint.py"), "--config", str(cfgp),
               "--out", str(out), "--seed", str(c.seed), "--dtype", c.dtype,
               "--shards", str(c.shards)]
        if c.bits:
            cmd += ["--quantize", str(c.bits), "--group-size", str(c.group_size)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([sys.executable, str(HERE / "oracle_logits.py"), "--model", str(out),
                        "--prompt-ids", ",".join(map(str, c.prompt_ids)),
                        "--decode-steps", str(c.decode_steps), "--out", str(orc)], check=True)
        ref = root / name / "model"
        for f in sorted(ref.iterdir()):
            check((out / f.name).read_bytes() == f.read_bytes(),
                  f"determinism {name}: {f.name} differs")
        check(tensor_digest(orc) == tensor_digest(root / name / "oracle.safetensors"),
              f"determinism {name}: oracle tensors differ")
        print(f"determinism {name}: checkpoint files and oracle tensors identical")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases-dir", required=True, type=Path)
    p.add_argument("--determinism", default="e2b-tiny-q4,26b-a4b-tiny-q4")
    a = p.parse_args()
    names = json.loads((a.cases_dir / "index.json").read_text())["cases"]
    for n in names:
        print(check_case(a.cases_dir / n))
    digests = [tensor_digest(a.cases_dir / n / "oracle.safetensors") for n in names]
    check(len(set(digests)) == len(digests), "two cases have identical oracle tensors")
    for n in filter(None, a.determinism.split(",")):
        if n in names:
            determinism(a.cases_dir, n)
    print("OK" if not FAIL else f"{len(FAIL)} FAILURES")
    sys.exit(1 if FAIL else 0)


if __name__ == "__main__":
    main()
