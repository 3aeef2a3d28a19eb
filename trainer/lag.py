"""How stale the rollouts a step trains on are: each admitted result's *version lag*, the latest version
the trainer had published when it trained the step minus the version the result was generated with
(0: on-policy; 1: the one-step asynchrony's usual; more: an actor that fell behind, or jobs posted
early). A step's lags are summarized as p50, p99 (nearest rank) and max, for the step report and the
metrics a fleet operator watches."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VersionLag:
    p50: int
    p99: int
    max: int
    results: int
    """Results the figures are over (0: none, and every figure 0)."""


def version_lags(versions: Iterable[int], latest: int) -> list[int]:
    """Each result's lag behind ``latest`` (never below 0: a result is admitted only at a published version)."""
    return [max(latest - v, 0) for v in versions]


def summarize(lags: list[int]) -> VersionLag:
    """p50, p99 and max of ``lags`` (nearest rank: each is a lag some result had)."""
    if not lags:
        return VersionLag(0, 0, 0, 0)
    ordered = sorted(lags)

    def rank(q: float) -> int:
        return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]

    return VersionLag(rank(0.50), rank(0.99), ordered[-1], len(ordered))
