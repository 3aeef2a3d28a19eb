"""What ``aurora bench fuzz`` fuzzes: a :class:`Target` (valid inputs, a mutator, the parsers to run).

Its own module so that the engine (:mod:`bench.fuzz.fuzz`) and the targets it runs
(:mod:`bench.fuzz.targets`, :mod:`bench.fuzz.roles`) import it, and not each other.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
SHOW_BYTES = 512
"""Bytes of an input shown in a report."""


@dataclass(frozen=True, slots=True)
class Target(Generic[T]):
    """Valid inputs, how to mutate one, and the parsers to run on a mutant."""

    name: str
    seeds: Sequence[T]
    mutate: Callable[[random.Random, T], T]
    execute: Callable[[T], object]
    """Raises, or returns a str labelling an outcome other than plain acceptance."""
    show: Callable[[T], str] = field(default=lambda case: hexed(case))
    functions: tuple[str, ...] = ()
    """What ``execute`` calls, for the report."""


def hexed(data: bytes) -> str:
    """An input as hex, its first SHOW_BYTES bytes."""
    more = f"...(+{len(data) - SHOW_BYTES} bytes)" if len(data) > SHOW_BYTES else ""
    return bytes(data[:SHOW_BYTES]).hex() + more
