"""Which elements of each HF tensor this rank owns under FSDP2, and those elements' words: the
rank's :class:`~aurora_store.bucket.parts.Share` of what the trainer publishes.

Every FSDP2 parameter is a DTensor sharded on dim 0, so a rank's local shard is one contiguous
range of the flattened tensor; tensors every rank holds whole are published by rank 0 only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from aurora_store.bucket.parts import Share
from aurora_store.errors import UnsupportedError
from aurora_store.format.manifest import TensorSpec
from aurora_store.rl.models import tied_names
from aurora_store.tensors import host_words, word_views


def published_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` without tied duplicates: a tensor two names share (tied embeddings) is
    published once, under its first name, as transformers and vLLM load it back."""
    state = module.state_dict()
    tied = tied_names(state)
    return {k: v for k, v in state.items() if k not in tied}


def local_share(
    module: torch.nn.Module,
    *,
    dtype: torch.dtype | None = torch.bfloat16,
    group: Any = None,
    keep_device: bool = False,
    state: Mapping[str, torch.Tensor] | None = None,
) -> Share:
    """The words this rank publishes of :func:`published_state` (or of ``state``, a part of the
    module's state dict such as a LoRA adapter's): each DTensor's local shard (a
    contiguous range of the flattened tensor) and, on rank 0 of ``group`` only, the tensors every
    rank holds whole (buffers, unsharded parameters). Floating-point tensors are cast to ``dtype``
    (round to nearest even, as the actors hold them); None publishes them as they are. With
    ``keep_device`` the words stay on the shards' device as word tensors (a delta is then extracted
    there); else they are copied to the host."""
    from torch.distributed.tensor import DTensor

    first = not dist.is_initialized() or dist.get_rank(group) == 0
    specs, ranges, words = [], {}, {}
    for name, t in (published_state(module) if state is None else state).items():
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
