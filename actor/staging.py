"""Staging: the changes that move live weights from the held version to a newer one.

Decoded deltas are merged per tensor into sorted positions and their new words, so
staging costs memory in proportion to the changed elements (the union over the staged
versions), never a second copy of the model. Each staged version's weight digest is
checked against its manifest before the next one is staged; nothing touches the live
weights until :meth:`Staging` is applied. No torch here: live weights are read through
:class:`LiveWords` (words at positions, a range's words, or a classed lookup where they live),
with the staged words laid over them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from aurora_store.codec import classes
from aurora_store.codec.base import Lookup
from aurora_store.errors import ChainError
from aurora_store.format.blocks import DecodedBlock
from aurora_store.format.digest import Digest, tensor_keys
from aurora_store.format.manifest import Manifest


class LiveWords(Protocol):
    """What staging reads of the live weights."""

    def read(self, name: str, index: np.ndarray) -> np.ndarray: ...

    def read_range(self, name: str, lo: int, hi: int) -> np.ndarray: ...

    def locate(
        self,
        name: str,
        lo: int,
        hi: int,
        lookup: Lookup,
        staged: tuple[np.ndarray, np.ndarray] | None,
    ) -> tuple[np.ndarray, np.ndarray] | None: ...


@dataclass(slots=True)
class Staging:
    """Changes from ``base_version`` up to ``version``, verified, not yet applied."""

    base_version: int
    base_hash: str
    version: int
    version_hash: str
    digest: Digest
    changes: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """name -> (sorted flat positions, new words)."""
    full: dict[str, np.ndarray] | None = None
    """When the cheapest path went through a full version: every tensor's words."""

    @property
    def nbytes(self) -> int:
        n = sum(i.nbytes + w.nbytes for i, w in self.changes.values())
        return n + (sum(w.nbytes for w in self.full.values()) if self.full is not None else 0)

    @property
    def changed(self) -> int:
        return sum(int(i.size) for i, _ in self.changes.values())

    def words_at(self, live: LiveWords, name: str, index: np.ndarray) -> np.ndarray:
        """Words at ``index`` as of the staged version (staged where changed, else live or full)."""
        base = self.full[name][index] if self.full is not None else live.read(name, index)
        staged = self.changes.get(name)
        if staged is not None and staged[0].size:
            idx, vals = staged
            pos = np.searchsorted(idx, index)
            ok = pos < idx.size
            hit = np.zeros(index.shape, bool)
            hit[ok] = idx[pos[ok]] == index[ok]
            base = base.copy()
            base[hit] = vals[pos[hit]]
        return base

    def words_range(self, live: LiveWords, name: str, lo: int, hi: int) -> np.ndarray:
        """Words at flat positions ``[lo, hi)`` as of the staged version."""
        base = self.full[name][lo:hi] if self.full is not None else live.read_range(name, lo, hi)
        staged = self.changes.get(name)
        if staged is not None and staged[0].size:
            idx, vals = staged
            a, b = np.searchsorted(idx, [lo, hi])
            if b > a:
                base = base.copy()
                base[idx[a:b] - lo] = vals[a:b]
        return base

    def locate(self, live: LiveWords, name: str, lo: int, hi: int, lookup: Lookup) -> tuple[np.ndarray, np.ndarray]:
        """A classed block's positions over ``[lo, hi)`` as of the staged version: where the live
        weights are, when they can look it up there (a device), else on the host."""
        staged = None
        if self.full is None and name in self.changes and self.changes[name][0].size:
            idx, vals = self.changes[name]
            a, b = np.searchsorted(idx, [lo, hi])
            staged = (idx[a:b] - lo, vals[a:b]) if b > a else None
        got = None if self.full is not None else live.locate(name, lo, hi, lookup, staged)
        if got is not None:
            return got
        words = self.words_range(live, name, lo, hi)
        return classes.locate(words, lookup)

    def view(self, live: LiveWords) -> StagedWords:
        """The staged version's words, as a delta decoder reads its parent."""
        return StagedWords(self, live)

    def add_version(self, m: Manifest, blocks: list[DecodedBlock], live: LiveWords) -> None:
        """Stage one more delta (``m``, decoded against this staging): all or nothing."""
        if m.parent is None or (m.parent.version, m.parent.version_hash) != (self.version, self.version_hash):
            raise ChainError(f"version {m.version} does not follow staged version {self.version}")
        digest = self.digest.copy()
        updates: list[tuple[str, np.ndarray, np.ndarray]] = []
        specs = {t.name: t for t in m.tensors}
        for blk in blocks:
            old = self.words_at(live, blk.name, blk.index)
            new = blk.new_words(old)
            s = specs[blk.name]
            digest.update(tensor_keys(s.name, s.dtype, s.shape), blk.index, old, new)
            updates.append((blk.name, blk.index, new))
        if digest.hex() != m.weights_digest:
            raise ChainError(
                f"version {m.version}: staged weights digest {digest.hex()}, manifest says {m.weights_digest}"
            )
        for name, index, new in updates:
            self.changes[name] = _merge(self.changes.get(name), index, new)
        self.version, self.version_hash, self.digest = m.version, m.version_hash, digest


@dataclass(frozen=True, slots=True)
class StagedWords:
    """:class:`~aurora_store.format.blocks.OldWords` of a staging over live weights."""

    staging: Staging
    live: LiveWords

    def old_at(self, name: str, index: np.ndarray) -> np.ndarray:
        return self.staging.words_at(self.live, name, index)

    def old_range(self, name: str, lo: int, hi: int) -> np.ndarray:
        return self.staging.words_range(self.live, name, lo, hi)

    def old_locate(self, name: str, lo: int, hi: int, lookup: Lookup) -> tuple[np.ndarray, np.ndarray]:
        return self.staging.locate(self.live, name, lo, hi, lookup)


def _merge(
    old: tuple[np.ndarray, np.ndarray] | None, index: np.ndarray, words: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Union of staged positions; the newer words win."""
    if old is None or old[0].size == 0:
        order = np.argsort(index, kind="stable")
        return index[order], words[order]
    idx, vals = old
    keep = ~np.isin(idx, index, assume_unique=True)
    all_idx = np.concatenate([idx[keep], index])
    all_vals = np.concatenate([vals[keep], words])
    order = np.argsort(all_idx, kind="stable")
    return all_idx[order], all_vals[order]
