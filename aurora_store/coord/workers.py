"""The worker registry of a run (:attr:`Coordinator.workers
<aurora_store.coord.coordinator.Coordinator.workers>`): registrations, heartbeats and liveness, on
Redis's clock. A *worker* is any process that registers with the run: an actor (:class:`actor.worker.Actor`)
or a relay (:class:`relay.worker.Relay`); its id is its worker id (``--worker-id`` for an actor).

- ``workers`` (hash): worker id -> JSON registration (role, region, protocol, the version an actor has applied).
- ``alive`` (sorted set): worker id -> when its heartbeat expires (ms on Redis's clock).
- ``roster`` (sorted set): worker id -> the ``roster_seq`` number of its last change (registered,
  updated, gone, back after expiring), so a reader asks only what changed
  (:class:`~aurora_store.coord.roster.Roster`).
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import time
import uuid
from typing import Any

from aurora_store.coord import wire
from aurora_store.coord.epoch import Epoch
from aurora_store.coord.keyspace import Keyspace

log = logging.getLogger("aurora.coord")

VERSIONS_BATCH = 1000
"""Live workers' registrations read per round trip by :meth:`Workers.versions`."""

PROTOCOL = 2
"""The coordination protocol workers declare when they register: 2 is push (job inboxes and commits
as streams, liveness in ``alive``); a trainer leases only to actors that speak its protocol."""

# Redis's clock in ms, inside a script (liveness is judged on one clock, whatever the workers' clocks say)
LUA_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: roster, roster_seq.  Marks ARGV[1] changed (after LUA_NOW).
_CHANGED = """
local function changed(wid) redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[2]), wid) end
"""


# KEYS: roster, roster_seq, alive, workers, epoch.  ARGV: worker id, ttl_ms, a new random epoch id.
# A heartbeat: the worker's expiry moves on; one that had expired (or was never alive) is marked
# changed, so the trainer sees it back. Returns the epoch, whether the registration exists, and
# Redis's clock (ms), from which the worker's cheap beats (:class:`Beat`) reckon deadlines.
_BEAT = (
    LUA_NOW
    + _CHANGED
    + """
local prev = redis.call('ZSCORE', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
if (not prev) or tonumber(prev) < now then changed(ARGV[1]) end
local e = redis.call('GET', KEYS[5])
if not e then
  e = ARGV[3]
  redis.call('SET', KEYS[5], e)
end
return {e, redis.call('HEXISTS', KEYS[4], ARGV[1]), now}
"""
)

# KEYS: roster, roster_seq, alive, workers.  ARGV: worker id, registration JSON, ttl_ms (or '' to keep
# the expiry as it is).  Writes a registration and marks it changed.
_REGISTER = (
    LUA_NOW
    + _CHANGED
    + """
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[1]) end
changed(ARGV[1])
return 1
"""
)

# KEYS: roster, roster_seq, alive, workers.  ARGV: worker id.  A worker leaves.
_UNREGISTER = (
    LUA_NOW
    + _CHANGED
    + """
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
changed(ARGV[1])
return 1
"""
)

# KEYS: alive.  The ids of the workers alive now.
_ALIVE = (
    LUA_NOW
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""
)


