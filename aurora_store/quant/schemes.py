"""The quantized artefacts a trainer can publish (issue 37): pure functions of its FP32 weights.

Actors hold exactly the bits the trainer published, so quantization happens once, in the trainer,
by these functions, and is reproducible bit for bit from the masters: numpy on FP32 values, IEEE
754 single-precision arithmetic (correctly rounded on every machine), explicit rounding and
tie-breaking, no device kernels. ``docs/FORMAT.md`` §6a states the layouts and rules; the golden
vectors in ``tests/test_quant.py`` pin them.

- ``fp8-e4m3-block128``: a linear layer's ``weight`` [N, K] as E4M3 words
  (:mod:`aurora_store.quant.e4m3`) in 128 x 128 blocks, each with one FP32 scale in
  ``weight_scale_inv`` [ceil(N/128), ceil(K/128)], so that ``weight ~= e4m3 x weight_scale_inv``
  element-wise over its block: the layout of DeepSeek-V3's and Qwen3-FP8's checkpoints, which
  vLLM's block-FP8 loader serves (``quantization_config`` ``{"quant_method": "fp8",
  "weight_block_size": [128, 128]}``).
- ``int8-w8a8-channel``: a linear layer's ``weight`` as INT8, symmetric, one FP32 scale per output
  channel in ``weight_scale`` [N, 1] (``weight ~= int8 x weight_scale``); activations quantized per
  token at run time: compressed-tensors' ``int-quantized`` format, which vLLM's W8A8 INT8 scheme
  serves (its CPU build too).

Only the decoder's linear projections are quantized; embeddings, norms and the output head stay
in the run's dtype (BF16) in the same version.

:func:`quantize` quantizes the weights as the run publishes them in BF16 (its masters rounded to
nearest even, widened exactly back to FP32), not the FP32 masters: a block's scale then changes only
when its largest BF16 value does. Measured by ``aurora bench quant`` on SmolLM2-135M's Adam trace
at ~1% BF16 density (``bench/results/quant-smollm2.json``): no FP8 scale changed in 6 steps this way,
99% of them every step from the FP32 masters (each block's largest master moves each step), which
re-quantizes whole blocks and doubles the delta.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from aurora_store.errors import UnsupportedError
from aurora_store.format import dtypes
from aurora_store.quant import e4m3

BLOCK = 128
"""The side of an FP8 scale's block."""
INT8_MAX = 127
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections quantized (by module name); every other tensor stays in the run's dtype."""


@dataclass(frozen=True, slots=True)
class Quantized:
    """One weight's quantized words and their scales, as a version publishes them."""

    words: np.ndarray
    """uint8 words, the weight's shape: E4M3 patterns, or INT8 as two's complement."""
    scale: np.ndarray
    """FP32 scales: [ceil(N/128), ceil(K/128)] per block, or [N, 1] per channel."""
    scale_name: str
    """The scale's tensor suffix beside ``weight``: ``weight_scale_inv`` or ``weight_scale``."""
    dtype: str
    """The words' safetensors dtype: ``F8_E4M3`` or ``I8``."""


def fp8_block128(weight: np.ndarray) -> Quantized:
    """``weight`` [N, K] (FP32) as E4M3 words with one FP32 scale per 128 x 128 block.

    Per block: ``amax`` = the largest magnitude; ``scale = amax / 448`` (FP32 division, rounded to
    nearest even), or 1.0 for a block of zeros; each word = E4M3(``w / scale``) with the FP32 quotient
    rounded to nearest even, then to E4M3 nearest even, saturating at 448. A NaN or infinite weight is
    refused: no scale would represent it."""
    w = _matrix(weight)
    n, k = w.shape
    rows, cols = -(-n // BLOCK), -(-k // BLOCK)
    pad = np.zeros((rows * BLOCK, cols * BLOCK), dtype=np.float32)  # zeros never raise a block's amax
    pad[:n, :k] = np.abs(w)
    amax = pad.reshape(rows, BLOCK, cols, BLOCK).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / np.float32(e4m3.MAX), np.float32(1.0)).astype(np.float32)
    per = np.repeat(np.repeat(scale, BLOCK, axis=0), BLOCK, axis=1)[:n, :k]
    words = e4m3.encode((w / per).astype(np.float32))
    return Quantized(words, scale, "weight_scale_inv", "F8_E4M3")


