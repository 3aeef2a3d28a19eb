"""The classed codec: positions coded within the parent's exponent classes, Rice-coded ranks.

Round trips (compiled kernels and the numpy paths, which must give the same bytes), the
multi-threaded passes, the writer's choice between classed and sparse, and hostile payloads:
every bad stream is a CorruptError, never a crash or a wrong decode."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aurora_store import codec
from aurora_store.codec import classed, classes, frames, kernels, rice, sparse
from aurora_store.codec.base import Encoded, Exponent, Span
from aurora_store.codec.words import block_of
from aurora_store.errors import CorruptError, StoreError
from aurora_store.format import dtypes
from aurora_store.format.delta import DeltaBuilder, code_block
from aurora_store.format.manifest import TensorSpec
from tests.helpers import decoded_change

BF16 = dtypes.dtype("BF16")
F32 = dtypes.dtype("F32")
F16 = dtypes.dtype("F16")
SPECIAL16 = [0x0000, 0x8000, 0x7FC0, 0x7FC1, 0xFFFF, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x3F80, 0x7F7F]

pytestmark = pytest.mark.skipif(not classes.compiled(), reason="the codec's kernels need numba")


def bf16(x: np.ndarray) -> np.ndarray:
    """FP32 values rounded to BF16 (nearest even), as words."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def trained_step(n: int, seed: int = 0, drift: float = 2e-6) -> tuple[np.ndarray, np.ndarray]:
    """A BF16 tensor before and after an Adam-like step of its FP32 masters (about 1-3% change)."""
    rng = np.random.default_rng(seed)
    masters = rng.normal(0, 0.02, n).astype(np.float32)
    step = np.float32(drift) * rng.choice(np.array([-1.0, 1.0], np.float32), n)
    return bf16(masters), bf16(masters + step)


def code(old: np.ndarray, new: np.ndarray, dt: dtypes.DType = BF16) -> Encoded:
    ex = classes.extract(old, new, dt.exponent)
    return classed.encode(ex.positions, ex.old, ex.new, dt.exponent, ex.classes, ex.ranks)


def decode(enc: Encoded, old: np.ndarray, dt: dtypes.DType = BF16, payload: bytes | None = None, **over: Any) -> Any:
    header = dataclasses.replace(enc.header, **over)
    data = enc.payload if payload is None else payload
    return classed.decode(data, header, dt.span(old.size), block_of(old), "blk")


def roundtrip(old: np.ndarray, new: np.ndarray, dt: dtypes.DType = BF16) -> Encoded:
    pos = np.flatnonzero(old != new)
    enc = code(old, new, dt)
    got = decode(enc, old, dt)
    out = old.copy()
    sparse.apply(out, 0, got.positions, got.delta)
    assert np.array_equal(got.positions, pos)
    assert np.array_equal(out, new)
    return enc


@st.composite
def word_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, dtypes.DType]:
    dt = draw(st.sampled_from([BF16, F16, F32]))
    word = np.dtype(f"<u{dt.width}")
    n = draw(st.integers(1, 400))
    old = draw(
        hnp.arrays(word, n, elements=st.one_of(st.sampled_from(SPECIAL16), st.integers(0, 2 ** (8 * dt.width) - 1)))
    )
    pattern = draw(st.sampled_from(["all", "first", "last", "random", "ulp"]))
    new = old.copy()
    if pattern == "all":
        new = new + word.type(1 + draw(st.integers(0, 1000)))
    elif pattern == "first":
        new[0] ^= word.type(0x8000)
    elif pattern == "last":
        new[-1] = old[-1] ^ word.type(1)
    else:
        mask = draw(hnp.arrays(np.bool_, n))
        if pattern == "random":
            new[mask] = draw(hnp.arrays(word, n))[mask]
        else:
            steps = draw(hnp.arrays(np.int8, n, elements=st.sampled_from([-1, 1, -2, 2, 40])))
            new[mask] = (old[mask].astype(np.int64) + steps[mask]).astype(word)
    if not (old != new).any():
        new[0] = old[0] ^ word.type(1)
    return old, new, dt


@given(word_pairs())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_round_trip_every_bit_pattern(case: tuple[np.ndarray, np.ndarray, dtypes.DType]) -> None:
    roundtrip(*case)


