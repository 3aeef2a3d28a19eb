"""Publishing a version: the choreography of plan -> parts -> commit -> baseline on every rank.

A version is published by one process, or by every rank of a sharded trainer together; the
:class:`Publisher` is the same in both and only its :class:`Collective` differs (a local no-op,
or the trainer's torch collectives). Each publisher holds a :class:`~aurora_store.bucket.parts.Share`
of the model: the whole tensor table, and the flat element range of each tensor it owns with that
range's words. Each step below is one :func:`~aurora_store.bucket.collective.agree` or
:func:`~aurora_store.bucket.collective.decide`, so a failure on any rank is raised on every rank
and none waits forever:

1. rank 0 plans the version (number, parent, full or delta: :func:`plan_next`) and every rank
   learns the plan and every rank's ranges;
2. a rank whose baseline is not the parent's bits receives them from rank 0, which loads the
   parent once (a damaged parent turns the version full);
3. a delta: every rank builds its part (:func:`~aurora_store.bucket.delta_part.delta_part`), which
   may turn the version full when it outgrows the chain budget;
4. a full version: every rank builds its shards (:func:`~aurora_store.bucket.full_part.full_part`);
5. rank 0 writes the manifest from every rank's :class:`~aurora_store.bucket.parts.Part`, signed by
   the run's :class:`~aurora_store.bucket.signer.Signer` (the commit), and tells every rank the
   outcome; every rank moves its baseline.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from aurora_store.bucket.announce import Announcements
from aurora_store.bucket.attachments import Attachments
from aurora_store.bucket.collective import Collective, LocalCollective, agree, decide
from aurora_store.bucket.commit import Committer
from aurora_store.bucket.delta_part import delta_part
from aurora_store.bucket.full_part import full_part
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.parts import (
    Baseline,
    Part,
    PartContext,
    Share,
    copy_words,
    range_table,
    whole,
)
from aurora_store.bucket.plan import (
    KINDS,
    Kind,
    Latest,
    PublishPlan,
    VersionInfo,
    check_publish_args,
)
from aurora_store.bucket.planner import Planner
from aurora_store.bucket.reader import Reader
from aurora_store.bucket.run_config import RunConfig
from aurora_store.bucket.signer import Signer
from aurora_store.errors import (
    DAMAGE,
    ConflictError,
    CorruptError,
    StoreError,
    UnsupportedError,
)
from aurora_store.format.delta import DeltaBuilder
from aurora_store.format.manifest import Manifest, Rollback
from aurora_store.format.weights import WeightState

log = logging.getLogger("aurora.store")


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
        signer: Signer,
        collective: Collective | None = None,
    ) -> None:
        self.store, self.reader, self.config = store, reader, config
        self.files, self.announcements = files, announcements
        self.signer = signer
        """The run's signing key and pending rotation, shared by every publisher of the run."""
        self.collective: Collective = collective if collective is not None else LocalCollective()
        self.planner = Planner(store, reader, config, files=files, signer=signer)
        """What the next version is (rank 0 plans for the group)."""
        self.committer = Committer(store, config, files=files, announcements=announcements, signer=signer)
        """Writes the group's manifests (on rank 0)."""
        self._base: Baseline | None = None
        self._last_delta_bytes: int | None = None
        """Bytes of the last delta this publisher committed: what decides whether the next one streams."""
        self.on_refused: Callable[[BaseException], None] | None = None
        """Told of each object of the parent's chain that failed verification (rank 0), e.g. to count it
        in ``aurora_artifacts_rejected_total``: the publish went on as a full version."""

    def on(self, collective: Collective) -> Publisher:
        """A publisher of the same run (and signer) in ``collective``'s group, with a baseline of its own."""
        p = Publisher(
            self.store,
            self.reader,
            self.config,
            files=self.files,
            announcements=self.announcements,
            signer=self.signer,
            collective=collective,
        )
        p.on_refused = self.on_refused
        return p

    def resume(self) -> Latest | None:
        """Hold the last committed version's bits as this single publisher's baseline now (what a
        restarted trainer does before its first step), so the next publish diffs against it at once."""
        latest = self.planner.latest()
        if latest is not None:
            state = self.reader.materialize(latest.version)
            self._base = Baseline(latest, whole(state.specs), dict(state.words))
        return latest

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
        defer: bool = False,
        rotate_to: Any = None,
    ) -> VersionInfo:
        """Commit the next version from every publisher's ``share``; the same VersionInfo on every rank.
        ``rolls_back_to`` (rank 0's counts) says the share's weights continue from that older version's
        state, not the parent's (:class:`~aurora_store.format.manifest.Rollback`). With ``defer`` (a
        single publisher only), everything is written but the manifest, sealed and checked: the
        version's hash is known, and :meth:`commit_deferred` commits it later, after whatever must exist
        before it does (the trainer's state of that version); nothing is published meanwhile.

        ``rotate_to``: publish it as a key rotation to that key (see :meth:`Signer.rotate_to`).

        Raises on every rank if any rank failed or the commit did: ConflictError when another
        publisher committed the version (the next call reloads and continues on top of it), or
        when ``version`` is given and is not the next version."""
        t0 = time.perf_counter()
        if kind not in KINDS:
            raise StoreError(f"kind must be 'auto', 'full' or 'delta', got {kind!r}")
        if self.committer.deferred is not None:
            raise StoreError(
                f"version {self.committer.deferred.version} is sealed, its commit deferred: "
                "commit it before publishing the next"
            )
        if defer and self.collective.size != 1:
            raise UnsupportedError("deferring a version's commit needs a single publisher, not a group")
        step, meta = check_publish_args(step, meta)  # on every rank, before any rank writes a byte
        if rotate_to is not None:
            self.signer.rotate_to(rotate_to)
        try:
            plan, builder, after_full, info = self._publish(
                share, kind=kind, step=step, meta=meta, version=version, rolls_back_to=rolls_back_to, defer=defer
            )
        except ConflictError:
            self._base = None  # the run moved on: the next publish reloads it
            raise
        info = dataclasses.replace(info, seconds=time.perf_counter() - t0)
        if plan.rotation is not None:
            self.signer.rotated()  # the run is signed by the new key from now on
        self._advance(plan.latest_after(info), share, builder, after_full)
        if info.kind == "delta":
            self._last_delta_bytes = info.bytes
        return info

    def _publish(
        self,
        share: Share,
        *,
        kind: Kind,
        step: int | None,
        meta: Mapping[str, str] | None,
        version: int | None,
        rolls_back_to: Rollback | None,
        defer: bool,
    ) -> tuple[PublishPlan, DeltaBuilder | None, dict[str, np.ndarray], VersionInfo]:
        """The steps every rank takes together (see the module's docstring)."""
        comm = self.collective

        def hello() -> tuple[None, dict[str, Any]]:
            if comm.rank != 0:
                return None, self._hello(share, None)
            known = self._base.latest if self._base is not None else None
            plan = self.planner.plan(share.specs, kind=kind, version=version, known=known)
            return None, self._hello(share, (plan, self.planner.floor(plan, step, meta)))

        _, hellos = agree(comm, hello)
        if len({h["layout"] for h in hellos}) != 1:
            raise UnsupportedError("ranks disagree on the tensor table or the run's segment/shard sizes")
        plan, floor = PublishPlan.from_dict(hellos[0]["plan"]), hellos[0]["floor"]
        table = range_table(share.specs, [h["ranges"] for h in hellos])
        if plan.parent is not None and plan.same_layout and any(h["base"] != plan.parent.version_hash for h in hellos):
            damage = self._resync(share, table, plan.parent)
            if damage is not None:  # a full version needs no parent bits: the run goes on
                if kind == "delta":
                    raise CorruptError(f"{damage}; a delta needs its parent's bits: publish a full version")
                log.warning("%s; publishing version %d as a full version instead", damage, plan.version)
                plan = plan.as_full()
        ctx = PartContext(self.store, self.announcements, self.config, comm)
        builder: DeltaBuilder | None = None
        parts: list[Part] = []
        if not plan.full:
            assert self._base is not None
            builder, parts = delta_part(
                plan, share, self._base, ctx, floor=floor, last_delta_bytes=self._last_delta_bytes
            )
            if builder is None:
                plan = plan.as_full()
        after_full: dict[str, np.ndarray] = {}
        if plan.full:
            after_full, parts = full_part(plan, share, table, self._base, ctx)

        def commit() -> tuple[None, dict[str, Any]]:
            info = self.committer.commit(plan, parts, step=step, meta=meta, rolls_back_to=rolls_back_to, defer=defer)
            return None, dataclasses.asdict(info)

        _, info = decide(comm, commit)
        return plan, builder, after_full, VersionInfo(**info)

    # ------------------------------------------------------------ phases

    def _hello(self, share: Share, planned: tuple[PublishPlan, int] | None) -> dict[str, Any]:
        """What a rank tells the others before anything is written: the layout it publishes, its ranges,
        the version its baseline holds and (rank 0) the plan and its smallest manifest's bytes."""
        plan, floor = planned if planned is not None else (None, 0)
        cfg = self.config
        ident = [[s.name, s.dtype, list(s.shape)] for s in share.specs], cfg.segment_bytes, cfg.shard_bytes
        base = self._base
        fits = base is not None and base.fits(share.specs, share.ranges)
        return {
            "layout": hashlib.sha256(json.dumps(ident).encode()).hexdigest(),
            "ranges": {k: list(v) for k, v in share.ranges.items()},
            "base": base.latest.version_hash if base is not None and fits else None,
            "plan": None if plan is None else plan.to_dict(),
            "floor": floor,
        }

    def _resync(self, share: Share, table: dict[str, list[tuple[int, int, int]]], parent: Latest) -> str | None:
        """Rank 0 loads the parent version once and sends every rank the bits of its ranges. When an
        object or manifest of the parent's chain is damaged, missing or fails verification (a forged or
        replayed manifest of an older version: someone else's doing, and never built on), returns what
        is wrong instead, on every rank, and nothing is loaded."""
        comm = self.collective

        def load() -> tuple[WeightState | None, dict[str, str]]:
            try:
                state = self.reader.materialize(parent.version)
            except DAMAGE as exc:
                if self.on_refused is not None:
                    self.on_refused(exc)
                return None, {"damage": str(exc)}
            if state.version_hash != parent.version_hash:
                raise ConflictError(f"{self.store.uri}: version {parent.version} changed hash")
            return state, {}

        state, verdict = decide(comm, load)
        if "damage" in verdict:
            return str(verdict["damage"])
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

    @property
    def deferred(self) -> Manifest | None:
        """The sealed manifest of the version published with ``defer`` and not committed yet."""
        return self.committer.deferred

    def commit_deferred(self) -> VersionInfo:
        """Write the deferred version's manifest: its commit. ConflictError if another publisher committed
        that version meanwhile (the next publish reloads the run); either way nothing is deferred after."""
        try:
            return self.committer.commit_deferred()
        except StoreError:
            self._base = None  # the version is not the latest: the next publish reloads the run
            raise

    def _advance(
        self, latest: Latest, share: Share, builder: DeltaBuilder | None, after_full: dict[str, np.ndarray]
    ) -> None:
        """Move the baseline to the version just committed: a delta's changes in place, else the
        bits just published (views into this rank's shards where it built them, else copies)."""
        base = self._base
        if builder is not None and base is not None and base.fits(share.specs, share.ranges):
            base.advance(latest, share.words, builder)
            return
        words = {k: after_full[k] if k in after_full else copy_words(v) for k, v in share.words.items()}
        self._base = Baseline(latest, dict(share.ranges), words)
