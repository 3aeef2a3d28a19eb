"""The group of publishers of one version, as publishing needs it: its size, this one's rank, JSON
gathered and broadcast, word arrays sent point to point. A single process is a group of one
(:class:`LocalCollective`); the trainer's ranks use torch.distributed (``trainer.collectives``);
tests use threads (``aurora_store.testing.collective``)."""

from __future__ import annotations

import json
from typing import Any, Protocol

import numpy as np

from aurora_store.errors import UnsupportedError


class Collective(Protocol):
    """What publishing needs from the group of publishers: its size, this one's rank, JSON gathered
    and broadcast, and word arrays sent point to point."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def all_gather_json(self, obj: Any) -> list[Any]: ...

    def broadcast_json(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        ...

    def exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> None:
        """Send each (rank, words); fill each (rank, out) in place."""
        ...


class LocalCollective:
    """A publisher alone: rank 0 of 1. Messages still round-trip through JSON, so a single process
    uses exactly what a rank would receive."""

    rank = 0
    size = 1

    def all_gather_json(self, obj: Any) -> list[Any]:
        return [json.loads(json.dumps(obj, sort_keys=True))]

    def broadcast_json(self, obj: Any) -> Any:
        return json.loads(json.dumps(obj, sort_keys=True))

    def exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> None:
        if sends or recvs:
            raise UnsupportedError("a single publisher has no other rank to exchange words with")
