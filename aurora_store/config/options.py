"""Command-line options derived from config dataclasses: one source of truth per option.

A role's options are a ``kw_only, slots`` dataclass with a docstring under every field; a
field whose type is another such dataclass is a section (an argument group, e.g. the
trainer's ``model``, ``data``, ``rollout``, ``optim``, ``publish``, ``schedule``). For every
leaf field, :func:`add_options` adds ``--field-name`` with the field's docstring as its help,
its type from the annotation and its default from the dataclass; :func:`build` makes the
config back from the parsed arguments. ``option(...)`` in a field's metadata renames a flag,
reads a default from the environment, or gives choices. A numeric field's annotation carries its
:class:`Range` (``prompts: Annotated[int, COUNT] = 32``): :func:`build` refuses a value outside it,
naming the flag or the environment variable it came from, and a config file's tables are checked
against the same ranges when the file is read (:mod:`aurora_store.config`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import math
import os
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aurora_store.errors import ConfigError
from aurora_store.redact import redact_value

_KEY = "aurora_option"
_FROM_ENV = "aurora_options_from_env"
"""The parser default (a dest of no option) that records which options took their value from a set
environment variable: dest -> variable, so :func:`build` can name it in an error."""

MAX_DEPTH = 32
"""How deep a JSON option or a config file's tables and arrays may nest (storage options take a few levels)."""

INT_MAX = (1 << 63) - 1
"""The largest integer any option takes: what fits Redis, JSON readers and torch's seed alike."""


