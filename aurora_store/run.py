"""A run: the public face of the store (publish, materialize, versions).

``publish`` diffs a state dict against the last published bits (the one copy of the
model the publisher keeps), uploads immutable segments, and commits by writing the
manifest last with put-if-absent. ``materialize`` rebuilds any version bit-exact from
the nearest full version plus deltas, verifying every byte on the way.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from aurora_store import signing
from aurora_store.delta import DeltaBuilder, SealedObject
from aurora_store.errors import ConflictError, LayoutError, StoreError
from aurora_store.full import build_shards
from aurora_store.limits import Limits
from aurora_store.manifest import FILES_DIR, Manifest, Parent, Segment, Stats, TensorSpec, manifest_key
from aurora_store.objectstore import ObjectStore
from aurora_store.reader import Reader
from aurora_store.weights import WeightState, full_digest

if TYPE_CHECKING:
    import torch

log = logging.getLogger("aurora.store")


class Announcer(Protocol):
    """Where a publisher says what it has uploaded: segments before the manifest, then the commit."""

    def segment(self, version: int, entry: Segment) -> None: ...

    def commit(self, manifest: Manifest) -> None: ...


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """What one publish committed."""

    version: int
    kind: str
    bytes: int
    changed: int
    elements: int
    version_hash: str
    weights_digest: str
    segments: int
    seconds: float

    @property
    def density(self) -> float:
        return self.changed / self.elements if self.elements else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    full_every: int = 50
    """Every version that is a multiple of this is published full (version 0 always is)."""
    segment_bytes: int = 4 << 20
    """Target size of a delta segment: readers fetch and verify segments in parallel."""
    shard_bytes: int = 256 << 20
    """Target size of a full version's safetensors shard."""
    concurrency: int = 8
    """Parallel ranged GETs / uploads."""
    limits: Limits = field(default_factory=Limits)


