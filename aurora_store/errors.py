"""The store's one error family.

Every failure a caller can act on is a :class:`StoreError`; each message names the
object involved and what was expected. Backend exceptions are translated into this
family in exactly one place (:mod:`aurora_store.objectstore`).
"""

from __future__ import annotations


class StoreError(ValueError):
    """Base of every error raised by aurora_store."""


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


class ConflictError(StoreError):
    """A write lost a race: the object or version already exists with other content."""


class LayoutError(StoreError):
    """Tensor names, shapes or dtypes changed within a chain without a full version."""


class UnsupportedError(StoreError):
    """A dtype, backend or option this store cannot handle."""
