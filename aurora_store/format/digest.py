"""Weight digest: an additive multiset hash of (tensor, index, bits) over all elements.

``digest = sum over elements of h(tensor, index, bits)  (mod 2**64, two lanes)``

Because the sum is additive, a publisher that changes k elements updates the digest in
O(k): subtract the old elements' hashes, add the new ones. A reader checks a live or
materialized model against the manifest the same way. The mixer is a keyed 64-bit
finaliser, not a cryptographic hash: the digest detects corruption and mis-applied
deltas; authenticity comes from segment SHA-256s and the manifest signature.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

LANES = 2
_MASK = (1 << 64) - 1
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S33 = np.uint64(33)
_CHUNK = 1 << 16
"""Elements per pass: small enough that the ~20 passes of the mixer stay in cache."""
_POOL = ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1)), thread_name_prefix="aurora-digest")


def tensor_keys(name: str, dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Per-lane 64-bit keys of a tensor: a hash of its name, dtype and shape."""
    ident = f"{name}\0{dtype}\0{','.join(map(str, shape))}".encode()
    raw = hashlib.blake2b(ident, digest_size=16 * LANES, person=b"aurora-digest").digest()
    return tuple(int.from_bytes(raw[8 * j : 8 * j + 8], "little") for j in range(2 * LANES))


def _fmix(x: np.ndarray) -> np.ndarray:
    x ^= x >> _S33
    x *= _M1
    x ^= x >> _S33
    x *= _M2
    x ^= x >> _S33
    return x


def _lane_sums(keys: tuple[int, ...], index: np.ndarray, words: np.ndarray) -> list[int]:
    out = []
    w = words.astype(np.uint64)
    for lane in range(LANES):
        x = index.astype(np.uint64) ^ np.uint64(keys[2 * lane])
        x = _fmix(x)
        x += (w ^ np.uint64(keys[2 * lane + 1])) * _GOLDEN
        x = _fmix(x)
        out.append(int(x.sum(dtype=np.uint64)))
    return out


class Digest:
    """A running weight digest; ``hex()`` is what manifests record."""

    __slots__ = ("lanes",)

    def __init__(self, lanes: list[int] | None = None) -> None:
        self.lanes = list(lanes) if lanes is not None else [0] * LANES

    @classmethod
    def from_hex(cls, text: str) -> Digest:
        raw = bytes.fromhex(text)
        return cls([int.from_bytes(raw[8 * j : 8 * j + 8], "little") for j in range(LANES)])

    def hex(self) -> str:
        return b"".join(v.to_bytes(8, "little") for v in self.lanes).hex()

    def copy(self) -> Digest:
        return Digest(self.lanes)

    def _add(self, sums: list[int], sign: int) -> None:
        self.lanes = [(a + sign * b) & _MASK for a, b in zip(self.lanes, sums, strict=True)]

    def add(self, other: Digest) -> None:
        """Combine with the digest of a disjoint set of elements."""
        self._add(other.lanes, 1)

    def add_elements(self, keys: tuple[int, ...], index: np.ndarray, words: np.ndarray, sign: int = 1) -> None:
        """Add (or with ``sign=-1`` remove) elements at flat ``index`` with bit ``words``."""
        for lo in range(0, index.size, _CHUNK):
            self._add(_lane_sums(keys, index[lo : lo + _CHUNK], words[lo : lo + _CHUNK]), sign)

    def add_tensor(self, keys: tuple[int, ...], words: np.ndarray, sign: int = 1) -> None:
        """Add every element of a flat word array (O(numel): full versions only; uses every core)."""
        flat = words.reshape(-1)

        def span(lo: int, hi: int) -> list[int]:
            acc = [0] * LANES
            for a in range(lo, hi, _CHUNK):
                b = min(a + _CHUNK, hi)
                acc = [
                    (x + y) & _MASK
                    for x, y in zip(acc, _lane_sums(keys, np.arange(a, b, dtype=np.uint64), flat[a:b]), strict=True)
                ]
            return acc

        step = 64 * _CHUNK
        if flat.size <= step:
            self._add(span(0, flat.size), sign)
            return
        for sums in _POOL.map(lambda lo: span(lo, min(lo + step, flat.size)), range(0, flat.size, step)):
            self._add(sums, sign)

    def update(self, keys: tuple[int, ...], index: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
        """Elements at ``index`` changed from ``old`` to ``new`` bits: O(len(index))."""
        self.add_elements(keys, index, old, -1)
        self.add_elements(keys, index, new, 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Digest) and self.lanes == other.lanes

    def __hash__(self) -> int:
        return hash(tuple(self.lanes))

    def __repr__(self) -> str:
        return f"Digest({self.hex()})"
