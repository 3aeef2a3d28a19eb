"""AuroraRL's artifact store: lossless, versioned full and sparse-delta checkpoints on any object store."""

from __future__ import annotations

from aurora_store.errors import (
    ChainError,
    ConflictError,
    CorruptError,
    LayoutError,
    LimitError,
    MissingError,
    StoreError,
    UnauthenticatedError,
    UnsupportedError,
)
from aurora_store.limits import Limits
from aurora_store.run import Run, RunConfig, VersionInfo, open_run

__all__ = [
    "ChainError",
    "ConflictError",
    "CorruptError",
    "LayoutError",
    "LimitError",
    "Limits",
    "MissingError",
    "Run",
    "RunConfig",
    "StoreError",
    "UnauthenticatedError",
    "UnsupportedError",
    "VersionInfo",
    "open_run",
]
