"""The ``descent`` invariant of ``aurora bench chaos``: every version's weights descend from its
manifest's parent or from the rollback it declares, never from anything else.

A trainer process says where its weights come from once, when it starts (a line of its log), and
names itself in every manifest it publishes (``meta.trainer``). The first version a process publishes
continues from the state it resumed from: its parent (the version before it) unless the manifest
declares ``rolls_back_to`` that state, with that version's hash, abandoning every version between.
Every later version of the same process continues from the process's own version before it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_START = re.compile(
    r"trainer (?P<tag>[0-9a-f]{8}) (?:starts a new run at version 0"
    r"|resumes from the state of version (?P<state>\d+); latest committed version (?P<latest>\d+))"
)


@dataclass(frozen=True, slots=True)
class Start:
    """What a trainer process said of its weights when it started."""

    tag: str
    """The process's tag (``meta.trainer`` of what it publishes)."""
    state: int | None
    """The version whose saved state it resumed from; None: it started a new run (at version 0)."""
    latest: int | None = None
    """The latest committed version when it resumed."""


def read_starts(log: Path) -> list[Start]:
    """Every trainer start line of ``log`` (a trainer's log across its restarts), in order; whatever
    prefix the log formatter or the supervisor put before the words is ignored."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if m := _START.search(line):
            state, latest = m.group("state"), m.group("latest")
            out.append(Start(m["tag"], None if state is None else int(state), None if latest is None else int(latest)))
    return out


@dataclass(slots=True)
class Descent:
    """The verdict on one region's versions."""

    problems: list[str] = field(default_factory=list)
    rollbacks: int = 0
    """Versions that declare ``rolls_back_to``."""
    abandoned: int = 0
    """Versions those rollbacks abandon."""


def descent(docs: Mapping[int, Mapping[str, Any]], starts: Iterable[Start]) -> Descent:
    """Check every committed version >= 1 of one bucket (``docs``: version -> its manifest's JSON)
    against the start lines of the trainer processes that published them."""
    out = Descent()
    by_tag: dict[str, Start] = {}
    for s in starts:
        if by_tag.setdefault(s.tag, s) != s:
            out.problems.append(f"trainer {s.tag} logged two different start lines: {by_tag[s.tag]} and {s}")
    published: dict[str, list[int]] = {}
    for v in sorted(docs):
        tag = _trainer(docs[v])
        if tag is not None:
            published.setdefault(tag, []).append(v)
    for v in sorted(docs):
        if v < 1:
            continue
        doc, tag = docs[v], _trainer(docs[v])
        back = doc.get("rolls_back_to")
        if back is not None:
            out.rollbacks += 1
            abandons = back.get("abandons") if isinstance(back, dict) else None
            out.abandoned += len(abandons) if isinstance(abandons, list) else 0
        if tag is None:
            out.problems.append(f"version {v}: its manifest names no trainer process (meta.trainer): unknown origin")
            continue
        mine = published[tag]
        if v != mine[0]:
            before = max(u for u in mine if u < v)
            if back is not None:
                out.problems.append(
                    f"version {v}: trainer {tag} continues from its version {before}, yet the manifest declares "
                    f"a rollback {back!r}"
                )
            elif before != v - 1:
                out.problems.append(
                    f"version {v}: trainer {tag} continues from its own version {before}, not from its parent "
                    f"{v - 1} (published by trainer {_trainer(docs.get(v - 1, {}))})"
                )
            continue
        start = by_tag.get(tag)
        if start is None:
            out.problems.append(f"version {v}: trainer {tag}, its first, logged no start line: unknown origin")
        elif start.state is None:
            out.problems.append(f"version {v}: trainer {tag} started a new run, yet its first version is {v}, not 0")
        elif back is None:
            if start.state != v - 1:
                out.problems.append(
                    f"version {v}: trainer {tag} resumed from the state of version {start.state} (latest "
                    f"{start.latest}) but the manifest declares no rollback: its weights descend from version "
                    f"{start.state}, not from its parent {v - 1}"
                )
        else:
            out.problems += [f"version {v} (trainer {tag}): {p}" for p in _rollback_problems(v, back, start, docs)]
    return out


def _rollback_problems(v: int, back: Any, start: Start, docs: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """What is wrong with version ``v``'s ``rolls_back_to``, declared by a trainer that said ``start``."""
    if not isinstance(back, dict):
        return [f"rolls_back_to is {back!r}, not an object"]
    s = start.state
    to, digest, abandons = back.get("version"), back.get("version_hash"), back.get("abandons")
    problems = []
    if to != s:
        problems.append(f"declares a rollback to version {to!r}, but the trainer resumed from the state of {s}")
    target = docs.get(to) if isinstance(to, int) else None
    if target is None:
        problems.append(f"rolls back to version {to!r}, which is not committed here")
    elif digest != target.get("version_hash"):
        problems.append(f"rolls back to version {to} with hash {digest!r}, not that version's")
    if s is not None and abandons != list(range(s + 1, v)):
        problems.append(f"abandons {abandons!r}, not the versions between {s} and {v}: {list(range(s + 1, v))}")
    return problems


def _trainer(doc: Mapping[str, Any]) -> str | None:
    meta = doc.get("meta")
    tag = meta.get("trainer") if isinstance(meta, dict) else None
    return tag if isinstance(tag, str) and tag else None
