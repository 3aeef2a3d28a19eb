"""Leasing a trainer's jobs (a part of :class:`~trainer.dispatch.Dispatcher`): who is eligible, the
throughput-proportional split, the sweep that takes back expired and orphaned leases, and idle
actors taking over unstarted work.

Eligible actors are alive, speak this coordination protocol, and hold the latest version or the
one before; the roster's view says which (no round trip). A sweep refreshes the roster (what
changed), reads the expired leases from the deadline index, and takes back the leases of actors
that are gone: a few round trips whatever the fleet. This trainer made every lease, so it knows
every holder without asking Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.jobs import JobBoard, now_ms
from aurora_store.coord.roster import Roster
from aurora_store.coord.schedule import effective, split
from aurora_store.coord.workers import PROTOCOL
from aurora_store.rl.tasks import Prompt
from trainer.config import ScheduleConfig

log = logging.getLogger("aurora.trainer")


class Leasing:
    """The leasing half of a Dispatcher (its state is the Dispatcher's)."""

    board: JobBoard
    roster: Roster
    schedule: ScheduleConfig
    tag: str
    published: dict[int, str]
    pending: dict[str, tuple[int, Prompt]]
    step_jobs: dict[int, dict[str, Prompt]]
    holder: dict[str, str]
    closed: set[int]
    dropped: Counter[str]
    stolen: int
    sweeps: int
    _taus: tuple[dict[str, float], set[str]] | None
    _old_protocol: set[str]
    _warned: float
    _lock: threading.RLock

    if TYPE_CHECKING:

        def _down(self, exc: CoordinationError) -> None: ...

    def _eligible(self) -> dict[str, float]:
        """Actors that may get work now, with their split weights (no round trip: the roster's view
        and the throughputs read at the last post)."""
        latest = max(self.published)
        if self._taus is None:
            self._taus = self.board.throughputs()
        taus, probation = self._taus
        ok = {}
        for wid, doc in self.roster.docs.items():
            if doc.get("role") != "actor" or doc.get("version") not in (latest, latest - 1):
                continue
            if doc.get("protocol") != PROTOCOL:
                if wid not in self._old_protocol:
                    self._old_protocol.add(wid)
                    log.warning(
                        "actor %s speaks coordination protocol %r, this trainer %d: it gets no work until it "
                        "is upgraded",
                        wid,
                        doc.get("protocol", 1),
                        PROTOCOL,
                    )
                continue
            ok[wid] = taus.get(wid)
        return effective(ok, probation, self.schedule.alpha)

    def post(self, step: int, prompts: list[Prompt]) -> None:
        """Lease ``step``'s prompts to the eligible actors (those that are waiting get them on a sweep)."""
        with self._lock:
            for i, p in enumerate(prompts):
                job = f"{self.tag}:{step}:{i}"
                self.step_jobs[step][job] = p
                self.pending[job] = (step, p)
            try:
                self._refresh_roster()  # who is alive and where, as of now (what changed only)
                self._taus = self.board.throughputs()  # once a step: the split follows the EMAs
                self._assign(turn=step)
            except CoordinationError as exc:  # the prompts stay pending: the next sweep places them
                self._down(exc)

    def _assign(self, *, turn: int) -> None:
        if not self.pending:
            return
        weights = self._eligible()
        if not weights:
            if time.monotonic() - self._warned > 30:
                self._warned = time.monotonic()
                top = max(self.published)
                held = f"version {top}" if top < 1 else f"version {top} or {top - 1}"
                log.warning(
                    "%d prompts wait for an actor holding %s (actors start or catch up)", len(self.pending), held
                )
            return
        version = max(self.published)
        shares = split(len(self.pending), weights, turn=turn)
        it = iter(list(self.pending.items()))
        items = []
        for actor, n in shares.items():
            for _ in range(n):
                job, (step, prompt) = next(it)
                items.append((job, actor, prompt.to_dict(), step))
        self.board.lease_many(items, version=version, lease_s=self.schedule.lease_s)
        for job, actor, _, _ in items:  # only once leased: a Redis failure leaves them all pending
            del self.pending[job]
            self.holder[job] = actor

    def _sweep(self) -> None:
        """Re-lease jobs whose lease expired (or was given back) or whose actor is gone; place pending
        prompts; let idle actors take over half (rounded down) of the not-yet-started jobs of the actor
        with the most of them. A few round trips, whatever the number of actors and jobs."""
        self.sweeps += 1
        self._refresh_roster()
        foreign = []
        for job in self.board.expired(now_ms()):
            step = step_of(job, self.tag)
            if step is None or job not in self.step_jobs.get(step, ()) or step in self.closed:
                foreign.append(job)
            elif job not in self.pending:
                self._lost_lease(job, step)
        self.board.settle(foreign)
        alive = self.roster.docs
        for job, actor in list(self.holder.items()):
            if actor not in alive:
                step = step_of(job, self.tag)
                if step is not None and job in self.step_jobs.get(step, ()) and job not in self.pending:
                    self._lost_lease(job, step)
        self._assign(turn=int(now_ms() // 1000))
        if self.schedule.steal:
            self._rebalance()

    def _refresh_roster(self) -> None:
        changes = self.roster.refresh()
        if changes.pruned:
            self.board.forget_actors(changes.pruned)
        if changes.reloaded:
            self._taus = None

    def _lost_lease(self, job: str, step: int) -> None:
        self.holder.pop(job, None)
        self.pending[job] = (step, self.step_jobs[step][job])
        self.dropped["lease_lost"] += 1

    def _rebalance(self) -> None:
        eligible = self._eligible()
        busy = set(self.holder.values())
        idle = sorted(set(eligible) - busy)
        if not idle or not self.holder:
            return
        untaken: dict[str, list[str]] = defaultdict(list)
        # One round trip, only when an actor is idle. Only a busy holder's jobs move: one that has
        # started a job of its own and has others waiting. A job leased moments ago is on its way to
        # its holder, and one whose holder has started nothing is about to be taken: moving either
        # would race the holder (under load, again and again).
        waiting = self.board.untaken()
        started = {a for j, a in self.holder.items() if j not in waiting}
        settled = now_ms() - self.schedule.steal_after_s * 1000
        for job, leased in sorted(waiting.items()):
            actor = self.holder.get(job)
            if actor in started and leased <= settled:
                untaken[actor].append(job)
        moves: list[tuple[str, str]] = []
        for thief in idle:
            if not untaken:
                break
            donor = max(sorted(untaken), key=lambda a: len(untaken[a]))
            n = len(untaken[donor]) // 2  # a lone unstarted job stays: its holder starts it next
            if n == 0:
                break
            moved, untaken[donor] = untaken[donor][-n:], untaken[donor][:-n]
            if not untaken[donor]:
                del untaken[donor]
            moves += [(job, thief) for job in moved]
        if not moves:
            return
        version = max(self.published)
        items = [(job, thief, None, -1) for job, thief in moves]
        tokens = self.board.lease_many(items, version=version, lease_s=self.schedule.lease_s)
        for (job, thief), token in zip(moves, tokens, strict=True):
            if token:
                self.holder[job] = thief
                self.stolen += 1


def step_of(job: str, tag: str) -> int | None:
    """The step of one of this trainer's job ids (``tag:step:i``), None for anyone else's."""
    head, sep, rest = job.partition(":")
    step, sep2, index = rest.partition(":")
    if head != tag or not sep or not sep2 or not step.isdigit() or not index.isdigit() or len(step) > 12:
        return None
    return int(step)
