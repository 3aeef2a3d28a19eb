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


def check(settings: LoraSettings) -> None:
    """The settings make a LoRA table a run spec can record (rank, alpha and target names in range),
    or a ModelError, before anything is attached or wrapped."""
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


def attach(run: Run, base: torch.nn.Module, settings: LoraSettings, dtype: torch.dtype) -> LoraSpec:
    """Attach ``base`` (in ``dtype``, tied duplicates once) to ``run`` and return the run spec's LoRA
    table naming it. Call before ``wrap`` (the base's own tensor names) and before version 0 (so its
    manifest lists the base's files)."""
    check(settings)
    state = {
        k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).cpu()
        for k, v in published_state(base).items()
    }
    specs, views = word_views(state)
    digest, files = attach_base(run, specs, {k: host_words(v) for k, v in views.items()})
    return LoraSpec(
        rank=settings.rank, alpha=settings.alpha, targets=settings.targets, base_digest=digest, base_files=files
    )
