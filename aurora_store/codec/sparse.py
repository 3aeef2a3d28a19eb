"""Sparse coding of changed elements: gap-coded positions plus zigzag ULP steps.

A block covers elements ``[start, stop)`` of one tensor and holds ``count`` changed
elements as four zstd frames (see docs/FORMAT.md, "Sparse block"), whose lengths and the
counts a reader needs are the block's :class:`SparseHeader`:

1. gaps: ``pos[0]+1, pos[1]-pos[0], ...`` (positions relative to ``start``) as
   little-endian uint32 (uint64 when a gap needs it), byte-shuffled;
2. and 3. symbols: the zigzag of the signed, wrapping difference ``new - old`` of the
   element bits, clamped to 15, two 4-bit symbols per byte (low nibble first), in two
   streams: elements whose *old* exponent field is below the block's ``split``, then the
   others. Small weights take multi-ULP steps, large ones single-ULP steps, so each
   stream gets its own entropy table (measured: about 25% fewer symbol bytes). The
   reader knows the old weights, so the split costs nothing to transmit;
4. escapes: for each symbol 15, ``zigzag - 15`` as a word, byte-shuffled.

The differences are bit-pattern arithmetic, so the result is exact for every bit pattern
(signed zeros, NaN payloads, infinities, subnormals). No per-element Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aurora_store.codec import frames
from aurora_store.codec.base import (
    BlockWords,
    Codec,
    Decoded,
    Encoded,
    Exponent,
    Span,
    entries,
    int_field,
    stream_lengths,
)
from aurora_store.errors import CorruptError

ESCAPE = 15
NAME = "sparse"


@dataclass(frozen=True, slots=True)
class SparseHeader:
    """What a reader needs to split a sparse block's payload into its four streams."""

    count: int
    """Changed elements in the block."""
    gap_width: int
    """Bytes per gap word: 4, or 8 when a gap needs it."""
    escapes: int
    """Symbols equal to ESCAPE (their values are in the escape stream)."""
    split: int
    """Exponent threshold between the two symbol streams."""
    streams: tuple[int, int, int, int]
    """Byte lengths of the gap, low-symbol, high-symbol and escape frames."""


def shuffle(words: np.ndarray) -> bytes:
    """Byte-shuffle: all first bytes, then all second bytes, ... (little-endian words)."""
    width = words.dtype.itemsize
    if width == 1:
        return words.tobytes()
    return np.ascontiguousarray(
        words.astype(words.dtype.newbyteorder("<"), copy=False).view(np.uint8).reshape(-1, width).T
    ).tobytes()


def unshuffle(data: bytes, width: int) -> np.ndarray:
    """Inverse of :func:`shuffle`: words rebuilt from byte planes (2.4x faster than a transpose copy)."""
    planes = np.frombuffer(data, dtype=np.uint8).reshape(width, -1)
    out = planes[0].astype(f"<u{width}")
    for b in range(1, width):
        out |= planes[b].astype(f"<u{width}") << np.uint8(8 * b)
    return out