@given(word_pairs())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_numpy_paths_write_and_read_the_same_bytes(case: tuple[np.ndarray, np.ndarray, dtypes.DType]) -> None:
    old, new, dt = case
    compiled = code(old, new, dt)
    with kernels.disabled():
        assert not classes.compiled()
        plain = code(old, new, dt)
        got = decode(compiled, old, dt)
    assert plain == compiled
    assert np.array_equal(got.positions, np.flatnonzero(old != new))


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    saved = os.environ.get("AURORA_CODEC_THREADS")
    os.environ["AURORA_CODEC_THREADS"] = str(n)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["AURORA_CODEC_THREADS"]
        else:
            os.environ["AURORA_CODEC_THREADS"] = saved


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_passes_split_over_threads_give_one_pass_result(n_threads: int) -> None:
    """A range split into parts (an odd size, so the cuts round) extracts and locates exactly as one pass."""
    old, new = trained_step(3 * (1 << 20) + 12345, seed=n_threads)
    with threads(1):
        one = code(old, new)
    with threads(n_threads):
        ex = classes.extract(old, new, BF16.exponent)
        assert np.array_equal(ex.positions, np.flatnonzero(old != new))
        many = code(old, new)
        got = decode(many, old)
    assert many == one
    assert np.array_equal(got.positions, ex.positions)
    assert np.array_equal(old[got.positions] + got.delta, new[got.positions])


def test_ranks_count_the_elements_of_their_class_before_them() -> None:
    old = np.array([0x3F80, 0x3C00, 0x3F81, 0x3C01, 0x3F82, 0x3C02], "<u2")  # classes 127, 120 alternate
    new = old.copy()
    new[[2, 3, 5]] += np.uint16(1)
    ex = classes.extract(old, new, BF16.exponent)
    assert ex.positions.tolist() == [2, 3, 5]
    assert ex.classes.tolist() == [127, 120, 120]
    assert ex.ranks.tolist() == [1, 1, 2]
    assert classes.sizes(old, BF16.exponent)[[120, 127]].tolist() == [3, 3]


def test_trained_weights_cost_less_than_the_sparse_codec() -> None:
    """On weights whose change rate follows the exponent, the classed codec is the smaller by a margin."""
    old, new = trained_step(200_000)
    ours = roundtrip(old, new)
    pos = np.flatnonzero(old != new)
    theirs = sparse.encode(pos, old[pos], new[pos], BF16.exponent)
    assert len(ours.payload) < 0.85 * len(theirs.payload)
    assert ours.header.classes >= 5


@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(0, 20)), min_size=1, max_size=6),
    st.integers(0, 2**31),
)
@settings(max_examples=200, deadline=None)
def test_rice_round_trip(runs: list[tuple[int, int]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = np.array([c for c, _ in runs], np.int64)
    ks = np.array([k for _, k in runs], np.uint8)
    values = np.concatenate([rng.integers(0, 1 << min(k + 3, 40), c) for c, k in runs]).astype(np.int64)
    unary, rem = rice.encode(values, counts, ks)
    assert np.array_equal(rice.decode(unary, rem, counts, ks, "r"), values)
    with kernels.disabled():
        assert rice.encode(values, counts, ks) == (unary, rem)
        assert np.array_equal(rice.decode(unary, rem, counts, ks, "r"), values)


def test_rice_parameter_fits_the_mean_of_geometric_values() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.geometric(p, 5000) - 1 for p in (0.5, 0.05, 0.005)]).astype(np.int64)
    counts = np.array([5000, 5000, 5000], np.int64)
    ks = rice.best_k(values, counts)
    bits = [int((v >> k).sum()) + v.size * (k + 1) for v, k in zip(np.split(values, 3), ks.tolist(), strict=True)]
    for i, v in enumerate(np.split(values, 3)):  # no other parameter is shorter by more than 0.5%
        best = min(int((v >> k).sum()) + v.size * (k + 1) for k in range(24))
        assert bits[i] <= best * 1.005


# ------------------------------------------------------------ the writer's choice


