"""GRPO: group-relative advantages and the clipped importance-ratio loss.

For each prompt the actors sample a group of completions; a completion's advantage is its
reward minus the group mean, over the group's standard deviation. The loss is PPO's clipped
surrogate with the ratio taken against the log-probabilities the actor reported when it
sampled (so one-step-stale rollouts are corrected, and clipped), plus an optional KL penalty
to a frozen reference (the k3 estimator). It is normalised one of two ways:

- ``token``: the sum over every completion token of the batch, over the batch's token count
  (DAPO, Dr. GRPO): a long completion weighs as many tokens as it has;
- ``sequence``: each completion's mean over its tokens, then the mean over completions (GRPO).

The batch may be cut into micro-batches (and over data-parallel ranks): each part divides by
the whole batch's normaliser, so their gradients add up to the whole batch's.

**Rollout correction** (``correction``: ``tis`` or ``mask``; ``none`` is the plain loss above).
The engine samples with its own kernels (vLLM's, another dtype path), so its log-probabilities
``log π_rollout`` differ from the trainer's at the same weights. With a correction on, the trainer
recomputes ``log π_old``, its own log-probability of each sampled token under the weights of the
version the rollout was generated with (:class:`trainer.rollout_policy.RolloutPolicy`), takes
PPO's ratio against that, ``π_θ / π_old``, and weighs each token by the importance weight
``rho = π_old / π_rollout`` (no gradient through it): truncated at ``cap`` (``tis``: truncated
importance sampling, Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training"; verl's rollout correction, slime's TIS), or dropped when outside
``[1/cap, cap]`` (``mask``: masked importance sampling, as verl's token-level rejection). The
gap itself is measured on the way: the mean ``|log π_old - log π_rollout|`` per token and the
sequence-level KL, ``E_seq[Σ_t log π_rollout - log π_old]`` (KL(π_rollout ‖ π_old), estimated
on the rollout's own samples).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aurora_store.errors import ConfigError

CORRECTIONS = ("none", "tis", "mask")


@dataclass(frozen=True, kw_only=True, slots=True)
class GRPOConfig:
    """The loss's parameters (their defaults and help live in :mod:`trainer.config`)."""

    clip: float
    """Ratios outside [1 - clip, 1 + clip] stop contributing gradient in the improving direction."""
    kl_coef: float
    """Weight of the KL penalty to the reference model; 0 turns it (and the reference) off."""
    temperature: float
    """The sampling temperature the actors used; log-probabilities are taken at the same one."""
    norm: str = "token"
    """``token`` or ``sequence`` (see the module docstring)."""
    correction: str = "none"
    """Rollout correction: ``none``, ``tis`` or ``mask`` (see the module docstring)."""
    correction_cap: float = 2.0
    """``tis``: importance weights above it are cut to it; ``mask``: tokens whose weight is outside
    ``[1/cap, cap]`` are dropped."""

    def __post_init__(self) -> None:
        if self.correction not in CORRECTIONS:
            raise ConfigError(f"--rollout-correction {self.correction!r}: expected one of {CORRECTIONS}")
        if not self.correction_cap > 1:  # NaN too
            raise ConfigError(f"--rollout-correction-cap must be above 1, got {self.correction_cap}")


