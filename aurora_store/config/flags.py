"""The ``--config`` flag: the file a command line names is read before its parser is built, so the
file's values are the parser's defaults (flags and set ``AURORA_*`` variables override them)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from aurora_store.config.check import role_values
from aurora_store.config.load import load
from aurora_store.config.schema import ENV, ROLES, RunFile
from aurora_store.errors import ConfigError


@dataclass(slots=True)
class _Request:
    command: str | None
    path: str | None
    region: str | None
    loaded: dict[str, RunFile] = field(default_factory=dict)


_REQUEST: ContextVar[_Request | None] = ContextVar("aurora_config_request", default=None)


def requested(argv: Sequence[str]) -> None:
    """Note which config file (``--config``, or ``$AURORA_CONFIG``) and region (``--region``) the
    command line ``argv`` asks for, before its parser is built: the parser's defaults come from the
    file. The real parser checks the same flags again (:func:`confirm`)."""
    argv = list(argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--region", "--dest-region", dest="region")
    try:
        ns, _ = pre.parse_known_args(argv[1:])
    except argparse.ArgumentError:  # the real parser says what is wrong
        ns = argparse.Namespace(config=None, region=None)
    _REQUEST.set(_Request(command, ns.config or os.environ.get(ENV) or None, ns.region))


def defaults(command: str) -> dict[str, Any]:
    """The file's options for ``command`` when it is the one being run with a config file (by
    dest, for :func:`aurora_store.config.options.add_options`); {} otherwise."""
    req = _REQUEST.get()
    schema = ROLES.get(command)
    if req is None or req.command != command or req.path is None or schema is None:
        return {}
    if req.path not in req.loaded:
        req.loaded[req.path] = load(req.path)
    f = req.loaded[req.path]
    region = f.regions[f.home] if schema.regions == "home" else f.region(req.region, command)
    if schema.regions == "not_home" and region.name == f.home:
        raise ConfigError(f"{f.path}: {region.name} is the home region: the trainer writes it, no relay copies into it")
    return role_values(schema, f, region)


def add_flag(parser: argparse.ArgumentParser) -> None:
    """The ``--config`` flag of a role that reads the file."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(ENV) or None,
        help=f"the run's config file (aurora.toml; or ${ENV}): its values are this command's defaults, "
        "which flags and AURORA_* variables that are set override",
    )


def confirm(args: argparse.Namespace) -> None:
    """The real parser's ``--config`` is the file :func:`requested` read (an abbreviated flag would not be)."""
    req = _REQUEST.get()
    given = getattr(args, "config", None)
    if req is not None and given is not None and given != req.path:
        raise ConfigError(f"--config {given}: write the flag in full, as --config FILE")
