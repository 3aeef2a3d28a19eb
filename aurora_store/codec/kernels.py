"""The codec's compiled loops (numba, cached on disk): passes over every element of a block's range
and the bit-serial Rice coder. Each has a numpy equivalent in the module that calls it (the same
arrays, slower), used where numba is absent, cannot compile, or ``AURORA_CODEC_NUMPY`` is set.

Every kernel is written for hostile input: it checks each index it derives from a stream before it
reads or writes with it (numba does not), and reports a bad stream by its return value.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("aurora.codec")

WORDS = (np.uint8, np.uint16, np.uint32)
"""Word types the kernels are compiled for: every float type with small steps (8-byte words take numpy)."""
LEAD = np.array([8 - int(b).bit_length() for b in range(256)], np.int64)
"""Zero bits above the highest one bit of each byte value."""
OVERRUN = -1
"""A Rice kernel's return: a stream ends before its last value."""
OVERFLOW = -2
"""A Rice kernel's return: a value does not fit 62 bits."""


def _extract(
    old: Any, new: Any, shift: int, mask: int, pos: Any, cls: Any, rank: Any, was: Any, now: Any, sizes: Any
) -> int:
    # Changed positions with class and rank; -1 when there are more than ``pos`` holds. Four
    # interleaved counters per class: a run of one class then costs no store-to-load stall per
    # element; the rank is their sum, read at changed elements only.
    cnt = np.zeros((4, mask + 1), np.int64)
    j = 0
    for i in range(old.size):
        w = old[i]
        c = (w >> shift) & mask
        if w != new[i]:
            if j == pos.size:
                return -1
            pos[j] = i
            cls[j] = c
            rank[j] = cnt[0, c] + cnt[1, c] + cnt[2, c] + cnt[3, c]
            was[j] = w
            now[j] = new[i]
            j += 1
        cnt[i & 3, c] += 1
    for c in range(mask + 1):
        sizes[c] = cnt[0, c] + cnt[1, c] + cnt[2, c] + cnt[3, c]
    return j


def _sizes(old: Any, shift: int, mask: int, sizes: Any) -> None:
    cnt = np.zeros((4, mask + 1), np.int64)
    for i in range(old.size):
        cnt[i & 3, (old[i] >> shift) & mask] += 1
    for c in range(mask + 1):
        sizes[c] = cnt[0, c] + cnt[1, c] + cnt[2, c] + cnt[3, c]


def _locate(
    old: Any, shift: int, mask: int, first: Any, last: Any, ranks: Any, base: Any, out_pos: Any, out_src: Any
) -> int:
    # ``ranks[first[c]:last[c]]`` are class c's, strictly increasing, counted from ``base[c]`` elements
    # of the class before ``old``: walk the range once; when the count of class c seen reaches the
    # next rank wanted, that element is the next change.
    n_cls = mask + 1
    left = np.zeros(n_cls, np.int64)
    ptr = first.copy()
    for c in range(n_cls):
        left[c] = ranks[ptr[c]] - base[c] + 1 if ptr[c] < last[c] else -1
    j = 0
    for i in range(old.size):
        c = (old[i] >> shift) & mask
        v = left[c] - 1
        left[c] = v
        if v == 0:
            out_pos[j] = i
            out_src[j] = ptr[c]
            j += 1
            p = ptr[c] + 1
            ptr[c] = p
            left[c] = ranks[p] - ranks[p - 1] if p < last[c] else -1
    return j


def _class_major(
    cls: Any, ranks: Any, old: Any, new: Any, mask: int, counts: Any, gaps: Any, was: Any, now: Any, sym: Any, hist: Any
) -> None:
    # A counting sort of changes (in position order) by class: each class's changes keep their
    # order, so their ranks ascend; ``gaps`` gets each rank less the one before it in its class, less
    # one (a class's first: its rank). ``counts`` and ``hist`` (zeroed) get the changes of each class
    # and of each (class, symbol); ``sym`` the zigzag of the wrapping step ``new - old`` (words of
    # ``mask`` bits), clamped to 15.
    n_cls = counts.size
    for j in range(cls.size):
        counts[cls[j]] += 1
    ptr = np.zeros(n_cls, np.int64)
    at = 0
    for c in range(n_cls):
        ptr[c] = at
        at += counts[c]
    prev = np.full(n_cls, -1, np.int64)
    half = mask >> 1
    for j in range(cls.size):
        c = cls[j]
        p = ptr[c]
        ptr[c] = p + 1
        gaps[p] = ranks[j] - prev[c] - 1
        prev[c] = ranks[j]
        a = old[j]
        b = new[j]
        was[p] = a
        now[p] = b
        d = (np.int64(b) - np.int64(a)) & mask
        z = 2 * d if d <= half else 2 * (mask - d) + 1  # zigzag of the signed step
        s = 15 if z >= 15 else z
        sym[p] = s
        hist[c, s] += 1


