"""A run: the public face of the store (publish, materialize, versions, attachments, state).

``publish`` diffs a state dict against the last published bits (the one copy of the
model the publisher keeps), uploads immutable segments, and commits by writing the
manifest last with put-if-absent. ``materialize`` rebuilds any version bit-exact from
the nearest full version plus deltas, verifying every byte on the way. Both single-process
and sharded publishing drive one :class:`~aurora_store.bucket.plan.PublishPlan`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from aurora_store.bucket.attachments import Attachments
from aurora_store.bucket.objectstore import ObjectStore, StagedWrite
from aurora_store.bucket.plan import (
    Kind,
    PublishPlan,
    Tip,
    VersionInfo,
    check_publish_args,
    committed_elsewhere,
    plan_next,
)
from aurora_store.bucket.publish import (
    Baseline,
    Part,
    Uploads,
    Words,
    copy_words,
    delta_part,
    elements_part,
    host,
    whole,
)
from aurora_store.bucket.reader import Reader
from aurora_store.bucket.run_config import RunConfig
from aurora_store.bucket.state import StateStore
from aurora_store.errors import AuroraError, ConflictError, MissingError, StoreError, UnauthenticatedError
from aurora_store.format import signing
from aurora_store.format.delta import DeltaBuilder, SealedObject
from aurora_store.format.digest import Digest
from aurora_store.format.full import build_index, build_shard, plan_shards, shard_words
from aurora_store.format.keys import manifest_key, version_dir
from aurora_store.format.manifest import Manifest, Segment, TensorSpec
from aurora_store.format.manifest_parser import parse_manifest
from aurora_store.format.weights import WeightState

if TYPE_CHECKING:
    import torch

log = logging.getLogger("aurora.store")


class Announcer(Protocol):
    """Where a publisher says what it has uploaded: segments before the manifest, then the commit."""

    def segment(self, version: int, entry: Segment) -> None: ...

    def commit(self, manifest: Manifest) -> None: ...


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
        if vk is None and self.signing_key is not None:  # a publisher reads its own signed run with its own key
            self.reader = Reader(self.store, self.config.limits, self.signing_key.public_key(), insist=False)
        else:
            self.reader = Reader(self.store, self.config.limits, vk)
        self.files = Attachments(self.store)
        """The run's attached files (config.json, tokenizer files)."""
        self.state = StateStore(self.store)
        """The trainer's saved states."""
        self.announcer: Announcer | None = None
        """Told of each uploaded segment and each commit (cut-through relays listen to it)."""
        self._base: Baseline | None = None

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
                raise MissingError(f"{self.uri} has no committed versions")
        chain = self.reader.chain(version)
        state = self.reader.load_full(chain[0])
        for m in chain[1:]:
            self.reader.apply_delta(state, m)
        return state

    def materialize(self, version: int | None = None) -> dict[str, torch.Tensor]:
        """``version`` (latest when None) as a state dict, bit-exact and verified."""
        from aurora_store.tensors import from_words  # torch loads only for callers that want tensors

        state = self.materialize_words(version)
        return {s.name: from_words(s, state.words[s.name]) for s in state.specs}

    # ------------------------------------------------------------ planning

    def tip(self, held: Tip | None = None) -> Tip | None:
        """The last committed version (None for an empty run). A publisher passes the tip it last
        committed: one key is checked instead of listing the run, so a publish costs the same at
        version 10 and at 100,000; if another publisher has committed since, ConflictError."""
        if held is not None:
            if self.store.exists(manifest_key(held.version + 1)):
                raise committed_elsewhere(self.store.url(manifest_key(held.version + 1)), held.version + 1)
            return held
        latest = self.latest()
        return None if latest is None else Tip.of(self.manifest(latest), self.reader.identity())

    def plan(
        self, specs: tuple[TensorSpec, ...], *, kind: str = "auto", version: int | None = None, held: Tip | None = None
    ) -> PublishPlan:
        """The plan of the next version with tensor table ``specs`` (see :func:`plan_next`)."""
        try:
            tip = self.tip(held)
        except UnauthenticatedError as exc:
            if self.signing_key is None and self.reader.verify_key is None:  # say what a publisher lacks
                raise UnauthenticatedError(
                    f"{self.uri}: the run is signed; publish with its key (--signing-key, AURORA_SIGNING_KEY)",
                    url=exc.url,
                ) from None
            raise
        return plan_next(
            tip,
            specs,
            kind=kind,
            full_every=self.config.full_every,
            version=version,
            url=self.uri,
            signer=self.signer,
        )

    @property
    def signer(self) -> str | None:
        """The key id this publisher signs with (None: it does not sign)."""
        return None if self.signing_key is None else signing.key_id(self.signing_key.public_key())

    def resume(self) -> Tip | None:
        """Hold the last committed version's bits as this publisher's baseline now (what a restarted
        trainer does before its first step), so the next publish diffs against it at once."""
        tip = self.tip()
        if tip is not None:
            state = self.materialize_words(tip.version)
            self._base = Baseline(tip, whole(state.specs), state.words)
        return tip

    # ------------------------------------------------------------ publishing

    def publish(
        self,
        state_dict: Mapping[str, torch.Tensor],
        *,
        kind: Kind = "auto",
        step: int | None = None,
        meta: Mapping[str, str] | None = None,
        version: int | None = None,
    ) -> VersionInfo:
        """Commit ``state_dict`` as the next version; full or delta as the policy decides.

        Raises ConflictError if another publisher committed a version since this one last
        published (the next call reloads and continues on top of it), or if ``version`` is
        given and is not the next version."""
        from aurora_store.tensors import host_words, word_views  # torch loads only for callers with tensors

        specs, views = word_views(state_dict)
        where = self.config.extract
        if where == "device" or (where == "auto" and any(v.device.type != "cpu" for v in views.values())):
            words: dict[str, Any] = dict(views)
        else:
            words = {k: host_words(v) for k, v in views.items()}
        return self.publish_words(specs, words, kind=kind, step=step, meta=meta, version=version)

    def publish_words(
        self,
        specs: tuple[TensorSpec, ...],
        words: Words,
        *,
        kind: Kind = "auto",
        step: int | None = None,
        meta: Mapping[str, str] | None = None,
        version: int | None = None,
    ) -> VersionInfo:
        """:meth:`publish` for callers that already hold bit patterns (flat little-endian word
        arrays, as :func:`aurora_store.tensors.to_words` makes them, or flat word tensors on a
        device, whose deltas are then extracted there): benchmarks, sharded ranks."""
        t0 = time.perf_counter()
        step, meta = check_publish_args(step, meta)
        try:
            plan = self.plan(specs, kind=kind, version=version, held=self._base.tip if self._base else None)
        except ConflictError:
            self._base = None
            raise
        base = self._baseline(plan)
        ranges = whole(specs)
        part: Part | None = None
        builder: DeltaBuilder | None = None
        if not plan.full:
            assert base is not None
            made = delta_part(
                plan,
                base,
                words,
                self.uploads(plan.version),
                segment_bytes=self.config.segment_bytes,
                classed=self.config.codec == "classed",
                may_abandon=plan.kind == "auto",
            )
            if made is None:
                plan = plan.as_full()
            else:
                part, builder = made
        held: dict[str, np.ndarray] | None = None
        if part is None:
            part, held = self._full_part(plan, {k: host(v) for k, v in words.items()}, base)
        info = self.commit(plan, [part], step=step, meta=meta, started=t0)
        tip = plan.tip_after(info)
        if held is not None:
            self._base = Baseline(tip, dict(ranges), {k: held[k] for k in ranges})
        elif base is not None and base.fits(specs, ranges):
            base.advance(tip, words, builder)
            self._base = base
        else:
            self._base = Baseline(tip, dict(ranges), {k: copy_words(words[k]) for k in ranges})
        return info

    def _full_part(
        self, plan: PublishPlan, words: Mapping[str, np.ndarray], base: Baseline | None
    ) -> tuple[Part, dict[str, np.ndarray]]:
        """Build the shards of a full version one after another, each uploading while the next is built,
        with the weights digest computed beside them. Returns the part and views of every tensor in
        the shards' buffers: the next baseline, so the model is copied once, into the shards (and
        uploads in flight hold no bytes of their own)."""
        ranges = whole(plan.specs)
        counting = self.store.pool.submit(elements_part, plan.specs, ranges, words, base)
        uploads = self.uploads(plan.version)
        held: dict[str, np.ndarray] = {}
        for g, members in enumerate(plan_shards(plan.specs, self.config.shard_bytes)):
            held.update(shard_words(self.put_shard(uploads, plan, g, members, words)))
        entries = uploads.wait()
        changed, digest = counting.result()
        return Part(entries, changed, digest), held

    def uploads(self, version: int, *, max_pending: int | None = None) -> Uploads:
        """Cut-through uploads of objects of ``version`` on the store's pool, each announced as it lands."""
        return Uploads(
            self.store.pool, lambda obj, staged: self.upload(version, obj, staged=staged), max_pending=max_pending
        )

    def upload(self, version: int, obj: SealedObject, *, staged: StagedWrite | None = None) -> None:
        """Put one object of the version being published (put-if-absent; a retry with the same bytes
        is a success) and announce it: for publishers that build objects themselves (sharded ranks)."""
        sha = obj.entry.sha256
        verify = lambda b: hashlib.sha256(b).hexdigest() == sha  # noqa: E731
        self.store.put_immutable(obj.entry.key, obj.data, verify=verify, staged=staged)
        self._announce("segment", version, obj.entry)

    def put_shard(
        self,
        uploads: Uploads,
        plan: PublishPlan,
        ordinal: int,
        members: list[TensorSpec],
        words: Mapping[str, np.ndarray],
    ) -> SealedObject:
        """Build shard ``ordinal`` of full version ``plan`` and submit it to ``uploads``. On a local
        store its bytes are written while it is being hashed, and only linked under its key here."""
        staged = self.store.stage(version_dir(plan.version))
        try:
            shard = build_shard(
                plan.version, ordinal, plan.specs, members, words, sink=staged.write if staged else None
            )
        except BaseException:
            if staged is not None:
                staged.discard()
            raise
        uploads.submit(shard, staged)
        return shard

    def commit(
        self,
        plan: PublishPlan,
        parts: list[Part],
        *,
        step: int | None = None,
        meta: Mapping[str, str] | None = None,
        started: float | None = None,
    ) -> VersionInfo:
        """Write the manifest of ``plan``'s version from every publisher's part: the commit.

        Delta segments keep the order of ``parts``; a full version's shards are ordered by their
        first tensor and its index is built and uploaded here. The manifest is parsed back with
        the readers' rules before it is written. ConflictError if the version is already committed."""
        t0 = time.perf_counter() if started is None else started
        step, meta = check_publish_args(step, meta)
        entries = [e for p in parts for e in p.entries]
        digest = Digest() if plan.full or plan.parent is None else Digest.from_hex(plan.parent.weights_digest)
        for p in parts:
            digest.add(p.digest)
        index = None
        if plan.full:
            entries.sort(key=lambda e: e.tensors[0] if e.tensors else -1)
            obj = build_index(plan.version, plan.specs, entries)
            self.upload(plan.version, obj)
            index = obj.entry
        m = plan.manifest(
            segments=tuple(entries),
            index=index,
            changed=sum(p.changed for p in parts),
            weights_digest=digest.hex(),
            files=self.files.refs(),
            step=step,
            meta=meta,
        )
        m = signing.seal(m, self.signing_key)
        data = m.to_bytes()
        key = manifest_key(plan.version)
        lim = self.config.limits
        parse_manifest(
            data,
            expect_version=plan.version,
            max_bytes=lim.max_manifest_bytes,
            max_segment_bytes=lim.max_segment_bytes,
            what=f"{self.store.url(key)} (before commit)",
        )
        if not self.store.put_if_absent(key, data):
            self._base = None
            raise committed_elsewhere(self.store.url(key), plan.version)
        self._announce("commit", m)
        return VersionInfo.of(m, time.perf_counter() - t0)

    # ------------------------------------------------------------ internals

    def _baseline(self, plan: PublishPlan) -> Baseline | None:
        """The bits of ``plan``'s parent: those this publisher holds, else materialized from the store."""
        if plan.parent is None or (plan.full and not plan.same_layout):
            return None  # nothing to diff against or count changes from
        if self._base is not None and self._base.tip == plan.parent:
            return self._base
        state = self.materialize_words(plan.parent.version)
        return Baseline(plan.parent, whole(state.specs), state.words)

    def _announce(self, what: str, *args: Any) -> None:
        """Best effort: coordination never blocks or fails a publish. Relays and actors that miss
        an announcement find the version by scanning the buckets."""
        if self.announcer is None:
            return
        try:
            getattr(self.announcer, what)(*args)
        except AuroraError as exc:  # a coordination failure: the bucket is the truth, announcing is a hint
            log.warning("%s: could not announce %s: %s", self.uri, what, exc)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_run(
    uri: str,
    *,
    storage_options: dict[str, Any] | None = None,
    signing_key: Any = None,
    verify_key: Any = None,
    **config: Any,
) -> Run:
    """Open (or start) the run stored under ``uri``, any fsspec URI; ``config`` fields are
    :class:`RunConfig`'s (``full_every``, ``segment_bytes``, ``shard_bytes``, ``concurrency``, ``limits``)."""
    return Run(
        uri, storage_options=storage_options, signing_key=signing_key, verify_key=verify_key, config=RunConfig(**config)
    )
