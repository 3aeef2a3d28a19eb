"""FP8 E4M3 (the ``fn`` variant: no infinities, one NaN pattern per sign) as bit patterns, from FP32.

A word is ``S EEEE MMM``: exponent bias 7, so normals are ``1.MMM x 2^(E-7)`` for E in 1..15 (the
largest finite value, ``0 1111 110``, is 448), subnormals ``0.MMM x 2^-6`` for E = 0, and
``S 1111 111`` is NaN. :func:`encode` rounds to nearest, ties to even (IEEE 754's default, and what
``torch.Tensor.to(torch.float8_e4m3fn)`` does for every value it does not overflow), and saturates:
a magnitude above 448 becomes 448 rather than NaN, so a quantizer's rounding of a block's largest
element can never produce a NaN. NaN stays NaN (0x7F, or 0xFF with the sign), -0.0 stays 0x80.

Pure numpy on bit patterns: the same words on every machine, no device or library rounding mode
involved. :func:`decode` is exact (every E4M3 value is an FP32 value).
"""

from __future__ import annotations

import numpy as np

MAX = 448.0
"""The largest finite E4M3 magnitude."""
NAN = 0x7F
"""The positive NaN pattern (``S 1111 111``)."""
_MIN_NORMAL_EXP = -6
"""Normals are at or above 2^-6; below, subnormals in steps of 2^-9."""


def encode(x: np.ndarray) -> np.ndarray:
    """FP32 values ``x`` as E4M3 words (uint8), rounded to nearest even and saturated at +-448."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    sign = ((bits >> 24) & 0x80).astype(np.uint8)
    nan = np.isnan(f)
    mag = np.where(nan, np.float32(0.0), np.minimum(np.abs(f), np.float32(MAX)))  # NaN's word is set below
    mbits = mag.view(np.uint32)
    # normals: keep 3 of FP32's 23 mantissa bits, rounding the 20 dropped ones to nearest even
    rounded = (mbits + np.uint32(0x7FFFF) + ((mbits >> 20) & 1)) & np.uint32(0xFFF00000)
    exp = (rounded >> 23).astype(np.int32) - 127 + 7  # E4M3's biased exponent
    normal = ((exp << 3) | ((rounded >> 20) & 7).astype(np.int32)).astype(np.uint8)
    # subnormals (and values that round up to the smallest normal): multiples of 2^-9, ties to even
    steps = np.rint(mag * np.float32(512.0)).astype(np.int32)  # exact scaling by a power of two
    small = mag < np.float32(2.0**_MIN_NORMAL_EXP)
    out = np.where(small, steps.astype(np.uint8), normal)
    out = np.where(nan, np.uint8(NAN), out)
    return (out | sign).astype(np.uint8)


def decode(words: np.ndarray) -> np.ndarray:
    """E4M3 words as their exact FP32 values (NaN for ``S 1111 111``)."""
    w = np.asarray(words, dtype=np.uint8).astype(np.int32)
    exp = (w >> 3) & 0xF
    mant = (w & 7).astype(np.float32)
    normal = (np.float32(1.0) + mant / np.float32(8.0)) * np.ldexp(np.float32(1.0), exp - 7).astype(np.float32)
    sub = mant * np.float32(2.0**-9)
    mag = np.where(exp == 0, sub, normal).astype(np.float32)
    mag = np.where((w & 0x7F) == NAN, np.float32(np.nan), mag)
    return np.where(w & 0x80, -mag, mag).astype(np.float32)
