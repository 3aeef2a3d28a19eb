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
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

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


_EMPTY = np.empty(0, np.uint64)


def _compile() -> Any:
    """The compiled mixer (numba, cached on disk), or None when numba is not installed or turned off."""
    global _fmix_one
    if os.environ.get("AURORA_DIGEST_NUMPY"):
        return None
    try:
        import numba
    except ImportError:
        return None
    try:
        # module-level functions, not a closure: numba's disk cache missed the closure in every
        # process (0.50 s at each role's first digest against 0.37 s, 0.2 s of it importing numba)
        _fmix_one = numba.njit(cache=True, nogil=True)(_fmix)  # the numpy mixer, compiled for one element
        kernel = numba.njit(cache=True, nogil=True)(_lanes)
        zero = np.uint64(0)
        kernel(zero, zero, zero, zero, _EMPTY, 0, np.zeros(1, np.uint16))  # compiles (or loads) now, not mid-publish
        return kernel
    except Exception:  # a numba that cannot compile here: the numpy mixer gives the same bits
        return None


def _lanes(k0: Any, k1: Any, k2: Any, k3: Any, index: Any, base: int, words: Any) -> tuple[Any, Any]:
    """Both lane sums of elements ``index`` (or ``base, base+1, ...`` when empty) with ``words``: the
    compiled kernel's body (:func:`_compile`)."""
    a = np.uint64(0)
    b = np.uint64(0)
    for i in range(words.size):
        idx = np.uint64(base + i) if index.size == 0 else index[i]
        w = np.uint64(words[i])
        a += _fmix_one(_fmix_one(idx ^ k0) + (w ^ k1) * _GOLDEN)
        b += _fmix_one(_fmix_one(idx ^ k2) + (w ^ k3) * _GOLDEN)
    return a, b


_fmix_one: Any = None
""":func:`_fmix` compiled for one element, once :func:`_compile` ran."""


_KERNEL: Any = None
_KERNEL_READY = False
_KERNEL_LOADING = threading.Lock()


def _kernel() -> Any:
    """The compiled lane kernel or None; the first caller compiles (or loads) it, concurrent ones wait."""
    global _KERNEL, _KERNEL_READY
    if not _KERNEL_READY:
        with _KERNEL_LOADING:
            if not _KERNEL_READY:
                _KERNEL = _compile()
                _KERNEL_READY = True
    return _KERNEL


def _sums(keys: tuple[int, ...], index: np.ndarray | None, base: int, words: np.ndarray) -> list[int]:
    """Lane sums of elements ``index`` (or ``base, base+1, ...`` when None) with ``words``."""
    k = _kernel()
    if k is None:
        idx = np.arange(base, base + words.size, dtype=np.uint64) if index is None else index
        return _lane_sums(keys, idx, words)
    u = [np.uint64(v) for v in keys]
    idx = _EMPTY if index is None else np.ascontiguousarray(index, dtype=np.uint64)
    a, b = k(u[0], u[1], u[2], u[3], idx, base, np.ascontiguousarray(words))
    return [int(a), int(b)]


def _fmix(x: Any) -> Any:
    """The 64-bit finaliser, on an array (numpy) or on one element (compiled)."""
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
        if _kernel() is not None:
            self._add(_sums(keys, index, 0, words), sign)
            return
        for lo in range(0, index.size, _CHUNK):
            self._add(_lane_sums(keys, index[lo : lo + _CHUNK], words[lo : lo + _CHUNK]), sign)

    def add_range(self, keys: tuple[int, ...], start: int, words: np.ndarray, sign: int = 1) -> None:
        """Add the elements ``start, start + 1, ...`` with bit ``words`` (a rank's shard of a tensor)."""
        self.add_tensor(keys, words, sign, start=start)

    def add_tensor(self, keys: tuple[int, ...], words: np.ndarray, sign: int = 1, *, start: int = 0) -> None:
        """Add every element of a flat word array (O(numel): full versions only; uses every core);
        ``start`` is the flat index of its first element."""
        flat = words.reshape(-1)

        def span(lo: int, hi: int) -> list[int]:
            if _kernel() is not None:
                return _sums(keys, None, start + lo, flat[lo:hi])
            acc = [0] * LANES
            for a in range(lo, hi, _CHUNK):
                b = min(a + _CHUNK, hi)
                part = _lane_sums(keys, np.arange(start + a, start + b, dtype=np.uint64), flat[a:b])
                acc = [(x + y) & _MASK for x, y in zip(acc, part, strict=True)]
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
