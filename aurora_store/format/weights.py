"""Weights as the store sees them: flat little-endian word arrays keyed by HF name."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aurora_store.format.digest import Digest, tensor_keys
from aurora_store.format.manifest import TensorSpec


@dataclass(slots=True)
class WeightState:
    """Bit patterns of every tensor at one version, with that version's lineage (read as
    :class:`~aurora_store.codec.base.Words` through :class:`~aurora_store.codec.words.HostWords`)."""

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
