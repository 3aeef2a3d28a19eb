"""Class ranks kept across versions: a classed block's lookup at O(changed), not O(elements).

:func:`aurora_store.codec.classes.locate` turns a classed block's (class, rank) pairs into positions by
walking every parent word of the block's range: per version, a pass over the whole model however few
elements changed. A reader that holds the same weights version after version can keep what that walk
computes instead. A :class:`RankIndex` of one flat word array cuts it into chunks of :data:`CHUNK`
elements and holds, per chunk, its offsets sorted by class (2 bytes an element) and where each class's
run starts (``2 * (2^E + 1)`` bytes a chunk: 0.13 bytes an element for BF16). A lookup then reads no
element: per class it finds the chunk of each rank by one pointer over the chunks' class counts and
reads the offset there (O(chunks x classes + ranks); the chunks are 4096 times fewer than the
elements). When a version is applied, only the elements whose exponent changed (about one change in
128 for BF16) move between the runs of their chunk (:meth:`RankIndex.update`).

Compiled kernels only (:mod:`aurora_store.codec.kernels`): without numba a reader keeps walking.
Results are those of :func:`classes.locate` exactly, errors included (a rank past its class is corrupt).
"""

from __future__ import annotations

import os

import numpy as np

from aurora_store.codec import kernels
from aurora_store.codec.base import Exponent, Lookup
from aurora_store.errors import CorruptError

CHUNK = 4096
"""Elements per chunk: offsets fit 2 bytes, and a move shifts at most a chunk's offsets."""


def enabled() -> bool:
    """Whether readers that can keep an index should: yes unless ``AURORA_RANK_INDEX=0``. A decode
    with the index costs in proportion to what changed instead of a walk over every parent word (what
    that saves is measured by ``aurora bench codec`` and ``e2e``: docs/ARCHITECTURE.md, "Figures the
    design rests on"); it costs 2.1 bytes of host memory per weight and a build of two or three walks
    after each load, made in the background (``actor.live.TensorWeights``). Off where host memory is
    tighter than decode time."""
    return os.environ.get("AURORA_RANK_INDEX", "1") != "0"


RANK_COST = 20
"""A lookup's cost per rank through an index, in walks of one element (measured on 16M BF16 words with
2 threads: 25-55 ns a rank against 1.2-2.8 ns an element walked, the walk slower as more elements change)."""
MOVE_COST = 1250
"""Moving one element of an index to another exponent class, in walks of one element (1.2-2 us a move)."""


def worth(changes: int, elements: int, moves: int = 0) -> bool:
    """Whether a lookup of ``changes`` ranks in a range of ``elements`` should go through an index that
    first makes ``moves`` class moves (the last commit's, not yet made), rather than walk the range.
    Measured in process on an 85M-element BF16 model whose steps move ~2.3% of the changed elements to
    another class (real Adam steps: about 0.8%): at ~9% changed a version staged in 0.93 s through the
    index against 0.51 s walking; the break-even is near 2% changed there, near 3% for real steps."""
    return RANK_COST * changes + MOVE_COST * moves <= elements


def available(words: np.ndarray) -> bool:
    """Whether an index can be built for ``words`` here (compiled kernels, a word type they take)."""
    return kernels.get() is not None and words.dtype.type in kernels.WORDS


class RankIndex:
    """The exponent classes of one flat word array, chunk by chunk, sorted for rank lookups."""

    __slots__ = ("exponent", "perm", "size", "start")

    def __init__(self, words: np.ndarray, exponent: Exponent) -> None:
        k = kernels.get()
        if k is None or words.dtype.type not in kernels.WORDS:
            raise ValueError("a rank index needs the compiled kernels and 1-, 2- or 4-byte words")
        self.exponent = exponent
        self.size = int(words.size)
        chunks = -(-self.size // CHUNK)
        self.perm = np.zeros(chunks * CHUNK, np.uint16)
        self.start = np.zeros((chunks, (1 << exponent.bits) + 1), np.uint16)
        k.rank_build(words, exponent.shift, (1 << exponent.bits) - 1, CHUNK, self.perm, self.start)

    @property
    def nbytes(self) -> int:
        return int(self.perm.nbytes + self.start.nbytes)

    def locate(self, lo: int, hi: int, lookup: Lookup) -> tuple[np.ndarray, np.ndarray]:
        """:func:`aurora_store.codec.classes.locate` over ``[lo, hi)`` of the indexed words: positions
        (relative to ``lo``) in ascending order and, for each, its index in ``lookup.ranks``."""
        k = kernels.get()
        assert k is not None
        if lookup.exponent != self.exponent or not 0 <= lo < hi <= self.size:
            raise ValueError(f"a lookup of [{lo}, {hi}) with {lookup.exponent} in an index of {self.size} words")
        out = np.empty(lookup.ranks.size, np.int64)
        present = np.ascontiguousarray(lookup.present, np.int64)
        counts = np.ascontiguousarray(lookup.counts, np.int64)
        if int(counts.sum()) != out.size:
            raise CorruptError(f"{lookup.what}: class counts sum to {int(counts.sum())}, {out.size} ranks")
        if present.size and (int(present.min()) < 0 or int(present.max()) >= self.start.shape[1] - 1):
            raise CorruptError(f"{lookup.what}: a class id outside [0, {self.start.shape[1] - 1})")
        ranks = np.ascontiguousarray(lookup.ranks, np.int64)
        src = np.empty(out.size, np.int64)
        if k.rank_locate(self.perm, self.start, CHUNK, lo, hi, present, counts, ranks, out, src) < 0:
            raise CorruptError(f"{lookup.what}: positions rank past the end of their exponent class")
        return out, src

    def update(self, positions: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
        """The indexed words change at flat ``positions`` (unique) from ``old`` to ``new``: move those
        whose class changes. ValueError if the index did not hold ``old`` there (it is then unusable)."""
        k = kernels.get()
        assert k is not None
        was, now = self.exponent.of(old), self.exponent.of(new)
        moved = np.flatnonzero(was != now)
        if moved.size == 0:
            return
        pos = np.ascontiguousarray(positions[moved], np.int64)
        if k.rank_move(self.perm, self.start, CHUNK, pos, was[moved], now[moved]) < 0:
            raise ValueError("the rank index does not hold the words it is told were there")
