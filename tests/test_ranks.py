"""Class ranks kept across versions (aurora_store.codec.ranks): an index's lookups are the walk's
(``classes.locate``) exactly, errors included, before and after any run of updates; an index moved
forward equals one built from the new words; and live weights keep theirs in step with their commits
and rebuild it after any other write."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from actor.live import TensorWeights
from aurora_store.codec import classed, classes, ranks
from aurora_store.codec.base import Exponent, Lookup, Span
from aurora_store.errors import CorruptError
from aurora_store.format import dtypes
from aurora_store.format.manifest import TensorSpec

pytestmark = pytest.mark.skipif(not classes.compiled(), reason="the rank index needs the codec's kernels")

TYPES = [(np.dtype("<u2"), Exponent(7, 8)), (np.dtype("<u2"), Exponent(10, 5)), (np.dtype("<u4"), Exponent(23, 8))]


def random_words(rng: np.random.Generator, n: int, dt: np.dtype, exponent: Exponent, classes_: int) -> np.ndarray:
    """Words whose exponents take ``classes_`` values (few: long runs of one class, many ranks per class)."""
    bits = 8 * dt.itemsize
    words = rng.integers(0, 1 << bits, n, dtype=np.uint64)
    exps = rng.choice(rng.integers(0, 1 << exponent.bits, classes_), n).astype(np.uint64)
    mask = np.uint64(((1 << exponent.bits) - 1) << exponent.shift)
    return ((words & ~mask) | (exps << np.uint64(exponent.shift))).astype(dt)


def lookup_of(old: np.ndarray, new: np.ndarray, exponent: Exponent) -> Lookup:
    ex = classes.extract(old, new, exponent)
    order = np.argsort(ex.classes, kind="stable")
    present, counts = np.unique(ex.classes, return_counts=True)
    return Lookup(exponent, present.astype(np.int64), counts.astype(np.int64), ex.ranks[order], "block")


def change(rng: np.random.Generator, words: np.ndarray, density: float, exponent: Exponent) -> np.ndarray:
    """Some words stepped by a few ULPs (crossing exponents now and then), some set to anything."""
    new = words.copy()
    at = rng.random(words.size) < density
    steps = rng.integers(-3, 4, int(at.sum())).astype(np.int64)
    new[at] = (
        (words[at].astype(np.int64) + steps * (1 << max(0, exponent.shift - 2))) % (1 << 8 * words.itemsize)
    ).astype(words.dtype)
    wild = rng.random(words.size) < density / 4
    new[wild] = rng.integers(0, 1 << 8 * words.itemsize, int(wild.sum()), dtype=np.uint64).astype(words.dtype)
    return new


def step(rng: np.random.Generator, words: np.ndarray, density: float, exponent: Exponent) -> np.ndarray:
    """An optimizer-like step: ``density`` of the words move by one ULP, and one in fifty of those
    crosses into the next exponent class (real steps cross about one in 128: few moves, so a live
    index is worth keeping, :func:`ranks.worth`)."""
    new = words.copy()
    at = np.flatnonzero(rng.random(words.size) < density)
    new[at] ^= words.dtype.type(1)
    cross = at[rng.random(at.size) < 1 / 50]
    top = (1 << exponent.bits) - 1
    exps = (exponent.of(words[cross]).astype(np.int64) + 1) % top  # never into the all-ones class
    keep = ~np.asarray(((1 << exponent.bits) - 1) << exponent.shift, dtype=np.int64)
    new[cross] = ((words[cross].astype(np.int64) & keep) | (exps << exponent.shift)).astype(words.dtype)
    return new


@given(
    st.integers(0, 2),
    st.integers(1, 3 * ranks.CHUNK + 50),
    st.integers(1, 40),
    st.floats(0.0005, 0.5),
    st.integers(0, 2**32 - 1),
    st.integers(0, 3),
)
@settings(max_examples=150, deadline=None)
def test_lookups_equal_the_walk_through_any_updates(
    t: int, n: int, classes_: int, density: float, seed: int, updates: int
) -> None:
    dt, exponent = TYPES[t]
    rng = np.random.default_rng(seed)
    words = random_words(rng, n, dt, exponent, classes_)
    index = ranks.RankIndex(words, exponent)
    for _ in range(updates + 1):
        lo = int(rng.integers(0, n))
        hi = int(rng.integers(lo + 1, n + 1))
        new = change(rng, words, density, exponent)
        look = lookup_of(words[lo:hi], new[lo:hi], exponent)
        if look.ranks.size:
            want = classes.locate(words[lo:hi], look)
            got = index.locate(lo, hi, look)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        at = np.flatnonzero(new != words)
        index.update(at, words[at], new[at])
        words = new
        fresh = ranks.RankIndex(words, exponent)
        assert np.array_equal(index.perm, fresh.perm) and np.array_equal(index.start, fresh.start)


def test_a_classed_block_decodes_the_same_through_an_index() -> None:
    rng = np.random.default_rng(5)
    masters = rng.normal(0, 0.02, 3 * ranks.CHUNK + 7).astype(np.float32)
    to_bf16 = lambda x: torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view("<u2")  # noqa: E731
    moved = masters.copy()
    moved[::101] += np.float32(3e-3)  # under 1% of the elements: sparse enough for the index (ranks.worth)
    old, new = to_bf16(masters), to_bf16(moved)
    ex = classes.extract(old, new, Exponent(7, 8))
    enc = classed.encode(ex.positions, ex.old, ex.new, Exponent(7, 8), ex.classes, ex.ranks)
    live = TensorWeights({"w": torch.from_numpy(old.view(np.int16).copy()).view(torch.bfloat16)}, rank_index=True)
    from aurora_store.codec.base import BlockWords

    span = Span(old.size, 2, dtypes.dtype("BF16").exponent)
    got = classed.decode(enc.payload, enc.header, span, BlockWords(live, "w", 0, old.size), "b")
    assert live._ranks  # the lookup went through an index
    assert np.array_equal(got.positions, ex.positions)
    assert np.array_equal((old[got.positions] + got.delta).astype("<u2"), new[ex.positions])


@pytest.mark.parametrize("t", range(3))
def test_hostile_lookups_are_corrupt_like_the_walk(t: int) -> None:
    dt, exponent = TYPES[t]
    rng = np.random.default_rng(t)
    words = random_words(rng, 2 * ranks.CHUNK + 100, dt, exponent, 3)
    index = ranks.RankIndex(words, exponent)
    c = int(exponent.of(words[:1])[0])
    size = int((exponent.of(words[100:5000]) == c).sum())
    cases = {
        "past its class": np.array([size], np.int64),
        "last past its class": np.array([0, size + 3], np.int64),
        "not ascending": np.array([2, 1], np.int64),
        "repeated": np.array([1, 1], np.int64),
    }
    for why, r in cases.items():
        look = Lookup(exponent, np.array([c]), np.array([r.size]), r, "blk")
        with pytest.raises(CorruptError, match="blk"):
            classes.locate(words[100:5000], look)
        with pytest.raises(CorruptError, match="blk"):
            index.locate(100, 5000, look)
        assert why
    for bad in (np.array([-1]), np.array([1 << exponent.bits])):
        with pytest.raises(CorruptError, match="class id"):
            index.locate(0, 10, Lookup(exponent, bad, np.array([1]), np.array([0]), "blk"))
    with pytest.raises(CorruptError, match="counts sum"):
        index.locate(0, 10, Lookup(exponent, np.array([c]), np.array([2]), np.array([0]), "blk"))
    with pytest.raises(ValueError):
        index.locate(0, words.size + 1, Lookup(exponent, np.array([c]), np.array([1]), np.array([0]), "blk"))


def test_an_update_from_words_it_does_not_hold_is_refused() -> None:
    exponent = Exponent(7, 8)
    words = np.arange(10_000, dtype="<u2") * np.uint16(7)
    index = ranks.RankIndex(words, exponent)
    at = np.array([5, 9000])
    lie = words[at] ^ np.uint16(0x4000)  # other exponents than the index holds there
    with pytest.raises(ValueError, match="does not hold"):
        index.update(at, lie, words[at])


def test_live_weights_keep_their_index_with_commits_and_rebuild_it_after_other_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(1)
    exponent = Exponent(7, 8)
    words = random_words(rng, 16 * ranks.CHUNK, np.dtype("<u2"), exponent, 12)
    live = TensorWeights({"w": torch.from_numpy(words.view(np.int16).copy()).view(torch.bfloat16)}, rank_index=True)

    def check(new: np.ndarray) -> None:
        now = live.flat("w").numpy().view("<u2")
        look = lookup_of(now, new, exponent)
        want = classes.locate(now.copy(), look)
        got = live.locate("w", 0, now.size, look)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])

    for _ in range(3):  # lookups, then commits that move the index forward (no rebuild)
        new = step(rng, live.flat("w").numpy().view("<u2").copy(), 0.01, exponent)
        check(new)
        index = live._ranks["w"][0]
        at = np.flatnonzero(new != live.flat("w").numpy().view("<u2"))
        live.commit(live.prepare({"w": (at, new[at])}))
        assert live._moves["w"][0] is index  # moved at the next lookup, not at the safe point
    check(step(rng, live.flat("w").numpy().view("<u2").copy(), 0.01, exponent))
    assert live._ranks["w"][0] is index and not live._moves
    with torch.no_grad():  # a write the index is not told of: the next lookup builds a new one
        live.tensors["w"].mul_(-3)
    check(step(rng, live.flat("w").numpy().view("<u2").copy(), 0.01, exponent))
    assert live._ranks["w"][0] is not index
    monkeypatch.setenv("AURORA_RANK_INDEX", "0")
    off = TensorWeights({"w": live.tensors["w"].clone()})  # turned off: every lookup walks
    look = lookup_of(off.flat("w").numpy().view("<u2"), words, exponent)
    off.locate("w", 0, 16 * ranks.CHUNK, look)
    assert not off._ranks
    monkeypatch.delenv("AURORA_RANK_INDEX", raising=False)  # the default: on (ranks.enabled says why)
    assert TensorWeights().rank_index and not TensorWeights(rank_index=False).rank_index


def test_a_dense_lookup_walks_and_leaves_the_index_to_the_next_sparse_one() -> None:
    """Above ranks.WALK_ABOVE a lookup walks (moving the index and looking up every rank would cost
    more): the index is neither used nor moved then, and the next sparse lookup brings it up to date
    (moved by the last commit's moves, or rebuilt) and equals the walk."""
    rng = np.random.default_rng(3)
    exponent = Exponent(7, 8)
    words = random_words(rng, 4 * ranks.CHUNK, np.dtype("<u2"), exponent, 12)
    live = TensorWeights({"w": torch.from_numpy(words.view(np.int16).copy()).view(torch.bfloat16)}, rank_index=True)
    now = lambda: live.flat("w").numpy().view("<u2")  # noqa: E731

    def apply(density: float) -> tuple[np.ndarray, np.ndarray]:
        new = (step if density < 0.1 else change)(rng, now().copy(), density, exponent)
        look = lookup_of(now(), new, exponent)
        want = classes.locate(now().copy(), look)
        got = live.locate("w", 0, now().size, look)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        at = np.flatnonzero(new != now())
        live.commit(live.prepare({"w": (at, new[at])}))
        return look.ranks, new

    look, _ = apply(0.005)
    assert ranks.worth(look.size, now().size) and "w" in live._moves  # the index, moved at the next lookup
    index = live._moves["w"][0]
    look, _ = apply(0.2)
    assert not ranks.worth(look.size, now().size)
    assert "w" not in live._ranks and live._moves["w"][0] is index  # walked: the index was left alone
    look, new = apply(0.005)  # its moves are a version behind: rebuilt, then moved by this commit
    assert ranks.worth(look.size, now().size) and live._moves["w"][0] is not index
    assert np.array_equal(now(), new)
    apply(0.005)
    assert "w" in live._ranks or "w" in live._moves


def test_a_lookup_weighs_the_moves_an_index_must_make_first() -> None:
    """A sparse version after one whose commit moved many elements between classes walks (making the
    moves would cost more than the walk), and leaves those moves pending."""
    rng = np.random.default_rng(4)
    exponent = Exponent(7, 8)
    words = random_words(rng, 4 * ranks.CHUNK, np.dtype("<u2"), exponent, 12)
    live = TensorWeights({"w": torch.from_numpy(words.view(np.int16).copy()).view(torch.bfloat16)}, rank_index=True)
    now = lambda: live.flat("w").numpy().view("<u2")  # noqa: E731
    new = now().copy()
    at = np.sort(rng.choice(new.size, 300, replace=False))
    new[at] ^= np.uint16(1 << 7)  # 300 changes, every one to another class
    live.locate("w", 0, new.size, lookup_of(now(), new, exponent))
    live.commit(live.prepare({"w": (at, new[at])}))
    assert live._pending_moves("w", exponent, new.size) == 300
    target = step(rng, now().copy(), 0.002, exponent)
    look = lookup_of(now(), target, exponent)
    assert not ranks.worth(look.ranks.size, new.size, 300)
    got = live.locate("w", 0, new.size, look)
    want = classes.locate(now().copy(), look)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert "w" in live._moves and "w" not in live._ranks  # walked; the moves wait


def test_a_load_builds_every_index_in_the_background_and_a_commit_waits_for_a_build() -> None:
    """After a load each host tensor's index is built without a lookup asking for it (the first delta
    after a load then looks up at O(changed)); a commit racing the build finishes after it, and the
    index then either moves with the commit or is rebuilt: lookups stay the walk's."""
    rng = np.random.default_rng(5)
    exponent = dtypes.dtype("BF16").exponent
    specs = tuple(TensorSpec(n, "BF16", (64, ranks.CHUNK)) for n in ("a", "b", "c"))
    words = {s.name: random_words(rng, s.numel, np.dtype("<u2"), exponent, 20) for s in specs}
    live = TensorWeights(rank_index=True)
    live.load(specs, words)
    at = np.sort(rng.choice(specs[0].numel, 500, replace=False))
    new = words["a"].copy()
    new[at] ^= np.uint16(1 << 7)  # every change moves its element to another exponent class
    live.commit(live.prepare({"a": (at, new[at])}))  # races the background build of "a"
    assert live.warmed(60) and {"b", "c"} <= set(live._ranks)  # built ahead, no lookup asked
    for s in specs:
        now = live.flat(s.name).numpy().view("<u2")
        target = step(rng, now.copy(), 0.008, exponent)
        look = lookup_of(now, target, exponent)
        want = classes.locate(now.copy(), look)
        got = live.locate(s.name, 0, now.size, look)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), s.name
    assert np.array_equal(live.flat("a").numpy().view("<u2"), new)
    off = TensorWeights(rank_index=False)
    off.load(specs, words)
    assert off._warming == [] and not off._ranks  # turned off: no build started, nothing built