def _rice_encode(values: Any, counts: Any, ks: Any, unary: Any, rem: Any) -> None:
    # ``unary`` and ``rem`` are zeroed and exactly as long as the codes need. Remainder bits go
    # through a 64-bit accumulator (at most 7 + MAX_K bits held).
    ub = 0
    acc = np.int64(0)
    held = 0
    out = 0
    j = 0
    for c in range(counts.size):
        k = ks[c]
        mask = (np.int64(1) << k) - 1
        for _ in range(counts[c]):
            v = values[j]
            j += 1
            ub += v >> k
            unary[ub >> 3] |= np.uint8(0x80 >> (ub & 7))
            ub += 1
            acc = (acc << k) | (v & mask)
            held += k
            while held >= 8:
                held -= 8
                rem[out] = np.uint8((acc >> held) & 0xFF)
                out += 1
            acc &= (np.int64(1) << held) - 1
    if held:
        rem[out] = np.uint8((acc << (8 - held)) & 0xFF)


def _rice_decode(
    unary: Any, rem: Any, counts: Any, ks: Any, lead: Any, running: bool, limit: int, out: Any, ends: Any
) -> int:
    # Values into ``out``; ``ends`` gets the bits each stream used. Returns 0, OVERRUN or OVERFLOW.
    # ``lead[b]``: the zero bits above the highest one bit of byte b. With ``running``, each run's
    # values are gaps and ``out`` gets their running positions (v0, v0 + v1 + 1, ...), each below
    # ``limit`` (else OVERFLOW).
    nu = unary.size * 8
    ub = 0
    at = 0
    acc = np.int64(0)
    held = 0
    j = 0
    for c in range(counts.size):
        k = ks[c]
        top = np.int64(1) << (62 - k)
        pos = np.int64(-1)
        for _ in range(counts[c]):
            q = 0
            while True:
                if ub >= nu:
                    return -1
                rest = (np.int64(unary[ub >> 3]) << (ub & 7)) & 0xFF  # the byte's unread bits, at its top
                if rest == 0:
                    q += 8 - (ub & 7)
                    ub = (ub | 7) + 1
                    continue
                z = lead[rest]
                q += z
                ub += z + 1
                break
            if q >= top:
                return -2
            while held < k:
                if at >= rem.size:
                    return -1
                acc = (acc << 8) | np.int64(rem[at])
                at += 1
                held += 8
            held -= k
            v = (np.int64(q) << k) | ((acc >> held) & ((np.int64(1) << k) - 1))
            acc &= (np.int64(1) << held) - 1
            if running:
                if v >= limit:
                    return -2
                pos += v + 1
                if pos >= limit:
                    return -2
                v = pos
            out[j] = v
            j += 1
    ends[0] = ub
    ends[1] = at * 8 - held
    return 0


def _rank_build(words: Any, shift: int, mask: int, size: int, perm: Any, start: Any) -> None:
    # Per chunk of ``size`` elements: a counting sort of its offsets by class (``perm``, offsets
    # ascending within a class) and where each class's run starts (``start[j, c]``; ``start[j, n_cls]``
    # is the chunk's length).
    # Four interleaved counters per class, as in ``_extract``: a run of one class costs no
    # store-to-load stall per element.
    n = words.size
    n_cls = mask + 1
    at = np.zeros(n_cls + 1, np.int64)
    cnt = np.zeros((4, n_cls), np.int64)
    for j in range(start.shape[0]):
        lo = j * size
        hi = min(lo + size, n)
        cnt[:] = 0
        for i in range(lo, hi):
            cnt[i & 3, (words[i] >> shift) & mask] += 1
        at[0] = 0
        for c in range(n_cls):
            at[c + 1] = at[c] + cnt[0, c] + cnt[1, c] + cnt[2, c] + cnt[3, c]
        for c in range(n_cls + 1):
            start[j, c] = at[c]
        for i in range(lo, hi):
            c = (words[i] >> shift) & mask
            perm[lo + at[c]] = i - lo
            at[c] += 1


