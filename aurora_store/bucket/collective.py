"""The group of publishers of one version, as publishing needs it: its size, this one's rank, JSON
gathered and broadcast, word arrays sent point to point. A single process is a group of one
(:class:`LocalCollective`); the trainer's ranks use torch.distributed (``trainer.collectives``);
tests use threads (``aurora_store.testing.collective``).

Publishing is a sequence of steps every rank takes together: :func:`agree` (every rank does its part
and learns every rank's answer) and :func:`decide` (rank 0 decides and every rank learns what). A
failure on any rank travels in the same message, so every rank raises and none waits forever.
Messages are JSON: no pickle crosses ranks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import numpy as np

from aurora_store import errors
from aurora_store.errors import StoreError, UnsupportedError


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


# ------------------------------------------------------------ agreeing on every rank

T = TypeVar("T")


def agree(collective: Collective, local: Callable[[], tuple[T, Any]]) -> tuple[T, list[Any]]:
    """Every rank runs ``local``, which returns what this rank keeps and what it tells the others (JSON);
    returns what this rank kept and every rank's message, on every rank. A rank whose ``local`` raised
    reports it through the same gather instead of leaving the others waiting, and then every rank
    raises: the failed rank its own exception, the others one of the same family naming that rank."""
    kept, failure = _attempt(local)
    messages = collective.all_gather_json(_report(failure) or kept[1])
    raise_reported(messages, failure)
    return kept[0], messages


def decide(collective: Collective, local: Callable[[], tuple[T, Any]]) -> tuple[T | None, Any]:
    """Rank 0 runs ``local`` (what it keeps, what it tells the others); returns what this rank kept
    (None on other ranks) and rank 0's message, on every rank. If rank 0 failed, every rank raises
    (rank 0 its own exception)."""
    kept, failure = _attempt(local) if collective.rank == 0 else ((None, None), None)
    message = collective.broadcast_json(_report(failure) or kept[1])
    raise_reported([message], failure)
    return kept[0], message


def raise_reported(messages: list[Any], mine: BaseException | None) -> None:
    """Raise if any rank reported a failure in ``messages``: ``mine`` on the rank that had it, else the
    first reported failure as the store's error of that name (a plain StoreError for any other)."""
    bad = [(r, m) for r, m in enumerate(messages) if isinstance(m, dict) and "error" in m]
    if not bad:
        return
    if mine is not None:
        raise mine
    r, m = bad[0]
    cls = getattr(errors, str(m.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, StoreError)):
        cls = StoreError
    raise cls(f"rank {r}: {m['error']}" if len(messages) > 1 else m["error"])


def _attempt(fn: Callable[[], T]) -> tuple[Any, BaseException | None]:
    """Run a rank's local work; a failure must reach the other ranks instead of leaving them waiting."""
    try:
        return fn(), None
    except Exception as exc:  # reported through the next collective, then re-raised on this rank
        return (None, None), exc


def _report(failure: BaseException | None) -> dict[str, str] | None:
    return None if failure is None else {"error": str(failure)[:2000], "type": type(failure).__name__}