@dataclass(frozen=True, slots=True)
class Sample:
    """One completion of a group, as an actor returned it."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    reward: float


@dataclass(slots=True)
class Sums:
    """A micro-batch's contributions to the step's metrics, as sums (they add across micro-batches and ranks)."""

    tokens: float = 0.0
    sequences: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    clipped: float = 0.0
    drift: float = 0.0
    mismatch_abs: float = 0.0
    """Sum over tokens of |log π_old - log π_rollout| (with a rollout correction)."""
    mismatch_kl: float = 0.0
    """Sum over sequences of Σ_t (log π_rollout - log π_old) (with a rollout correction)."""
    corrected: float = 0.0
    """Tokens whose importance weight was truncated (``tis``) or that were dropped (``mask``)."""

    def add(self, other: Sums) -> None:
        for f in self.__slots__:
            setattr(self, f, getattr(self, f) + getattr(other, f))


def advantages(rewards: Sequence[float], eps: float = 1e-4) -> list[float]:
    """(r - mean) / (std + eps) within one group; all zeros when every reward is equal."""
    t = torch.tensor(rewards, dtype=torch.float64)
    if t.numel() < 2:
        return [0.0] * t.numel()
    std = t.std(unbiased=False)
    return ((t - t.mean()) / (std + eps)).tolist() if std > 0 else [0.0] * t.numel()


def batch(
    samples: Sequence[Sample], device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
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
    if device is not None and device.type != "cpu":
        return ids.to(device), attn.to(device), comp.to(device), old.to(device)
    return ids, attn, comp, old


def autocast(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on CUDA (FP32 master weights, BF16 matmuls); nothing on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _log_softmax(
    model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, temperature: float, start: int = 0
) -> torch.Tensor:
    """Log-softmax of the logits at positions ``start`` .. width-2 (those that predict a next token).
    Only those positions' logits are computed where the model can (``logits_to_keep``): prompt
    positions need none, and a [batch, width, vocab] logits tensor is what fills the memory."""
    keep = _takes(model, "logits_to_keep") and start > 0
    extra: dict[str, object] = {"logits_to_keep": ids.shape[1] - start} if keep else {}
    if _takes(model, "use_cache"):
        extra["use_cache"] = False  # no KV cache is built for a scoring pass (transformers builds one by default)
    with autocast(ids.device):
        logits = model(input_ids=ids, attention_mask=attn, **extra).logits
    if not keep:
        logits = logits[:, start:]
    return F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)


def _takes(model: torch.nn.Module, argument: str) -> bool:
    """Whether the model's forward takes ``argument`` by name (transformers' causal LMs take
    ``logits_to_keep`` and ``use_cache``)."""
    forward = getattr(model, "forward", None)
    try:
        return forward is not None and argument in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def token_logprobs(
    model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, temperature: float, start: int = 0
) -> torch.Tensor:
    """log p(token j+1 | tokens ≤ j) for every position j from ``start``, at ``temperature``."""
    return torch.gather(_log_softmax(model, ids, attn, temperature, start), 2, ids[:, start + 1 :, None]).squeeze(2)


def completion_start(samples: Sequence[Sample]) -> int:
    """The first position whose logits predict a completion token, over ``samples``."""
    return max(0, min(len(s.prompt_ids) for s in samples) - 1)


def correction_weights(
    old: torch.Tensor, rollout: torch.Tensor, mode: str, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weights of the rollout correction from ``old`` (log π_old, the trainer's at the
    rollout's version) and ``rollout`` (log π_rollout, the engine's), and which tokens it changed
    (truncated or dropped). No gradient flows through them."""
    rho = torch.exp((old - rollout).detach())
    if mode == "tis":
        return rho.clamp(max=cap), rho > cap
    if mode == "mask":
        keep = (rho <= cap) & (rho >= 1 / cap)
        return keep.to(rho.dtype), ~keep
    raise ValueError(f"rollout correction {mode!r}: expected tis or mask")


