"""Live weights as the updater sees them: HF names, read and written as raw words in place.

The updater never touches an engine's tensors directly. It reads the words at given flat
positions of an HF-named tensor (to decode a delta against its parent), and at a safe point
writes staged words back in place. :class:`TensorWeights` serves a plain mapping of HF
names to torch tensors (the torch engine's parameters, or tensors of its own); the vLLM
engine serves its fused, possibly tensor-parallel parameters through the same protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch

from aurora_store import device
from aurora_store.codec.base import Lookup
from aurora_store.errors import LayoutError
from aurora_store.format.manifest import TensorSpec
from aurora_store.tensors import from_words, to_words, torch_dtype, word_tensor, word_view


class LiveWeights(Protocol):
    """What the updater needs from an engine's weights."""

    def load(self, specs: tuple[TensorSpec, ...], words: Mapping[str, np.ndarray]) -> None:
        """Overwrite every tensor with ``words`` (bootstrap, or a staged full version)."""

    def read(self, name: str, index: np.ndarray) -> np.ndarray:
        """Little-endian words of tensor ``name`` at sorted flat positions ``index``."""

    def read_range(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Little-endian words of tensor ``name`` at flat positions ``[lo, hi)`` (the classed codec
        reads a block's whole range; a host tensor gives a view, a device one a copy of the range)."""

    def locate(
        self, name: str, lo: int, hi: int, lookup: Lookup, staged: tuple[np.ndarray, np.ndarray] | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """A classed block's positions over ``[lo, hi)`` of tensor ``name``, looked up where the
        weights live with ``staged`` (range-relative positions, words) laid over them; None when
        this engine looks up on the host (from :meth:`read_range`)."""

    def prepare(self, changes: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> object:
        """Everything a write needs (device copies of positions and words); may fail."""

    def commit(self, prepared: object) -> None:
        """Scatter what :meth:`prepare` made into the live tensors; must not fail."""

    def discard(self, prepared: object) -> None:
        """Free what :meth:`prepare` made without writing it (staging moved on)."""

    def snapshot(self) -> tuple[tuple[TensorSpec, ...], dict[str, np.ndarray]]:
        """Specs and words of every tensor (an O(model) copy; audits and tests only)."""


class TensorWeights:
    """Live weights held as a mapping of HF names to torch tensors, on any device."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor] | None = None,
        *,
        device: str | torch.device = "cpu",
        lookup_on_device: bool | None = None,
    ) -> None:
        self.tensors: dict[str, torch.Tensor] = tensors if tensors is not None else {}
        self.device = torch.device(device)
        self.lookup_on_device = lookup_on_device
        """Classed lookups with torch ops where the tensors live: None (the default) on an
        accelerator only; True also on CPU tensors (tests); False never."""

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

    def _flat(self, name: str) -> torch.Tensor:
        t = self.tensors[name]
        return word_view(t.view(-1))

    def read(self, name: str, index: np.ndarray) -> np.ndarray:
        flat = self._flat(name)
        got = flat[torch.from_numpy(index).to(flat.device)].cpu().numpy()
        return got.view(f"<u{got.dtype.itemsize}")

    def read_range(self, name: str, lo: int, hi: int) -> np.ndarray:
        got = self._flat(name)[lo:hi].cpu().numpy()
        return got.view(f"<u{got.dtype.itemsize}")

    def locate(
        self, name: str, lo: int, hi: int, lookup: Lookup, staged: tuple[np.ndarray, np.ndarray] | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """On an accelerator, the lookup runs there: only ranks go and positions come back. Host
        tensors take the host pass (the compiled one is the faster)."""
        flat = self._flat(name)
        if not (flat.device.type != "cpu" if self.lookup_on_device is None else self.lookup_on_device):
            return None
        words = flat[lo:hi]
        if staged is not None:  # the staged version's classes: a device copy of the range, staged words written in
            words = words.clone()
            device.write(words, staged[0], staged[1])
        return device.locate(words, lookup)

    def prepare(self, changes: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> object:
        out = []
        for name, (idx, words) in changes.items():
            flat = self._flat(name)
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