@dataclass(frozen=True, slots=True)
class Range:
    """The values a numeric option takes, in its annotation: ``Annotated[float, Range(gt=0)]``.
    Bounds are inclusive (``ge``, ``le``) or exclusive (``gt``, ``lt``); NaN and infinities are never
    in a range, and an integer option is also within [-2**63 + 1, 2**63 - 1]."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def describe(self, integer: bool) -> str:
        """What a value must be: ``an integer >= 1``, ``a finite number in (0, 1]``."""
        kind = "an integer" if integer else "a finite number"
        lo = self.ge if self.ge is not None else self.gt
        hi = self.le if self.le is not None else self.lt
        if lo is not None and hi is not None:
            left, right = "[" if self.ge is not None else "(", "]" if self.le is not None else ")"
            return f"{kind} in {left}{_num(lo)}, {_num(hi)}{right}"
        pairs = ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
        return " ".join([kind, *(f"{op} {_num(b)}" for op, b in pairs if b is not None)])

    def holds(self, value: Any, integer: bool) -> bool:
        """Whether ``value`` (an int or float, as the option's type makes it) is in the range."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if integer and (not isinstance(value, int) or abs(value) > INT_MAX):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )


def shown(value: Any) -> str:
    """A number as an error shows it: short, whatever its size."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return f"{value!r:.60}"


def _num(b: float) -> str:
    return str(int(b)) if float(b).is_integer() else repr(b)


COUNT = Range(ge=1)
"""How many of something there must be at least one of (prompts, batches, connections)."""
NONNEGATIVE = Range(ge=0)
"""A count that may be zero (warm-up steps, a seed)."""
SECONDS = Range(gt=0, le=30 * 86400)
"""A duration or period: more than nothing, at most 30 days (it becomes Redis milliseconds)."""
PORT = Range(ge=0, le=65535)
"""A TCP port (0: off, where the option says so)."""


def option(
    *,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    env: str | None = None,
    metavar: str | None = None,
    nargs: int | None = None,
    parse: Callable[[str], Any] | None = None,
    file: str | None = None,
) -> dict[str, Any]:
    """Field metadata for :func:`add_options`: ``flag`` instead of ``--field-name``; ``aliases``, more
    flags for the same option; ``env``, an
    environment variable that gives the default (the option is then not required); ``nargs``
    values for a list field; ``parse``, the argument's type when the annotation's is not enough (for a
    list or tuple field without ``nargs``, one argument that ``parse`` reads whole, e.g. comma-separated).
    ``file``: what of a run's config file's common part gives this option (one of
    :data:`aurora_store.config.schema.FACTS`, e.g. ``"region.uri"``, or ``"host"`` for an option set per
    host, never in the file); a role's tables may not set such an option."""
    return {
        _KEY: {
            "flag": flag,
            "aliases": aliases,
            "env": env,
            "metavar": metavar,
            "nargs": nargs,
            "parse": parse,
            "file": file,
        }
    }


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object (fsspec storage options and the like)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError(f"nested deeper than {MAX_DEPTH} objects or arrays") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise argparse.ArgumentTypeError(f"nested deeper than {MAX_DEPTH} objects or arrays")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        todo += [(c, depth + 1) for c in children if isinstance(c, (dict, list))]
    return value


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` and of the dataclasses it derives from
    (read from their source with ``ast``)."""
    docs: dict[str, str] = {}
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, after in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _leaves(cls: type, section: str = "") -> Iterator[tuple[str, str, dataclasses.Field[Any], Any, str]]:
    """(section, dest, field, type, doc) of every leaf field of ``cls``, sections flattened."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _leaves(tp, f.name if not section else f"{section}.{f.name}")  # type: ignore[arg-type]
            continue
        if f.name not in docs:
            raise TypeError(f"{cls.__name__}.{f.name} has no docstring: every option needs one for its --help")
        yield section, f"{section}.{f.name}" if section else f.name, f, tp, docs[f.name]


def leaves(cls: type) -> list[tuple[str, str, dataclasses.Field[Any], Any, str]]:
    """(section, dest, field, type, docstring) of every leaf option of ``cls``, sections flattened
    (what a config file's tables are checked against)."""
    return list(_leaves(cls))


@functools.cache
def ranges(cls: type) -> dict[str, tuple[Range, bool]]:
    """The :class:`Range` of every leaf option of ``cls`` that has one, and whether it is an integer, by dest."""
    out: dict[str, tuple[Range, bool]] = {}
    for _, dest, f, tp, _ in _leaves(cls):
        owner = _owner(cls, dest)
        extras = typing.get_type_hints(owner, include_extras=True)[f.name]
        base, _ = base_type(tp)
        for meta in getattr(extras, "__metadata__", ()):
            if isinstance(meta, Range):
                if base not in (int, float):
                    raise TypeError(f"{owner.__name__}.{f.name}: a Range bounds an int or float option only")
                out[dest] = (meta, base is int)
    return out


def _owner(cls: type, dest: str) -> type:
    """The dataclass that declares leaf ``dest`` of ``cls`` (a section's class, or ``cls``)."""
    for part in dest.split(".")[:-1]:
        cls = typing.get_type_hints(cls)[part]
    return cls


def out_of_range(cls: type, dest: str, value: Any) -> str | None:
    """What option ``dest`` of ``cls`` must be, if ``value`` is outside its range (None if in it, or
    it has no range). None is in range where the option's type allows None."""
    if dest not in ranges(cls) or value is None:
        return None
    rng, integer = ranges(cls)[dest]
    return None if rng.holds(value, integer) else rng.describe(integer)


def option_env(f: dataclasses.Field[Any]) -> str | None:
    """The environment variable that gives field ``f``'s default, if any."""
    return f.metadata.get(_KEY, {}).get("env")


def option_file(f: dataclasses.Field[Any]) -> str | None:
    """What of a config file's common part gives field ``f`` (its ``option(file=...)``), if anything."""
    return f.metadata.get(_KEY, {}).get("file")


def field_defaults(cls: type) -> dict[str, Any]:
    """Every leaf field's default, by dest (``section.field``)."""
    return {dest: _default(f) for _, dest, f, _, _ in _leaves(cls)}


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def base_type(tp: Any) -> tuple[Any, bool]:
    """The type inside ``X | None`` and whether None is allowed."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    exclude: frozenset[str] = frozenset(),
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """One flag per leaf field of ``cls`` (except the dests in ``exclude``), grouped by section;
    ``defaults`` (by dest) replaces a field's default for this command (a recipe: ``aurora demo``'s, or
    a run's config file); an ``env`` variable that is set overrides both."""
    groups: dict[str, Any] = {}
    from_env_dests: dict[str, str] = dict(parser.get_default(_FROM_ENV) or {})
    for section, dest, f, tp, doc in _leaves(cls):
        if dest in exclude:
            continue
        target = parser
        if section:
            if section not in groups:
                groups[section] = parser.add_argument_group(section)
            target = groups[section]
        meta = f.metadata.get(_KEY, {})
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        default = (defaults or {}).get(dest, _default(f))
        kw: dict[str, Any] = {"dest": dest, "help": doc.replace("%", "%%")}  # argparse formats help with %
        env = meta.get("env")
        from_env = bool(env) and env in os.environ
        if env:
            default = os.environ.get(env, None if default is dataclasses.MISSING else default)
            if from_env:
                from_env_dests[dest] = env
            kw["help"] = f"{doc.rstrip('.')} (or ${env}" + (", which is set" if from_env else "") + ")."
        base, optional = base_type(tp)
        if base is bool:
            kw["action"] = argparse.BooleanOptionalAction if default is True else "store_true"
        elif typing.get_origin(base) is typing.Literal:
            kw["choices"] = list(typing.get_args(base))
        elif typing.get_origin(base) in (list, tuple) and meta.get("parse") and not meta.get("nargs"):
            kw["type"] = meta["parse"]
        elif typing.get_origin(base) in (list, tuple):
            kw["nargs"] = meta.get("nargs") or "+"
            kw["type"] = meta.get("parse") or typing.get_args(base)[0]
        else:
            kw["type"] = meta.get("parse") or (json_object if typing.get_origin(base) is dict else base)
            if base is str:
                kw["action"], kw["env"] = _TextOption, env
        if kw.get("action") in (None, _TextOption) and "choices" not in kw:
            kw["metavar"] = meta.get("metavar") or f.name.upper()
        if default is dataclasses.MISSING or (default is None and env and not optional):
            kw["required"] = True
        else:
            kw["default"] = default
            shown = default is not None and not isinstance(default, bool) and default not in ("", {}, [], ())
            if shown and not from_env:  # a value from the environment may be a secret: never in --help
                kw["help"] += f" (default: {redact_value(default)})".replace("%", "%%")
        target.add_argument(flag, *meta.get("aliases", ()), **kw)
    parser.set_defaults(**{_FROM_ENV: from_env_dests})


PRIVATE_KEY = "PRIVATE KEY-----"
"""What every PEM private key's text holds (``-----BEGIN PRIVATE KEY-----``, ``... RSA PRIVATE KEY-----``)."""


def holds_private_key(text: str) -> bool:
    """Whether ``text`` is (or holds) a PEM private key's text, not a path to one."""
    return "-----BEGIN" in text and PRIVATE_KEY in text


class _TextOption(argparse.Action):
    """A string option as typed on the command line (argparse calls it for flags only, never for a
    default from the environment): a private key's text there is readable by every local user in the
    process list, so it is taken with a warning that says how to pass it instead."""

    def __init__(self, *args: Any, env: str | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.env = env

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, flag: str | None = None
    ) -> None:
        if isinstance(values, str) and holds_private_key(values):
            instead = "a path to the key's file (mode 0600)" + (f", or its text in ${self.env}" if self.env else "")
            print(
                f"{parser.prog}: warning: {flag or self.dest} was given a private key's text on the command line, "
                f"where every local user can read it in the process list (ps, /proc/PID/cmdline); give it "
                f"{instead} instead",
                file=sys.stderr,
            )
        setattr(namespace, self.dest, values)


def build(cls: type, args: argparse.Namespace | Mapping[str, Any], **given: Any) -> Any:
    """An instance of ``cls`` from parsed arguments (by dest), with ``given`` (by field name, top
    level or ``section.field``) for the options the command line did not have. A value outside its
    option's :class:`Range` is a :class:`ConfigError` naming the flag, or the environment variable
    it came from (a config file's values were checked when the file was read)."""
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    values = {**values, **given}
    env = values.get(_FROM_ENV) or {}
    problems = []
    for _, dest, f, _, _ in _leaves(cls):
        if dest in values and (want := out_of_range(cls, dest, values[dest])) is not None:
            flag = f.metadata.get(_KEY, {}).get("flag") or "--" + f.name.replace("_", "-")
            source = f"{flag} (or ${env[dest]}, which is set)" if dest in env and dest not in given else flag
            problems.append(f"{source}: expected {want}, got {shown(values[dest])}")
    if problems:
        raise ConfigError("; ".join(problems))
    return _build(cls, "", values)


def _build(cls: type, section: str, values: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        dest = f"{section}.{f.name}" if section else f.name
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            kw[f.name] = values[dest] if dest in values else _build(tp, dest, values)  # type: ignore[arg-type]
        elif dest in values:
            value = values[dest]
            kw[f.name] = tuple(value) if typing.get_origin(base_type(tp)[0]) is tuple and value is not None else value
    return cls(**kw)
