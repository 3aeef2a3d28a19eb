"""The relay's Prometheus metrics: its region's version and lag, copy time per version, objects.

Labelled with the destination ``region``. Bytes each way are the common
``aurora_bucket_bytes_total`` (``bucket="source"``: read from the source region, what crosses the
WAN; ``bucket="dest"``: written to this region and read back to verify). No torch.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from aurora_store.metrics import Metrics, Spec

if TYPE_CHECKING:
    from aurora_store.coord.coordinator import Coordinator
    from relay.stats import RelayStats

REGION_VERSION = Spec(
    "aurora_relay_region_version",
    "gauge",
    "The latest version committed in the relay's region (its destination), as this relay committed or found it.",
    ("region",),
)
SOURCE_VERSION = Spec(
    "aurora_relay_source_version",
    "gauge",
    "The latest version the relay has seen committed at its source (announced or listed).",
    ("region",),
)
VERSION_LAG = Spec(
    "aurora_relay_version_lag",
    "gauge",
    "Versions the relay's region is behind its source (source version minus region version, at least 0).",
    ("region",),
)
COPY_SECONDS = Spec(
    "aurora_relay_copy_seconds",
    "histogram",
    "Per version this relay committed: from its first segment announced (or, unannounced, the start of its "
    "copy) until its manifest is committed at the destination.",
    ("region",),
)
OBJECTS_COPIED = Spec(
    "aurora_relay_objects_copied_total", "counter", "Objects copied source to destination.", ("region",)
)
OBJECTS_SKIPPED = Spec(
    "aurora_relay_objects_skipped_total",
    "counter",
    "Objects found already at the destination, verified there and not copied again.",
    ("region",),
)
COPIED_BYTES = Spec(
    "aurora_relay_copied_bytes_total",
    "counter",
    "Payload bytes of the objects copied across regions (manifests and read-backs not included).",
    ("region",),
)
VERSIONS_COMMITTED = Spec(
    "aurora_relay_versions_committed_total",
    "counter",
    "Versions this relay committed at the destination.",
    ("region",),
)
SPECS = (
    REGION_VERSION,
    SOURCE_VERSION,
    VERSION_LAG,
    COPY_SECONDS,
    OBJECTS_COPIED,
    OBJECTS_SKIPPED,
    COPIED_BYTES,
    VERSIONS_COMMITTED,
)

_TRACKED = 1024
"""Versions whose first announcement is remembered at most (the oldest go first)."""


class RelayMetrics:
    """One relay's metrics; :class:`~relay.worker.Relay` feeds them once per version or object."""

    def __init__(self, region: str) -> None:
        self.region = region
        self.m = Metrics("relay", region, SPECS)
        self._region_v = self._source_v = -1
        self._first: dict[int, float] = {}
        self._lock = threading.Lock()
        self._region = self.m.gauge(REGION_VERSION).labels(region)
        self._source = self.m.gauge(SOURCE_VERSION).labels(region)
        self._copy = self.m.histogram(COPY_SECONDS).labels(region)
        self.m.pull(VERSION_LAG, self._lag, region)

    def _lag(self) -> float:
        if self._region_v < 0 or self._source_v < 0:
            return 0.0
        return float(max(0, self._source_v - self._region_v))

    def watch(self, stats: RelayStats, coord: Coordinator | None) -> None:
        """Export the relay's own counts (read at scrape time) and the coordinator's skipped Redis entries."""
        self.m.pull(OBJECTS_COPIED, lambda: stats.copied, self.region)
        self.m.pull(OBJECTS_SKIPPED, lambda: stats.skipped, self.region)
        self.m.pull(COPIED_BYTES, lambda: stats.bytes, self.region)
        self.m.pull(VERSIONS_COMMITTED, lambda: stats.versions, self.region)
        if coord is not None:
            self.m.redis_skipped(coord.skipped.snapshot)

    def region_at(self, version: int) -> None:
        """The destination holds ``version`` (committed by this relay or found there)."""
        with self._lock:
            if version > self._region_v:
                self._region_v = version
                self._region.set(version)

    def source_at(self, version: int) -> None:
        """The source has committed ``version``."""
        with self._lock:
            if version > self._source_v:
                self._source_v = version
                self._source.set(version)

    def first_seen(self, version: int) -> None:
        """The relay first heard of ``version`` (a segment announced, or its copy starting)."""
        with self._lock:
            if version not in self._first and version > self._region_v:
                self._first[version] = time.monotonic()
                while len(self._first) > _TRACKED:
                    del self._first[min(self._first)]

    def committed(self, version: int) -> None:
        """This relay wrote ``version``'s manifest at the destination: its copy time is observed."""
        with self._lock:
            t0 = self._first.pop(version, None)
            for v in [v for v in self._first if v < version]:  # never committed by this relay: forgotten
                del self._first[v]
        if t0 is not None:
            self._copy.observe(time.monotonic() - t0)
        self.region_at(version)
