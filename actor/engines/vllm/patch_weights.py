"""Live weights for vLLM layouts this project does not map: vLLM's own loaders place every change.

Where :class:`~actor.engines.vllm.layout.VllmLayout` refuses a model (MoE experts, or anything else it
does not know how vLLM fuses and shards), the actor cannot address vLLM's parameters itself.
:class:`VllmPatchWeights` keeps the version's words in host memory under HF names (reads for
decoding deltas, snapshots for audits) and sends each change to the workers as sparse patches in
checkpoint coordinates, which the ``aurora`` weight-transfer backend hands to the model's own
``load_weights`` (:mod:`actor.engines.vllm.transfer`). A load writes every tensor whole (so the engine
holds exactly the version, whatever it loaded or made of it); a delta goes as sparse patches.
Costs and limits are vLLM's: the host copy is one model in RAM, a sparse patch costs O(whole
tensor) per rank, NaN values are refused before anything is staged, and a loader that fails
half-way cannot be rolled back, so this object then refuses every further write and the actor
must be restarted.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from actor.engines.vllm.transfer import patch_values
from actor.stager import Base, Staged
from aurora_store.codec import words as host
from aurora_store.codec.base import Lookup, Overlay
from aurora_store.errors import LayoutError, StoreError, UnsupportedError
from aurora_store.format.manifest import Manifest, TensorSpec
from aurora_store.format.weights import full_digest

Push = Callable[..., None]
"""``push(op, *args)``: one ``update_weights`` call of the aurora backend on every worker."""


class VllmPatchWeights:
    """:class:`~actor.live.LiveWeights` over a vLLM engine serving a model with tensors ``specs``."""

    def __init__(
        self,
        specs: tuple[TensorSpec, ...],
        push: Push,
        *,
        after_write: Callable[[], None] | None = None,
        batch_bytes: int = 256 << 20,
    ) -> None:
        self.specs = specs
        self.words: dict[str, np.ndarray] = {}
        """The host copy of what the engine holds, under HF names (empty until :meth:`load`)."""
        self._by_name = {s.name: s for s in specs}
        self.push, self.after_write = push, after_write
        self.batch_bytes = batch_bytes
        self.broken: str | None = None

    def _spec(self, name: str) -> TensorSpec:
        spec = self._by_name.get(name)
        if spec is None:
            raise LayoutError(f"tensor {name!r} is not in the engine's model")
        if not self.words:
            raise StoreError("vLLM live weights hold no version yet: load() one first")
        return spec

    def _check(self) -> None:
        if self.broken is not None:
            raise StoreError(f"the vLLM engine's weights are in an unknown state ({self.broken}); restart the actor")

    def load(self, specs: tuple[TensorSpec, ...], words: Mapping[str, np.ndarray]) -> None:
        """Write every tensor whole through vLLM's loaders (dense patches, in parts of about
        ``batch_bytes``): what the engine holds is then known, whatever it loaded or repacked."""
        self._check()
        if specs != self.specs:
            raise LayoutError("the version's tensor table differs from the one vLLM loaded; restart the actor")
        flat = {}
        for s in specs:
            w = np.asarray(words[s.name]).reshape(-1)
            if w.size != s.numel or w.dtype.itemsize != s.width:
                raise LayoutError(f"{s.name!r}: expected {s.numel} words of {s.width} bytes")
            flat[s.name] = w
        token, batch, size = uuid.uuid4().hex, [], 0
        try:
            for s in specs:
                batch.append([s.name, s.dtype, list(s.shape), None, flat[s.name]])
                size += flat[s.name].nbytes
                if size >= self.batch_bytes:
                    self.push("patch_stage", token, batch)
                    batch, size = [], 0
            if batch:
                self.push("patch_stage", token, batch)
        except BaseException:
            with contextlib.suppress(Exception):
                self.push("patch_drop", token)
            raise
        self._commit(token)
        self.words = {name: np.array(w, copy=True) for name, w in flat.items()}
        self._written()

    def at(self, name: str, index: np.ndarray) -> np.ndarray:
        return self.words[self._spec(name).name][np.asarray(index)]

    def locate(self, name: str, lo: int, hi: int, lookup: Lookup, over: Overlay | None = None) -> Overlay:
        """The host pass, over the host copy."""
        return host.locate(self.words[self._spec(name).name][lo:hi], lookup, over)

    def prepare(
        self,
        changes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        replaced: Mapping[str, np.ndarray] | None = None,
        over: Mapping[str, np.ndarray] | None = None,
    ) -> object:
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
        self._commit(token)
        for name, (idx, new) in changes.items():
            self.words[name][np.asarray(idx)] = new
        self._written()

    def _commit(self, token: str) -> None:
        self._check()
        try:
            self.push("patch_commit", token)
        except Exception as exc:
            self.broken = f"a patch failed half-way: {exc}"[:500]
            raise

    def _written(self) -> None:
        if self.after_write is not None:
            self.after_write()

    def discard(self, prepared: object) -> None:
        token, _ = _prepared(prepared)
        if token is not None:
            self.push("patch_drop", token)

    def digest(self) -> str:
        if not self.words:
            raise StoreError("vLLM live weights hold no version yet: load() one first")
        return full_digest(self.specs, self.words).hex()

    def readback(self) -> str | None:
        """Nothing staged is ever committed here."""
        return None

    stages_in_place = False
    """vLLM's loaders place every change here, from host words: versions are decoded on the host."""

    def stage_version(self, base: Staged | Base, m: Manifest, data: Sequence[memoryview]) -> Staged:
        raise UnsupportedError("the patches mode decodes versions on the host (stages_in_place is False)")

    def commit_staged(self, staged: Staged) -> None:
        raise UnsupportedError("the patches mode stages nothing in the engine")

    def drop_staged(self, staged: Staged) -> None:
        raise UnsupportedError("the patches mode stages nothing in the engine")

    def snapshot(self) -> tuple[tuple[TensorSpec, ...], dict[str, np.ndarray]]:
        """The host copy (vLLM's parameters cannot be read back in HF coordinates for this layout)."""
        if not self.words:
            raise StoreError("vLLM live weights hold no version yet: load() one first")
        return self.specs, {k: v.copy() for k, v in self.words.items()}


def _prepared(prepared: object) -> tuple[str | None, dict[str, Any]]:
    if not (isinstance(prepared, tuple) and len(prepared) == 2):
        raise StoreError("not something VllmPatchWeights.prepare() made")
    return prepared
