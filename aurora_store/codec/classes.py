"""Exponent classes: an element's class is the exponent field of its word in the parent version.

An element changes in a float type when its master's drift crosses half an ULP, and the ULP is set
by the exponent, so the density of changes differs by class (measured on the reference trace: 5%
of the elements in a small-exponent class change in a step, 0.5% in a large one). Positions coded
as ranks within their class cost what that conditional distribution costs, and the reader, which
holds the parent, rebuilds every class itself.

Two passes over a block's range, both O(elements):

- :func:`extract` (writer): the changed positions of ``old != new`` with each one's class and its
  *rank*, the number of elements of the same class before it in the range;
- :func:`locate` (reader): the inverse, from class-major ``(class, rank)`` pairs back to positions.

Both run compiled (numba, cached on disk), a large range split over threads (``threads()``), with a
numpy fallback that gives the same arrays (a stable sort of every element's class: measured 25-30x
slower than the compiled pass, used where numba is absent or ``AURORA_CODEC_NUMPY`` is set). No
per-element Python either way.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from aurora_store.codec import kernels
from aurora_store.codec.base import Exponent, Lookup
from aurora_store.errors import CorruptError


@dataclass(frozen=True, slots=True)
class Extracted:
    """The changed elements of a range, in position order."""

    positions: np.ndarray
    """int64, ascending, relative to the range."""
    classes: np.ndarray
    """int64: the exponent field of each one's old word."""
    ranks: np.ndarray
    """int64: elements of the same class before it in the range."""
    old: np.ndarray
    """Its word before."""
    new: np.ndarray
    """Its word after."""


_PART_MIN = 1 << 20
"""Elements per thread below which a pass runs on one thread."""
_LEAD = 1.6
"""How much longer the first part of a locate pass is: it walks while the others' sizes are counted
(a count costs about 0.4 of a walk)."""
_POOL: ThreadPoolExecutor | None = None
_SPARE = 16
"""The writer's kernel first makes room for one change in this many elements (2-6% change in a step)."""


def compiled() -> bool:
    """Whether the compiled kernels are in use (else the numpy fallback)."""
    return kernels.get() is not None


def of(words: np.ndarray, exponent: Exponent) -> np.ndarray:
    """The class of every word (its exponent field), as the smallest unsigned type that holds it."""
    return exponent.of(words).astype(np.uint8 if exponent.bits <= 8 else np.uint16)


