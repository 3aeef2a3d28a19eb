"""Published sparse-delta schemes the codec is measured against, with exact decoders.

Both code one tensor's changed elements as gaps between ascending positions (the first gap
is ``position + 1``, as in ``aurora_store.codec.sparse``) followed by the raw little-endian
new BF16 words. ``count`` travels as metadata, as it does for ours, so payloads compare
like for like.

- ``aurora_leb128`` (AuroraRL paper): gaps as LEB128 varints, no entropy coding.
- ``pulse_zstd1`` (PULSE / grail): gaps as int32, the whole payload zstd level 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zstandard

_MAX_VARINT = 10
"""Bytes in the longest LEB128 varint of a uint64."""


def gaps(positions: np.ndarray) -> np.ndarray:
    """``pos[0]+1, pos[1]-pos[0], ...`` as uint64 (positions ascending, unique)."""
    return np.diff(positions.astype(np.int64, copy=False), prepend=np.int64(-1)).astype(np.uint64)


def positions_from_gaps(g: np.ndarray) -> np.ndarray:
    """Inverse of :func:`gaps`; a gap below one (or past int64) is an error."""
    g64 = g.astype(np.int64)
    if g64.size and int(g64.min()) < 1:
        raise ValueError("a gap below one: positions are not strictly increasing")
    return np.cumsum(g64) - 1


def leb128_encode(values: np.ndarray) -> np.ndarray:
    """Unsigned LEB128: 7 bits per byte, low groups first, high bit set on all but the last byte."""
    v = values.astype(np.uint64, copy=False)
    nbytes = np.ones(v.size, np.int64)
    top = int(v.max()) if v.size else 0
    for k in range(1, _MAX_VARINT):
        if top < 1 << (7 * k):
            break
        nbytes += v >= np.uint64(1 << (7 * k))
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.empty(int(ends[-1]) if v.size else 0, np.uint8)
    idx = np.arange(v.size)
    for k in range(_MAX_VARINT):
        idx = idx[nbytes[idx] > k]
        if not idx.size:
            break
        byte = ((v[idx] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        byte |= (nbytes[idx] > k + 1).astype(np.uint8) << np.uint8(7)
        out[starts[idx] + k] = byte
    return out


def leb128_decode(data: np.ndarray, count: int) -> np.ndarray:
    """Decode exactly ``count`` varints that fill ``data`` (uint8) into uint64."""
    last = np.flatnonzero(data < 0x80)
    if last.size != count or (data.size and (not count or int(last[-1]) != data.size - 1)):
        raise ValueError(f"LEB128: {last.size} varints in {data.size} bytes, expected {count} filling them")
    if not count:
        return np.empty(0, np.uint64)
    starts = np.concatenate((np.zeros(1, np.int64), last[:-1] + 1))
    lengths = last - starts + 1
    if int(lengths.max()) > _MAX_VARINT or int(data[last[lengths == _MAX_VARINT]].max(initial=0)) > 1:
        raise ValueError("LEB128: a varint overflows 64 bits")
    shift = ((np.arange(data.size) - np.repeat(starts, lengths)) * 7).astype(np.uint64)
    parts = (data & np.uint8(0x7F)).astype(np.uint64) << shift
    return np.bitwise_or.reduceat(parts, starts)


def aurora_leb128_encode(positions: np.ndarray, values: np.ndarray) -> bytes:
    return leb128_encode(gaps(positions)).tobytes() + values.astype("<u2", copy=False).tobytes()


def aurora_leb128_decode(payload: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.frombuffer(payload, np.uint8)
    split = raw.size - 2 * count
    if split < count:
        raise ValueError(f"aurora_leb128: {raw.size} bytes cannot hold {count} changes")
    positions = positions_from_gaps(leb128_decode(raw[:split], count))
    return positions, raw[split:].view("<u2").astype(np.uint16)


def pulse_zstd1_encode(positions: np.ndarray, values: np.ndarray) -> bytes:
    g = gaps(positions)
    if g.size and int(g.max()) > np.iinfo(np.int32).max:
        raise ValueError("pulse_zstd1: a gap does not fit int32")
    raw = g.astype("<i4").tobytes() + values.astype("<u2", copy=False).tobytes()
    return zstandard.ZstdCompressor(level=1).compress(raw)


def pulse_zstd1_decode(payload: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    raw = zstandard.ZstdDecompressor().decompress(payload)
    if len(raw) != 6 * count:
        raise ValueError(f"pulse_zstd1: {len(raw)} bytes, expected {6 * count}")
    positions = positions_from_gaps(np.frombuffer(raw, "<i4", count))
    return positions, np.frombuffer(raw, "<u2", count, 4 * count).astype(np.uint16)


@dataclass(frozen=True, slots=True)
class Baseline:
    """One scheme: ``encode(positions, new_words) -> payload``, ``decode(payload, count) -> (positions, new_words)``."""

    name: str
    encode: Callable[[np.ndarray, np.ndarray], bytes]
    decode: Callable[[bytes, int], tuple[np.ndarray, np.ndarray]]


BASELINES = (
    Baseline("aurora_leb128", aurora_leb128_encode, aurora_leb128_decode),
    Baseline("pulse_zstd1", pulse_zstd1_encode, pulse_zstd1_decode),
)
