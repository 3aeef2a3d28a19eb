"""Command-line options derived from config dataclasses: one source of truth per option.

A role's options are a ``kw_only, slots`` dataclass with a docstring under every field; a
field whose type is another such dataclass is a section (an argument group, e.g. the
trainer's ``model``, ``data``, ``rollout``, ``optim``, ``publish``, ``schedule``). For every
leaf field, :func:`add_options` adds ``--field-name`` with the field's docstring as its help,
its type from the annotation and its default from the dataclass; :func:`build` makes the
config back from the parsed arguments. ``option(...)`` in a field's metadata renames a flag,
reads a default from the environment, or gives choices.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import os
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from aurora_store.redact import redact_value

_KEY = "aurora_option"


def option(
    *,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    env: str | None = None,
    metavar: str | None = None,
    nargs: int | None = None,
    parse: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Field metadata for :func:`add_options`: ``flag`` instead of ``--field-name``; ``aliases``, more
    flags for the same option; ``env``, an
    environment variable that gives the default (the option is then not required); ``nargs``
    values for a list field; ``parse``, the argument's type when the annotation's is not enough (for a
    list or tuple field without ``nargs``, one argument that ``parse`` reads whole, e.g. comma-separated)."""
    return {_KEY: {"flag": flag, "aliases": aliases, "env": env, "metavar": metavar, "nargs": nargs, "parse": parse}}


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
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
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


def option_env(f: dataclasses.Field[Any]) -> str | None:
    """The environment variable that gives field ``f``'s default, if any."""
    return f.metadata.get(_KEY, {}).get("env")


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
        if kw.get("action") is None and "choices" not in kw:
            kw["metavar"] = meta.get("metavar") or f.name.upper()
        if default is dataclasses.MISSING or (default is None and env and not optional):
            kw["required"] = True
        else:
            kw["default"] = default
            shown = default is not None and not isinstance(default, bool) and default not in ("", {}, [], ())
            if shown and not from_env:  # a value from the environment may be a secret: never in --help
                kw["help"] += f" (default: {redact_value(default)})".replace("%", "%%")
        target.add_argument(flag, *meta.get("aliases", ()), **kw)


def build(cls: type, args: argparse.Namespace | Mapping[str, Any], **given: Any) -> Any:
    """An instance of ``cls`` from parsed arguments (by dest), with ``given`` (by field name, top
    level or ``section.field``) for the options the command line did not have."""
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    return _build(cls, "", {**values, **given})


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
