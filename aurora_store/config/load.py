"""Reading a config file: TOML in, a checked :class:`~aurora_store.config.schema.RunFile` out, or one
:class:`ConfigError` that lists every problem (the key, and what was expected)."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from typing import Any

from aurora_store.config.options import MAX_DEPTH, holds_private_key
from aurora_store.config.schema import (
    COMMON,
    MAX_FILE_BYTES,
    NAME,
    REGION_KEYS,
    ROLES,
    Region,
    RunFile,
    kind_of,
    near,
    table_values,
)
from aurora_store.errors import ConfigError
from aurora_store.localfile import read_regular
from aurora_store.redact import is_secret, redact


def load(path: str) -> RunFile:
    """Read and check ``path``: the common part and every declared role's tables. Raises one
    :class:`ConfigError` that lists every problem found."""
    try:
        raw = read_regular(path, MAX_FILE_BYTES + 1)  # a FIFO planted here is refused, never waited on
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: over {MAX_FILE_BYTES} bytes: not a config file")
    return parse(raw, path)


def parse(raw: bytes, path: str = "aurora.toml") -> RunFile:
    """:func:`load` for bytes already read (``path`` names them in errors)."""
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except ValueError:  # Python's own cap on reading an integer's digits (4300)
        raise ConfigError(f"{path}: not valid TOML: an integer too long to read") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    return from_doc(doc, path)


def from_doc(doc: dict[str, Any], path: str = "aurora.toml") -> RunFile:
    """:func:`parse` for a document already parsed (as :mod:`tomllib` gives it)."""
    errors: list[str] = []
    warnings: list[str] = []
    for where, value, depth in _nodes(doc):
        if depth > MAX_DEPTH:
            raise ConfigError(f"{path}: {where[:200]}: nested deeper than {MAX_DEPTH} tables or arrays")
        if isinstance(value, str) and holds_private_key(value) and where != "keys.signing":
            verify = where == "keys.verify"
            what = " where the run's public key belongs (aurora keygen writes it as NAME.pub)" if verify else ""
            errors.append(
                f"{where}: holds a private key's text{what}; a config file must never carry one: keep the key in "
                "a file of its own (mode 0600) and give its path, or its text in the environment"
            )
    f = _common(doc, path, errors, warnings)
    tables = {k: v for k, v in doc.items() if k not in COMMON}
    known = {t.name: t for s in ROLES.values() for t in s.tables}
    for name, value in tables.items():
        if name not in known:
            errors.append(
                f"{name}: unknown key{near(name, [*COMMON, *known])} "
                f"(the file's top level takes: {', '.join([*COMMON, *known])})"
            )
        elif not isinstance(value, dict):
            errors.append(f"{name}: expected a table ([{name}]), got {kind_of(value)}")
    for schema in ROLES.values():
        for table in schema.tables:
            if isinstance(tables.get(table.name, {}), dict):
                table_values(schema, table, tables.get(table.name, {}), table.name, errors)
    per_region = {t.name: (s, t) for s in ROLES.values() for t in s.tables if t.per_region}
    raw = doc.get("regions")
    for name, region in (raw if isinstance(raw, dict) else {}).items():
        for key, value in region.items() if isinstance(region, dict) else ():
            if key in REGION_KEYS or not isinstance(value, dict):
                continue
            if key not in per_region:
                errors.append(
                    f"regions.{name}.{key}: unknown key{near(key, [*REGION_KEYS, *per_region])} "
                    f"(a region takes: {', '.join([*REGION_KEYS, *per_region])})"
                )
            else:
                table_values(*per_region[key], value, f"regions.{name}.{key}", errors)
    if errors:
        raise ConfigError(f"{path}: " + ("\n  ".join(["", *errors]) if len(errors) > 1 else errors[0]))
    assert f is not None
    return dataclasses.replace(
        f, tables={k: v for k, v in tables.items() if isinstance(v, dict)}, warnings=tuple(warnings)
    )


def _common(doc: dict[str, Any], path: str, errors: list[str], warnings: list[str]) -> RunFile | None:
    run_id = _string(doc, "run_id", "the run's name in Redis", errors, required=True)
    if run_id is not None and not NAME.match(run_id):
        errors.append(f"run_id: expected a short name (letters, digits, '-', '_', '.'), got {run_id!r:.80}")
    home = _string(doc, "home", "the trainer's region, a key of [regions]", errors, required=True)
    redis = _string(doc, "redis", "a Redis URL", errors)
    if redis is not None:
        if not re.match(r"^(redis|rediss|unix|redis\+cluster|rediss\+cluster)://", redis):
            errors.append(
                "redis: expected a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL,"
                f" got {redact(redis)!r:.120}"
            )
        elif redact(redis) != redis:
            warnings.append("redis: the URL holds a password; keep it out of the file, in $AURORA_REDIS")
    keys = _table(doc, "keys", errors)
    signing = _string(keys, "signing", "the trainer's Ed25519 private key file", errors, where="keys.")
    verify = _string(keys, "verify", "the run's Ed25519 public key file", errors, where="keys.")
    for k in keys:
        if k not in ("signing", "verify"):
            errors.append(f"keys.{k}: unknown key{near(k, ['signing', 'verify'])} ([keys] takes: signing, verify)")
    if signing is not None and signing.lstrip().startswith("-----BEGIN"):
        errors.append(
            "keys.signing: expected a path to the key file; a private key's text belongs in $AURORA_SIGNING_KEY"
        )
    base = os.path.dirname(os.path.abspath(path))
    signing, verify = (_beside(base, k) for k in (signing, verify))
    raw_regions = _table(doc, "regions", errors)
    if "regions" not in doc:
        errors.append("regions: missing: expected a [regions.NAME] table per region, with its bucket's uri")
    elif isinstance(doc["regions"], dict) and not raw_regions:
        errors.append("regions: expected at least one [regions.NAME] table")
    regions: dict[str, Region] = {}
    for name, value in raw_regions.items():
        where = f"regions.{name}"
        if not NAME.match(name):
            errors.append(f"{where}: expected a region name (letters, digits, '-', '_', '.'), got {name!r:.80}")
            continue
        if not isinstance(value, dict):
            errors.append(f"{where}: expected a table ([{where}]) with a uri, got {kind_of(value)}")
            continue
        uri = _string(
            value, "uri", "the region's run URI (s3://, gs://, file://, ...)", errors, required=True, where=where + "."
        )
        if uri is not None and redact(uri) != uri:
            warnings.append(f"{where}.uri: the URI holds credentials; give them to fsspec through the environment")
        options = _table(value, "storage_options", errors, where=where + ".")
        for k in _secret_paths(options):
            warnings.append(f"{where}.storage_options.{k}: looks like a credential; keep it in the environment")
        source = _string(value, "source", "the region its relay copies from", errors, where=where + ".")
        tables = {k: v for k, v in value.items() if k not in REGION_KEYS}
        for k, v in tables.items():
            if not isinstance(v, dict):
                errors.append(f"{where}.{k}: expected a table, got {kind_of(v)}")
        if uri is not None:
            regions[name] = Region(
                name=name,
                uri=uri,
                storage_options=options,
                source=source,
                tables={k: v for k, v in tables.items() if isinstance(v, dict)},
            )
    if home is not None and raw_regions and home not in raw_regions:
        errors.append(
            f"home: {home!r} is not a key of [regions]{near(home, raw_regions)} "
            f"(the file has: {', '.join(raw_regions)})"
        )
    by_uri: dict[str, str] = {}
    for r in regions.values():
        other = by_uri.setdefault(r.uri.rstrip("/"), r.name)
        if other != r.name:
            errors.append(f"regions.{r.name}.uri: the same URI as regions.{other}: every region needs its own copy")
    if home in regions:
        regions = {n: dataclasses.replace(r, source=_source(r, home, raw_regions, errors)) for n, r in regions.items()}
    if errors or run_id is None or home is None:
        return None
    return RunFile(
        path=path,
        run_id=run_id,
        home=home,
        redis=redis,
        signing_key=signing,
        verify_key=verify,
        regions=regions,
        tables={},
    )


def _beside(base: str, key: str | None) -> str | None:
    """A key file's path, relative to the config file's directory; a public key's PEM text as is."""
    if key is None or os.path.isabs(key) or key.lstrip().startswith("-----BEGIN"):
        return key
    return os.path.join(base, key)


