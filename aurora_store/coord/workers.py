"""The worker registry of a run (:attr:`Coordinator.workers
<aurora_store.coord.coordinator.Coordinator.workers>`): registrations, heartbeats and liveness, on
Redis's clock. A *worker* is any process that registers with the run: an actor (:class:`actor.worker.Actor`)
or a relay (:class:`relay.worker.Relay`); its id is its worker id (``--worker-id`` for an actor).

- ``workers`` (hash): worker id -> JSON registration (role, region, protocol, the version an actor has applied).
- ``alive`` (sorted set): worker id -> when its heartbeat expires (ms on the clock of the Redis node that
  holds the set). On a Redis Cluster there is one a shard, on the worker's shard slot
  (:meth:`Workers.alive_key`), so a beat goes where the worker's listener blocks.
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
from typing import Any, NamedTuple

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

# KEYS: roster, roster_seq.  Marks a worker changed.
_CHANGED = """
local function changed(wid) redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[2]), wid) end
"""


# KEYS: alive (the worker's shard's).  ARGV: worker id, ttl_ms.  The first half of a full beat: the
# worker's expiry moves on, on the clock of the node that holds it; returns that clock (ms), from which
# the worker's cheap beats (:class:`Beat`) reckon deadlines.
_BEAT_ALIVE = (
    LUA_NOW
    + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return now
"""
)

# KEYS: roster, roster_seq, workers, epoch.  ARGV: worker id, a new random epoch id.  The second half of
# a full beat, after its expiry moved on: the worker is marked changed (so a trainer that took it for
# dead sees it back: full beats are rare, a mark costs the trainer one registration read), and the
# epoch and whether the registration exists are returned.
_BEAT = (
    _CHANGED
    + """
changed(ARGV[1])
local e = redis.call('GET', KEYS[4])
if not e then
  e = ARGV[2]
  redis.call('SET', KEYS[4], e)
end
return {e, redis.call('HEXISTS', KEYS[3], ARGV[1])}
"""
)

# KEYS: roster, roster_seq, workers.  ARGV: worker id, registration JSON, or '' to remove it.  Writes
# (or removes) a registration and marks it changed.
_REGISTER = (
    _CHANGED
    + """
if ARGV[2] == '' then redis.call('HDEL', KEYS[3], ARGV[1]) else redis.call('HSET', KEYS[3], ARGV[1], ARGV[2]) end
changed(ARGV[1])
return 1
"""
)

# KEYS: alive (one shard's).  The ids of the workers alive now, on that node's clock.
_ALIVE = (
    LUA_NOW
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""
)


class FullBeat(NamedTuple):
    """What a full beat (:meth:`Workers.beat_full`) learned."""

    lost: bool
    """This worker's state in Redis is gone (it registers again)."""
    node_ms: int | None
    """The clock (ms) of the node holding its expiry when it moved (None: a reply it could not read)."""
    local_ms: float
    """This machine's clock (ms) when that answer came."""