def changed_positions(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Flat indices (int64, ascending) where the bit patterns of two word arrays differ."""
    return np.flatnonzero(old.reshape(-1) != new.reshape(-1))


def zigzag(diff: np.ndarray) -> np.ndarray:
    bits = diff.dtype.itemsize * 8
    signed = diff.view(f"<i{diff.dtype.itemsize}")
    return ((signed << 1) ^ (signed >> (bits - 1))).view(diff.dtype)


def unzigzag(zz: np.ndarray) -> np.ndarray:
    one = zz.dtype.type(1)
    return (zz >> one) ^ (np.zeros_like(zz) - (zz & one))


_FRAME_COST_BITS = 48 * 8
"""Rough cost of one more zstd frame with its entropy table, used to decide whether to split."""


def choose_split(exps: np.ndarray, sym: np.ndarray, bits: int) -> int:
    """The exponent threshold that minimises the order-0 cost of the two symbol streams."""
    if sym.size < 512:
        return 0
    n_exp = 1 << bits
    return split_from_hist(np.bincount(exps * 16 + sym, minlength=n_exp * 16).reshape(n_exp, 16))


def split_from_hist(counts: np.ndarray) -> int:
    """:func:`choose_split` from the counts of each (exponent, symbol) pair (one row per exponent)."""
    hist = counts.astype(np.float64)
    below = np.vstack([np.zeros((1, 16)), np.cumsum(hist, axis=0)])  # row T: counts with exponent < T
    above = below[-1] - below

    def cost(c: np.ndarray) -> np.ndarray:
        n = c.sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            h = np.where(c > 0, c * np.log2(np.where(c > 0, n / c, 1.0)), 0.0).sum(axis=1)
        return h + _FRAME_COST_BITS * (n[:, 0] > 0)

    return int(np.argmin(cost(below) + cost(above)))


def pack_symbols(sym: np.ndarray, level: int) -> bytes:
    if sym.size % 2:
        sym = np.append(sym, np.uint8(0))
    return frames.compress((sym[0::2] | (sym[1::2] << np.uint8(4))).tobytes(), level)


def encode(
    positions: np.ndarray,
    old: np.ndarray,
    new: np.ndarray,
    exponent: Exponent,
    level: int = frames.DEFAULT_LEVEL,
) -> Encoded:
    """Encode changed elements: ``positions`` relative to the block start, ascending and
    unique; ``old``/``new`` their word values (unsigned, same dtype, all different)."""
    count = int(positions.size)
    gaps = np.diff(positions.astype(np.int64, copy=False), prepend=np.int64(-1))
    gap_width = 4 if count == 0 or int(gaps.max()) < 2**32 else 8
    gap_frame = frames.compress(shuffle(gaps.astype(f"<u{gap_width}")), level)
    zz = zigzag(new - old)
    sym = np.minimum(zz, ESCAPE).astype(np.uint8)
    esc_words = zz[sym == ESCAPE] - zz.dtype.type(ESCAPE)
    exps = exponent.of(old)
    split = choose_split(exps, sym, exponent.bits)
    below = exps < split
    low_frame = pack_symbols(sym[below], level)
    high_frame = pack_symbols(sym[~below], level)
    esc_frame = frames.compress(shuffle(esc_words), level)
    header = SparseHeader(
        count=count,
        gap_width=gap_width,
        escapes=int(esc_words.size),
        split=split,
        streams=(len(gap_frame), len(low_frame), len(high_frame), len(esc_frame)),
    )
    return Encoded(gap_frame + low_frame + high_frame + esc_frame, header)


def unpack_symbols(raw: bytes, n: int, what: str) -> np.ndarray:
    packed = np.frombuffer(raw, np.uint8)
    sym = np.empty(packed.size * 2, np.uint8)
    sym[0::2] = packed & np.uint8(15)
    sym[1::2] = packed >> np.uint8(4)
    if n % 2 and sym[-1] != 0:
        raise CorruptError(f"{what}: padding nibble is not zero")
    return sym[:n]


def decode(payload: bytes | memoryview, header: SparseHeader, span: Span, parent: BlockWords, what: str) -> Decoded:
    """Decode a block into positions relative to its start and wrapping word deltas.

    ``parent.at(positions)`` returns the old words at block-relative positions (the reader's
    weights before this version): the symbol streams are split by their exponents. Every
    length is checked before anything is allocated; positions outside the span, repeated
    positions or zero deltas are corrupt."""
    count, escapes, split, streams, width = header.count, header.escapes, header.split, header.streams, span.width
    gap_width = header.gap_width
    if gap_width not in (4, 8):
        raise CorruptError(f"{what}: gap width {gap_width}, expected 4 or 8")
    if not 0 <= escapes <= count <= span.elements:
        raise CorruptError(f"{what}: {count} changes with {escapes} escapes over {span.elements} elements")
    if not 0 <= split <= 1 << span.exponent.bits:
        raise CorruptError(f"{what}: split {split} outside [0, {1 << span.exponent.bits}]")
    if len(streams) != 4 or sum(streams) != len(payload) or min(streams) < 0:
        raise CorruptError(f"{what}: stream lengths {list(streams)} do not tile a {len(payload)}-byte payload")
    view = memoryview(payload)
    ends = np.cumsum(streams).tolist()
    gaps = unshuffle(frames.decompress(view[: ends[0]], count * gap_width, f"{what} gaps"), gap_width)
    if count == 0:
        for i, name in ((1, "symbols"), (2, "symbols"), (3, "escapes")):
            frames.decompress(view[ends[i - 1] : ends[i]], 0, f"{what} {name}")
        return Decoded(np.empty(0, np.int64), np.empty(0, f"<u{width}"), None)
    if int(gaps.min()) < 1:
        raise CorruptError(f"{what}: positions are not strictly increasing (a zero gap)")
    if float(gaps.sum(dtype=np.float64)) > span.elements + 1:
        raise CorruptError(f"{what}: positions run outside a block of {span.elements} elements")
    positions = np.cumsum(gaps.astype(np.int64)) - 1
    if int(positions[-1]) >= span.elements:
        raise CorruptError(f"{what}: position {int(positions[-1])} outside a block of {span.elements} elements")
    below = span.exponent.of(parent.at(positions)) < split
    n_low = int(np.count_nonzero(below))
    low = unpack_symbols(frames.decompress(view[ends[0] : ends[1]], (n_low + 1) // 2, f"{what} symbols"), n_low, what)
    n_high = count - n_low
    high = unpack_symbols(
        frames.decompress(view[ends[1] : ends[2]], (n_high + 1) // 2, f"{what} symbols"), n_high, what
    )
    sym = np.empty(count, np.uint8)
    sym[below] = low
    sym[~below] = high
    escaped = sym == ESCAPE
    if int(np.count_nonzero(escaped)) != escapes:
        raise CorruptError(f"{what}: {int(np.count_nonzero(escaped))} escape symbols, manifest says {escapes}")
    esc_raw = frames.decompress(view[ends[2] :], escapes * width, f"{what} escapes")
    zz = sym.astype(f"<u{width}")
    if escapes:
        esc = unshuffle(esc_raw, width)
        limit = np.iinfo(f"<u{width}").max - ESCAPE
        if int(esc.max()) > limit:
            raise CorruptError(f"{what}: escape value overflows a {width}-byte word")
        zz[escaped] = esc + zz.dtype.type(ESCAPE)
    if not zz.all():
        raise CorruptError(f"{what}: a listed change has a zero delta")
    return Decoded(positions, unzigzag(zz), None)


def apply(target: np.ndarray, start: int, positions: np.ndarray, deltas: np.ndarray) -> None:
    """Add wrapping ``deltas`` to ``target`` (a flat word array) at ``start + positions``."""
    idx = positions + start if start else positions
    np.put(target, idx, np.take(target, idx) + deltas)


class SparseCodec(Codec):
    name = NAME
    fields = frozenset({"count", "gap_width", "escapes", "split", "streams"})
    sparse_only = True

    def parse_header(self, doc: Mapping[str, Any], *, length: int, span: Span, what: str) -> SparseHeader:
        count = int_field(doc, "count", 1, span.elements, what)
        gap_width = doc.get("gap_width")
        if type(gap_width) is not int or gap_width not in (4, 8):
            raise CorruptError(f"{what}.gap_width must be 4 or 8, got {gap_width!r}"[:200])
        lengths = stream_lengths(doc, 4, length, what)
        return SparseHeader(
            count=count,
            gap_width=gap_width,
            escapes=int_field(doc, "escapes", 0, count, what),
            split=int_field(doc, "split", 0, 1 << span.exponent.bits, what),
            streams=(lengths[0], lengths[1], lengths[2], lengths[3]),
        )

    def header_dict(self, header: SparseHeader) -> dict[str, Any]:
        return entries(header)

    def decoded_bytes(self, header: SparseHeader, span: Span) -> int:
        return header.count * (header.gap_width + 1) + header.escapes * span.width

    def decode(
        self, payload: bytes | memoryview, header: SparseHeader, span: Span, parent: BlockWords, what: str
    ) -> Decoded:
        return decode(payload, header, span, parent, what)


CODEC = SparseCodec()
