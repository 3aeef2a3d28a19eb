"""The trainer's view of the live workers, kept up to date in O(what changed).

Workers mark themselves changed in the ``roster`` sorted set (score: a run-wide sequence number)
when they register, update their registration (an actor applied a version), leave, or beat again
after their heartbeat had expired; their expiry is in ``alive`` (score: ms on Redis's clock). A
:meth:`Roster.refresh` is one script: the registrations changed since the last sequence number it
saw, the workers whose heartbeat expired since the last refresh, and the pruning of workers dead
for longer than ``prune_after_s`` (their registration and liveness entries; the caller forgets
their per-actor keys). Nothing scans every worker, except the first refresh (and the first after
Redis lost its state, seen by the sequence number going back).

Registrations are hostile input: a damaged one is counted and treated as no worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aurora_store.coord import wire
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.workers import LUA_NOW

PRUNE_AFTER_S = 3600.0
"""A worker dead this long is removed from Redis (it registers again if it comes back)."""
BATCH = 5000
"""Changed registrations read per round trip (a first refresh of a large fleet takes several)."""

# KEYS: roster, roster_seq, alive, workers.  ARGV: last sequence seen, last refresh's time (ms), batch,
# prune age (ms).  Returns {now, current sequence, {wid, seq, expiry, registration}..., died, pruned}.
_REFRESH = (
    LUA_NOW
    + """
local cur = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local changed = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, ARGV[3])
for i = 1, #ids, 2 do
  local wid = ids[i]
  changed[#changed + 1] = {wid, ids[i + 1], redis.call('ZSCORE', KEYS[3], wid) or '',
                           redis.call('HGET', KEYS[4], wid) or ''}
end
local died = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[2], now)
local pruned = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[4]), 'LIMIT', 0, 100)
for _, wid in ipairs(pruned) do
  redis.call('ZREM', KEYS[3], wid)
  redis.call('ZREM', KEYS[1], wid)
  redis.call('HDEL', KEYS[4], wid)
end
return {now, cur, changed, died, pruned}
"""
)


@dataclass(slots=True)
class Changes:
    """What one refresh learned."""

    joined: set[str] = field(default_factory=set)
    """Workers alive now that were not (new, back, or updated)."""
    gone: set[str] = field(default_factory=set)
    """Workers that were alive and are no more (heartbeat expired, left, registration damaged)."""
    pruned: list[str] = field(default_factory=list)
    """Workers removed from Redis, long dead: forget their per-worker keys."""
    reloaded: bool = False
    """The whole roster was read again (first refresh, or Redis lost its state)."""


class Roster:
    """Live workers and their registrations, refreshed incrementally."""

    def __init__(self, coord: Coordinator, *, prune_after_s: float = PRUNE_AFTER_S) -> None:
        self.coord = coord
        self._refresh = coord.keys.script(_REFRESH)
        self.prune_ms = int(prune_after_s * 1000)
        self.docs: dict[str, dict[str, Any]] = {}
        """Alive workers' registrations, by worker id."""
        self.expiry: dict[str, int] = {}
        self.seq = 0
        self.since = 0
        self.round_trips = 0
        """Round trips refreshes made (one a refresh; more only while a large first read goes on)."""

    def reset(self) -> None:
        """Forget everything: the next refresh reads the whole roster."""
        self.docs.clear()
        self.expiry.clear()
        self.seq = self.since = 0

    def refresh(self) -> Changes:
        """Bring the view up to date (one round trip, more only while a large first read goes on)."""
        out = Changes(reloaded=self.seq == 0)
        before = set(self.docs)
        while True:
            keys = [self.coord.key(k) for k in ("roster", "roster_seq", "alive", "workers")]
            args = [self.seq, self.since, BATCH, self.prune_ms]
            reply = self.coord.call(self._refresh, keys=keys, args=args)
            self.round_trips += 1
            try:
                now, cur, changed, died, pruned = reply
                now, cur = int(now), int(cur)
            except (TypeError, ValueError):
                self.coord.skipped.skip("bad_roster", repr(reply)[:80])
                return out
            if cur < self.seq:  # the counter went back: Redis lost its state; read it all again
                self.reset()
                out.reloaded = True
                continue
            for entry in changed:
                self._changed(entry, now)
            for wid in died:
                self.docs.pop(str(wid), None)
                self.expiry.pop(str(wid), None)
            out.pruned += [str(w) for w in pruned]
            self.since = now
            if len(changed) < BATCH:
                break
        after = set(self.docs)
        out.joined = after - before
        out.gone = before - after
        return out

    def _changed(self, entry: Any, now: int) -> None:
        try:
            wid, seq, expiry, doc = (str(x) for x in entry)
            self.seq = max(self.seq, wire.uint(seq, "roster_seq"))
            wire.name(wid, "worker_id")
        except (TypeError, ValueError, wire.BadEntry) as exc:
            self.coord.skipped.skip("bad_roster", f"{str(entry)[:80]}: {exc}")
            return
        self.docs.pop(wid, None)
        self.expiry.pop(wid, None)
        if not doc or not expiry:
            return  # left, or never beat
        try:
            parsed = wire.json_object(doc, "registration")
            until = int(float(expiry))
        except (ValueError, OverflowError, wire.BadEntry) as exc:
            self.coord.skipped.skip(getattr(exc, "reason", "bad_expiry"), f"worker {wid!r:.80}: {exc}")
            return
        if until > now:
            self.docs[wid] = parsed
            self.expiry[wid] = until
