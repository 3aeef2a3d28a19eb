"""Coordination in Redis: versions per region, segment announcements, wake-ups, workers.

Every key of a run lives under ``aurora:{run_id}:``. Redis holds coordination state only:
weights never pass through it, and every committed version can be rediscovered from the
buckets (:meth:`Regions.rebuild <aurora_store.coord.regions.Regions.rebuild>`), so losing Redis
loses no data. The :class:`Coordinator` holds the objects that own each part:
``coord.regions`` (:mod:`aurora_store.coord.regions`), ``coord.workers``
(:mod:`aurora_store.coord.workers`) and ``coord.epoch`` (:mod:`aurora_store.coord.epoch`).
Multi-key changes (advance a region's version and post its commit event) are one Lua script. Works with a
real Redis (``redis://``, ``rediss://``, passwords in the URL) and with the embedded
Redis-compatible server of :mod:`aurora_store.coord.embedded`.

Keys:
- ``region:{region}`` (hash): committed ``version``, ``version_hash``, ``kind``, ``updated_ms``.
- ``events:{region}`` (stream): ``type=segment`` (``version, key, size, sha256``) as each
  segment lands, before its manifest; ``type=commit`` (``version, version_hash, kind``).
  Relays block on it (XREAD) instead of polling buckets.
- ``commits:{region}`` (stream): the commit events alone, so the region's actors wake once per
  version (a blocking XREAD, with their job inbox), not once per segment.
- ``workers`` (hash): worker id -> JSON registration.
- ``alive`` (sorted set): worker id -> when its heartbeat expires (ms on Redis's clock): who is
  alive, and who died since a given time, are ranges of it, never a scan of every worker (on a Redis
  Cluster one a shard, beside the shard's actors' streams: :mod:`aurora_store.coord.keyspace`).
- ``roster`` (sorted set): worker id -> the sequence number (``roster_seq``) of its last change
  (registered, updated, gone, come back): the trainer reads only what changed since it last looked
  (:class:`aurora_store.coord.roster.Roster`).
- ``reports`` (stream): objects a worker found corrupt or missing.
- ``epoch`` (string): a random id written by the first role to find it missing. A role that
  finds another id (or none) than the one it last saw knows that Redis lost its state without
  a disconnect (``FLUSHALL``, a failover to an empty replica) and rebuilds what it keeps there
  (:class:`aurora_store.coord.epoch.Epoch`, :attr:`Coordinator.epoch`).

Everything read back is hostile input (:mod:`aurora_store.coord.wire`): a bad entry is counted
in :attr:`Coordinator.skipped` by reason, logged once a minute per reason, and skipped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from aurora_store.coord import wire
from aurora_store.coord.epoch import Epoch
from aurora_store.coord.keyspace import Keyspace
from aurora_store.coord.regions import Regions
from aurora_store.coord.workers import Workers

if TYPE_CHECKING:
    from aurora_store.format.manifest import Manifest, Segment

log = logging.getLogger("aurora.coord")


class Coordinator:
    """All Redis state of one run: the objects that own its parts (region versions, workers, the epoch),
    sharing one :class:`~aurora_store.coord.keyspace.Keyspace`; reports and telemetry notes here."""

    def __init__(self, url: str, run_id: str, *, prefix: str = "aurora", client_name: str | None = None) -> None:
        self.keys = Keyspace(url, run_id, prefix=prefix, client_name=client_name)
        """The run's keys, clients and calls (shared with the job board and the roster)."""
        self.url, self.run_id, self.base = url, run_id, self.keys.base
        self.skipped = self.keys.skipped
        """Entries read from Redis that failed their checks, by reason."""
        self.key, self.call = self.keys.key, self.keys.call
        self.epoch = Epoch(self.keys)
        """Whether Redis lost its state (:meth:`Epoch.check`, :meth:`Epoch.lost`)."""
        self.workers = Workers(self.keys, self.epoch)
        """Registrations, heartbeats and liveness."""
        self.regions = Regions(self.keys)
        """The version each region holds, and its events."""

    @property
    def r(self) -> Any:
        """The keyspace's client (decoding)."""
        return self.keys.r

    def ping(self) -> None:
        self.call(self.r.ping)

    def read_streams(
        self, after: dict[str, str], *, block_ms: int, count: int = 1000
    ) -> dict[str, list[tuple[str, dict[str, str]]]]:
        """One blocking XREAD over several streams (key -> the id to read after): what arrived in
        each, raw (the caller parses it as hostile input), waiting up to ``block_ms`` for anything."""
        return self.read_streams_after((), after, block_ms=block_ms, count=count)[1]

    def read_streams_after(
        self, commands: Sequence[tuple[Any, ...]], after: dict[str, str], *, block_ms: int, count: int = 1000
    ) -> tuple[list[Any], dict[str, list[tuple[str, dict[str, str]]]]]:
        """``commands`` (on the streams' slot), then :meth:`read_streams`, in one round trip: their replies,
        and what arrived."""
        first, reply = self.keys.xread_after(commands, after, count=count, block=max(block_ms, 1))
        return first, {str(key): list(entries) for key, entries in reply or []}

    def versions_in_use(self) -> tuple[dict[str, int], list[str]]:
        """What ``aurora gc`` must not delete from under anyone: the version every live actor has applied
        and every region is at (relays copy what comes after it), by who (``actor a1 in eu``,
        ``region eu``); and the entries that could not be read (a live worker whose applied version is
        unknown, a damaged region). Reads the live workers' registrations only (:meth:`Workers.versions`)
        and every region's entry: for gc, not for a loop."""
        in_use, unreadable = self.workers.versions()
        for region, got in self.regions.versions().items():
            if got is None:
                unreadable.append(f"region {region!r:.80}: its version entry is damaged")
            else:
                in_use[f"region {region}"] = got.version
        return in_use, unreadable

    # ------------------------------------------------------------ reports

    def report(self, worker_id: str, region: str, version: int, obj: str, error: str) -> None:
        """Record an object a worker refused (corrupt or missing), for operators and relays."""
        fields = {"worker": worker_id, "region": region, "version": version, "object": obj, "error": error[:1000]}
        self.call(self.r.xadd, self.key("reports"), fields, maxlen=10_000, approximate=True)

    def reports(self) -> Iterator[dict[str, str]]:
        for _eid, fields in self.call(self.r.xrange, self.key("reports")):
            yield fields

    # ------------------------------------------------------------ telemetry

    def note(self, stream: str, **fields: Any) -> None:
        """Append a telemetry record (step metrics, applied versions) to stream ``stream``."""
        self.call(self.r.xadd, self.key("log", stream), {"doc": json.dumps(fields)}, maxlen=100_000, approximate=True)

    def notes(self, stream: str, after: str = "0-0", *, count: int = 10_000) -> list[tuple[str, dict[str, Any]]]:
        """Records of ``stream`` after id ``after``, oldest first."""
        reply = self.keys.xread({self.key("log", stream): after}, count=count)
        out = []
        for _s, entries in reply or []:
            for eid, f in entries:
                try:
                    out.append((eid, wire.json_object(f.get("doc"), "note")))
                except wire.BadEntry as exc:
                    self.skipped.skip(exc.reason, f"note {eid} of {stream}: {exc}")
        return out

    def release_idle(self) -> None:
        """Close the connections no thread is using now (they reconnect on their next command): an idle
        actor keeps only its listener's, busy in its blocking read."""
        self.keys.release_idle()

    def close(self) -> None:
        self.keys.close()


class RegionAnnouncer:
    """Tells a region's workers what a publisher (trainer or relay) has just made available there."""

    def __init__(self, coord: Coordinator, region: str) -> None:
        self.coord = coord
        self.region = region

    def segment(self, version: int, entry: Segment) -> None:
        self.coord.regions.announce(self.region, version, entry)

    def commit(self, manifest: Manifest) -> None:
        self.coord.regions.commit(self.region, manifest.version, manifest.version_hash, manifest.kind)
