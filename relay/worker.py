"""Relay worker: one destination region, fed cut-through from a source region.

Segments are copied as soon as they are announced (before their manifest exists), each verified:
the relay writes the bytes it checked against their hash, and reads back only an object another
writer placed first. A version's manifest is written last, byte for byte the source's, only
after every object it names is verified there; then the region's version advances in Redis. A
commit that follows the relay's own last one costs one read across the link (the manifest, while
the destination is checked for it) and one write: no listing, and the parent it links to is the
manifest the relay wrote. Crash-safe and idempotent: objects are written with put-if-absent and
never rewritten, objects already present are verified and skipped, and on start the relay
backfills every committed version the destination lacks. Announced segments are copied on a
small pool of their own, so the segments of one version (a full checkpoint's shards, a large
delta's segments) cross the WAN in parallel; a copy already in flight is waited for, never
started twice. No torch.

What the relay remembers is bounded by the versions it may still need: objects it verified are
kept by version only until that version is committed at the destination (versions commit in
order, so every version up to the last committed one is done: an announcement of one of its
objects is a no-op), plus the run's attachments.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from aurora_store.bucket.limits import Limits
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.reader import Reader
from aurora_store.bucket.retention import records as retention_records
from aurora_store.coord import wire
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.workers import Beat
from aurora_store.errors import ChainError, CorruptError, MissingError, StoreError, UnauthenticatedError
from aurora_store.errors import about as about_url
from aurora_store.format import retention, signing
from aurora_store.format.keys import manifest_key, object_version, rotation_marker_key
from aurora_store.format.manifest import Manifest, Segment, check_link
from aurora_store.format.retention import Retired
from relay.metrics import RelayMetrics
from relay.stats import RelayStats

log = logging.getLogger("aurora.relay")
T = TypeVar("T")


class Relay:
    """Copies a run from ``source`` to ``dest``; ``dest_region`` names the destination in Redis."""

    def __init__(
        self,
        source: ObjectStore,
        dest: ObjectStore,
        coord: Coordinator | None,
        *,
        source_region: str,
        dest_region: str,
        limits: Limits | None = None,
        verify_key: object = None,
        announced_copies: int = 4,
        metrics: RelayMetrics | None = None,
    ) -> None:
        vk = signing.load_verify_key(verify_key) if verify_key is not None else None  # type: ignore[arg-type]
        self.source, self.dest, self.coord = source, dest, coord
        self.source_region, self.dest_region = source_region, dest_region
        self.limits = limits or Limits()
        self.src = Reader(source, self.limits, vk)
        self.dst = Reader(dest, self.limits, vk, keys_from=self.src)  # a rotation may reach the destination last
        self.stats = RelayStats()
        self._retired = Retired()
        """What gc retired at the source or the destination (their honoured records', read with every backfill)."""
        self._pending_records: dict[str, int] = {}
        """The source's honoured records not at the destination yet, with the highest version each retires."""
        self._verified: dict[int | None, set[tuple[str, str]]] = {}
        """Objects verified at the destination, by version (None: attachments), for uncommitted versions only."""
        self._committed = -1
        """The latest version committed at the destination (every one before it is committed or retired)."""
        self._last: Manifest | None = None
        """The destination's manifest of ``_committed`` as this relay committed or read it (set with it):
        the parent the next version is checked against without reading it back."""
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="relay-manifest")
        """Reads a version's manifest across the link while the destination is checked."""
        self._inflight: dict[tuple[str, str], Future[None]] = {}
        self._lock = threading.Lock()
        self._last_warned: dict[str, float] = {}
        self._copies = ThreadPoolExecutor(max(1, announced_copies), thread_name_prefix="relay-announced")
        self.metrics = metrics or RelayMetrics(dest_region)
        """This relay's Prometheus metrics (served by ``aurora relay --metrics-port``)."""
        self.metrics.watch(self.stats, coord)
        source.meter, dest.meter = self.metrics.m.meter("source"), self.metrics.m.meter("dest")

    # ------------------------------------------------------------ objects

    def copy_object(self, entry: Segment) -> None:
        """Make ``entry`` present and verified at the destination; never rewrite an object.
        If an announced copy of it is in flight, wait for that one (and redo it only if it failed)."""
        ident = (entry.key, entry.sha256)
        with self._lock:
            if self._is_verified(ident):
                return
            running = self._inflight.get(ident)
        if running is not None:
            try:
                running.result()
                return
            except StoreError:
                pass  # that attempt failed: try again here, and let this one's error propagate
        self._copy(entry)

    def copy_announced(self, entry: Segment) -> Future[None] | None:
        """Start copying an announced segment in the background (None if done or already under way, or
        if its version is committed at the destination already)."""
        ident = (entry.key, entry.sha256)
        with self._lock:
            if self._is_verified(ident) or ident in self._inflight or self._is_committed(entry.key):
                return None
            fut = self._copies.submit(self._copy_logged, entry)
            self._inflight[ident] = fut
            return fut

    def _copy_logged(self, entry: Segment) -> None:
        try:
            self._copy(entry)
        except StoreError as exc:  # the commit copies it again (and then fails loudly) or a rescan does
            log.info("relay %s: announced %s: %s", self.dest_region, entry.key, exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop((entry.key, entry.sha256), None)

    def _copy(self, entry: Segment) -> None:
        ident = (entry.key, entry.sha256)
        with self._lock:
            if self._is_verified(ident):
                return
        if self.dest.exists(entry.key):
            self._verify_dest(entry)  # a corrupt object here is refused, never overwritten
            with self._lock:
                self._remember(ident)
                self.stats.skipped += 1
            return
        data = self.src.fetch(entry)  # verified at the source before it crosses the WAN
        if not self.dest.put_if_absent(entry.key, data):  # a concurrent writer won: its bytes are checked
            self._verify_dest(entry)  # (what this relay created is the bytes it verified: no read back)
        with self._lock:
            self._remember(ident)
            self.stats.copied += 1
            self.stats.bytes += entry.size

    def _is_verified(self, ident: tuple[str, str]) -> bool:
        return ident in self._verified.get(object_version(ident[0]), ())

    def _is_committed(self, key: str) -> bool:
        v = object_version(key)
        return v is not None and v <= self._committed

    def _remember(self, ident: tuple[str, str]) -> None:
        """Record a verified object (under the lock), unless its version is committed already."""
        if not self._is_committed(ident[0]):
            self._verified.setdefault(object_version(ident[0]), set()).add(ident)

    def _committed_through(self, m: Manifest) -> None:
        """Every version up to ``m``'s is committed at the destination, ``m`` the latest of them: forget
        their objects, and keep ``m`` as the parent the next version links to."""
        with self._lock:
            if m.version < self._committed:
                return
            self._committed, self._last = m.version, m
            for v in [v for v in self._verified if v is not None and v <= m.version]:
                del self._verified[v]

    def _verify_dest(self, entry: Segment) -> None:
        try:
            self.dst.fetch(entry)
        except CorruptError as exc:
            if self.coord is not None:
                self.coord.report("relay", self.dest_region, -1, self.dest.url(entry.key), str(exc))
            raise

    # ------------------------------------------------------------ versions

    def copy_version(self, version: int) -> bool:
        """Copy one committed version; True if this call committed it at the destination."""
        # The source's manifest is read (a round trip across the link) while the destination is
        # checked for it (one in its own region); the read is waited for either way, so the source's
        # reader is never used by two threads at once.
        ahead = self._ahead.submit(self.src.manifest_with_bytes, version)
        if self.dest.exists(manifest_key(version)):
            with contextlib.suppress(StoreError):  # its manifest is the destination's: the source's is not needed
                ahead.result()
            m = self.dst.manifest(version)
            if (
                m.rotation is not None
            ):  # the marker a destination's readers list (written before the manifest; idempotent)
                self.dest.put_if_absent(rotation_marker_key(version), b"")
            self._advance(m)
            return False
        self.metrics.first_seen(version)
        m, raw = ahead.result()  # one GET: parsed, hash-, run- and signature-checked
        self._check_fits_dest(m)
        objects = list(m.objects) + list(m.files)
        for _ in self.dest.map(self.copy_object, objects):
            pass
        if m.rotation is not None:  # before the commit, as the trainer writes it: readers there find the rotation
            self.dest.put_if_absent(rotation_marker_key(version), b"")
        if self.dest.put_if_absent(manifest_key(version), raw):
            with self._lock:
                self.stats.versions += 1
            self.metrics.committed(version)
        elif self.dest.get(manifest_key(version), max_bytes=self.limits.max_manifest_bytes) != raw:
            raise CorruptError(f"{self.dest.url(manifest_key(version))} differs from the source's manifest")
        self._advance(m)
        return True

    def _check_fits_dest(self, m: Manifest) -> None:
        """``m`` continues what the destination holds: its parent is there and links to it, and it
        is of the destination's run. Checked before the first object is copied, so another run's
        version placed in the source never takes this version's place at the destination."""
        url = self.dest.url(manifest_key(m.version))
        if m.version == 0:
            return
        last = self._last  # the version this relay committed or found here last: if the parent, not read back
        parent = (m.parent.version, m.parent.version_hash) if m.parent is not None else None
        if last is None or parent != (last.version, last.version_hash):
            last = None
        parent_there = last is not None or (m.parent is not None and self.dest.exists(manifest_key(m.parent.version)))
        if m.parent is not None and not parent_there and m.kind == "full" and m.parent.version in self._retired:
            pass  # a full version needs no parent, and gc retired this one: nothing to link to
        elif m.parent is not None and not parent_there:
            raise ChainError(
                f"{url}: parent version {m.parent.version} is not at the destination yet; "
                "versions are committed in order"
            )
        lineage = self.dst.lineage()
        if m.run is not None and m.run.origin != lineage.origin:  # its key: checked by the source's reader
            raise ChainError(
                f"{url}: the source's version {m.version} is of run {m.run.origin}, "
                f"the destination's run is {lineage.origin}",
                url=url,
            )
        if m.parent is not None and parent_there:
            with about_url(url):
                check_link(last if last is not None else self.dst.manifest(m.parent.version), m)

    def _advance(self, m: Manifest) -> None:
        self._committed_through(m)
        self._place_records(m.version)
        self.metrics.region_at(m.version)
        if self.coord is not None:
            self.coord.regions.commit(self.dest_region, m.version, m.version_hash, m.kind)

    def backfill(self) -> list[int]:
        """Copy every committed source version the destination lacks, in order; returns them (first
        removing what a killed relay left half-written at the destination)."""
        self.dest.sweep_temporaries()
        retired = self._copy_retention()
        have = set(self.dst.versions())
        done = []
        versions = self.src.versions()
        if versions:
            self.metrics.source_at(versions[-1])
        for v in versions:
            if v not in have and v not in retired:  # a version gc retired here is not copied back
                self.copy_version(v)
                done.append(v)
        latest = self.dst.versions()
        if latest and self.coord is not None:
            self._advance(self.dst.manifest(latest[-1]))
        return done

    def _copy_retention(self) -> Retired:
        """What gc retired, at the source or here (none of it is copied back): the records each
        side's reader honours (a record that is not the run's, unsigned in a signed run or retiring
        versions not below the latest is ignored and logged). The source's records are placed here
        once this region holds a version above all they retire (:meth:`_place_records`), so an audit
        here never meets a record that retires versions it has yet to reach, nor one that was ignored."""
        src, dst = retention_records(self.src), retention_records(self.dst)
        for bad in src.bad:  # counted and logged, like every refusal; it is not copied here
            self.reject("a retention record", UnauthenticatedError(bad))
        there = set(self.dest.list_keys(retention.DIR))
        with self._lock:
            self._pending_records = {k: v for k, v in src.latest.items() if k not in there}
        committed = self.dst.versions()
        if committed:
            self._place_records(committed[-1])
        self._retired = src.retired | dst.retired
        return self._retired

    def _place_records(self, committed: int) -> None:
        """Copy the source's honoured records whose retired versions are all below ``committed``,
        the version this region now holds."""
        with self._lock:
            ready = [k for k, top in self._pending_records.items() if top < committed]
            for k in ready:
                del self._pending_records[k]
        for key in ready:
            try:
                self.dest.put_if_absent(key, self.source.get(key, max_bytes=retention.MAX_RECORD_BYTES))
            except StoreError as exc:  # the version is committed whatever becomes of its record: next backfill
                log.info("relay %s: retention record %s not copied yet: %s", self.dest_region, key, exc)

    # ------------------------------------------------------------ the loop

    def run(self, stop: threading.Event, *, block_ms: int = 1000, rescan_s: float = 30.0) -> None:
        """Serve until ``stop`` is set: backfill, then copy announced segments and commits as they come."""
        coord = self.coord
        if coord is None:
            raise StoreError("a long-running relay needs Redis; use --once to backfill without it")
        info = {"source": self.source.uri, "dest": self.dest.uri}
        wid = self._starting(stop, lambda: coord.workers.register("relay", self.dest_region, info=info))
        beat = Beat(coord.workers, wid, 15.0)  # as it registered: one ZADD a beat, in full only when it must
        after = self._starting(stop, lambda: coord.regions.last_event_id(self.source_region))
        if stop.is_set():
            self.close()
            return
        self._backfill_safely()
        with contextlib.suppress(CoordinationError):  # caught up: from now on each version is cut-through
            coord.workers.update(wid, serving=True)
        last_scan, need_scan = time.monotonic(), False
        while not stop.is_set():
            try:
                if need_scan or time.monotonic() - last_scan > rescan_s:
                    # events may have been lost (Redis restarted, or this relay missed some):
                    # the buckets are the truth, and Redis is rebuilt from them
                    self._backfill_safely()
                    try:
                        coord.regions.rebuild(self.source_region, self.src)
                        coord.regions.rebuild(self.dest_region, self.dst)
                    except StoreError as exc:  # a damaged latest manifest: refused, counted, retried next scan
                        self.reject("rebuild", exc)
                    coord.workers.register(
                        "relay",
                        self.dest_region,
                        worker_id=wid,
                        info={**info, "serving": True},
                    )
                    last_scan, need_scan = time.monotonic(), False
                beat()
                if coord.epoch.lost():  # FLUSHALL or an empty failover: rescan, rebuild, register again
                    need_scan = True
                    continue
                events = coord.regions.events(self.source_region, after, block_ms=block_ms)
            except CoordinationError as exc:
                log.warning("relay %s: %s; retrying", self.dest_region, exc)
                need_scan = True
                stop.wait(1.0)
                continue
            for e in events:
                after = e.id
                try:
                    self._handle(e.type, e.version, e.fields)
                except (MissingError, ChainError) as exc:
                    log.info("relay %s: %s; will catch up by scanning", self.dest_region, exc)
                    need_scan = True
                except StoreError as exc:  # a bad announcement or a bad object: counted, never fatal
                    self.reject(f"event {e.id}", exc)
                    need_scan = True
                except CoordinationError as exc:  # Redis cut or refusing mid-event: the buckets are the truth
                    log.warning("relay %s: %s; will catch up by scanning", self.dest_region, exc)
                    need_scan = True
                    break
        with contextlib.suppress(CoordinationError):  # stopping while Redis is away: the registration expires
            coord.workers.unregister(wid)
        self.close()

    def _starting(self, stop: threading.Event, fn: Callable[[], T]) -> T:
        """``fn()`` retried with backoff while Redis does not answer (a relay started while Redis
        restarts waits for it instead of exiting)."""
        backoff, said = 0.5, False
        while True:
            try:
                return fn()
            except CoordinationError as exc:
                if not said:
                    log.warning("relay %s: %s; retrying with backoff", self.dest_region, exc)
                    said = True
            if stop.wait(backoff):
                return None  # type: ignore[return-value]  # stopping: the caller checks stop
            backoff = min(backoff * 2, 10.0)

    def _backfill_safely(self) -> None:
        """Backfill, counting a version that fails its checks instead of dying of it: it stays out of
        this region (and every later one with it: versions are committed in order) until it is fixed."""
        try:
            self.backfill()
        except (MissingError, ChainError, CoordinationError) as exc:
            log.info("relay %s: %s; will retry on the next scan", self.dest_region, exc)
        except StoreError as exc:
            self.reject("backfill", exc)

    def reject(self, what: str, exc: StoreError) -> None:
        """Count a refusal by kind, and log it (each kind once a minute at warning level)."""
        kind = type(exc).__name__
        self.metrics.m.rejected(exc)
        with self._lock:
            self.stats.rejected[kind] = self.stats.rejected.get(kind, 0) + 1
            now = time.monotonic()
            loud = now - self._last_warned.get(kind, -1e9) > 60.0
            if loud:
                self._last_warned[kind] = now
        (log.warning if loud else log.debug)("relay %s: refused %s: %s", self.dest_region, what, exc)

    def close(self) -> None:
        """Wait for announced copies in flight and stop their pool."""
        self._copies.shutdown(wait=True)
        self._ahead.shutdown(wait=True)

    def _handle(self, kind: str, version: int, fields: dict[str, str]) -> None:
        """Act on one event. Events come from Redis, not from a signed manifest: every field is
        checked (only a segment, shard or index key of its version is ever copied; a manifest is
        written only as the commit, after the objects it names), and an event the coordinator
        found invalid is skipped (it counted it)."""
        if kind == "segment":
            try:
                key, size, sha = wire.parse_segment_event(fields, version)
            except wire.BadEntry as exc:
                raise CorruptError(f"announced segment: {exc}") from None
            if size > self.limits.max_segment_bytes:
                raise CorruptError(f"announced segment {key} is {size} bytes, over the cap")
            self.metrics.first_seen(version)
            self.copy_announced(Segment(key, size, sha))
        elif kind == "commit":
            self.metrics.source_at(version)
            for v in range(self._next_version(), version + 1):
                self.copy_version(v)

    def _next_version(self) -> int:
        """The first version the destination lacks: after the one this relay knows it holds, without
        listing it (a listing per commit is a large share of a slow region's time to apply a version:
        docs/ARCHITECTURE.md, "Figures the design rests on"); listed when it knows none yet."""
        if self._committed >= 0:
            return self._committed + 1
        have = self.dst.versions()
        return have[-1] + 1 if have else 0
