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
  Workers block on it (XREAD) instead of polling buckets.
- ``workers`` (hash): worker id -> JSON registration; ``hb:{id}`` (string with a TTL): alive.
- ``reports`` (stream): objects a worker found corrupt or missing.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from aurora_store.coord.errors import CoordinationError

if TYPE_CHECKING:
    from aurora_store.bucket.reader import Reader
    from aurora_store.format.manifest import Manifest, Segment

STREAM_MAXLEN = 100_000
"""Events kept per region (approximate trim); older ones are only in the buckets."""

_COMMIT = """
local cur = redis.call('HGET', KEYS[1], 'version')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'version_hash', ARGV[2], 'kind', ARGV[3], 'updated_ms', ARGV[4])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'type', 'commit', 'version', ARGV[1],
           'version_hash', ARGV[2], 'kind', ARGV[3])
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
    version: int
    fields: dict[str, str]


class Coordinator:
    """All Redis state of one run."""

    def __init__(self, url: str, run_id: str, *, prefix: str = "aurora") -> None:
        if not run_id or any(c in run_id for c in " {}\n"):
            raise CoordinationError(f"run id must be a non-empty name without spaces or braces, got {run_id!r}")
        self.url = url
        self.run_id = run_id
        self.base = f"{prefix}:{run_id}"
        try:
            self.r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30, health_check_interval=10)
        except ValueError as exc:
            raise CoordinationError(f"bad Redis URL {_redact(url)!r}: {exc}") from None
        self._commit = self.r.register_script(_COMMIT)

    def key(self, *parts: str) -> str:
        return ":".join((self.base, *parts))

    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` on this coordinator's Redis; a Redis failure is a CoordinationError
        (the password never in its message)."""
        try:
            return fn(*args, **kw)
        except redis.RedisError as exc:
            raise CoordinationError(f"Redis at {_redact(self.url)}: {type(exc).__name__}: {exc}") from None

    def ping(self) -> None:
        self.call(self.r.ping)

    # ------------------------------------------------------------ versions

    def commit(self, region: str, version: int, version_hash: str, kind: str) -> bool:
        """Advance ``region`` to ``version`` and post its commit event, atomically; False if not newer."""
        now = str(int(time.time() * 1000))
        keys = [self.key("region", region), self.key("events", region)]
        args = [version, version_hash, kind, now, STREAM_MAXLEN]
        return bool(self.call(self._commit, keys=keys, args=args))

    def region_version(self, region: str) -> RegionVersion | None:
        h = self.call(self.r.hgetall, self.key("region", region))
        if not h or "version" not in h:
            return None
        return RegionVersion(int(h["version"]), h.get("version_hash", ""), h.get("kind", ""))

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
                out.append(Event(eid, fields.get("type", ""), int(fields.get("version", -1)), fields))
        return out

    def rebuild(self, region: str, reader: Reader) -> RegionVersion | None:
        """Set ``region``'s version from its bucket (after Redis lost its state); never moves it back."""
        versions = reader.versions()
        if not versions:
            return self.region_version(region)
        m = reader.manifest(versions[-1])
        self.commit(region, m.version, m.version_hash, m.kind)
        return self.region_version(region)

    # ------------------------------------------------------------ workers

    def register(
        self,
        role: str,
        region: str,
        *,
        ttl_s: float = 15.0,
        worker_id: str | None = None,
        info: dict[str, Any] | None = None,
    ) -> str:
        """Register a worker and start its heartbeat; returns its id."""
        wid = worker_id or f"{role}-{region}-{uuid.uuid4().hex[:8]}"
        doc = {"role": role, "region": region, "started_ms": int(time.time() * 1000), **(info or {})}
        self.call(self.r.hset, self.key("workers"), wid, json.dumps(doc))
        self.heartbeat(wid, ttl_s)
        return wid

    def heartbeat(self, worker_id: str, ttl_s: float = 15.0) -> None:
        self.call(self.r.set, self.key("hb", worker_id), str(int(time.time() * 1000)), px=int(ttl_s * 1000))

    def workers(self, *, alive_only: bool = True) -> dict[str, dict[str, Any]]:
        """Registered workers (those with a live heartbeat unless ``alive_only`` is False)."""
        raw = self.call(self.r.hgetall, self.key("workers"))
        out = {}
        for wid, doc in raw.items():
            if alive_only and not self.call(self.r.exists, self.key("hb", wid)):
                continue
            out[wid] = json.loads(doc)
        return out

    def update_worker(self, worker_id: str, **fields: Any) -> None:
        """Merge ``fields`` (e.g. the version an actor holds) into a worker's registration."""
        doc = self.call(self.r.hget, self.key("workers"), worker_id)
        merged = {**(json.loads(doc) if doc else {}), **fields}
        self.call(self.r.hset, self.key("workers"), worker_id, json.dumps(merged))

    def unregister(self, worker_id: str) -> None:
        self.call(self.r.hdel, self.key("workers"), worker_id)
        self.call(self.r.delete, self.key("hb", worker_id))

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
        return [(eid, json.loads(f["doc"])) for _s, entries in reply or [] for eid, f in entries]

    def close(self) -> None:
        self.r.close()


def _redact(url: str) -> str:
    """A Redis URL without its password, for error messages."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"


class RegionAnnouncer:
    """Tells a region's workers what a publisher (trainer or relay) has just made available there."""

    def __init__(self, coord: Coordinator, region: str) -> None:
        self.coord = coord
        self.region = region

    def segment(self, version: int, entry: Segment) -> None:
        self.coord.announce_segment(self.region, version, entry)

    def commit(self, manifest: Manifest) -> None:
        self.coord.commit(self.region, manifest.version, manifest.version_hash, manifest.kind)
