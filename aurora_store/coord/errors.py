"""The coordination layer's error family: Redis unreachable or refusing, and malformed jobs."""

from __future__ import annotations

from aurora_store.errors import AuroraError


class CoordinationError(AuroraError):
    """Redis is unreachable or answered with an error."""


class JobError(CoordinationError, ValueError):
    """A job, lease or result is malformed."""
