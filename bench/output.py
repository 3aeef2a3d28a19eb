"""What every benchmark's command line shares: its flags' dataclass, preset overrides, and output.

``aurora bench NAME`` is the one way in (:mod:`bench.cli` dispatches to ``bench.NAME``). Each
benchmark declares its command line as a ``Flags`` dataclass deriving from :class:`Output`, and
:func:`aurora_store.options.add_options` makes the flags from it, as for the roles. Every benchmark
prints one JSON object with ``--json`` and a rich table otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

C = TypeVar("C")


@dataclass(kw_only=True, slots=True)
class Output:
    """The flag every benchmark has."""

    json: bool = False
    """Print one JSON object on stdout, nothing else."""


def comma_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated names (blanks dropped)."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


def overridden(base: C, flags: Output) -> C:
    """``base`` (a preset dataclass) with every field of ``flags`` it shares that was given (not None)."""
    fields = {f.name for f in dataclasses.fields(base)}  # type: ignore[arg-type]
    changes = {
        f.name: getattr(flags, f.name)
        for f in dataclasses.fields(flags)
        if f.name in fields and getattr(flags, f.name) is not None
    }
    return dataclasses.replace(base, **changes)  # type: ignore[type-var]


def emit(result: dict[str, Any], flags: Output, render: Callable[[dict[str, Any]], None]) -> int:
    """Print ``result`` as one JSON object with ``--json``, else render it; the exit status."""
    if flags.json:
        print(json.dumps(result))
    else:
        render(result)
    return 0


def parser_for(name: str, flags: type[Output], description: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``aurora bench NAME``: one flag per field of ``flags``."""
    from aurora_store.options import add_options

    parser = argparse.ArgumentParser(prog=f"aurora bench {name}", description=description)
    add_options(parser, flags)
    return parser
