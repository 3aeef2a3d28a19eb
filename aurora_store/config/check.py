"""What a role reads from a config file, and ``aurora config check``: every role's options built, for
every region it runs in."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from aurora_store.config.load import load
from aurora_store.config.options import build, leaves, option_env
from aurora_store.config.schema import ROLES, Region, RoleSchema, RunFile, table_values
from aurora_store.errors import ConfigError
from aurora_store.redact import redact_value


def role_values(schema: RoleSchema, f: RunFile, region: Region | None) -> dict[str, Any]:
    """Every option the file gives role ``schema`` in ``region``, by dest."""
    errors: list[str] = []
    out = schema.derive(f, region)
    for table in schema.tables:
        out.update(table_values(schema, table, f.tables.get(table.name, {}), table.name, errors))
        if table.per_region and region is not None and table.name in region.tables:
            where = f"regions.{region.name}.{table.name}"
            out.update(table_values(schema, table, region.tables[table.name], where, errors))
    if errors:  # load() checked them all; a file changed in between
        raise ConfigError(f"{f.path}: " + "; ".join(errors))
    return out


@dataclass(frozen=True, slots=True)
class RoleCheck:
    """One role in one region, as the file sets it up."""

    command: str
    region: str | None
    options: dict[str, Any]
    """Every option, by dest: the file's values over the defaults (secrets redacted)."""
    from_env: dict[str, str]
    """Required options the file leaves to the environment (or a flag): dest -> variable."""


def check(path: str) -> tuple[RunFile, list[RoleCheck]]:
    """What ``aurora config check`` does: load the file, then build every role's options dataclass
    for every region it runs in (a role's required options the file leaves out must have an
    environment variable)."""
    f = load(path)
    out = []
    errors = []
    for schema in ROLES.values():
        for region in schema.runs_in(f):
            given = role_values(schema, f, region)
            values: dict[str, Any] = {}
            from_env: dict[str, str] = {}
            for _, dest, fld, _, _ in leaves(schema.cls):
                if dest in given:
                    values[dest] = given[dest]
                elif fld.default is not dataclasses.MISSING:
                    values[dest] = fld.default
                elif fld.default_factory is not dataclasses.MISSING:
                    values[dest] = fld.default_factory()
                elif (env := option_env(fld)) is not None:
                    from_env[dest] = env
                    values[dest] = None
                else:
                    where = f" --region {region.name}" if region is not None and schema.regions != "home" else ""
                    errors.append(
                        f"aurora {schema.command}{where}: option {dest} is neither in the file nor has a default"
                    )
            errors += [f"aurora {schema.command}: {e}" for e in _missing_files(given)]
            build(schema.cls, values)  # the role's own dataclass takes them
            shown = {k: redact_value(v) for k, v in values.items() if k not in from_env}
            out.append(RoleCheck(schema.command, region.name if region is not None else None, shown, from_env))
    if errors:
        raise ConfigError(f"{path}: " + "; ".join(dict.fromkeys(errors)))
    return f, out


FILE_OPTIONS = frozenset(
    {"signing_key", "rotate_signing_key", "verify_key", "fleet_key", "revoked_actors", "identity_key", "identity_cert"}
)
"""Options that name a file (a key, a certificate, the revocation list), or hold PEM or JSON text itself."""


def _missing_files(given: dict[str, Any]) -> list[str]:
    """The file options in ``given`` that name no regular file (relative to this directory, as a role
    started here reads them); PEM text or a certificate's JSON in the value itself is not a path."""
    out = []
    for dest, value in given.items():
        if dest.rsplit(".", 1)[-1] not in FILE_OPTIONS or not isinstance(value, str):
            continue
        if "-----BEGIN" in value or value.lstrip().startswith("{"):
            continue
        if not os.path.isfile(value):
            why = "is not a regular file" if os.path.exists(value) else "does not exist"
            where = "" if os.path.isabs(value) else f" (in {os.getcwd()}, where a role started here looks)"
            out.append(f"option {dest}: {value} {why}{where}")
    return out
