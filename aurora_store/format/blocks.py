"""Decoding a delta's blocks and applying them to word arrays, all or nothing. No I/O.

A block is decoded by the codec its manifest entry names, against the words the reader
holds before the version (their exponents split the sparse symbol streams and class the
classed codec's positions). The
decoded blocks of a version are applied only after the weights digest they would produce
matches the manifest, so a failed apply changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from aurora_store import codec
from aurora_store.codec.base import Lookup
from aurora_store.errors import ChainError, CorruptError, LimitError
from aurora_store.format import dtypes
from aurora_store.format.manifest import Manifest, Segment
from aurora_store.format.weights import WeightState


class OldWords(Protocol):
    """The words a reader holds before the version being decoded."""

    def old_at(self, name: str, index: np.ndarray) -> np.ndarray:
        """Words of tensor ``name`` at sorted flat positions ``index``."""
        ...

    def old_range(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Words of tensor ``name`` at flat positions ``[lo, hi)`` (a view where it can be)."""
        ...

    def old_locate(self, name: str, lo: int, hi: int, lookup: Lookup) -> tuple[np.ndarray, np.ndarray]:
        """The classed codec's lookup over flat positions ``[lo, hi)`` of tensor ``name``
        (``aurora_store.codec.classes.locate``), wherever those words live."""
        ...


@dataclass(frozen=True, slots=True)
class _BlockParent:
    """A codec's view of :class:`OldWords` over one block's range."""

    old: OldWords
    name: str
    start: int
    stop: int

    def at(self, positions: np.ndarray) -> np.ndarray:
        return self.old.old_at(self.name, positions + self.start)

    def words(self) -> np.ndarray:
        return self.old.old_range(self.name, self.start, self.stop)

    def locate(self, lookup: Lookup) -> tuple[np.ndarray, np.ndarray]:
        return self.old.old_locate(self.name, self.start, self.stop, lookup)


@dataclass(slots=True)
class DecodedBlock:
    name: str
    index: np.ndarray
    """Flat element positions."""
    delta: np.ndarray | None
    """Wrapping word deltas (sparse blocks) ..."""
    words: np.ndarray | None
    """... or the new words themselves (dense blocks)."""

    def new_words(self, old: np.ndarray) -> np.ndarray:
        """The block's words after the version, given the words ``old`` at :attr:`index` before it."""
        if self.delta is not None:
            return old + self.delta
        assert self.words is not None
        return self.words


def decode_block(
    m: Manifest, seg: Segment, b_i: int, data: memoryview, url: str, max_decoded_bytes: int, old: OldWords
) -> DecodedBlock:
    """Block ``b_i`` of segment ``seg`` (whose verified bytes are ``data``) of delta ``m``."""
    b = seg.blocks[b_i]
    spec = m.tensors[b.tensor]
    what = f"{url} block {b_i} ({spec.name}[{b.start}:{b.stop}])"
    c = codec.get(b.codec)
    if c is None:  # the parser admits registered codecs only
        raise CorruptError(f"{what}: unknown codec {b.codec!r}")
    span = dtypes.dtype(spec.dtype).span(b.stop - b.start)
    expands = c.decoded_bytes(b.header, span)
    if expands > max_decoded_bytes:
        raise LimitError(f"{what}: would decode to {expands} bytes, over the cap of {max_decoded_bytes}")
    got = c.decode(
        data[b.offset : b.offset + b.length], b.header, span, _BlockParent(old, spec.name, b.start, b.stop), what
    )
    return DecodedBlock(spec.name, got.positions + b.start, got.delta, got.words)


def changed_by(state: WeightState, blocks: list[DecodedBlock]) -> int:
    """Elements of ``state`` that applying ``blocks`` would change (a dense block may rewrite equal words)."""
    n = 0
    for blk in blocks:
        old = state.words[blk.name][blk.index]
        n += int(np.count_nonzero(old != blk.new_words(old)))
    return n


def apply_blocks(state: WeightState, m: Manifest, blocks: list[DecodedBlock]) -> None:
    """Check the digest the blocks would produce, then write them: all or nothing."""
    digest = state.digest.copy()
    news = []
    for blk in blocks:
        old = state.words[blk.name][blk.index]
        new = blk.new_words(old)
        digest.update(state.keys(blk.name), blk.index, old, new)
        news.append(new)
    if digest.hex() != m.weights_digest:
        raise ChainError(
            f"version {m.version}: applying it gives weights digest {digest.hex()}, manifest says {m.weights_digest}"
        )
    for blk, new in zip(blocks, news, strict=True):
        state.words[blk.name][blk.index] = new
    state.version, state.version_hash, state.digest = m.version, m.version_hash, digest
