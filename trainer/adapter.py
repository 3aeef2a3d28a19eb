"""LoRA in the trainer: PEFT wraps the frozen base, the run carries that base, versions hold the adapter.

PEFT does the adapter (``get_peft_model``, target matching, the adapter's state dict); this module
only ties it to the run. The base is rounded to the run's dtype before it is wrapped, so the frozen
weights the trainer computes with are, value for value, the base the run carries and every actor
holds (a BF16 base widens exactly to FP32 masters), and it is attached to the run once, named by
its weight digest (:mod:`aurora_store.bucket.lora_base`). The adapter's matrices, named as PEFT
saves them, are what each version publishes (:class:`trainer.publication.LoraAdapter`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aurora_store.bucket.lora_base import attach_base
from aurora_store.bucket.run import Run
from aurora_store.format.keys import lora_base_file
from aurora_store.format.weights import WeightState
from aurora_store.rl import adapters
from aurora_store.rl.errors import ModelError
from aurora_store.rl.runspec import LoraSpec, RunSpecError
from aurora_store.tensors import host_words, word_views
from trainer.sharded import published_state


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """A LoRA adapter's shape: PEFT's ``r``, ``lora_alpha`` and ``target_modules``."""

    rank: int
    alpha: float
    targets: tuple[str, ...]


def round_base(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Round every floating-point weight of ``model`` to ``dtype`` in place, keeping its own dtype
    (round to nearest even: the bits the run will carry and the actors hold)."""
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point() and t.dtype != dtype:
                t.copy_(t.to(dtype).to(t.dtype))


def wrap(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """``model`` frozen under a new LoRA adapter of ``settings`` (:func:`aurora_store.rl.adapters.wrap`)."""
    return adapters.wrap(model, rank=settings.rank, alpha=settings.alpha, targets=settings.targets)


def check(settings: LoraSettings, model: torch.nn.Module | None = None) -> None:
    """The settings make a LoRA table a run spec can record (rank, alpha and target names in range) and,
    given the ``model`` to adapt, name its decoder's linear layers; or a ModelError, before anything is
    attached or wrapped."""
    if model is not None:
        adapters.check_targets(model, settings.targets)
    try:
        LoraSpec(
            rank=settings.rank,
            alpha=settings.alpha,
            targets=settings.targets,
            base_digest="0" * 32,
            base_files=(lora_base_file(0, 1),),
        )
    except RunSpecError as exc:
        raise ModelError(f"LoRA adapter: {exc}") from None


def attach(
    run: Run, base: torch.nn.Module, settings: LoraSettings, dtype: torch.dtype, *, write: bool = True
) -> LoraSpec:
    """Attach ``base`` (in ``dtype``, tied duplicates once) to ``run`` and return the run spec's LoRA
    table naming it. Call before ``wrap`` (the base's own tensor names) and before version 0 (so its
    manifest lists the base's files). ``write=False`` only names it (the ranks but the first)."""
    check(settings)
    state = {
        k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).cpu()
        for k, v in published_state(base).items()
    }
    specs, views = word_views(state)
    digest, files = attach_base(run, specs, {k: host_words(v) for k, v in views.items()}, write=write)
    return LoraSpec(
        rank=settings.rank, alpha=settings.alpha, targets=settings.targets, base_digest=digest, base_files=files
    )


def settings_of(lora: LoraSpec) -> LoraSettings:
    return LoraSettings(rank=lora.rank, alpha=lora.alpha, targets=lora.targets)


def load_base_into(run: Run, model: torch.nn.Module, lora: LoraSpec, base: WeightState | None = None) -> WeightState:
    """Write the base ``run`` carries (verified against the digest ``lora`` names) into ``model``'s own
    tensors, widened to their dtype (a resumed run's frozen base: exactly the bits it started from), and
    return it; ``base``: the one an earlier call returned (read and verified once, not again)."""
    from aurora_store.bucket.lora_base import load_base
    from aurora_store.tensors import from_words

    if base is None:
        latest = run.latest()
        if latest is None:
            raise ModelError(f"{run.uri}: a LoRA run without a committed version has no base to resume from")
        base = load_base(run, run.manifest(latest), lora.base_files, lora.base_digest)
    state = model.state_dict()
    with torch.no_grad():
        for s in base.specs:
            if s.name not in state:
                raise ModelError(f"{run.uri}: the run's LoRA base has {s.name}, which its config.json's model has not")
            state[s.name].copy_(from_words(s, base.words[s.name]).to(state[s.name].dtype))
    return base


def version_weights(model: torch.nn.Module, adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every parameter of wrapped ``model`` by its own name, with a version's ``adapter`` (by its saved
    names) in place of the model's: what a frozen copy takes to compute as that version (the base never
    moves, so it is the model's)."""
    from aurora_store.rl.adapters import parameter_name

    out = {n: p.detach() for n, p in model.named_parameters() if "lora_" not in n}
    out.update({parameter_name(k): v for k, v in adapter.items()})
    return out