class Workers:
    """The worker registry of a run: registrations, heartbeats (which also read the epoch) and liveness."""

    def __init__(self, keys: Keyspace, epoch: Epoch) -> None:
        self.keys = keys
        self.epoch = epoch
        self._beat = keys.script(_BEAT)
        self._register = keys.script(_REGISTER)
        self._unregister = keys.script(_UNREGISTER)
        self._alive = keys.script(_ALIVE)
        self._docs: dict[str, dict[str, Any]] = {}
        """The registrations this registry wrote, by worker id (merged into by :meth:`update`)."""

    def _keys(self) -> list[str]:
        return [self.keys.key(k) for k in ("roster", "roster_seq", "alive", "workers")]

    def register(
        self,
        role: str,
        region: str,
        *,
        ttl_s: float = 15.0,
        worker_id: str | None = None,
        info: dict[str, Any] | None = None,
    ) -> str:
        """Register a worker (alive for ``ttl_s`` from now, then as long as it beats); returns its id."""
        wid = worker_id or f"{role}-{region}-{uuid.uuid4().hex[:8]}"
        doc = {"role": role, "region": region, "protocol": PROTOCOL, "started_ms": int(time.time() * 1000)}
        doc.update(info or {})
        self.keys.call(self._register, keys=self._keys(), args=[wid, json.dumps(doc), int(ttl_s * 1000)])
        self._docs[wid] = doc
        return wid

    def heartbeat(self, worker_id: str, ttl_s: float = 15.0) -> bool:
        """Beat (one round trip, which also checks the epoch); True if this worker's state in Redis is
        gone: Redis lost its state since the last check, or the registration was removed (a worker
        long taken for dead is pruned). Either way the worker registers again; :meth:`Epoch.lost`
        then says so once too. A script of five commands: a worker that beats often uses a
        :class:`Beat`, which runs it only when one ZADD cannot do."""
        return self._exact(worker_id, ttl_s)[0]

    def _exact(self, worker_id: str, ttl_s: float) -> tuple[bool, int | None]:
        """:meth:`heartbeat`, and Redis's clock (ms) when it ran (None on a reply it could not read)."""
        keys = [*self._keys(), self.epoch.key]
        args = [worker_id, int(ttl_s * 1000), secrets.token_hex(8)]
        reply = self.keys.call(self._beat, keys=keys, args=args)
        if not (isinstance(reply, list) and len(reply) == 3):
            self.keys.skipped.skip("bad_beat", repr(reply)[:60])
            return False, None
        lost = self.epoch.saw(reply[0])
        if reply[1] != 1 and not lost:
            log.warning("worker %s: its registration is gone from Redis; registering again", worker_id)
            self.epoch.mark_lost()
            lost = True
        try:
            return lost, int(reply[2])
        except (TypeError, ValueError):
            self.keys.skipped.skip("bad_beat", repr(reply)[:60])
            return lost, None

    def beat_cheap(self, worker_id: str, deadline_ms: int) -> bool:
        """Move ``worker_id``'s expiry to ``deadline_ms`` (Redis's clock, as the caller reckons it) if it
        is alive in Redis: one ZADD. False if it is not (never beat, expired and pruned, or Redis lost
        its state): the caller then beats with :meth:`heartbeat`."""
        changed = self.keys.call(self.keys.r.zadd, self.keys.key("alive"), {worker_id: deadline_ms}, xx=True, ch=True)
        return changed == 1

    def alive(self) -> set[str]:
        """The ids of the workers alive now (one round trip; Redis's clock)."""
        return {str(w) for w in self.keys.call(self._alive, keys=[self.keys.key("alive")])}

    def registrations(self, *, alive_only: bool = True) -> dict[str, dict[str, Any]]:
        """Registered workers (those alive unless ``alive_only`` is False); a damaged registration is
        counted and skipped. Reads every worker: for tools and tests; the trainer's loop reads only
        what changed (:class:`~aurora_store.coord.roster.Roster`)."""
        raw = self.keys.call(self.keys.r.hgetall, self.keys.key("workers"))
        alive = self.alive() if alive_only else None
        out = {}
        for wid, doc in raw.items():
            if alive is not None and wid not in alive:
                continue
            try:
                wire.name(wid, "worker_id")
                parsed = wire.json_object(doc, "registration")
            except wire.BadEntry as exc:
                self.keys.skipped.skip(exc.reason, f"worker {wid!r:.80}: {exc}")
                continue
            out[wid] = parsed
        return out

    def update(self, worker_id: str, **fields: Any) -> None:
        """Merge ``fields`` (e.g. the version an actor holds) into a worker's registration, in one round
        trip when this registry registered it (a damaged registration is replaced)."""
        old = self._docs.get(worker_id)
        if old is None:
            doc = self.keys.call(self.keys.r.hget, self.keys.key("workers"), worker_id)
            try:
                old = wire.json_object(doc, "registration") if doc else {}
            except wire.BadEntry as exc:
                self.keys.skipped.skip(exc.reason, f"worker {worker_id}: {exc}")
                old = {}
        merged = {**old, **fields}
        self.keys.call(self._register, keys=self._keys(), args=[worker_id, json.dumps(merged), ""])
        self._docs[worker_id] = merged

    def versions(self) -> tuple[dict[str, int], list[str]]:
        """The version each live actor has applied, by ``actor {id} in {region}``, and the live workers whose
        registration could not be read (counted as skipped too). Served from the liveness registry: the
        ids alive now (a range of ``alive``), then only their registrations, :data:`VERSIONS_BATCH` a round
        trip; so for ``aurora gc`` it costs what the live fleet does, never every worker ever registered."""
        applied: dict[str, int] = {}
        unreadable: list[str] = []
        alive = sorted(self.alive())
        for at in range(0, len(alive), VERSIONS_BATCH):
            ids = alive[at : at + VERSIONS_BATCH]
            docs = self.keys.call(self.keys.r.hmget, self.keys.key("workers"), ids)
            for wid, doc in zip(ids, docs, strict=True):
                if doc is None:
                    continue  # left (or was pruned) since: it registers again, from the latest version
                try:
                    parsed = wire.json_object(doc, "registration")
                    if parsed.get("role") == "actor" and "version" in parsed:
                        v = parsed["version"]  # a JSON number: what update wrote
                        v = str(v) if isinstance(v, int) and not isinstance(v, bool) else v
                        applied[f"actor {wire.name(wid, 'worker_id')} in {parsed.get('region')!s:.40}"] = wire.version(
                            v
                        )
                except wire.BadEntry as exc:
                    self.keys.skipped.skip(exc.reason, f"worker {wid!r:.80}: {exc}")
                    unreadable.append(f"worker {wid!r:.80}: {exc}")
        return applied, unreadable

    def unregister(self, worker_id: str) -> None:
        self.keys.call(self._unregister, keys=self._keys(), args=[worker_id])
        self._docs.pop(worker_id, None)


