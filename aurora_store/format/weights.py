"""Weights as the store sees them: flat little-endian word arrays keyed by HF name."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aurora_store.codec import classes
from aurora_store.codec.base import Lookup
from aurora_store.format.digest import Digest, tensor_keys
from aurora_store.format.manifest import TensorSpec


@dataclass(slots=True)
class WeightState:
    """Bit patterns of every tensor at one version, with that version's identity."""

    specs: tuple[TensorSpec, ...]
    words: dict[str, np.ndarray]
    version: int = -1
    version_hash: str = ""
    digest: Digest = field(default_factory=Digest)
    _by_name: dict[str, TensorSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name = {s.name: s for s in self.specs}

    def keys(self, name: str) -> tuple[int, ...]:
        spec = self._by_name[name]
        return tensor_keys(spec.name, spec.dtype, spec.shape)

    def spec(self, name: str) -> TensorSpec:
        return self._by_name[name]

    def old_at(self, name: str, index: np.ndarray) -> np.ndarray:
        """Words of tensor ``name`` at flat ``index`` (what a delta decoder reads)."""
        return self.words[name][index]

    def old_range(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Words of tensor ``name`` at flat positions ``[lo, hi)``: a view."""
        return self.words[name][lo:hi]

    def old_locate(self, name: str, lo: int, hi: int, lookup: Lookup) -> tuple[np.ndarray, np.ndarray]:
        """The classed codec's lookup over ``[lo, hi)`` of tensor ``name`` (host words)."""
        return classes.locate(self.words[name][lo:hi], lookup)

    def copy(self) -> WeightState:
        return WeightState(
            self.specs,
            {k: v.copy() for k, v in self.words.items()},
            self.version,
            self.version_hash,
            self.digest.copy(),
        )


def full_digest(specs: tuple[TensorSpec, ...], words: dict[str, np.ndarray]) -> Digest:
    """The digest of complete weights: O(elements), used for full versions."""
    d = Digest()
    for s in specs:
        d.add_tensor(tensor_keys(s.name, s.dtype, s.shape), words[s.name])
    return d
