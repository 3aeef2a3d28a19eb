"""The root of every error AuroraRL raises, and the store's family under it.

Each concern has one family, all under :class:`AuroraError` (what a command line catches):
:class:`StoreError` for artifacts and buckets (here; :class:`RetentionError` for ``aurora gc``),
``CoordinationError`` for Redis (:mod:`aurora_store.coord.errors`), ``RLError`` for tasks, models,
data sets and run specs (:mod:`aurora_store.rl.errors`), ``MetricsError`` for serving metrics
(:mod:`aurora_store.metrics`), :class:`ConfigError` for config files and :class:`PayloadError`
for rollout-result payloads (both here). Each message names the object involved and what was expected; an
error about one object also carries its URL in :attr:`StoreError.url`. Backend exceptions
are translated into this family by :func:`aurora_store.storage.base.translated` alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class AuroraError(Exception):
    """Base of every error raised by AuroraRL's library code."""


class StoreError(AuroraError, ValueError):
    """An artifact or bucket problem; ``url`` names the object when there is one."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        """The object (its full URL) the error is about, for reports and audits; None if none."""


@contextmanager
def about(url: str) -> Iterator[None]:
    """Errors raised while handling the object at ``url`` name it in :attr:`StoreError.url`."""
    try:
        yield
    except StoreError as exc:
        if exc.url is None:
            exc.url = url
        raise


class CorruptError(StoreError):
    """An object's bytes do not match what the manifest (or the format) promises."""


class LimitError(CorruptError):
    """An object or a decoded stream exceeds a configured cap (size, count, bomb)."""


class ChainError(CorruptError):
    """Versions do not form a valid chain: a gap, a wrong parent or a wrong digest."""


class MissingError(StoreError, FileNotFoundError):
    """An object or version that should exist does not."""


class UnauthenticatedError(StoreError):
    """A manifest is unsigned, signed by another key, or its signature is wrong."""


class KeyHistoryError(UnauthenticatedError):
    """A signed run's key history cannot be read past a key rotation: that rotation version's manifest
    is damaged, forged, replayed or missing, so no version signed after it can be verified from this
    bucket until the manifest is repaired (:attr:`url` names it)."""


DAMAGE = (CorruptError, MissingError, UnauthenticatedError)
"""What an object or manifest that failed verification raises (damaged, missing, forged or replayed):
someone else's doing, never built on, and not cured by retrying the read (unlike a plain StoreError)."""


class UnreachableError(StoreError):
    """The bucket's endpoint did not answer: the connection was refused, reset or timed out, or the
    endpoint could not be resolved. Unlike bad credentials or a missing bucket, waiting may cure it."""


class ConflictError(StoreError):
    """A write lost a race: the object or version already exists with other content."""


class LayoutError(StoreError):
    """Tensor names, shapes or dtypes changed within a chain without a full version."""


class UnsupportedError(StoreError):
    """A dtype, backend or option this store cannot handle."""


class ConfigError(AuroraError, ValueError):
    """A run's config file (``aurora.toml``) is unreadable or says something no role can use; the
    message names the file, the key and what was expected."""


class RetentionError(StoreError):
    """``aurora gc`` refused to delete: it cannot tell what is safe to (unreadable manifests or Redis
    entries, no Redis to ask what live actors hold)."""


class PayloadError(AuroraError, ValueError):
    """A rollout result's payload is malformed; ``reason`` is a short identifier the trainer counts
    drops by (``bad_payload``, ``payload_too_large``, ``wrong_size``, ...), ``detail`` says what."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
