"""The benchmarks' workload: a Qwen3-shaped trace's BF16 bits at version 0 and each later version's changes.

Built once per run from ``bench.codec.trace`` (the optimizer is gone when it returns); one copy of the model,
moved forward and back in place, so a benchmark never holds two.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np

from aurora_store.format.manifest import TensorSpec


@dataclass(slots=True)
class Workload:
    """The trace's bits at version 0, and for each later version the elements that changed.

    One copy of the model: `versions` moves it forward in place and back when the iteration ends."""

    specs: tuple[TensorSpec, ...]
    words: dict[str, np.ndarray]
    """Flat BF16 words of version 0 (of a later version while `versions` is being iterated)."""
    diffs: list[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]
    """Per version from 1 on: name -> (flat positions, old words, new words)."""
    steps: list[int]
    """Trace step of each version."""

    @property
    def full_bytes(self) -> int:
        return sum(a.nbytes for a in self.words.values())

    def versions(self) -> Generator[tuple[int, dict[str, np.ndarray]], None, None]:
        """``(version, words)`` from 0 on; ``words`` is `words`, moved forward in place (publish a version
        before taking the next), and back to version 0 when the iterator is closed. One at a time."""
        done = 0
        try:
            yield 0, self.words
            for diff in self.diffs:
                for name, (pos, _, new) in diff.items():
                    self.words[name][pos] = new
                done += 1
                yield done, self.words
        finally:
            for diff in reversed(self.diffs[:done]):
                for name, (pos, old, _) in diff.items():
                    self.words[name][pos] = old


def make_workload(
    layers: int, vocab: int | None, seed: int, first_step: int, versions: int, tick: Callable[[], None]
) -> Workload:
    """Run the trace, keeping only BF16 bits (the optimizer is gone when this returns)."""
    from bench.codec import trace  # torch loads here, not when the CLI parses its arguments

    base: dict[str, np.ndarray] = {}
    prev: dict[str, np.ndarray] = {}
    specs: tuple[TensorSpec, ...] = ()
    diffs: list[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
    for step, bits in trace.steps(layers, first_step + versions, seed, vocab=vocab):
        tick()
        flat = {k: a.reshape(-1) for k, a in bits.items()}
        if step == first_step:
            base = flat
            specs = tuple(sorted((TensorSpec(k, "BF16", a.shape) for k, a in bits.items()), key=lambda s: s.name))
        elif step > first_step:
            diff = {}
            for k, a in flat.items():
                pos = np.flatnonzero(prev[k] != a)
                if pos.size:
                    diff[k] = (pos, prev[k][pos], a[pos])
            diffs.append(diff)
        prev = flat
    return Workload(specs, base, diffs, list(range(first_step, first_step + versions + 1)))
