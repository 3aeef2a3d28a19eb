"""Decoding a delta's blocks and applying them to word arrays, all or nothing. No I/O.

A block is decoded by the codec its manifest entry names, against the words the reader
holds before the version (their exponents split the sparse symbol streams and class the
classed codec's positions). The
decoded blocks of a version are applied only after the weights digest they would produce
matches the manifest, so a failed apply changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aurora_store import codec
from aurora_store.codec.base import BlockWords, Words
from aurora_store.codec.words import HostWords
from aurora_store.errors import ChainError, CorruptError, LimitError
from aurora_store.format import dtypes
from aurora_store.format.digest import Digest, tensor_keys
from aurora_store.format.manifest import Manifest, Segment
from aurora_store.format.weights import WeightState


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
    m: Manifest, seg: Segment, b_i: int, data: memoryview, url: str, max_decoded_bytes: int, old: Words
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
        data[b.offset : b.offset + b.length], b.header, span, BlockWords(old, spec.name, b.start, b.stop), what
    )
    return DecodedBlock(spec.name, got.positions + b.start, got.delta, got.words)


def changed_by(state: WeightState, blocks: list[DecodedBlock]) -> int:
    """Elements of ``state`` that applying ``blocks`` would change (a dense block may rewrite equal words)."""
    n = 0
    for blk in blocks:
        old = state.words[blk.name][blk.index]
        n += int(np.count_nonzero(old != blk.new_words(old)))
    return n


@dataclass(frozen=True, slots=True)
class Checked:
    """A version's decoded blocks with the words each writes, after their digest matched the manifest."""

    version: int
    version_hash: str
    digest: Digest
    """The weights digest at the version."""
    writes: list[tuple[str, np.ndarray, np.ndarray]]
    """(tensor, flat positions, new words) of each block."""
    olds: list[np.ndarray]
    """The words each block's write replaces (read from ``old``), in :attr:`writes`' order."""


def check(m: Manifest, blocks: list[DecodedBlock], old: Words, digest: Digest) -> Checked:
    """The first half of an all-or-nothing apply: the words ``blocks`` write over ``old`` (words at
    ``m``'s parent, whose weights digest is ``digest``) and the digest they produce, checked against
    ``m``'s; ChainError if it differs. Nothing is written: the caller writes :attr:`Checked.writes`."""
    specs = {t.name: t for t in m.tensors}
    digest = digest.copy()
    writes, olds = [], []
    for blk in blocks:
        was = old.at(blk.name, blk.index)
        new = blk.new_words(was)
        s = specs[blk.name]
        digest.update(tensor_keys(s.name, s.dtype, s.shape), blk.index, was, new)
        writes.append((blk.name, blk.index, new))
        olds.append(was)
    if digest.hex() != m.weights_digest:
        raise ChainError(
            f"version {m.version}: applying it gives weights digest {digest.hex()}, manifest says {m.weights_digest}"
        )
    return Checked(m.version, m.version_hash, digest, writes, olds)


def apply_blocks(state: WeightState, m: Manifest, blocks: list[DecodedBlock]) -> None:
    """Move host weights ``state`` to version ``m``: :func:`check`, then write; all or nothing."""
    done = check(m, blocks, HostWords(state.words), state.digest)
    for name, index, new in done.writes:
        state.words[name][index] = new
    state.version, state.version_hash, state.digest = done.version, done.version_hash, done.digest
