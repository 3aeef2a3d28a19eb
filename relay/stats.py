"""What a relay did, counted: objects and bytes copied, versions committed, what it refused.

Its own module so that :mod:`relay.worker` (which fills it) and :mod:`relay.metrics` (which
exports it) both import it, and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RelayStats:
    copied: int = 0
    """Objects copied source -> destination (the cross-region transfers)."""
    skipped: int = 0
    """Objects found already at the destination and verified there."""
    bytes: int = 0
    """Bytes copied across regions."""
    versions: int = 0
    """Versions this relay committed at the destination (a count: a relay runs for ever)."""
    rejected: dict[str, int] = field(default_factory=dict)
    """What this relay refused (bad announcements, versions that fail their checks), by error kind."""
