"""The jittered backoff a refused fleet retries Redis with (issue 41)."""

from __future__ import annotations

import logging
import random

import pytest

from aurora_store.coord.backoff import Backoff


def test_waits_spread_over_a_growing_window_and_each_episode_is_told_once(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("aurora.test.backoff")
    b = Backoff("actor a", log, base_s=0.5, cap_s=30.0, rng=random.Random(3))
    with caplog.at_level(logging.WARNING, logger="aurora.test.backoff"):
        waits = [
            b.failed("Redis at redis://h:6379/0: ConnectionError: max number of clients reached") for _ in range(12)
        ]
        b.succeeded()
        b.succeeded()  # nothing to say: no episode
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 2, told
    assert "Redis turned it away (max number of clients reached)" in told[0] and "after 12 failed tries" in told[1]
    assert all(0 <= w <= min(30.0, 0.5 * 2 ** (i + 1)) for i, w in enumerate(waits)), "within the window"
    assert max(waits[6:]) > 10 and len({round(w, 3) for w in waits}) == len(waits), "growing, and jittered"


def test_a_fleet_refused_together_does_not_come_back_together() -> None:
    """A thousand actors refused at once: their next tries spread over the window, none bunched."""
    fleet = [Backoff(f"a{i}", None, rng=random.Random(i)) for i in range(1000)]
    for b in fleet:
        for _ in range(4):
            b.failed("refused")
    waits = sorted(b.failed("refused") for b in fleet)  # the fifth tries: window 16 s
    per_second = [sum(1 for w in waits if s <= w < s + 1) for s in range(16)]
    assert max(per_second) < 3 * 1000 / 16, per_second
