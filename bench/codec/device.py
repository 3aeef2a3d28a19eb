"""``aurora bench codec --device cpu|cuda``: extraction and apply where the weights live.

Every step of the reference trace is moved to the device once (outside the timers); then, on the
same tensors, best of a few repetitions:

- ``bare``: ``torch.nonzero(old != new)``, the floor (it finds the positions and nothing else);
- ``extract``: what a device publisher needs for the sparse coding, the changed positions and both
  words gathered, on the host (:func:`aurora_store.device.changed`);
- ``extract_classed``: that plus every change's class rank (:func:`aurora_store.device.extract`);
- ``lookup``: a classed decode's (class, rank) -> position lookup (:func:`aurora_store.device.locate`);
- ``stage``: staged positions and words copied to the device (``TensorWeights.prepare``, while
  generating) and ``apply``: their scatter into the live tensors at the safe point (``commit``).

Throughput ratios are ``bare`` time over each one's: the issue's target is at least 0.5 for
extraction and apply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from actor.live import TensorWeights
from aurora_store import device
from aurora_store.codec.base import Lookup
from aurora_store.format import dtypes

BF16 = dtypes.dtype("BF16").exponent
TARGET = 0.5


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _best(fn: Callable[[], Any], dev: torch.device, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    return best


def measure_step(
    step: int, old: dict[str, np.ndarray], new: dict[str, np.ndarray], dev: torch.device, repeats: int
) -> dict[str, Any]:
    to = {k: torch.from_numpy(a.reshape(-1).view(np.int16).copy()).to(dev) for k, a in old.items()}
    tn = {k: torch.from_numpy(a.reshape(-1).view(np.int16).copy()).to(dev) for k, a in new.items()}
    lookups = {}
    changes = {}
    for k in to:
        ex = device.extract(to[k], tn[k], BF16)
        order = np.argsort(ex.classes, kind="stable")
        present, counts = np.unique(ex.classes, return_counts=True)
        lookups[k] = (present, counts, ex.ranks[order])
        changes[k] = (ex.positions, ex.new)
        if not np.array_equal(ex.positions, np.flatnonzero(old[k].reshape(-1) != new[k].reshape(-1))):
            raise AssertionError(f"step {step}: device extraction of {k} differs from the host's")
    live = TensorWeights({k: v.clone() for k, v in to.items()})

    def bare() -> None:
        for k in to:
            torch.nonzero(to[k] != tn[k])

    def extract() -> None:
        for k in to:
            pos, was, now = device.changed(to[k], tn[k])
            pos.cpu(), was.cpu(), now.cpu()

    def extract_classed() -> None:
        for k in to:
            device.extract(to[k], tn[k], BF16)

    def lookup() -> None:
        for k in to:
            present, counts, ranks = lookups[k]
            device.locate(to[k], Lookup(BF16, present, counts, ranks, k))

    prepared: list[Any] = []

    def stage() -> None:
        prepared[:] = [live.prepare(changes)]

    def apply() -> None:
        live.commit(prepared[0])

    seconds = {}
    for name, fn in (("bare", bare), ("extract", extract), ("extract_classed", extract_classed), ("lookup", lookup)):
        fn()  # warm: allocator, kernels
        seconds[name] = _best(fn, dev, repeats)
    stage()
    seconds["stage"] = _best(stage, dev, repeats)
    seconds["apply"] = _best(apply, dev, repeats)
    for k, t in live.tensors.items():
        if not torch.equal(t, tn[k]):
            raise AssertionError(f"step {step}: the device apply does not reproduce {k}")
    elements = sum(t.numel() for t in to.values())
    changed = sum(p.size for p, _ in changes.values())
    return {
        "step": step,
        "elements": elements,
        "changed": changed,
        "seconds": seconds,
        "elements_per_s": {k: elements / v for k, v in seconds.items()},
        "vs_bare": {k: seconds["bare"] / v for k, v in seconds.items() if k != "bare"},
    }


def measure(layers: int, steps: int, seed: int, vocab: int | None, dev_name: str, repeats: int) -> dict[str, Any]:
    from bench.codec import trace

    dev = torch.device(dev_name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    results = []
    prev = None
    for step, bits in trace.steps(layers, steps, seed, vocab=vocab):
        if prev is not None:
            results.append(measure_step(step, prev, bits, dev, repeats))
        prev = bits
    use = [s for s in results if s["step"] >= 4] or results
    mean = {k: float(np.mean([s["vs_bare"][k] for s in use])) for k in use[0]["vs_bare"]} if use else {}
    return {
        "bench": "codec",
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "layers": layers,
        "vocab": vocab,
        "repeats": repeats,
        "steps": results,
        "summary": {
            "over_steps": [s["step"] for s in use],
            "vs_bare": mean,
            "targets": {
                "extract_ge_0.5_of_bare": mean.get("extract", 0.0) >= TARGET,
                "apply_ge_0.5_of_bare": mean.get("apply", 0.0) >= TARGET,
                "extract_classed_ge_0.5_of_bare": mean.get("extract_classed", 0.0) >= TARGET,
            },
        },
    }