def _parts(n: int, lead: float = 1.0) -> list[tuple[int, int]]:
    """The ranges a pass over ``n`` elements is split into, one per thread (one below 2M elements),
    the first ``lead`` times as long as the others."""
    p = max(1, min(threads(), n // _PART_MIN))
    weights = np.cumsum([0.0, lead] + [1.0] * (p - 1))
    cuts = [int(n * w / weights[-1]) for w in weights[:-1]] + [n]  # the last cut exactly n, whatever the rounding
    return list(itertools.pairwise(cuts))


def threads() -> int:
    """Threads a pass over a large range uses: ``AURORA_CODEC_THREADS``, else up to 4 of the CPUs."""
    raw = os.environ.get("AURORA_CODEC_THREADS", "")
    return max(1, int(raw)) if raw.isdigit() else max(1, min(4, os.cpu_count() or 1))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="aurora-codec")
    return _POOL


def extract(old: np.ndarray, new: np.ndarray, exponent: Exponent) -> Extracted:
    """Changed elements of two flat word arrays of one dtype, with their classes and ranks."""
    k = kernels.get()
    if k is not None and old.dtype.type in kernels.WORDS:
        parts = list(
            _pool().map(lambda r: _extract_part(k, old[r[0] : r[1]], new[r[0] : r[1]], exponent), _parts(old.size))
        )
        if len(parts) == 1:
            ex = parts[0][0]
            return Extracted(*(getattr(ex, f).copy() for f in Extracted.__slots__))  # free the spare room
        before = np.zeros(1 << exponent.bits, np.int64)  # class sizes before each part: ranks count from 0
        for (ex, sizes_), (lo, _) in zip(parts, _parts(old.size), strict=True):
            ex.positions[:] += lo
            ex.ranks[:] += before[ex.classes]
            before += sizes_
        return Extracted(*(np.concatenate([getattr(e, f) for e, _ in parts]) for f in Extracted.__slots__))
    positions = np.flatnonzero(old != new)
    c = of(old, exponent)
    order = np.argsort(c, kind="stable")
    sorted_at = np.empty(order.size, np.int64)
    sorted_at[order] = np.arange(order.size)
    first = np.concatenate([[0], np.cumsum(np.bincount(c, minlength=1 << exponent.bits))[:-1]])
    classes = c[positions].astype(np.int64)
    return Extracted(positions, classes, sorted_at[positions] - first[classes], old[positions], new[positions])


def _extract_part(
    k: kernels.Kernels, old: np.ndarray, new: np.ndarray, exponent: Exponent
) -> tuple[Extracted, np.ndarray]:
    mask = (1 << exponent.bits) - 1
    sizes_ = np.zeros(mask + 1, np.int64)
    for cap in (max(1024, old.size // _SPARE), old.size):  # a denser change than expected: once more
        pos, cls, rank = (np.empty(cap, np.int64) for _ in range(3))
        was, now = np.empty(cap, old.dtype), np.empty(cap, old.dtype)
        j = k.extract(old, new, exponent.shift, mask, pos, cls, rank, was, now, sizes_)
        if j >= 0:
            break
    return Extracted(pos[:j], cls[:j], rank[:j], was[:j], now[:j]), sizes_


def sizes(old: np.ndarray, exponent: Exponent) -> np.ndarray:
    """Elements of each class among ``old`` (int64, one entry per class)."""
    k = kernels.get()
    if k is not None and old.dtype.type in kernels.WORDS:
        out = np.zeros(1 << exponent.bits, np.int64)
        k.sizes(old, exponent.shift, (1 << exponent.bits) - 1, out)
        return out
    return np.bincount(of(old, exponent), minlength=1 << exponent.bits).astype(np.int64)


def locate(old: np.ndarray, lookup: Lookup) -> tuple[np.ndarray, np.ndarray]:
    """Positions of a classed block's ranks (``lookup``) in the range whose parent words are ``old``.

    Returns the positions in ascending order and, for each, its index in ``lookup.ranks``. A rank
    past its class's size in the parent is corrupt."""
    exponent, present, counts, ranks, what = lookup.exponent, lookup.present, lookup.counts, lookup.ranks, lookup.what
    n_cls = 1 << exponent.bits
    count = int(ranks.size)
    if count and int(ranks.max()) >= old.size:
        raise CorruptError(f"{what}: a rank of {int(ranks.max())} in a range of {old.size} elements")
    first = np.zeros(n_cls, np.int64)
    last = np.zeros(n_cls, np.int64)
    ends = np.cumsum(counts)
    first[present], last[present] = ends - counts, ends
    k = kernels.get()
    if k is not None and old.dtype.type in kernels.WORDS:
        parts = _parts(old.size, lead=_LEAD)
        # Part i's walk needs the class sizes of the parts before it; the first part's walk needs
        # none, so it runs while those are counted (and is made longer to match).
        counted = [_pool().submit(sizes, old[lo:hi], exponent) for lo, hi in parts[:-1]]

        def walk(i: int) -> tuple[np.ndarray, np.ndarray]:
            lo, hi = parts[i]
            base = np.zeros(n_cls, np.int64)
            for f in counted[:i]:
                base += f.result()
            # the first part's walk takes every rank (it finds those below its own class sizes,
            # which it need not wait for); the last takes the rest; the others, their share
            top = base + counted[i].result() if 0 < i < len(counted) else None
            a, b = first.copy(), last.copy()
            for c in present.tolist() if len(parts) > 1 else ():  # this part's share of each class's ranks
                seg = ranks[first[c] : last[c]]
                a[c] = first[c] + np.searchsorted(seg, base[c])
                if top is not None:
                    b[c] = first[c] + np.searchsorted(seg, top[c])
            n = int((b - a).sum())
            out_pos, out_src = np.empty(n, np.int64), np.empty(n, np.int64)
            found = k.locate(old[lo:hi], exponent.shift, n_cls - 1, a, b, ranks, base, out_pos, out_src)
            return out_pos[:found] + lo, out_src[:found]

        got = list(_pool().map(walk, range(len(parts))))
        found = sum(p.size for p, _ in got)
        if found != count:
            raise CorruptError(f"{what}: {count - found} positions rank past the end of their exponent class")
        if len(got) == 1:
            return got[0]
        return np.concatenate([p for p, _ in got]), np.concatenate([s for _, s in got])
    classes = np.repeat(present, counts)
    c = of(old, exponent)
    sizes_ = np.bincount(c, minlength=n_cls)
    if count and bool((ranks >= sizes_[classes]).any()):
        raise CorruptError(
            f"{what}: {int((ranks >= sizes_[classes]).sum())} positions rank past the end of their class"
        )
    starts = np.concatenate([[0], np.cumsum(sizes_)[:-1]])
    at = np.argsort(c, kind="stable")[starts[classes] + ranks] if count else np.empty(0, np.int64)
    src = np.argsort(at, kind="stable")
    return at[src].astype(np.int64), src.astype(np.int64)