def int8_channel(weight: np.ndarray) -> Quantized:
    """``weight`` [N, K] (FP32) as symmetric INT8 with one FP32 scale per output channel (row).

    Per row: ``amax`` = the largest magnitude; ``scale = amax / 127`` (FP32, nearest even), or 1.0 for a
    row of zeros; each value = ``w / scale`` (FP32, nearest even) rounded to the nearest integer, ties to
    even, clamped to [-127, 127] (never -128: the range is symmetric). A NaN or infinite weight is refused."""
    w = _matrix(weight)
    amax = np.abs(w).max(axis=1, keepdims=True) if w.shape[1] else np.zeros((w.shape[0], 1), np.float32)
    scale = np.where(amax > 0, amax / np.float32(INT8_MAX), np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint((w / scale).astype(np.float32)), -INT8_MAX, INT8_MAX).astype(np.int8)
    return Quantized(q.view(np.uint8), scale, "weight_scale", "I8")


SCHEMES = {"fp8-e4m3-block128": fp8_block128, "int8-w8a8-channel": int8_channel}
"""Each scheme's quantizer, by the name ``--publish-dtype`` takes."""


@dataclass(frozen=True, slots=True)
class Layout:
    """What a scheme publishes for one weight [N, K], without quantizing it: the words' dtype and the
    scale's name and shape (every rank of a sharded trainer lists them; one rank quantizes)."""

    dtype: str
    scale_name: str
    scale_shape: tuple[int, int]


def layout(scheme: str, shape: tuple[int, ...]) -> Layout:
    """The layout ``scheme`` gives a weight of ``shape`` (a matrix)."""
    quantizer(scheme)  # an unknown scheme is refused by name
    if len(shape) != 2:
        raise UnsupportedError(f"a quantized weight must be a matrix, got shape {shape}")
    n, k = shape
    if scheme == "fp8-e4m3-block128":
        return Layout("F8_E4M3", "weight_scale_inv", (-(-n // BLOCK), -(-k // BLOCK)))
    return Layout("I8", "weight_scale", (n, 1))


def scale_of(weight_name: str, scale_name: str) -> str:
    """The scale tensor's name beside a quantized ``<module>.weight``."""
    return weight_name[: -len("weight")] + scale_name


def bf16_values(weight: np.ndarray) -> np.ndarray:
    """FP32 ``weight`` rounded to BF16 (nearest even, as torch rounds), as FP32 values again (exact)."""
    return dtypes.bf16_widened(dtypes.bf16_words(weight))


def quantize(scheme: str, weight: np.ndarray) -> Quantized:
    """``weight`` (the trainer's FP32 master) as ``scheme`` publishes it: quantized from its BF16 value."""
    return quantizer(scheme)(bf16_values(weight))


def quantizer(scheme: str) -> Callable[[np.ndarray], Quantized]:
    """The quantizer of ``scheme``, or an UnsupportedError naming the schemes there are."""
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise UnsupportedError(f"quantization scheme {scheme!r}: expected one of {', '.join(SCHEMES)}") from None


def quantized_names(names: Iterable[str]) -> list[str]:
    """The tensors of a model a scheme quantizes: the ``weight`` of every decoder linear projection."""
    return [n for n in names if n.endswith(".weight") and n.rsplit(".", 2)[-2] in LINEAR]


def dequantize(q: Quantized) -> np.ndarray:
    """The FP32 values the words and scales stand for (what an engine computes with)."""
    if q.dtype == "F8_E4M3":
        n, k = q.words.shape
        per = np.repeat(np.repeat(q.scale, BLOCK, axis=0), BLOCK, axis=1)[:n, :k]
        return (e4m3.decode(q.words) * per).astype(np.float32)
    return (q.words.view(np.int8).astype(np.float32) * q.scale).astype(np.float32)


def _matrix(weight: np.ndarray) -> np.ndarray:
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 2:
        raise UnsupportedError(f"a quantized weight must be a matrix, got shape {w.shape}")
    if not np.isfinite(w).all():
        raise UnsupportedError("a weight to quantize holds NaN or infinity: no scale represents it")
    return w


def hf_quantization_config(scheme: str) -> dict[str, object]:
    """The ``quantization_config`` a HF ``config.json`` names the scheme's checkpoints by, as vLLM's
    loaders read it: ``fp8`` with 128 x 128 weight blocks and dynamic activations (vLLM's block-FP8
    linear method, as DeepSeek-V3's and Qwen3-FP8's configs say), or compressed-tensors
    ``int-quantized`` W8A8 (INT8 weights per output channel, static; INT8 activations per token,
    dynamic: vLLM's ``CompressedTensorsW8A8Int8``). Only ``Linear`` layers are targets; the output
    head is left out by name (it stays BF16 in every version)."""
    quantizer(scheme)
    if scheme == "fp8-e4m3-block128":
        return {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK],
        }
    int8 = {"num_bits": 8, "type": "int", "symmetric": True}
    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {**int8, "strategy": "channel", "dynamic": False},
                "input_activations": {**int8, "strategy": "token", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }
