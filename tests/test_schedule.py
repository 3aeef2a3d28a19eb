"""Hypothesis properties of the throughput-proportional split, the EMA and probation weights."""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aurora_store.coord.schedule import effective, ema, split

NAMES = st.text("abcdefgh", min_size=1, max_size=3)
RATES = st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False)
"""Positive, finite throughputs, from subnormal-adjacent to near overflow."""
ANY_WEIGHT = st.one_of(
    RATES,
    st.just(0.0),
    st.just(-0.0),
    st.floats(max_value=-1e-300, allow_nan=False),  # negatives, -inf included
    st.just(math.nan),
)
BATCH = st.integers(0, 10_000)
TURN = st.integers(-(2**40), 2**40)


def _usable(w: float) -> bool:
    return w > 0 and math.isfinite(w)


@st.composite
def weights(draw: st.DrawFn, values: st.SearchStrategy[float] = ANY_WEIGHT) -> dict[str, float]:
    names = draw(st.lists(NAMES, min_size=1, max_size=8, unique=True))
    out = {n: draw(values) for n in names}
    if not any(_usable(w) for w in out.values()):
        out[names[0]] = draw(RATES)
    return out


# ---------------------------------------------------------------- split


@given(BATCH, weights(), TURN)
def test_split_sums_to_batch_and_every_actor_is_listed(batch: int, w: dict[str, float], turn: int) -> None:
    shares = split(batch, w, turn=turn)
    assert shares.keys() == w.keys()
    assert sum(shares.values()) == batch
    assert all(isinstance(s, int) and s >= 0 for s in shares.values())


@given(BATCH, weights(), TURN)
def test_split_is_within_one_of_the_exact_proportional_share(batch: int, w: dict[str, float], turn: int) -> None:
    shares = split(batch, w, turn=turn)
    live = {a: Fraction(x) for a, x in w.items() if _usable(x)}
    total = sum(live.values())
    for a, s in shares.items():
        exact = batch * live[a] / total if a in live else Fraction(0)
        assert abs(s - exact) < 1, (a, s, float(exact))


@given(BATCH, weights(), TURN)
def test_split_gives_unusable_weights_nothing(batch: int, w: dict[str, float], turn: int) -> None:
    shares = split(batch, w, turn=turn)
    for a, x in w.items():
        if not _usable(x):
            assert shares[a] == 0, (a, x)


@given(BATCH, weights(), TURN)
def test_split_is_deterministic_and_ignores_insertion_order(batch: int, w: dict[str, float], turn: int) -> None:
    first = split(batch, w, turn=turn)
    assert split(batch, dict(w), turn=turn) == first
    assert split(batch, dict(reversed(list(w.items()))), turn=turn) == first


@given(BATCH, weights(RATES), TURN, st.integers(2, 1000))
def test_split_depends_only_on_the_proportions(batch: int, w: dict[str, float], turn: int, k: int) -> None:
    scaled = {a: x * k for a, x in w.items()}
    if all(math.isfinite(x) and x > 0 and Fraction(x) == k * Fraction(w[a]) for a, x in scaled.items()):
        assert split(batch, scaled, turn=turn) == split(batch, w, turn=turn)


@given(st.integers(1, 8), RATES, BATCH, TURN)
def test_remainder_rotates_so_equal_actors_get_equal_totals(n: int, rate: float, batch: int, start: int) -> None:
    names = [f"actor{i}" for i in range(n)]
    totals = dict.fromkeys(names, 0)
    for turn in range(start, start + n):
        shares = split(batch, dict.fromkeys(names, rate), turn=turn)
        assert max(shares.values()) - min(shares.values()) <= 1
        for a, s in shares.items():
            totals[a] += s
    assert set(totals.values()) == {batch}


def test_split_rotation_moves_the_remainder() -> None:
    w = {"a": 1.0, "b": 1.0, "c": 1.0}
    assert split(4, w, turn=0) == {"a": 2, "b": 1, "c": 1}
    assert split(4, w, turn=1) == {"a": 1, "b": 2, "c": 1}
    assert split(4, w, turn=2) == {"a": 1, "b": 1, "c": 2}
    assert split(4, w, turn=3) == split(4, w, turn=0)


def test_split_known_values() -> None:
    assert split(64, {"fast": 1.0, "mid": 0.5, "slow": 0.3, "fading": 0.8}) == {
        "fast": 25,
        "mid": 12,
        "slow": 7,
        "fading": 20,
    }
    assert split(0, {"a": 0.0}) == {"a": 0}
    assert split(0, {}) == {}
    assert split(10, {"a": 1e308, "b": 1e308}) == {"a": 5, "b": 5}  # sum of weights overflows a float