def test_builder_codes_a_tensor_in_many_blocks_each_ranked_from_its_own_start() -> None:
    old, new = trained_step(50_001, drift=4e-6)
    spec = TensorSpec("w", "BF16", (old.size,))
    b = DeltaBuilder(1, (spec,), segment_bytes=700)  # blocks of at most 700 changes
    sealed = [*b.add_tensor(spec, old, new), *b.finish()]
    blocks = [(blk, obj.data) for obj in sealed for blk in obj.entry.blocks]
    assert len(blocks) > 3 and [blk.codec for blk, _ in blocks[:-1]] == ["classed"] * (len(blocks) - 1)
    out = old.copy()
    for blk, data in blocks:  # the last block holds the few changes left: either codec may be the smaller
        c = codec.get(blk.codec)
        assert c is not None
        payload = bytes(data[blk.offset : blk.offset + blk.length])
        parent = block_of(old[blk.start : blk.stop])
        got = c.decode(payload, blk.header, BF16.span(blk.stop - blk.start), parent, "b")
        sparse.apply(out, blk.start, got.positions, got.delta)
    assert np.array_equal(out, new)


def test_writer_keeps_the_sparse_codec_where_it_is_smaller() -> None:
    rng = np.random.default_rng(5)
    old = rng.integers(0, 1 << 16, 4096, dtype=np.uint16)  # no exponent structure, few changes
    new = old.copy()
    new[rng.choice(old.size, 40, replace=False)] ^= np.uint16(1)
    ex = classes.extract(old, new, BF16.exponent)
    enc, name = code_block(ex, BF16.exponent, old.size)
    assert name == "sparse"
    assert len(enc.payload) <= len(
        classed.encode(ex.positions, ex.old, ex.new, BF16.exponent, ex.classes, ex.ranks).payload
    )
    enc, name = code_block(ex, BF16.exponent, old.size, classed_ok=False)
    assert name == "sparse"
    tr_old, tr_new = trained_step(100_000)
    assert code_block(classes.extract(tr_old, tr_new, BF16.exponent), BF16.exponent, tr_old.size)[1] == "classed"


# ------------------------------------------------------------ hostile input


@pytest.fixture
def block() -> tuple[Encoded, np.ndarray]:
    old, new = trained_step(20_000, seed=3)
    return roundtrip(old, new), old


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"count": 0}, "changes in"),
        ({"classes": 0}, "changes in"),
        ({"classes": 300}, "changes in"),
        ({"escapes": 10**6}, "changes in"),
        ({"split": 257}, "split 257 outside"),
        ({"streams": (1, 1, 1, 1, 1, 1)}, "do not tile"),
        ({"streams": (1, 2)}, "do not tile"),
        ({"classes": 1}, "declares"),
    ],
)
def test_hostile_headers(block: tuple[Encoded, np.ndarray], override: dict[str, Any], match: str) -> None:
    enc, old = block
    with pytest.raises(StoreError, match=match):
        decode(enc, old, **override)