def loss(
    model: torch.nn.Module,
    samples: Sequence[Sample],
    adv: Sequence[float],
    cfg: GRPOConfig,
    reference: torch.nn.Module | None = None,
    *,
    normalizer: float | None = None,
    weight: float = 1.0,
    rollout_model: torch.nn.Module | None = None,
) -> tuple[torch.Tensor, Sums]:
    """The GRPO loss of ``samples`` and its metric sums. ``normalizer`` is the whole batch's token
    count (``token``) or completion count (``sequence``); None: these samples are the batch.
    ``weight`` 0 makes a stand-in micro-batch (a rank with no samples still runs its collectives).
    ``rollout_model``: the weights the samples were generated with, which a rollout correction needs."""
    device = next(model.parameters()).device
    ids, attn, comp, old = batch(samples, device)
    start = completion_start(samples)
    comp, old = comp[:, start:], old[:, start:]
    logp = _log_softmax(model, ids, attn, cfg.temperature, start)
    new = torch.gather(logp, 2, ids[:, start + 1 :, None]).squeeze(2)
    a = torch.tensor(adv, dtype=torch.float32, device=device)[:, None]
    corrected = torch.zeros_like(comp)
    mismatch = (torch.zeros_like(comp), torch.zeros(()))
    if cfg.correction == "none":
        ratio = torch.exp(new - old)
        token_weight = torch.ones_like(comp)
    else:
        if rollout_model is None:
            raise ValueError(f"the {cfg.correction} rollout correction needs the rollout's weights")
        with torch.no_grad():
            prox = token_logprobs(rollout_model, ids, attn, cfg.temperature, start)
        ratio = torch.exp(new - prox)
        token_weight, hit = correction_weights(prox, old, cfg.correction, cfg.correction_cap)
        corrected = hit.to(comp.dtype)
        mismatch = ((prox - old).abs(), ((old - prox) * comp).sum())
    per_token = -torch.minimum(ratio * a, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * a) * token_weight
    k3 = torch.zeros_like(new)
    if cfg.kl_coef > 0 and reference is not None:
        with torch.no_grad():
            ref = token_logprobs(reference, ids, attn, cfg.temperature, start)
        d = ref - new
        k3 = torch.exp(d) - d - 1
        per_token = per_token + cfg.kl_coef * k3
    lengths = comp.sum(dim=1).clamp(min=1)
    if cfg.norm == "sequence":
        numerator = ((per_token * comp).sum(dim=1) / lengths).sum()
        denominator = normalizer if normalizer is not None else float(len(samples))
    else:
        numerator = (per_token * comp).sum()
        denominator = normalizer if normalizer is not None else float(comp.sum().item())
    total = numerator * weight / max(denominator, 1e-9)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(dim=-1)
        sums = Sums(
            tokens=float(comp.sum()) * weight,
            sequences=float(len(samples)) * weight,
            kl=float((k3 * comp).sum()) * weight,
            entropy=float((entropy * comp).sum()) * weight,
            clipped=float((((ratio - 1).abs() > cfg.clip).float() * comp).sum()) * weight,
            drift=float(((new - old).abs() * comp).sum()) * weight,
            mismatch_abs=float((mismatch[0] * comp).sum()) * weight,
            mismatch_kl=float(mismatch[1]) * weight,
            corrected=float((corrected * comp).sum()) * weight,
        )
    return total, sums


def micro_batches(samples: Sequence[Sample], budget: int) -> Iterator[list[int]]:
    """Indices of ``samples`` in consecutive micro-batches whose padded size (rows x longest row) stays
    within ``budget`` tokens; a sample longer than the budget is a micro-batch of its own."""
    current: list[int] = []
    width = 0
    for i, s in enumerate(samples):
        n = len(s.prompt_ids) + len(s.token_ids)
        if current and max(width, n) * (len(current) + 1) > budget:
            yield current
            current, width = [], 0
        current.append(i)
        width = max(width, n)
    if current:
        yield current


def sft_loss(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]]
) -> torch.Tensor:
    """Cross-entropy on answer tokens only (the supervised warm start)."""
    samples = [Sample(tuple(p), tuple(a), (0.0,) * len(a), 0.0) for p, a in zip(prompts, answers, strict=True)]
    device = next(model.parameters()).device
    ids, attn, comp, _ = batch(samples, device)
    start = completion_start(samples)
    new = token_logprobs(model, ids, attn, 1.0, start)
    return -(new * comp[:, start:]).sum() / comp.sum().clamp(min=1)
