"""A run's one config file, ``aurora.toml``: every role reads its part of it.

The file names the run, its home region, every region's bucket (URI and fsspec options),
Redis and the signing keys; tables named after the roles' option sections (``[model]``,
``[data]``, ``[publish]``, ``[schedule]``, ``[actor]``, ``[relay]``, ...) hold their options,
with the same names as the flags. ``aurora train --config aurora.toml``, ``aurora relay --config
aurora.toml --region eu`` and ``aurora actor --config aurora.toml --region eu`` take the file's
values as their defaults; flags, and ``AURORA_*`` variables that are set, override them.

The library never imports a role: each role declares which tables fill which of its options, and
how it reads the common part (:class:`RoleSchema`, :func:`declare`), when it registers its
subcommand. The whole file is checked, whichever role reads it, so a typo is found by the first
role that starts, and by ``aurora config check`` before that. Errors name the file, the key and
what was expected, all at once; a bad file never starts a role.
"""

from aurora_store.config.check import RoleCheck, check, role_values
from aurora_store.config.flags import add_flag, confirm, defaults, requested
from aurora_store.config.load import from_doc, load, parse
from aurora_store.config.schema import (
    COMMON,
    ENV,
    FACTS,
    HOST,
    REGION_KEYS,
    Region,
    RoleSchema,
    RunFile,
    Table,
    declare,
    schemas,
)

__all__ = [
    "COMMON",
    "ENV",
    "FACTS",
    "HOST",
    "REGION_KEYS",
    "Region",
    "RoleCheck",
    "RoleSchema",
    "RunFile",
    "Table",
    "add_flag",
    "check",
    "confirm",
    "declare",
    "defaults",
    "from_doc",
    "load",
    "parse",
    "requested",
    "role_values",
    "schemas",
]
