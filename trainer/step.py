"""One optimizer step of GRPO over a step's batch: micro-batches, ranks, clipping, the schedule.

The batch is the same on every rank (rank 0 broadcasts it). It is cut into micro-batches of at
most ``micro_batch_tokens`` padded tokens per rank; each micro-batch is split over the ranks,
and every rank runs every micro-batch (one with no sample of its own runs a zero-weight stand-in),
so FSDP2's collectives line up. Each part divides by the whole batch's normaliser, so the
accumulated gradient is the whole batch's. Then the gradient's global norm is clipped and the
learning rate follows warm-up then constant, a function of the step (nothing to restore).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trainer.grpo import GRPOConfig, Sample, Sums, loss, micro_batches


@dataclass(frozen=True, slots=True)
class StepStats:
    """What the step's optimizer did and saw, over the whole batch (every rank's share)."""

    tokens: int
    """Completion tokens trained on."""
    response_len: float
    """Mean completion length, in tokens."""
    kl: float | None
    """Mean k3 KL to the reference per completion token; None without a reference (--kl-coef 0)."""
    entropy: float
    """Mean entropy of the policy per completion token, in nats."""
    clip_frac: float
    """Fraction of completion tokens whose ratio left [1 - clip, 1 + clip]."""
    logprob_drift: float
    """Mean |new - old| log-probability per completion token: how far the policy moved since sampling."""
    grad_norm: float
    """The gradient's global norm before clipping (0 when nothing was trained)."""
    lr: float
    micro_batches: int
    """0 when every advantage was 0 (no group had a signal): nothing trained, and kl, entropy,
    clip_frac and logprob_drift were not measured (0)."""
    mismatch_abs: float | None = None
    """Mean |log π_old - log π_rollout| per completion token: the trainer's log-probabilities against
    the engine's at the rollout's weights. None without a rollout correction (not measured)."""
    mismatch_kl: float | None = None
    """Sequence-level KL(π_rollout ‖ π_old), the mean over completions of Σ_t log π_rollout - log π_old.
    None without a rollout correction."""
    corrected_frac: float | None = None
    """Fraction of completion tokens whose importance weight was truncated (tis) or that were dropped
    (mask). None without a rollout correction."""


def learning_rate(base: float, step: int, warmup_steps: int) -> float:
    """Linear warm-up over ``warmup_steps`` steps (step 1 is the first), then ``base``."""
    return base if warmup_steps <= 0 else base * min(1.0, step / warmup_steps)


def optimizer_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    samples: Sequence[Sample],
    adv: Sequence[float],
    cfg: GRPOConfig,
    *,
    step: int,
    base_lr: float,
    warmup_steps: int,
    max_grad_norm: float,
    micro_batch_tokens: int,
    rank: int = 0,
    world: int = 1,
    reference: torch.nn.Module | None = None,
    all_reduce: object = None,
    rollout_model: torch.nn.Module | None = None,
    before_update: Callable[[], None] | None = None,
) -> StepStats:
    """Train on ``samples`` (the whole batch, identical on every rank); collective under torchrun.
    ``rollout_model``: the weights the samples were generated with (a rollout correction needs them);
    ``before_update`` runs once the gradients are in, before the weights move."""
    lr = learning_rate(base_lr, step, warmup_steps)
    for group in opt.param_groups:
        group["lr"] = lr
    sums = Sums()
    total_tokens = sum(len(s.token_ids) for s in samples)
    normalizer = float(total_tokens if cfg.norm == "token" else len(samples))
    plan = list(micro_batches(samples, micro_batch_tokens * world)) if any(a != 0 for a in adv) else []
    opt.zero_grad(set_to_none=True)
    for members in plan:
        mine = members[rank::world]
        weight = 1.0 if mine else 0.0
        part = mine or members[:1]  # a stand-in: the collectives of a forward and backward, no gradient
        value, got = loss(
            model,
            [samples[i] for i in part],
            [adv[i] for i in part],
            cfg,
            reference,
            normalizer=normalizer,
            weight=weight,
            rollout_model=rollout_model,
        )
        value.backward()
        sums.add(got)
    if before_update is not None:
        before_update()
    grad_norm = 0.0
    if plan:
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else math.inf)
        full = getattr(norm, "full_tensor", None)  # a DTensor under FSDP2
        grad_norm = float(full() if full is not None else norm)
        opt.step()
    opt.zero_grad(set_to_none=True)
    totals = _reduced(sums, all_reduce)
    per_token = max(totals.tokens, 1.0)
    measured = cfg.correction != "none" and rollout_model is not None and bool(plan)
    return StepStats(
        tokens=total_tokens,
        response_len=total_tokens / max(len(samples), 1),
        kl=totals.kl / per_token if reference is not None else None,
        entropy=totals.entropy / per_token,
        clip_frac=totals.clipped / per_token,
        logprob_drift=totals.drift / per_token,
        grad_norm=grad_norm,
        lr=lr,
        micro_batches=len(plan),
        mismatch_abs=totals.mismatch_abs / per_token if measured else None,
        mismatch_kl=totals.mismatch_kl / max(totals.sequences, 1.0) if measured else None,
        corrected_frac=totals.corrected / per_token if measured else None,
    )


def _reduced(sums: Sums, all_reduce: object) -> Sums:
    """The metric sums of every rank (``all_reduce(list[float]) -> list[float]`` sums them; None: one rank)."""
    if all_reduce is None:
        return sums
    values = [getattr(sums, f) for f in Sums.__slots__]
    out = all_reduce(values)  # type: ignore[operator]
    return Sums(*out)
