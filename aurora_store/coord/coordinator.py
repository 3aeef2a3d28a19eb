"""Coordination in Redis: versions per region, segment announcements, wake-ups, workers.

Every key of a run lives under ``aurora:{run_id}:``. Redis holds coordination state only:
weights never pass through it, and every committed version can be rediscovered from the
buckets (:meth:`Coordinator.rebuild`), so losing Redis loses no data. Multi-key changes
(advance a region's version and post its commit event) are one Lua script. Works with a
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
  alive, and who died since a given time, are ranges of it, never a scan of every worker.
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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aurora_store.coord import wire
from aurora_store.coord.epoch import Epoch
from aurora_store.coord.keyspace import Keyspace
from aurora_store.coord.workers import Workers

if TYPE_CHECKING:
    from aurora_store.bucket.reader import Reader
    from aurora_store.format.manifest import Manifest, Segment

log = logging.getLogger("aurora.coord")

STREAM_MAXLEN = 10_000
"""Events kept per region (approximate trim); older ones are only in the buckets."""
COMMITS_MAXLEN = 1_000
"""Commit events kept per region in ``commits:{region}`` (what actors block on)."""

# KEYS: region, events, commits.  ARGV: version, version_hash, kind, now_ms, events maxlen, commits maxlen
_COMMIT = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '')
if cur and cur >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'version_hash', ARGV[2], 'kind', ARGV[3], 'updated_ms', ARGV[4])
for i, key in ipairs({KEYS[2], KEYS[3]}) do
  redis.call('XADD', key, 'MAXLEN', '~', ARGV[4 + i], '*', 'type', 'commit', 'version', ARGV[1],
             'version_hash', ARGV[2], 'kind', ARGV[3])
end
return 1
"""


@dataclass(frozen=True, slots=True)
class RegionVersion:
    version: int
    version_hash: str
    kind: str


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a region's event stream."""

    id: str
    type: str
    """``segment`` or ``commit``; ``invalid`` for an entry no role could have written (skipped)."""
    version: int
    fields: dict[str, str]


