"""Publishing a model from the trainer: which elements of each HF tensor this rank owns, and the
run's one :class:`~aurora_store.bucket.publisher.Publisher` driven with them.

Under torchrun with FSDP2 (``fully_shard``) every parameter is a DTensor sharded on dim 0, so a
rank's local shard is one contiguous range of the flattened tensor; tensors every rank holds
whole are published by rank 0 only. Every rank hands its :class:`Share` to the publisher in the
trainer's group (:class:`~trainer.collectives.TorchCollective`); a single process is a group of
one. Deciding the version, uploading and committing are the publisher's, not the trainer's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from aurora_store.bucket.plan import Kind, VersionInfo
from aurora_store.bucket.publisher import Publisher, Share
from aurora_store.bucket.run import Run
from aurora_store.errors import UnsupportedError
from aurora_store.format.manifest import TensorSpec
from aurora_store.rl.models import tied_names
from aurora_store.tensors import host_words, word_views
from trainer.collectives import TorchCollective


class ModelPublisher:
    """Publishes ``model``'s current weights to ``run`` from every rank of ``group`` (collective:
    all ranks call :meth:`publish` together), or from this process alone without torch.distributed.
    Only rank 0's ``run`` needs the signing key; all need the same config."""

    def __init__(
        self, run: Run, model: torch.nn.Module, *, group: Any = None, dtype: torch.dtype | None = torch.bfloat16
    ) -> None:
        self.model, self.group, self.dtype = model, group, dtype
        self.extract = run.config.extract
        sharded = dist.is_available() and dist.is_initialized()
        self.publisher: Publisher = run.publisher.on(TorchCollective(group)) if sharded else run.publisher

    def publish(
        self, *, step: int | None = None, kind: Kind = "auto", meta: Mapping[str, str] | None = None
    ) -> VersionInfo:
        """Commit the model's current weights as the next version; the same VersionInfo on every rank."""
        keep = _on_device(self.extract, self.model)
        share = local_share(self.model, dtype=self.dtype, group=self.group, keep_device=keep)
        return self.publisher.publish(share, kind=kind, step=step, meta=meta)


def _on_device(extract: str, model: torch.nn.Module) -> bool:
    """Whether this rank extracts its deltas where its shards live (the run's ``extract`` setting)."""
    if extract != "auto":
        return extract == "device"
    return any(p.device.type not in ("cpu", "meta") for p in model.parameters())


def published_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` without tied duplicates: a tensor two names share (tied embeddings) is
    published once, under its first name, as transformers and vLLM load it back."""
    state = module.state_dict()
    tied = tied_names(state)
    return {k: v for k, v in state.items() if k not in tied}


def local_share(
    module: torch.nn.Module, *, dtype: torch.dtype | None = torch.bfloat16, group: Any = None, keep_device: bool = False
) -> Share:
    """The words this rank publishes of :func:`published_state`: each DTensor's local shard (a
    contiguous range of the flattened tensor) and, on rank 0 of ``group`` only, the tensors every
    rank holds whole (buffers, unsharded parameters). Floating-point tensors are cast to ``dtype``
    (round to nearest even, as the actors hold them); None publishes them as they are. With
    ``keep_device`` the words stay on the shards' device as word tensors (a delta is then extracted
    there); else they are copied to the host."""
    from torch.distributed.tensor import DTensor

    first = not dist.is_initialized() or dist.get_rank(group) == 0
    specs, ranges, words = [], {}, {}
    for name, t in published_state(module).items():
        if isinstance(t, DTensor):
            rng = _flat_range(name, t)
            local = t.to_local().detach()
        else:
            rng = (0, t.numel()) if first else None
            local = t.detach()
        if rng is None or rng[0] == rng[1]:
            local = local.reshape(-1)[:0]  # only its dtype is needed
        if dtype is not None and local.is_floating_point():
            local = local.to(dtype)
        (spec,), views = word_views({name: local})
        w: dict[str, Any] = dict(views) if keep_device else {name: host_words(views[name])}
        specs.append(TensorSpec(name, spec.dtype, tuple(int(s) for s in t.shape)))
        if rng is not None and rng[0] < rng[1]:
            count = int(w[name].numel()) if keep_device else int(w[name].size)
            if count != rng[1] - rng[0]:
                raise UnsupportedError(f"{name!r}: local shard has {count} elements, expected {rng}")
            ranges[name], words[name] = rng, w[name]
    specs.sort(key=lambda s: s.name)
    return Share(tuple(specs), ranges, words)


def _flat_range(name: str, t: Any) -> tuple[int, int] | None:
    """Flat elements [lo, hi) of a DTensor's local shard, or None when another rank publishes
    them (a replica that is not the first on its mesh dimension)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    coord = t.device_mesh.get_coordinate()
    if coord is None:
        return None
    for d, p in enumerate(t.placements):
        if p.is_replicate():
            if coord[d] != 0:
                return None
        elif not p.is_shard() or type(p).__name__ != "Shard":
            raise UnsupportedError(f"{name!r}: placement {p} cannot be published (only Shard and Replicate)")
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    gshape = tuple(int(s) for s in t.shape)
    if tuple(t.to_local().shape) != tuple(shape):
        raise UnsupportedError(f"{name!r}: local shard is {list(t.to_local().shape)}, expected {list(shape)}")
    numel = int(np.prod(shape, dtype=np.int64))
    if numel == 0:
        return (0, 0)
    last = max((d for d in range(len(gshape)) if shape[d] != gshape[d]), default=-1)
    if any(shape[d] != 1 for d in range(last)):
        raise UnsupportedError(
            f"{name!r}: local shard {list(shape)} at {list(offset)} of {list(gshape)} "
            "is not a contiguous range of the flattened tensor"
        )
    lo = 0
    for g, o in zip(gshape, offset, strict=True):
        lo = lo * g + int(o)
    return lo, lo + numel