class Workers:
    """The worker registry of a run: registrations, heartbeats (which also read the epoch) and liveness.

    A worker's liveness entry is in the ``alive`` set of its shard (:meth:`alive_key`; on one server
    there is one ``alive``), beside its own streams, so on a Redis Cluster the fleet's beats spread over
    the masters as its blocking reads do, and a listener sends its beat and its read to one node in one
    round trip. Its registration is on the run's control slot. A change to both is two steps, liveness
    first: whoever sees a worker marked changed then finds its expiry already moved on."""

    def __init__(self, keys: Keyspace, epoch: Epoch) -> None:
        self.keys = keys
        self.epoch = epoch
        self._beat_alive = keys.script(_BEAT_ALIVE)
        self._beat = keys.script(_BEAT)
        self._register = keys.script(_REGISTER)
        self._alive = keys.script(_ALIVE, inline=True)
        self._docs: dict[str, dict[str, Any]] = {}
        """The registrations this registry wrote, by worker id (merged into by :meth:`update`)."""

    def _keys(self) -> list[str]:
        return [self.keys.key(k) for k in ("roster", "roster_seq", "workers")]

    def alive_key(self, worker_id: str) -> str:
        """The ``alive`` set that holds ``worker_id``'s expiry (its shard's, on a cluster)."""
        return self.keys.actor_key(worker_id, "alive")

    def alive_keys(self) -> list[str]:
        """Every ``alive`` set of the run (one on one server, one a shard on a cluster)."""
        return self.keys.sharded("alive")

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
        self.keys.call(self._beat_alive, keys=[self.alive_key(wid)], args=[wid, int(ttl_s * 1000)])
        self.keys.call(self._register, keys=self._keys(), args=[wid, json.dumps(doc)])
        self._docs[wid] = doc
        return wid

    def heartbeat(self, worker_id: str, ttl_s: float = 15.0) -> bool:
        """Beat in full (two round trips, which also check the epoch); True if this worker's state in
        Redis is gone: Redis lost its state since the last check, or the registration was removed (a
        worker long taken for dead is pruned). Either way the worker registers again; :meth:`Epoch.lost`
        then says so once too. A worker that beats often uses a :class:`Beat`, which beats in full only
        when one ZADD cannot do."""
        return self.beat_full(worker_id, ttl_s).lost

    def beat_full(self, worker_id: str, ttl_s: float) -> FullBeat:
        """:meth:`heartbeat`, with the two clocks a :class:`Beat` reckons its cheap beats' deadlines from."""
        now = self.keys.call(self._beat_alive, keys=[self.alive_key(worker_id)], args=[worker_id, int(ttl_s * 1000)])
        after = time.time() * 1000
        keys = [*self._keys(), self.epoch.key]
        reply = self.keys.call(self._beat, keys=keys, args=[worker_id, secrets.token_hex(8)])
        if not (isinstance(reply, list) and len(reply) == 2):
            self.keys.skipped.skip("bad_beat", repr(reply)[:60])
            return FullBeat(False, None, after)
        lost = self.epoch.saw(reply[0])
        if reply[1] != 1 and not lost:
            log.warning("worker %s: its registration is gone from Redis; registering again", worker_id)
            self.epoch.mark_lost()
            lost = True
        try:
            return FullBeat(lost, int(now), after)
        except (TypeError, ValueError):
            self.keys.skipped.skip("bad_beat", repr(now)[:60])
            return FullBeat(lost, None, after)

    def beat_cheap(self, worker_id: str, deadline_ms: int) -> bool:
        """Move ``worker_id``'s expiry to ``deadline_ms`` (its node's clock, as the caller reckons it) if it
        is alive in Redis: one ZADD (:meth:`cheap_beat`). False if it is not (never beat, expired and
        pruned, or Redis lost its state): the caller then beats with :meth:`heartbeat`."""
        return self.keys.call(self.keys.r.execute_command, *self.cheap_beat(worker_id, deadline_ms)) == 1

    def cheap_beat(self, worker_id: str, deadline_ms: int) -> tuple[Any, ...]:
        """The one command of a cheap beat, as sent: ZADD XX CH, whose answer is 1 exactly when the entry
        existed (the caller never sends the score it holds)."""
        return ("ZADD", self.alive_key(worker_id), "XX", "CH", deadline_ms, worker_id)

    def alive(self) -> set[str]:
        """The ids of the workers alive now (one round trip a node; each node's clock judges its own)."""

        def fill(pipe: Any) -> None:
            for key in self.alive_keys():
                self._alive(keys=[key], client=pipe)

        return {str(w) for ids in self.keys.pipeline(fill) for w in ids}

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
        self.keys.call(self._register, keys=self._keys(), args=[worker_id, json.dumps(merged)])
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
        """Leave: the registration goes (marked changed: the trainer sees it gone), then the expiry."""
        self.keys.call(self._register, keys=self._keys(), args=[worker_id, ""])
        self.keys.call(self.keys.r.zrem, self.alive_key(worker_id), worker_id)
        self._docs.pop(worker_id, None)


