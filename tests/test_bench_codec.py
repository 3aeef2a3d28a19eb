"""The codec benchmark: exact baselines, the reference trace's shape, and a tiny end-to-end run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aurora_store.codec import classes
from bench.codec import baselines, codec, trace
from bench.codec.baselines import BASELINES, Baseline

EDGE_POSITIONS = {
    "none": np.empty(0, np.int64),
    "all": np.arange(1000, dtype=np.int64),
    "first_only": np.array([0]),
    "last_only": np.array([2**20 - 1]),
    "first_and_last": np.array([0, 2**20 - 1]),
    "gap_2^14": np.array([3, 3 + 2**14, 4 + 2**14]),
    "gap_2^21": np.array([2**21 - 1, 2**22]),
    "gap_2^28": np.array([5, 5 + 2**28, 6 + 2**28 + 2**28]),
}


def _round_trip(b: Baseline, positions: np.ndarray, values: np.ndarray) -> bytes:
    payload = b.encode(positions, values)
    got_pos, got_val = b.decode(payload, positions.size)
    assert got_pos.dtype == np.int64 and got_val.dtype == np.uint16
    np.testing.assert_array_equal(got_pos, positions)
    np.testing.assert_array_equal(got_val, values)
    return payload


def test_leb128_known_bytes() -> None:
    values = np.array([0, 1, 127, 128, 300, 624485], np.uint64)
    expected = bytes([0x00, 0x01, 0x7F, 0x80, 0x01, 0xAC, 0x02, 0xE5, 0x8E, 0x26])
    assert baselines.leb128_encode(values).tobytes() == expected


@pytest.mark.parametrize(
    ("value", "length"),
    [(0, 1), (2**7 - 1, 1), (2**7, 2), (2**14 - 1, 2), (2**14, 3), (2**28 - 1, 4), (2**28, 5), (2**63, 10)],
)
def test_leb128_lengths_at_boundaries(value: int, length: int) -> None:
    encoded = baselines.leb128_encode(np.array([value], np.uint64))
    assert encoded.size == length
    assert baselines.leb128_decode(encoded, 1).tolist() == [value]


def test_leb128_full_uint64_range() -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [rng.integers(0, 2**64 - 1, 500, np.uint64, endpoint=True), np.array([2**64 - 1, 2**63 - 1], np.uint64)]
    )
    np.testing.assert_array_equal(baselines.leb128_decode(baselines.leb128_encode(values), values.size), values)


def test_leb128_rejects_malformed() -> None:
    encoded = baselines.leb128_encode(np.array([5, 300], np.uint64))
    with pytest.raises(ValueError, match="LEB128"):
        baselines.leb128_decode(encoded, 3)
    with pytest.raises(ValueError, match="LEB128"):
        baselines.leb128_decode(encoded[:-1], 2)  # truncated: the last varint has no end
    with pytest.raises(ValueError, match="overflows"):
        baselines.leb128_decode(np.array([0xFF] * 9 + [0x02], np.uint8), 1)


@pytest.mark.parametrize("b", BASELINES, ids=lambda b: b.name)
@pytest.mark.parametrize("case", list(EDGE_POSITIONS))
def test_baselines_round_trip_edge_cases(b: Baseline, case: str) -> None:
    positions = EDGE_POSITIONS[case]
    values = np.random.default_rng(1).integers(0, 2**16, positions.size).astype(np.uint16)
    _round_trip(b, positions, values)


def test_leb128_payload_size() -> None:
    """Gaps ``pos[0]+1, ...`` as varints, then two raw bytes per value: nothing else."""
    positions = EDGE_POSITIONS["gap_2^28"]  # gaps 6, 2^28, 2^28 + 1
    values = np.array([0x1234, 0xFFFF, 0x0001], np.uint16)
    payload = _round_trip(BASELINES[0], positions, values)
    assert len(payload) == 1 + 5 + 5 + 2 * 3
    assert payload[-6:] == values.astype("<u2").tobytes()


def test_pulse_rejects_wrong_count() -> None:
    payload = baselines.pulse_zstd1_encode(np.array([1, 2]), np.array([7, 8], np.uint16))
    with pytest.raises(ValueError, match="pulse_zstd1"):
        baselines.pulse_zstd1_decode(payload, 3)


@st.composite
def sparse_changes(draw: st.DrawFn, limit: int) -> tuple[np.ndarray, np.ndarray]:
    positions = np.array(sorted(draw(st.sets(st.integers(0, limit), max_size=200))), np.int64)
    values = draw(st.lists(st.integers(0, 2**16 - 1), min_size=positions.size, max_size=positions.size))
    return positions, np.array(values, np.uint16)


@settings(max_examples=150, deadline=None)
@given(sparse_changes(2**40))
def test_aurora_leb128_round_trips(changes: tuple[np.ndarray, np.ndarray]) -> None:
    _round_trip(BASELINES[0], *changes)


@settings(max_examples=150, deadline=None)
@given(sparse_changes(2**31 - 2))
def test_pulse_zstd1_round_trips(changes: tuple[np.ndarray, np.ndarray]) -> None:
    _round_trip(BASELINES[1], *changes)


def test_trace_has_qwen3_0_6b_shapes() -> None:
    shapes = trace.parameter_shapes(trace.QWEN3_0_6B)
    assert len(shapes) == 2 + 28 * 11 and "lm_head.weight" not in shapes
    assert shapes["model.embed_tokens.weight"] == (151936, 1024)
    assert shapes["model.layers.27.self_attn.q_proj.weight"] == (2048, 1024)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (1024, 1024)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (1024, 2048)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (128,)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (1024, 3072)
    assert trace.parameter_count(28) == 596_049_920


def test_trace_is_seeded_and_publishes_bf16() -> None:
    def first_two(seed: int) -> list[dict[str, np.ndarray]]:
        return [bits for _, bits in trace.steps(0, 1, seed, vocab=2048)]

    a, b, c = first_two(3), first_two(3), first_two(4)
    name = "model.embed_tokens.weight"
    assert list(a[0]) == [name, "model.norm.weight"]
    for x, y in zip(a, b, strict=True):
        assert all(np.array_equal(x[k], y[k]) for k in x)
    assert not np.array_equal(a[0][name], c[0][name])
    assert a[0][name].dtype == np.uint16 and a[0][name].shape == (2048, 1024)
    assert np.all(a[0]["model.norm.weight"] == 0x3F80)  # BF16 1.0
    assert 0 < np.count_nonzero(a[0][name] != a[1][name]) < a[0][name].size // 10


def test_measure_step_counts_exact_changes_of_any_bit_pattern() -> None:
    rng = np.random.default_rng(5)
    old = {"a": rng.integers(0, 2**16, (64, 33)).astype(np.uint16), "b": np.zeros(10, np.uint16)}
    old["a"].reshape(-1)[[0, 5, 6]] = 0x3F80
    new = {k: v.copy() for k, v in old.items()}
    flat = new["a"].reshape(-1)
    flat[[0, 5, 6, 2111]] = [0x7FC1, 0x8000, 0xFF80, flat[2111] ^ 1]  # NaN payload, -0, -inf, one ULP
    new["b"][9] = 0x0001  # smallest subnormal
    r = codec.measure_step(1, old, new, repeats=1)
    assert (r["changed"], r["elements"]) == (5, 64 * 33 + 10)
    assert r["density"] == 5 / (64 * 33 + 10)
    assert r["bytes"]["dense"] == 2 * r["elements"]


@pytest.fixture(scope="module")
def tiny() -> dict:
    return codec.measure(layers=1, steps=2, seed=0, vocab=32, repeats=2)


@pytest.mark.slow
def test_measure_reports_the_json_shape(tiny: dict) -> None:
    r = json.loads(json.dumps(tiny))
    assert r["bench"] == "codec" and r["params"] == trace.parameter_count(1, 32)
    assert [s["step"] for s in r["steps"]] == [1, 2]
    for s in r["steps"]:
        assert 0 < s["density"] < 0.2
        assert set(s["bytes_per_changed"]) == {"ours", "sparse", "aurora_leb128", "pulse_zstd1", "dense"}
        assert s["bytes_per_changed"]["dense"] == pytest.approx(2 / s["density"])
        assert set(s["time_ratio"]) == {
            "encode_vs_scan",
            "decode_vs_scan",
            "apply_vs_scan",
            "apply_vs_sparse",
            "sparse_encode_vs_scan",
            "sparse_decode_vs_scan",
            "indexed_decode_vs_decode",
        }
        indexed = {"indexed_decode"} if classes.compiled() else set()  # through rank indexes: kernels only
        assert (
            set(s["seconds"])
            == {
                "scan",
                "encode",
                "decode",
                "apply",
                "sparse_encode",
                "sparse_decode",
                "sparse_apply",
            }
            | indexed
        )
        assert set(s["link_s"]) == {"0.25 Gbps", "1 Gbps", "10 Gbps"}
        assert s["link_s"]["0.25 Gbps"] == pytest.approx(s["bytes"]["ours"] * 8 / 0.25e9)
        assert sum(s["blocks_by_codec"].values()) > 0
        assert all(v > 0 for v in s["seconds"].values())
        assert s["peak_rss_mb"] > 0
    summary = r["summary"]
    assert summary["over_steps"] == [1, 2]  # fewer than SUMMARY_FROM steps: all of them
    assert set(summary["targets"]) == {
        "bytes_per_changed_le_0.95",
        "encode_vs_scan_le_2.0",
        "decode_vs_scan_le_1.5",
        "apply_no_slower_than_sparse",
        "smaller_than_both_baselines_ge_2.3x",
    }
    assert all(isinstance(v, bool) for v in summary["targets"].values())


def test_ours_is_smaller_than_both_baselines(tiny: dict) -> None:
    for s in tiny["steps"]:
        per = s["bytes_per_changed"]
        assert per["ours"] < min(per["aurora_leb128"], per["pulse_zstd1"])
        assert per["ours"] <= per["sparse"]  # the writer keeps the sparse coding of a block where it is smaller
        assert min(s["smaller_than"].values()) >= 1


@pytest.mark.parametrize("encode", [codec.encode, codec.encode_sparse], ids=["ours", "sparse"])
def test_both_codings_are_bit_exact_on_the_trace(encode) -> None:  # type: ignore[no-untyped-def]
    (_, old), (_, new) = trace.steps(0, 1, 11, vocab=4096)
    blocks = encode(old, new)
    target = {k: a.reshape(-1).copy() for k, a in old.items()}
    codec.apply(codec.decode(blocks, {k: a.reshape(-1) for k, a in old.items()}), target)
    for k, a in new.items():
        assert np.array_equal(target[k], a.reshape(-1)), k
    assert sum(b.header.count for _, b in blocks.values()) > 0


@pytest.mark.slow
def test_device_bench_reports_every_pass_against_the_bare_one() -> None:
    from bench.codec import device as codec_device

    r = json.loads(json.dumps(codec_device.measure(0, 2, 11, 4096, "cpu", 2)))
    assert r["bench"] == "codec" and r["device"] == "cpu" and [s["step"] for s in r["steps"]] == [1, 2]
    for s in r["steps"]:
        assert 0 < s["changed"] < s["elements"]
        assert set(s["seconds"]) == {"bare", "extract", "extract_classed", "lookup", "stage", "apply"}
        assert set(s["vs_bare"]) == set(s["seconds"]) - {"bare"} and all(v > 0 for v in s["vs_bare"].values())
    assert set(r["summary"]["targets"]) == {
        "extract_ge_0.5_of_bare",
        "apply_ge_0.5_of_bare",
        "extract_classed_ge_0.5_of_bare",
    }


def test_device_flag_is_checked() -> None:
    from aurora_store.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "codec", "--device", "tpu", "--json"])
    assert exit_.value.code == 2