class Run:
    """One run's versions under a store URI."""

    def __init__(
        self,
        uri: str,
        *,
        storage_options: dict[str, Any] | None = None,
        signing_key: Any = None,
        verify_key: Any = None,
        config: RunConfig | None = None,
    ) -> None:
        self.config = config or RunConfig()
        if self.config.full_every < 1:
            raise StoreError(f"full_every must be >= 1, got {self.config.full_every}")
        self.store = ObjectStore(uri, storage_options, concurrency=self.config.concurrency)
        self.signing_key = signing.load_signing_key(signing_key) if signing_key is not None else None
        vk = signing.load_verify_key(verify_key) if verify_key is not None else None
        self.reader = Reader(self.store, self.config.limits, vk)
        self._base: WeightState | None = None
        self._file_refs: dict[str, Segment] = {}
        self.announcer: Announcer | None = None
        """Told of each uploaded segment and each commit (cut-through relays listen to it)."""

    @property
    def uri(self) -> str:
        return self.store.uri

    # ------------------------------------------------------------ reading

    def versions(self) -> list[int]:
        """Committed versions, ascending."""
        return self.reader.versions()

    def latest(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def manifest(self, version: int) -> Manifest:
        return self.reader.manifest(version)

    def materialize_words(self, version: int | None = None) -> WeightState:
        """The verified bit patterns of ``version`` (latest when None), as word arrays."""
        if version is None:
            version = self.latest()
            if version is None:
                from aurora_store.errors import MissingError

                raise MissingError(f"{self.uri} has no committed versions")
        chain = self.reader.chain(version)
        state = self.reader.load_full(chain[0])
        for m in chain[1:]:
            self.reader.apply_delta(state, m)
        return state

    def materialize(self, version: int | None = None) -> dict[str, torch.Tensor]:
        """``version`` (latest when None) as a state dict, bit-exact and verified."""
        from aurora_store.tensors import from_words

        state = self.materialize_words(version)
        return {s.name: from_words(s, state.words[s.name]) for s in state.specs}

    # ------------------------------------------------------------ publishing

    def publish(
        self,
        state_dict: Mapping[str, torch.Tensor],
        *,
        kind: Literal["auto", "full", "delta"] = "auto",
        step: int | None = None,
        meta: Mapping[str, str] | None = None,
        version: int | None = None,
    ) -> VersionInfo:
        """Commit ``state_dict`` as the next version; full or delta as the policy decides.

        Raises ConflictError if another publisher committed a version since this one last
        published (the next call reloads and continues on top of it), or if ``version`` is
        given and is not the next version."""
        from aurora_store.tensors import to_words

        specs, words = to_words(state_dict)
        return self.publish_words(specs, words, kind=kind, step=step, meta=meta, version=version)

    def publish_words(
        self,
        specs: tuple[TensorSpec, ...],
        words: dict[str, np.ndarray],
        *,
        kind: Literal["auto", "full", "delta"] = "auto",
        step: int | None = None,
        meta: Mapping[str, str] | None = None,
        version: int | None = None,
    ) -> VersionInfo:
        """:meth:`publish` for callers that already hold bit patterns (flat little-endian word
        arrays, as :func:`aurora_store.tensors.to_words` makes them): benchmarks, sharded ranks."""
        if kind not in ("auto", "full", "delta"):
            raise StoreError(f"kind must be 'auto', 'full' or 'delta', got {kind!r}")
        t0 = time.perf_counter()
        base = self._baseline()
        nxt = 0 if base is None else base.version + 1
        if version is not None and version != nxt:
            raise ConflictError(f"{self.uri}: asked to publish version {version}, but the next version is {nxt}")
        version = nxt
        layout_changed = base is not None and base.specs != specs
        if layout_changed and kind != "full":
            raise LayoutError(_layout_message(base.specs if base else (), specs, version))
        if kind == "delta" and base is None:
            raise LayoutError("version 0 must be full; the first publish of a run cannot be a delta")
        chain_bytes = 0 if base is None else self._chain_bytes(base.version)
        full_bytes = sum(s.numel * s.width for s in specs)
        full = base is None or kind == "full" or (kind == "auto" and version % self.config.full_every == 0)
        builder = None
        entries: list[Segment] = []
        if not full:
            assert base is not None
            builder, entries = self._stream_delta(version, specs, base, words, kind, chain_bytes, full_bytes)
            full = builder is None
        if full:
            # shards are uploaded as they are built: never a second copy of the model in memory
            for obj in build_shards(version, specs, words, self.config.shard_bytes):
                self.upload(version, obj)
                entries.append(obj.entry)
            digest = full_digest(specs, words)
            changed = _count_changed(base, specs, words)
        else:
            assert base is not None and builder is not None
            digest = base.digest.copy()
            for c in builder.changes:
                digest.update(base.keys(c.name), c.positions, c.old, c.new)
            changed = builder.changed
        segments = tuple(entries[:-1]) if full else tuple(entries)
        info = self.commit(
            version,
            specs,
            parent=None if base is None else Parent(base.version, base.version_hash),
            segments=segments,
            index=entries[-1] if full else None,
            changed=changed,
            weights_digest=digest.hex(),
            chain_bytes=chain_bytes,
            step=step,
            meta=meta,
            started=t0,
        )
        self._advance(base, info, specs, words, builder, digest)
        return info

    def upload(self, version: int, obj: SealedObject) -> None:
        """Put one object of ``version`` (put-if-absent; a retry with the same bytes is a success)
        and announce it: for publishers that build segments themselves (sharded ranks)."""
        self._upload(obj)
        self._announce("segment", version, obj.entry)

    def commit(
        self,
        version: int,
        specs: tuple[TensorSpec, ...],
        *,
        parent: Parent | None,
        segments: tuple[Segment, ...],
        index: Segment | None,
        changed: int,
        weights_digest: str,
        chain_bytes: int,
        step: int | None = None,
        meta: Mapping[str, str] | None = None,
        started: float | None = None,
        check: bool = False,
    ) -> VersionInfo:
        """Write the manifest of ``version`` whose objects are all uploaded: the commit.

        A full version when ``index`` is given, else a delta. ``chain_bytes`` is the parent's
        (0 when it is full). With ``check`` the manifest is parsed back with the readers' rules
        before it is written (for manifests assembled from other processes' entries). Raises
        ConflictError if the version is already committed."""
        t0 = time.perf_counter() if started is None else started
        full = index is not None
        objects = segments + ((index,) if index is not None else ())
        nbytes = sum(e.size for e in objects)
        m = Manifest(
            version=version,
            kind="full" if full else "delta",
            parent=parent,
            created=datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            step=step,
            tensors=specs,
            segments=segments,
            index=index,
            stats=Stats(
                sum(s.numel for s in specs),
                changed,
                nbytes,
                0 if full else chain_bytes + nbytes,
                sum(s.numel * s.width for s in specs),
            ),
            weights_digest=weights_digest,
            meta=dict(meta or {}),
            files=self._attached_files(),
        )
        m = _seal(m, self.signing_key)
        data = m.to_bytes()
        if check:
            Manifest.from_bytes(
                data,
                expect_version=version,
                max_bytes=self.config.limits.max_manifest_bytes,
                max_segment_bytes=self.config.limits.max_segment_bytes,
                what=f"{self.store.url(manifest_key(version))} (before commit)",
            )
        if not self.store.put_if_absent(manifest_key(version), data):
            self._base = None
            raise ConflictError(
                f"{self.store.url(manifest_key(version))}: version {version} was committed by "
                "another publisher; reload and publish again"
            )
        self._announce("commit", m)
        return VersionInfo(
            version,
            m.kind,
            nbytes,
            changed,
            m.stats.elements,
            m.version_hash,
            m.weights_digest,
            len(objects),
            time.perf_counter() - t0,
        )

    # ------------------------------------------------------------ internals

    def _stream_delta(
        self,
        version: int,
        specs: tuple[TensorSpec, ...],
        base: WeightState,
        words: dict[str, np.ndarray],
        kind: str,
        chain_bytes: int,
        full_bytes: int,
    ) -> tuple[DeltaBuilder | None, list[Segment]]:
        """Cut-through: each sealed segment uploads (and is announced) on a worker while
        extraction goes on, so a delta costs about max(extract, upload), not their sum.

        Returns (None, []) when the auto policy finds mid-way that the chain would outgrow a
        full copy; segments already uploaded then belong to no manifest and are ignored."""
        builder = DeltaBuilder(version, specs, self.config.segment_bytes)
        pending: list[Future[None]] = []
        entries: list[Segment] = []

        def submit(obj: SealedObject) -> None:
            entries.append(obj.entry)
            pending.append(self.store.pool.submit(self.upload, version, obj))

        abandoned = False
        try:
            for s in specs:
                for obj in builder.add_tensor(s, base.words[s.name], words[s.name]):
                    submit(obj)
                if kind == "auto" and chain_bytes + builder.encoded_bytes > full_bytes:
                    abandoned = True
                    break
            if not abandoned:
                for obj in builder.finish():
                    submit(obj)
        finally:
            for f in pending:
                f.result()  # re-raises the first upload error
        return (None, []) if abandoned else (builder, entries)

    def _announce(self, what: str, *args: Any) -> None:
        """Best effort: coordination never blocks or fails a publish. Relays and actors that miss
        an announcement find the version by scanning the buckets."""
        if self.announcer is None:
            return
        try:
            getattr(self.announcer, what)(*args)
        except StoreError as exc:
            log.warning("%s: could not announce %s: %s", self.uri, what, exc)

    def _upload(self, obj: SealedObject) -> None:
        sha = obj.entry.sha256

        def same(existing: bytes) -> bool:
            return hashlib.sha256(existing).hexdigest() == sha

        self.store.put_immutable(obj.entry.key, obj.data, verify=same)

    def _attached_files(self) -> tuple[Segment, ...]:
        """Size and SHA-256 of every attachment, for the manifest; each file is hashed once per publisher."""
        from aurora_store.attachments import MAX_BYTES, list_attachments

        refs = []
        for name in list_attachments(self):
            key = f"{FILES_DIR}/{name}"
            ref = self._file_refs.get(key)
            if ref is None:
                data = self.store.get(key, max_bytes=MAX_BYTES)
                ref = self._file_refs[key] = Segment(key, len(data), hashlib.sha256(data).hexdigest())
            refs.append(ref)
        return tuple(refs)

    def _baseline(self) -> WeightState | None:
        """The last committed version's bits: kept in memory, rebuilt from the store when stale.

        A publisher that holds its baseline checks one key (the next manifest) rather than
        listing the run, so a publish costs the same at version 10 and at version 100,000."""
        if self._base is not None:
            nxt = self._base.version + 1
            if self.store.exists(manifest_key(nxt)):
                self._base = None
                raise ConflictError(
                    f"{self.uri}: version {nxt} was committed by another publisher since this one "
                    "published; publish again to continue on top of it"
                )
            return self._base
        latest = self.latest()
        if latest is None:
            return None
        self._base = self.materialize_words(latest)
        return self._base

    def _chain_bytes(self, version: int) -> int:
        m = self.reader.manifest(version)
        return 0 if m.kind == "full" else m.stats.chain_bytes

    def _advance(
        self,
        base: WeightState | None,
        info: VersionInfo,
        specs: tuple[TensorSpec, ...],
        words: dict[str, np.ndarray],
        builder: DeltaBuilder | None,
        digest: Any,
    ) -> None:
        if builder is None or base is None:
            self._base = WeightState(specs, {s.name: np.array(words[s.name], copy=True) for s in specs})
        else:
            for c in builder.changes:
                base.words[c.name][c.positions] = c.new
            self._base = base
        self._base.version, self._base.version_hash, self._base.digest = info.version, info.version_hash, digest

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seal(m: Manifest, key: Any) -> Manifest:
    import dataclasses

    m = dataclasses.replace(m, version_hash=m.compute_hash())
    if key is not None:
        m = dataclasses.replace(m, signature=signing.sign(m.version_hash, key))
    return m


def _count_changed(base: WeightState | None, specs: tuple[TensorSpec, ...], words: dict[str, np.ndarray]) -> int:
    if base is None or base.specs != specs:
        return sum(s.numel for s in specs)
    return sum(int(np.count_nonzero(base.words[s.name] != words[s.name])) for s in specs)


def _layout_message(old: Iterable[TensorSpec], new: Iterable[TensorSpec], version: int) -> str:
    a = {s.name: s for s in old}
    b = {s.name: s for s in new}
    diffs = [f"added {n!r}" for n in sorted(b.keys() - a.keys())]
    diffs += [f"removed {n!r}" for n in sorted(a.keys() - b.keys())]
    diffs += [
        f"{n!r} {a[n].dtype}{list(a[n].shape)} -> {b[n].dtype}{list(b[n].shape)}"
        for n in sorted(a.keys() & b.keys())
        if a[n] != b[n]
    ]
    return (
        f"version {version}: tensor layout changed since version {version - 1} ({'; '.join(diffs[:5])}"
        f"{'; ...' if len(diffs) > 5 else ''}); a delta cannot change names, shapes or dtypes: "
        "publish with kind='full' to start a new chain"
    )


def open_run(
    uri: str,
    *,
    storage_options: dict[str, Any] | None = None,
    signing_key: Any = None,
    verify_key: Any = None,
    full_every: int = 50,
    segment_bytes: int = 4 << 20,
    shard_bytes: int = 256 << 20,
    concurrency: int = 8,
    limits: Limits | None = None,
) -> Run:
    """Open (or start) the run stored under ``uri``, any fsspec URI."""
    cfg = RunConfig(
        full_every=full_every,
        segment_bytes=segment_bytes,
        shard_bytes=shard_bytes,
        concurrency=concurrency,
        limits=limits or Limits(),
    )
    return Run(uri, storage_options=storage_options, signing_key=signing_key, verify_key=verify_key, config=cfg)
