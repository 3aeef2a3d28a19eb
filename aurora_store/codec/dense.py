"""Dense blocks: the raw little-endian words of a tensor range, as one zstd frame.

Used for dtypes the trainer does not update by small steps (integers, bool, F64) and
for any tensor where every element may change."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aurora_store.codec import frames
from aurora_store.codec.base import BlockWords, Codec, Decoded, Encoded, Span, int_field
from aurora_store.errors import CorruptError

NAME = "dense"


@dataclass(frozen=True, slots=True)
class DenseHeader:
    count: int
    """Elements in the block: every element of its range."""


def encode(words: np.ndarray, level: int = frames.DEFAULT_LEVEL) -> Encoded:
    return Encoded(frames.compress(np.ascontiguousarray(words).tobytes(), level), DenseHeader(int(words.size)))


def decode(payload: bytes | memoryview, header: DenseHeader, span: Span, what: str) -> np.ndarray:
    """The block's words."""
    if header.count != span.elements:
        raise CorruptError(f"{what}: a dense block of {header.count} elements over a range of {span.elements}")
    raw = frames.decompress(payload, span.elements * span.width, what)
    return np.frombuffer(raw, dtype=f"<u{span.width}").copy()


class DenseCodec(Codec):
    name = NAME
    fields = frozenset({"count"})

    def parse_header(self, doc: Mapping[str, Any], *, length: int, span: Span, what: str) -> DenseHeader:
        count = int_field(doc, "count", 1, span.elements, what)
        if count != span.elements:
            raise CorruptError(f"{what}: a dense block counts every element")
        return DenseHeader(count)

    def header_dict(self, header: DenseHeader) -> dict[str, Any]:
        return {"count": header.count}

    def decoded_bytes(self, header: DenseHeader, span: Span) -> int:
        return header.count * span.width

    def decode(
        self, payload: bytes | memoryview, header: DenseHeader, span: Span, parent: BlockWords, what: str
    ) -> Decoded:
        return Decoded(np.arange(span.elements, dtype=np.int64), None, decode(payload, header, span, what))


CODEC = DenseCodec()
