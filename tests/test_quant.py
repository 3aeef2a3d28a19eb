"""The trainer's quantizers (issue 37): E4M3 rounding bit for bit as torch's cast, and each scheme's
words and scales pinned by golden vectors, so a change of rounding, scale rule or tie-breaking fails
here before it reaches a run."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aurora_store.errors import UnsupportedError
from aurora_store.quant import e4m3, schemes


def _golden_matrix(n: int, k: int) -> np.ndarray:
    """A [n, k] FP32 matrix from integer arithmetic alone (the same on every machine and numpy), with an
    outlier column (its blocks get larger scales) and one 128 x 128 block of zeros."""
    i = np.arange(n * k, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(12345)) % np.uint64(1 << 32)
    w = ((h.astype(np.float64) / 2**32 - 0.5) * 0.1).astype(np.float32).reshape(n, k)
    w[:, 7] *= 40
    w[128:, 256:] = 0
    return w


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _torch_e4m3(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def test_e4m3_rounds_every_bf16_value_in_range_as_torchs_cast() -> None:
    x = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) <= e4m3.MAX)]
    assert np.array_equal(e4m3.encode(x), _torch_e4m3(x))


def test_e4m3_breaks_every_tie_to_even_as_torchs_cast() -> None:
    values = np.unique(e4m3.decode(np.arange(256, dtype=np.uint8)))
    values = values[np.isfinite(values)]
    mids = ((values[:-1].astype(np.float64) + values[1:]) / 2).astype(np.float32)  # exact in FP32
    got = e4m3.encode(mids)
    assert np.array_equal(got, _torch_e4m3(mids))
    assert np.all((got & 1) == 0), "every tie goes to the even word"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=-448, max_value=448, width=32, allow_subnormal=True), min_size=1, max_size=64))
def test_e4m3_agrees_with_torch_on_any_fp32_in_range(values: list[float]) -> None:
    x = np.array(values, dtype=np.float32)
    assert np.array_equal(e4m3.encode(x), _torch_e4m3(x))


def test_e4m3_words_round_trip_and_saturate() -> None:
    words = np.arange(256, dtype=np.uint8)
    nan = (words & 0x7F) == e4m3.NAN
    assert np.array_equal(e4m3.encode(e4m3.decode(words))[~nan], words[~nan])
    assert np.isnan(e4m3.decode(words[nan])).all()
    special = np.array([449.0, -1e30, np.inf, -np.inf, -0.0, np.nan, 2.0**-10, -(2.0**-10) * 3], dtype=np.float32)
    # saturate at +-448 (0x7E, 0xFE) where torch gives NaN; -0.0 keeps its sign; ties of subnormals to even
    assert e4m3.encode(special).tolist() == [0x7E, 0xFE, 0x7E, 0xFE, 0x80, 0x7F, 0x00, 0x82]


def test_fp8_block128_golden_vector() -> None:
    q = schemes.fp8_block128(_golden_matrix(200, 300))
    assert (q.dtype, q.scale_name, q.words.shape, q.scale.shape) == ("F8_E4M3", "weight_scale_inv", (200, 300), (2, 3))
    assert q.scale.dtype == np.float32 and q.scale[1, 2] == 1.0, "a block of zeros has scale 1"
    assert _sha(q.words) == FP8_WORDS and _sha(q.scale) == FP8_SCALES


def test_int8_channel_golden_vector() -> None:
    q = schemes.int8_channel(_golden_matrix(200, 300))
    assert (q.dtype, q.scale_name, q.words.shape, q.scale.shape) == ("I8", "weight_scale", (200, 300), (200, 1))
    assert int(q.words.view(np.int8).min()) >= -127, "symmetric: never -128"
    assert _sha(q.words) == INT8_WORDS and _sha(q.scale) == INT8_SCALES


def test_fp8_block128_is_the_usual_block_quantizer_in_torch() -> None:
    """The same words as the common torch recipe (amax / 448 per block, divide, cast), written here
    independently, on a matrix whose sides are not multiples of 128."""
    w = _golden_matrix(200, 300)
    t = torch.from_numpy(w)
    scale = torch.ones(2, 3)
    words = torch.empty(200, 300, dtype=torch.uint8)
    for i in range(2):
        for j in range(3):
            block = t[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
            amax = block.abs().max()
            s = amax / 448 if amax > 0 else torch.tensor(1.0)
            scale[i, j] = s
            q = (block / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            words[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] = q.view(torch.uint8)
    got = schemes.fp8_block128(w)
    assert np.array_equal(got.words, words.numpy()) and np.array_equal(got.scale, scale.numpy())


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 300),
    st.floats(1e-6, 1e3),
    st.integers(0, 2**32 - 1),
)
def test_dequantized_weights_are_within_half_a_step_of_the_masters(n: int, k: int, spread: float, seed: int) -> None:
    w = (np.random.default_rng(seed).standard_normal((n, k)) * spread).astype(np.float32)
    fp8 = schemes.fp8_block128(w)
    per = np.repeat(np.repeat(fp8.scale, 128, 0), 128, 1)[:n, :k]
    # E4M3 keeps 3 mantissa bits: a normal's rounding error is at most 2^-4 of it; a subnormal's 2^-10 x scale
    err = np.abs(schemes.dequantize(fp8) - w)
    assert np.all(err <= np.maximum(np.abs(w) * 2.0**-4, per * 2.0**-10) * (1 + 1e-6))
    i8 = schemes.int8_channel(w)
    # half a step, plus FP32's rounding of w / s and of q x s (each at most 2^-24 of up to 127 steps)
    assert np.all(np.abs(schemes.dequantize(i8) - w) <= i8.scale * (0.5 + 2.0**-15))


@pytest.mark.parametrize("scheme", sorted(schemes.SCHEMES))
def test_what_no_scale_represents_is_refused(scheme: str) -> None:
    quantize = schemes.quantizer(scheme)
    for bad in (np.array([[1.0, np.nan]], np.float32), np.array([[np.inf, 0.0]], np.float32)):
        with pytest.raises(UnsupportedError, match="NaN or infinity"):
            quantize(bad)
    with pytest.raises(UnsupportedError, match="must be a matrix"):
        quantize(np.zeros(4, np.float32))
    zeros = quantize(np.zeros((3, 5), np.float32))
    assert not zeros.words.any() and np.all(zeros.scale == 1.0)


def test_an_unknown_scheme_is_refused_with_the_names_there_are() -> None:
    with pytest.raises(UnsupportedError, match="fp8-e4m3-block128, int8-w8a8-channel"):
        schemes.quantizer("fp4")


def test_only_the_decoders_linear_weights_are_quantized() -> None:
    names = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.mlp.down_proj.bias",
        "model.norm.weight",
        "lm_head.weight",
    ]
    assert schemes.quantized_names(names) == [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    ]


FP8_WORDS = "63c257e1c14bd340da6b397aee25651ec2c119503c6c20a7d599129c97d825a9"
FP8_SCALES = "016b430363b9c82214e1c36c3e03e9a64b050cd3e7b3fea136383a8239f6d12d"
INT8_WORDS = "2f2be933a21a601c39da5ccccd56a210d1b451437f7e71938c136945f91e63e7"
INT8_SCALES = "58057bddce366c48e1432cb0075c90ec81609b0b83c860dbe4bc7663672d2fb9"


def test_a_scheme_quantizes_the_bf16_weights_so_a_scale_moves_only_with_its_blocks_largest_bf16_value() -> None:
    w = schemes.bf16_values(_golden_matrix(200, 300))
    moved = (w * np.float32(1 + 2**-12)).astype(np.float32)  # every master moves, within half a BF16 step
    assert not np.array_equal(moved, w) and np.array_equal(schemes.bf16_values(moved), w)
    for scheme, quantize in schemes.SCHEMES.items():
        a, b = schemes.quantize(scheme, w), schemes.quantize(scheme, moved)
        assert np.array_equal(a.words, b.words) and np.array_equal(a.scale, b.scale), scheme
        assert not np.array_equal(quantize(w).scale, quantize(moved).scale), "from FP32 every scale would move"
    x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(2.0**-140), np.inf, 3.0e38], np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(schemes.bf16_values(x), want), "nearest even, as torch rounds to BF16"
