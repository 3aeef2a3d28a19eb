"""Prometheus metrics: a registry per process, served over HTTP, and the metrics every role shares.

Each role declares its metrics as :class:`Spec` rows in its own package (``trainer/metrics.py``,
``relay/metrics.py``, ``actor/metrics.py``) and builds them on a :class:`Metrics` of its own: a
registry per process, not prometheus_client's global one, so two roles (or two tests) in one
process never collide. Counts a role keeps anyway (Redis entries skipped, results dropped) are
read when Prometheus scrapes (:meth:`Metrics.pull`), so the hot paths pay nothing for them; the
rest are counters, gauges and histograms touched once per object, version, batch or result.

``--metrics-port PORT`` serves ``/metrics`` on ``127.0.0.1:PORT``: only this host can scrape it
until ``--metrics-addr`` (or ``$AURORA_METRICS_ADDR``) binds another address (``0.0.0.0`` for a
Prometheus on another host). One thread serves every connection, a bounded number of them, each
timed out (:mod:`aurora_store.metrics_http`); a port in use is a clear error at start.
A metrics failure never stops a role: a reader that raises at scrape time drops its family from
that scrape and is logged, nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from aurora_store.errors import (
    AuroraError,
    ChainError,
    ConflictError,
    CorruptError,
    LayoutError,
    LimitError,
    MissingError,
    UnauthenticatedError,
)
from aurora_store.metrics_http import LOOPBACK, MetricsServer

log = logging.getLogger("aurora.metrics")

Kind = Literal["counter", "gauge", "histogram"]
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Histogram buckets for durations, from a local apply (milliseconds) to a full checkpoint over a WAN."""


class MetricsError(AuroraError):
    """Metrics cannot be served as asked (the port is taken, the address is not this host's)."""


@dataclass(frozen=True, slots=True)
class Spec:
    """One metric as Prometheus sees it: full name (``_total`` on counters), type, help, label names."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()

    @property
    def series(self) -> tuple[str, ...]:
        """The names of the series it exports (what PromQL names)."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_count", f"{self.name}_sum")
        return (self.name,)


ROLE_INFO = Spec(
    "aurora_role_info", "gauge", "1 for every running role process, by role and region.", ("role", "region")
)
BUCKET_BYTES = Spec(
    "aurora_bucket_bytes_total",
    "counter",
    "Bytes this process moved to (upload) or from (download) an object-store bucket: every write, ranged GET "
    "and read-back, as the store's I/O layer did it. bucket: home (trainer), source or dest (relay), region or "
    "fallback (actor).",
    ("role", "region", "direction", "bucket"),
)
ARTIFACTS_REJECTED = Spec(
    "aurora_artifacts_rejected_total",
    "counter",
    "Objects and manifests this process refused, by reason: corrupt (hash or size mismatch, unparsable), "
    "over_limit, bad_chain (wrong parent, digest or run), missing, unauthenticated (bad or missing signature), "
    "layout_changed, conflict, other.",
    ("role", "region", "reason"),
)
REDIS_SKIPPED = Spec(
    "aurora_redis_entries_skipped_total",
    "counter",
    "Entries read from Redis that failed their checks and were skipped, by reason.",
    ("role", "region", "reason"),
)
COMMON = (ROLE_INFO, BUCKET_BYTES, ARTIFACTS_REJECTED, REDIS_SKIPPED)
"""What every role exports (with its ``role`` and ``region`` labels)."""

_REASONS: tuple[tuple[type[Exception], str], ...] = (  # most specific first
    (LimitError, "over_limit"),
    (ChainError, "bad_chain"),
    (CorruptError, "corrupt"),
    (MissingError, "missing"),
    (UnauthenticatedError, "unauthenticated"),
    (LayoutError, "layout_changed"),
    (ConflictError, "conflict"),
)


def reason_of(exc: BaseException) -> str:
    """The ``reason`` label of a refusal: a short name for the store error's kind."""
    return next((reason for cls, reason in _REASONS if isinstance(exc, cls)), "other")


Reading = float | Mapping[str, float] | Mapping[tuple[str, ...], float]
"""What a pulled metric's reader returns: one value, or values by label value(s)."""


