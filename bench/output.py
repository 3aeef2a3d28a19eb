"""What every benchmark's command line shares: its flags' dataclass, preset overrides, and output.

``aurora bench NAME`` is the one way in (:mod:`bench.cli` dispatches to ``bench.NAME``). Each
benchmark declares its command line as a ``Flags`` dataclass deriving from :class:`Output`, and
:func:`aurora_store.config.options.add_options` makes the flags from it, as for the roles. Every benchmark
prints one JSON object with ``--json`` and a rich table otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from aurora_store.cli_parser import Parser

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


def parser_for(
    name: str, flags: type[Output], description: str | None = None, presets: Mapping[str, Any] | None = None
) -> argparse.ArgumentParser:
    """The parser of ``aurora bench NAME``: one flag per field of ``flags``; ``presets`` (a label, such
    as ``--quick``, to a preset config or mapping) fill in the help of the flags that default to None."""
    from aurora_store.config.options import add_options

    note = preset_note(flags, presets or {})
    parser = Parser(prog=f"aurora bench {name}", description=description, epilog=note)
    add_options(parser, flags)
    return parser


def preset_note(flags: type[Output], presets: Mapping[str, Any]) -> str | None:
    """The ``--help`` epilog: for each preset, its values of the flags whose field defaults to None
    (the preset's value), read from the presets themselves."""
    names = [f.name for f in dataclasses.fields(flags) if f.default is None]
    parts = []
    for label, preset in presets.items():
        values = preset if isinstance(preset, Mapping) else {n: getattr(preset, n, None) for n in names}
        shown = [f"--{n.replace('_', '-')} {_shown(values[n])}" for n in names if values.get(n) is not None]
        if shown:
            parts.append(f"{label}: {' '.join(shown)}")
    return f"Presets: {'; '.join(parts)}." if parts else None


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
