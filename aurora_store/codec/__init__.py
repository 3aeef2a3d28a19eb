"""Byte codecs for delta blocks, looked up by the name a manifest block gives.

Codecs transform arrays to bytes and back and never see a store. A new codec is a module
with a :class:`~aurora_store.codec.base.Codec` added to :data:`REGISTRY` under a new name;
names are never reused, so runs written with older codecs stay readable.
"""

from __future__ import annotations

from aurora_store.codec import classed, dense, sparse
from aurora_store.codec.base import Codec

REGISTRY: dict[str, Codec] = {c.name: c for c in (sparse.CODEC, dense.CODEC, classed.CODEC)}


def get(name: object) -> Codec | None:
    """The codec registered as ``name``, or None (a manifest naming another is corrupt)."""
    return REGISTRY.get(name) if isinstance(name, str) else None


def names() -> list[str]:
    return sorted(REGISTRY)
