"""Live weights as the updater sees them: HF names, read and written as raw words in place.

The updater never touches an engine's tensors directly. It reads them as
:class:`~aurora_store.codec.base.Words` (to decode a delta against its parent), and at a safe
point writes staged words back in place. :class:`TensorWeights` serves a plain mapping of HF
names to torch tensors (the torch engine's parameters, or tensors of its own); the vLLM
engine serves its fused, possibly tensor-parallel parameters through the same protocol.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from actor.stager import Base, Staged, Stager
from aurora_store.codec import ranks
from aurora_store.codec.base import Exponent, Lookup, Overlay, Words
from aurora_store.device import TensorWords
from aurora_store.errors import LayoutError
from aurora_store.format import dtypes
from aurora_store.format.digest import Digest
from aurora_store.format.manifest import Manifest, TensorSpec
from aurora_store.format.weights import full_digest
from aurora_store.tensors import from_words, to_words, torch_dtype, word_tensor, word_views

log = logging.getLogger("aurora.actor")


class LiveWeights(Words, Protocol):
    """What the updater needs from an engine's weights: their :class:`~aurora_store.codec.base.Words`
    (to decode and stage deltas against) and the writes below."""

    def load(self, specs: tuple[TensorSpec, ...], words: Mapping[str, np.ndarray]) -> None:
        """Overwrite every tensor with ``words`` (bootstrap, or a staged full version)."""

    def prepare(
        self,
        changes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        replaced: Mapping[str, np.ndarray] | None = None,
        over: Mapping[str, np.ndarray] | None = None,
    ) -> object:
        """Everything a write needs (device copies of positions and words); may fail. ``replaced``: the
        words the changes replace, where the caller read them already. ``over``: the words of a staged
        full version the changes lie over (the updater loads it just before :meth:`commit`); None when
        they lie over the live weights. Only weights that make something of the whole version while
        preparing (a LoRA adapter loaded into vLLM) need it."""

    def commit(self, prepared: object) -> None:
        """Scatter what :meth:`prepare` made into the live tensors; must not fail."""

    def discard(self, prepared: object) -> None:
        """Free what :meth:`prepare` made without writing it (staging moved on)."""

    def snapshot(self) -> tuple[tuple[TensorSpec, ...], dict[str, np.ndarray]]:
        """Specs and words of every tensor (an O(model) copy; audits and tests only)."""

    def digest(self) -> str:
        """The weights digest of what they hold, computed where they live (O(model) work; audits and
        ``--verify-live`` after a load)."""

    def readback(self) -> str | None:
        """The weights digest after the last :meth:`commit_staged`, from the digest before it and the
        words its positions hold now, read back where the weights live: O(changed) (``--verify-live``
        after a delta). None where no staged version was committed."""

    @property
    def stages_in_place(self) -> bool:
        """Whether :meth:`stage_version` decodes deltas where the weights live (else the updater
        decodes on the host against :meth:`at` and :meth:`locate`, and writes through :meth:`prepare`)."""

    def stage_version(self, base: Staged | Base, m: Manifest, data: Sequence[memoryview]) -> Staged:
        """Decode delta ``m`` (its segments' verified bytes) against the held version ``base`` or
        over the staging ``base`` (kept until dropped), where the weights live; check its weights
        digest; keep the changes staged there. Nothing live is written; on error nothing changes."""

    def commit_staged(self, staged: Staged) -> None:
        """Write ``staged`` into the live weights at the safe point (every rank, or none)."""

    def drop_staged(self, staged: Staged) -> None:
        """Forget ``staged`` without writing it."""


class TensorWeights(TensorWords):
    """Live weights held as a mapping of HF names to torch tensors, on any device.

    With ``rank_index`` (:func:`~aurora_store.codec.ranks.enabled` says when), classed lookups
    against host tensors go through a :class:`~aurora_store.codec.ranks.RankIndex` per tensor (2.1
    bytes of host memory an element, built in the background after each load, or at a tensor's
    first lookup), which each commit moves forward with the weights (at the next lookup, not at the
    safe point): a delta's lookup then costs O(changed), not a walk over every element. An index
    is trusted only while its tensor's in-place version counter is the one it was built or moved at
    (anything else that writes the tensor makes it rebuild); ``rank_index`` False keeps the walk
    (None, the default: on unless ``AURORA_RANK_INDEX=0``)."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor] | None = None,
        *,
        device: str | torch.device = "cpu",
        lookup_on_device: bool | None = None,
        rank_index: bool | None = None,
    ) -> None:
        super().__init__(tensors, lookup_on_device=lookup_on_device)
        self.device = torch.device(device)
        self.rank_index = ranks.enabled() if rank_index is None else rank_index
        self._ranks: dict[str, tuple[ranks.RankIndex, int]] = {}
        """name -> (index, the tensor's ``_version`` it holds the classes of)."""
        self._ranks_lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self._warming: list[threading.Thread] = []
        self._moves: dict[str, tuple[ranks.RankIndex, int, np.ndarray, np.ndarray, np.ndarray]] = {}
        """name -> an index the last commit left behind, the tensor's ``_version`` after that commit,
        and the commit's positions, old and new words: made at the next lookup."""
        self._move_counts: dict[str, int] = {}
        """name -> how many of its pending moves change an element's class (what they cost)."""
        self.stager = Stager(self)
        """Versions staged against these tensors, in this process (:meth:`stage_version`)."""

    def load(self, specs: tuple[TensorSpec, ...], words: Mapping[str, np.ndarray]) -> None:
        self.stager.clear()
        with self._ranks_lock:
            self._ranks.clear()
            self._moves.clear()
            self._move_counts.clear()
        if not self.tensors:  # no engine tensors given: own them
            self.tensors = {s.name: from_words(s, words[s.name]).to(self.device) for s in specs}
            self._warm(specs)
            return
        have = {n: (tuple(t.shape), t.dtype) for n, t in self.tensors.items()}
        want = {s.name: (s.shape, torch_dtype(s)) for s in specs}
        if have != want:
            missing = sorted(set(want) - set(have))[:3]
            extra = sorted(set(have) - set(want))[:3]
            raise LayoutError(f"the engine's tensors do not match the version's: missing {missing}, extra {extra}")
        with torch.no_grad():
            for s in specs:
                with self._build_lock(s.name):  # never under an index being built from these words
                    self.tensors[s.name].copy_(from_words(s, words[s.name]))
        self._warm(specs)

    def locate(self, name: str, lo: int, hi: int, lookup: Lookup, over: Overlay | None = None) -> Overlay:
        """Through the tensor's rank index where one is worth it (nothing staged over the range, and a
        lookup sparse enough: :func:`~aurora_store.codec.ranks.worth`), else by the walk. A dense
        version leaves the index as it was (its moves or a rebuild wait for the next sparse lookup)."""
        sparse = ranks.worth(int(lookup.ranks.size), hi - lo, self._pending_moves(name, lookup.exponent, hi - lo))
        index = self._index(name, lookup.exponent) if sparse and (over is None or over[0].size == 0) else None
        if index is None:
            return super().locate(name, lo, hi, lookup, over)
        return index.locate(lo, hi, lookup)

    def _pending_moves(self, name: str, exponent: Exponent, elements: int) -> int:
        """The class moves the tensor's index must make before its next lookup (the last commit's), pro
        rata to a lookup of ``elements`` of the tensor's; counted once per commit."""
        with self._ranks_lock:
            moves = self._moves.get(name)
            if moves is None:
                return 0
            count = self._move_counts.get(name)
            if count is None:
                _, _, _, was, now = moves
                count = int(np.count_nonzero(exponent.of(was) != exponent.of(now.view(was.dtype))))
                self._move_counts[name] = count
        return count * elements // max(1, self.flat(name).numel())

    def _build_lock(self, name: str) -> threading.Lock:
        """The lock under which tensor ``name``'s index is built and its words written."""
        with self._ranks_lock:
            return self._building.setdefault(name, threading.Lock())

    def warm(self) -> None:
        """Build every tensor's rank index in the background now (after the tensors were written
        by something other than :meth:`load`, as a vLLM worker's are)."""
        self._warm(to_specs(self.tensors))

    def _warm(self, specs: tuple[TensorSpec, ...]) -> None:
        """Build the rank index of every tensor in the background after a load, so the first delta after
        it looks up at O(changed) as later ones do: built at that delta's first lookup instead, 12
        actors' indexes cost the four-regions world a 2.9 s stall at its first timed step. A lookup or
        a write of a tensor whose index is being built waits for it (its build lock)."""
        self._ahead([(s.name, e) for s in specs if (e := dtypes.dtype(s.dtype).exponent).bits])

    def _ahead(self, todo: list[tuple[str, Exponent]]) -> None:
        """Bring the rank indexes of ``todo`` up to date on a thread of their own (a lookup or a write of
        a tensor whose index is being built waits for it under its build lock)."""
        if not todo or not self.rank_index or not ranks.available(np.empty(0, np.uint16)):
            return

        def build() -> None:
            for name, exponent in todo:
                try:
                    self._index(name, exponent)
                except (KeyError, ValueError, RuntimeError) as exc:  # the tensors changed under it: built on use
                    log.debug("rank index of %s not brought up to date ahead: %s", name, exc)

        thread = threading.Thread(target=build, name="aurora-rank-index", daemon=True)
        with self._ranks_lock:
            self._warming = [t for t in self._warming if t.is_alive()] + [thread]
        thread.start()

    def warmed(self, timeout: float | None = None) -> bool:
        """Wait until the indexes a load or commit started bringing up to date are (at most ``timeout``
        seconds); whether none is still being worked on."""
        with self._ranks_lock:
            threads = list(self._warming)
        for t in threads:
            t.join(timeout)
        return not any(t.is_alive() for t in threads)

    def _index(self, name: str, exponent: Exponent) -> ranks.RankIndex | None:
        """The tensor's current rank index (built now if it has none or a stale one), or None where
        the lookup does not take the host pass or no index can be built."""
        flat = self.flat(name)
        on_device = flat.device.type != "cpu" if self.lookup_on_device is None else self.lookup_on_device
        if not self.rank_index or on_device or flat.device.type != "cpu":
            return None
        with self._build_lock(name):  # blocks of one tensor decode in parallel: one builds, the others wait for it
            with self._ranks_lock:
                held = self._ranks.get(name)
                moves = self._moves.pop(name, None)
                self._move_counts.pop(name, None)
            if held is None and moves is not None and moves[1] == flat._version:  # the last commit's moves
                index, version, at, was, now = moves
                try:
                    index.update(at, was, now.view(was.dtype))
                    held = (index, version)
                except ValueError:  # not the words it held after all: rebuilt below
                    held = None
            if held is not None and held[1] == flat._version and held[0].exponent == exponent:
                with self._ranks_lock:
                    self._ranks[name] = held
                return held[0]
            words = flat.numpy().view(f"<u{flat.element_size()}")
            if not ranks.available(words):
                return None
            index = ranks.RankIndex(words, exponent)
            with self._ranks_lock:
                self._ranks[name] = (index, flat._version)
            return index

    def prepare(
        self,
        changes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        replaced: Mapping[str, np.ndarray] | None = None,
        over: Mapping[str, np.ndarray] | None = None,
    ) -> object:
        out = []
        for name, (idx, words) in changes.items():
            flat = self.flat(name)
            with self._ranks_lock:
                held = self._ranks.get(name)
            # the words being replaced, for the index's moves (read now: nothing writes before commit)
            was = None
            if held is not None and held[1] == flat._version:
                known = replaced.get(name) if replaced is not None else None
                was = known if known is not None and known.shape == idx.shape else self.at(name, idx)
            out.append((name, flat, torch.from_numpy(idx).to(flat.device), word_tensor(words).to(flat.device), was))
        return out

    def commit(self, prepared: object) -> None:
        """Scatter, and leave each index its moves to make at its next lookup (off the safe point, and
        not beside it: a thread making them at once competes with the repack of the layers just written).

        Tensors may share storage (views of one fused engine parameter share its version counter),
        so every index is checked against the counters before any write and stamped with them after
        all of them: an index of a tensor this commit did not write stays valid too."""
        assert isinstance(prepared, list)
        written = {name for name, *_ in prepared}
        with self._ranks_lock:
            valid = {n: held for n, held in self._ranks.items() if held[1] == self.flat(n)._version}
        with torch.no_grad():
            for name, flat, idx_t, val_t, _ in prepared:
                with self._build_lock(name):  # an index being built (after a load) is finished first
                    flat.index_copy_(0, idx_t, val_t)  # positions are unique: 2-2.5x index_put's speed on CPU
        with self._ranks_lock:
            for name, flat, idx_t, val_t, was in prepared:
                held = self._ranks.pop(name, None)
                if held is not None and was is not None and valid.get(name) is held:
                    self._moves[name] = (held[0], flat._version, idx_t.cpu().numpy(), was, val_t.cpu().numpy())
                    self._move_counts.pop(name, None)
            for name, held in valid.items():
                if name not in written and self._ranks.get(name) is held:
                    self._ranks[name] = (held[0], self.flat(name)._version)

    def discard(self, prepared: object) -> None:
        """Nothing to free: prepared tensors are ordinary objects."""

    def snapshot(self) -> tuple[tuple[TensorSpec, ...], dict[str, np.ndarray]]:
        specs, words = to_words({k: v.detach().cpu() for k, v in self.tensors.items()})
        return specs, {k: w.copy() for k, w in words.items()}

    def digest(self) -> str:
        """Tensor by tensor (the digest is a sum over elements): one tensor at a time on the host."""
        total = Digest()
        for name, t in self.tensors.items():
            specs, words = to_words({name: t.detach().cpu()})
            total.add(full_digest(specs, words))
        return total.hex()

    # ------------------------------------------------------------ decoded where they live

    stages_in_place = True

    def stage_version(self, base: Staged | Base, m: Manifest, data: Sequence[memoryview]) -> Staged:
        token = uuid.uuid4().hex
        on = base.token if isinstance(base, Staged) else base
        return Staged.answered(token, base, self.stager.stage(token, on, m, data))

    def commit_staged(self, staged: Staged) -> None:
        self.stager.commit(staged.token)

    def readback(self) -> str | None:
        return self.stager.readback()

    def drop_staged(self, staged: Staged) -> None:
        self.stager.drop(staged.token)


def to_specs(tensors: Mapping[str, torch.Tensor]) -> tuple[TensorSpec, ...]:
    """The specs of named tensors (no copy)."""
    return word_views({n: t.detach() for n, t in tensors.items()})[0]