def _rank_locate(
    perm: Any, start: Any, size: int, lo: int, hi: int, present: Any, counts: Any, ranks: Any, out: Any, src: Any
) -> int:
    # Class-major (class, rank) pairs of the range [lo, hi) to range-relative positions (``out``,
    # ascending) and their index in ``ranks`` (``src``), chunk by chunk (a chunk's offsets stay in
    # cache); -1 for a rank that is not below its class's size in the range or not ascending. No
    # element is read: per chunk, each class's count, and the offsets of the ranks that fall in it.
    n = present.size
    j0 = lo // size
    ptr = np.zeros(n, np.int64)
    end = np.zeros(n, np.int64)
    cum = np.zeros(n, np.int64)  # class-i elements in [lo, chunk j's start): negative in lo's own chunk
    at = 0
    for i in range(n):
        c = present[i]
        ptr[i] = at
        at += counts[i]
        end[i] = at
        left = j0 * size + np.int64(start[j0, c])
        right = j0 * size + np.int64(start[j0, c + 1])
        s = left
        while left < right:
            mid = (left + right) >> 1
            if perm[mid] < lo - j0 * size:
                left = mid + 1
            else:
                right = mid
        cum[i] = s - left
        for q in range(ptr[i] + 1, end[i]):
            if ranks[q] <= ranks[q - 1]:
                return -1
    k = 0
    j = j0
    tmp_off = np.empty(size, np.int64)
    tmp_src = np.empty(size, np.int64)
    bucket = np.zeros(65, np.int64)
    shift = 0  # 64 buckets of offsets per chunk
    while (size - 1) >> shift >= 64:
        shift += 1
    while j * size < hi and k < at:
        base = j * size
        m = 0
        for i in range(n):
            c = present[i]
            first = np.int64(start[j, c])
            cnt = np.int64(start[j, c + 1]) - first
            q = ptr[i]
            top = cum[i] + cnt
            while q < end[i] and ranks[q] < top:
                tmp_off[m] = np.int64(perm[base + first + ranks[q] - cum[i]])
                tmp_src[m] = q
                m += 1
                q += 1
            ptr[i] = q
            cum[i] = top
        # the chunk's finds in offset order: a counting sort by the offset's top bits, then an
        # insertion pass over what is left (each find is at most its bucket's length from its place)
        bucket[:] = 0
        for t in range(m):
            bucket[(tmp_off[t] >> shift) + 1] += 1
        for g in range(64):
            bucket[g + 1] += bucket[g]
        for t in range(m):
            g = tmp_off[t] >> shift
            d = k + bucket[g]
            bucket[g] += 1
            out[d] = tmp_off[t]
            src[d] = tmp_src[t]
        for t in range(k + 1, k + m):
            o = out[t]
            r = src[t]
            u = t
            while u > k and out[u - 1] > o:
                out[u] = out[u - 1]
                src[u] = src[u - 1]
                u -= 1
            out[u] = o
            src[u] = r
        for t in range(k, k + m):
            p = base + out[t]
            if p >= hi:
                return -1
            out[t] = p - lo
        k += m
        j += 1
    return 0 if k == at else -1


