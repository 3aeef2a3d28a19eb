"""Publishing a version: one object owns plan -> parts -> commit -> baseline.

A version is published by one process, or by every rank of a sharded trainer together; the
:class:`Publisher` is the same in both and only its :class:`Collective` differs (a local no-op,
or the trainer's torch collectives). Each publisher holds a :class:`Share` of the model: the
whole tensor table, and the flat element range of each tensor it owns with that range's words.

One publish, on every rank:

1. rank 0 plans the version (number, parent, full or delta: :func:`plan_next`) and every rank
   learns the plan and every rank's ranges (one gather);
2. a rank whose baseline is not the parent's bits receives them from rank 0, which loads the
   parent once;
3. a delta: every rank encodes its ranges against its baseline. A forced delta streams its
   segments as they are sealed (cut-through), and so does an ``auto`` one when the last delta
   says it will fit the chain budget with room to spare; otherwise it is held in memory until
   every rank's size is known (one gather of sizes), so nothing is written for a delta that is
   then abandoned for a full version. A streamed delta that outgrows the budget all the same (it
   grew :data:`STREAM_MARGIN` times since the last one) is published full and its segments removed;
4. a full version: shard g of ``plan_shards`` is assembled on rank g mod W, built and uploaded
   there, so the shards are byte for byte what one process writes;
5. rank 0 writes the manifest from every rank's :class:`~aurora_store.bucket.parts.Part` (the
   commit) and tells every rank the outcome; every rank moves its baseline.

A failure on any rank is reported through the next collective and raised on every rank (the
rank's own exception where it had one), so no rank waits forever. Control messages are JSON:
no pickle crosses ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from aurora_store import errors
from aurora_store.bucket.announce import Announcements
from aurora_store.bucket.attachments import Attachments
from aurora_store.bucket.collective import Collective, LocalCollective
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.parts import (
    Baseline,
    Part,
    Uploads,
    copy_words,
    elements_part,
    encode_delta,
    host,
    range_table,
    whole,
)
from aurora_store.bucket.plan import (
    KINDS,
    Kind,
    PublishPlan,
    Tip,
    VersionInfo,
    check_publish_args,
    committed_elsewhere,
    plan_next,
)
from aurora_store.bucket.reader import Reader
from aurora_store.bucket.run_config import RunConfig
from aurora_store.errors import (
    DAMAGE,
    ConflictError,
    CorruptError,
    LimitError,
    StoreError,
    UnauthenticatedError,
    UnsupportedError,
)
from aurora_store.format import signing
from aurora_store.format.delta import DeltaBuilder, SealedObject
from aurora_store.format.digest import Digest
from aurora_store.format.full import build_index, build_shard, plan_shards, shard_words
from aurora_store.format.keys import manifest_key, rotation_marker_key, version_dir
from aurora_store.format.manifest import Manifest, Rollback, Rotation, Segment, TensorSpec
from aurora_store.format.manifest_parser import parse_manifest

T = TypeVar("T")
log = logging.getLogger("aurora.store")
STREAM_MARGIN = 4
"""An ``auto`` delta streams (cut-through) when the chain plus this many times the last delta's
bytes stays within a full copy: a delta that grew more than that since the last one is the rare
case, and then its streamed segments are removed when it is published full instead."""


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


class Publisher:
    """Commits versions of a run: every publisher of one run in one group calls :meth:`publish`
    together (a single process is a group of one)."""

    def __init__(
        self,
        store: ObjectStore,
        reader: Reader,
        config: RunConfig,
        *,
        files: Attachments,
        announcements: Announcements,
        signing_key: Any = None,
        collective: Collective | None = None,
    ) -> None:
        self.store, self.reader, self.config = store, reader, config
        self.files, self.announcements, self.signing_key = files, announcements, signing_key
        self.collective: Collective = collective if collective is not None else LocalCollective()
        self.rotating: Any = None
        """The Ed25519 private key the next version rotates the run to (:meth:`rotate_to`), if any."""
        self._base: Baseline | None = None
        self._last_delta_bytes: int | None = None
        """Bytes of the last delta this publisher committed: what decides whether the next one streams."""
        self._held: _Held | None = None
        """A version published with ``hold=True``: everything written but its manifest."""
        self._markers_checked = False
        """Whether a key-rotation marker a killed predecessor left at the version this publisher commits
        without a rotation was looked for (once: this publisher writes a marker only with its rotation)."""
        self.on_refused: Callable[[BaseException], None] | None = None
        """Told of each object of the parent's chain that failed verification (rank 0), e.g. to count it
        in ``aurora_artifacts_rejected_total``: the publish went on as a full version."""

    def on(self, collective: Collective) -> Publisher:
        """A publisher of the same run in ``collective``'s group, with a baseline of its own."""
        p = Publisher(
            self.store,
            self.reader,
            self.config,
            files=self.files,
            announcements=self.announcements,
            signing_key=self.signing_key,
            collective=collective,
        )
        p.rotating, p.on_refused = self.rotating, self.on_refused
        return p

    @property
    def signer(self) -> str | None:
        """The key id this publisher signs with (None: it does not sign)."""
        return None if self.signing_key is None else signing.key_id(self.signing_key.public_key())

    def rotate_to(self, key: Any) -> None:
        """Publish the next version as a key rotation to ``key`` (an Ed25519 private key, or what
        :func:`~aurora_store.format.signing.load_signing_key` reads), signed by this publisher's key
        and ``key``; from then on it signs with ``key``. If the run is already signed by ``key`` (a
        publisher restarted after its rotation), it just signs with ``key``."""
        new = signing.load_signing_key(key)
        if self.signing_key is None:
            raise StoreError(
                f"{self.store.uri}: a key rotation needs the run's current signing key to sign it "
                "(--signing-key, with the new key as --rotate-signing-key)"
            )
        if signing.key_id(new.public_key()) == self.signer:
            raise StoreError(f"{self.store.uri}: the key to rotate to is the signing key itself ({self.signer})")
        self.rotating = new

    def check_signer(self) -> Tip | None:
        """The run's tip, once this publisher is known to be able to sign its next version (what a
        trainer checks at start); UnauthenticatedError, saying what to do, otherwise."""
        tip = self._read_tip(None)
        rotation = self._rotation_for(tip)  # first: it may move this publisher to its new key
        self._check_not_retired(tip)
        plan_next(
            tip,
            tip.specs if tip is not None else (),
            kind="auto",
            full_every=self.config.full_every,
            url=self.store.uri,
            signer=self.signer,
            rotation=rotation,
        )
        return tip

    def _check_not_retired(self, tip: Tip | None) -> None:
        """UnauthenticatedError, saying so, if this publisher's key is one the run rotated away from (a
        trainer restarted with the old key alone): rotating again is not the way on, its current key is."""
        current = tip.identity.signed_by if tip is not None else None
        if current is None or self.signer is None or self.signer == current:
            return
        assert tip is not None
        eras = self.reader.keys_at(tip.version, self.store.uri).eras
        for era, after in itertools.pairwise(eras):
            if era.key_id == self.signer:
                raise UnauthenticatedError(
                    f"{self.store.uri}: key {self.signer} was retired at version {after.since}, when the run was "
                    f"rotated to key {after.key_id}; the run is signed by key {current} now: publish with it "
                    "(--signing-key, AURORA_SIGNING_KEY)"
                )

    def _rotation_for(self, tip: Tip | None) -> Rotation | None:
        """The rotation the next version after ``tip`` carries: None without one pending, or when
        the run is already signed by the key to rotate to (then this publisher signs with it now)."""
        if self.rotating is None:
            return None
        new_id = signing.key_id(self.rotating.public_key())
        if tip is not None and tip.identity.signed_by == new_id:
            self.signing_key, self.rotating = self.rotating, None
            return None
        assert self.signing_key is not None
        if tip is not None and tip.identity.signed_by is not None:
            used = [e.key_id for e in self.reader.keys_at(tip.version, self.store.uri).eras]
            if new_id in used:  # readers refuse a rotation back to a key the run used
                raise StoreError(f"{self.store.uri}: key {new_id} signed this run before; rotate to a new key")
        return signing.rotation(self.signing_key, self.rotating)

    def _read_tip(self, held: Tip | None) -> Tip | None:
        try:
            return self.tip(held)
        except UnauthenticatedError as exc:
            if self.signing_key is None and self.reader.verify_key is None:  # say what a publisher lacks
                raise UnauthenticatedError(
                    f"{self.store.uri}: the run is signed; publish with its key (--signing-key, AURORA_SIGNING_KEY)",
                    url=exc.url,
                ) from None
            if self.signing_key is not None and self.rotating is None:
                raise UnauthenticatedError(
                    f"{exc}; if {self.signer} is a new key for this run, publish the next version as a key "
                    "rotation: with the run's current key as --signing-key and the new one as "
                    "--rotate-signing-key (Run.publish(..., rotate_to=NEW))",
                    url=exc.url,
                ) from None
            raise

    # ------------------------------------------------------------ planning

    def tip(self, held: Tip | None = None) -> Tip | None:
        """The last committed version (None for an empty run). With the tip this publisher last
        committed, one key is checked instead of listing the run, so a publish costs the same at
        version 10 and at 100,000; if another publisher has committed since, ConflictError."""
        if held is not None:
            if self.store.exists(manifest_key(held.version + 1)):
                raise committed_elsewhere(self.store.url(manifest_key(held.version + 1)), held.version + 1)
            return held
        versions = self.reader.versions()
        return None if not versions else Tip.of(self.reader.manifest(versions[-1]), self.reader.identity())

    def plan(self, specs: tuple[TensorSpec, ...], *, kind: str = "auto", version: int | None = None) -> PublishPlan:
        """The next version with tensor table ``specs`` (see :func:`plan_next`), after the tip this
        publisher holds (ConflictError if another publisher got there first) or the run's latest."""
        tip = self._read_tip(self._base.tip if self._base is not None else None)
        rotation = self._rotation_for(tip)  # first: it may move this publisher to its new key
        return plan_next(
            tip,
            specs,
            kind=kind,
            full_every=self.config.full_every,
            version=version,
            url=self.store.uri,
            signer=self.signer,
            rotation=rotation,
        )

    def _fits(self, plan: PublishPlan, step: int | None, meta: Mapping[str, str] | None) -> tuple[PublishPlan, int]:
        """``plan`` and the bytes of its smallest delta manifest (what every delta entry adds to), after
        checking that its manifest can fit the readers' cap: LimitError before a byte is written if
        even its smallest manifest (:meth:`PublishPlan.skeleton`, sealed as the commit seals it) would
        not. An ``auto`` plan may turn full, so it must fit as a full version."""
        cap = self.config.limits.max_manifest_bytes
        files = self.files.refs()

        def size(full: bool) -> tuple[int, int]:
            m = plan.skeleton(shard_bytes=self.config.shard_bytes, files=files, step=step, meta=meta, full=full)
            return len(signing.seal(m, self.signing_key).to_bytes()), len(m.segments)

        floor, _ = size(False)
        full = plan.full or plan.kind == "auto"
        least, shards = size(True) if full else (floor, 0)
        if least > cap:
            what = f"a full version's {shards} shards and " if full else ""
            url = self.store.url(manifest_key(plan.version))
            raise LimitError(
                f"{url}: version {plan.version}: its manifest would be at least {least} bytes, over the cap of "
                f"{cap} ({what}a table of {len(plan.specs)} tensors); raise the readers' max_manifest_bytes "
                "(every reader of the run needs it too) or publish fewer, larger tensors",
                url=url,
            )
        return plan, floor

    def resume(self) -> Tip | None:
        """Hold the last committed version's bits as this single publisher's baseline now (what a
        restarted trainer does before its first step), so the next publish diffs against it at once."""
        tip = self.tip()
        if tip is not None:
            state = self.reader.materialize(tip.version)
            self._base = Baseline(tip, whole(state.specs), dict(state.words))
        return tip

    # ------------------------------------------------------------ publishing

    def publish(
        self,
        share: Share,
        *,
        kind: Kind = "auto",
        step: int | None = None,
        meta: Mapping[str, str] | None = None,
        version: int | None = None,
        rolls_back_to: Rollback | None = None,
        hold: bool = False,
        rotate_to: Any = None,
    ) -> VersionInfo:
        """Commit the next version from every publisher's ``share``; the same VersionInfo on every rank.
        ``rolls_back_to`` (rank 0's counts) says the share's weights continue from that older version's
        state, not the parent's (:class:`~aurora_store.format.manifest.Rollback`). With ``hold`` (a
        single publisher only), everything is written but the manifest, sealed and checked: the
        version's hash is known, and :meth:`commit_held` commits it later, after whatever must exist
        before it does (the trainer's state of that version); nothing is published meanwhile.

        ``rotate_to``: publish it as a key rotation to that key (see :meth:`rotate_to`).

        Raises on every rank if any rank failed or the commit did: ConflictError when another
        publisher committed the version (the next call reloads and continues on top of it), or
        when ``version`` is given and is not the next version."""
        t0 = time.perf_counter()
        if kind not in KINDS:
            raise StoreError(f"kind must be 'auto', 'full' or 'delta', got {kind!r}")
        if self._held is not None:
            raise StoreError(f"version {self._held.manifest.version} is held: commit it before publishing the next")
        if hold and self.collective.size != 1:
            raise UnsupportedError("holding a version's commit needs a single publisher, not a group")
        step, meta = check_publish_args(step, meta)  # on every rank, before any rank writes a byte
        if rotate_to is not None:
            self.rotate_to(rotate_to)
        comm = self.collective
        planned, failure = None, None
        if comm.rank == 0:
            planned, failure = _attempt(
                lambda: self._fits(self.plan(share.specs, kind=kind, version=version), step, meta)
            )
        hello = comm.all_gather_json(_report(failure) or self._hello(share, planned))
        floor = hello[0].get("floor", 0)
        self._check(hello, failure)
        if len({h["layout"] for h in hello}) != 1:
            raise UnsupportedError("ranks disagree on the tensor table or the run's segment/shard sizes")
        plan = PublishPlan.from_dict(hello[0]["plan"])
        table = range_table(share.specs, [h["ranges"] for h in hello])
        if plan.parent is not None and plan.same_layout and any(h["base"] != plan.parent.version_hash for h in hello):
            damage = self._resync(share, table, plan.parent)
            if damage is not None:  # a full version needs no parent bits: the run goes on
                if kind == "delta":
                    raise CorruptError(f"{damage}; a delta needs its parent's bits: publish a full version")
                log.warning("%s; publishing version %d as a full version instead", damage, plan.version)
                plan = plan.as_full()
        builder: DeltaBuilder | None = None
        parts: list[Part] = []
        if not plan.full:
            builder, parts = self._delta(plan, share, floor)
            if builder is None:
                plan = plan.as_full()
        after_full: dict[str, np.ndarray] = {}
        if plan.full:
            part, after_full, failure = self._full(plan, share, table)
            parts = self._gather(plan, part, failure)
        outcome: Any = None
        if comm.rank == 0:
            info, failure = _attempt(
                lambda: self._commit(plan, parts, step=step, meta=meta, rolls_back_to=rolls_back_to, hold=hold)
            )
            outcome = _report(failure) or {"info": None if info is None else dataclasses.asdict(info)}
        outcome = comm.broadcast_json(outcome)
        self._check([outcome], failure if comm.rank == 0 else None)
        info = VersionInfo(**{**outcome["info"], "seconds": time.perf_counter() - t0})
        if plan.rotation is not None and self.rotating is not None:
            self.signing_key, self.rotating = self.rotating, None  # the run is signed by the new key from now on
        self._advance(plan.tip_after(info), share, builder, after_full)
        if info.kind == "delta":
            self._last_delta_bytes = info.bytes
        return info

    # ------------------------------------------------------------ phases

    def _hello(self, share: Share, planned: tuple[PublishPlan, int] | None) -> dict[str, Any]:
        plan, floor = planned if planned is not None else (None, 0)
        cfg = self.config
        ident = [[s.name, s.dtype, list(s.shape)] for s in share.specs], cfg.segment_bytes, cfg.shard_bytes
        base = self._base
        fits = base is not None and base.fits(share.specs, share.ranges)
        return {
            "layout": hashlib.sha256(json.dumps(ident).encode()).hexdigest(),
            "ranges": {k: list(v) for k, v in share.ranges.items()},
            "base": base.tip.version_hash if base is not None and fits else None,
            "plan": None if plan is None else plan.to_dict(),
            "floor": floor,
        }

    def _resync(self, share: Share, table: dict[str, list[tuple[int, int, int]]], parent: Tip) -> str | None:
        """Rank 0 loads the parent version once and sends every rank the bits of its ranges. When an
        object or manifest of the parent's chain is damaged, missing or fails verification (a forged or
        replayed manifest of an older version: someone else's doing, and never built on), returns what
        is wrong instead, on every rank, and nothing is loaded."""
        comm = self.collective
        state, failure = None, None
        if comm.rank == 0:
            state, failure = _attempt(lambda: self.reader.materialize(parent.version))
            if state is not None and state.version_hash != parent.version_hash:
                state, failure = None, ConflictError(f"{self.store.uri}: version {parent.version} changed hash")
        damaged = isinstance(failure, DAMAGE)
        if failure is not None and damaged and self.on_refused is not None:
            self.on_refused(failure)
        verdict = comm.broadcast_json({"damage": str(failure)} if damaged else (_report(failure) or {}))
        if "damage" in verdict:
            return str(verdict["damage"])
        self._check([verdict], failure)
        words: dict[str, np.ndarray] = {}
        for s in share.specs:
            mine = share.ranges.get(s.name)
            if comm.rank == 0:
                assert state is not None
                loaded = state.words[s.name]
                comm.exchange([(r, loaded[lo:hi]) for r, lo, hi in table[s.name] if r != 0], [])
                if mine is not None:
                    words[s.name] = loaded if mine == (0, s.numel) else loaded[mine[0] : mine[1]].copy()
            elif mine is not None:
                words[s.name] = np.empty(mine[1] - mine[0], dtype=f"<u{s.width}")
                comm.exchange([], [(0, words[s.name])])
        self._base = Baseline(parent, dict(share.ranges), words)
        return None

    def _delta(self, plan: PublishPlan, share: Share, floor: int) -> tuple[DeltaBuilder | None, list[Part]]:
        """Every rank's delta part, or (None, []) when the plan turns full. A delta the plan may still
        turn full (``auto``) streams its segments as they are sealed (cut-through) only when this
        publisher's last delta says it will fit the chain budget with room to spare
        (:data:`STREAM_MARGIN`); otherwise it is held until every rank's size is known and uploaded only
        if the chain stays within a full copy's bytes and its manifest (``floor`` bytes without its
        segments, plus theirs) within the readers' cap. A streamed delta that outgrows either all the
        same is published full, and its segments are removed again (no manifest names them)."""
        comm = self.collective
        stream = self._streams(plan)
        uploads = self._uploads(plan.version, hold=not stream)
        encoded, failure = _attempt(lambda: self._encode(plan, share, uploads))
        if stream:  # a streamed delta's uploads have all finished before any rank moves on
            _, failed = _attempt(uploads.wait)
            failure = failure or failed
        mine = None
        if encoded is not None:
            mine = {
                "bytes": encoded[0].encoded_bytes,
                "stopped": encoded[1],
                "entries": [sum(uploads.entry_bytes), len(uploads.entry_bytes)],
            }
        sizes = comm.all_gather_json(_report(failure) or mine)
        self._check(sizes, failure)
        assert encoded is not None
        builder, _ = encoded
        n = sum(s["entries"][1] for s in sizes)  # with their commas: never more than the real manifest
        manifest_bytes = floor + sum(s["entries"][0] for s in sizes) + max(n - 1, 0)
        too_big = manifest_bytes > self.config.limits.max_manifest_bytes
        if plan.kind == "auto" and (
            any(s["stopped"] for s in sizes) or plan.outgrows(sum(s["bytes"] for s in sizes)) or too_big
        ):
            if too_big:
                log.warning(
                    "%s: version %d: a delta manifest of at least %d bytes would be over the cap of %d; "
                    "publishing it full",
                    self.store.uri,
                    plan.version,
                    manifest_bytes,
                    self.config.limits.max_manifest_bytes,
                )
            if stream:
                self._remove(plan, uploads.wait())
            uploads.drop()
            return None, []
        uploads.release()
        done, failure = _attempt(uploads.wait)
        part = None if done is None else Part(done, builder.changed, builder.digest_change())
        return builder, self._gather(plan, part, failure)

    def _streams(self, plan: PublishPlan) -> bool:
        """Whether this delta's segments go up as they are sealed, before its size is known."""
        if plan.kind != "auto":
            return True  # a forced delta is never abandoned
        last = self._last_delta_bytes
        chain = plan.parent.chain_bytes if plan.parent is not None else 0
        return last is not None and chain + STREAM_MARGIN * last <= plan.full_bytes

    def _remove(self, plan: PublishPlan, entries: list[Segment]) -> None:
        """Remove the segments of a streamed delta that was abandoned for a full version (best effort:
        they belong to no manifest either way; a relay may already hold copies)."""
        log.warning(
            "%s: version %d: a delta outgrew the chain budget or the manifest cap after its segments were "
            "uploaded; publishing it full and removing its %d segments",
            self.store.uri,
            plan.version,
            len(entries),
        )
        try:
            self.store.delete([e.key for e in entries])
        except StoreError as exc:
            log.warning(
                "%s: version %d: could not remove the abandoned segments: %s", self.store.uri, plan.version, exc
            )

    def _encode(self, plan: PublishPlan, share: Share, uploads: Uploads) -> tuple[DeltaBuilder, bool]:
        assert self._base is not None
        return encode_delta(
            plan,
            self._base,
            share.words,
            uploads,
            segment_bytes=self.config.segment_bytes,
            classed=self.config.codec == "classed",
            rank=self.collective.rank,
            world=self.collective.size,
        )

    def _full(
        self, plan: PublishPlan, share: Share, table: dict[str, list[tuple[int, int, int]]]
    ) -> tuple[Part | None, dict[str, np.ndarray], BaseException | None]:
        """This rank's shards of the full version: shard g is assembled on rank g mod W, built and
        uploaded there. Every rank takes part in every transfer even after a local failure, so none
        waits forever. Also returns views into the shards built here of the tensors this rank owns
        whole: its next baseline, so a single process copies the model once, into the shards."""
        comm = self.collective
        failure: BaseException | None = None
        uploads = self._uploads(plan.version, max_pending=self.config.concurrency)  # bounds the shards in memory
        held = {k: host(v) for k, v in share.words.items()}  # a full version is built on the host
        counting = self.store.pool.submit(elements_part, plan.specs, share.ranges, held, self._base, plan.parent)
        built: dict[str, np.ndarray] = {}
        for g, members in enumerate(plan_shards(plan.specs, self.config.shard_bytes)):
            owner = g % comm.size
            words: dict[str, np.ndarray] = {}
            for s in members:
                mine = held.get(s.name)
                if comm.rank != owner:
                    comm.exchange([(owner, mine)] if mine is not None else [], [])
                    continue
                if share.ranges.get(s.name) == (0, s.numel):
                    assert mine is not None
                    words[s.name] = mine  # owned whole: no assembly
                    continue
                out = words[s.name] = np.empty(s.numel, dtype=f"<u{s.width}")
                comm.exchange([], [(r, out[lo:hi]) for r, lo, hi in table[s.name] if r != owner])
                if mine is not None:
                    lo, hi = share.ranges[s.name]
                    out[lo:hi] = mine
            if comm.rank == owner and failure is None:
                try:
                    shard = self._put_shard(uploads, plan, g, members, words)
                    views = shard_words(shard)
                    built.update({s.name: views[s.name] for s in members if share.ranges.get(s.name) == (0, s.numel)})
                except Exception as exc:  # reported after every transfer is done
                    failure = exc
        entries, failed = _attempt(uploads.wait)
        if failure or failed:
            return None, {}, failure or failed
        counted, failed = _attempt(counting.result)
        if counted is None:
            return None, {}, failed
        changed, digest, known = counted
        return Part(entries or [], changed, digest, known), built, None

    def _put_shard(
        self, uploads: Uploads, plan: PublishPlan, ordinal: int, members: list[TensorSpec], words: Mapping[str, Any]
    ) -> SealedObject:
        """Build shard ``ordinal`` of full version ``plan`` and submit it to ``uploads``. On a local
        store its bytes are written while it is being hashed, and only linked under its key then."""
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

    def _uploads(self, version: int, *, max_pending: int | None = None, hold: bool = False) -> Uploads:
        """Uploads of objects of ``version`` on the store's pool, each announced as it lands."""
        return Uploads(self.store, version, self.announcements, max_pending=max_pending, hold=hold)

    def _gather(self, plan: PublishPlan, part: Part | None, failure: BaseException | None) -> list[Part]:
        """Every rank's part, on every rank; raises everywhere if any rank failed."""
        reports = self.collective.all_gather_json(_report(failure) or (part.to_dict() if part is not None else {}))
        self._check(reports, failure)
        return [Part.from_dict(r, plan.specs) for r in reports]

    def _commit(
        self,
        plan: PublishPlan,
        parts: list[Part],
        *,
        step: int | None,
        meta: Mapping[str, str] | None,
        rolls_back_to: Rollback | None = None,
        hold: bool = False,
    ) -> VersionInfo:
        """Write the manifest of ``plan``'s version from every publisher's part: the commit (with
        ``hold``, seal it and keep it for :meth:`commit_held`).

        Delta segments keep the order of ``parts``; a full version's shards are ordered by their
        first tensor and its index is built and uploaded here. The manifest is parsed back with
        the readers' rules before it is written. ConflictError if the version is already committed."""
        t0 = time.perf_counter()
        entries = [e for p in parts for e in p.entries]
        digest = Digest() if plan.full or plan.parent is None else Digest.from_hex(plan.parent.weights_digest)
        for p in parts:
            digest.add(p.digest)
        index = None
        if plan.full:
            entries.sort(key=lambda e: e.tensors[0] if e.tensors else -1)
            uploads = self._uploads(plan.version)
            uploads.submit(build_index(plan.version, plan.specs, entries))
            (index,) = uploads.wait()
        m = plan.manifest(
            segments=tuple(entries),
            index=index,
            changed=sum(p.changed for p in parts),
            counted=all(p.counted for p in parts),
            weights_digest=digest.hex(),
            files=self.files.refs(),
            step=step,
            meta=meta,
            rolls_back_to=rolls_back_to,
        )
        m = signing.seal(m, self.signing_key, self.rotating if plan.rotation is not None else None)
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
        if plan.rotation is not None:  # before the commit: a reader listing the run finds every rotation
            self.store.put_if_absent(rotation_marker_key(plan.version), b"")
        elif not self._markers_checked:
            self._remove_leftover_marker(plan.version)
        if hold:
            self._held = _Held(key, data, m)
        else:
            self._put_manifest(key, data, m)
        return VersionInfo.of(m, time.perf_counter() - t0)

    def _remove_leftover_marker(self, version: int) -> None:
        """Before committing ``version`` without a rotation, remove the key-rotation marker a trainer
        killed mid-rotation left there (written before its manifest, which never committed): it would
        cost every new reader a read and a warning for the life of the run. Looked for once per
        publisher (one HEAD): an S3 delete says nothing of whether the key was there."""
        key = rotation_marker_key(version)
        self._markers_checked = True
        try:
            if not self.store.exists(key):
                return
            self.store.delete([key])
        except StoreError as exc:  # a bucket that refuses deletes: readers warn of it; gc removes it
            log.warning(
                "%s: could not remove the stray key-rotation marker at version %d: %s", self.store.uri, version, exc
            )
            return
        log.warning(
            "%s: removed the key-rotation marker a publish that did not commit left at version %d "
            "(this version rotates no key)",
            self.store.uri,
            version,
        )

    def _put_manifest(self, key: str, data: bytes, m: Manifest) -> None:
        # These very bytes already there are this publisher's commit: its create-only request was
        # written but its answer lost, and the storage client's retry was refused (412) as a taken key.
        try:
            self.store.put_immutable(key, data, verify=lambda existing: existing == data)
        except (ConflictError, LimitError):
            raise committed_elsewhere(self.store.url(key), m.version) from None
        self.announcements.commit(m)

    @property
    def held(self) -> Manifest | None:
        """The sealed manifest of the version published with ``hold`` and not committed yet."""
        return None if self._held is None else self._held.manifest

    def commit_held(self) -> VersionInfo:
        """Write the held version's manifest: its commit. ConflictError if another publisher committed
        that version meanwhile (the next publish reloads the run); either way nothing is held after."""
        held, self._held = self._held, None
        if held is None:
            raise StoreError("no version is held")
        t0 = time.perf_counter()
        try:
            self._put_manifest(held.key, held.data, held.manifest)
        except StoreError:
            self._base = None  # the version is not the tip: the next publish reloads the run
            raise
        return VersionInfo.of(held.manifest, time.perf_counter() - t0)

    def _advance(self, tip: Tip, share: Share, builder: DeltaBuilder | None, after_full: dict[str, np.ndarray]) -> None:
        """Move the baseline to the version just committed: a delta's changes in place, else the
        bits just published (views into this rank's shards where it built them, else copies)."""
        base = self._base
        if builder is not None and base is not None and base.fits(share.specs, share.ranges):
            base.advance(tip, share.words, builder)
            return
        words = {k: after_full[k] if k in after_full else copy_words(v) for k, v in share.words.items()}
        self._base = Baseline(tip, dict(share.ranges), words)

    def _check(self, reports: list[Any], mine: BaseException | None) -> None:
        """Raise on every rank if any rank reported a failure: this rank's own exception if it had one."""
        bad = [(r, rep) for r, rep in enumerate(reports) if "error" in rep]
        if not bad:
            return
        if isinstance(mine, ConflictError) or any(rep["type"] == ConflictError.__name__ for _, rep in bad):
            self._base = None  # the run moved on: the next publish reloads it
        if mine is not None:
            raise mine
        r, rep = bad[0]
        cls = getattr(errors, rep["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, StoreError)):
            cls = StoreError
        raise cls(f"rank {r}: {rep['error']}" if len(reports) > 1 else rep["error"])


@dataclass(frozen=True, slots=True)
class _Held:
    """A sealed manifest, not yet written."""

    key: str
    data: bytes
    manifest: Manifest


def _attempt(fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """Run a rank's local work; a failure must reach the other ranks instead of leaving them waiting."""
    try:
        return fn(), None
    except Exception as exc:  # reported through the next collective, then re-raised on this rank
        return None, exc


def _report(failure: BaseException | None) -> dict[str, str] | None:
    return None if failure is None else {"error": str(failure)[:2000], "type": type(failure).__name__}
