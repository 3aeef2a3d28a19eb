"""``aurora bench codec``: size and speed of the sparse BF16 codec on the reference trace.

Every published step is diffed against the one before and coded by ours
(``aurora_store.codec.sparse``) and by the published baselines; bytes are real payload
bytes, times are the best of a few repetitions in the same run, measured against a bare
``np.flatnonzero(a != b)`` scan of the same arrays. Every decode is checked bit-exact.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from aurora_store.codec import sparse
from aurora_store.codec.base import Encoded
from aurora_store.format import dtypes
from aurora_store.options import positive
from bench.baselines import BASELINES
from bench.output import emit

REPEATS = 3
FULL = (28, 6)
QUICK = (2, 4)
"""(layers, steps) of a full and a ``--quick`` run."""
SUMMARY_FROM = 4
"""The summary averages steps from this one on (Adam's moments have warmed up), or all steps if none."""
TARGETS = {"bytes_per_changed": 1.3, "encode_vs_scan": 2.0, "decode_vs_scan": 1.0, "smaller_than": 2.3}

Arrays = dict[str, np.ndarray]
T = TypeVar("T")


class RoundTripError(AssertionError):
    """A decoder did not reproduce the published arrays bit for bit."""


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


BF16 = dtypes.dtype("BF16")


def scan(old: Arrays, new: Arrays) -> dict[str, np.ndarray]:
    """The floor: find the changed positions of every tensor and nothing else."""
    return {k: np.flatnonzero(a.reshape(-1) != new[k].reshape(-1)) for k, a in old.items()}


def encode(old: Arrays, new: Arrays) -> dict[str, Encoded]:
    """Ours, as a publisher runs it: extract the changed elements of every tensor and code them."""
    out = {}
    for name, a in old.items():
        o, n = a.reshape(-1), new[name].reshape(-1)
        pos = sparse.changed_positions(o, n)
        out[name] = sparse.encode(pos, o[pos], n[pos], BF16.exponent)
    return out


def decode_apply(blocks: dict[str, Encoded], target: Arrays) -> None:
    """Ours, as an actor runs it: decode every block and apply it to flat word arrays in place."""
    for name, b in blocks.items():
        t = target[name]
        got = sparse.decode(b.payload, b.header, BF16.span(t.size), t.take, name)
        assert got.delta is not None
        sparse.apply(t, 0, got.positions, got.delta)


def baseline_bytes(positions: dict[str, np.ndarray], new: Arrays) -> dict[str, int]:
    """Payload bytes of every baseline, each decoded and checked against the changed elements."""
    total = dict.fromkeys((b.name for b in BASELINES), 0)
    for name, pos in positions.items():
        values = new[name].reshape(-1)[pos]
        for b in BASELINES:
            payload = b.encode(pos, values)
            got_pos, got_val = b.decode(payload, pos.size)
            if not (np.array_equal(got_pos, pos) and np.array_equal(got_val, values)):
                raise RoundTripError(f"{b.name} does not round-trip {name}")
            total[b.name] += len(payload)
    return total


def peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def measure_step(
    step: int, old: Arrays, new: Arrays, repeats: int = REPEATS, tick: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """Sizes, times and exactness of one step's delta ``old -> new``."""
    target = {k: np.empty(a.size, a.dtype) for k, a in old.items()}
    t_scan, t_enc, t_dec = float("inf"), float("inf"), float("inf")
    positions: dict[str, np.ndarray] = {}
    blocks: dict[str, Encoded] = {}
    for _ in range(repeats):  # interleaved, so drift in machine speed hits all three alike
        t, positions = _timed(partial(scan, old, new))
        t_scan = min(t_scan, t)
        t, blocks = _timed(partial(encode, old, new))
        t_enc = min(t_enc, t)
        for k, a in old.items():  # a fresh copy of the old version, outside the timer
            np.copyto(target[k], a.reshape(-1))
        t, _ = _timed(partial(decode_apply, blocks, target))
        t_dec = min(t_dec, t)
        for k, n in new.items():
            if not np.array_equal(target[k], n.reshape(-1)):
                raise RoundTripError(f"step {step}: ours does not reproduce {k} bit for bit")
        tick()
    target.clear()  # free the copy before the baselines run
    elements = sum(a.size for a in new.values())
    changed = sum(b.header.count for b in blocks.values())
    if changed != sum(p.size for p in positions.values()):
        raise RoundTripError(f"step {step}: ours coded {changed} changes, the scan found another count")
    size = {
        "ours": sum(len(b.payload) for b in blocks.values()),
        **baseline_bytes(positions, new),
        "dense": 2 * elements,
    }
    streams = [sum(b.header.streams[i] for b in blocks.values()) for i in range(4)]
    streams = [streams[0], streams[1] + streams[2], streams[3]]
    tick()

    def per(x: float) -> float | None:
        return x / changed if changed else None

    return {
        "step": step,
        "elements": elements,
        "changed": changed,
        "density": changed / elements,
        "bytes": size,
        "bytes_per_changed": {k: per(v) for k, v in size.items()},
        "ours_streams_per_changed": {k: per(v) for k, v in zip(("gaps", "symbols", "escapes"), streams, strict=True)},
        "escapes": sum(b.header.escapes for b in blocks.values()),
        "smaller_than": {b.name: size[b.name] / size["ours"] for b in BASELINES},
        "seconds": {"scan": t_scan, "encode": t_enc, "decode": t_dec},
        "time_ratio": {"encode_vs_scan": t_enc / t_scan, "decode_vs_scan": t_dec / t_scan},
        "peak_rss_mb": peak_rss_mb(),
    }


def _mean(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def summarize(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over steps >= SUMMARY_FROM (all steps if there are none), and the targets met."""
    use = [s for s in steps if s["step"] >= SUMMARY_FROM] or steps
    out: dict[str, Any] = {"over_steps": [s["step"] for s in use], "density": _mean(s["density"] for s in use)}
    for key in ("bytes_per_changed", "smaller_than", "time_ratio", "seconds"):
        out[key] = {k: _mean(s[key][k] for s in use) for k in use[0][key]} if use else {}
    out["peak_rss_mb"] = max((s["peak_rss_mb"] for s in steps), default=None)

    def ok(value: float | None, limit: float, below: bool = True) -> bool:
        return value is not None and (value <= limit if below else value >= limit)

    smaller = min(out["smaller_than"].values(), default=None)
    out["targets"] = {
        "bytes_per_changed_le_1.3": ok(out["bytes_per_changed"].get("ours"), TARGETS["bytes_per_changed"]),
        "encode_vs_scan_le_2.0": ok(out["time_ratio"].get("encode_vs_scan"), TARGETS["encode_vs_scan"]),
        "decode_vs_scan_le_1.0": ok(out["time_ratio"].get("decode_vs_scan"), TARGETS["decode_vs_scan"]),
        "smaller_than_both_baselines_ge_2.3x": ok(smaller, TARGETS["smaller_than"], below=False),
    }
    return out


def measure(
    layers: int, steps: int, seed: int, vocab: int | None = None, progress: bool = False, repeats: int = REPEATS
) -> dict[str, Any]:
    """Run the whole benchmark in-process and return its JSON-ready result."""
    from bench import trace  # torch loads here, not when the CLI parses its arguments

    shape = trace.Shape(layers=layers, vocab=trace.QWEN3_0_6B.vocab if vocab is None else vocab)
    full = shape == trace.QWEN3_0_6B
    console = Console(stderr=True)
    results: list[dict[str, Any]] = []
    with Progress(console=console, disable=not (progress and console.is_terminal), transient=True) as bar:
        made = bar.add_task("trace: init + Adam + BF16", total=steps + 1)
        coded = bar.add_task("codec: scan/encode/decode", total=steps * (repeats + 1))
        prev: Arrays | None = None
        for step, bits in trace.steps(layers, steps, seed, vocab=shape.vocab):
            bar.advance(made)
            if prev is not None:
                results.append(measure_step(step, prev, bits, repeats, tick=lambda: bar.advance(coded)))
            prev = bits
    return {
        "bench": "codec",
        "model": "Qwen3-0.6B" if full else f"Qwen3-0.6B-shaped ({layers} layers, vocab {shape.vocab})",
        "layers": layers,
        "vocab": shape.vocab,
        "params": trace.parameter_count(layers, shape.vocab),
        "seed": seed,
        "trace": {
            "init_std": trace.INIT_STD,
            "grad_std": trace.GRAD_STD,
            "optimizer": {"name": "Adam", "lr": trace.LR, "betas": list(trace.BETAS), "eps": trace.EPS},
            "publish": "BF16 round-to-nearest-even",
        },
        "repeats": repeats,
        "steps": results,
        "summary": summarize(results),
    }


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render(result: dict[str, Any], console: Console) -> None:
    """The human table: one row per step, then the summary and its targets."""
    short = {"ours": "ours", "aurora_leb128": "leb128", "pulse_zstd1": "pulse", "dense": "dense"}
    baselines = [b.name for b in BASELINES]
    summary = result["summary"]
    table = Table(
        title=f"codec: {result['model']}, {result['params']:,} params",
        caption=f"B/chg: payload bytes per changed element; x: times smaller than ours; "
        f"times best of {result['repeats']}; mean over steps {summary['over_steps']}",
    )
    for col in ("step", "density", *(f"B/chg {v}" for v in short.values()), *(f"x {short[n]}" for n in baselines)):
        table.add_column(col, justify="right")
    for col in ("scan s", "enc/scan", "dec/scan", "RSS MB"):
        table.add_column(col, justify="right")
    rows = [(str(s["step"]), s) for s in result["steps"]]
    if rows:
        rows.append(("mean", summary))
    for i, (label, s) in enumerate(rows):
        table.add_row(
            label,
            _fmt(s["density"], ".3%"),
            *(_fmt(s["bytes_per_changed"][n], ".3f") for n in short),
            *(_fmt(s["smaller_than"][n], ".2f") for n in baselines),
            _fmt(s["seconds"]["scan"], ".3f"),
            _fmt(s["time_ratio"]["encode_vs_scan"], ".2f"),
            _fmt(s["time_ratio"]["decode_vs_scan"], ".2f"),
            _fmt(s["peak_rss_mb"], ".0f"),
            end_section=i == len(rows) - 2,
        )
    console.print(table)
    for name, met in summary["targets"].items():
        console.print(f"  {'[green]met[/]' if met else '[red]missed[/]'}  {name}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK[0]} layers, {QUICK[1]} steps")
    parser.add_argument("--layers", type=positive, help=f"decoder layers (default {FULL[0]}, {QUICK[0]} with --quick)")
    parser.add_argument("--steps", type=positive, help=f"optimizer steps (default {FULL[1]}, {QUICK[1]} with --quick)")
    parser.add_argument("--vocab", type=positive, help="embedding rows (default 151936, Qwen3's)")
    parser.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")


def run(args: argparse.Namespace) -> int:
    layers, steps = QUICK if args.quick else FULL
    result = measure(
        args.layers if args.layers is not None else layers,
        args.steps if args.steps is not None else steps,
        args.seed,
        vocab=args.vocab,
        progress=True,
    )
    return emit(result, args, lambda r: render(r, Console()))
