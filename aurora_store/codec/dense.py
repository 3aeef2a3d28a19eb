"""Dense blocks: the raw little-endian words of a tensor range, as one zstd frame.

Used for dtypes the trainer does not update by small steps (integers, bool, F64) and
for any tensor where every element may change."""

from __future__ import annotations

import numpy as np

from aurora_store.codec import frames
from aurora_store.errors import CorruptError


def encode(words: np.ndarray, level: int = frames.DEFAULT_LEVEL) -> bytes:
    return frames.compress(np.ascontiguousarray(words).tobytes(), level)


def decode(payload: bytes | memoryview, *, width: int, span: int, what: str) -> np.ndarray:
    raw = frames.decompress(payload, span * width, what)
    if len(raw) != span * width:
        raise CorruptError(f"{what}: dense block of {len(raw)} bytes, expected {span * width}")
    return np.frombuffer(raw, dtype=f"<u{width}").copy()
