"""The pieces of a version one publisher makes: its part, its uploads, its baseline.

A version is published by one or more publishers (a process, or each rank of a sharded
trainer), each over the elements it owns: a *range* ``[lo, hi)`` of each flattened tensor it
publishes, the whole tensor for a single process. Each diffs its ranges against its
:class:`Baseline` (the bits it last published, the only copy of the model it keeps), uploads
sealed segments, and reports a :class:`Part`: the objects it wrote, the elements it changed and
its share of the additive weights digest. :mod:`~aurora_store.bucket.delta_part` and
:mod:`~aurora_store.bucket.full_part` build a rank's part of either kind;
:class:`~aurora_store.bucket.publisher.Publisher` drives them and turns the parts into the manifest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from aurora_store import codec
from aurora_store.bucket.announce import Announcements
from aurora_store.bucket.collective import Collective
from aurora_store.bucket.objectstore import ObjectStore, Staged
from aurora_store.bucket.plan import Latest
from aurora_store.bucket.run_config import RunConfig
from aurora_store.errors import StoreError, UnsupportedError
from aurora_store.format import dtypes
from aurora_store.format.delta import DeltaBuilder, SealedObject
from aurora_store.format.digest import Digest
from aurora_store.format.manifest import Block, Segment, TensorSpec, canonical

Words = Mapping[str, Any]
"""Tensor name -> its flat words: a little-endian numpy word array on the host, or a flat signed
integer tensor on the weights' device (``aurora_store.tensors.word_views``), which a delta is
then extracted on (:mod:`aurora_store.device`)."""
Ranges = Mapping[str, tuple[int, int]]
"""Tensor name -> the flat element range ``[lo, hi)`` a publisher owns (tensors it does not publish are absent)."""


def whole(specs: Iterable[TensorSpec]) -> dict[str, tuple[int, int]]:
    """Every element of every tensor: what a single-process publisher owns."""
    return {s.name: (0, s.numel) for s in specs if s.numel}


@dataclass(frozen=True, slots=True)
class Share:
    """What one publisher publishes of a model: the whole tensor table, and for each tensor it
    publishes part of, the flat element range ``[lo, hi)`` it owns and that range's words (host
    word arrays, or word tensors on the weights' device, where its deltas are then extracted)."""

    specs: tuple[TensorSpec, ...]
    ranges: dict[str, tuple[int, int]]
    words: dict[str, Any]

    @classmethod
    def whole(cls, specs: tuple[TensorSpec, ...], words: Mapping[str, Any]) -> Share:
        """Every element of every tensor: what a single process publishes."""
        ranges = whole(specs)
        missing = sorted(ranges.keys() - words.keys())
        if missing:
            raise StoreError(f"no words for tensor {missing[0]!r:.100} of the tensor table")
        return cls(specs, ranges, {k: words[k] for k in ranges})


@dataclass(frozen=True, slots=True)
class PartContext:
    """What building one rank's part needs besides the plan and the share: the store it writes to,
    where its uploads are announced, the run's sizes and limits, and the group of publishers."""

    store: ObjectStore
    announcements: Announcements
    config: RunConfig
    collective: Collective

    def uploads(self, version: int, *, max_pending: int | None = None, buffer: bool = False) -> Uploads:
        """Uploads of objects of ``version`` on the store's pool, each announced as it lands."""
        return Uploads(self.store, version, self.announcements, max_pending=max_pending, buffer=buffer)