class _Pulled:
    """A family read at scrape time from counts kept elsewhere; a reader that fails skips one scrape."""

    def __init__(self, spec: Spec, fixed: tuple[str, ...], read: Callable[[], Reading]) -> None:
        self.spec, self.fixed, self.read = spec, fixed, read

    def _family(self) -> CounterMetricFamily | GaugeMetricFamily:
        family = CounterMetricFamily if self.spec.kind == "counter" else GaugeMetricFamily
        return family(self.spec.name, self.spec.help, labels=list(self.spec.labels))

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        try:
            values = self.read()
            fam = self._family()
            if isinstance(values, Mapping):
                for key, value in values.items():
                    fam.add_metric([*self.fixed, *((key,) if isinstance(key, str) else key)], float(value))
            else:
                fam.add_metric(list(self.fixed), float(values))
        except Exception as exc:  # a scrape must never take a role down, nor fail for one family
            log.warning("metric %s not read this scrape: %s: %s", self.spec.name, type(exc).__name__, exc)
            return
        yield fam


class Metrics:
    """One process's registry: the common metrics (labelled with ``role`` and ``region``) and the
    role's own, each built once from its :class:`Spec`."""

    def __init__(self, role: str, region: str, specs: Iterable[Spec] = ()) -> None:
        self.role, self.region = role, region
        self.registry = CollectorRegistry()
        self.specs = {s.name: s for s in (*COMMON, *specs)}
        self._made: dict[str, Any] = {}
        self.server: MetricsServer | None = None
        self.gauge(ROLE_INFO).labels(role, region).set(1)
        self._rejected = self.counter(ARTIFACTS_REJECTED)

    def _make(self, spec: Spec, kind: Kind, make: Callable[..., Any], **kw: Any) -> Any:
        if self.specs.get(spec.name) != spec or spec.kind != kind:
            raise ValueError(f"{spec.name} is not a {kind} declared for this registry")
        if spec.name not in self._made:
            name = spec.name.removesuffix("_total") if kind == "counter" else spec.name
            self._made[spec.name] = make(name, spec.help, list(spec.labels), registry=self.registry, **kw)
        return self._made[spec.name]

    def counter(self, spec: Spec) -> Counter:
        return self._make(spec, "counter", Counter)

    def gauge(self, spec: Spec) -> Gauge:
        return self._make(spec, "gauge", Gauge)

    def histogram(self, spec: Spec, buckets: tuple[float, ...] = SECONDS) -> Histogram:
        return self._make(spec, "histogram", Histogram, buckets=buckets)

    def pull(self, spec: Spec, read: Callable[[], Reading], *fixed: str) -> None:
        """Export ``spec`` as ``read()`` says at each scrape; ``fixed``: its first label values
        (the rest are the keys ``read`` returns)."""
        if self.specs.get(spec.name) != spec or spec.kind == "histogram" or spec.name in self._made:
            raise ValueError(f"{spec.name} cannot be pulled here (undeclared, a histogram, or already built)")
        self._made[spec.name] = _Pulled(spec, fixed, read)
        self.registry.register(self._made[spec.name])

    # ------------------------------------------------------------ the common metrics

    def meter(self, bucket: str) -> Callable[[str, int], None]:
        """The hook an :class:`~aurora_store.bucket.objectstore.ObjectStore` calls with (direction,
        bytes) for every object or range it moves: counted under ``bucket``."""
        counter = self.counter(BUCKET_BYTES)
        children = {d: counter.labels(self.role, self.region, d, bucket) for d in ("upload", "download")}

        def moved(direction: str, n: int) -> None:
            children[direction].inc(n)

        return moved

    def rejected(self, exc: BaseException) -> None:
        """Count an object or manifest this role refused."""
        self._rejected.labels(self.role, self.region, reason_of(exc)).inc()

    def redis_skipped(self, read: Callable[[], Mapping[str, int]]) -> None:
        """Export a coordinator's count of skipped Redis entries (its ``skipped`` tally's snapshot)."""
        self.pull(REDIS_SKIPPED, read, self.role, self.region)

    # ------------------------------------------------------------ serving

    def serve(self, port: int | None, addr: str = LOOPBACK) -> None:
        """Serve ``/metrics`` on ``addr:port`` (port None or 0: not at all), from a daemon thread."""
        if not port:
            return
        try:
            self.server = MetricsServer(self.registry, addr, port)
        except (OSError, OverflowError, ValueError) as exc:  # taken, not this host's, not an address
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise MetricsError(f"--metrics-port {port}: cannot serve metrics on {addr}:{port}: {why}") from None
        log.info("%s: metrics on http://%s:%d/metrics", self.role, addr, port)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
