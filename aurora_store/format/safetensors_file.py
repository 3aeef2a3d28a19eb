"""The safetensors container: build and parse, on raw little-endian words. No torch.

Layout: an 8-byte little-endian header length N, N bytes of JSON header (padded with
spaces to a multiple of 8), then the tensor data. The parser treats the header as
hostile: a size cap, strict fields, known dtypes, and data ranges that tile the data
area exactly with no gaps or overlaps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aurora_store.errors import CorruptError, LimitError, StoreError
from aurora_store.format import dtypes

MAX_HEADER = 100 << 20


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    stop: int


def build(
    tensors: Sequence[tuple[str, str, tuple[int, ...], np.ndarray]], metadata: dict[str, str] | None = None
) -> bytes:
    """Serialise ``(name, dtype, shape, words)`` tuples, in the given order."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, dt, shape, words in tensors:
        n = words.size * words.dtype.itemsize
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    parts = [len(raw).to_bytes(8, "little"), raw]
    parts += [np.ascontiguousarray(w).astype(w.dtype.newbyteorder("<"), copy=False).tobytes() for *_, w in tensors]
    return b"".join(parts)


def parse(data: bytes | memoryview, what: str) -> tuple[dict[str, Entry], int]:
    """Parse a safetensors header; returns its entries and the data area's byte offset."""
    if len(data) < 8:
        raise CorruptError(f"{what}: {len(data)} bytes is too short for a safetensors file")
    n = int.from_bytes(bytes(data[:8]), "little")
    if n > MAX_HEADER or n > len(data) - 8:
        raise (LimitError if n > MAX_HEADER else CorruptError)(f"{what}: header length {n} is out of bounds")
    try:
        header = json.loads(bytes(data[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptError(f"{what}: safetensors header is not JSON ({exc})"[:300]) from None
    if not isinstance(header, dict):
        raise CorruptError(f"{what}: safetensors header must be an object")
    base = 8 + n
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise CorruptError(f"{what}: tensor {name!r} has a malformed entry")
        try:
            dt = dtypes.dtype(info["dtype"])
        except StoreError as exc:
            raise CorruptError(f"{what}: tensor {name!r}: {exc}") from None
        shape, offs = info["shape"], info["data_offsets"]
        if (
            not isinstance(shape, list)
            or not all(type(s) is int and s >= 0 for s in shape)
            or not isinstance(offs, list)
            or len(offs) != 2
            or not all(type(o) is int and o >= 0 for o in offs)
        ):
            raise CorruptError(f"{what}: tensor {name!r} has a malformed shape or offsets")
        numel = 1
        for s in shape:
            numel *= s
        if offs[1] - offs[0] != numel * dt.width:
            raise CorruptError(f"{what}: tensor {name!r} spans {offs[1] - offs[0]} bytes, expected {numel * dt.width}")
        entries[name] = Entry(name, dt.name, tuple(shape), offs[0], offs[1])
    cursor = 0
    for e in sorted(entries.values(), key=lambda e: (e.start, e.stop)):
        if e.start != cursor:
            raise CorruptError(f"{what}: tensor data has a gap or overlap at byte {e.start} ({e.name!r})")
        cursor = e.stop
    if base + cursor != len(data):
        raise CorruptError(f"{what}: data area is {len(data) - base} bytes, tensors cover {cursor}")
    return entries, base


def words(data: bytes | memoryview, base: int, entry: Entry) -> np.ndarray:
    """A writable copy of one tensor's elements as flat little-endian words."""
    width = dtypes.dtype(entry.dtype).width
    return np.frombuffer(
        data, dtype=f"<u{width}", count=(entry.stop - entry.start) // width, offset=base + entry.start
    ).copy()
