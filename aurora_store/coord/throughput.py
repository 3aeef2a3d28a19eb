"""Throughput EMAs in Redis (a part of :class:`~aurora_store.coord.jobs.JobBoard`): each actor folds its
finished batches into its own tokens/s estimate (``tau`` hash), a rejoining actor goes on probation
(``probation`` set) until it finishes a batch, and the trainer reads them all once a step to split
the step's prompts (:mod:`aurora_store.coord.schedule`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from aurora_store.coord.errors import JobError
from aurora_store.coord.schedule import ema

if TYPE_CHECKING:
    import redis


class Throughputs:
    """The EMA half of a JobBoard (its client, keys and calls)."""

    r: redis.Redis
    _tau: dict[str, float]

    if TYPE_CHECKING:

        def _k(self, *parts: str) -> str: ...

        def _call(self, fn: Any, *args: Any, **kw: Any) -> Any: ...

        def _pipeline(self, fill: Any, *, binary: bool = False) -> list[Any]: ...

    def report_throughput(self, actor: str, tokens: float, elapsed_s: float, *, beta: float) -> float:
        """Fold a finished batch into ``actor``'s EMA (only the actor writes its own) and end its
        probation: one round trip (two the first time, to read the EMA it starts from)."""
        prev = self._tau.get(actor)
        try:
            if prev is None:
                raw = self._call(self.r.hget, self._k("tau"), actor)
                prev = float(raw) if raw is not None else None
                if prev is not None and not (math.isfinite(prev) and prev >= 0):
                    prev = None  # a damaged entry: start again
            tau = ema(prev, tokens, elapsed_s, beta)
        except ValueError as exc:
            raise JobError(f"actor {actor}: {exc}") from None
        self._pipeline(lambda p: (p.hset(self._k("tau"), actor, repr(tau)), p.srem(self._k("probation"), actor)))
        self._tau[actor] = tau
        return tau

    def joined(self, actor: str) -> bool:
        """Note that ``actor`` (re)joined: one already measured goes on probation. True if rejoining."""
        if self._call(self.r.hexists, self._k("tau"), actor):
            self._call(self.r.sadd, self._k("probation"), actor)
            return True
        return False

    def throughputs(self) -> tuple[dict[str, float], set[str]]:
        """Every actor's EMA (tokens/s) and the set on probation (one round trip)."""
        raw, probation = self._pipeline(lambda p: (p.hgetall(self._k("tau")), p.smembers(self._k("probation"))))
        taus = {}
        for a, v in raw.items():
            try:
                tau = float(v)
            except ValueError:
                continue
            if math.isfinite(tau) and tau > 0:  # a damaged entry counts as unmeasured
                taus[a] = tau
        return taus, set(probation)
