"""A group of publishers as threads of one process: the publisher's ``Collective`` without torch,
so store-side tests drive several ranks through the real publishing code in milliseconds."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


class ThreadGroup:
    """``size`` ranks that meet at a barrier; rank r's collective is ``group.rank(r)``."""

    def __init__(self, size: int, *, timeout: float = 60.0) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=timeout)
        self._slots: list[Any] = [None] * size
        self._mail = {(a, b): queue.Queue[np.ndarray]() for a in range(size) for b in range(size)}
        self._timeout = timeout

    def rank(self, r: int) -> ThreadCollective:
        return ThreadCollective(self, r)

    def run(self, fn: Callable[[int], T]) -> list[T | BaseException]:
        """``fn(rank)`` on every rank at once; each rank's result, or the exception it raised."""
        out: list[Any] = [None] * self.size

        def one(r: int) -> None:
            try:
                out[r] = fn(r)
            except BaseException as exc:  # returned to the test, which asserts on it
                out[r] = exc

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out


class ThreadCollective:
    """One rank of a :class:`ThreadGroup`. JSON round-trips as it would between processes."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self._group, self.rank, self.size = group, rank, group.size

    def all_gather_json(self, obj: Any) -> list[Any]:
        g = self._group
        g._barrier.wait()  # every rank has read the previous round's slots
        g._slots[self.rank] = json.dumps(obj, sort_keys=True)
        g._barrier.wait()
        return [json.loads(s) for s in g._slots]

    def broadcast_json(self, obj: Any) -> Any:
        return self.all_gather_json(obj if self.rank == 0 else None)[0]

    def exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> None:
        g = self._group
        for r, words in sends:
            g._mail[(self.rank, r)].put(np.array(words, copy=True))
        for r, out in recvs:
            out[...] = g._mail[(r, self.rank)].get(timeout=g._timeout).view(out.dtype)
