"""Caps a reader enforces on untrusted objects, and I/O sizing."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    max_manifest_bytes: int = 16 << 20
    """A manifest larger than this is refused before it is parsed (parsing JSON takes ~17x its size
    in memory; a 70B model's delta manifest is ~1-2 MiB)."""
    cached_manifests: int = 256
    """Verified manifests a reader keeps (least recently used dropped first)."""
    max_segment_bytes: int = 4 << 30
    """A segment or shard the manifest says is larger than this is refused before it is fetched."""
    part_bytes: int = 8 << 20
    """Ranged-GET size: objects larger than this are fetched in parallel parts."""
    max_block_decoded_bytes: int = 1 << 30
    """A delta block whose streams would expand past this is refused before decompression."""
