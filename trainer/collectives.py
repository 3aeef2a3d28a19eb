"""The collectives sharded publishing and the distributed trainer need, on torch.distributed; JSON
travels as uint8 tensors, so no pickle crosses ranks."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from aurora_store.tensors import WORDS, word_tensor


class TorchCollective:
    """The publisher's :class:`~aurora_store.bucket.collective.Collective` on a torch.distributed
    ``group`` (also what the distributed trainer gathers with); JSON travels as uint8 tensors."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
        backend = str(dist.get_backend(group))
        nccl_only = "nccl" in backend and "gloo" not in backend
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl_only else torch.device("cpu")

    def all_gather_json(self, obj: Any) -> list[Any]:
        data = json.dumps(obj, sort_keys=True).encode()
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        sizes = [torch.zeros_like(size) for _ in range(self.size)]
        dist.all_gather(sizes, size, group=self.group)
        n = [int(s.item()) for s in sizes]
        buf = torch.zeros(max(n), dtype=torch.uint8, device=self.device)
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        outs = [torch.empty_like(buf) for _ in range(self.size)]
        dist.all_gather(outs, buf, group=self.group)
        return [json.loads(o[:k].cpu().numpy().tobytes()) for o, k in zip(outs, n, strict=True)]

    def broadcast_json(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        data = json.dumps(obj, sort_keys=True).encode() if self.rank == 0 else b""
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        dist.broadcast(size, src=self.ranks[0], group=self.group)
        buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=self.device)
        if self.rank == 0:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        dist.broadcast(buf, src=self.ranks[0], group=self.group)
        return json.loads(buf.cpu().numpy().tobytes())

    def exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> None:
        """Point-to-point: send each (group rank, words); fill each (group rank, out) in place."""
        works: list[Any] = []
        keep: list[torch.Tensor] = []
        landing: list[tuple[torch.Tensor, np.ndarray]] = []
        for r, words in sends:
            arr = words if words.flags.writeable and words.flags.c_contiguous else np.array(words)
            t = word_tensor(arr).to(self.device)
            works.append(dist.isend(t, dst=self.ranks[r], group=self.group))
            keep.append(t)
        for r, out in recvs:
            t = torch.empty(out.size, dtype=WORDS[out.itemsize], device=self.device)
            works.append(dist.irecv(t, src=self.ranks[r], group=self.group))
            landing.append((t, out))
        for work in works:
            work.wait()
        for t, out in landing:
            out[...] = t.cpu().numpy().view(out.dtype)
