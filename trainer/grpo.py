"""GRPO: group-relative advantages and the clipped importance-ratio loss.

For each prompt the actors sample a group of completions; a completion's advantage is its
reward minus the group mean, over the group's standard deviation. The loss is PPO's clipped
surrogate with the ratio taken against the log-probabilities the actor reported when it
sampled (so one-step-stale rollouts are corrected, and clipped), averaged over completion
tokens, plus an optional KL penalty to a frozen reference (the k3 estimator).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, kw_only=True, slots=True)
class GRPOConfig:
    """The loss's parameters (their defaults and help live in :mod:`trainer.config`)."""

    clip: float
    """Ratios outside [1 - clip, 1 + clip] stop contributing gradient in the improving direction."""
    kl_coef: float
    """Weight of the KL penalty to the reference model; 0 turns it (and the reference) off."""
    temperature: float
    """The sampling temperature the actors used; log-probabilities are taken at the same one."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One completion of a group, as an actor returned it."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    reward: float


def advantages(rewards: Sequence[float], eps: float = 1e-4) -> list[float]:
    """(r - mean) / (std + eps) within one group; all zeros when every reward is equal."""
    t = torch.tensor(rewards, dtype=torch.float64)
    if t.numel() < 2:
        return [0.0] * t.numel()
    std = t.std(unbiased=False)
    return ((t - t.mean()) / (std + eps)).tolist() if std > 0 else [0.0] * t.numel()


def batch(samples: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask, completion mask (over targets) and old log-probs."""
    seqs = [list(s.prompt_ids) + list(s.token_ids) for s in samples]
    width = max(len(x) for x in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attn = torch.zeros(len(seqs), width, dtype=torch.long)
    comp = torch.zeros(len(seqs), width - 1, dtype=torch.float32)
    old = torch.zeros(len(seqs), width - 1, dtype=torch.float32)
    for i, (s, x) in enumerate(zip(samples, seqs, strict=True)):
        ids[i, : len(x)] = torch.tensor(x)
        attn[i, : len(x)] = 1
        p, n = len(s.prompt_ids), len(s.token_ids)
        comp[i, p - 1 : p - 1 + n] = 1.0  # logits at position j predict token j + 1
        old[i, p - 1 : p - 1 + n] = torch.tensor(s.logprobs, dtype=torch.float32)
    return ids, attn, comp, old


def token_logprobs(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(token j+1 | tokens ≤ j) for every position, at ``temperature``."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / temperature
    return torch.gather(F.log_softmax(logits, dim=-1), 2, ids[:, 1:, None]).squeeze(2)


def loss(
    model: torch.nn.Module,
    samples: Sequence[Sample],
    adv: Sequence[float],
    cfg: GRPOConfig,
    reference: torch.nn.Module | None = None,
    *,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss over ``samples`` (token-mean, or token-sum over ``normalizer``: a data-parallel
    rank passes the global token count over the world size) and diagnostics."""
    ids, attn, comp, old = batch(samples)
    new = token_logprobs(model, ids, attn, cfg.temperature)
    a = torch.tensor(adv, dtype=torch.float32)[:, None]
    ratio = torch.exp(new - old)
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * a)
    per_token = -surrogate
    kl = torch.zeros(())
    if cfg.kl_coef > 0 and reference is not None:
        with torch.no_grad():
            ref = token_logprobs(reference, ids, attn, cfg.temperature)
        d = ref - new
        k3 = torch.exp(d) - d - 1
        per_token = per_token + cfg.kl_coef * k3
        kl = (k3 * comp).sum() / comp.sum().clamp(min=1)
    n = comp.sum().clamp(min=1)
    total = (per_token * comp).sum() / (n if normalizer is None else max(normalizer, 1e-9))
    with torch.no_grad():
        clipped = (((ratio - 1).abs() > cfg.clip).float() * comp).sum() / n
        drift = ((new - old).abs() * comp).sum() / n
    return total, {"clip_frac": float(clipped), "kl": float(kl), "logprob_drift": float(drift)}


def sft_loss(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]]
) -> torch.Tensor:
    """Cross-entropy on answer tokens only (the supervised warm start)."""
    samples = [Sample(tuple(p), tuple(a), (0.0,) * len(a), 0.0) for p, a in zip(prompts, answers, strict=True)]
    ids, attn, comp, _ = batch(samples)
    new = token_logprobs(model, ids, attn, 1.0)
    return -(new * comp).sum() / comp.sum().clamp(min=1)
