"""Throughput-proportional batch splitting: pure arithmetic, no I/O.

Each actor a has a throughput estimate τ_a (tokens/s), kept as an exponential moving
average τ ← β·τ + (1-β)·tokens/elapsed of the batches it has finished. A step's batch of
B prompts is split in proportion, B_a = ⌊B·τ_a/T⌋ with T = Σ τ, and the remainder goes one
prompt at a time to the largest fractional parts (ties broken by a rotating turn), so mixed
GPUs finish a step together. An actor that rejoins after being away has its share scaled by
``alpha`` until it finishes a batch and so proves its speed again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction


def ema(previous: float | None, tokens: float, elapsed_s: float, beta: float) -> float:
    """The new throughput estimate after a batch of ``tokens`` that took ``elapsed_s``."""
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    if previous is not None and not (math.isfinite(previous) and previous >= 0):
        raise ValueError(f"the previous estimate must be a finite rate >= 0, got {previous}")
    if elapsed_s <= 0 or tokens < 0 or not math.isfinite(tokens) or not math.isfinite(elapsed_s):
        raise ValueError(f"a batch needs tokens >= 0 and elapsed > 0, got {tokens} tokens in {elapsed_s} s")
    rate = tokens / elapsed_s
    if not math.isfinite(rate):
        raise ValueError(f"{tokens} tokens in {elapsed_s} s is not a finite rate")
    return rate if previous is None else beta * previous + (1.0 - beta) * rate


def effective(taus: Mapping[str, float | None], probation: frozenset[str] | set[str], alpha: float) -> dict[str, float]:
    """The weights a split uses: measured τ, times ``alpha`` for actors on probation.

    An actor never measured (τ None) counts as the mean of the measured ones (1.0 when none
    is), and is on probation too. A measured τ of 0 also counts as the mean, so no actor is
    starved of the work that would measure it again."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    for actor, tau in taus.items():
        if tau is not None and not (math.isfinite(tau) and tau >= 0):
            raise ValueError(f"throughput of {actor!r} must be a finite rate >= 0 or None, got {tau}")
    known = [t for t in taus.values() if t is not None and t > 0]
    prior = sum(t / len(known) for t in known) if known else 1.0  # no overflow for huge rates
    out = {}
    for actor, tau in taus.items():
        base = tau if tau is not None and tau > 0 else prior
        out[actor] = base * (alpha if actor in probation or tau is None else 1.0)
    return out


def split(batch: int, weights: Mapping[str, float], *, turn: int = 0) -> dict[str, int]:
    """Split ``batch`` items over actors in proportion to ``weights``.

    Floors first, then the remainder one by one to the largest fractional parts; equal
    fractions are ordered by a rotation of the sorted actor names by ``turn``, so no actor
    is always first in line. Every item is assigned; the result sums to ``batch``. Actors of
    weight 0, negative or NaN get nothing; an infinite weight is refused. The arithmetic is
    exact (fractions), so huge or tiny weights neither overflow nor lose the remainder."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
        raise ValueError(f"batch must be an int >= 0, got {batch!r}")
    if any(w == math.inf for w in weights.values()):
        raise ValueError(f"weights must be finite, got {dict(weights)}")
    live = {a: Fraction(float(w)) for a, w in weights.items() if w > 0}  # NaN > 0 is False
    if not live:
        if batch:
            raise ValueError("no actor with a positive throughput to split the batch over")
        return {a: 0 for a in weights}
    total = sum(live.values())
    exact = {a: batch * w / total for a, w in live.items()}
    shares = {a: math.floor(x) for a, x in exact.items()}
    names = sorted(live)
    k = turn % len(names)
    order = {a: i for i, a in enumerate(names[k:] + names[:k])}
    left = batch - sum(shares.values())
    for a in sorted(live, key=lambda a: (-(exact[a] - shares[a]), order[a]))[:left]:
        shares[a] += 1
    return {a: shares.get(a, 0) for a in weights}


def capped_split(
    batch: int,
    weights: Mapping[str, float],
    *,
    caps: Mapping[str, int],
    hard: frozenset[str] | set[str] = frozenset(),
    turn: int = 0,
) -> dict[str, int]:
    """:func:`split`, with no actor given more than ``caps[actor]`` items (actors not in ``caps`` have no
    cap): what a capped actor would have had is split over the others by their weights, again and
    again until it fits. Every item is still assigned: when every actor is at its cap, the rest goes
    over the caps of actors not in ``hard`` (a share cap is fairness; a hard one is a limit), and
    only when all are hard-capped over the hard caps too."""
    shares = {a: 0 for a in weights}
    left = batch
    for limits in (dict(caps), {a: c for a, c in caps.items() if a in hard}, {}):
        live = {a: w for a, w in weights.items() if w > 0 and shares[a] < limits.get(a, batch + shares[a] + 1)}
        while left and live:
            got = split(left, live, turn=turn)
            over = [a for a in live if a in limits and shares[a] + got[a] > limits[a]]
            if not over:
                for a, n in got.items():
                    shares[a] += n
                left = 0
                break
            for a in over:
                left -= limits[a] - shares[a]
                shares[a] = limits[a]
                del live[a]
    if left:
        raise ValueError("no actor with a positive throughput to split the batch over")
    return shares