def _streams(enc: Encoded) -> list[bytes]:
    ends = np.cumsum(enc.header.streams).tolist()
    return [enc.payload[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def _with(enc: Encoded, i: int, data: bytes) -> tuple[bytes, tuple[int, ...]]:
    parts = _streams(enc)
    parts[i] = data
    return b"".join(parts), tuple(len(p) for p in parts)


def _table(enc: Encoded) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = enc.header.classes
    raw = frames.decompress(_streams(enc)[0], 7 * n, "t")
    return (
        np.frombuffer(raw, "<u2", n, 0).copy(),
        np.frombuffer(raw, "<u4", n, 2 * n).copy(),
        np.frombuffer(raw, np.uint8, n, 6 * n).copy(),
    )


def _retable(enc: Encoded, ids: np.ndarray, counts: np.ndarray, ks: np.ndarray) -> tuple[bytes, tuple[int, ...]]:
    raw = ids.astype("<u2").tobytes() + counts.astype("<u4").tobytes() + ks.astype(np.uint8).tobytes()
    return _with(enc, 0, frames.compress(raw))


def test_hostile_tables(block: tuple[Encoded, np.ndarray]) -> None:
    enc, old = block
    ids, counts, ks = _table(enc)
    cases = {
        "not increasing": (ids[::-1].copy(), counts, ks),
        "id past 2^E": (np.where(np.arange(ids.size) == ids.size - 1, 300, ids), counts, ks),
        "count 0": (ids, np.where(np.arange(counts.size) == 0, 0, counts), ks),
        "counts off by one": (ids, counts + (np.arange(counts.size) == 0), ks),
        "k above 40": (ids, counts, np.where(np.arange(ks.size) == 0, 41, ks)),
    }
    for name, (i, c, k) in cases.items():
        payload, streams = _retable(enc, i, c, k)
        with pytest.raises(CorruptError) as refused:
            decode(enc, old, payload=payload, streams=streams)
        assert "blk" in str(refused.value), name


def test_hostile_bit_strings(block: tuple[Encoded, np.ndarray]) -> None:
    enc, old = block
    parts = _streams(enc)
    unary, rem = parts[1], parts[2]
    bad = {
        "unary byte after its last value": _with(enc, 1, unary + b"\x80"),
        "unary short": _with(enc, 1, unary[:-1]),
        "unary padding bit": _with(enc, 1, unary[:-1] + bytes([unary[-1] | 1])) if unary[-1] & 1 == 0 else None,
        "remainders short": _with(enc, 2, rem[:-1]),
        "remainders long": _with(enc, 2, rem + b"\0"),
        "a zero unary string": _with(enc, 1, bytes(len(unary))),
    }
    for name, case in bad.items():
        if case is None:
            continue
        payload, streams = case
        with pytest.raises(CorruptError) as refused:
            decode(enc, old, payload=payload, streams=streams)
        assert "blk" in str(refused.value), name


def test_a_rank_past_its_class_in_the_parent_is_corrupt(block: tuple[Encoded, np.ndarray]) -> None:
    """Decoded against another parent (one whose classes are smaller), the ranks cannot all be placed."""
    enc, old = block
    other = np.full_like(old, 0x3F80)  # every element in one class of the parent
    with pytest.raises(CorruptError, match="rank past"):
        decode(enc, other)
    with kernels.disabled(), pytest.raises(CorruptError, match="rank past"):
        decode(enc, other)


def test_a_parent_short_of_the_ranks_is_refused(block: tuple[Encoded, np.ndarray]) -> None:
    enc, old = block
    with pytest.raises(CorruptError, match="rank"):
        classed.decode(enc.payload, enc.header, BF16.span(old.size), block_of(old[: old.size // 2]), "blk")


@given(st.binary(max_size=300), st.integers(1, 5), st.integers(1, 3), st.integers(0, 80), st.booleans())
@settings(max_examples=300, deadline=None)
def test_garbage_never_crashes(payload: bytes, count: int, n_cls: int, cut: int, plain: bool) -> None:
    cuts = sorted(min(len(payload), cut * i // 2) for i in range(1, 6))
    streams = tuple(b - a for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True))
    header = classed.ClassedHeader(count, min(n_cls, count), 0, cut % 257, streams)  # type: ignore[arg-type]
    old = np.arange(64, dtype=np.uint16) * np.uint16(997)
    try:
        with kernels.disabled() if plain else contextlib.nullcontext():
            got = classed.decode(payload, header, Span(64, 2, Exponent(7, 8)), block_of(old), "fuzz")
    except StoreError:
        return
    # what decodes is a real change of the parent, and coding it again gives it back bit-exact
    roundtrip(old, decoded_change(old, got, count))


def test_headers_round_trip_through_the_manifest_entries(block: tuple[Encoded, np.ndarray]) -> None:
    enc, old = block
    span = BF16.span(old.size)
    doc = classed.CODEC.header_dict(enc.header)
    assert set(doc) == classed.CODEC.fields
    assert classed.CODEC.parse_header(doc, length=len(enc.payload), span=span, what="b") == enc.header
    for bad in ({"classes": 0}, {"streams": doc["streams"][:5]}, {"split": 257}, {"count": -1}):
        with pytest.raises(CorruptError):
            classed.CODEC.parse_header({**doc, **bad}, length=len(enc.payload), span=span, what="b")
    with pytest.raises(CorruptError, match="exponent"):
        classed.CODEC.parse_header(doc, length=len(enc.payload), span=Span(old.size, 2, Exponent(0, 0)), what="b")
