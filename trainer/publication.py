"""What the trainer publishes of its model, and the publisher that commits it every step.

The run's artefact (``aurora_run.json``: what every version holds) is made from the model by one
seam, :meth:`Artefact.state_for_publish`: this rank's share of the published tensors. Three are
implemented: full weights (:class:`FullWeights`), a LoRA adapter's matrices over a base the run
carries (:class:`LoraAdapter`), and full weights whose linear projections are quantized
(:class:`QuantizedWeights`: words and scales, by :mod:`aurora_store.quant.schemes`). The store and
the publisher do not know which.
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
from aurora_store.quant import schemes
from aurora_store.rl import runspec
from aurora_store.tensors import dtype_named
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


@dataclass(frozen=True, slots=True)
class QuantizedWeights:
    """Every parameter and buffer as :class:`FullWeights` publishes them, except the decoder's linear
    projections (:func:`~aurora_store.quant.schemes.quantized_names`): those as the run's scheme
    quantizes their BF16 values, the words under the weight's own name (``F8_E4M3`` or ``I8``) and
    the scales beside them (``weight_scale_inv`` or ``weight_scale``, FP32).

    The quantizer needs whole blocks and rows: under FSDP2 each projection is gathered on every rank
    (one at a time: the collective every rank calls in the same order) and published by rank 0, as
    tensors every rank holds whole are; the other tensors stay sharded. The quantization runs on the
    host in numpy (bit-exact by construction, docs/FORMAT.md §6a): O(model) host work per version, as
    the BF16 copy a publish makes is."""

    spec: runspec.Artefact

    @property
    def dtype(self) -> torch.dtype:
        return published_dtype(self.spec)

    @property
    def scheme(self) -> str:
        assert self.spec.scheme is not None
        return self.spec.scheme

    def state_for_publish(self, model: torch.nn.Module, *, group: Any, keep_device: bool) -> Share:
        from torch.distributed.tensor import DTensor

        first = not dist.is_initialized() or dist.get_rank(group) == 0
        state = published_state(model)
        out: dict[str, torch.Tensor] = {}
        targets = set(schemes.quantized_names(state))
        for name, t in state.items():
            if name not in targets:
                out[name] = t.detach().to(self.dtype) if t.is_floating_point() else t.detach()
                continue
            whole = t.full_tensor() if isinstance(t, DTensor) else t  # collective: every rank, in order
            device = whole.device if keep_device else torch.device("cpu")
            shape = tuple(int(s) for s in whole.shape)
            lay = schemes.layout(self.scheme, shape)
            if first:
                q = schemes.quantize(self.scheme, whole.detach().float().cpu().numpy())
                words = torch.from_numpy(q.words).view(dtype_named(lay.dtype)).to(device)
                scale = torch.from_numpy(q.scale).to(device)
            else:  # rank 0 publishes it; the others list its spec only
                words = torch.empty(shape, dtype=dtype_named(lay.dtype), device=device)
                scale = torch.empty(lay.scale_shape, dtype=torch.float32, device=device)
            out[name] = words
            out[schemes.scale_of(name, lay.scale_name)] = scale
            del whole
        return local_share(model, dtype=None, group=group, keep_device=keep_device, state=out)

    def full_bytes(self, model: torch.nn.Module) -> int:
        state = published_state(model)
        targets = set(schemes.quantized_names(state))
        total = 0
        for name, t in state.items():
            if name in targets:
                lay = schemes.layout(self.scheme, tuple(t.shape))
                total += t.numel() + 4 * lay.scale_shape[0] * lay.scale_shape[1]
            else:
                total += t.numel() * (self.dtype.itemsize if t.is_floating_point() else t.element_size())
        return total


def artefact_for(spec: runspec.Artefact) -> Artefact:
    """The artefact a run records (``aurora_run.json``), made from a model."""
    if spec.kind == "weights":
        return FullWeights(spec)
    if spec.kind == "lora":
        return LoraAdapter(spec)
    if spec.kind == "quantized":
        return QuantizedWeights(spec)
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
