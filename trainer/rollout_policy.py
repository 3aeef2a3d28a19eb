"""The weights a step's rollouts were generated with, as the trainer computes them.

A rollout correction (``--rollout-correction tis|mask``, :mod:`trainer.grpo`) compares the
engine's log-probabilities with the trainer's own under the *same* weights: those of the version
the rollouts were generated on, bit for bit as published (BF16). With one-step asynchrony that is
the version before the trainer's current one (or the current one, on the first steps and after a
resume), so :class:`RolloutPolicy` keeps one frozen copy of the model: before each optimizer step
moves the weights, it takes their BF16 bits, which the next step's rollouts were generated with.
That costs one model copy (BF16 on GPU, its FP32 widening on CPU, as the KL reference) and a copy
of the weights per step; the correction itself costs a forward pass per micro-batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import torch

from aurora_store.errors import AuroraError

log = logging.getLogger("aurora.trainer")


class RolloutPolicy:
    """A frozen copy of the policy holding the weights of one published version (``version``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        published: torch.dtype = torch.bfloat16,
        load: Callable[[int], Mapping[str, torch.Tensor]] | None = None,
    ) -> None:
        """``model``: a module of the policy's architecture (sharded like it under FSDP2), in the dtype
        it computes in; its weights are overwritten by :meth:`take`. ``published``: the dtype versions
        hold their float weights in (the run's artefact). ``load``: a published version's weights by
        HF name (the run's ``materialize``), for rollouts of a version neither copy holds (after a
        restart); None where the copy cannot take a whole state dict (a sharded model)."""
        self.model = model.eval().requires_grad_(False)
        self.published = published
        self.load = load
        self.version: int | None = None

    def take(self, policy: torch.nn.Module, version: int) -> None:
        """Hold ``policy``'s weights as published at ``version`` (rounded as the publisher does)."""
        mine = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, p in policy.named_parameters():
                dst = mine[name]
                src = p.detach().to(self.published)
                dst.copy_(src.to(dst.dtype))
        self.version = version

    def switch_to(self, version: int, policy: torch.nn.Module, current: int) -> bool:
        """Make this copy hold ``version``, the rollouts' one (``policy`` is at ``current``). False when
        neither this copy nor the policy has that version's weights (the step is then trained without
        a correction, and said so)."""
        if self.version == version:
            return True
        if version == current:
            self.take(policy, current)
            return True
        if self.load is not None and self._load(version):
            return True
        log.warning(
            "rollouts of version %d, but the trainer holds the weights of versions %s and %d only: this step "
            "is trained without the rollout correction",
            version,
            self.version,
            current,
        )
        return False

    def _load(self, version: int) -> bool:
        """Hold ``version`` as the run published it (bit-exact: the bucket has every version). False,
        logged, when it cannot be read (retired by gc, a store failure) or does not fit this model."""
        try:
            state = self.load(version) if self.load is not None else {}
        except AuroraError as exc:
            log.warning("rollouts of version %d: cannot load it from the run (%s)", version, exc)
            return False
        mine = dict(self.model.named_parameters())
        missing = sorted(mine.keys() - state.keys())
        if missing:
            log.warning("rollouts of version %d: the version has no %r", version, missing[0])
            return False
        with torch.no_grad():
            for name, dst in mine.items():
                dst.copy_(state[name].to(dst.device, dst.dtype))
        self.version = version
        log.info("rollouts of version %d: loaded it from the run for the rollout correction", version)
        return True
