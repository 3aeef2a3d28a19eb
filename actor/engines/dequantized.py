"""A quantized run's weights on the torch engine: the published words and scales, exactly, and the
BF16 weights the model computes from, dequantized from them after every write.

The run publishes its decoder's linear projections as a scheme's words and scales
(:mod:`aurora_store.quant.schemes`); the actor holds exactly those bits: they are the live weights
the updater decodes deltas against, stages and writes, and what ``--verify-live`` digests. A
transformers model cannot compute from FP8 or INT8 words, so each projection the model holds in BF16
is rewritten from its words and scales after every write that touched either (``words x scale`` in
FP32, rounded to BF16 nearest even: the values :func:`~aurora_store.quant.schemes.dequantize`
gives, rounded as the trainer rounds). A write costs that projection's dequantization, O(layer)
per projection touched, beside the O(changed) write of the words.

This is the torch engine's reading of a quantized version (for engines without the scheme's kernels,
and for tests); vLLM serves the words themselves (its INT8 and FP8 kernels: ``actor.engines.vllm``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from actor.live import TensorWeights
from aurora_store.format.manifest import TensorSpec
from aurora_store.quant import schemes
from aurora_store.tensors import dtype_named


class DequantizedWeights(TensorWeights):
    """The published tensors of a quantized run (words and scales of the quantized projections, the
    model's own parameters for every other tensor), feeding the model's BF16 projections."""

    def __init__(self, model: torch.nn.Module, scheme: str, *, device: str | torch.device = "cpu") -> None:
        params = dict(model.named_parameters())
        tensors: dict[str, torch.Tensor] = {}
        self._projections: dict[str, tuple[torch.nn.Parameter, str]] = {}
        """weight name -> the model's BF16 parameter, and its scale's name."""
        self._of: dict[str, str] = {}
        """words' or scale's name -> the weight name they make."""
        targets = set(schemes.quantized_names(params))
        for name, p in params.items():
            if name not in targets:
                tensors[name] = p
                continue
            lay = schemes.layout(scheme, tuple(p.shape))
            scale = schemes.scale_of(name, lay.scale_name)
            tensors[name] = torch.zeros(p.shape, dtype=dtype_named(lay.dtype), device=p.device)
            tensors[scale] = torch.ones(lay.scale_shape, dtype=torch.float32, device=p.device)
            self._projections[name] = (p, scale)
            self._of[name] = self._of[scale] = name
        super().__init__(tensors, device=device)

    def load(self, specs: tuple[TensorSpec, ...], words: Mapping[str, np.ndarray]) -> None:
        super().load(specs, words)
        self._refresh(self._projections)

    def commit(self, prepared: object) -> None:
        super().commit(prepared)
        assert isinstance(prepared, list)
        self._refresh({self._of[name] for name, *_ in prepared if name in self._of})

    def _refresh(self, names: object) -> None:
        """Rewrite the model's BF16 projections ``names`` from their words and scales."""
        with torch.no_grad():
            for name in names:  # type: ignore[attr-defined]
                param, scale = self._projections[name]
                param.copy_(dequantized(self.tensors[name], self.tensors[scale]).to(param.dtype))


def dequantized(words: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FP32 values of quantized ``words`` [N, K] (E4M3 or INT8) and their FP32 ``scale``: one per
    128 x 128 block ([ceil(N/128), ceil(K/128)]) or per row ([N, 1]); on the words' device. Equal, bit
    for bit, to :func:`aurora_store.quant.schemes.dequantize` (exact widening, one FP32 product)."""
    values = words.to(torch.float32)
    n, k = values.shape
    if tuple(scale.shape) != (n, 1):  # block scales
        block = schemes.BLOCK
        scale = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]
    return values * scale
