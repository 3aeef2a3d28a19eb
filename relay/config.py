"""The relay's options: the one source of ``aurora relay``'s flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from aurora_store.config import Region, RoleSchema, RunFile, Table
from aurora_store.metrics_http import ADDR_ENV, LOOPBACK
from aurora_store.options import PORT, SECONDS, Range, option


@dataclass(kw_only=True, slots=True)
class RelayConfig:
    """Everything ``aurora relay`` needs."""

    source: str
    """The source region's run URI (home, or an upstream relay's)."""
    dest: str
    """This region's run URI."""
    redis: str | None = field(default=None, metadata=option(env="AURORA_REDIS"))
    """Redis URL; a relay without one can only --once."""
    run_id: str | None = None
    """The run's name in Redis (default: the last part of --source)."""
    source_region: str = "home"
    """The source's region name in Redis."""
    dest_region: str = field(metadata=option(aliases=("--region",)))
    """This region's name in Redis (with --config, the file's region to relay into)."""
    once: bool = False
    """Copy every committed version the destination lacks, then exit."""
    verify_key: str | None = field(default=None, metadata=option(metavar="KEY", env="AURORA_VERIFY_KEY"))
    """The run's Ed25519 public key (a PEM file, or PEM text in the environment): refuse versions it
    did not sign. A signed run cannot be relayed without it."""
    source_options: dict[str, Any] = field(
        default_factory=dict, metadata=option(metavar="JSON", env="AURORA_SOURCE_OPTIONS")
    )
    """fsspec storage options of the source bucket, as a JSON object."""
    dest_options: dict[str, Any] = field(
        default_factory=dict, metadata=option(metavar="JSON", env="AURORA_DEST_OPTIONS")
    )
    """fsspec storage options of the destination bucket, as a JSON object."""
    concurrency: Annotated[int, Range(ge=1, le=256)] = 8
    """Parallel object copies (1 to 256)."""
    rescan_s: Annotated[float, SECONDS] = 30.0
    """Also scan the buckets this often, in seconds (announcements are hints; the buckets are the truth)."""
    metrics_port: Annotated[int | None, PORT] = None
    """Serve Prometheus metrics over HTTP on this port (/metrics; 0 or unset: off), on --metrics-addr."""
    metrics_addr: str = field(default=LOOPBACK, metadata=option(metavar="ADDR", env=ADDR_ENV))
    """The address --metrics-port binds: this host only by default; 0.0.0.0 (or one interface's address)
    for a Prometheus on another host, behind a firewall that lets only it in."""


def _from_file(f: RunFile, region: Region | None) -> dict[str, Any]:
    """A relay's options from a config file's common part: its region's bucket, its source's, Redis, the key."""
    assert region is not None and region.source is not None  # a relay runs in every region but home
    source = f.regions[region.source]
    out: dict[str, Any] = {
        "source": source.uri,
        "source_options": source.storage_options,
        "source_region": source.name,
        "dest": region.uri,
        "dest_options": region.storage_options,
        "dest_region": region.name,
        "run_id": f.run_id,
    }
    if f.redis is not None:
        out["redis"] = f.redis
    if f.verify_key is not None:
        out["verify_key"] = f.verify_key
    return out


CONFIG_FILE = RoleSchema(
    command="relay",
    cls=RelayConfig,
    tables=(Table("relay", ("",)),),
    derive=_from_file,
    derived=frozenset(
        {
            "source",
            "source_options",
            "source_region",
            "dest",
            "dest_options",
            "dest_region",
            "run_id",
            "redis",
            "verify_key",
        }
    ),
    regions="not_home",
)
"""How ``aurora relay --config aurora.toml --region R`` reads the file: ``[relay]`` holds its options
(concurrency, rescan_s, ...); region R's ``source`` (home by default) is what it copies from."""
