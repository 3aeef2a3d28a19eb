"""How a run is written and read: the settings of :class:`~aurora_store.bucket.run.Run`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from aurora_store.bucket.limits import Limits
from aurora_store.errors import StoreError

CODECS = ("classed", "sparse")
"""What a writer may code float deltas with (:attr:`RunConfig.codec`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    full_every: int = 50
    """Every version that is a multiple of this is published full (version 0 always is)."""
    segment_bytes: int = 4 << 20
    """Target size of a delta segment: readers fetch and verify segments in parallel."""
    shard_bytes: int = 256 << 20
    """Target size of a full version's safetensors shard."""
    concurrency: int = 8
    """Parallel ranged GETs / uploads."""
    extract: str = "auto"
    """Where a delta of tensors is extracted: ``device`` (torch ops where the tensors live; only the
    changes reach the host), ``host`` (a copy of every tensor on the host, then the compiled host
    passes) or ``auto`` (device for tensors on an accelerator, host for CPU tensors, where the host
    passes are the faster)."""
    codec: str = "classed"
    """How float deltas are coded: ``classed`` (positions by the parent's exponent class, the
    sparse codec where smaller: format aurora/3) or ``sparse`` (the sparse codec only, so every
    version stays aurora/2 for readers that predate aurora/3: a rolling upgrade)."""
    limits: Limits = field(default_factory=Limits)
    """Caps on what readers accept from the bucket."""

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise StoreError(f"codec must be one of {CODECS}, got {self.codec!r}")
        if self.extract not in ("auto", "host", "device"):
            raise StoreError(f"extract must be 'auto', 'host' or 'device', got {self.extract!r}")

    def extract_on_device(self, device_types: Iterable[str]) -> bool:
        """Whether a publisher whose tensors live on ``device_types`` (torch's ``device.type`` names)
        extracts its deltas there: the one rule of ``extract``, for single-process and sharded
        publishers alike (``meta`` tensors, which hold no data, count for neither)."""
        if self.extract != "auto":
            return self.extract == "device"
        return any(t not in ("cpu", "meta") for t in device_types)
