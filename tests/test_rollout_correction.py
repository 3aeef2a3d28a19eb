"""Rollout correction (``--rollout-correction tis|mask``) on crafted log-probabilities, and the frozen
copy of the weights the rollouts were generated with."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from aurora_store.errors import ConfigError
from aurora_store.rl.models import build_model, tiny_config
from aurora_store.rl.tokenizers import CharTokenizer
from trainer.grpo import GRPOConfig, Sample, batch, correction_weights, loss, token_logprobs
from trainer.rollout_policy import RolloutPolicy

TOK = CharTokenizer()
PROMPT = tuple(TOK.encode("3+4="))


def tiny(seed: int = 0) -> torch.nn.Module:
    return build_model(tiny_config(TOK.vocab_size, hidden=32, layers=1), seed=seed)


def test_weights_truncate_or_drop_by_the_ratio_of_the_two_log_probabilities() -> None:
    old = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0], requires_grad=True)
    rollout = torch.tensor([0.0, -math.log(3), math.log(3), -math.log(1.5), math.log(1.5)])  # rho 1, 3, 1/3, 1.5, 2/3
    w, hit = correction_weights(old, rollout, "tis", 2.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, 1 / 3, 1.5, 2 / 3]))
    assert hit.tolist() == [False, True, False, False, False], "tis truncates only weights above the cap"
    assert not w.requires_grad, "no gradient flows through the weights"
    w, hit = correction_weights(old, rollout, "mask", 2.0)
    assert w.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert hit.tolist() == [False, True, True, False, False], "mask drops what is outside [1/cap, cap]"
    with pytest.raises(ValueError, match="tis or mask"):
        correction_weights(old, rollout, "none", 2.0)


def completions(model: torch.nn.Module) -> tuple[list[Sample], torch.Tensor]:
    """Two two-token completions and the model's own log-probabilities of their tokens."""
    toks = [(5, 6), (7, 8)]
    ids, attn, _, _ = batch([Sample(PROMPT, t, (0.0, 0.0), 0.0) for t in toks])
    with torch.no_grad():
        lp = token_logprobs(model, ids, attn, 1.0)[:, len(PROMPT) - 1 : len(PROMPT) + 1]
    return [Sample(PROMPT, t, (0.0, 0.0), 0.0) for t in toks], lp


@pytest.mark.parametrize("mode", ["tis", "mask"])
def test_the_loss_weighs_tokens_and_measures_the_gap(mode: str) -> None:
    """The rollout's weights are the policy's (ratio 1): every token weighs the advantage by its
    correction weight, and the gap between the engine's crafted log-probabilities and the trainer's
    is what was put there."""
    model = tiny()
    samples, lp = completions(model)
    shift = torch.tensor([[0.0, math.log(3)], [-math.log(3), 0.1]])  # engine minus trainer: rho 1, 1/3, 3, e^-0.1
    engine = lp + shift
    crafted = [Sample(s.prompt_ids, s.token_ids, tuple(engine[i].tolist()), 0.0) for i, s in enumerate(samples)]
    cfg = GRPOConfig(clip=0.2, kl_coef=0.0, temperature=1.0, correction=mode, correction_cap=2.0)
    adv = [1.0, -0.5]
    value, sums = loss(model, crafted, adv, cfg, rollout_model=copy.deepcopy(model))
    rho = torch.exp(-shift)
    w = rho.clamp(max=2.0) if mode == "tis" else ((rho <= 2.0) & (rho >= 0.5)).float()
    want = -(torch.tensor(adv)[:, None] * w).sum() / 4
    assert math.isclose(float(value.detach()), float(want), rel_tol=1e-5, abs_tol=1e-7)
    assert math.isclose(sums.mismatch_abs, float(shift.abs().sum()), rel_tol=1e-5)
    assert math.isclose(sums.mismatch_kl, float(shift.sum()), rel_tol=1e-5), "Σ_t log π_rollout - log π_old"
    assert sums.corrected == (1.0 if mode == "tis" else 2.0), "tis truncates rho 3; mask drops 3 and 1/3"
    plain, _ = loss(model, crafted, adv, GRPOConfig(clip=0.2, kl_coef=0.0, temperature=1.0))
    assert not math.isclose(float(plain.detach()), float(value.detach())), "plain: the ratio is against the engine's"


def test_a_correction_needs_the_rollouts_weights_and_a_cap_above_one() -> None:
    model = tiny()
    samples, _ = completions(model)
    with pytest.raises(ValueError, match="needs the rollout's weights"):
        loss(model, samples, [1.0, 0.0], GRPOConfig(clip=0.2, kl_coef=0.0, temperature=1.0, correction="tis"))
    for cap in (1.0, 0.5, math.nan):
        with pytest.raises(ConfigError, match="cap must be above 1"):
            GRPOConfig(clip=0.2, kl_coef=0.0, temperature=1.0, correction="tis", correction_cap=cap)
    with pytest.raises(ConfigError, match="expected one of"):
        GRPOConfig(clip=0.2, kl_coef=0.0, temperature=1.0, correction="clip")


def test_the_copy_holds_a_versions_bf16_bits_and_knows_which() -> None:
    policy = tiny(seed=1)
    copy = RolloutPolicy(tiny(seed=2))
    assert copy.switch_to(0, policy, current=0) and copy.version == 0
    for (name, p), (_, q) in zip(policy.named_parameters(), copy.model.named_parameters(), strict=True):
        assert torch.equal(q, p.detach().to(torch.bfloat16).float()), name
        assert not q.requires_grad
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    assert copy.switch_to(0, policy, current=1), "it still holds version 0"
    assert not copy.switch_to(5, policy, current=1), "neither it nor the policy has version 5"
    copy.take(policy, 1)
    assert copy.version == 1


def test_a_version_neither_copy_holds_is_loaded_from_the_run(tmp_path: object) -> None:
    """After a restart the trainer holds neither the rollouts' version nor its copy: the copy loads
    it from the run, bit-exact as published; a version the run does not have stays uncorrected."""
    import aurora_store
    from trainer.publication import ModelPublisher

    policy = tiny(seed=1)
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    publisher = ModelPublisher(run, policy)
    publisher.publish(step=0)
    published = {k: v.detach().to(torch.bfloat16) for k, v in policy.named_parameters()}
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    publisher.publish(step=1)
    copy = RolloutPolicy(tiny(seed=2), load=run.materialize)
    assert copy.switch_to(0, policy, current=1) and copy.version == 0, "loaded from the run"
    for name, q in copy.model.named_parameters():
        assert torch.equal(q, published[name].float()), name
    assert not copy.switch_to(7, policy, current=1), "the run has no version 7"
    assert copy.version == 0
