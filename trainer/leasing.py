"""Leasing a trainer's jobs (:class:`Leases`, held by :class:`~trainer.dispatch.Dispatcher`): the jobs
of each step and who holds them, who is eligible, the throughput-proportional split, the sweep that
takes back expired and orphaned leases, and idle actors taking over unstarted work (and the overdue
work of actors that have delivered nothing yet).

Eligible actors are alive, speak this coordination protocol, and hold the latest version or the
one before; the roster's view says which (no round trip). How much each gets is
:class:`~trainer.pacing.Pacing`'s: throughput measured from admitted work (a self-report is only a
first estimate), no more than ``max_share`` of the jobs placed at once while others are eligible,
and none for a while after its lease expired without a result. A sweep refreshes the roster (what
changed), reads the expired leases from the deadline index, and takes back the leases of actors
that are gone: a few round trips whatever the fleet. This trainer made every lease, so it knows
every holder without asking Redis.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import Counter, defaultdict, deque
from collections.abc import Container, Mapping

from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.lease import now_ms
from aurora_store.coord.roster import Roster
from aurora_store.coord.schedule import capped_split, effective
from aurora_store.coord.workers import PROTOCOL
from aurora_store.rl.tasks import Prompt
from trainer.config import ScheduleConfig
from trainer.pacing import Pacing

log = logging.getLogger("aurora.trainer")


class Leases:
    """The jobs of one trainer and who holds them: each step's prompts, those waiting for a lease, the
    holder of every lease, the steps already collected; and the posting, sweeping and rebalancing
    that keep every prompt leased to an eligible actor. The dispatcher holds one and admits results
    against it."""

    def __init__(
        self, board: JobBoard, roster: Roster, *, schedule: ScheduleConfig, tag: str, dropped: Counter[str]
    ) -> None:
        self.board, self.roster = board, roster
        self.schedule = schedule
        self.tag = tag
        self.dropped = dropped
        """Where a lease taken back is counted (``lease_lost``), with the dispatcher's drops."""
        self.latest: int | None = None
        """The latest published version: jobs are leased at it, to actors holding it or the one before."""
        self.pending: dict[str, tuple[int, Prompt]] = {}
        """Jobs waiting for a lease: job id -> (step, prompt)."""
        self.step_jobs: dict[int, dict[str, Prompt]] = defaultdict(dict)
        """Each step's jobs and their prompts (this trainer posted them: no need to ask Redis)."""
        self.holder: dict[str, str] = {}
        """Leased, unadmitted job -> the actor it is leased to (this trainer made every lease)."""
        self.tokens: dict[str, int] = {}
        """Leased, unadmitted job -> its lease's fencing token: only a result carrying it speaks for the lease."""
        self.leased_at: dict[str, float] = {}
        """Leased, unadmitted job -> when this trainer leased it (its monotonic clock)."""
        self.job_s: deque[float] = deque(maxlen=JOB_SAMPLES)
        """How long the last admitted jobs of proven actors took, from lease to admission."""
        self.first_job_s: deque[float] = deque(maxlen=JOB_SAMPLES)
        """The same for the first jobs of actors (not proven when admitted): what a run's first step has."""
        self.closed: set[int] = set()
        """Steps whose results were collected: nothing more is admitted for them."""
        self.pacing = Pacing(backoff_s=schedule.backoff_s, sweep_s=schedule.sweep_s)
        """Each actor's throughput as measured from its admitted results, and its backoff."""
        self.stolen = 0
        self.sweeps = 0
        self._taus: tuple[dict[str, float], set[str]] | None = None
        self._old_protocol: set[str] = set()
        self._warned = time.monotonic()  # warn after 30 s without an eligible actor, not at once

    def step_of(self, job: str) -> int | None:
        """The step of ``job`` if it is one of this trainer's current jobs, else None."""
        step = step_of(job, self.tag)
        return None if step is None or job not in self.step_jobs.get(step, ()) else step

    def _version(self) -> int:
        if self.latest is None:
            raise ValueError("no version is published yet: nothing can be leased")
        return self.latest

    def eligible(self) -> dict[str, float]:
        """Actors that may get work now, with their split weights (no round trip: the roster's view
        and the throughputs read at the last post, as :class:`Pacing` trusts them). An actor backed off
        gets nothing while any other is eligible."""
        latest = self._version()
        if self._taus is None:
            self._taus = self.board.throughputs.read()
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
        ready = {a: tau for a, tau in self.pacing.taus(ok).items() if not self.pacing.backed_off(a)}
        return effective(ready or self.pacing.taus(ok), probation, self.schedule.alpha)

    def add(self, step: int, prompts: list[Prompt]) -> None:
        """Make ``step``'s prompts this trainer's jobs, waiting for a lease."""
        for i, p in enumerate(prompts):
            job = f"{self.tag}:{step}:{i}"
            self.step_jobs[step][job] = p
            self.pending[job] = (step, p)

    def place(self, *, turn: int) -> None:
        """Lease the waiting jobs to the eligible actors as of now (the roster's changes and the
        throughputs read first: once a step, the split follows the EMAs)."""
        self._refresh_roster()
        self._taus = self.board.throughputs.read()
        self._assign(turn=turn)

    def _assign(self, *, turn: int) -> None:
        if not self.pending:
            return
        weights = self.eligible()
        if not weights:
            if time.monotonic() - self._warned > 30:
                self._warned = time.monotonic()
                top = self._version()
                held = f"version {top}" if top < 1 else f"version {top} or {top - 1}"
                log.warning(
                    "%d prompts wait for an actor holding %s (actors start or catch up)", len(self.pending), held
                )
            return
        version = self._version()
        n = len(self.pending)
        probes = {a for a in weights if self.pacing.struck(a)}
        caps = {a: 1 for a in probes}  # one job at a time until it delivers again
        if len(weights) > 1 and self.schedule.max_share < 1:
            share = math.ceil(self.schedule.max_share * n)
            caps.update({a: min(caps.get(a, share), share) for a in weights})
        shares = capped_split(n, weights, caps=caps, hard=probes, turn=turn)
        it = iter(list(self.pending.items()))
        items = []
        for actor, n in shares.items():
            for _ in range(n):
                job, (step, prompt) = next(it)
                items.append((job, actor, prompt.to_dict(), step))
        tokens = self.board.lease_many(
            items, version=version, lease_s=self.schedule.lease_s, hold_s=self.schedule.max_hold_s
        )
        for (job, actor, _, _), token in zip(items, tokens, strict=True):  # only once leased: a Redis failure
            del self.pending[job]  # leaves them all pending
            self._leased(job, actor, token)

    def sweep(self) -> None:
        """Re-lease jobs whose lease expired (or was given back) or whose actor is gone; place pending
        prompts; let idle actors take over half (rounded down) of the not-yet-started jobs of the actor
        with the most of them. A few round trips, whatever the number of actors and jobs."""
        self.sweeps += 1
        self.pacing.observe(self.holder.values())
        self._refresh_roster()
        foreign = []
        for job, deadline in self.board.expired_leases(now_ms()):
            step = step_of(job, self.tag)
            if step is None or job not in self.step_jobs.get(step, ()) or step in self.closed:
                foreign.append(job)
            elif job not in self.pending:
                holder = self.holder.get(job)
                if holder is not None and deadline > 0:  # expired, not given back (deadline 0)
                    self.pacing.strike(holder)
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

    def admitted(self, job: str, actor: str, tokens: int) -> None:
        """``job``'s result, ``tokens`` completion tokens by ``actor``, was admitted: its lease is done,
        and ``actor`` measured."""
        at = self.leased_at.get(job)
        if at is not None:
            (self.job_s if self.pacing.proven(actor) else self.first_job_s).append(time.monotonic() - at)
        self._unleased(job)
        self.pacing.credit(actor, tokens)

    def holds(self, job: str, actor: str, token: int) -> bool:
        """Whether ``actor`` holds ``job``'s current lease under ``token``: what a result must carry to give
        the lease up by failing. Anyone can write a result under any name and token (a stale holder's late
        one, or a forger's); only the holder's own failure may cost it its lease."""
        return self.holder.get(job) == actor and self.tokens.get(job) == token

    def again(self, job: str, step: int) -> None:
        """Lease ``job`` again at the next sweep (its holder produced something unusable)."""
        self._unleased(job)
        self.pending[job] = (step, self.step_jobs[step][job])

    def close(self, step: int) -> list[str]:
        """``step``'s results are collected: nothing more is admitted for it. Forgets the steps trained
        on long ago (late results for them are unknown jobs); returns their jobs, for Redis to drop."""
        dropped = []
        for s in [s for s in self.step_jobs if s < step - 2]:
            jobs = list(self.step_jobs.pop(s))
            for job in jobs:
                self._unleased(job)
            self.closed.discard(s)
            dropped += jobs
        self.closed.add(step)
        return dropped

    def rebuild(self, admitted: Mapping[int, Container[str]]) -> int:
        """Redis lost its state: every unadmitted job of the current steps waits for a lease again, and the
        whole roster is read again. Returns how many jobs."""
        n = 0
        for step, jobs in self.step_jobs.items():
            if step in self.closed:
                continue
            for job, prompt in jobs.items():
                if job not in admitted.get(step, {}) and job not in self.pending:
                    self.pending[job] = (step, prompt)
                    n += 1
        self.holder.clear()
        self.tokens.clear()
        self.leased_at.clear()
        self.roster.reset()
        self._taus = None
        return n

    def _refresh_roster(self) -> None:
        changes = self.roster.refresh()
        if changes.pruned:
            self.board.forget_actors(changes.pruned)
            self.pacing.forget(changes.pruned)
        if changes.reloaded:
            self._taus = None

    def _leased(self, job: str, actor: str, token: int) -> None:
        self.holder[job] = actor
        self.tokens[job] = token
        self.leased_at[job] = time.monotonic()

    def _unleased(self, job: str) -> None:
        self.holder.pop(job, None)
        self.tokens.pop(job, None)
        self.leased_at.pop(job, None)

    def takeover_s(self) -> float | None:
        """How long a started job of an unproven holder runs before an idle actor takes it over:
        :data:`OVERDUE` times the median of the last admitted jobs of proven actors (of any actor
        until :data:`FIRST_SAMPLES` such jobs were admitted: in a run's first step every actor is
        unproven), at least :data:`UNPROVEN_STEAL_S`; None until that many jobs were admitted. An
        honest newcomer three times slower than the fleet loses its probe jobs to it and adds
        nothing; a hung one costs its step that much. Its lease would not end it: a holder renews
        the leases of the jobs it runs, and a hung engine's process still renews."""
        samples = list(self.job_s) if len(self.job_s) >= FIRST_SAMPLES else [*self.job_s, *self.first_job_s]
        if len(samples) < FIRST_SAMPLES:
            return None
        return max(UNPROVEN_STEAL_S, OVERDUE * statistics.median(samples))

    def _lost_lease(self, job: str, step: int) -> None:
        self._unleased(job)
        self.pending[job] = (step, self.step_jobs[step][job])
        self.dropped["lease_lost"] += 1

    def _rebalance(self) -> None:
        eligible = self.eligible()
        busy = set(self.holder.values())
        idle = sorted(set(eligible) - busy)
        if not idle or not self.holder:
            return
        untaken: dict[str, list[str]] = defaultdict(list)
        # One round trip, only when an actor is idle. Only a busy holder's jobs move: one that has
        # started a job of its own and has others waiting. A job leased moments ago is on its way to
        # its holder, and one whose holder has started nothing is about to be taken: moving either
        # would race the holder (under load, again and again). Unless the holder has not proven it
        # works (no result admitted yet, or a lease lost since): then all its unstarted jobs may move,
        # so a registration that never takes its jobs holds them for UNPROVEN_STEAL_S, not for a lease.
        waiting = self.board.untaken()
        started = {a for j, a in self.holder.items() if j not in waiting}
        now = now_ms()
        settled = now - self.schedule.steal_after_s * 1000
        unproven_settled = now - min(self.schedule.steal_after_s, UNPROVEN_STEAL_S) * 1000
        for job, leased in sorted(waiting.items()):
            actor = self.holder.get(job)
            if actor is None:
                continue
            proven = self.pacing.proven(actor)
            if (proven and actor in started and leased <= settled) or (not proven and leased <= unproven_settled):
                untaken[actor].append(job)
        # A started job of an unproven holder (a hung engine behind a beating heartbeat, a new actor
        # far slower than the fleet) is taken over once it runs OVERDUE times the fleet's usual job,
        # and its holder struck: otherwise its step waits a whole lease for it.
        overdue: list[str] = []
        limit = self.takeover_s()
        if limit is not None:
            late = time.monotonic() - limit
            for job, actor in sorted(self.holder.items()):
                at = self.leased_at.get(job)
                if job not in waiting and at is not None and at <= late and not self.pacing.proven(actor):
                    overdue.append(job)
        moves: list[tuple[str, str]] = []
        proven_first = sorted(idle, key=lambda a: not self.pacing.proven(a))
        for i, job in enumerate(overdue):  # all of them at once, dealt over the idle (a thief batches them)
            self.pacing.strike(self.holder[job])
            moves.append((job, proven_first[i % len(proven_first)]))
        thieves = {t for _, t in moves}
        idle = [a for a in idle if a not in thieves]
        for thief in idle:
            if not untaken:
                break
            donor = max(sorted(untaken), key=lambda a: len(untaken[a]))
            n = len(untaken[donor]) // 2  # a lone unstarted job stays: its holder starts it next
            if donor not in started:  # nor started, nor proven: it may never start them
                n = len(untaken[donor])
                self.pacing.strike(donor)  # and it gets no more until its backoff is over, then a probe
            if n == 0:
                break
            moved, untaken[donor] = untaken[donor][-n:], untaken[donor][:-n]
            if not untaken[donor]:
                del untaken[donor]
            moves += [(job, thief) for job in moved]
        if not moves:
            return
        version = self._version()
        items = [(job, thief, None, -1) for job, thief in moves]
        tokens = self.board.lease_many(
            items, version=version, lease_s=self.schedule.lease_s, hold_s=self.schedule.max_hold_s
        )
        for (job, thief), token in zip(moves, tokens, strict=True):
            if token:
                self._leased(job, thief, token)
                self.stolen += 1


OVERDUE = 3.0
"""A started job of an unproven holder is taken over after this many times the fleet's median job."""
JOB_SAMPLES = 64
"""Admitted jobs of proven actors whose durations make that median."""
FIRST_SAMPLES = 4
"""Admitted jobs of proven actors before any is taken over: few, so a hung engine in the fleet a run
starts with costs the first step a few jobs' time too, not a lease (``aurora bench dispatch``'s hung
actor measures it: docs/ARCHITECTURE.md, "Figures the design rests on")."""
UNPROVEN_STEAL_S = 0.5
"""How long an unstarted job of an unproven holder (no result admitted yet, or a lease lost since) waits
before an idle actor may take it over: an actor waiting for work starts a pushed job within
milliseconds, and one that has not in half a second while it has proven nothing (a registration that
never takes its jobs) must not cost every step ``steal_after_s``."""


def step_of(job: str, tag: str) -> int | None:
    """The step of one of this trainer's job ids (``tag:step:i``), None for anyone else's."""
    head, sep, rest = job.partition(":")
    step, sep2, index = rest.partition(":")
    if head != tag or not sep or not sep2 or not step.isdigit() or not index.isdigit() or len(step) > 12:
        return None
    return int(step)