def _source(r: Region, home: str, regions: Mapping[str, Any], errors: list[str]) -> str | None:
    """The region a relay into ``r`` copies from, checked to lead back to home without a loop."""
    if r.name == home:
        if r.source is not None:
            errors.append(f"regions.{r.name}.source: the home region has no source (the trainer writes it)")
        return None
    chain = [r.name]
    at = r.source or home
    while at != home:
        if at not in regions:
            errors.append(f"regions.{chain[-1]}.source: {at!r} is not a key of [regions]{near(at, regions)}")
            return None
        if at in chain:
            errors.append(f"regions.{r.name}.source: the relays' chain {' -> '.join([*chain, at])} never reaches home")
            return None
        chain.append(at)
        nxt = regions[at].get("source") if isinstance(regions[at], dict) else None
        at = nxt if isinstance(nxt, str) else home
    return r.source or home


def _string(
    doc: Mapping[str, Any], key: str, what: str, errors: list[str], *, required: bool = False, where: str = ""
) -> str | None:
    if key not in doc:
        if required:
            errors.append(f"{where}{key}: missing: expected {what}")
        return None
    value = doc[key]
    if not isinstance(value, str) or not value.strip():
        errors.append(f"{where}{key}: expected {what} (a non-empty string), got {kind_of(value)}")
        return None
    return value


def _table(doc: Mapping[str, Any], key: str, errors: list[str], *, where: str = "") -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        errors.append(f"{where}{key}: expected a table, got {kind_of(value)}")
        return {}
    return value


def _nodes(doc: Mapping[str, Any]) -> Iterator[tuple[str, Any, int]]:
    """(dotted path, value, depth) of every value in ``doc``, tables and arrays walked without recursion."""
    todo: list[tuple[str, Any, int]] = [(str(k), v, 1) for k, v in doc.items()]
    while todo:
        where, value, depth = todo.pop()
        yield where, value, depth
        if depth > MAX_DEPTH:
            return
        if isinstance(value, dict):
            todo += [(f"{where}.{k}", v, depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            todo += [(f"{where}[{i}]", v, depth + 1) for i, v in enumerate(value)]


def _secret_paths(options: Mapping[str, Any]) -> list[str]:
    """The dotted paths in ``options`` whose keys name credentials (options are at most MAX_DEPTH deep)."""
    return [
        where for where, v, _ in _nodes(options) if not isinstance(v, dict) and is_secret(where.rsplit(".", 1)[-1], v)
    ]