def range_table(
    specs: tuple[TensorSpec, ...], ranges: list[dict[str, list[int]]]
) -> dict[str, list[tuple[int, int, int]]]:
    """Who owns which elements of each tensor: (rank, lo, hi), checked to tile [0, numel) exactly."""
    table: dict[str, list[tuple[int, int, int]]] = {s.name: [] for s in specs}
    for r, own in enumerate(ranges):
        for name, (lo, hi) in own.items():
            if name not in table:
                raise UnsupportedError(f"rank {r} publishes {name!r:.100}, which is not in the tensor table")
            table[name].append((r, lo, hi))
    for s in specs:
        pieces = table[s.name] = sorted(table[s.name], key=lambda p: p[1])
        end = 0
        for r, lo, hi in pieces:
            if lo != end:
                raise UnsupportedError(f"{s.name!r}: rank {r}'s shard starts at element {lo}, expected {end}")
            end = hi
        if end != s.numel:
            raise UnsupportedError(f"{s.name!r}: the ranks' shards cover {end} of {s.numel} elements")
    return table


@dataclass(slots=True)
class Part:
    """One publisher's share of a version."""

    entries: list[Segment]
    """The objects it uploaded: delta segments, or a full version's shards."""
    changed: int
    """Elements of its ranges that differ from the parent (all of them for a new chain)."""
    digest: Digest
    """Its share of the weights digest: a delta's change to the parent's, a full version's sum over its elements."""
    counted: bool = True
    """False when ``changed`` is unknown: a full version's part built without the parent's bits."""

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def to_dict(self) -> dict[str, Any]:
        """As JSON, for a rank to send rank 0 (no pickle crosses ranks)."""
        kind = "delta" if any(e.blocks for e in self.entries) else "full"
        return {
            "entries": [e.to_dict(kind) for e in self.entries],
            "changed": self.changed,
            "digest": self.digest.hex(),
            "counted": self.counted,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], specs: tuple[TensorSpec, ...]) -> Part:
        """The inverse of :meth:`to_dict`, block headers checked by their codecs (``specs``: the plan's)."""
        entries = []
        for e in d["entries"]:
            blocks = tuple(_block(b, specs) for b in e.get("blocks", ()))
            entries.append(
                Segment(e["key"], e["size"], e["sha256"], blocks=blocks, tensors=tuple(e.get("tensors", ())))
            )
        return cls(entries, int(d["changed"]), Digest.from_hex(d["digest"]), bool(d["counted"]))


def _block(b: Mapping[str, Any], specs: tuple[TensorSpec, ...]) -> Block:
    c = codec.get(b["codec"])
    if c is None:
        raise StoreError(f"a publisher's part names codec {b['codec']!r}, expected one of {codec.names()}")
    span = dtypes.dtype(specs[b["tensor"]].dtype).span(b["stop"] - b["start"])
    header = c.parse_header(b, length=b["length"], span=span, what="a publisher's part: block")
    return Block(b["tensor"], b["start"], b["stop"], c.name, b["offset"], b["length"], header)


@dataclass(slots=True)
class Baseline:
    """What a publisher last committed: that version's :class:`Latest`, and the words of its ranges then."""

    latest: Latest
    ranges: dict[str, tuple[int, int]]
    words: dict[str, Any]
    """Host word arrays, or device word tensors for a publisher that extracts on its device."""

    def fits(self, specs: tuple[TensorSpec, ...], ranges: Ranges) -> bool:
        """Whether it holds exactly these ranges of this tensor table (a delta can be taken against it)."""
        return self.latest.specs == specs and self.ranges == dict(ranges)

    def advance(self, latest: Latest, words: Words, builder: DeltaBuilder | None) -> None:
        """Move to the version just committed: a delta's changes in place, else a copy of ``words``."""
        if builder is None:
            self.words = {k: copy_words(v) for k, v in words.items()}
        else:
            for c in builder.changes:
                kept = self.words[c.name]
                at = c.positions - self.ranges[c.name][0]
                if isinstance(kept, np.ndarray):
                    kept[at] = c.new
                else:
                    from aurora_store import device

                    device.write(kept, at, c.new)
        self.latest = latest

    def beside(self, name: str, new: Any) -> Any:
        """The baseline's words of ``name`` where ``new`` lives: moved to its device (or the host) once,
        after a full version left them on the host, and kept there."""
        kept = self.words[name]
        if isinstance(new, np.ndarray) != isinstance(kept, np.ndarray):
            if isinstance(new, np.ndarray):
                kept = host(kept)
            else:
                from aurora_store.tensors import word_tensor  # torch: only for words that are tensors

                kept = word_tensor(kept).to(new.device).view(new.dtype)
            self.words[name] = kept
        return kept


