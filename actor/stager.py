"""Versions staged where the weights live: one rank's decode, check and safe-point write.

A :class:`Stager` holds the live weights of one rank (the torch engine's parameters in the actor's
own process, or a vLLM worker's, reached there by the worker ops of
:mod:`actor.engines.vllm.weights`) and stages versions against them. It is handed a delta's manifest
and its segments' verified bytes, and decodes them with the codec against those weights and what it
has already staged over them (:class:`~actor.staging.Staging`: the staged words laid over the live
ones), checks the weights digest the version would have, keeps the changed words and their write
prepared (O(changed)), and writes them in place when told to at the safe point. What goes in is the
version's bytes; what comes out is a digest and a count: nothing O(model) crosses, and no copy of the
model is made. A failed stage leaves the staging it extended, and the live weights, as they were.

The actor's :class:`~actor.updater.Updater` drives one ``Stager`` per rank through its live weights'
``stage_version`` / ``commit_staged`` / ``drop_staged`` (:class:`~actor.live.LiveWeights`), with the
handle :class:`Staged`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from actor.staging import Staging
from aurora_store.codec.base import Words
from aurora_store.errors import ChainError, CorruptError, StoreError
from aurora_store.format.blocks import DecodedBlock, decode_block
from aurora_store.format.digest import Digest, tensor_keys
from aurora_store.format.manifest import Manifest

MAX_DECODED_BYTES = 1 << 30
"""A block may decode to at most this many bytes (the readers' default cap)."""


@dataclass(frozen=True, slots=True)
class Base:
    """The version the live weights hold: where a staging chain starts."""

    version: int
    version_hash: str
    digest: str
    """Its weights digest (hex)."""


@dataclass(frozen=True, slots=True)
class Staged:
    """A version staged inside an engine, as the actor knows it: the engine keeps the changed words
    under ``token``; the actor keeps what it must check and report."""

    token: str
    base_version: int
    version: int
    version_hash: str
    digest: Digest
    changed: int
    """Elements that differ from the held version."""
    nbytes: int
    """What the engine holds for it (positions and words, on every rank)."""
    full: None = None
    """Never a full version (those take the host pass: :class:`~actor.staging.Staging`)."""

    @classmethod
    def answered(cls, token: str, base: Staged | Base, answer: Sequence[Any]) -> Staged:
        """The handle of what a :class:`Stager` staged under ``token`` on ``base``, from its answer
        (:meth:`Stager.stage`'s tuple, in process or read back from a worker)."""
        version, version_hash, digest, changed, nbytes = answer
        first = base.base_version if isinstance(base, Staged) else base.version
        return cls(
            token, first, int(version), str(version_hash), Digest.from_hex(str(digest)), int(changed), int(nbytes)
        )


class Writable(Words, Protocol):
    """What a stager needs of one rank's live weights: their words (to decode against) and an in-place
    write in two halves (:class:`~actor.live.TensorWeights` provides them)."""

    def prepare(
        self, changes: Mapping[str, tuple[np.ndarray, np.ndarray]], replaced: Mapping[str, np.ndarray] | None = None
    ) -> object:
        """Everything the write of ``changes`` (over the words ``replaced``, where known) needs; may fail."""
        ...

    def commit(self, prepared: object) -> None:
        """The write itself; must not fail."""
        ...


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="aurora-stage")
        return _POOL


