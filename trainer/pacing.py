"""How much work each actor gets, from what it delivered (held by :class:`~trainer.leasing.Leases`).

An actor's throughput EMA in Redis is its own report (:mod:`aurora_store.coord.throughput`): anyone
who can write Redis can claim any rate, and one registration claiming 1e12 tokens/s once took every
job of every step and never ran one (issue 25, bug 3). So the trainer measures each actor itself:
the completion tokens of its *admitted* results over the time it held leases (both decayed with a
half-life of :data:`HALF_LIFE_S`, so a measure follows an actor that speeds up or slows down). A
report is only a first estimate, and never a larger one than the fleet's: until an actor has a
result admitted it counts for at most the mean of the measured actors (when none is measured yet,
the lower median of the reports).

An actor whose lease expires without a result (a fake that never takes its jobs, a hung engine
behind a heartbeat that still beats), or that has delivered nothing and loses its jobs to an idle
actor before it starts one (:class:`~trainer.leasing.Leases`), is backed off: no new lease for
``backoff_s``, doubling with every further strike (up to :data:`BACKOFF_MAX_S`) and reset by its next
admitted result. Until that result it holds at most one job at a time (a probe), and has no claim to
its jobs not yet started. Liveness thus follows progress, not the heartbeat thread: a registration
that beats and never delivers costs a lease's time and then less and less.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

HALF_LIFE_S = 300.0
"""Wall seconds after which what an actor delivered counts half in its measured rate."""
BACKOFF_MAX_S = 600.0
"""The longest an actor whose leases keep expiring waits for its next lease (or ``backoff_s`` if longer)."""


@dataclass(slots=True)
class _Record:
    tokens: float = 0.0
    """Completion tokens of the actor's admitted results (decayed)."""
    busy_s: float = 0.0
    """Seconds it held at least one lease (decayed alike)."""
    strikes: int = 0
    """Leases expired without a result since its last admitted one."""
    until: float = 0.0
    """No new lease before this (the clock's time)."""


class Pacing:
    """Each actor's measured throughput and backoff (see the module's doc). Not thread-safe: the
    dispatcher's lock covers it, as it covers the leases."""

    def __init__(self, *, backoff_s: float, sweep_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.backoff_s = backoff_s
        """The first backoff after an expired lease (0: none)."""
        self.sweep_s = sweep_s
        """How often busy time is observed: the resolution of a measured rate."""
        self.clock = clock
        self._at: float | None = None
        self._records: dict[str, _Record] = {}

    def _record(self, actor: str) -> _Record:
        rec = self._records.get(actor)
        if rec is None:
            rec = self._records[actor] = _Record()
        return rec

    def observe(self, holders: Iterable[str]) -> None:
        """Time passed since the last call: each actor in ``holders`` (one that holds a lease) was busy
        all of it; everything measured decays."""
        now = self.clock()
        if self._at is not None and now > self._at:
            dt = now - self._at
            keep = 0.5 ** (dt / HALF_LIFE_S)
            for rec in self._records.values():
                rec.tokens *= keep
                rec.busy_s *= keep
            for actor in set(holders):
                self._record(actor).busy_s += dt
        self._at = now

    def credit(self, actor: str, tokens: int) -> None:
        """A result of ``actor``'s was admitted, with ``tokens`` completion tokens: it is measured, and
        its backoff is over."""
        rec = self._record(actor)
        rec.tokens += tokens
        rec.strikes = 0
        rec.until = 0.0

    def strike(self, actor: str) -> None:
        """A lease of ``actor``'s expired without a result, or its jobs moved before it proved it works:
        back it off (once for the leases that expire together: an expiry while it is backed off adds
        nothing)."""
        if self.backoff_s <= 0 or self.backed_off(actor):
            return
        rec = self._record(actor)
        rec.strikes += 1
        wait = min(self.backoff_s * 2.0 ** (rec.strikes - 1), max(BACKOFF_MAX_S, self.backoff_s))
        rec.until = self.clock() + wait

    def backed_off(self, actor: str) -> bool:
        """Whether ``actor`` gets no new lease now."""
        rec = self._records.get(actor)
        return rec is not None and self.clock() < rec.until

    def struck(self, actor: str) -> bool:
        """Whether a lease of ``actor``'s expired since its last admitted result (it gets one job at a time)."""
        rec = self._records.get(actor)
        return rec is not None and rec.strikes > 0

    def proven(self, actor: str) -> bool:
        """Whether ``actor`` has delivered (a result admitted) and lost no lease since."""
        rec = self._records.get(actor)
        return rec is not None and rec.tokens > 0 and rec.strikes == 0

    def rate(self, actor: str) -> float | None:
        """``actor``'s measured throughput (tokens/s of admitted results over the time it held leases),
        None until a result of its is admitted."""
        rec = self._records.get(actor)
        if rec is None or rec.tokens <= 0:
            return None
        return rec.tokens / max(rec.busy_s, self.sweep_s, 1e-3)

    def taus(self, reported: Mapping[str, float | None]) -> dict[str, float | None]:
        """The throughput to split by, for each actor of ``reported`` (its own report, None if it made
        none): the measured rate where there is one; else the report, at most the measured actors'
        mean (the lower median of the unmeasured reports when no actor is measured)."""
        measured = {a: r for a in reported if (r := self.rate(a)) is not None}
        if measured:
            ceiling = sum(r / len(measured) for r in measured.values())
        else:
            reports = [t for t in reported.values() if t is not None]
            ceiling = statistics.median_low(reports) if reports else 0.0
        out: dict[str, float | None] = {}
        for actor, tau in reported.items():
            if actor in measured:
                out[actor] = measured[actor]
            else:
                out[actor] = None if tau is None else min(tau, ceiling)
        return out

    def forget(self, actors: Iterable[str]) -> None:
        """Actors long gone (pruned from the roster)."""
        for actor in actors:
            self._records.pop(actor, None)
