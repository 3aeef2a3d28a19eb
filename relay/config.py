"""The relay's options: the one source of ``aurora relay``'s flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from aurora_store.config import RoleSchema, Table
from aurora_store.config.options import PORT, SECONDS, Range, option
from aurora_store.metrics_http import ADDR_ENV, LOOPBACK


@dataclass(kw_only=True, slots=True)
class RelayConfig:
    """Everything ``aurora relay`` needs."""

    source: str = field(metadata=option(file="source.uri"))
    """The source region's run URI (home, or an upstream relay's)."""
    dest: str = field(metadata=option(file="region.uri"))
    """This region's run URI."""
    redis: str | None = field(default=None, metadata=option(env="AURORA_REDIS", file="redis"))
    """Redis URL (one server, or a cluster's ``redis+cluster://host:port,...``); a relay without one can only --once."""
    run_id: str | None = field(default=None, metadata=option(file="run_id"))
    """The run's name in Redis (default: the last part of --source)."""
    source_region: str = field(default="home", metadata=option(file="source.name"))
    """The source's region name in Redis."""
    dest_region: str = field(metadata=option(aliases=("--region",), file="region.name"))
    """This region's name in Redis (with --config, the file's region to relay into)."""
    once: bool = False
    """Copy every committed version the destination lacks, then exit."""
    verify_key: str | None = field(
        default=None, metadata=option(metavar="KEY", env="AURORA_VERIFY_KEY", file="verify_key")
    )
    """The run's Ed25519 public key (a PEM file, or PEM text in the environment): refuse versions it
    did not sign. A signed run cannot be relayed without it."""
    source_options: dict[str, Any] = field(
        default_factory=dict,
        metadata=option(metavar="JSON", env="AURORA_SOURCE_OPTIONS", file="source.storage_options"),
    )
    """fsspec storage options of the source bucket, as a JSON object."""
    dest_options: dict[str, Any] = field(
        default_factory=dict, metadata=option(metavar="JSON", env="AURORA_DEST_OPTIONS", file="region.storage_options")
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


CONFIG_FILE = RoleSchema(
    command="relay",
    cls=RelayConfig,
    tables=(Table("relay", ("",)),),
    regions="not_home",
)
"""How ``aurora relay --config aurora.toml --region R`` reads the file: ``[relay]`` holds its options
(concurrency, rescan_s, ...); region R's ``source`` (home by default) is what it copies from."""
