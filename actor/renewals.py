"""Leases kept while their jobs run: a batch longer than a lease is not leased again under its holder.

The trainer leases each job for ``lease_s`` on its own clock. A reasoning rollout may run for minutes,
longer than any lease a trainer can afford for a dead actor, so the actor renews the leases it holds
(:meth:`~aurora_store.coord.jobs.JobBoard.renew`): on a thread of its own, a third of a lease apart
(at most every ``max_period_s``), every lease it took moves on by the time that passed on this
actor's clock since its last renewal, all in one round trip, fenced by their tokens; so do the leases
waiting in its inbox behind the batch it runs (its next batch: left to expire, each would be leased
again to this same actor, and the actor struck for it). A lease is held from the moment its job is
taken until its result is submitted (renewed until then, it leaves the trainer a lease's time to
admit it) or it is given back; one the trainer is done with early (moved to another actor, past
the hold the trainer allows) answers 0 to a renewal and is let go. An actor
that stops (killed, paused, cut off from Redis) stops renewing, and its leases expire a lease after
the last renewal, as before. An idle actor holds nothing and sends nothing. A leaving actor gives
back what it holds (:meth:`Renewer.give_back_all`), so the trainer leases those jobs again at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.lease import Lease

log = logging.getLogger("aurora.actor")

MIN_PERIOD_S = 0.05
"""Renewals never come closer than this."""


@dataclass(frozen=True, slots=True)
class GivenBack:
    """What a leaving actor's :meth:`Renewer.give_back_all` did: how many leases it owed the trainer,
    those Redis could not be told of (each with when it expires on its own), and why not."""

    owed: int
    failed: list[tuple[Lease, float]]
    error: CoordinationError | None


@dataclass(slots=True)
class _Held:
    lease: Lease
    since: float
    """When it was last renewed (or taken), on this process's monotonic clock."""
    window_s: float
    """How long the lease had left when it was taken (what a renewal keeps it at)."""


class Renewer:
    """The leases one actor holds, renewed while it holds them."""

    def __init__(self, board: JobBoard, actor: str, *, max_period_s: float = 5.0) -> None:
        self.board, self.actor = board, actor
        self.max_period_s = max_period_s
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._last_round: float | None = None
        self.renewed = 0
        """Renewals made (each moved one lease's deadline on)."""
        self._unreleased: list[tuple[Lease, float]] = []
        """Leases given back while stopping that Redis could not be told of, with when they expire."""

    def hold(self, leases: Sequence[Lease]) -> None:
        """Keep ``leases`` (just taken) until the trainer is done with them."""
        now, wall = time.monotonic(), time.time()
        with self._lock:
            for lease in leases:
                window = max(MIN_PERIOD_S * 3, lease.deadline_ms / 1000 - wall)
                self._held[lease.job] = _Held(lease, now, window)
        self._wake.set()

    def done(self, lease: Lease) -> None:
        """Stop renewing ``lease``: its result was submitted (renewed until then, it has a lease's time
        left for the trainer to admit it) or it was given back."""
        with self._lock:
            h = self._held.get(lease.job)
            if h is not None and h.lease.token == lease.token:
                del self._held[lease.job]

    @property
    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def expiry(self, lease: Lease) -> float:
        """When ``lease`` runs out unless renewed again (Unix time, by this process's clock): a lease
        after its last renewal, or its own deadline if this renewer does not hold it."""
        with self._lock:
            h = self._held.get(lease.job)
        if h is None or h.lease.token != lease.token:
            return lease.deadline_ms / 1000
        return time.time() - (time.monotonic() - h.since) + h.window_s

    def drop_all(self) -> list[tuple[Lease, float]]:
        """Stop renewing everything (the actor is leaving): each lease it held, with its :meth:`expiry`."""
        with self._lock:
            held = list(self._held.values())
        out = [(h.lease, self.expiry(h.lease)) for h in held]
        with self._lock:
            self._held.clear()
        return out

    def give_back(self, lease: Lease, *, owe: bool = False) -> None:
        """Hand ``lease`` back to the trainer (it leases the job again) and stop renewing it. With ``owe``
        (the actor is stopping, or its batch was cut off from Redis), one that Redis cannot be told of is
        kept, for :meth:`give_back_all` to try again and name; without, the failure is raised."""
        expires = self.expiry(lease)
        self.done(lease)
        try:
            self.board.release(lease)
        except CoordinationError:
            if not owe:
                raise
            with self._lock:
                self._unreleased.append((lease, expires))

    def give_back_all(self) -> GivenBack:
        """Give back every lease still held, and those :meth:`give_back` could not while stopping (the
        actor is leaving: the trainer leases those jobs again at once)."""
        with self._lock:
            owed, self._unreleased = self._unreleased, []
        owed += self.drop_all()
        failed: list[tuple[Lease, float]] = []
        error: CoordinationError | None = None
        for lease, expires in owed:
            try:
                self.board.release(lease)
            except CoordinationError as exc:
                failed.append((lease, expires))
                error = exc
        return GivenBack(len(owed), failed, error)

    def period_s(self) -> float | None:
        """Seconds until the next renewal round; None while nothing is held."""
        with self._lock:
            if not self._held:
                return None
            shortest = min(h.window_s for h in self._held.values())
        return max(MIN_PERIOD_S, min(self.max_period_s, shortest / 3))

    def renew(self) -> int:
        """One round: every held lease moved on by the time since its last renewal, and the leases waiting
        in this actor's inbox (its next batch, behind the one it runs) by the time since the last round;
        those the trainer is done with are let go. Returns how many were renewed."""
        now = time.monotonic()
        with self._lock:
            held = list(self._held.values())
        if not held:
            self._last_round = None
            return 0
        since_round = now - (self._last_round if self._last_round is not None else min(h.since for h in held))
        self._last_round = now
        mine = {h.lease.job for h in held}
        queued = [(job, token) for job, token in self.board.queued(self.actor) if job not in mine]
        items = [(h.lease.job, h.lease.token, self.actor, int((now - h.since) * 1000)) for h in held]
        items += [(job, token, self.actor, int(since_round * 1000)) for job, token in queued]
        got = self.board.renew(items)
        renewed = sum(1 for d in got[len(held) :] if d > 0)
        with self._lock:
            for h, deadline in zip(held, got, strict=False):
                if self._held.get(h.lease.job) is not h:
                    continue  # taken again meanwhile: the newer hold stands
                if deadline > 0:
                    h.since = now
                    renewed += 1
                else:
                    del self._held[h.lease.job]
        self.renewed += renewed
        return renewed

    def run(self, stop: threading.Event) -> None:
        """Renew until ``stop``; wait without a command while nothing is held."""
        while not stop.is_set():
            period = self.period_s()
            if period is None:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            if stop.wait(period):
                return
            try:
                self.renew()
            except CoordinationError as exc:  # Redis is away: the heartbeat re-registers; try again next round
                if stop.is_set():
                    return  # stopping: its client may be closed under it
                log.warning("actor %s: renewing leases: %s", self.actor, exc)

    def stop(self) -> None:
        """Wake the thread (it ends once its ``stop`` event is set)."""
        self._wake.set()
