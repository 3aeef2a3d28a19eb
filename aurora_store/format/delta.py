"""Building a delta version: changed elements become blocks, blocks fill segments.

Pure computation over word arrays; no I/O. ``DeltaBuilder.add_tensor`` yields each
segment as soon as it is sealed, so a caller can upload it while extraction goes on
(cut-through); ``finish`` seals the last one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aurora_store.codec import classed, classes, dense, frames, sparse
from aurora_store.codec.base import Encoded, Exponent
from aurora_store.errors import StoreError
from aurora_store.format import dtypes
from aurora_store.format.digest import Digest, tensor_keys
from aurora_store.format.keys import object_key
from aurora_store.format.manifest import Block, Segment, TensorSpec


@dataclass(frozen=True, slots=True)
class SealedObject:
    """An object ready to upload and the manifest entry that describes it."""

    entry: Segment
    data: bytes | memoryview
    """A full version's shard is a writable buffer: its publisher keeps views of it as its baseline."""


@dataclass(slots=True)
class Change:
    """Elements of one tensor that changed: flat positions with their old and new words."""

    name: str
    positions: np.ndarray
    old: np.ndarray
    new: np.ndarray


ClassSizes = Callable[[int, int], np.ndarray]
"""``sizes(lo, hi)``: elements of each exponent class among the old words ``[lo, hi)`` of a range."""
_SMALL_BLOCK = 256
"""Changes below which a block is coded both ways (cheap) and the smaller kept."""


def _order0_bytes(count: int, elements: int) -> float:
    """Bytes of ``count`` positions among ``elements`` at the entropy of an iid changed bit."""
    p = count / elements
    if p >= 1:
        return 0.0
    return float(elements * -(p * np.log2(p) + (1 - p) * np.log2(1 - p)) / 8)


def code_block(
    ex: classes.Extracted,
    exponent: Exponent,
    elements: int,
    level: int = frames.DEFAULT_LEVEL,
    *,
    classed_ok: bool = True,
) -> tuple[Encoded, str]:
    """One float block's changes (``ex``, relative to a block of ``elements``) and its codec's name:
    the smaller of the classed and sparse codings. The sparse one is tried only where it may win:
    a small block (the classed table's fixed cost), or ranks that cost no less than the order-0
    bound of the positions, which the sparse gaps come close to."""
    if not classed_ok:
        return sparse.encode(ex.positions, ex.old, ex.new, exponent, level), sparse.NAME
    enc = classed.encode(ex.positions, ex.old, ex.new, exponent, ex.classes, ex.ranks, level)
    rank_bytes = enc.header.streams[1] + enc.header.streams[2]
    if ex.positions.size >= _SMALL_BLOCK and rank_bytes < _order0_bytes(ex.positions.size, elements):
        return enc, classed.NAME
    alt = sparse.encode(ex.positions, ex.old, ex.new, exponent, level)
    return (alt, sparse.NAME) if len(alt.payload) < len(enc.payload) else (enc, classed.NAME)


def seal(version: int, ordinal: int, data: bytes, suffix: str, **entry: Any) -> SealedObject:
    """``data`` as object ``ordinal`` of ``version`` under its content-addressed key."""
    sha = hashlib.sha256(data).hexdigest()
    return SealedObject(Segment(object_key(version, ordinal, sha, suffix), len(data), sha, **entry), data)


