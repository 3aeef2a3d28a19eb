"""Live weights for vLLM layouts this project does not map: vLLM's own loaders place every change.

Where :class:`~actor.vllm_layout.VllmLayout` refuses a model (MoE experts, or anything else it
does not know how vLLM fuses and shards), the actor cannot address vLLM's parameters itself.
:class:`VllmPatchWeights` keeps the version's words in host memory under HF names (reads for
decoding deltas, snapshots for audits) and sends each change to the workers as sparse patches in
checkpoint coordinates, which the ``aurora`` weight-transfer backend hands to the model's own
``load_weights`` (:mod:`actor.vllm_transfer`). Costs and limits are vLLM's: the host copy is one
model in RAM, a patch costs O(whole tensor) per rank, NaN values are refused before anything is
staged, and a loader that fails half-way cannot be rolled back, so this object then refuses
every further write and the actor must be restarted.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from actor.vllm_transfer import patch_values
from aurora_store.codec.base import Lookup
from aurora_store.errors import LayoutError, StoreError
from aurora_store.format.manifest import TensorSpec

Push = Callable[..., None]
"""``push(op, *args)``: one ``update_weights`` call of the aurora backend on every worker."""


class VllmPatchWeights:
    """:class:`~actor.live.LiveWeights` over a vLLM engine that loaded ``specs``/``words`` itself."""

    def __init__(
        self,
        specs: tuple[TensorSpec, ...],
        words: Mapping[str, np.ndarray],
        push: Push,
        *,
        after_write: Callable[[], None] | None = None,
    ) -> None:
        self.specs = specs
        self.words = {s.name: np.array(words[s.name], copy=True).reshape(-1) for s in specs}
        self._by_name = {s.name: s for s in specs}
        self.push, self.after_write = push, after_write
        self.broken: str | None = None

    def _spec(self, name: str) -> TensorSpec:
        spec = self._by_name.get(name)
        if spec is None:
            raise LayoutError(f"tensor {name!r} is not in the engine's model")
        return spec

    def _check(self) -> None:
        if self.broken is not None:
            raise StoreError(f"the vLLM engine's weights are in an unknown state ({self.broken}); restart the actor")

    def load(self, specs: tuple[TensorSpec, ...], words: Mapping[str, np.ndarray]) -> None:
        """Move to ``words`` by patching only the elements that differ from what the engine holds."""
        if specs != self.specs:
            raise LayoutError("the version's tensor table differs from the one vLLM loaded; restart the actor")
        changes = {}
        for s in specs:
            new = np.asarray(words[s.name]).reshape(-1)
            if new.size != s.numel or new.dtype.itemsize != s.width:
                raise LayoutError(f"{s.name!r}: expected {s.numel} words of {s.width} bytes")
            idx = np.flatnonzero(self.words[s.name] != new)
            if idx.size:
                changes[s.name] = (idx.astype(np.int64), new[idx])
        if changes:
            self.commit(self.prepare(changes))

    def read(self, name: str, index: np.ndarray) -> np.ndarray:
        return self.words[self._spec(name).name][np.asarray(index)]

    def locate(
        self, name: str, lo: int, hi: int, lookup: Lookup, staged: tuple[np.ndarray, np.ndarray] | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The lookup runs on the host, over the words this engine holds there."""
        return None

    def read_range(self, name: str, lo: int, hi: int) -> np.ndarray:
        return self.words[self._spec(name).name][lo:hi]

    def prepare(self, changes: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> object:
        self._check()
        entries = []
        for name, (idx, new) in changes.items():
            spec = self._spec(name)
            idx = np.asarray(idx)
            if idx.ndim != 1 or np.shape(new) != idx.shape or np.asarray(new).dtype.itemsize != spec.width:
                raise LayoutError(f"{name!r}: expected one {spec.width}-byte word per position")
            if idx.size and (idx.min() < 0 or idx.max() >= spec.numel):
                raise LayoutError(f"positions into {name!r} run outside its {spec.numel} elements")
            patch_values(spec, np.asarray(new))  # refuses NaN and non-float tensors here, before any worker sees it
            entries.append([name, spec.dtype, list(spec.shape), idx.astype(np.int64), np.asarray(new)])
        token = uuid.uuid4().hex
        if entries:
            try:
                self.push("patch_stage", token, entries)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.push("patch_drop", token)
                raise
        return (token if entries else None, dict(changes))

    def commit(self, prepared: object) -> None:
        token, changes = _prepared(prepared)
        if token is None:
            return
        self._check()
        try:
            self.push("patch_commit", token)
        except Exception as exc:
            self.broken = f"a patch failed half-way: {exc}"[:500]
            raise
        for name, (idx, new) in changes.items():
            self.words[name][np.asarray(idx)] = new
        if self.after_write is not None:
            self.after_write()

    def discard(self, prepared: object) -> None:
        token, _ = _prepared(prepared)
        if token is not None:
            self.push("patch_drop", token)

    def snapshot(self) -> tuple[tuple[TensorSpec, ...], dict[str, np.ndarray]]:
        """The host copy (vLLM's parameters cannot be read back in HF coordinates for this layout)."""
        return self.specs, {k: v.copy() for k, v in self.words.items()}


def _prepared(prepared: object) -> tuple[str | None, dict[str, Any]]:
    if not (isinstance(prepared, tuple) and len(prepared) == 2):
        raise StoreError("not something VllmPatchWeights.prepare() made")
    return prepared
