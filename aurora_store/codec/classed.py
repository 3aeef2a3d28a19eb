"""The ``classed`` codec: changed positions coded within their parent's exponent class.

The reader holds the parent version, so it knows every element's exponent class (see
:mod:`aurora_store.codec.classes`), and the density of changes differs by class. A block lists,
for each class with changes, how many it has and a Rice parameter fitted to that class's density;
the changes of a class are coded as the gaps between their ranks within the class. Values are the
sparse codec's zigzag ULP steps, in the same class-major order, in two symbol streams split at an
exponent (a contiguous cut, since the order is class-major) plus escapes.

Payload: six streams, whose lengths are the header's ``streams`` (docs/FORMAT.md, "Classed block"):

0. table, one zstd frame: ``classes`` class ids (u16), then their change counts (u32), then their
   Rice parameters (u8), little-endian;
1. unary bits and 2. remainder bits of the Rice codes (:mod:`aurora_store.codec.rice`), raw;
3. and 4. symbols of the classes below ``split`` and of the others, as in the sparse codec;
5. escapes, as in the sparse codec.

What it saves over the sparse codec, and how close its positions come to their entropy, is measured
by ``aurora bench codec`` (docs/ARCHITECTURE.md, "Figures the design rests on"). Decoding classes every parent
word of the block's range (one O(elements) pass, compiled) unless the parent's words keep a
:class:`~aurora_store.codec.ranks.RankIndex` (live host weights may: O(changed) per version), and a
writer keeps the sparse codec for a block where this one is not smaller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aurora_store.codec import frames, kernels, rice
from aurora_store.codec.base import (
    BlockWords,
    Codec,
    Decoded,
    Encoded,
    Exponent,
    Lookup,
    Span,
    entries,
    int_field,
    stream_lengths,
)
from aurora_store.codec.sparse import (
    ESCAPE,
    pack_symbols,
    shuffle,
    split_from_hist,
    unpack_symbols,
    unshuffle,
    unzigzag,
    zigzag,
)
from aurora_store.errors import CorruptError

NAME = "classed"
STREAMS = 6
_TABLE_ENTRY = 7
"""Bytes per class in the table: u16 class, u32 count, u8 Rice parameter."""


@dataclass(frozen=True, slots=True)
class ClassedHeader:
    count: int
    """Changed elements in the block."""
    classes: int
    """Exponent classes with changes (entries of the table)."""
    escapes: int
    """Symbols equal to ESCAPE."""
    split: int
    """Exponent class where the second symbol stream starts."""
    streams: tuple[int, int, int, int, int, int]
    """Byte lengths of the table, unary, remainder, low-symbol, high-symbol and escape streams."""


def encode(
    positions: np.ndarray,
    old: np.ndarray,
    new: np.ndarray,
    exponent: Exponent,
    cls: np.ndarray,
    ranks: np.ndarray,
    level: int = frames.DEFAULT_LEVEL,
) -> Encoded:
    """Encode changed elements given in position order: ``old``/``new`` their words, ``cls`` and
    ``ranks`` their classes and ranks within the block's range (:func:`classes.extract`)."""
    count = int(positions.size)
    gaps, was, now, sym, counts_all, hist = _class_major(cls, ranks, old, new, exponent)
    present = np.flatnonzero(counts_all)
    counts = counts_all[present]
    ks = rice.best_k(gaps, counts)
    unary, rem = rice.encode(gaps, counts, ks)
    table = frames.compress(present.astype("<u2").tobytes() + counts.astype("<u4").tobytes() + ks.tobytes(), level)
    escaped = np.flatnonzero(sym == ESCAPE)
    esc_words = zigzag(now[escaped] - was[escaped]) - now.dtype.type(ESCAPE)
    split = split_from_hist(hist) if count >= 512 else 0
    n_low = int(counts_all[:split].sum())
    low, high = pack_symbols(sym[:n_low], level), pack_symbols(sym[n_low:], level)
    esc = frames.compress(shuffle(esc_words), level)
    parts = (table, unary, rem, low, high, esc)
    header = ClassedHeader(
        count=count,
        classes=int(present.size),
        escapes=int(esc_words.size),
        split=split,
        streams=tuple(len(p) for p in parts),  # type: ignore[arg-type]
    )
    return Encoded(b"".join(parts), header)


