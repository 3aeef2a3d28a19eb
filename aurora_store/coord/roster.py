"""The trainer's view of the live workers, kept up to date in O(what changed).

Workers mark themselves changed in the ``roster`` sorted set (score: a run-wide sequence number)
when they register, update their registration (an actor applied a version), leave, or beat in full
(as one back after its heartbeat had expired does); their expiry is in ``alive`` (score: ms on the
clock of the node that holds it; one set a shard on a Redis Cluster, :meth:`Workers.alive_key
<aurora_store.coord.workers.Workers.alive_key>`). A :meth:`Roster.refresh` is one pipeline (one round
trip on one server, one a node on a cluster): the registrations changed since the last sequence number
it saw (on the control slot), and from every ``alive`` set the workers whose heartbeat expired since
the last refresh. A worker that is new to the view (registered, or back) costs one more round trip,
for its expiry. Workers dead for longer than ``prune_after_s`` are pruned: their registrations (unless
they beat again meanwhile), then their liveness entries; the caller forgets their per-actor keys.
Nothing scans every worker, except the first refresh (and the first after Redis lost its state, seen
by the sequence number going back).

Registrations are hostile input: a damaged one is counted and treated as no worker.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from aurora_store.coord import wire
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.workers import LUA_NOW

PRUNE_AFTER_S = 3600.0
"""A worker dead this long is removed from Redis (it registers again if it comes back)."""
BATCH = 5000
"""Changed registrations read per round trip (a first refresh of a large fleet takes several)."""
PRUNE_BATCH = 100
"""Workers pruned per ``alive`` set and refresh."""

# KEYS: roster, roster_seq, workers.  ARGV: last sequence seen, batch.  Returns {current sequence,
# {wid, seq, registration}...}.
_CHANGED = """
local cur = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local changed = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, ARGV[2])
for i = 1, #ids, 2 do
  changed[#changed + 1] = {ids[i], ids[i + 1], redis.call('HGET', KEYS[3], ids[i]) or ''}
end
return {cur, changed}
"""

# KEYS: alive (one set).  ARGV: last refresh's time on this node (ms), prune age (ms), prune batch.
# Returns {now, died since, long dead}.
_DIED = (
    LUA_NOW
    + """
local died = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], now)
return {now, died, redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]), 'LIMIT', 0, ARGV[3])}
"""
)

# KEYS: alive (one set).  ARGV: workers.  Returns {now, their expiries ('' if none)}.
_EXPIRIES = (
    LUA_NOW
    + """
