"""The actor's Prometheus metrics: the version it holds and its lag, staging, apply and the
generation pause at a safe point, its throughput EMA, what it generated.

Labelled with ``region`` and ``actor`` (one actor per process: a handful of series each). Bytes
fetched are the common ``aurora_bucket_bytes_total`` (``bucket="region"``, and ``"fallback"`` when
the region's copy was bad); objects it refused, ``aurora_artifacts_rejected_total``. No torch.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from aurora_store.metrics import Metrics, Spec

if TYPE_CHECKING:
    from aurora_store.coord.coordinator import Coordinator

_LABELS = ("region", "actor")
APPLIED_VERSION = Spec("aurora_actor_version", "gauge", "The version this actor holds (generates with).", _LABELS)
VERSION_LAG = Spec(
    "aurora_actor_version_lag",
    "gauge",
    "Its region's committed version minus the version it holds (as last seen from Redis or the bucket).",
    _LABELS,
)
STAGE_SECONDS = Spec(
    "aurora_actor_stage_seconds",
    "histogram",
    "Time to stage versions (fetch with ranged GETs, verify, decode) while generation goes on.",
    _LABELS,
)
APPLY_SECONDS = Spec(
    "aurora_actor_apply_seconds",
    "histogram",
    "Time to apply a staged version at a safe point: the in-place write of the live weights.",
    _LABELS,
)
PAUSE_SECONDS = Spec(
    "aurora_actor_generation_pause_seconds",
    "histogram",
    "How long generation paused at a safe point for a version switch: the apply, and before it, when a "
    "job needed a version not applied yet, waiting for it to reach the region and staging it.",
    _LABELS,
)
THROUGHPUT = Spec(
    "aurora_actor_throughput_ema_tokens_per_second",
    "gauge",
    "The throughput EMA (tokens/s) this actor last wrote to Redis: what the trainer splits jobs by.",
    _LABELS,
)
SKIPPED = Spec(
    "aurora_actor_versions_skipped_total",
    "counter",
    "Versions this actor never applied because it went from an older one straight to a newer (staging the "
    "latest its region held, or a full version on its route).",
    _LABELS,
)
JOINED = Spec(
    "aurora_actor_joined",
    "gauge",
    "1 while this actor is registered with its run and its Redis serves it; 0 before it joins and while Redis "
    'turns it away or fails: sum(aurora_role_info{role="actor"}) - sum(aurora_actor_joined) counts the actors '
    "that could not join (they cannot say so in the Redis that refuses them).",
    _LABELS,
)
REDIS_FAILURES = Spec(
    "aurora_actor_redis_failures_total",
    "counter",
    "Tries at Redis that failed, by reason: maxclients, connection_refused, clusterdown, moved, tryagain, "
    "loading, other.",
    (*_LABELS, "reason"),
)
RESULTS = Spec("aurora_actor_results_submitted_total", "counter", "Results (one per job) submitted.", _LABELS)
TOKENS = Spec("aurora_actor_generated_tokens_total", "counter", "Completion tokens generated for jobs.", _LABELS)
SPECS = (
    APPLIED_VERSION,
    VERSION_LAG,
    SKIPPED,
    JOINED,
    REDIS_FAILURES,
    STAGE_SECONDS,
    APPLY_SECONDS,
    PAUSE_SECONDS,
    THROUGHPUT,
    RESULTS,
    TOKENS,
)


class ActorMetrics:
    """One actor's metrics; the worker loop feeds them once per version switch or batch."""

    def __init__(self, region: str, actor: str) -> None:
        self.m = Metrics("actor", region, SPECS)
        labels = (region, actor)
        self._labels = labels
        self._applied = self._region = -1
        self._lock = threading.Lock()
        self._stage = self.m.histogram(STAGE_SECONDS).labels(*labels)
        self._apply = self.m.histogram(APPLY_SECONDS).labels(*labels)
        self._pause = self.m.histogram(PAUSE_SECONDS).labels(*labels)
        self._tau = self.m.gauge(THROUGHPUT).labels(*labels)
        self._results = self.m.counter(RESULTS).labels(*labels)
        self._tokens = self.m.counter(TOKENS).labels(*labels)
        self._skipped = self.m.counter(SKIPPED).labels(*labels)
        self._joined = self.m.gauge(JOINED).labels(*labels)
        self._joined.set(0)
        self._redis_failures = self.m.counter(REDIS_FAILURES)
        self.skipped = 0
        """Versions skipped since the actor started (:data:`SKIPPED`)."""
        self.m.pull(APPLIED_VERSION, self._read_applied, *labels)
        self.m.pull(VERSION_LAG, self._read_lag, *labels)

    def _read_applied(self) -> dict[tuple[str, ...], float]:
        return {(): float(self._applied)} if self._applied >= 0 else {}  # nothing applied yet: no series

    def _read_lag(self) -> dict[tuple[str, ...], float]:
        if self._applied < 0:
            return {}
        return {(): float(max(0, self._region - self._applied))}  # an actor applies only what its region holds

    def watch_redis(self, coord: Coordinator) -> None:
        self.m.redis_skipped(coord.skipped.snapshot)

    def applied(self, version: int) -> int:
        """The actor now holds ``version`` (bootstrapped or applied); the versions it skipped to get there
        (none at its first, or when it went back to an older one)."""
        with self._lock:
            skipped = max(version - self._applied - 1, 0) if self._applied >= 0 else 0
            self.skipped += skipped
            self._skipped.inc(skipped)
            self._applied = version
            self._region = max(self._region, version)
        return skipped

    def joined(self, now: bool) -> None:
        """Whether the actor is registered with its run and its Redis serves it (:data:`JOINED`)."""
        self._joined.set(1 if now else 0)

    def redis_failed(self, why: str) -> None:
        """A try at Redis failed, for ``why`` (:func:`aurora_store.coord.backoff.reason`)."""
        self._redis_failures.labels(*self._labels, why).inc()

    def region_at(self, version: int | None) -> None:
        """The region's committed version, as the actor just read it."""
        if version is not None:
            with self._lock:
                self._region = version

    def staged(self, seconds: float) -> None:
        self._stage.observe(seconds)

    def switched(self, *, apply_s: float, pause_s: float) -> None:
        """A version was applied in ``apply_s``; generation waited ``pause_s`` for it (at least the apply)."""
        self._apply.observe(apply_s)
        self._pause.observe(max(pause_s, apply_s))

    def batch(self, *, results: int, tokens: int, tau: float) -> None:
        """A batch was submitted; ``tau`` is the EMA it left in Redis."""
        self._results.inc(results)
        self._tokens.inc(tokens)
        self._tau.set(tau)

    def calibrated(self, tau: float) -> None:
        self._tau.set(tau)
