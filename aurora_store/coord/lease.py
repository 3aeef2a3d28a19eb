"""A lease as its holder sees it, an open job as the trainer sees it, and the names they carry.

Below :mod:`aurora_store.coord.jobs` (which makes and checks leases) and
:mod:`aurora_store.coord.results` (whose entries name a lease), so neither imports the other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aurora_store.coord.errors import JobError


@dataclass(frozen=True, slots=True)
class Lease:
    """A job as its holder sees it."""

    job: str
    token: int
    step: int
    version: int
    deadline_ms: int
    prompt: dict[str, Any]
    """The job's document as its poster gave it (the trainer's prompt, as JSON)."""


@dataclass(frozen=True, slots=True)
class OpenJob:
    job: str
    step: int
    version: int
    actor: str
    deadline_ms: int
    taken: bool
    """Whether the holder has taken it from its inbox (started it)."""


def now_ms() -> int:
    return int(time.time() * 1000)


def is_name(raw: Any) -> bool:
    """Whether ``raw``, read from Redis, is a job or actor id a role could have written."""
    return isinstance(raw, str) and 0 < len(raw) <= 200 and raw.isprintable() and not any(c in raw for c in " |{}")


def check_name(name: str, what: str) -> str:
    """``name`` if it may name a job or an actor (it goes into key names), else a JobError."""
    if not isinstance(name, str) or not name or len(name) > 200 or any(c in name for c in " |\n{}"):
        raise JobError(f"{what} id must be a short name without spaces, '|' or braces, got {name!r}")
    return name