def test_actors_loading_together_while_the_kernels_load_each_build_every_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six actors of one process load at once, as the transfer bench's do, while the codec's kernels
    are not loaded yet: the first to ask loads them and the others wait for it. (The others once got
    None, took that for "no compiled kernels here", built no index, and the first delta of those actors
    walked every tensor.)"""
    from aurora_store.codec import kernels

    rng = np.random.default_rng(6)
    exponent = dtypes.dtype("BF16").exponent
    specs = tuple(TensorSpec(n, "BF16", (16, ranks.CHUNK)) for n in ("a", "b"))
    words = {s.name: random_words(rng, s.numel, np.dtype("<u2"), exponent, 20) for s in specs}
    monkeypatch.setattr(kernels, "_KERNELS", None)
    monkeypatch.setattr(kernels, "_READY", False)  # as in a process that has not used them yet
    lives = [TensorWeights(rank_index=True) for _ in range(6)]
    start = threading.Barrier(len(lives))

    def load(live: TensorWeights) -> None:
        start.wait()
        live.load(specs, words)

    threads = [threading.Thread(target=load, args=(live,)) for live in lives]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert kernels.get() is not None
    for i, live in enumerate(lives):
        assert live.warmed(120) and set(live._ranks) == {"a", "b"}, f"actor {i} built {sorted(live._ranks)}"
