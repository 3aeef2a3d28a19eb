"""Round trips and hostile payloads for the sparse and dense codecs, their registry and headers,
and zstd framing."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aurora_store import codec
from aurora_store.codec import dense, frames, sparse
from aurora_store.codec.base import Encoded, Exponent, Span
from aurora_store.codec.words import block_of
from aurora_store.errors import CorruptError, LimitError, StoreError
from tests.helpers import decoded_change

SPECIAL16 = [0x0000, 0x8000, 0x7FC0, 0x7FC1, 0xFFFF, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x3F80, 0x7F7F]


EXPONENT = {2: Exponent(7, 8), 4: Exponent(23, 8)}
"""BF16 and F32 exponent fields."""


def roundtrip(old: np.ndarray, new: np.ndarray) -> Encoded:
    pos = sparse.changed_positions(old, new)
    exp = EXPONENT[old.dtype.itemsize]
    blk = sparse.encode(pos, old[pos], new[pos], exp)
    got = sparse.decode(blk.payload, blk.header, Span(old.size, old.dtype.itemsize, exp), block_of(old), "t")
    assert got.delta is not None and got.words is None
    out = old.copy()
    sparse.apply(out, 0, got.positions, got.delta)
    assert np.array_equal(got.positions, pos)
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
    assert blk.header.gap_width == 8 and blk.header.count == 2 and blk.header.escapes == 0
    got = sparse.decode(blk.payload, blk.header, Span(2**33, 2, EXPONENT[2]), _Zeros(), "t")
    assert got.positions.tolist() == [0, 2**32 + 5] and got.delta is not None and got.delta.tolist() == [1, 1]
    del old


class _Zeros:
    """A parent of zeros too large to hold: the sparse codec reads it only at the changes."""

    def at(self, positions: np.ndarray) -> np.ndarray:
        return np.zeros(positions.size, np.uint16)

    def words(self) -> np.ndarray:
        raise AssertionError("the sparse codec never reads a whole range")


def test_ulp_steps_cost_a_nibble() -> None:
    rng = np.random.default_rng(0)
    old = rng.integers(0x3C00, 0x3D00, 100_000, dtype=np.uint16)
    new = old.copy()
    idx = rng.choice(old.size, 2000, replace=False)
    new[idx] += rng.choice(np.array([1, 0xFFFF], np.uint16), idx.size)
    h = roundtrip(old, new).header
    assert h.escapes == 0 and h.streams[1] + h.streams[2] < 2000 * 0.2


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
    h = roundtrip(old, new).header
    assert 0 < h.split <= 256 and h.streams[1] > 0 and h.streams[2] > 0
    sym = np.minimum((step << 1) ^ (step >> 63), 15).astype(np.uint8)[np.argsort(idx)]
    one_table = len(frames.compress((sym[0::2] | (sym[1::2] << 4)).tobytes()))
    assert h.streams[1] + h.streams[2] < 0.8 * one_table


def _decode(blk: Encoded, span: int = 100, payload: bytes | None = None, **over: Any) -> None:
    """Decode ``blk`` with some header fields overridden (as a hostile manifest could)."""
    header = dataclasses.replace(blk.header, **over)
    parent = block_of(np.arange(100, dtype=np.uint16))
    sparse.decode(blk.payload if payload is None else payload, header, Span(span, 2, EXPONENT[2]), parent, "blk")


@pytest.fixture
def block() -> Encoded:
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
def test_sparse_hostile_metadata(block: Encoded, override: dict[str, Any], match: str) -> None:
    with pytest.raises(CorruptError, match=match):
        _decode(block, **override)


def test_sparse_hostile_streams(block: Encoded) -> None:
    g, lo, s, e = block.header.streams  # split 0: every symbol is in the second stream
    assert block.header.split == 0
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
    enc = dense.encode(words)
    assert enc.header.count == words.size
    if words.size:  # an empty range has no block
        got = codec.get("dense").decode(
            enc.payload, enc.header, Span(words.size, 8, Exponent(0, 0)), block_of(words), "d"
        )
        assert np.array_equal(got.words, words) and np.array_equal(got.positions, np.arange(words.size))


@given(st.binary(max_size=200), st.integers(0, 3), st.integers(0, 3), st.integers(0, 64))
@settings(max_examples=300)
def test_sparse_decode_never_crashes_on_garbage(payload: bytes, count: int, escapes: int, cut: int) -> None:
    a = min(cut, len(payload))
    b = min(a + cut, len(payload))
    c = min(b + cut // 2, len(payload))
    header = sparse.SparseHeader(count, 4, escapes, cut * 4, (a, b - a, c - b, len(payload) - c))
    parent = np.arange(64, dtype=np.uint16)
    try:
        got = sparse.decode(payload, header, Span(64, 2, EXPONENT[2]), block_of(parent), "fuzz")
    except StoreError:
        return
    # what decodes is a real change of the parent, and coding it again gives it back bit-exact
    roundtrip(parent, decoded_change(parent, got, count))


def test_empty_frames_are_checked_too() -> None:
    empty = frames.compress(b"")
    assert frames.decompress(empty, 0, "e") == b""
    with pytest.raises(CorruptError, match="extra bytes"):
        frames.decompress(empty + b"junk", 0, "e")


def test_registry_names_every_codec_and_nothing_else() -> None:
    assert codec.names() == ["classed", "dense", "sparse"]
    assert codec.get("sparse") is sparse.CODEC and codec.get("dense") is dense.CODEC
    assert codec.get("lz4") is None and codec.get(None) is None and codec.get(["sparse"]) is None


def test_headers_round_trip_through_the_manifest_entries(block: Encoded) -> None:
    span = Span(100, 2, EXPONENT[2])
    doc = sparse.CODEC.header_dict(block.header)
    assert set(doc) == sparse.CODEC.fields
    assert sparse.CODEC.parse_header(doc, length=len(block.payload), span=span, what="b") == block.header
    dense_doc = dense.CODEC.header_dict(dense.DenseHeader(100))
    assert dense.CODEC.parse_header(dense_doc, length=9, span=span, what="b") == dense.DenseHeader(100)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"count": 0}, r"count must be an integer in \[1, 100\]"),
        ({"count": True}, "count must be an integer"),
        ({"gap_width": 5}, "gap_width must be 4 or 8"),
        ({"streams": "1,2"}, "streams must be a list"),
        ({"streams": [1, 2, 3]}, "do not tile"),
        ({"streams": [0, 0, 0, -1]}, "streams must be an integer"),
        ({"escapes": 9}, r"escapes must be an integer in \[0, 3\]"),
        ({"split": 257}, r"split must be an integer in \[0, 256\]"),
    ],
)
def test_hostile_sparse_headers(block: Encoded, override: dict[str, Any], match: str) -> None:
    doc = {**sparse.CODEC.header_dict(block.header), **override}
    with pytest.raises(CorruptError, match=match):
        sparse.CODEC.parse_header(doc, length=len(block.payload), span=Span(100, 2, EXPONENT[2]), what="b")


def test_a_dense_block_codes_its_whole_range() -> None:
    with pytest.raises(CorruptError, match="counts every element"):
        dense.CODEC.parse_header({"count": 99}, length=9, span=Span(100, 2, EXPONENT[2]), what="b")
    with pytest.raises(CorruptError, match="over a range of 100"):
        dense.decode(
            dense.encode(np.zeros(99, np.uint16)).payload, dense.DenseHeader(99), Span(100, 2, EXPONENT[2]), "b"
        )
