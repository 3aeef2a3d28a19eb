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


Tensors = Sequence[tuple[str, str, tuple[int, ...], np.ndarray]]
"""``(name, dtype, shape, words)`` tuples, in file order."""


def layout(tensors: Tensors, metadata: dict[str, str] | None = None) -> tuple[bytes, list[int]]:
    """The file's first bytes (length prefix and padded JSON header) and each tensor's byte offset
    in the file, with the file's size last."""
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
    head = len(raw).to_bytes(8, "little") + raw
    offsets = [len(head)]
    for *_, words in tensors:
        offsets.append(offsets[-1] + words.size * words.dtype.itemsize)
    return head, offsets


def little_bytes(words: np.ndarray) -> np.ndarray:
    """A tensor's words as the flat little-endian bytes the file holds (a view when they already are)."""
    w = np.ascontiguousarray(words).reshape(-1)
    return w.astype(w.dtype.newbyteorder("<"), copy=False).view(np.uint8)


def build(tensors: Tensors, metadata: dict[str, str] | None = None) -> bytearray:
    """Serialise ``tensors`` into one buffer: one copy of the data, no intermediate bytes."""
    head, offsets = layout(tensors, metadata)
    out = bytearray(offsets[-1])
    out[: len(head)] = head
    dst = np.frombuffer(out, dtype=np.uint8)
    for (*_, w), lo, hi in zip(tensors, offsets[:-1], offsets[1:], strict=True):
        dst[lo:hi] = little_bytes(w)
    return out


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
    """One tensor's elements as flat little-endian words, writable: a view into ``data`` when it
    is a writable buffer (the tensor then lives in it), else a copy."""
    width = dtypes.dtype(entry.dtype).width
    out = np.frombuffer(data, dtype=f"<u{width}", count=(entry.stop - entry.start) // width, offset=base + entry.start)
    return out if out.flags.writeable else out.copy()