class Beat:
    """One worker's heartbeat at fleet scale: one ZADD a beat, with the deadline as its score.

    The full beat (:meth:`Workers.heartbeat`: two scripts, the expiry on the node's clock, then the mark
    that makes a trainer that took the worker for dead see it back, the epoch and the registration's
    check) runs only when one ZADD cannot do its work: the first beat, a beat that may come after this
    worker's expiry (the trainer must then see it back), one whose ZADD finds no entry (Redis lost its
    state, or the worker was pruned: the epoch and the registration are checked), and every
    :data:`RESYNC_S` to measure the node's clock again. A cheap beat's deadline is this machine's clock
    plus the offset to the node's clock measured by the last full beat (to within half its round trip),
    plus the lifetime; a beat is taken to come after the expiry if the last deadline is within
    :data:`MARGIN_S` of passing, so a skew below that margin never hides a comeback."""

    def __init__(self, workers: Workers, worker_id: str, ttl_s: float) -> None:
        self.workers, self.worker_id, self.ttl_ms = workers, worker_id, int(ttl_s * 1000)
        self._offset_ms: int | None = None
        """Redis's clock minus this machine's, in ms (from the last full beat)."""
        self._deadline_ms = 0
        """The expiry the last beat set (Redis's clock)."""
        self._synced = -math.inf
        """When (monotonic s) the last full beat ran."""
        self.fulls = 0
        """Full beats so far."""
        self.cheaps = 0
        """Cheap beats so far."""

    def __call__(self) -> bool:
        """Beat; True if this worker's state in Redis is gone (as :meth:`Workers.heartbeat`)."""
        deadline = self.plan()
        if deadline is not None and self.landed(deadline, self.workers.beat_cheap(self.worker_id, deadline)):
            return False
        return self.full()

    def plan(self) -> int | None:
        """The deadline of a cheap beat now (its command: :meth:`Workers.cheap_beat`), or None if this beat
        must be full (:meth:`full`). A caller that sends the command itself (with its blocking read, in
        one round trip) reports its answer to :meth:`landed`."""
        local = time.time() * 1000
        offset = self._offset_ms
        margin_ms = min(MARGIN_S * 1000, self.ttl_ms / 4)  # a short lifetime (tests) has less room
        if offset is None or time.monotonic() - self._synced > RESYNC_S:
            return None
        if local + offset + margin_ms >= self._deadline_ms:
            return None
        # never the score it holds: ZADD XX CH then answers 1 exactly when the entry exists
        return max(int(local) + offset + self.ttl_ms, self._deadline_ms + 1)

    def landed(self, deadline: int, existed: bool) -> bool:
        """A cheap beat's answer: True if it moved the expiry; False if the entry was gone (beat in full)."""
        if not existed:
            return False
        self._deadline_ms = deadline
        self.cheaps += 1
        return True

    def full(self) -> bool:
        """A full beat (:meth:`Workers.heartbeat`), which measures the node's clock again."""
        before = time.time() * 1000
        lost, now, after = self.workers.beat_full(self.worker_id, self.ttl_ms / 1000)
        self.fulls += 1
        if now is not None:
            self._offset_ms = int(now - (before + after) / 2)
            self._deadline_ms = now + self.ttl_ms
            self._synced = time.monotonic()
        return lost


RESYNC_S = 300.0
"""How often a :class:`Beat` measures Redis's clock again (a full beat)."""
MARGIN_S = 2.0
"""A :class:`Beat` whose last deadline is this close to passing (or a quarter of its lifetime, if
less) beats in full (it may come after the expiry, by Redis's clock: the trainer must see it back)."""