@dataclass(slots=True)
class DeltaBuilder:
    version: int
    specs: tuple[TensorSpec, ...]
    segment_bytes: int = 4 << 20
    level: int = frames.DEFAULT_LEVEL
    first_ordinal: int = 0
    """Ordinal (in the key) of the first sealed segment."""
    ordinal_step: int = 1
    """Ordinal increment between segments: a sharded publisher's rank r of W numbers its segments
    r, r + W, r + 2W, ... so keys from different ranks of one version never collide."""
    use_classed: bool = True
    """Code float blocks with the ``classed`` codec where it is smaller; False: ``sparse`` only
    (what a run of the format before aurora/3 holds)."""
    changes: list[Change] = field(default_factory=list)
    _index: dict[str, int] = field(default_factory=dict)
    _parts: list[bytes] = field(default_factory=list)
    _blocks: list[Block] = field(default_factory=list)
    _fill: int = 0
    _sealed: int = 0
    _sealed_bytes: int = 0

    def __post_init__(self) -> None:
        self._index = {s.name: i for i, s in enumerate(self.specs)}

    @property
    def encoded_bytes(self) -> int:
        """Bytes of every block encoded so far (sealed or not)."""
        return self._sealed_bytes + self._fill

    @property
    def changed(self) -> int:
        return sum(int(c.positions.size) for c in self.changes)

    def add_tensor(self, spec: TensorSpec, old: np.ndarray, new: np.ndarray, start: int = 0) -> Iterator[SealedObject]:
        """Diff one tensor (flat word arrays) and yield any segments this fills.

        ``old`` and ``new`` may be a slice of the tensor, flat elements [start, start + len(new))
        (a rank's shard): the blocks then tile that range only, and ``changes`` hold flat positions
        in the whole tensor."""
        if start < 0 or old.size != new.size or start + new.size > spec.numel:
            raise StoreError(f"{spec.name}: elements [{start}, {start + new.size}) are not inside [0, {spec.numel})")
        t = self._index[spec.name]
        dt = dtypes.dtype(spec.dtype)
        if not dt.sparse:
            positions = sparse.changed_positions(old, new)
            if positions.size:
                self.changes.append(Change(spec.name, positions + start, old[positions], new[positions]))
                yield from self._add_dense(t, spec, new, start)
            return
        ex = classes.extract(old, new, dt.exponent)
        yield from self.add_extracted(spec, ex, new.size, start, lambda lo, hi: classes.sizes(old[lo:hi], dt.exponent))

    def add_extracted(
        self, spec: TensorSpec, ex: classes.Extracted, size: int, start: int, sizes: ClassSizes
    ) -> Iterator[SealedObject]:
        """:meth:`add_tensor` of a float tensor whose changes were extracted elsewhere (on the
        weights' device): ``ex`` relative to ``start``, over ``size`` elements; ``sizes(lo, hi)``
        counts the elements of each class in ``[lo, hi)`` of the old words (relative to ``start``),
        which only a tensor that spans several blocks asks for."""
        dt = dtypes.dtype(spec.dtype)
        if not dt.sparse or start < 0 or start + size > spec.numel:
            raise StoreError(
                f"{spec.name}: {size} extracted elements at {start} of a {spec.dtype} tensor of {spec.numel}"
            )
        if ex.positions.size == 0:
            return
        self.changes.append(Change(spec.name, ex.positions + start, ex.old, ex.new))
        yield from self._add_sparse(self._index[spec.name], dt.exponent, ex, sizes, start, size)

    def _add_sparse(
        self, t: int, exponent: Exponent, ex: classes.Extracted, sizes: ClassSizes, base: int, size: int
    ) -> Iterator[SealedObject]:
        """Blocks tiling [base, base + size), ``ex`` the changes relative to ``base``; each block holds
        at most ``segment_bytes`` changes."""
        per_block = max(1, self.segment_bytes)
        positions = ex.positions
        start = 0
        before = np.zeros(1 << exponent.bits, np.int64)  # class sizes in [0, start): ranks count from start
        for lo in range(0, positions.size, per_block):
            cut = slice(lo, lo + per_block)
            chunk = positions[cut]
            stop = size if lo + per_block >= positions.size else int(chunk[-1]) + 1
            ranks = ex.ranks[cut] - before[ex.classes[cut]] if start else ex.ranks[cut]
            part = classes.Extracted(chunk - start, ex.classes[cut], ranks, ex.old[cut], ex.new[cut])
            classed_ok = self.use_classed and exponent.bits > 0  # the classed codec classes by exponent (INT8 has none)
            enc, name = code_block(part, exponent, stop - start, self.level, classed_ok=classed_ok)
            yield from self._append(enc, t, base + start, base + stop, name)
            if stop < size:
                before += sizes(start, stop)  # only a tensor that spans blocks pays this
            start = stop

    def _add_dense(self, t: int, spec: TensorSpec, new: np.ndarray, base: int) -> Iterator[SealedObject]:
        per_block = max(1, self.segment_bytes // spec.width)
        for start in range(0, new.size, per_block):
            stop = min(new.size, start + per_block)
            yield from self._append(dense.encode(new[start:stop], self.level), t, base + start, base + stop, dense.NAME)

    def _append(self, enc: Encoded, t: int, start: int, stop: int, codec: str) -> Iterator[SealedObject]:
        if self._fill and self._fill + len(enc.payload) > self.segment_bytes:
            yield self._seal()
        self._blocks.append(Block(t, start, stop, codec, self._fill, len(enc.payload), enc.header))
        self._parts.append(enc.payload)
        self._fill += len(enc.payload)
        if self._fill >= self.segment_bytes:
            yield self._seal()

    def _seal(self) -> SealedObject:
        ordinal = self.first_ordinal + self._sealed * self.ordinal_step
        obj = seal(self.version, ordinal, b"".join(self._parts), "seg", blocks=tuple(self._blocks))
        self._parts, self._blocks, self._fill = [], [], 0
        self._sealed += 1
        self._sealed_bytes += obj.entry.size
        return obj

    def digest_change(self) -> Digest:
        """What the changes so far add to the parent's weights digest (digests are additive)."""
        change = Digest()
        specs = {s.name: s for s in self.specs}
        for c in self.changes:
            s = specs[c.name]
            change.update(tensor_keys(s.name, s.dtype, s.shape), c.positions, c.old, c.new)
        return change

    def finish(self) -> Iterator[SealedObject]:
        if self._blocks:
            yield self._seal()
