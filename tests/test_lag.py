"""Issue 41: a step's version lag (p50, p99, max of its admitted results) and the versions an actor skipped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actor.metrics import ActorMetrics
from trainer.lag import VersionLag, summarize, version_lags


@given(st.lists(st.integers(0, 10**6), max_size=300), st.integers(0, 10**6))
def test_lag_figures_are_lags_some_result_had_in_rank_order(versions: list[int], latest: int) -> None:
    lags = version_lags(versions, latest)
    got = summarize(lags)
    assert got.results == len(versions)
    if not lags:
        assert got == VersionLag(0, 0, 0, 0)
        return
    assert {got.p50, got.p99, got.max} <= set(lags) and got.p50 <= got.p99 <= got.max == max(lags)
    below = sum(x <= got.p50 for x in lags)
    assert below * 2 >= len(lags) and sum(x < got.p50 for x in lags) * 2 < len(lags), "the median by nearest rank"
    assert sum(x <= got.p99 for x in lags) >= 0.99 * len(lags)


def test_a_step_of_one_step_asynchrony_and_a_straggler() -> None:
    assert summarize(version_lags([4] * 99 + [1], latest=5)) == VersionLag(1, 1, 4, 100)
    assert summarize(version_lags([4] * 98 + [1, 1], latest=5)) == VersionLag(1, 4, 4, 100)
    assert version_lags([6], latest=5) == [0], "never below 0"


def test_an_actor_counts_the_versions_it_went_past() -> None:
    m = ActorMetrics("eu", "eu-0")
    assert m.applied(3) == 0, "the first version applied skips nothing (it is where the actor starts)"
    assert m.applied(4) == 0 and m.applied(7) == 2 and m.applied(7) == 0
    assert m.applied(2) == 0, "a rewind (Redis lost its state, a rollback) is not a skip"
    assert m.skipped == 2
    got = m.m.registry.get_sample_value("aurora_actor_versions_skipped_total", {"region": "eu", "actor": "eu-0"})
    assert got == 2.0, "exported as the counter"