class Stager:
    """Stages versions against one rank's live weights (:class:`~actor.live.TensorWeights`, which
    hold the rank's tensors under HF names: views of an engine's own parameters, or the
    parameters themselves) and writes them in place at the safe point."""

    def __init__(self, live: Writable, *, max_decoded_bytes: int = MAX_DECODED_BYTES) -> None:
        self.live = live
        self.max_decoded_bytes = max_decoded_bytes
        self._staged: dict[str, tuple[Staging, object, str]] = {}
        """token -> the staging, its write prepared, and the digest of the held version it starts from."""
        self._lock = threading.Lock()
        self._last: tuple[Staging, str] | None = None
        """What the last commit wrote, and the digest before it (for :meth:`readback`)."""
        self._keys: dict[str, tuple[str, str, tuple[int, ...]]] = {}
        """Each staged tensor's (name, dtype, shape), for its digest keys."""

    def stage(
        self, token: str, base: str | Base, m: Manifest, data: Sequence[bytes | memoryview]
    ) -> tuple[int, str, str, int, int]:
        """Stage delta ``m`` (its segments' verified bytes ``data``, in manifest order) on top of the
        staging ``base`` names or of the held version ``base``, under ``token``. Returns the version,
        its hash, its weights digest (hex), the elements changed since the held version and the bytes
        the staging holds. On any error nothing staged changes."""
        with self._lock:
            if isinstance(base, str):
                got = self._staged.get(base)
                if got is None:
                    raise StoreError(f"no version is staged here under {base!r} to stage version {m.version} on")
                work, start = got[0].extended(), got[2]
            else:
                start = base.digest
                work = Staging.empty(base.version, base.version_hash, Digest.from_hex(base.digest), live=self.live)
        if m.kind != "delta":
            raise StoreError(f"version {m.version} is a full version: it is loaded, not staged in place")
        if m.parent is None or (m.parent.version, m.parent.version_hash) != (work.version, work.version_hash):
            raise ChainError(f"version {m.version} does not follow version {work.version}, which it would be staged on")
        if len(data) != len(m.segments):
            raise CorruptError(f"version {m.version}: {len(data)} segments given, the manifest lists {len(m.segments)}")
        for seg, got_bytes in zip(m.segments, data, strict=True):
            if len(got_bytes) != seg.size:
                raise CorruptError(f"{seg.key}: {len(got_bytes)} bytes given, the manifest says {seg.size}")

        views = [memoryview(d) for d in data]
        jobs = [(i, b_i) for i, seg in enumerate(m.segments) for b_i in range(len(seg.blocks))]

        # blocks in parallel: the codec's kernels free the GIL (on 2 cores the Python between them kept it at 1x)
        def decode(job: tuple[int, int]) -> DecodedBlock:
            i, b_i = job
            return decode_block(m, m.segments[i], b_i, views[i], m.segments[i].key, self.max_decoded_bytes, work)

        blocks = list(_pool().map(decode, jobs))
        work.add_version(m, blocks)  # the digest check: raises before anything is kept
        self._keys.update((t.name, (t.name, t.dtype, t.shape)) for t in m.tensors if t.name in work.changes)
        prepared = self.live.prepare(work.changes, work.replaced)
        with self._lock:
            self._staged[token] = (work, prepared, start)
        return work.version, work.version_hash, work.digest.hex(), work.changed, work.nbytes

    def commit(self, token: str) -> list[str]:
        """Write what ``token`` staged into the live weights (the safe point); every other staging,
        made over the weights before it, is dropped. Returns the names of the tensors written."""
        with self._lock:
            got = self._staged.pop(token, None)
            if got is None:
                raise StoreError(f"no version is staged here under {token!r}")
            self._staged.clear()
        work, prepared, start = got
        self.live.commit(prepared)
        self._last = (work, start)
        return [name for name, (idx, _) in work.changes.items() if idx.size]

    def readback(self) -> str | None:
        """The weights digest the live weights have now, from the digest before the last commit and the
        words its positions hold now, read back here: O(changed). It equals the version's digest when
        every staged word landed (and nothing else moved those words). None before any commit, or where
        the words it replaced were not kept."""
        if self._last is None:
            return None
        work, start = self._last
        digest = Digest.from_hex(start)
        for name, (idx, _) in work.changes.items():
            replaced = work.replaced.get(name)
            if replaced is None or replaced.shape != idx.shape:
                return None  # not kept (never, for a staging over the live weights): the caller reads them all
            now = self.live.at(name, idx)
            digest.update(tensor_keys(*self._keys[name]), idx, replaced, now)
        return digest.hex()

    def drop(self, token: str) -> None:
        """Forget what ``token`` staged (nothing was written)."""
        with self._lock:
            self._staged.pop(token, None)

    def clear(self) -> None:
        """Forget everything staged, and the last commit (the live weights were overwritten)."""
        with self._lock:
            self._staged.clear()
            self._last = None

    @property
    def tokens(self) -> list[str]:
        with self._lock:
            return list(self._staged)
