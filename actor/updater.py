"""Actor-side weight sync: learn of versions, stage them while generating, apply at a safe point.

The updater holds a mapping of HF names to live torch tensors (any device) and the
version they are at. ``stage()`` fetches the cheapest path to the region's latest
version (deltas, or the nearest full plus deltas) with parallel ranged GETs, verifies
every segment and every version's weight digest, and keeps the result in a
:class:`~actor.staging.Staging` while generation goes on. ``apply()`` then writes it
into the live tensors in place under the write side of a readers-writer lock: a batch
(reader) never sees a half-applied model, and if anything fails before the write the
live weights stay exactly at the old version.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from actor.config import SyncConfig
from actor.live import LiveWeights, TensorWeights
from actor.rwlock import ReadWriteLock
from actor.stager import Base, Staged
from actor.staging import Staging
from aurora_store.bucket import catchup
from aurora_store.bucket.run import Run, open_run
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import CoordinationError
from aurora_store.errors import CorruptError, LayoutError, MissingError, StoreError
from aurora_store.format.digest import Digest
from aurora_store.format.manifest import Manifest, TensorSpec

log = logging.getLogger("aurora.actor")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Applied:
    version: int
    version_hash: str
    weights_digest: str


def open_sync_runs(sync: SyncConfig) -> tuple[Run, Run | None]:
    """The region's run and the fallback (home) run, each with its storage options and the run's verify key."""
    run = open_run(
        sync.store, storage_options=sync.storage_options, verify_key=sync.verify_key, concurrency=sync.connections
    )
    fallback = None
    if sync.fallback:
        options = sync.storage_options if sync.fallback_options is None else sync.fallback_options
        fallback = open_run(
            sync.fallback, storage_options=options, verify_key=sync.verify_key, concurrency=sync.connections
        )
    return run, fallback


class Updater:
    """Keeps one actor's live weights in sync with its region's bucket."""

    def __init__(
        self,
        run: Run,
        *,
        region: str,
        coord: Coordinator | None = None,
        fallback: Run | None = None,
        device: str | torch.device = "cpu",
        worker_id: str = "actor",
        live: LiveWeights | None = None,
    ) -> None:
        self.run = run
        self.region = region
        self.coord = coord
        self.fallback = fallback
        self.device = torch.device(device)
        self.worker_id = worker_id
        self.live: LiveWeights = live if live is not None else TensorWeights(device=self.device)
        self.specs: tuple[TensorSpec, ...] = ()
        self.applied: Applied | None = None
        self.lock = ReadWriteLock()
        self._digest = Digest()
        self._staged: Staging | Staged | None = None
        self._prepared: tuple[Staging, object] | None = None
        """What ``live.prepare`` made of the staged changes, built while staging, off the apply path."""
        self._stage_lock = threading.Lock()
        self._last_in_place = False
        """Whether the last write was a version staged in the engine (``verify`` reads back only it)."""
        self.on_refused: Callable[[StoreError], None] | None = None
        """Told of every object or manifest this updater refused (an actor's metrics count them)."""

    # ------------------------------------------------------------ discovery

    def latest(self, *, redis: bool = True) -> int | None:
        """The region's committed version: from Redis (unless ``redis`` is False), else from the bucket."""
        if self.coord is not None and redis:
            try:
                rv = self.coord.regions.version(self.region)
                if rv is not None:
                    return rv.version
            except CoordinationError as exc:
                log.warning("actor %s: %s; listing the bucket instead", self.worker_id, exc)
        return self.run.latest()

    # ------------------------------------------------------------ bootstrap

    def bootstrap(self, version: int | None = None) -> Applied:
        """Load ``version`` (latest when None) as new live tensors: nearest full plus deltas, from the
        fallback (home) bucket if the region's copy is damaged or incomplete."""
        target = version if version is not None else self.latest()
        try:
            state = self.run.materialize_words(target)
        except (CorruptError, MissingError) as exc:
            self._refused(exc)
            if self.fallback is None:
                raise
            log.warning("actor %s: %s; bootstrapping from the fallback", self.worker_id, exc)
            try:
                state = self.fallback.materialize_words(target)
            except StoreError as exc2:
                self._refused(exc2)
                raise
        except StoreError as exc:  # unsigned, of another run, ...: no fallback makes it acceptable
            self._refused(exc)
            raise
        with self._stage_lock, self.lock.write():  # what was staged lay over the weights this load replaces
            self.live.load(state.specs, state.words)
            self._staged = self._prepared = None
            self._last_in_place = False
            self.specs = state.specs
            self._digest = state.digest
            self.applied = Applied(state.version, state.version_hash, state.digest.hex())
        return self.applied

    # ------------------------------------------------------------ staging

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """The live tensors by HF name, when they are kept as plain tensors."""
        if not isinstance(self.live, TensorWeights):
            raise StoreError("this updater's live weights are an engine's own layout, not HF-named tensors")
        return self.live.tensors

    def route(self, target: int) -> list[Manifest]:
        """The cheapest chain of manifests from the applied version to ``target`` (bytes to fetch); from
        the latest full version when gc retired a version between (:mod:`aurora_store.bucket.catchup`)."""
        assert self.applied is not None
        return catchup.route(self.run.reader, self.applied.version, target, self.specs)

    def stage(self, target: int | None = None) -> Staging | Staged | None:
        """Fetch, verify and decode up to ``target`` (latest when None) without touching live weights."""
        if self.applied is None:
            raise StoreError("stage() needs an applied version: call bootstrap() first")
        target = self.latest() if target is None else target
        with self._stage_lock:
            staged = self._staged
            start = staged.version if staged is not None else self.applied.version
            if target is None or target <= start:
                return staged
            try:
                plan = (
                    self.route(target)
                    if staged is None
                    else catchup.route(self.run.reader, staged.version, target, self.specs, cheapest=False)
                )
            except StoreError as exc:
                self._refused(exc)
                raise
            deltas_only = all(m.kind == "delta" for m in plan)
            if self.live.stages_in_place and deltas_only and not isinstance(staged, Staging):
                return self._stage_in_place(staged, plan)
            if isinstance(staged, Staged):  # staged in the engine, and the route goes on through a full version
                self.live.drop_staged(staged)
                self._staged = staged = None
                plan = self.route(target)
            if staged is None:
                staged = Staging.empty(self.applied.version, self.applied.version_hash, self._digest, live=self.live)
            work = staged.extended()
            try:
                for m in plan:
                    self._stage_one(work, m)
            except StoreError as exc:  # refused, and nothing recovered from it (a fallback read would have)
                self._refused(exc)
                raise
            self._staged = work
            if self._prepared is not None:
                self.live.discard(self._prepared[1])
            self._prepared = None  # cleared first: a failing prepare must not leave a stale one behind
            self._prepared = (work, self.live.prepare(work.changes, work.replaced, work.full))
            return work

    def _stage_in_place(self, staged: Staged | None, plan: list[Manifest]) -> Staged | None:
        """Stage the deltas of ``plan`` inside the engine, each decoded where the weights live
        (:meth:`~actor.live.LiveWeights.stage_version`): only their verified bytes go in. The whole
        plan is staged or none is (the staging before it stays)."""
        assert self.applied is not None
        base: Staged | Base = (
            staged if staged is not None else Base(self.applied.version, self.applied.version_hash, self._digest.hex())
        )
        made: list[Staged] = []
        try:
            for m in plan:

                def stage(run: Run, m: Manifest = m, on: Staged | Base = base) -> Staged:
                    return self.live.stage_version(on, m, run.reader.fetch_all(m))

                base = self._with_fallback(m, stage)
                made.append(base)
        except StoreError as exc:
            self._refused(exc)
            for s in made:
                with contextlib.suppress(StoreError):
                    self.live.drop_staged(s)
            raise
        for s in ([staged] if staged is not None else []) + made[:-1]:  # each kept a copy of the changes before it
            try:
                self.live.drop_staged(s)
            except StoreError as exc:  # the engine keeps it until its next commit forgets every staging
                log.warning("actor %s: dropping staged version %d: %s", self.worker_id, s.version, exc)
        self._staged = made[-1]
        return made[-1]

    def _stage_one(self, work: Staging, m: Manifest) -> None:
        if m.kind == "full":
            if m.tensors != self.specs:
                raise LayoutError(f"version {m.version} changes the tensor layout; reload the engine to follow it")
            state = self._with_fallback(m, lambda run: run.reader.load_full(m))
            work.full, work.changes = state.words, {}
            work.version, work.version_hash, work.digest = m.version, m.version_hash, state.digest
            return

        blocks = self._with_fallback(m, lambda run: run.reader.decode_delta(m, work))
        work.add_version(m, blocks)

    def _with_fallback(self, m: Manifest, fn: Callable[[Run], T]) -> T:
        """Run ``fn`` on the region's bucket; on a corrupt or missing object, report it, retry once,
        then read the version from the fallback (home) bucket if one is configured."""
        try:
            return fn(self.run)
        except (CorruptError, MissingError) as exc:
            self._report(m.version, exc)
            try:
                return fn(self.run)
            except (CorruptError, MissingError) as exc2:
                if self.fallback is None:
                    raise
                self._refused(exc2)
                log.warning("actor %s: %s; reading version %d from the fallback", self.worker_id, exc2, m.version)
                return fn(self.fallback)

    def _refused(self, exc: StoreError) -> None:
        if self.on_refused is not None:
            self.on_refused(exc)

    def _report(self, version: int, exc: StoreError) -> None:
        self._refused(exc)
        if self.coord is not None:
            with contextlib.suppress(CoordinationError):
                self.coord.report(self.worker_id, self.region, version, exc.url or "", str(exc))

    # ------------------------------------------------------------ apply

    def apply(self) -> Applied | None:
        """Switch the live weights to the staged version, in place, as one transaction."""
        with self._stage_lock:
            staged = self._staged
            if staged is None or self.applied is None or staged.version == self.applied.version:
                return None
            if isinstance(staged, Staged):  # decoded and checked in the engine: only the write is left
                with self.lock.write():
                    self.live.commit_staged(staged)
                    self._last_in_place = True
                    self._digest = staged.digest
                    self.applied = Applied(staged.version, staged.version_hash, staged.digest.hex())
                self._staged = None
                self._tell_applied(staged.version, staged.version_hash)
                return self.applied
            # everything that can fail has been checked while staging or is done by prepare()
            ready = self._prepared
            prepared = ready[1] if ready is not None and ready[0] is staged else self.live.prepare(staged.changes)
            with self.lock.write():
                if staged.full is not None:
                    self.live.load(self.specs, staged.full)
                self.live.commit(prepared)
                self._last_in_place = False
                self._digest = staged.digest
                self.applied = Applied(staged.version, staged.version_hash, staged.digest.hex())
            self._staged = self._prepared = None
            self._tell_applied(staged.version, staged.version_hash)
            return self.applied

    def _tell_applied(self, version: int, version_hash: str) -> None:
        if self.coord is not None:
            with contextlib.suppress(CoordinationError):
                self.coord.workers.update(self.worker_id, version=version, version_hash=version_hash)

    # ------------------------------------------------------------ checks

    def verify(self) -> tuple[str, str]:
        """The live weights' digest, read back where they live, and how: ``"written"`` after a delta
        staged in the engine (the digest before it and the words its positions hold now: O(changed)),
        ``"whole"`` otherwise (every word: O(model), after a load or a host-pass write)."""
        with self.lock.read():
            got = self.live.readback() if self._last_in_place else None
            return (got, "written") if got is not None else (self.live.digest(), "whole")

    def live_digest(self) -> str:
        """The digest of the live weights, computed from scratch where they live (O(model) work there,
        only the digest crossing to this process); for audits, tests and ``--verify-live``."""
        with self.lock.read():
            return self.live.digest()

    @property
    def staged(self) -> Staging | Staged | None:
        return self._staged
