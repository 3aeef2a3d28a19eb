"""Throughput EMAs in Redis (``JobBoard.throughputs``): each actor folds its finished batches into its
own tokens/s estimate (``tau`` hash), a rejoining actor goes on probation (``probation`` set) until it
finishes a batch, and the trainer reads them all once a step to split the step's prompts
(:mod:`aurora_store.coord.schedule`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from aurora_store.coord.errors import JobError
from aurora_store.coord.keyspace import Keyspace
from aurora_store.coord.schedule import ema


class Throughputs:
    """The actors' throughput EMAs and who is on probation."""

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys
        self._tau: dict[str, float] = {}
        """The EMAs this object wrote, by actor (only an actor writes its own)."""

    def _k(self, name: str) -> str:
        return self.keys.key(name)

    def report(self, actor: str, tokens: float, elapsed_s: float, *, beta: float) -> float:
        """Fold a finished batch into ``actor``'s EMA (only the actor writes its own) and end its
        probation: one round trip (two the first time, to read the EMA it starts from)."""
        prev = self._tau.get(actor)
        try:
            if prev is None:
                raw = self.keys.call(self.keys.r.hget, self._k("tau"), actor)
                prev = float(raw) if raw is not None else None
                if prev is not None and not (math.isfinite(prev) and prev >= 0):
                    prev = None  # a damaged entry: start again
            tau = ema(prev, tokens, elapsed_s, beta)
        except ValueError as exc:
            raise JobError(f"actor {actor}: {exc}") from None
        self.keys.pipeline(lambda p: (p.hset(self._k("tau"), actor, repr(tau)), p.srem(self._k("probation"), actor)))
        self._tau[actor] = tau
        return tau

    def joined(self, actor: str) -> bool:
        """Note that ``actor`` (re)joined: one already measured goes on probation. True if rejoining."""
        if self.keys.call(self.keys.r.hexists, self._k("tau"), actor):
            self.keys.call(self.keys.r.sadd, self._k("probation"), actor)
            return True
        return False

    def read(self) -> tuple[dict[str, float], set[str]]:
        """Every actor's EMA (tokens/s) and the set on probation (one round trip)."""
        raw, probation = self.keys.pipeline(lambda p: (p.hgetall(self._k("tau")), p.smembers(self._k("probation"))))
        taus = {}
        for a, v in raw.items():
            try:
                tau = float(v)
            except ValueError:
                continue
            if math.isfinite(tau) and tau > 0:  # a damaged entry counts as unmeasured
                taus[a] = tau
        return taus, set(probation)

    def forget(self, pipe: Any, actors: Sequence[str]) -> None:
        """Queue on ``pipe`` the removal of ``actors``' EMAs and probation."""
        pipe.hdel(self._k("tau"), *actors)
        pipe.srem(self._k("probation"), *actors)