def _class_major(
    cls: np.ndarray, ranks: np.ndarray, old: np.ndarray, new: np.ndarray, exponent: Exponent
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Changes (position order) sorted by class: their Rice values (each rank less the previous one
    of its class, less one; a class's first: its rank), old and new words and symbols, then the
    changes of every class and of every (class, symbol)."""
    n_cls = 1 << exponent.bits
    k = kernels.get()
    if k is not None and old.dtype.type in kernels.WORDS:
        counts, hist = np.zeros(n_cls, np.int64), np.zeros((n_cls, 16), np.int64)
        gaps, sym = np.empty(cls.size, np.int64), np.empty(cls.size, np.uint8)
        was, now = np.empty_like(old), np.empty_like(new)
        mask = (1 << (8 * old.dtype.itemsize)) - 1
        k.class_major(cls, ranks, old, new, mask, counts, gaps, was, now, sym, hist)
        return gaps, was, now, sym, counts, hist
    order = np.argsort(cls.astype(np.uint8 if exponent.bits <= 8 else np.uint16), kind="stable")
    c, r = cls[order], ranks[order]
    counts = np.bincount(c, minlength=n_cls).astype(np.int64)
    gaps = np.diff(r, prepend=np.int64(-1)) - 1
    first = np.concatenate([[0], np.cumsum(counts[counts > 0])[:-1]])
    gaps[first] = r[first]
    was, now = old[order], new[order]
    sym = np.minimum(zigzag(now - was), ESCAPE).astype(np.uint8)
    hist = np.bincount(c * 16 + sym, minlength=n_cls * 16).reshape(n_cls, 16).astype(np.int64)
    return gaps, was, now, sym, counts, hist


def _table(raw: bytes, n: int, n_cls: int, count: int, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    present = np.frombuffer(raw, "<u2", n, 0).astype(np.int64)
    counts = np.frombuffer(raw, "<u4", n, 2 * n).astype(np.int64)
    ks = np.frombuffer(raw, np.uint8, n, 6 * n).astype(np.int64)
    if n and (int(present.max()) >= n_cls or bool((np.diff(present) <= 0).any())):
        raise CorruptError(f"{what}: classes {present[:8].tolist()}... are not increasing ids below {n_cls}")
    if (n and int(counts.min()) < 1) or int(counts.sum()) != count:
        raise CorruptError(f"{what}: class counts sum to {int(counts.sum())} (none may be 0), header says {count}")
    if n and int(ks.max()) > rice.MAX_K:
        raise CorruptError(f"{what}: a Rice parameter above {rice.MAX_K}")
    return present, counts, ks


def decode(payload: bytes | memoryview, header: ClassedHeader, span: Span, parent: BlockWords, what: str) -> Decoded:
    """Decode a block into ascending positions relative to its start and wrapping word deltas.

    Classes every parent word of the block's range (``parent.locate``, on the host or where the
    parent's words live). Every length is checked
    before anything is allocated; a rank past its class, a zero delta or a stray bit is corrupt."""
    count, n, split, width = header.count, header.classes, header.split, span.width
    n_cls = 1 << span.exponent.bits
    if span.exponent.bits == 0:
        raise CorruptError(f"{what}: classed coding needs an element type with an exponent")
    if not 1 <= n <= min(count, n_cls) or not 0 <= header.escapes <= count <= span.elements:
        raise CorruptError(f"{what}: {count} changes in {n} classes with {header.escapes} escapes")
    if not 0 <= split <= n_cls:
        raise CorruptError(f"{what}: split {split} outside [0, {n_cls}]")
    if len(header.streams) != STREAMS or sum(header.streams) != len(payload) or min(header.streams) < 0:
        raise CorruptError(f"{what}: stream lengths {list(header.streams)} do not tile a {len(payload)}-byte payload")
    view = memoryview(payload)
    ends = np.cumsum(header.streams).tolist()
    cut = [view[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    present, counts, ks = _table(frames.decompress(cut[0], n * _TABLE_ENTRY, f"{what} table"), n, n_cls, count, what)
    if header.streams[1] > (count + span.elements + 7) // 8:  # a class's gaps sum to at most its size
        raise CorruptError(f"{what}: a unary stream of {header.streams[1]} bytes cannot code {count} ranks")
    ranks = rice.decode(cut[1], cut[2], counts, ks, what, running_below=span.elements)
    positions, src = parent.locate(Lookup(span.exponent, present, counts, ranks, what))
    n_low = int(counts[present < split].sum())
    low = unpack_symbols(frames.decompress(cut[3], (n_low + 1) // 2, f"{what} symbols"), n_low, what)
    n_high = count - n_low
    high = unpack_symbols(frames.decompress(cut[4], (n_high + 1) // 2, f"{what} symbols"), n_high, what)
    sym = np.concatenate([low, high])
    escaped = sym == ESCAPE
    if int(np.count_nonzero(escaped)) != header.escapes:
        raise CorruptError(f"{what}: {int(np.count_nonzero(escaped))} escape symbols, manifest says {header.escapes}")
    esc_raw = frames.decompress(cut[5], header.escapes * width, f"{what} escapes")
    zz = sym.astype(f"<u{width}")
    if header.escapes:
        esc = unshuffle(esc_raw, width)
        if int(esc.max()) > np.iinfo(f"<u{width}").max - ESCAPE:
            raise CorruptError(f"{what}: escape value overflows a {width}-byte word")
        zz[escaped] = esc + zz.dtype.type(ESCAPE)
    if not zz.all():
        raise CorruptError(f"{what}: a listed change has a zero delta")
    return Decoded(positions, unzigzag(zz)[src], None)


class ClassedCodec(Codec):
    name = NAME
    fields = frozenset({"count", "classes", "escapes", "split", "streams"})
    sparse_only = True

    def parse_header(self, doc: Mapping[str, Any], *, length: int, span: Span, what: str) -> ClassedHeader:
        if span.exponent.bits == 0:
            raise CorruptError(f"{what}: classed coding needs an element type with an exponent")
        count = int_field(doc, "count", 1, span.elements, what)
        lengths = stream_lengths(doc, STREAMS, length, what)
        n_cls = 1 << span.exponent.bits
        return ClassedHeader(
            count=count,
            classes=int_field(doc, "classes", 1, min(count, n_cls), what),
            escapes=int_field(doc, "escapes", 0, count, what),
            split=int_field(doc, "split", 0, n_cls, what),
            streams=lengths,  # type: ignore[arg-type]
        )

    def header_dict(self, header: ClassedHeader) -> dict[str, Any]:
        return entries(header)

    def decoded_bytes(self, header: ClassedHeader, span: Span) -> int:
        """The table, ranks and positions (24 bytes a change), symbols and escapes; the unary bits
        are bounded by the payload itself."""
        return header.classes * _TABLE_ENTRY + header.count * 25 + header.escapes * span.width

    def decode(
        self, payload: bytes | memoryview, header: ClassedHeader, span: Span, parent: BlockWords, what: str
    ) -> Decoded:
        return decode(payload, header, span, parent, what)


CODEC = ClassedCodec()