class Beat:
    """One worker's heartbeat at fleet scale: one ZADD a beat, with the deadline as its score.

    The full beat (:meth:`Workers.heartbeat`: a script of five commands on Redis's clock, which also
    checks the epoch and marks a worker back from expiry changed for the trainer) runs only when one
    ZADD cannot do its work: the first beat, a beat that may come after this worker's expiry (the
    trainer must then see it back), one whose ZADD finds no entry (Redis lost its state, or the worker
    was pruned: the epoch and the registration are checked), and every :data:`RESYNC_S` to measure
    Redis's clock again. A cheap beat's deadline is this machine's clock plus the offset to Redis's
    clock measured by the last full beat (to within half its round trip), plus the lifetime; a beat
    is taken to come after the expiry if the last deadline is within :data:`MARGIN_S` of passing,
    so a skew below that margin never hides a comeback."""

    def __init__(self, workers: Workers, worker_id: str, ttl_s: float) -> None:
        self.workers, self.worker_id, self.ttl_ms = workers, worker_id, int(ttl_s * 1000)
        self._offset_ms: int | None = None
        """Redis's clock minus this machine's, in ms (from the last full beat)."""
        self._deadline_ms = 0
        """The expiry the last beat set (Redis's clock)."""
        self._synced = -math.inf
        """When (monotonic s) the last full beat ran."""
        self.full = 0
        self.cheap = 0

    def __call__(self) -> bool:
        """Beat; True if this worker's state in Redis is gone (as :meth:`Workers.heartbeat`)."""
        local = time.time() * 1000
        offset = self._offset_ms
        margin_ms = min(MARGIN_S * 1000, self.ttl_ms / 4)  # a short lifetime (tests) has less room
        fresh = offset is not None and time.monotonic() - self._synced <= RESYNC_S
        if fresh and offset is not None and local + offset + margin_ms < self._deadline_ms:
            # never the score it holds: ZADD XX CH then answers 1 exactly when the entry exists
            deadline = max(int(local) + offset + self.ttl_ms, self._deadline_ms + 1)
            if self.workers.beat_cheap(self.worker_id, deadline):
                self._deadline_ms = deadline
                self.cheap += 1
                return False
        return self._full()

    def _full(self) -> bool:
        before = time.time() * 1000
        lost, now = self.workers._exact(self.worker_id, self.ttl_ms / 1000)
        self.full += 1
        if now is not None:
            self._offset_ms = int(now - (before + time.time() * 1000) / 2)
            self._deadline_ms = now + self.ttl_ms
            self._synced = time.monotonic()
        return lost


RESYNC_S = 300.0
"""How often a :class:`Beat` measures Redis's clock again (a full beat)."""
MARGIN_S = 2.0
"""A :class:`Beat` whose last deadline is this close to passing (or a quarter of its lifetime, if
less) beats in full (it may come after the expiry, by Redis's clock: the trainer must see it back)."""
