"""The version each region holds, and the events that announce it (``Coordinator.regions``).

- ``region:{region}`` (hash): committed ``version``, ``version_hash``, ``kind``, ``updated_ms``.
- ``events:{region}`` (stream): ``type=segment`` (``version, key, size, sha256``) as each
  segment lands, before its manifest; ``type=commit`` (``version, version_hash, kind``).
  Relays block on it (XREAD) instead of polling buckets.
- ``commits:{region}`` (stream): the commit events alone, so the region's actors wake once per
  version (a blocking XREAD, with their job inbox), not once per segment.

Advancing a region's version and posting its commit events is one Lua script. Every committed
version can be rediscovered from the region's bucket (:meth:`Regions.rebuild`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aurora_store.coord import wire
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.keyspace import Keyspace

log = logging.getLogger("aurora.coord")

if TYPE_CHECKING:
    from aurora_store.bucket.reader import Reader
    from aurora_store.format.manifest import Segment

STREAM_MAXLEN = 10_000
"""Events kept per region (approximate trim); older ones are only in the buckets."""
COMMITS_MAXLEN = 1_000
"""Commit events kept per region in ``commits:{region}`` (what actors block on)."""

# KEYS: region, events, commits.  ARGV: version, version_hash, kind, now_ms, events maxlen, commits maxlen
_COMMIT = """
-- an entry of another type (anyone who can write Redis may have put it there) is junk: the bucket is the
-- truth and the next commit rebuilds it, so it is replaced rather than failing every commit for good
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then redis.call('DEL', KEYS[1]) end
for i = 2, 3 do
  local t = redis.call('TYPE', KEYS[i]).ok
  if t ~= 'stream' and t ~= 'none' then redis.call('DEL', KEYS[i]) end
end
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


class Regions:
    """Region versions, their event streams and their commit streams."""

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys
        self._commit = keys.script(_COMMIT)

    def commit(self, region: str, version: int, version_hash: str, kind: str) -> bool:
        """Advance ``region`` to ``version`` and post its commit event, atomically; False if not newer."""
        now = str(int(time.time() * 1000))
        keys = [self.keys.key("region", region), self.keys.key("events", region), self.commits_key(region)]
        args = [version, version_hash, kind, now, STREAM_MAXLEN, COMMITS_MAXLEN]
        if not self.keys.call(self._commit, keys=keys, args=args):
            return False
        if self.keys.cluster:
            event = {"type": "commit", "version": version, "version_hash": version_hash, "kind": kind}
            self._copy_commit(region, event)
        return True

    def _copy_commit(self, region: str, fields: dict[str, Any]) -> None:
        """On a cluster, the commit event copied to every actor shard's stream (where the region's actors
        block), one pipeline. Not atomic with the commit: a copy lost to a failed node only delays the
        actors it would have woken until their listener's next look at the region's version."""
        try:
            self.keys.pipeline(
                lambda p: [
                    p.xadd(k, fields, maxlen=COMMITS_MAXLEN, approximate=True)
                    for k in self.keys.shard_keys("commits", region)
                ]
            )
        except CoordinationError as exc:
            log.warning(
                "region %s: version %s committed, its wake-up not copied to every actor shard: %s",
                region,
                fields["version"],
                exc,
            )

    def commits_key(self, region: str, actor: str | None = None) -> str:
        """The stream of ``region``'s commit events alone, as ``actor`` blocks on it (on a cluster, its
        shard's copy; the control stream when no actor is named)."""
        if actor is None:
            return self.keys.key("commits", region)
        return self.keys.actor_key(actor, "commits", region)

    def version(self, region: str) -> RegionVersion | None:
        """The version ``region`` holds, None if unknown (or if its entry is damaged: counted, skipped; a
        key of another type there is damaged too, not a failure of Redis)."""
        key = self.version_key(region)
        (reply,) = self.keys.pipeline(lambda pipe: pipe.execute_command("HGETALL", key), errors=True)
        return self.parse_version(region, reply)

    def version_key(self, region: str) -> str:
        """The hash of ``region``'s version (a control key: read it with HGETALL, parse it with
        :meth:`parse_version`)."""
        return self.keys.key("region", region)

    def parse_version(self, region: str, h: Any) -> RegionVersion | None:
        """:meth:`version` from the hash's HGETALL reply (hostile: a damaged entry is counted, None)."""
        if isinstance(h, Exception):  # a reply in a pipeline: a key of another type (anyone may have set it)
            self.keys.skipped.skip("bad_region", f"region {region}: {type(h).__name__}: {str(h)[:80]}")
            return None
        if not isinstance(h, dict) or not h:
            return None
        try:
            kind = h.get("kind")
            if kind not in ("full", "delta"):
                raise wire.BadEntry("bad_kind", f"kind {kind!r:.20}")
            return RegionVersion(
                wire.version(h.get("version")), wire.hex64(h.get("version_hash"), "version_hash"), kind
            )
        except wire.BadEntry as exc:
            self.keys.skipped.skip(exc.reason, f"region {region}: {exc}")
            return None

    def versions(self) -> dict[str, RegionVersion | None]:
        """Every region with a version entry, and its version (None: the entry is damaged). A scan of the
        keyspace: for tools (``aurora gc``), not for a loop."""
        prefix = self.keys.key("region", "")
        found = self.keys.call(lambda: list(self.keys.r.scan_iter(match=prefix + "*", count=1000)))
        return {key[len(prefix) :]: self.version(key[len(prefix) :]) for key in found}

    def announce(self, region: str, version: int, seg: Segment) -> None:
        """Post a sealed, uploaded segment before its manifest exists (cut-through)."""
        fields = {"type": "segment", "version": version, "key": seg.key, "size": seg.size, "sha256": seg.sha256}
        self.keys.call(
            self.keys.r.xadd, self.keys.key("events", region), fields, maxlen=STREAM_MAXLEN, approximate=True
        )

    def last_event_id(self, region: str) -> str:
        """The id to read after to see only events posted from now on."""
        last = self.keys.call(self.keys.r.xrevrange, self.keys.key("events", region), count=1)
        return last[0][0] if last else "0-0"

    def events(self, region: str, after: str, *, block_ms: int = 1000, count: int = 1000) -> list[Event]:
        """Events of ``region`` after id ``after``, waiting up to ``block_ms`` for the first one."""
        reply = self.keys.xread({self.keys.key("events", region): after}, count=count, block=block_ms)
        return [self._event(region, eid, fields) for _stream, entries in reply or [] for eid, fields in entries]

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
            self.keys.skipped.skip(exc.reason, f"event {eid} of region {region}: {exc}")
            return Event(eid, "invalid", -1, fields)

    def rebuild(self, region: str, reader: Reader) -> RegionVersion | None:
        """Set ``region``'s version from its bucket (after Redis lost its state); never moves it back."""
        versions = reader.versions()
        if not versions:
            return self.version(region)
        m = reader.manifest(versions[-1])
        self.commit(region, m.version, m.version_hash, m.kind)
        return self.version(region)
