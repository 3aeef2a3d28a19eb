"""The shared tail of every benchmark's command line: flag overrides of a preset config, and output.

``aurora bench NAME`` is the one way in (:mod:`bench.cli` dispatches to ``bench.NAME``); every
benchmark prints one JSON object with ``--json`` and a rich table otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

C = TypeVar("C")


def overridden(base: C, args: argparse.Namespace, names: Iterable[str]) -> C:
    """``base`` (a dataclass) with ``seed``, every flag in ``names`` that was given, and ``--modes``."""
    changes: dict[str, Any] = {"seed": args.seed}
    for name in names:
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if getattr(args, "modes", None):
        changes["modes"] = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    return dataclasses.replace(base, **changes)  # type: ignore[type-var]


def emit(result: dict[str, Any], args: argparse.Namespace, render: Callable[[dict[str, Any]], None]) -> int:
    """Print ``result`` as one JSON object with ``--json``, else render it; the exit status."""
    if args.json:
        print(json.dumps(result))
    else:
        render(result)
    return 0
