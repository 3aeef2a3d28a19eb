"""The seeded reference trace: a Qwen3-0.6B-shaped policy trained by Adam on noise, published in BF16.

FP32 masters start at N(0, 0.02) (norm weights at 1.0) and take Adam steps (lr 1e-6) on iid
N(0, 1e-3) gradients; each version is published by rounding to BF16 (round-to-nearest-even),
as a trainer would. Memory holds one FP32 master, the Adam state and the gradients, nothing
more: a full-scale trace is ~600M parameters, ~9.6 GB.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class Shape:
    """Model dimensions, from the public Qwen3-0.6B ``config.json``."""

    layers: int = 28
    hidden: int = 1024
    intermediate: int = 3072
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 151936
    """Embeddings are tied: there is no separate ``lm_head.weight``."""


QWEN3_0_6B = Shape()
INIT_STD = 0.02
GRAD_STD = 1e-3
LR = 1e-6
BETAS = (0.9, 0.999)
EPS = 1e-8


def parameter_shapes(shape: Shape) -> dict[str, tuple[int, ...]]:
    """HF parameter names and shapes in state-dict order."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab, h)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (shape.head_dim,),
            p + "self_attn.k_norm.weight": (shape.head_dim,),
            p + "mlp.gate_proj.weight": (shape.intermediate, h),
            p + "mlp.up_proj.weight": (shape.intermediate, h),
            p + "mlp.down_proj.weight": (h, shape.intermediate),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    out["model.norm.weight"] = (h,)
    return out


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    """Round an FP32 tensor to BF16 (nearest-even) and return its bit patterns as uint16."""
    return t.detach().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def steps(
    layers: int, n_steps: int, seed: int, vocab: int | None = None
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """Yield ``(step, {name: BF16 bits})`` for steps ``0..n_steps``; step 0 is the initial weights.

    Each snapshot is fresh: the caller may keep the previous one while the next is made."""
    shape = Shape(layers=layers, vocab=QWEN3_0_6B.vocab if vocab is None else vocab)
    gen = torch.Generator().manual_seed(seed)
    params: dict[str, torch.nn.Parameter] = {}
    for name, dims in parameter_shapes(shape).items():
        t = torch.ones(dims) if _is_norm(name) else torch.empty(dims).normal_(0.0, INIT_STD, generator=gen)
        params[name] = torch.nn.Parameter(t)
    for p in params.values():
        p.grad = torch.empty_like(p)
    opt = torch.optim.Adam(list(params.values()), lr=LR, betas=BETAS, eps=EPS, fused=True)
    yield 0, {name: bf16_bits(p) for name, p in params.items()}
    for step in range(1, n_steps + 1):
        for p in params.values():
            assert p.grad is not None
            p.grad.normal_(0.0, GRAD_STD, generator=gen)
        opt.step()
        yield step, {name: bf16_bits(p) for name, p in params.items()}


def parameter_count(layers: int, vocab: int | None = None) -> int:
    shape = Shape(layers=layers, vocab=QWEN3_0_6B.vocab if vocab is None else vocab)
    return sum(int(np.prod(d)) for d in parameter_shapes(shape).values())
