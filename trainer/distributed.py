"""The trainer under torchrun: process group, FSDP2 sharding, and rank-0-decides broadcasts.

Without torchrun (no ``WORLD_SIZE`` > 1 in the environment) everything here is a no-op on
one rank, so the trainer has one code path. Under torchrun every rank builds the same model,
``fully_shard`` shards each decoder layer and the root (FSDP2), rank 0 alone talks to Redis
(jobs, admission, metrics) and broadcasts each step's batch, every rank computes the loss
on its slice of it, and all ranks publish together through :class:`~trainer.publication.ModelPublisher`.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from trainer.collectives import TorchCollective


class Dist:
    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.main = self.rank == 0
        self._comm = TorchCollective(None) if self.world > 1 else None

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` (JSON-able) on every rank."""
        return obj if self._comm is None else self._comm.broadcast_json(obj)

    def sum_floats(self, values: list[float]) -> list[float]:
        """Element-wise sums of every rank's ``values`` (metrics; JSON over the group, no pickle)."""
        if self._comm is None:
            return values
        return [sum(col) for col in zip(*self._comm.all_gather_json(values), strict=True)]

    def shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """FSDP2 over every decoder layer and the root; the model as is on one rank. A LoRA run's
        model is PEFT's wrapper: its layers are those of the model it wraps, each holding its frozen
        weights and its adapter's matrices in one shard group."""
        if self.world == 1:
            return model
        from torch.distributed.fsdp import fully_shard

        unwrap = getattr(model, "get_base_model", None)
        inner = unwrap() if callable(unwrap) else model
        for layer in inner.model.layers:  # type: ignore[union-attr]
            fully_shard(layer)
        fully_shard(model)
        return model

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
