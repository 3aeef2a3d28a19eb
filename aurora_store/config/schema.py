"""The shape of a run's config file: its regions, the common part every role reads, and the tables
each role declares (which of its options a table fills, and the options' types)."""

from __future__ import annotations

import difflib
import functools
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from aurora_store.config.options import base_type, leaves, option_file, out_of_range, shown
from aurora_store.errors import ConfigError
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


def _source(f: RunFile, r: Region | None) -> Region | None:
    return f.regions[r.source] if r is not None and r.source is not None else None


def _fallback(f: RunFile, r: Region | None) -> Region | None:
    return f.regions[f.home] if r is not None and r.name != f.home else None


def _others(f: RunFile) -> dict[str, Any] | None:
    out = {n: {"uri": r.uri, "storage_options": r.storage_options} for n, r in f.regions.items() if n != f.home}
    return out or None


def _of(region: Region | None, attr: str) -> Any:
    return None if region is None else getattr(region, attr)


HOST = "host"
"""``option(file=HOST)``: an option set per host (a flag or a variable), never in the run's file."""

FACTS: dict[str, Callable[[RunFile, Region | None], Any]] = {
    "run_id": lambda f, r: f.run_id,
    "redis": lambda f, r: f.redis,
    "signing_key": lambda f, r: f.signing_key,
    "verify_key": lambda f, r: f.verify_key,
    "home.name": lambda f, r: f.home,
    "home.uri": lambda f, r: f.regions[f.home].uri,
    "home.storage_options": lambda f, r: f.regions[f.home].storage_options,
    "region.name": lambda f, r: _of(r, "name"),
    "region.uri": lambda f, r: _of(r, "uri"),
    "region.storage_options": lambda f, r: _of(r, "storage_options"),
    "source.name": lambda f, r: _of(_source(f, r), "name"),
    "source.uri": lambda f, r: _of(_source(f, r), "uri"),
    "source.storage_options": lambda f, r: _of(_source(f, r), "storage_options"),
    "fallback.uri": lambda f, r: _of(_fallback(f, r), "uri"),
    "fallback.storage_options": lambda f, r: _of(_fallback(f, r), "storage_options"),
    "other_regions": lambda f, r: _others(f),
    HOST: lambda f, r: None,
}
"""What an option may take from a config file's common part (``option(file=NAME)``), for the region a
role runs in: the run, Redis and the keys; the home region's, this region's, its relay source's and
(outside home) the fallback's bucket; every region but home's buckets. None: the file gives nothing
(no Redis in the file, no fallback at home), and the option keeps its flag, variable or default."""


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
    regions: Literal["home", "each", "not_home"]
    """Where the role runs: once at home, in every region, or in every region but home."""

    @property
    def derived(self) -> dict[str, str]:
        """The options the file's common part gives (or that are per host), by dest: each field's
        ``option(file=...)``. Tables may not set them."""
        return file_facts(self.cls)

    def derive(self, f: RunFile, region: Region | None) -> dict[str, Any]:
        """The options the common part gives for ``region`` (URIs, Redis, keys), by dest."""
        out = {dest: FACTS[fact](f, region) for dest, fact in self.derived.items()}
        return {dest: value for dest, value in out.items() if value is not None}

    def runs_in(self, f: RunFile) -> list[Region | None]:
        if self.regions == "home":
            return [f.regions[f.home]]
        return [r for r in f.regions.values() if self.regions == "each" or r.name != f.home]


@functools.cache
def file_facts(cls: type) -> dict[str, str]:
    """Every leaf option of ``cls`` that the file's common part gives, by dest: its fact's name."""
    out = {dest: option_file(f) for _, dest, f, _, _ in leaves(cls)}
    unknown = sorted(f"{d}: {v!r}" for d, v in out.items() if v is not None and v not in FACTS)
    if unknown:
        raise TypeError(f"{cls.__name__}: option(file=...) names no fact of a config file: {', '.join(unknown)}")
    return {d: v for d, v in out.items() if v is not None}


ROLES: dict[str, RoleSchema] = {}


def declare(schema: RoleSchema) -> None:
    """Register a role's reading of the file (each role does, when it registers its subcommand)."""
    file_facts(schema.cls)  # every option(file=...) names a fact of the file
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
            taken = {d.rsplit(".", 1)[-1]: fact for d, fact in schema.derived.items()}
            hint = ""
            if key in taken:
                hint = (
                    " (it is set per host: a flag or its variable)"
                    if taken[key] == HOST
                    else " (it comes from the file's common part: regions, redis, keys)"
                )
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
