"""Words at a version held as host arrays: the numpy implementation of :class:`~aurora_store.codec.base.Words`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from aurora_store.codec import classes
from aurora_store.codec.base import BlockWords, Lookup, Overlay


def locate(words: np.ndarray, lookup: Lookup, over: Overlay | None = None) -> Overlay:
    """The classed lookup over a host range ``words`` with ``over`` laid over it (on a copy)."""
    if over is not None and over[0].size:
        words = words.copy()
        words[over[0]] = over[1]
    return classes.locate(words, lookup)


@dataclass(frozen=True, slots=True)
class HostWords:
    """Flat little-endian word arrays by tensor name."""

    arrays: Mapping[str, np.ndarray]

    def at(self, name: str, index: np.ndarray) -> np.ndarray:
        return self.arrays[name][index]

    def locate(self, name: str, lo: int, hi: int, lookup: Lookup, over: Overlay | None = None) -> Overlay:
        return locate(self.arrays[name][lo:hi], lookup, over)


def block_of(words: np.ndarray) -> BlockWords:
    """A block's parent words given as one flat array holding exactly its range (tests, benchmarks)."""
    return BlockWords(HostWords({"": words}), "", 0, words.size)
