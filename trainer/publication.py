"""What the trainer publishes of its model, and the publisher that commits it every step.

The run's artefact (``aurora_run.json``: what every version holds) is made from the model by one
seam, :meth:`Artefact.state_for_publish`: this rank's share of the published tensors. Two are
implemented: full weights (:class:`FullWeights`) and a LoRA adapter's matrices over a base the run
carries (:class:`LoraAdapter`). FP8 weights (with their scales as extra tensors) would be one more
class here and one more name in :mod:`aurora_store.rl.runspec`; the store and the publisher would
not change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from aurora_store.bucket.parts import Share
from aurora_store.bucket.plan import Kind, VersionInfo
from aurora_store.bucket.publisher import Publisher
from aurora_store.bucket.run import Run
from aurora_store.format.manifest import Rollback
from aurora_store.rl import runspec
from trainer.collectives import TorchCollective
from trainer.sharded import local_share, published_state


class Artefact(Protocol):
    """What each version holds, made from the model being trained."""

    @property
    def spec(self) -> runspec.Artefact:
        """As the run records it, for actors to build their engines from."""
        ...

    @property
    def dtype(self) -> torch.dtype:
        """The dtype its float tensors are published in (what a copy of the published weights rounds to)."""
        ...

    def state_for_publish(self, model: torch.nn.Module, *, group: Any, keep_device: bool) -> Share:
        """This rank's share of the published tensors (collective-free: every rank calls it)."""
        ...

    def full_bytes(self, model: torch.nn.Module) -> int:
        """Bytes of one full copy of what is published."""
        ...


def published_dtype(spec: runspec.Artefact) -> torch.dtype:
    """The torch dtype a run's float tensors are published in (its artefact's ``dtype``)."""
    dtype = getattr(torch, spec.dtype)
    assert isinstance(dtype, torch.dtype)
    return dtype


@dataclass(frozen=True, slots=True)
class FullWeights:
    """Every parameter and buffer (tied duplicates once), float tensors cast to the run's dtype with
    round-to-nearest-even, as the actors will hold them."""

    spec: runspec.Artefact

    @property
    def dtype(self) -> torch.dtype:
        return published_dtype(self.spec)

    def state_for_publish(self, model: torch.nn.Module, *, group: Any, keep_device: bool) -> Share:
        return local_share(model, dtype=self.dtype, group=group, keep_device=keep_device)

    def full_bytes(self, model: torch.nn.Module) -> int:
        width = self.dtype.itemsize
        return sum(
            t.numel() * (width if t.is_floating_point() else t.element_size()) for t in published_state(model).values()
        )


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A LoRA adapter's matrices only (a model wrapped by :func:`trainer.adapter.wrap`), by the names
    PEFT saves them under, cast to the run's dtype; the frozen base travels with the run once
    (:func:`trainer.adapter.attach`)."""

    spec: runspec.Artefact

    @property
    def dtype(self) -> torch.dtype:
        return published_dtype(self.spec)

    def state_for_publish(self, model: torch.nn.Module, *, group: Any, keep_device: bool) -> Share:
        from aurora_store.rl.adapters import adapter_state

        return local_share(model, dtype=self.dtype, group=group, keep_device=keep_device, state=adapter_state(model))

    def full_bytes(self, model: torch.nn.Module) -> int:
        from aurora_store.rl.adapters import adapter_state

        return sum(t.numel() * self.dtype.itemsize for t in adapter_state(model).values())


def artefact_for(spec: runspec.Artefact) -> Artefact:
    """The artefact a run records (``aurora_run.json``), made from a model."""
    if spec.kind == "weights":
        return FullWeights(spec)
    if spec.kind == "lora":
        return LoraAdapter(spec)
    raise runspec.RunSpecError(f"artefact kind {spec.kind!r}: this trainer publishes {runspec.ARTEFACT_KINDS}")


class ModelPublisher:
    """Publishes ``artefact`` of ``model`` to ``run`` from every rank of ``group`` (collective: all
    ranks call :meth:`publish` together), or from this process alone without torch.distributed,
    through the run's one :class:`~aurora_store.bucket.publisher.Publisher`. Only rank 0's ``run``
    needs the signing key; all need the same config."""

    def __init__(
        self, run: Run, model: torch.nn.Module, *, group: Any = None, artefact: Artefact | None = None
    ) -> None:
        self.model, self.group = model, group
        self.artefact = artefact if artefact is not None else FullWeights(runspec.Artefact())
        self.config = run.config
        sharded = dist.is_available() and dist.is_initialized()
        self.publisher: Publisher = run.publisher.on(TorchCollective(group)) if sharded else run.publisher

    def publish(
        self,
        *,
        step: int | None = None,
        kind: Kind = "auto",
        meta: Mapping[str, str] | None = None,
        rolls_back_to: Rollback | None = None,
        defer: bool = False,
    ) -> VersionInfo:
        """Commit the model's current weights as the next version; the same VersionInfo on every rank.
        With ``defer``, all but the manifest: :meth:`commit_deferred` commits it."""
        keep = self.config.extract_on_device(p.device.type for p in self.model.parameters())
        share = self.artefact.state_for_publish(self.model, group=self.group, keep_device=keep)
        return self.publisher.publish(share, kind=kind, step=step, meta=meta, rolls_back_to=rolls_back_to, defer=defer)

    def commit_deferred(self) -> VersionInfo:
        """Commit the version published with ``defer`` (see :meth:`Publisher.commit_deferred`)."""
        return self.publisher.commit_deferred()