def host(words: Any) -> np.ndarray:
    """Words on the host: a word array as it is, a device word tensor copied."""
    if isinstance(words, np.ndarray):
        return words
    from aurora_store.tensors import host_words  # torch: only for words that are tensors

    return host_words(words)


def copy_words(words: Any) -> Any:
    """A copy the caller may keep while ``words`` changes (on the same device)."""
    return np.array(words, copy=True) if isinstance(words, np.ndarray) else words.clone()


class Uploads:
    """The objects of one version uploading on a pool while the publisher goes on (cut-through).

    At most ``max_pending`` are in memory at once: submitting one more first waits for the
    oldest. With ``buffer`` nothing is uploaded until :meth:`release` (a delta that may yet turn
    into a full version; :meth:`drop` forgets it). :meth:`wait` returns their manifest entries in
    submission order, or raises the first upload's error after every upload has finished."""

    def __init__(
        self,
        store: ObjectStore,
        version: int,
        announcements: Announcements | None = None,
        *,
        max_pending: int | None = None,
        buffer: bool = False,
    ) -> None:
        self._store, self._version, self._announcements = store, version, announcements
        self._max = max_pending
        self._pending: list[Future[None]] = []
        self._entries: list[Segment] = []
        self._failure: BaseException | None = None
        self._buffered: list[SealedObject] | None = [] if buffer else None
        self.entry_bytes: list[int] = []
        """The bytes each delta object submitted adds to its manifest (its entry, canonical JSON)."""

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the objects buffered (0 once released)."""
        return sum(o.entry.size for o in self._buffered or ())

    def release(self) -> None:
        """Upload every object buffered, and from now on upload as they come."""
        buffered, self._buffered = self._buffered or [], None
        for obj in buffered:
            self._start(obj, None)

    def drop(self) -> None:
        """Forget the objects buffered: none of them was written."""
        if self._buffered is not None:
            self._buffered = []

    def submit(self, obj: SealedObject, staged: Staged | None = None) -> None:
        """Upload ``obj`` (whose bytes are already in ``staged``, when given)."""
        if obj.entry.blocks:
            self.entry_bytes.append(len(canonical(obj.entry.to_dict("delta"))))
        if self._buffered is not None:
            if staged is not None:
                raise StoreError(f"{obj.entry.key}: a staged write cannot be buffered")
            self._buffered.append(obj)
            return
        self._start(obj, staged)

    def _start(self, obj: SealedObject, staged: Staged | None) -> None:
        if self._max is not None:
            while sum(not f.done() for f in self._pending) >= self._max:
                self._settle(next(f for f in self._pending if not f.done()))
        self._entries.append(obj.entry)
        self._pending.append(self._store.pool.submit(self._upload, obj, staged))

    def _upload(self, obj: SealedObject, staged: Staged | None) -> None:
        """Put one object (put-if-absent; a retry with the same bytes is a success), then announce it."""
        try:
            sha = obj.entry.sha256
            verify = lambda b: hashlib.sha256(b).hexdigest() == sha  # noqa: E731
            self._store.put_immutable(obj.entry.key, obj.data, verify=verify, staged=staged)
            if self._announcements is not None:
                self._announcements.segment(self._version, obj.entry)
        finally:
            if staged is not None:
                staged.discard()  # a no-op once linked; after a failure, no temporary file is left

    def _settle(self, f: Future[None]) -> None:
        exc = f.exception()
        if exc is not None and self._failure is None:
            self._failure = exc

    def wait(self) -> list[Segment]:
        for f in self._pending:
            self._settle(f)
        self._pending = []
        if self._failure is not None:
            raise self._failure
        return list(self._entries)