local expiries = {}
for i = 1, #ARGV do expiries[i] = redis.call('ZSCORE', KEYS[1], ARGV[i]) or '' end
return {now, expiries}
"""
)

# KEYS: roster, workers.  ARGV: the sequence the refresh read up to, then workers long dead.  Removes the
# registrations of those not marked changed since (one that beat again keeps its); returns them.
_FORGET = """
local gone = {}
for i = 2, #ARGV do
  local seq = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if (not seq) or tonumber(seq) <= tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    gone[#gone + 1] = ARGV[i]
  end
end
return gone
"""

# KEYS: alive (one set).  ARGV: the expiry at or below which an entry is long dead, then workers.
# Removes those still long dead (not those that beat since).
_PRUNE = """
local n = 0
for i = 2, #ARGV do
  local e = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if e and tonumber(e) <= tonumber(ARGV[1]) then n = n + redis.call('ZREM', KEYS[1], ARGV[i]) end
end
return n
"""


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
        keys = coord.keys
        # every refresh pipelines them: sent whole, they cost no SCRIPT EXISTS round trip
        self._changed = keys.script(_CHANGED, inline=True)
        self._died, self._expiries = keys.script(_DIED, inline=True), keys.script(_EXPIRIES, inline=True)
        self._forget, self._prune = keys.script(_FORGET), keys.script(_PRUNE, inline=True)
        self.prune_ms = int(prune_after_s * 1000)
        self.docs: dict[str, dict[str, Any]] = {}
        """Alive workers' registrations, by worker id."""
        self.seq = 0
        self.since: dict[str, int] = {}
        """Each ``alive`` set's last refresh, on its node's clock (ms)."""
        self.round_trips = 0
        """Round trips refreshes made (one a refresh, counting a pipeline over a cluster's nodes as one;
        one more when a worker joins, while a large first read goes on, or to prune)."""

    def reset(self) -> None:
        """Forget everything: the next refresh reads the whole roster."""
        self.docs.clear()
        self.seq = 0
        self.since.clear()

    def refresh(self) -> Changes:
        """Bring the view up to date (see the module)."""
        out = Changes(reloaded=self.seq == 0)
        before = set(self.docs)
        sets = self.coord.workers.alive_keys()
        control = [self.coord.key(k) for k in ("roster", "roster_seq", "workers")]
        while True:

            def fill(pipe: Any) -> None:
                self._changed(keys=control, args=[self.seq, BATCH], client=pipe)
                for key in sets:
                    self._died(keys=[key], args=[self.since.get(key, 0), self.prune_ms, PRUNE_BATCH], client=pipe)

            reply, *died = self.coord.keys.pipeline(fill)
            self.round_trips += 1
            try:
                cur, changed = int(reply[0]), list(reply[1])
            except (TypeError, ValueError, IndexError):
                self.coord.skipped.skip("bad_roster", repr(reply)[:80])
                return out
            if cur < self.seq:  # the counter went back: Redis lost its state; read it all again
                self.reset()
                out.reloaded = True
                continue
            old = self._dead(sets, died)
            entries = [self._entry(e) for e in changed]
            self._join(self._changed_docs(entries))  # a Redis failure here: the next refresh reads them again
            self.seq = max([self.seq, *(seq for _wid, seq, _doc in entries if seq is not None)])
            if old:
                out.pruned += self._prune_long_dead(old)
            if len(changed) < BATCH:
                break
        after = set(self.docs)
        out.joined = after - before
        out.gone = before - after
        return out

    def _dead(self, sets: list[str], replies: list[Any]) -> dict[str, list[str]]:
        """Each ``alive`` set's answer: who died since the last refresh leaves the view; returns the long
        dead, by set."""
        old: dict[str, list[str]] = {}
        for key, reply in zip(sets, replies, strict=True):
            try:
                now, died, long_dead = int(reply[0]), list(reply[1]), list(reply[2])
            except (TypeError, ValueError, IndexError) as exc:
                self.coord.skipped.skip("bad_roster", f"alive set {key}: {exc}: {repr(reply)[:80]}")
                continue
            for wid in died:
                self.docs.pop(str(wid), None)
            if long_dead:
                old[key] = [str(w) for w in long_dead]
            self.since[key] = now
        return old

    def _entry(self, entry: Any) -> tuple[str | None, int | None, str]:
        """A changed worker's id, sequence number and registration (hostile: checked; what fails its
        check is None, counted, and skipped)."""
        try:
            wid, seq, doc = (str(x) for x in entry)
        except (TypeError, ValueError) as exc:
            self.coord.skipped.skip("bad_roster", f"{str(entry)[:80]}: {exc}")
            return None, None, ""
        try:
            number: int | None = wire.uint(seq, "roster_seq")
        except wire.BadEntry as exc:
            self.coord.skipped.skip(exc.reason, f"{str(entry)[:80]}: {exc}")
            number = None
        try:
            return wire.name(wid, "worker_id"), number, doc
        except wire.BadEntry as exc:
            self.coord.skipped.skip(exc.reason, f"{str(entry)[:80]}: {exc}")
            return None, number, doc

    def _changed_docs(self, entries: list[tuple[str | None, int | None, str]]) -> dict[str, dict[str, Any]]:
        """Apply changed registrations: one that left or is damaged leaves the view, one in the view is
        updated; returns those new to it (they join once their expiry says they are alive)."""
        new: dict[str, dict[str, Any]] = {}
        for wid, _seq, doc in entries:
            if wid is None:
                continue
            parsed = None
            if doc:
                try:
                    parsed = wire.json_object(doc, "registration")
                except wire.BadEntry as exc:
                    self.coord.skipped.skip(exc.reason, f"worker {wid!r:.80}: {exc}")
            if parsed is None:
                self.docs.pop(wid, None)
                new.pop(wid, None)
            elif wid in self.docs:
                self.docs[wid] = parsed
            else:
                new[wid] = parsed
        return new

    def _join(self, new: dict[str, dict[str, Any]]) -> None:
        """Workers new to the view join it if their expiry (read now, one round trip) is to come."""
        if not new:
            return
        by_set: dict[str, list[str]] = defaultdict(list)
        for wid in new:
            by_set[self.coord.workers.alive_key(wid)].append(wid)
        sets = list(by_set)

        def fill(pipe: Any) -> None:
            for key in sets:
                self._expiries(keys=[key], args=by_set[key], client=pipe)

        replies = self.coord.keys.pipeline(fill)
        self.round_trips += 1
        for key, reply in zip(sets, replies, strict=True):
            try:
                now, expiries = int(reply[0]), [str(e) for e in reply[1]]
                if len(expiries) != len(by_set[key]):
                    raise ValueError(f"{len(expiries)} expiries for {len(by_set[key])} workers")
            except (TypeError, ValueError, IndexError) as exc:
                self.coord.skipped.skip("bad_roster", f"alive set {key}: {exc}: {repr(reply)[:80]}")
                continue
            for wid, expiry in zip(by_set[key], expiries, strict=True):
                try:
                    alive = bool(expiry) and int(float(expiry)) > now
                except (ValueError, OverflowError) as exc:
                    self.coord.skipped.skip("bad_expiry", f"worker {wid!r:.80}: {exc}")
                    continue
                if alive:
                    self.docs[wid] = new[wid]

    def _prune_long_dead(self, old: dict[str, list[str]]) -> list[str]:
        """Remove workers dead longer than the prune age: their registrations first (not of one marked
        changed since this refresh read: it beat again), then their liveness entries (not of one that
        beat since). Either step failing leaves what the next refresh finds and finishes."""
        keys = [self.coord.key("roster"), self.coord.key("workers")]
        ids = [wid for wids in old.values() for wid in wids]
        gone = {str(w) for w in self.coord.call(self._forget, keys=keys, args=[self.seq, *ids])}
        cutoff = {key: self.since[key] - self.prune_ms for key in old}

        def fill(pipe: Any) -> None:
            for key, wids in old.items():
                self._prune(keys=[key], args=[cutoff[key], *(w for w in wids if w in gone)], client=pipe)

        self.coord.keys.pipeline(fill)
        self.round_trips += 2
        for wid in gone:
            self.docs.pop(wid, None)
        return sorted(gone)