class Coordinator:
    """All Redis state of one run: region versions and their events here; the worker registry and the
    epoch in the objects it holds, which share its :class:`~aurora_store.coord.keyspace.Keyspace`."""

    def __init__(self, url: str, run_id: str, *, prefix: str = "aurora") -> None:
        self.keys = Keyspace(url, run_id, prefix=prefix)
        """The run's keys, clients and calls (shared with the job board and the roster)."""
        self.url, self.run_id, self.base = url, run_id, self.keys.base
        self.r = self.keys.r
        self.skipped = self.keys.skipped
        """Entries read from Redis that failed their checks, by reason."""
        self.key, self.call = self.keys.key, self.keys.call
        self.epoch = Epoch(self.keys)
        """Whether Redis lost its state (:meth:`Epoch.check`, :meth:`Epoch.lost`)."""
        self.workers = Workers(self.keys, self.epoch)
        """Registrations, heartbeats and liveness."""
        self._commit = self.r.register_script(_COMMIT)

    def ping(self) -> None:
        self.call(self.r.ping)

    # ------------------------------------------------------------ versions

    def commit(self, region: str, version: int, version_hash: str, kind: str) -> bool:
        """Advance ``region`` to ``version`` and post its commit event, atomically; False if not newer."""
        now = str(int(time.time() * 1000))
        keys = [self.key("region", region), self.key("events", region), self.commits_key(region)]
        args = [version, version_hash, kind, now, STREAM_MAXLEN, COMMITS_MAXLEN]
        return bool(self.call(self._commit, keys=keys, args=args))

    def commits_key(self, region: str) -> str:
        """The stream of ``region``'s commit events alone (actors block on it)."""
        return self.key("commits", region)

    def read_streams(
        self, after: dict[str, str], *, block_ms: int, count: int = 1000
    ) -> dict[str, list[tuple[str, dict[str, str]]]]:
        """One blocking XREAD over several streams (key -> the id to read after): what arrived in
        each, raw (the caller parses it as hostile input), waiting up to ``block_ms`` for anything."""
        reply = self.call(self.r.xread, after, count=count, block=max(block_ms, 1))
        return {str(key): list(entries) for key, entries in reply or []}

    def region_version(self, region: str) -> RegionVersion | None:
        """The version ``region`` holds, None if unknown (or if its entry is damaged: counted, skipped)."""
        h = self.call(self.r.hgetall, self.key("region", region))
        if not h:
            return None
        try:
            kind = h.get("kind")
            if kind not in ("full", "delta"):
                raise wire.BadEntry("bad_kind", f"kind {kind!r:.20}")
            return RegionVersion(
                wire.version(h.get("version")), wire.hex64(h.get("version_hash"), "version_hash"), kind
            )
        except wire.BadEntry as exc:
            self.skipped.skip(exc.reason, f"region {region}: {exc}")
            return None

    def announce_segment(self, region: str, version: int, seg: Segment) -> None:
        """Post a sealed, uploaded segment before its manifest exists (cut-through)."""
        fields = {"type": "segment", "version": version, "key": seg.key, "size": seg.size, "sha256": seg.sha256}
        self.call(self.r.xadd, self.key("events", region), fields, maxlen=STREAM_MAXLEN, approximate=True)

    def last_event_id(self, region: str) -> str:
        """The id to read after to see only events posted from now on."""
        last = self.call(self.r.xrevrange, self.key("events", region), count=1)
        return last[0][0] if last else "0-0"

    def events(self, region: str, after: str, *, block_ms: int = 1000, count: int = 1000) -> list[Event]:
        """Events of ``region`` after id ``after``, waiting up to ``block_ms`` for the first one."""
        reply = self.call(self.r.xread, {self.key("events", region): after}, count=count, block=block_ms)
        out = []
        for _stream, entries in reply or []:
            for eid, fields in entries:
                out.append(self._event(region, eid, fields))
        return out

    def _event(self, region: str, eid: str, fields: dict[str, str]) -> Event:
        """An event as read, checked: an entry no role could have written is ``invalid`` (its id still
        moves the reader on), counted and logged."""
        try:
            kind = fields.get("type")
            if kind not in ("segment", "commit"):
                raise wire.BadEntry("bad_type", f"type {kind!r:.40}")
            version = wire.version(fields.get("version"))
            if kind == "segment":
                wire.parse_segment_event(fields, version)
            else:
                wire.hex64(fields.get("version_hash"), "version_hash")
            return Event(eid, kind, version, fields)
        except wire.BadEntry as exc:
            self.skipped.skip(exc.reason, f"event {eid} of region {region}: {exc}")
            return Event(eid, "invalid", -1, fields)

    def rebuild(self, region: str, reader: Reader) -> RegionVersion | None:
        """Set ``region``'s version from its bucket (after Redis lost its state); never moves it back."""
        versions = reader.versions()
        if not versions:
            return self.region_version(region)
        m = reader.manifest(versions[-1])
        self.commit(region, m.version, m.version_hash, m.kind)
        return self.region_version(region)

    def holds(self) -> tuple[dict[str, int], list[str]]:
        """What ``aurora gc`` must not delete from under anyone: the version every live actor holds
        and every region is at (relays copy what comes after it), by who (``actor a1 in eu``,
        ``region eu``); and the entries that could not be read (a live worker whose held version is
        unknown, a damaged region). One pass over every worker and region: for gc, not for a loop."""
        held: dict[str, int] = {}
        unreadable: list[str] = []
        alive = self.workers.alive()
        for wid, doc in self.call(self.r.hgetall, self.key("workers")).items():
            if wid not in alive:
                continue  # gone: it bootstraps from the latest version when it comes back
            try:
                parsed = wire.json_object(doc, "registration")
                if parsed.get("role") == "actor" and "version" in parsed:
                    v = parsed["version"]  # a JSON number: what workers.update wrote
                    v = str(v) if isinstance(v, int) and not isinstance(v, bool) else v
                    held[f"actor {wire.name(wid, 'worker_id')} in {parsed.get('region')!s:.40}"] = wire.version(v)
            except wire.BadEntry as exc:
                unreadable.append(f"worker {wid!r:.80}: {exc}")
        prefix = self.key("region", "")
        for key in self.call(lambda: list(self.r.scan_iter(match=prefix + "*", count=1000))):
            region = key[len(prefix) :]
            got = self.region_version(region)
            if got is None:
                unreadable.append(f"region {region!r:.80}: its version entry is damaged")
            else:
                held[f"region {region}"] = got.version
        return held, unreadable

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
        reply = self.call(self.r.xread, {self.key("log", stream): after}, count=count)
        out = []
        for _s, entries in reply or []:
            for eid, f in entries:
                try:
                    out.append((eid, wire.json_object(f.get("doc"), "note")))
                except wire.BadEntry as exc:
                    self.skipped.skip(exc.reason, f"note {eid} of {stream}: {exc}")
        return out

    def close(self) -> None:
        self.keys.close()


class RegionAnnouncer:
    """Tells a region's workers what a publisher (trainer or relay) has just made available there."""

    def __init__(self, coord: Coordinator, region: str) -> None:
        self.coord = coord
        self.region = region

    def segment(self, version: int, entry: Segment) -> None:
        self.coord.announce_segment(self.region, version, entry)

    def commit(self, manifest: Manifest) -> None:
        self.coord.commit(self.region, manifest.version, manifest.version_hash, manifest.kind)
