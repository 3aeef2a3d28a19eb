"""Live weights as the updater sees them: HF names, read and written as raw words in place.

The updater never touches an engine's tensors directly. It reads them as
:class:`~aurora_store.codec.base.Words` (to decode a delta against its parent), and at a safe
point writes staged words back in place. :class:`TensorWeights` serves a plain mapping of HF
names to torch tensors (the torch engine's parameters, or tensors of its own); the vLLM
engine serves its fused, possibly tensor-parallel parameters through the same protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch

from aurora_store.codec.base import Words
from aurora_store.device import TensorWords
from aurora_store.errors import LayoutError
from aurora_store.format.manifest import TensorSpec
from aurora_store.tensors import from_words, to_words, torch_dtype, word_tensor


class LiveWeights(Words, Protocol):
    """What the updater needs from an engine's weights: their :class:`~aurora_store.codec.base.Words`
    (to decode and stage deltas against) and the writes below."""

    def load(self, specs: tuple[TensorSpec, ...], words: Mapping[str, np.ndarray]) -> None:
        """Overwrite every tensor with ``words`` (bootstrap, or a staged full version)."""

    def prepare(self, changes: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> object:
        """Everything a write needs (device copies of positions and words); may fail."""

    def commit(self, prepared: object) -> None:
        """Scatter what :meth:`prepare` made into the live tensors; must not fail."""

    def discard(self, prepared: object) -> None:
        """Free what :meth:`prepare` made without writing it (staging moved on)."""

    def snapshot(self) -> tuple[tuple[TensorSpec, ...], dict[str, np.ndarray]]:
        """Specs and words of every tensor (an O(model) copy; audits and tests only)."""


class TensorWeights(TensorWords):
    """Live weights held as a mapping of HF names to torch tensors, on any device."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor] | None = None,
        *,
        device: str | torch.device = "cpu",
        lookup_on_device: bool | None = None,
    ) -> None:
        super().__init__(tensors, lookup_on_device=lookup_on_device)
        self.device = torch.device(device)

    def load(self, specs: tuple[TensorSpec, ...], words: Mapping[str, np.ndarray]) -> None:
        if not self.tensors:  # no engine tensors given: own them
            self.tensors = {s.name: from_words(s, words[s.name]).to(self.device) for s in specs}
            return
        have = {n: (tuple(t.shape), t.dtype) for n, t in self.tensors.items()}
        want = {s.name: (s.shape, torch_dtype(s)) for s in specs}
        if have != want:
            missing = sorted(set(want) - set(have))[:3]
            extra = sorted(set(have) - set(want))[:3]
            raise LayoutError(f"the engine's tensors do not match the version's: missing {missing}, extra {extra}")
        with torch.no_grad():
            for s in specs:
                self.tensors[s.name].copy_(from_words(s, words[s.name]))

    def prepare(self, changes: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> object:
        out = []
        for name, (idx, words) in changes.items():
            flat = self.flat(name)
            out.append((flat, torch.from_numpy(idx).to(flat.device), word_tensor(words).to(flat.device)))
        return out

    def commit(self, prepared: object) -> None:
        assert isinstance(prepared, list)
        with torch.no_grad():
            for flat, idx_t, val_t in prepared:
                flat[idx_t] = val_t

    def discard(self, prepared: object) -> None:
        """Nothing to free: prepared tensors are ordinary objects."""

    def snapshot(self) -> tuple[tuple[TensorSpec, ...], dict[str, np.ndarray]]:
        specs, words = to_words({k: v.detach().cpu() for k, v in self.tensors.items()})
        return specs, {k: w.copy() for k, w in words.items()}