def _rank_move(perm: Any, start: Any, size: int, pos: Any, was: Any, now: Any) -> int:
    # Element ``pos[t]`` leaves class ``was[t]`` for class ``now[t]``: its offset moves from one run of
    # its chunk's ``perm`` to its sorted place in the other, the runs between shift by one, and their
    # starts with them. -1 if an offset is not where the index says (the index is stale).
    for t in range(pos.size):
        j = pos[t] // size
        base = j * size
        o = pos[t] - base
        a_c = was[t]
        b_c = now[t]
        a = base + np.int64(start[j, a_c])
        b = base + np.int64(start[j, a_c + 1])
        while a < b:
            m = (a + b) >> 1
            if perm[m] < o:
                a = m + 1
            else:
                b = m
        if a >= base + np.int64(start[j, a_c + 1]) or perm[a] != o:
            return -1
        lo = base + np.int64(start[j, b_c])
        hi = base + np.int64(start[j, b_c + 1])
        while lo < hi:
            m = (lo + hi) >> 1
            if perm[m] < o:
                lo = m + 1
            else:
                hi = m
        if b_c > a_c:
            for x in range(a, lo - 1):
                perm[x] = perm[x + 1]
            perm[lo - 1] = o
            for c in range(a_c + 1, b_c + 1):
                start[j, c] -= 1
        else:
            for x in range(a, lo, -1):
                perm[x] = perm[x - 1]
            perm[lo] = o
            for c in range(b_c + 1, a_c + 1):
                start[j, c] += 1
    return 0


@dataclass(frozen=True, slots=True)
class Kernels:
    extract: Any
    sizes: Any
    locate: Any
    class_major: Any
    rice_encode: Any
    rice_decode: Any
    rank_build: Any
    rank_locate: Any
    rank_move: Any


_KERNELS: Kernels | None = None
_READY = False
_LOADING = threading.Lock()
"""Held while the kernels compile or load: a caller that arrives meanwhile waits for them. (It once
saw ``_READY`` set before they were there and took the numpy path: one actor of six bootstrapping in
parallel threads built no rank index, and its first delta walked every tensor, 0.4 s more.)"""


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block, every caller takes its numpy path (parity checks, debugging)."""
    global _KERNELS, _READY
    saved = (_KERNELS, _READY)
    _KERNELS, _READY = None, True
    try:
        yield
    finally:
        _KERNELS, _READY = saved


def get() -> Kernels | None:
    """The compiled kernels, or None (no numba, ``AURORA_CODEC_NUMPY`` set, or it cannot compile here).
    Thread-safe: the first caller compiles (or loads them from numba's cache), the others wait."""
    global _KERNELS, _READY
    if _READY:
        return _KERNELS
    with _LOADING:
        if not _READY:
            _KERNELS = None if os.environ.get("AURORA_CODEC_NUMPY") else _load()
            _READY = True
    return _KERNELS


def _load() -> Kernels | None:
    try:
        import numba

        jit = numba.njit(cache=True, nogil=True)
        k = Kernels(
            jit(_extract),
            jit(_sizes),
            jit(_locate),
            jit(_class_major),
            jit(_rice_encode),
            jit(_rice_decode),
            jit(_rank_build),
            jit(_rank_locate),
            jit(_rank_move),
        )

        def i64(n: int = 1) -> np.ndarray:
            return np.zeros(n, np.int64)

        def u8() -> np.ndarray:
            return np.zeros(1, np.uint8)

        for dt in WORDS:  # compile (or load) now, not mid-publish; every argument its own array
            w = np.zeros(1, dt)
            k.extract(w, w.copy(), 0, 0, i64(), i64(), i64(), w.copy(), w.copy(), i64())
            k.sizes(w, 0, 0, i64())
            k.locate(w, 0, 0, i64(), i64(), i64(), i64(), i64(), i64())
            k.class_major(
                i64(), i64(), w, w.copy(), 1, i64(), i64(), w.copy(), w.copy(), u8(), np.zeros((1, 16), np.int64)
            )
            perm, start = np.zeros(1, np.uint16), np.zeros((1, 2), np.uint16)
            k.rank_build(w, 0, 0, 1, perm, start)
        k.rank_locate(perm, start, 1, 0, 1, i64(), i64(), i64(), i64(), i64())
        k.rank_move(perm, start, 1, i64(0), i64(0), i64(0))
        k.rice_encode(i64(0), i64(), u8(), u8(), u8())
        for running in (False, True):
            k.rice_decode(u8(), u8(), i64(), u8(), LEAD, running, 1, i64(), i64(2))
        return k
    except Exception as exc:  # a numba that cannot compile here: the numpy paths give the same arrays
        log.warning("the codec's kernels did not compile (%s): coding with numpy, several times slower", exc)
        return None
