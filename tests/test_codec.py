"""Round trips and hostile payloads for the sparse and dense codecs and zstd framing."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aurora_store.codec import dense, frames, sparse
from aurora_store.errors import CorruptError, LimitError, StoreError

SPECIAL16 = [0x0000, 0x8000, 0x7FC0, 0x7FC1, 0xFFFF, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x3F80, 0x7F7F]


EXPONENT = {2: sparse.Exponent(7, 8), 4: sparse.Exponent(23, 8)}
"""BF16 and F32 exponent fields."""


def roundtrip(old: np.ndarray, new: np.ndarray) -> sparse.SparseBlock:
    pos = sparse.changed_positions(old, new)
    exp = EXPONENT[old.dtype.itemsize]
    blk = sparse.encode(pos, old[pos], new[pos], exp)
    got_pos, delta = sparse.decode(
        blk.payload,
        count=blk.count,
        gap_width=blk.gap_width,
        escapes=blk.escapes,
        split=blk.split,
        streams=blk.streams,
        width=old.dtype.itemsize,
        span=old.size,
        exponent=exp,
        old_at=old.take,
        what="t",
    )
    out = old.copy()
    sparse.apply(out, 0, got_pos, delta)
    assert np.array_equal(got_pos, pos)
    assert np.array_equal(out, new)
    return blk


@st.composite
def word_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    width = draw(st.sampled_from([2, 4]))
    dt = np.dtype(f"<u{width}")
    n = draw(st.integers(0, 300))
    old = draw(hnp.arrays(dt, n, elements=st.one_of(st.sampled_from(SPECIAL16), st.integers(0, 2 ** (8 * width) - 1))))
    pattern = draw(st.sampled_from(["none", "all", "first", "last", "random", "ulp"]))
    new = old.copy()
    if n:
        if pattern == "all":
            new = new + dt.type(1 + draw(st.integers(0, 1000)))
        elif pattern == "first":
            new[0] ^= dt.type(0x8000)
        elif pattern == "last":
            new[-1] = draw(st.sampled_from(SPECIAL16)) if old[-1] != SPECIAL16[0] else dt.type(1)
        elif pattern == "random":
            mask = draw(hnp.arrays(np.bool_, n))
            vals = draw(hnp.arrays(dt, n))
            new[mask] = vals[mask]
        elif pattern == "ulp":
            mask = draw(hnp.arrays(np.bool_, n))
            steps = draw(hnp.arrays(np.int8, n, elements=st.sampled_from([-1, 1, -2, 2, 40])))
            new[mask] = (old[mask].astype(np.int64) + steps[mask]).astype(dt)
    return old, new


@given(word_pairs())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_sparse_round_trip(pair: tuple[np.ndarray, np.ndarray]) -> None:
    roundtrip(*pair)


def test_sparse_large_gaps_use_wide_words() -> None:
    old = np.zeros(2**33 // 2**20, np.uint16)  # small array, positions rebased below
    pos = np.array([0, 2**32 + 5], np.int64)
    blk = sparse.encode(pos, np.zeros(2, np.uint16), np.ones(2, np.uint16), EXPONENT[2])
    assert blk.gap_width == 8
    got, delta = sparse.decode(
        blk.payload,
        count=2,
        gap_width=8,
        escapes=0,
        split=blk.split,
        streams=blk.streams,
        width=2,
        span=2**33,
        exponent=EXPONENT[2],
        old_at=lambda p: np.zeros(p.size, np.uint16),
        what="t",
    )
    assert got.tolist() == [0, 2**32 + 5] and delta.tolist() == [1, 1]
    del old


def test_ulp_steps_cost_a_nibble() -> None:
    rng = np.random.default_rng(0)
    old = rng.integers(0x3C00, 0x3D00, 100_000, dtype=np.uint16)
    new = old.copy()
    idx = rng.choice(old.size, 2000, replace=False)
    new[idx] += rng.choice(np.array([1, 0xFFFF], np.uint16), idx.size)
    blk = roundtrip(old, new)
    assert blk.escapes == 0 and blk.streams[1] + blk.streams[2] < 2000 * 0.2


def test_symbol_streams_split_by_exponent() -> None:
    """Small weights take multi-ULP steps, large ones single ULPs: two entropy tables beat one."""
    rng = np.random.default_rng(1)
    old = (rng.standard_normal(200_000) * 0.02).astype(np.float32).view(np.uint32)
    old = (old >> 16).astype(np.uint16)  # BF16 bits
    new = old.copy()
    idx = rng.choice(old.size, 20_000, replace=False)
    small = ((old[idx] >> 7) & 0xFF) < 120  # |w| < 2**-7: about a third of the changes
    step = np.where(small, rng.integers(1, 12, idx.size), 1) * rng.choice([1, -1], idx.size)
    new[idx] = (old[idx].astype(np.int64) + step).astype(np.uint16)
    blk = roundtrip(old, new)
    assert 0 < blk.split <= 256 and blk.streams[1] > 0 and blk.streams[2] > 0
    sym = np.minimum((step << 1) ^ (step >> 63), 15).astype(np.uint8)[np.argsort(idx)]
    one_table = len(frames.compress((sym[0::2] | (sym[1::2] << 4)).tobytes()))
    assert blk.streams[1] + blk.streams[2] < 0.8 * one_table


def _decode(blk: sparse.SparseBlock, **over: object) -> None:
    kw: dict[str, object] = dict(
        count=blk.count,
        gap_width=blk.gap_width,
        escapes=blk.escapes,
        split=blk.split,
        streams=blk.streams,
        width=2,
        span=100,
        exponent=EXPONENT[2],
        old_at=np.arange(100, dtype=np.uint16).take,
        what="blk",
    )
    kw.update(over)
    payload = kw.pop("payload", blk.payload)
    sparse.decode(payload, **kw)  # type: ignore[arg-type]


@pytest.fixture
def block() -> sparse.SparseBlock:
    old = np.arange(100, dtype=np.uint16)
    new = old.copy()
    new[[3, 50, 99]] += np.array([1, 300, 0xFFFF], np.uint16)
    return sparse.encode(sparse.changed_positions(old, new), old[[3, 50, 99]], new[[3, 50, 99]], EXPONENT[2])


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"count": 4}, "declares"),
        ({"count": 2}, "declares"),
        ({"escapes": 0}, "escape symbols"),
        ({"gap_width": 3}, "gap width"),
        ({"span": 50}, "outside a block"),
        ({"count": 101}, "changes with"),
        ({"streams": (1, 1, 1, 1)}, "do not tile"),
        ({"streams": (1, 1, 1)}, "do not tile"),
        ({"split": 300}, "split 300 outside"),
        ({"split": 256}, "declares"),
        ({"payload": b"\0" * 30}, "not a zstd frame|do not tile"),
    ],
)
def test_sparse_hostile_metadata(block: sparse.SparseBlock, override: dict[str, object], match: str) -> None:
    with pytest.raises(CorruptError, match=match):
        _decode(block, **override)


def test_sparse_hostile_streams(block: sparse.SparseBlock) -> None:
    g, lo, s, e = block.streams  # split 0: every symbol is in the second stream
    assert block.split == 0
    raw = block.payload
    tail = raw[g + lo + s :]
    # a truncated payload
    with pytest.raises(CorruptError):
        _decode(block, payload=raw[:-1], streams=(g, lo, s, e - 1))
    # duplicated positions (a zero gap) are corrupt even with a consistent frame
    gaps = frames.compress(sparse.shuffle(np.array([1, 0, 5], np.uint32)))
    with pytest.raises(CorruptError, match="strictly increasing"):
        _decode(block, payload=gaps + raw[g:], streams=(len(gaps), lo, s, e))
    # a zero delta is not a change
    syms = frames.compress(bytes([0x10, 0x0F]))
    with pytest.raises(CorruptError, match="zero delta"):
        _decode(block, payload=raw[: g + lo] + syms + tail, streams=(g, lo, len(syms), e))
    # a non-zero padding nibble
    syms = frames.compress(bytes([0x21, 0x3F]))
    with pytest.raises(CorruptError, match="padding"):
        _decode(block, payload=raw[: g + lo] + syms + tail, streams=(g, lo, len(syms), e))
    # a frame without a declared size
    nosize = zstandard.ZstdCompressor(write_content_size=False).compress(b"\1\0\0\0" * 3)
    with pytest.raises(CorruptError, match="does not declare"):
        _decode(block, payload=nosize + raw[g:], streams=(len(nosize), lo, s, e))


def test_frames_refuse_bombs_and_trailing_data() -> None:
    bomb = frames.compress(b"\0" * (64 << 20))
    with pytest.raises(LimitError, match="declares 67108864 bytes, expected 10"):
        frames.decompress(bomb, 10, "bomb")
    ok = frames.compress(b"abc")
    assert frames.decompress(ok, 3, "ok") == b"abc"
    with pytest.raises(CorruptError, match="extra bytes"):
        frames.decompress(ok + b"x", 3, "trail")
    with pytest.raises(CorruptError, match="declares 3 bytes, expected 4"):
        frames.decompress(ok, 4, "short")


@given(hnp.arrays(np.dtype("<u8"), st.integers(0, 50)))
def test_dense_round_trip(words: np.ndarray) -> None:
    out = dense.decode(dense.encode(words), width=8, span=words.size, what="d")
    assert np.array_equal(out, words)


@given(st.binary(max_size=200), st.integers(0, 3), st.integers(0, 3), st.integers(0, 64))
@settings(max_examples=300)
def test_sparse_decode_never_crashes_on_garbage(payload: bytes, count: int, escapes: int, cut: int) -> None:
    a = min(cut, len(payload))
    b = min(a + cut, len(payload))
    c = min(b + cut // 2, len(payload))
    with contextlib.suppress(StoreError):
        sparse.decode(
            payload,
            count=count,
            gap_width=4,
            escapes=escapes,
            split=cut * 4,
            streams=(a, b - a, c - b, len(payload) - c),
            width=2,
            span=64,
            exponent=EXPONENT[2],
            old_at=np.arange(64, dtype=np.uint16).take,
            what="fuzz",
        )


def test_empty_frames_are_checked_too() -> None:
    empty = frames.compress(b"")
    assert frames.decompress(empty, 0, "e") == b""
    with pytest.raises(CorruptError, match="extra bytes"):
        frames.decompress(empty + b"junk", 0, "e")