@pytest.mark.parametrize(
    ("batch", "w"),
    [
        (-1, {"a": 1.0}),
        (1.5, {"a": 1.0}),
        (True, {"a": 1.0}),
        (3, {}),
        (3, {"a": 0.0, "b": -1.0, "c": math.nan}),
        (3, {"a": math.inf, "b": 1.0}),
    ],
)
def test_split_refuses_hostile_input(batch: object, w: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        split(batch, w)  # type: ignore[arg-type]


# ---------------------------------------------------------------- ema

BETA = st.floats(min_value=0.0, max_value=0.99)
TOKENS = st.floats(min_value=0.0, max_value=1e12)
ELAPSED = st.floats(min_value=1e-3, max_value=1e6)


@given(TOKENS, ELAPSED, BETA)
def test_ema_first_value_is_the_rate(tokens: float, elapsed: float, beta: float) -> None:
    assert ema(None, tokens, elapsed, beta) == tokens / elapsed


@given(st.floats(min_value=0.0, max_value=1e9), TOKENS, ELAPSED, BETA)
def test_ema_lies_between_the_previous_estimate_and_the_rate(
    prev: float, tokens: float, elapsed: float, beta: float
) -> None:
    rate = tokens / elapsed
    got = ema(prev, tokens, elapsed, beta)
    lo, hi = min(prev, rate), max(prev, rate)
    assert lo * (1 - 1e-12) <= got <= hi * (1 + 1e-12)


@given(st.floats(min_value=0.0, max_value=1e9), TOKENS, ELAPSED, BETA, st.integers(1, 200))
def test_ema_converges_to_a_constant_rate(prev: float, tokens: float, elapsed: float, beta: float, n: int) -> None:
    """After n batches at one rate the error has shrunk by beta**n (up to rounding: relative, and below the
    smallest normal float absolute, where a rate of 5e-324 tokens/s rounds to 0 or to itself)."""
    rate = tokens / elapsed
    tau = prev
    for _ in range(n):
        tau = ema(tau, tokens, elapsed, beta)
    assert abs(tau - rate) <= beta**n * abs(prev - rate) + 1e-9 * max(prev, rate) + sys.float_info.min


def test_ema_with_beta_zero_forgets_the_past() -> None:
    assert ema(100.0, 30.0, 2.0, 0.0) == 15.0
    assert ema(100.0, 30.0, 2.0, 0.5) == 57.5


@pytest.mark.parametrize(
    ("previous", "tokens", "elapsed", "beta"),
    [
        (None, 10.0, 1.0, 1.0),
        (None, 10.0, 1.0, -0.1),
        (None, 10.0, 1.0, math.nan),
        (None, 10.0, 0.0, 0.5),
        (None, 10.0, -1.0, 0.5),
        (None, 10.0, math.nan, 0.5),
        (None, 10.0, math.inf, 0.5),
        (None, math.nan, 1.0, 0.5),
        (None, math.inf, 1.0, 0.5),
        (None, -1.0, 1.0, 0.5),
        (None, 1e308, 1e-10, 0.5),  # a rate that overflows
        (math.nan, 10.0, 1.0, 0.5),
        (math.inf, 10.0, 1.0, 0.5),
        (-1.0, 10.0, 1.0, 0.5),
    ],
)
def test_ema_refuses_hostile_input(previous: float | None, tokens: float, elapsed: float, beta: float) -> None:
    with pytest.raises(ValueError):
        ema(previous, tokens, elapsed, beta)


# ---------------------------------------------------------------- effective

ALPHA = st.floats(min_value=1e-3, max_value=1.0)
TAUS = st.dictionaries(NAMES, st.one_of(st.none(), RATES), min_size=1, max_size=8)


@given(TAUS, st.data(), ALPHA)
def test_effective_scales_probation_by_alpha(taus: dict[str, float | None], data: st.DataObject, alpha: float) -> None:
    probation = data.draw(st.sets(st.sampled_from(sorted(taus))))
    got = effective(taus, probation, alpha)
    plain = effective(taus, set(), alpha)
    assert got.keys() == taus.keys()
    for a, tau in taus.items():
        if tau is not None:
            assert plain[a] == tau
            assert got[a] == (tau * alpha if a in probation else tau)


@given(TAUS, ALPHA)
def test_effective_gives_unknown_actors_the_mean_times_alpha(taus: dict[str, float | None], alpha: float) -> None:
    known = [t for t in taus.values() if t is not None]
    mean = math.fsum(t / len(known) for t in known) if known else 1.0
    got = effective(taus, frozenset(), alpha)
    for a, tau in taus.items():
        if tau is None:
            assert got[a] == pytest.approx(mean * alpha, rel=1e-12)
    assert all(math.isfinite(x) and x > 0 for x in got.values())


def test_effective_known_values() -> None:
    got = effective({"a": 2.0, "b": 4.0, "new": None, "back": 1.0, "zero": 0.0}, {"back"}, 0.5)
    mean = (2.0 + 4.0 + 1.0) / 3  # the measured ones, probation or not; a zero is not a measurement
    assert got == pytest.approx({"a": 2.0, "b": 4.0, "new": mean * 0.5, "back": 0.5, "zero": mean})
    assert effective({"x": None, "y": None}, set(), 0.25) == {"x": 0.25, "y": 0.25}
    assert effective({}, set(), 0.5) == {}


@pytest.mark.parametrize("alpha", [0.0, -0.5, 1.5, math.nan, math.inf])
def test_effective_refuses_bad_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        effective({"a": 1.0}, set(), alpha)


@pytest.mark.parametrize("tau", [math.nan, math.inf, -1.0])
def test_effective_refuses_bad_throughput(tau: float) -> None:
    with pytest.raises(ValueError, match="'a'"):
        effective({"a": tau, "b": 1.0}, set(), 0.5)
