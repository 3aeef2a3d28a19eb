"""Element types the store understands, by their safetensors names.

Tensors travel as arrays of unsigned machine words of the element's width (BF16 as
uint16, F32 as uint32, ...): the store compares, codes and hashes bit patterns, never
values, which is what makes it lossless. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aurora_store.codec.base import Exponent, Span
from aurora_store.errors import UnsupportedError


@dataclass(frozen=True, slots=True)
class DType:
    """One element type: its safetensors name, byte width and delta coding."""

    name: str
    """safetensors dtype string, e.g. ``"BF16"``."""
    width: int
    """Bytes per element."""
    sparse: bool
    """True when changed elements are coded sparsely (floating types the trainer updates)."""
    exponent_shift: int = 0
    exponent_bits: int = 0
    """Where the exponent field sits in a word (sparse dtypes only): it contexts the symbol coding."""
    narrow: bool = False
    """A 1-byte type coded sparsely since format aurora/6 (quantized weights: FP8, INT8); earlier formats
    write a changed tensor of it whole."""

    @property
    def word(self) -> np.dtype[np.unsignedinteger]:
        """The unsigned numpy type holding one element's bits."""
        return np.dtype(f"<u{self.width}")

    @property
    def exponent(self) -> Exponent:
        """The exponent field of this type's words (``bits == 0``: it has none)."""
        return Exponent(self.exponent_shift, self.exponent_bits)

    def span(self, elements: int) -> Span:
        """A block's range of ``elements`` of this type, as a codec sees it."""
        return Span(elements, self.width, self.exponent)


_TABLE = {
    d.name: d
    for d in (
        DType("BF16", 2, True, 7, 8),
        DType("F16", 2, True, 10, 5),
        DType("F32", 4, True, 23, 8),
        DType("F64", 8, False),
        DType("I64", 8, False),
        DType("I32", 4, False),
        DType("I16", 2, False),
        DType("I8", 1, True, narrow=True),
        DType("U64", 8, False),
        DType("U32", 4, False),
        DType("U16", 2, False),
        DType("U8", 1, False),
        DType("BOOL", 1, False),
        DType("F8_E4M3", 1, True, 3, 4, narrow=True),
        DType("F8_E5M2", 1, True, 2, 5, narrow=True),
    )
}


def dtype(name: str) -> DType:
    """Look up a dtype by its safetensors name; unknown names are an UnsupportedError."""
    try:
        return _TABLE[name]
    except (KeyError, TypeError):
        raise UnsupportedError(f"unsupported dtype {name!r}; known: {sorted(_TABLE)}") from None


def known() -> tuple[str, ...]:
    return tuple(sorted(_TABLE))


def bf16_words(x: np.ndarray) -> np.ndarray:
    """FP32 values rounded to BF16 words: to nearest, ties to even, as torch's ``to(torch.bfloat16)``
    rounds every number; a NaN becomes the quiet NaN 0x7FC0 (torch's CPU kernels give 0xFFFF)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), rounded)


def bf16_widened(words: np.ndarray) -> np.ndarray:
    """BF16 words as their FP32 values (exact)."""
    return (np.asarray(words).astype(np.uint32) << 16).view(np.float32)
