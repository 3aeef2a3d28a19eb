"""Staging: the changes that move live weights from the held version to a newer one.

Decoded deltas are merged per tensor into sorted positions and their new words, so
staging costs memory in proportion to the changed elements (the union over the staged
versions), never a second copy of the model. Each staged version's weight digest is
checked against its manifest before the next one is staged; nothing touches the live
weights until :meth:`Staging` is applied. No torch here: a staging is the
:class:`~aurora_store.codec.base.Words` of its version, the staged words laid over the live
weights' own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aurora_store.codec.base import Lookup, Overlay, Words
from aurora_store.codec.words import HostWords
from aurora_store.errors import ChainError
from aurora_store.format.blocks import DecodedBlock, check
from aurora_store.format.digest import Digest
from aurora_store.format.manifest import Manifest


@dataclass(slots=True)
class Staging:
    """Changes from ``base_version`` up to ``version``, verified, not yet applied: the
    :class:`~aurora_store.codec.base.Words` at ``version`` (staged where changed, else ``live``'s
    or the staged full version's), which the next delta is decoded against."""

    base_version: int
    base_hash: str
    version: int
    version_hash: str
    digest: Digest
    changes: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """name -> (sorted flat positions, new words)."""
    full: dict[str, np.ndarray] | None = None
    """When the cheapest path went through a full version: every tensor's words."""
    live: Words = field(kw_only=True)
    """The live weights, at ``base_version``."""
    replaced: dict[str, np.ndarray] = field(default_factory=dict, kw_only=True)
    """name -> the live words at the staged positions (what the changes replace), in their order; kept
    while the changes lie over the live weights (no full version staged), so the write need not read
    them again."""

    @classmethod
    def empty(cls, version: int, version_hash: str, digest: Digest, *, live: Words) -> Staging:
        """Nothing staged yet over ``live``, which holds ``version``."""
        return cls(version, version_hash, version, version_hash, digest.copy(), live=live)

    def extended(self) -> Staging:
        """A copy to stage more versions on; this one stays as it is if that fails."""
        return Staging(
            self.base_version,
            self.base_hash,
            self.version,
            self.version_hash,
            self.digest.copy(),
            dict(self.changes),
            self.full,
            live=self.live,
            replaced=dict(self.replaced),
        )

    @property
    def nbytes(self) -> int:
        n = sum(i.nbytes + w.nbytes for i, w in self.changes.values())
        return n + (sum(w.nbytes for w in self.full.values()) if self.full is not None else 0)

    @property
    def changed(self) -> int:
        return sum(int(i.size) for i, _ in self.changes.values())

    def _under(self) -> Words:
        """The words the staged changes lie over: the staged full version's, else the live ones."""
        return self.live if self.full is None else HostWords(self.full)

    def at(self, name: str, index: np.ndarray) -> np.ndarray:
        base = self._under().at(name, index)
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

    def locate(self, name: str, lo: int, hi: int, lookup: Lookup, over: Overlay | None = None) -> Overlay:
        """Run where the words under the staging live (on a device, when the live weights look up
        there), with the staged words of the range (and ``over``) laid over them."""
        mine = None
        staged = self.changes.get(name)
        if staged is not None and staged[0].size:
            idx, vals = staged
            a, b = np.searchsorted(idx, [lo, hi])
            mine = (idx[a:b] - lo, vals[a:b]) if b > a else None
        if over is not None:
            mine = over if mine is None else _merge(mine, over[0], over[1])
        return self._under().locate(name, lo, hi, lookup, mine)

    def add_version(self, m: Manifest, blocks: list[DecodedBlock]) -> None:
        """Stage one more delta (``m``, decoded against this staging): all or nothing."""
        if m.parent is None or (m.parent.version, m.parent.version_hash) != (self.version, self.version_hash):
            raise ChainError(f"version {m.version} does not follow staged version {self.version}")
        done = check(m, blocks, self, self.digest)
        over_live = self.full is None
        for name, (index, new, was) in _by_tensor(done.writes, done.olds).items():
            before = self.changes.get(name)
            if over_live:  # what a position staged before replaces stays; a new one replaces what check read
                self.replaced[name] = _replaced(before, self.replaced.get(name), index, was)
            self.changes[name] = _merge(before, index, new)
        if not over_live:
            self.replaced = {}
        self.version, self.version_hash, self.digest = done.version, done.version_hash, done.digest


def _by_tensor(
    writes: list[tuple[str, np.ndarray, np.ndarray]], olds: list[np.ndarray]
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each tensor's blocks joined into one write: positions, new words and the words they replace, in
    block order (blocks of a tensor cover disjoint ranges, so ascending positions stay ascending), so a
    tensor of many blocks is merged into the staging once, not once per block (a 155M-element
    embedding in ten blocks re-sorted what it had staged ten times)."""
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for (name, index, new), was in zip(writes, olds, strict=True):
        parts.setdefault(name, []).append((index, new, was))
    out = {}
    for name, got in parts.items():
        if len(got) == 1:
            out[name] = got[0]
            continue
        got.sort(key=lambda p: int(p[0][0]) if p[0].size else -1)
        out[name] = (
            np.concatenate([p[0] for p in got]),
            np.concatenate([p[1] for p in got]),
            np.concatenate([p[2] for p in got]),
        )
    return out


def _ascending(index: np.ndarray) -> bool:
    """Whether positions are strictly ascending (a decoder's always are: then nothing is sorted)."""
    return index.size < 2 or bool((index[1:] > index[:-1]).all())


def _replaced(
    old: tuple[np.ndarray, np.ndarray] | None, old_replaced: np.ndarray | None, index: np.ndarray, was: np.ndarray
) -> np.ndarray:
    """The live words :func:`_merge` of ``old`` and ``index`` replaces, in the merged order: ``old``'s own
    where it staged a position already (``was`` is then a staged word), else ``was``."""
    if old is None or old[0].size == 0 or old_replaced is None:
        return was if _ascending(index) else was[np.argsort(index, kind="stable")]
    idx = old[0]
    keep = ~np.isin(idx, index, assume_unique=True)
    pos = np.minimum(np.searchsorted(idx, index), idx.size - 1)
    hit = idx[pos] == index
    mine = was.copy()
    mine[hit] = old_replaced[pos[hit]]
    all_idx = np.concatenate([idx[keep], index])
    return np.concatenate([old_replaced[keep], mine])[np.argsort(all_idx, kind="stable")]


def _merge(
    old: tuple[np.ndarray, np.ndarray] | None, index: np.ndarray, words: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Union of staged positions; the newer words win."""
    if old is None or old[0].size == 0:
        if _ascending(index):
            return index, words
        order = np.argsort(index, kind="stable")
        return index[order], words[order]
    idx, vals = old
    keep = ~np.isin(idx, index, assume_unique=True)
    all_idx = np.concatenate([idx[keep], index])
    all_vals = np.concatenate([vals[keep], words])
    order = np.argsort(all_idx, kind="stable")
    return all_idx[order], all_vals[order]
