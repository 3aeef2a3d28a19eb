"""The relay's options: the one source of ``aurora relay``'s flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aurora_store.options import option


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
    dest_region: str
    """This region's name in Redis."""
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
    concurrency: int = 8
    """Parallel object copies."""
    rescan_s: float = 30.0
    """Also scan the buckets this often, in seconds (announcements are hints; the buckets are the truth)."""
