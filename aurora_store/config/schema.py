"""The shape of a run's config file: its regions, the common part every role reads, and the tables
each role declares (which of its options a table fills, and the options' types)."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from aurora_store.errors import ConfigError
from aurora_store.options import base_type, leaves, out_of_range, shown
from aurora_store.redact import redact

MAX_FILE_BYTES = 1 << 20
"""A config file is a few kilobytes; a bigger one is not a config file."""

ENV = "AURORA_CONFIG"
"""The environment variable that names the config file when ``--config`` is not given."""

COMMON = ("run_id", "home", "redis", "keys", "regions")
"""The top-level keys every role reads; the rest are the roles' tables."""

REGION_KEYS = ("uri", "storage_options", "source")
"""What a ``[regions.NAME]`` table holds, besides per-region role tables (``[regions.NAME.actor]``)."""

FLOAT_INT_MAX = 1 << 1000
"""An integer written for a float option must be below this (a double's range ends near 2**1024)."""

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")


@dataclass(frozen=True, slots=True)
class Region:
    """One ``[regions.NAME]`` table."""

    name: str
    uri: str
    storage_options: dict[str, Any]
    source: str | None
    """The region its relay copies from (the home region when the file says nothing); None for home."""
    tables: dict[str, dict[str, Any]]
    """Per-region role tables (``[regions.NAME.actor]``), over the shared ones."""


@dataclass(frozen=True, slots=True)
class RunFile:
    """The common part of a config file, checked; the role tables as written (checked too)."""

    path: str
    run_id: str
    home: str
    redis: str | None
    signing_key: str | None
    verify_key: str | None
    regions: dict[str, Region]
    tables: dict[str, dict[str, Any]]
    warnings: tuple[str, ...] = ()

    def region(self, name: str | None, command: str) -> Region:
        """Region ``name``, or a :class:`ConfigError` that lists the file's regions."""
        if name is None:
            raise ConfigError(
                f"{self.path}: aurora {command} --config needs --region (one of: {', '.join(self.regions)})"
            )
        if name not in self.regions:
            raise ConfigError(
                f"{self.path}: no region {name!r} in [regions]{near(name, self.regions)} "
                f"(the file has: {', '.join(self.regions)})"
            )
        return self.regions[name]


@dataclass(frozen=True, slots=True)
class Table:
    """A file table that fills some sections of a role's options."""

    name: str
    """The table's name in the file (``model``, ``actor``)."""
    sections: tuple[str, ...]
    """The option sections its keys belong to ("" is the top level); a key names one leaf option."""
    per_region: bool = False
    """It may also appear as ``[regions.NAME.<name>]``, whose keys win for that region."""


@dataclass(frozen=True, slots=True)
class RoleSchema:
    """How one role reads the file."""

    command: str
    """The subcommand (``train``, ``relay``, ``actor``)."""
    cls: type
    """The role's options dataclass."""
    tables: tuple[Table, ...]
    derive: Callable[[RunFile, Region | None], dict[str, Any]]
    """The options that come from the common part (URIs, Redis, keys), by dest, for one region."""
    derived: frozenset[str]
    """The dests :attr:`derive` owns: tables may not set them."""
    regions: Literal["home", "each", "not_home"]
    """Where the role runs: once at home, in every region, or in every region but home."""

    def runs_in(self, f: RunFile) -> list[Region | None]:
        if self.regions == "home":
            return [f.regions[f.home]]
        return [r for r in f.regions.values() if self.regions == "each" or r.name != f.home]


ROLES: dict[str, RoleSchema] = {}


def declare(schema: RoleSchema) -> None:
    """Register a role's reading of the file (each role does, when it registers its subcommand)."""
    options = {dest for _, dest, *_ in leaves(schema.cls)}
    for table in schema.tables:
        for key in table_keys(schema, table):
            if sum(f"{s}.{key}".lstrip(".") in options for s in table.sections) != 1:
                raise TypeError(f"{schema.command}: key {key!r} of [{table.name}] names no single option")
    ROLES[schema.command] = schema


def schemas() -> dict[str, RoleSchema]:
    """The roles that read the file, by subcommand."""
    return dict(ROLES)


def table_keys(schema: RoleSchema, table: Table) -> list[str]:
    """The keys ``table`` may hold: its sections' leaf options, less the derived ones."""
    keys = []
    for section, dest, *_ in leaves(schema.cls):
        if section in table.sections and dest not in schema.derived:
            keys.append(dest.rsplit(".", 1)[-1])
    return keys


def table_values(
    schema: RoleSchema, table: Table, values: Mapping[str, Any], where: str, errors: list[str]
) -> dict[str, Any]:
    """``values`` of ``table``, checked against the options' types; by dest."""
    by_key = {}
    for section, dest, f, tp, doc in leaves(schema.cls):
        if section in table.sections and dest not in schema.derived:
            by_key[dest.rsplit(".", 1)[-1]] = (dest, f, tp, doc)
    out = {}
    for key, value in values.items():
        if key not in by_key:
            taken = [d.rsplit(".", 1)[-1] for _, d, *_ in leaves(schema.cls) if d in schema.derived]
            hint = " (it comes from the file's common part: regions, redis, keys)" if key in taken else ""
            errors.append(
                f"{where}.{key}: unknown key{hint}{near(key, by_key)} ([{table.name}] takes: {', '.join(by_key)})"
            )
            continue
        dest, f, tp, doc = by_key[key]
        problem, converted = typed(value, tp)
        if problem is None:
            problem = out_of_range(schema.cls, dest, converted)
        if problem:
            errors.append(f"{where}.{key}: expected {problem}, got {kind_of(value)} ({doc.split('.')[0][:80]})")
        else:
            out[dest] = converted
    return out


def typed(value: Any, tp: Any) -> tuple[str | None, Any]:
    """(what was expected, if ``value`` is not of option type ``tp``; the value, converted)."""
    base, _ = base_type(tp)
    origin = typing.get_origin(base)
    if base is bool:
        return (None, value) if isinstance(value, bool) else ("true or false", None)
    if base is int:
        return (None, value) if isinstance(value, int) and not isinstance(value, bool) else ("an integer", None)
    if base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if isinstance(value, int) and ok and abs(value) > FLOAT_INT_MAX:
            return ("a number of at most 300 digits", None)  # float() would overflow
        return (None, float(value)) if ok else ("a number", None)
    if base is str:
        return (None, value) if isinstance(value, str) else ("a string", None)
    if origin is Literal:
        choices = typing.get_args(base)
        return (None, value) if value in choices else ("one of " + ", ".join(map(repr, choices)), None)
    if origin is dict or base is dict:
        return (None, value) if isinstance(value, dict) else ("a table", None)
    if origin in (list, tuple):
        (inner,) = typing.get_args(base)[:1]
        if not isinstance(value, list):
            return ("an array", None)
        items = [typed(v, inner) for v in value]
        bad = next((p for p, _ in items if p), None)
        return (f"an array of {bad}s", None) if bad else (None, [v for _, v in items])
    raise TypeError(f"an option of type {tp!r} cannot be read from a config file")


def kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"a number ({shown(value)})"
    if isinstance(value, str):
        return f"a string ({redact(value)!r:.60})"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def near(word: str, options: Sequence[str] | Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
