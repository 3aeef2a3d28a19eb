"""Following the region's versions: what an actor does for its weights, apart from serving jobs.

A :class:`Follower` stages the next version on a thread of its own while the engine generates (one
version ahead while a batch runs, the latest when idle), woken by the region's commits (the
:class:`~actor.wakeups.Wakeups` listener) with a look every ``check_s`` as the safety net; the
actor applies what is staged at its safe points between batches (:meth:`Follower.apply`) or brings
itself to exactly the version a job names (:meth:`Follower.advance_to`). Each applied version is
verified against the engine's live weights where asked (``--verify-live``), counted in the actor's
metrics and told to whoever listens. The RL actor (:class:`actor.worker.Actor`) and the weight-sync-only
follower (:mod:`actor.follow`) both follow through it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from actor.metrics import ActorMetrics
from actor.updater import Applied, Updater
from actor.wakeups import Wakeups
from aurora_store.errors import AuroraError, ChainError

log = logging.getLogger("aurora.actor")


class Follower:
    """Keeps an actor's weights following its region's versions, through its :class:`Updater`."""

    def __init__(
        self,
        up: Updater,
        wake: Wakeups,
        metrics: ActorMetrics,
        *,
        who: str,
        stop: threading.Event,
        check_s: float,
        verify_live: bool = False,
        on_applied: Callable[[Applied], None] | None = None,
        on_broken: Callable[[], None] | None = None,
    ) -> None:
        self.up, self.wake, self.metrics, self.who = up, wake, metrics, who
        self.stop, self.check_s, self.verify_live = stop, check_s, verify_live
        self.on_applied = on_applied
        """Told of each version applied (after it verified, where asked): the engine, Redis notes."""
        self.on_broken = on_broken
        """Called when the engine's weights turned out not to be the version's (the actor must stop)."""
        self.busy = threading.Event()
        """Set while a batch runs: the stager then stages only one version ahead (the batch's jobs may
        name the next), instead of the latest."""
        self.broken: str | None = None
        """Why the engine's weights are not trusted any more (``--verify-live`` found other weights)."""
        self.skipped = 0
        """Versions skipped to reach the one applied last (never applied: the stager went past them)."""

    def run(self) -> None:
        """Stage ahead while the engine generates (the stager thread), until ``stop``. Looks when a
        commit reaches the region (or a version was applied), and every ``check_s``."""
        while not self.stop.is_set():
            seen = self.wake.seq
            try:
                latest = self.wake.committed  # heard by the listener, on its connection
                if latest is None:  # nothing heard: Redis (unless the listener found nothing there), else the bucket
                    latest = self.up.latest(redis=not self.wake.looked)
                self.metrics.region_at(latest)
                applied = self.up.applied
                if latest is not None and applied is not None and latest > applied.version:
                    target = applied.version + 1 if self.busy.is_set() else latest
                    staged = self.up.staged
                    if staged is None or staged.version < target:
                        self.stage(target)
                        self.wake.kick.set()  # an idle main loop applies it now
                        continue
            except AuroraError as exc:
                if self.stop.is_set():
                    return  # stopping: its clients may be closed under it
                log.warning("actor %s: staging failed: %s", self.who, exc)
                if self.stop.wait(0.5):
                    return
            self.wake.wait_commit(seen, timeout=self.check_s)

    def stage(self, target: int) -> None:
        t0 = time.perf_counter()
        self.up.stage(target)
        self.metrics.staged(time.perf_counter() - t0)

    def apply(self, since: float | None = None) -> Applied | None:
        """Apply what is staged (at a safe point); ``since``: when generation began to wait for it. The
        version now applied, or None if nothing was staged."""
        t0 = time.perf_counter()
        staged = self.up.staged
        if staged is not None:
            what = "a full version" if staged.full is not None else f"{staged.changed} changed elements"
            log.info("actor %s: applying version %d (%s)", self.who, staged.version, what)
        applied = self.up.apply()
        if applied is not None:
            done = time.perf_counter()
            self.metrics.switched(apply_s=done - t0, pause_s=done - (t0 if since is None else since))
            self.now_at(applied)
        return applied

    def now_at(self, applied: Applied) -> None:
        """``applied`` is now the engine's version (applied, or loaded at bootstrap): verify it where asked,
        count it, and tell whoever listens."""
        if self.verify_live:
            self._verify(applied)
        self.skipped = self.metrics.applied(applied.version)
        if self.on_applied is not None:
            self.on_applied(applied)

    def advance_to(self, version: int, *, wait_s: float) -> bool:
        """Hold exactly ``version``: wait for it to reach this region, stage it, apply it. False if it
        did not arrive in ``wait_s`` (or the actor is stopping)."""
        assert self.up.applied is not None
        if version > self.up.applied.version:
            since = time.perf_counter()
            give_up = time.monotonic() + wait_s
            seen = self.wake.seq
            while (self.up.latest() or -1) < version:  # the relay is still copying it to this region
                left = give_up - time.monotonic()
                if left <= 0 or self.stop.is_set():
                    return False
                seen = self.wake.wait_commit(seen, timeout=min(left, 1.0))
            staged = self.up.staged
            if staged is None or staged.version != version:
                self.stage(version)
            self.apply(since)
            self.wake.poke()  # the stager looks for the next one
        return True

    def _verify(self, applied: Applied) -> None:
        """The engine's weights, read back, are exactly the version's (``--verify-live``): after a delta
        staged in the engine, the positions it wrote (O(changed)); after a load, every word (O(model))."""
        got, how = self.up.verify()
        if got != applied.weights_digest:
            self.broken = (
                f"the engine's weights at version {applied.version} have digest {got}, the manifest says "
                f"{applied.weights_digest}"
            )
            log.error("actor %s: %s; stopping", self.who, self.broken)
            if self.on_broken is not None:
                self.on_broken()
            raise ChainError(f"actor {self.who}: {self.broken}")
        log.info("actor %s: live weights verified at version %d (%s)", self.who, applied.version, how)
