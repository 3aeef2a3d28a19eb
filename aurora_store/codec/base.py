"""What every block codec provides. Codecs turn arrays into bytes and back; they never see a
store, a manifest or a tensor name, only a block's span and its header.

A block's header is the codec's own frozen dataclass (its fields are the block's entries in the
manifest besides ``tensor``, ``start``, ``stop``, ``codec``, ``offset`` and ``length``); the
manifest parser hands those entries to :meth:`Codec.parse_header`, which checks them as hostile
input. Every header has a ``count`` of coded elements.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

import numpy as np

from aurora_store.errors import CorruptError


@dataclass(frozen=True, slots=True)
class Exponent:
    """Where a dtype keeps its exponent: ``(word >> shift) & ((1 << bits) - 1)``; bits 0: none."""

    shift: int
    bits: int

    def of(self, words: np.ndarray) -> np.ndarray:
        return ((words >> words.dtype.type(self.shift)) & words.dtype.type((1 << self.bits) - 1)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Span:
    """The element range a block codes, as its codec sees it."""

    elements: int
    """Elements in the range (``stop - start``)."""
    width: int
    """Bytes per element word."""
    exponent: Exponent
    """The exponent field of the element type (``bits == 0`` when it has none)."""


class Header(Protocol):
    @property
    def count(self) -> int:
        """Elements the block codes."""
        ...


@dataclass(frozen=True, slots=True)
class Encoded:
    """A block's payload and the header a reader needs to decode it."""

    payload: bytes
    header: Any


@dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded block: block-relative positions with word deltas (``delta``) or new words (``words``)."""

    positions: np.ndarray
    delta: np.ndarray | None
    words: np.ndarray | None


@dataclass(frozen=True, slots=True)
class Lookup:
    """A classed block's ranks by class, to be turned into positions in its range: ``counts[i]``
    ranks of class ``present[i]`` (ascending ids), each class's strictly increasing."""

    exponent: Exponent
    present: np.ndarray
    counts: np.ndarray
    ranks: np.ndarray
    what: str
    """The block, for errors."""


Overlay = tuple[np.ndarray, np.ndarray]
"""Words laid over a range before a lookup: (range-relative positions, their words)."""


class Words(Protocol):
    """The words of named flat tensors at one version, wherever they live (host arrays, device
    tensors, staged changes over either): what a delta is decoded against and applied to. One
    protocol from the codec up to the live engine weights; implementations are
    :class:`aurora_store.codec.words.HostWords`, :class:`aurora_store.device.TensorWords`,
    ``actor.staging.Staging`` and each engine's live weights."""

    def at(self, name: str, index: np.ndarray) -> np.ndarray:
        """Little-endian words of tensor ``name`` at flat positions ``index`` (sorted, unique)."""
        ...

    def locate(self, name: str, lo: int, hi: int, lookup: Lookup, over: Overlay | None = None) -> Overlay:
        """The classed codec's lookup (:func:`aurora_store.codec.classes.locate`) over flat positions
        ``[lo, hi)`` of tensor ``name`` with ``over`` laid over that range, run where the words live."""
        ...


@dataclass(frozen=True, slots=True)
class BlockWords:
    """The parent words over one block's range ``[start, stop)`` of tensor ``name``, as a codec reads
    them: positions are block-relative."""

    words: Words
    name: str
    start: int
    stop: int

    def at(self, positions: np.ndarray) -> np.ndarray:
        return self.words.at(self.name, positions + self.start)

    def locate(self, lookup: Lookup) -> tuple[np.ndarray, np.ndarray]:
        return self.words.locate(self.name, self.start, self.stop, lookup)


class Codec(ABC):
    """A block codec, registered by :attr:`name` in :mod:`aurora_store.codec`."""

    name: ClassVar[str]
    fields: ClassVar[frozenset[str]]
    """The header's entries in a manifest block."""
    sparse_only: ClassVar[bool] = False
    """Only for element types the trainer updates by small steps (floats)."""

    @abstractmethod
    def parse_header(self, doc: Mapping[str, Any], *, length: int, span: Span, what: str) -> Any:
        """The header from a manifest block's entries (``fields`` exactly), checked; CorruptError if not."""

    @abstractmethod
    def header_dict(self, header: Any) -> dict[str, Any]:
        """The manifest entries of ``header`` (inverse of :meth:`parse_header`)."""

    @abstractmethod
    def decoded_bytes(self, header: Any, span: Span) -> int:
        """Bytes decoding would allocate: checked against a cap before any decompression."""

    @abstractmethod
    def decode(self, payload: bytes | memoryview, header: Any, span: Span, parent: BlockWords, what: str) -> Decoded:
        """Decode one block; every length is checked before anything is allocated."""


def stream_lengths(doc: Mapping[str, Any], n: int, length: int, what: str) -> tuple[int, ...]:
    """Entry ``streams`` of a hostile header: ``n`` byte lengths that tile a ``length``-byte payload."""
    streams = doc.get("streams")
    if not isinstance(streams, list):
        raise CorruptError(f"{what}.streams must be a list")
    lengths = tuple(int_field({"streams": x}, "streams", 0, length, what) for x in streams)
    if len(lengths) != n or sum(lengths) != length:
        raise CorruptError(f"{what}: streams {list(lengths)} do not tile {length} bytes")
    return lengths


def entries(header: Any) -> dict[str, Any]:
    """A header dataclass's manifest entries (tuples as lists): the inverse of a codec's ``parse_header``."""
    return {f.name: list(v) if isinstance(v, tuple) else v for f in fields(header) for v in [getattr(header, f.name)]}


def int_field(doc: Mapping[str, Any], name: str, lo: int, hi: int, what: str) -> int:
    """Entry ``name`` of a hostile header as an integer in ``[lo, hi]``."""
    v = doc.get(name)
    if type(v) is not int or not lo <= v <= hi:
        raise CorruptError(f"{what}.{name} must be an integer in [{lo}, {hi}], got {v!r}"[:300])
    return v
