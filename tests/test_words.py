"""Words at a version (:class:`aurora_store.codec.base.Words`): every implementation answers ``at``
and ``locate`` (with and without an overlay) with exactly the words and positions the host arrays
give, wherever its words live: host arrays, torch tensors (host or device lookup), and a staging of
changes over either, or over a staged full version."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from actor.staging import Staging
from aurora_store.codec import classes
from aurora_store.codec.base import Lookup, Words
from aurora_store.codec.words import HostWords
from aurora_store.device import TensorWords
from aurora_store.format import dtypes
from aurora_store.format.digest import Digest

BF16 = dtypes.dtype("BF16").exponent
SIZES = {"a": 30_011, "b": 64}


def _bf16(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    x = torch.from_numpy(rng.normal(0, scale, n).astype(np.float32)).to(torch.bfloat16)
    return x.view(torch.int16).numpy().view("<u2").copy()


def _versions() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Words before and at the version under test: about 3% of the elements differ."""
    rng = np.random.default_rng(21)
    before = {k: _bf16(rng, n, 0.02) for k, n in SIZES.items()}
    at = {k: v.copy() for k, v in before.items()}
    for v in at.values():
        hit = rng.random(v.size) < 0.03
        v[hit] = _bf16(rng, int(hit.sum()), 0.02)
    return before, at


def _tensors(words: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16) for k, v in words.items()}


def _staging(live: Words, before: dict[str, np.ndarray], at: dict[str, np.ndarray]) -> Staging:
    changes = {}
    for k in at:
        idx = np.flatnonzero(before[k] != at[k])
        changes[k] = (idx, at[k][idx])
    return Staging(0, "", 1, "", Digest(), changes, live=live)


IMPLEMENTATIONS: dict[str, Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], Words]] = {
    "host": lambda before, at: HostWords(at),
    "tensor, host lookup": lambda before, at: TensorWords(_tensors(at), lookup_on_device=False),
    "tensor, device lookup": lambda before, at: TensorWords(_tensors(at), lookup_on_device=True),
    "staged over host": lambda before, at: _staging(HostWords(before), before, at),
    "staged over tensors": lambda before, at: _staging(
        TensorWords(_tensors(before), lookup_on_device=True), before, at
    ),
    "staged full": lambda before, at: Staging(
        0, "", 1, "", Digest(), {}, {k: v.copy() for k, v in at.items()}, live=HostWords({})
    ),
}


def _lookup(words: np.ndarray, seed: int) -> Lookup:
    """A classed block's lookup over ``words``: the ranks of a random tenth of its positions."""
    rng = np.random.default_rng(seed)
    changed = words.copy()
    hit = rng.random(words.size) < 0.1
    changed[hit] ^= np.uint16(1)
    ex = classes.extract(words, changed, BF16)
    order = np.argsort(ex.classes, kind="stable")
    present, counts = np.unique(ex.classes, return_counts=True)
    return Lookup(BF16, present, counts, ex.ranks[order], "blk")


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_words_at_positions(impl: str) -> None:
    before, at = _versions()
    words = IMPLEMENTATIONS[impl](before, at)
    rng = np.random.default_rng(5)
    for name, want in at.items():
        index = np.sort(rng.choice(want.size, size=want.size // 7, replace=False)).astype(np.int64)
        got = words.at(name, index)
        assert got.dtype == np.dtype("<u2") and np.array_equal(got, want[index]), name
        assert words.at(name, np.zeros(0, np.int64)).size == 0


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize(("name", "lo", "hi"), [("a", 0, SIZES["a"]), ("a", 1_000, 17_003), ("b", 3, 60)])
def test_locate_over_a_range_with_and_without_an_overlay(impl: str, name: str, lo: int, hi: int) -> None:
    before, at = _versions()
    words = IMPLEMENTATIONS[impl](before, at)
    want = at[name][lo:hi]
    lookup = _lookup(want, seed=hi)
    got = words.locate(name, lo, hi, lookup)
    expected = classes.locate(want, lookup)
    assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])

    rng = np.random.default_rng(hi)
    pos = np.sort(rng.choice(want.size, size=max(1, want.size // 20), replace=False)).astype(np.int64)
    over = (pos, _bf16(rng, pos.size, 1.0))  # other exponents: the overlay moves elements between classes
    overlaid = want.copy()
    overlaid[pos] = over[1]
    lookup = _lookup(overlaid, seed=hi + 1)
    got = words.locate(name, lo, hi, lookup, over)
    expected = classes.locate(overlaid, lookup)
    assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert np.array_equal(words.at(name, np.arange(lo, hi)), want), "an overlay never changes the words"
