"""AuroraRL's library: lossless, versioned full and sparse-delta checkpoints on any object
store, and the coordination and RL vocabulary the roles share.

Layers import downward only (docs/ARCHITECTURE.md; ``tests/test_architecture.py`` holds the
order): ``codec``, then ``format`` (bytes, JSON, numpy), then ``tensors`` and ``device`` (torch),
then, side by side, ``bucket`` (object-store I/O, runs), ``coord`` (Redis) and ``rl`` (tasks,
models, tokenizers). The names below load their module on first use (``RunConfig`` from
``bucket.run_config``, where it is defined), so ``import aurora_store`` (or
``aurora_store.coord``) pulls in nothing heavy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from aurora_store.errors import (
    AuroraError,
    ChainError,
    ConflictError,
    CorruptError,
    LayoutError,
    LimitError,
    MissingError,
    StoreError,
    UnauthenticatedError,
    UnreachableError,
    UnsupportedError,
)

if TYPE_CHECKING:
    from aurora_store.bucket.limits import Limits
    from aurora_store.bucket.plan import VersionInfo
    from aurora_store.bucket.run import Run, open_run
    from aurora_store.bucket.run_config import RunConfig

_LAZY = {
    "Limits": "aurora_store.bucket.limits",
    "Run": "aurora_store.bucket.run",
    "RunConfig": "aurora_store.bucket.run_config",
    "VersionInfo": "aurora_store.bucket.plan",
    "open_run": "aurora_store.bucket.run",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'aurora_store' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AuroraError",
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
    "UnreachableError",
    "UnsupportedError",
    "VersionInfo",
    "open_run",
]
