"""Rollout jobs in Redis: leases with deadlines and fencing tokens, results, throughput EMAs.

The trainer posts each step's prompts as jobs, each leased to one actor: the lease has a
deadline and a fencing token (a run-wide counter, new for every lease, starting at a random
offset whenever Redis has none, so tokens from before a flush never match leases after it),
and the job goes to that actor's inbox. An actor takes its jobs, generates, and submits
results tagged with the token, the version it generated with and that version's hash. The
trainer admits a result only if the token is still the job's (a reassigned job fences out
its old holder), the submitter is the lease's actor, the deadline has not passed, and the
version and hash match; everything else is dropped and the job is leased again. Admission
is one Lua script, so a job is admitted once. Deadlines are on the trainer's clock: it sets
them and it checks them. A holder still running a job renews its lease (:meth:`JobBoard.renew`):
the deadline moves on by the time that passed on the holder's own clock since its last renewal,
fenced by the token, never past the hold the trainer gave the lease; so a batch longer than a lease
keeps it while its holder lives, and one that stops (killed, paused, partitioned) loses it a lease
after its last renewal.

Push, not poll, and O(what changed): an actor's inbox is a stream (``jobs:{actor}``) it blocks
on together with its region's commits; open leases are in the ``deadlines`` sorted set (score:
deadline), so a sweep reads the expired ones only; leases not yet started are in ``untaken``.
Leases and admissions go in pipelines: a step's jobs are one round trip.

Results are hostile input (:mod:`aurora_store.coord.results`). Each one is removed from the
stream once the trainer has admitted or dropped it (``board.results.discard``), and the trainer
deletes a step's jobs once it has trained on it (:meth:`JobBoard.drop_jobs`), so Redis holds only
the steps in flight. A drop the actor can act on is told to it (``board.notices.tell``,
:mod:`aurora_store.coord.notices`). Throughputs are :mod:`aurora_store.coord.throughput`'s. The
board holds those three objects; each owns its keys and they share the coordinator's
:class:`~aurora_store.coord.keyspace.Keyspace`.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from aurora_store.coord import wire
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import JobError
from aurora_store.coord.lease import Lease, OpenJob, check_name, is_name, now_ms
from aurora_store.coord.notices import Notices
from aurora_store.coord.results import Result, ResultStream
from aurora_store.coord.throughput import Throughputs

ADMITTED_TTL_S = 3600.0
"""An admitted job's record is kept at most this long (to refuse late duplicates) if its trainer
does not delete it first (it does, two steps after training on it)."""
MAX_FENCE_START = 10**13
"""Fencing tokens start at a random offset below this (tokens stay below 10^14: Lua prints them exactly)."""
MAX_HOLD_S = 3600.0
"""How long a lease its holder keeps renewing may last at most, unless the trainer says otherwise."""
MAX_RENEW_MS = 600_000
"""The most one renewal moves a deadline on (a holder renews every few seconds)."""
INBOX_MAXLEN = 4096
"""Leases kept in an actor's inbox stream (approximate trim); the actor deletes those it takes."""

# KEYS: job, fence, inbox, open set, deadlines, untaken.  ARGV: job id, actor, deadline_ms, step, version,
# prompt JSON or '', a random start for the fencing counter if Redis has none, inbox maxlen, now_ms,
# hold_until_ms (how far its holder may renew it), '0' to leave the inbox to the caller (on a cluster the
# inbox is on the actor's shard slot, not the job's: KEYS[3] is then any key of the job's slot)
_LEASE = """
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'admitted' then return 0 end
if ARGV[6] == '' and not state then return -1 end
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('SET', KEYS[2], ARGV[7]) end
local token = redis.call('INCR', KEYS[2])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'step', ARGV[4], 'prompt', ARGV[6]) end
redis.call('HSET', KEYS[1], 'actor', ARGV[2], 'token', token, 'deadline_ms', ARGV[3], 'version', ARGV[5],
           'state', 'leased', 'hold_until_ms', ARGV[10])
redis.call('HINCRBY', KEYS[1], 'leases', 1)
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[6], ARGV[9], ARGV[1])
if ARGV[11] ~= '0' then redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'lease', ARGV[1] .. '|' .. token) end
return token
"""

# KEYS: job, open set, deadlines, untaken.  ARGV: job id, token, now_ms, version, how long an admitted job
# is kept (ms), actor
_ADMIT = """
local h = redis.call('HMGET', KEYS[1], 'state', 'token', 'deadline_ms', 'version', 'actor')
if not h[1] then return 'unknown_job' end
if h[1] == 'admitted' then return 'duplicate' end
if h[2] ~= ARGV[2] then return 'stale_lease' end
if h[5] ~= ARGV[6] then return 'wrong_actor' end
if tonumber(ARGV[3]) > (tonumber(h[3]) or -1) then return 'expired' end
if h[4] ~= ARGV[4] then return 'wrong_version' end
redis.call('HSET', KEYS[1], 'state', 'admitted', 'admitted_ms', ARGV[3])
redis.call('HDEL', KEYS[1], 'prompt')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
return 'ok:' .. h[3]
"""

# KEYS: job, deadlines.  ARGV: token, job id.  A holder gives its lease back: its deadline becomes 0, so
# the trainer's next sweep finds it expired and leases it again.
_RELEASE = """
local h = redis.call('HMGET', KEYS[1], 'state', 'token')
if h[1] ~= 'leased' or h[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'deadline_ms', 0)
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return 1
"""


# KEYS: job, deadlines.  ARGV: token, actor, job id, ms to add.  The holder of a lease it is still running moves
# its deadline on by the time that passed since its last renewal (measured on its own clock: deadlines stay on
# the trainer's), never past the lease's hold_until_ms; a lease given back (deadline 0), admitted, leased to
# another, no longer tracked or at its hold is left alone. Returns the new deadline (the same one when there
# is nothing to add yet), or 0.
_RENEW = """
local h = redis.call('HMGET', KEYS[1], 'state', 'token', 'actor', 'deadline_ms', 'hold_until_ms')
if h[1] ~= 'leased' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] then return 0 end
local deadline, hold = tonumber(h[4]), tonumber(h[5])
if not deadline or deadline <= 0 or not hold then return 0 end
if not redis.call('ZSCORE', KEYS[2], ARGV[3]) then return 0 end
if tonumber(ARGV[4]) <= 0 then return deadline end
local moved = math.min(deadline + tonumber(ARGV[4]), hold)
if moved <= deadline then return 0 end
redis.call('ZADD', KEYS[2], 'XX', moved, ARGV[3])
redis.call('HSET', KEYS[1], 'deadline_ms', moved)
redis.call('HINCRBY', KEYS[1], 'renewals', 1)
return moved
"""


# KEYS: job, untaken.  ARGV: token, actor, job id, now_ms.  The holder takes a lease from its inbox: if the job
# is still leased to it under that token, marked taken (and no longer untaken) and its fields returned (state,
# token, actor, step, version, deadline_ms, prompt); else 0. One step, so a job the trainer dropped or leased
# again meanwhile is never written (a mark after a separate read would make a record of it again).
_CLAIM = """
local h = redis.call('HMGET', KEYS[1], 'state', 'token', 'actor', 'step', 'version', 'deadline_ms', 'prompt')
if h[1] ~= 'leased' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'taken_token', ARGV[1], 'taken_ms', ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[3])
return h
"""


class JobBoard:
    """The jobs and leases of one run (under the coordinator's prefix), and the objects that own the rest
    of the board: :attr:`results`, :attr:`notices` and :attr:`throughputs`, on the same keyspace."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.keys = coord.keys
        self.results = ResultStream(self.keys)
        """The results actors submit and the trainer reads."""
        self.notices = Notices(self.keys)
        """What the trainer tells actors about their dropped results."""
        self.throughputs = Throughputs(self.keys)
        """The actors' throughput EMAs and probation."""
        self._lease = self.keys.script(_LEASE)
        self._admit = self.keys.script(_ADMIT)
        self._release = self.keys.script(_RELEASE)
        self._renew = self.keys.script(_RENEW)
        self._claim = self.keys.script(_CLAIM, inline=True)
        self._inbox_after: dict[str, str] = {}
        """Per actor, the inbox id this board has read up to (what :meth:`take` reads after)."""

    @property
    def r(self) -> Any:
        return self.keys.r

    @property
    def rb(self) -> Any:
        """A client that does not decode (results carry bytes)."""
        return self.keys.rb

    def _k(self, *parts: str) -> str:
        return self.keys.key(*parts)

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        return self.keys.call(fn, *args, **kw)

    def _pipeline(self, fill: Any) -> list[Any]:
        return self.keys.pipeline(fill)

    def inbox(self, actor: str) -> str:
        """The stream of leases sent to ``actor``."""
        return self.keys.actor_key(actor, "jobs", check_name(actor, "actor"))

    # ------------------------------------------------------------ trainer side

    def lease(
        self,
        job: str,
        actor: str,
        *,
        version: int,
        lease_s: float,
        step: int = -1,
        prompt: Mapping[str, Any] | None = None,
    ) -> int:
        """Lease ``job`` to ``actor`` (a new job when ``prompt``, a JSON object, is given); returns the
        fencing token, 0 if the job was already admitted."""
        return self.lease_many([(job, actor, prompt, step)], version=version, lease_s=lease_s)[0]

    def lease_many(
        self,
        items: Sequence[tuple[str, str, Mapping[str, Any] | None, int]],
        *,
        version: int,
        lease_s: float,
        hold_s: float = MAX_HOLD_S,
    ) -> list[int]:
        """Lease each ``(job, actor, prompt or None, step)`` in one round trip; the fencing tokens
        (0: already admitted). A job given no prompt must exist. Its holder may renew the lease
        (:meth:`renew`) while it runs the job, up to ``hold_s`` after now."""
        now = now_ms()
        hold_until = now + int(max(hold_s, lease_s) * 1000)
        calls: list[tuple[list[str], list[str | int]]] = []
        split = self.keys.cluster
        for job, actor, prompt, step in items:
            keys = [self._k("job", job), self._k("fence"), self._k("fence") if split else self.inbox(actor)]
            keys += [self._k("open"), self._k("deadlines"), self._k("untaken")]
            body = json.dumps(dict(prompt)) if prompt is not None else ""
            start = secrets.randbelow(MAX_FENCE_START)
            deadline = now + int(lease_s * 1000)
            args: list[str | int] = [job, actor, deadline, step, version, body, start, INBOX_MAXLEN, now, hold_until]
            calls.append((keys, [*args, "0" if split else ""]))
        tokens = [int(t) for t in self._pipeline(lambda p: [self._lease(keys=k, args=a, client=p) for k, a in calls])]
        for (job, *_), token in zip(items, tokens, strict=True):
            if token < 0:
                raise JobError(f"job {job!r} does not exist; give its prompt to post it")
        if split:
            leased = zip(items, tokens, strict=True)
            self._tell_inboxes([(actor, job, token) for (job, actor, *_), token in leased if token > 0])
        return tokens

    def _tell_inboxes(self, leases: Sequence[tuple[str, str, int]]) -> None:
        """On a cluster, put each ``(actor, job, token)`` lease in its actor's inbox (on the actor's shard
        slot, so not in the lease's script): one pipeline after the leases. A lease whose entry is lost (a
        node failed between the two) is never taken: its deadline passes and the sweep leases it again."""
        self._pipeline(
            lambda p: [
                p.xadd(self.inbox(actor), {"lease": f"{job}|{token}"}, maxlen=INBOX_MAXLEN, approximate=True)
                for actor, job, token in leases
            ]
        )

    def post(
        self,
        step: int,
        version: int,
        prompts: Sequence[Mapping[str, Any]],
        shares: Mapping[str, int],
        *,
        lease_s: float,
        tag: str,
        hold_s: float = MAX_HOLD_S,
    ) -> dict[str, str]:
        """Lease ``prompts`` to actors, ``shares[actor]`` each in order; returns job id -> actor."""
        if sum(shares.values()) != len(prompts):
            raise JobError(f"shares sum to {sum(shares.values())} but step {step} has {len(prompts)} prompts")
        items: list[tuple[str, str, Mapping[str, Any] | None, int]] = []
        it = iter(enumerate(prompts))
        for actor, n in shares.items():
            for _ in range(n):
                i, p = next(it)
                items.append((f"{tag}:{step}:{i}", actor, p, step))
        self.lease_many(items, version=version, lease_s=lease_s, hold_s=hold_s)
        return {job: actor for job, actor, _, _ in items}

    def expired(self, now: int, *, limit: int = 1000) -> list[str]:
        """Jobs whose lease deadline (ms, the trainer's clock) is at or before ``now``, oldest first;
        released leases (deadline 0) included. One round trip, whatever the number of open jobs."""
        return [job for job, _ in self.expired_leases(now, limit=limit)]

    def expired_leases(self, now: int, *, limit: int = 1000) -> list[tuple[str, int]]:
        """:meth:`expired`, each with its deadline: 0 for a lease its holder gave back (:meth:`release`)."""
        raw = self._call(self.r.zrangebyscore, self._k("deadlines"), "-inf", now, start=0, num=limit, withscores=True)
        return [(j, int(d) if math.isfinite(d) else 0) for j, d in raw if is_name(j)]  # -inf: anyone's write

    def untaken(self) -> dict[str, float]:
        """Jobs leased and not yet taken by their holder, with when they were leased (ms, the trainer's
        clock): what an idle actor may take over."""
        got = self._call(self.r.zrange, self._k("untaken"), 0, -1, withscores=True)
        return {j: float(t) for j, t in got if is_name(j)}

    def settle(self, jobs: Sequence[str]) -> None:
        """Stop tracking the deadlines of ``jobs`` (not this trainer's, or no longer wanted)."""
        if jobs:
            self._pipeline(lambda p: (p.zrem(self._k("deadlines"), *jobs), p.zrem(self._k("untaken"), *jobs)))

    def open_jobs(self) -> list[OpenJob]:
        """Jobs leased and not yet admitted (a read of every open job: for a trainer that starts, and
        for tests; the sweep reads only :meth:`expired`); a damaged job record is counted and dropped
        from the open set (a job the trainer posted is leased again by its sweep)."""
        jobs = sorted(j for j in self._call(self.r.smembers, self._k("open")))
        fields = ("step", "version", "actor", "deadline_ms", "state", "token", "taken_token")
        rows = self._pipeline(lambda p: [p.hmget(self._k("job", j), *fields) for j in jobs])
        out, gone = [], []
        for job, h in zip(jobs, rows, strict=True):
            if h[4] != "leased":
                gone.append(job)
                continue
            try:
                step = -1 if h[0] == "-1" else wire.uint(h[0], "step")
                parsed = OpenJob(
                    job,
                    step,
                    wire.version(h[1]),
                    wire.name(h[2], "actor"),
                    wire.uint(h[3], "deadline_ms"),
                    h[6] is not None and h[6] == h[5],
                )
            except wire.BadEntry as exc:
                self.coord.skipped.skip(exc.reason, f"job {job!r:.80}: {exc}")
                gone.append(job)
                continue
            out.append(parsed)
        if gone:
            self._call(self.r.srem, self._k("open"), *gone)
        return out

    def admit(self, res: Result, published: Mapping[int, str]) -> str:
        """'ok' if ``res`` is admitted now, else why not: unknown_job, duplicate, stale_lease,
        wrong_actor, expired, wrong_version, wrong_version_hash or the reason it is malformed."""
        return self.admit_within(res, published)[0]

    def admit_within(self, res: Result, published: Mapping[int, str]) -> tuple[str, int | None, int]:
        """:meth:`admit`, the deadline of the lease it was admitted under (None if refused) and the
        time (ms) the admission was judged at."""
        return self.admit_many([res], published)[0]

    def admit_many(self, results: Sequence[Result], published: Mapping[int, str]) -> list[tuple[str, int | None, int]]:
        """:meth:`admit_within` for each result, the scripts in one round trip."""
        at = now_ms()
        out: list[tuple[str, int | None, int] | None] = []
        calls: list[tuple[list[str], list[str | int]]] = []
        for res in results:
            if res.malformed is not None:
                out.append((res.malformed, None, at))
            elif published.get(res.version) != res.version_hash:
                out.append(("wrong_version_hash", None, at))
            else:
                out.append(None)
                keys = [self._k("job", res.job), self._k("open"), self._k("deadlines"), self._k("untaken")]
                calls.append((keys, [res.job, res.token, at, res.version, int(ADMITTED_TTL_S * 1000), res.actor]))
        replies = iter(self._pipeline(lambda p: [self._admit(keys=k, args=a, client=p) for k, a in calls]))
        done = []
        for o in out:
            if o is not None:
                done.append(o)
                continue
            why, _, deadline = str(next(replies)).partition(":")
            done.append((why, int(deadline) if why == "ok" and deadline.isdigit() else None, at))
        return done

    def forget(self, jobs: Sequence[str]) -> None:
        """Drop jobs (a restarted trainer drops its predecessor's unadmitted ones)."""
        self.drop_jobs(jobs)

    def drop_jobs(self, jobs: Sequence[str]) -> None:
        """Delete jobs and everything that tracks them, a few hundred per round trip (a trainer drops
        each step's jobs once it trained on them: Redis holds only the steps in flight)."""
        for i in range(0, len(jobs), 500):
            chunk = list(jobs[i : i + 500])

            def fill(p: Any, chunk: list[str] = chunk) -> None:
                for j in chunk:  # one key a DEL: a cluster's pipeline takes no multi-key DEL
                    p.delete(self._k("job", j))
                p.srem(self._k("open"), *chunk)
                p.zrem(self._k("deadlines"), *chunk)
                p.zrem(self._k("untaken"), *chunk)

            self._pipeline(fill)

    def forget_actors(self, actors: Sequence[str]) -> None:
        """Delete the per-actor keys of actors long gone (pruned from the roster): their inboxes, notices
        and throughputs, in one round trip."""
        names = [a for a in actors if is_name(a)]
        if not names:
            return

        def fill(p: Any) -> None:
            for a in names:  # one key a command: on a cluster the inboxes are on different slots
                p.delete(self.inbox(a))
            self.notices.forget(p, names)
            self.throughputs.forget(p, names)

        self._pipeline(fill)

    # ------------------------------------------------------------ actor side

    def take(self, actor: str, *, max_jobs: int, block_s: float = 1.0) -> list[Lease]:
        """Up to ``max_jobs`` jobs leased to ``actor``, waiting up to ``block_s`` for the first (0: do
        not wait). Entries whose lease was revoked since (re-leased elsewhere, admitted) are skipped,
        and so are malformed job records: their leases expire and the trainer leases them again."""
        inbox = self.inbox(actor)
        after = self._inbox_after.get(actor, "0-0")
        block = None if block_s <= 0 else max(int(block_s * 1000), 1)
        reply = self.keys.xread({inbox: after}, count=max_jobs, block=block)
        entries = [e for _s, got in reply or [] for e in got]
        if not entries:
            return []
        self._inbox_after[actor] = entries[-1][0]
        return self.claim(actor, entries)

    def rewind(self, actor: str) -> None:
        """Read ``actor``'s inbox from its start again (Redis lost its state: new ids may be lower)."""
        self._inbox_after.pop(actor, None)

    def claim(self, actor: str, entries: Sequence[tuple[str, dict[str, str]]]) -> list[Lease]:
        """The leases inbox ``entries`` name that are still ``actor``'s, marked taken; the entries are
        deleted from the inbox. One round trip, whatever the number; each job is checked and marked in one
        step (:data:`_CLAIM`)."""
        wanted: list[tuple[str, str]] = []
        for _eid, f in entries:
            job, _, token = str(f.get("lease", "")).rpartition("|")
            if is_name(job) and token.isdigit():
                wanted.append((job, token))
            else:
                self.coord.skipped.skip("bad_inbox", f"inbox entry of {actor}: {str(f)[:80]}")
        at = now_ms()
        untaken = self._k("untaken")

        def fill(p: Any) -> None:
            for job, token in wanted:
                self._claim(keys=[self._k("job", job), untaken], args=[token, actor, job, at], client=p)
            if entries:
                p.xdel(self.inbox(actor), *(eid for eid, _ in entries))

        rows = self._pipeline(fill)[: len(wanted)] if entries else []
        out = []
        for (job, token), h in zip(wanted, rows, strict=True):
            if not isinstance(h, list) or len(h) != 7:
                continue  # no longer this actor's lease (admitted, leased again, dropped)
            try:
                step = -1 if h[3] == "-1" else wire.uint(h[3], "step")
                lease = Lease(
                    job,
                    wire.uint(token, "token"),
                    step,
                    wire.version(h[4]),
                    wire.uint(h[5], "deadline_ms"),
                    wire.json_object(h[6], "prompt"),
                )
            except wire.BadEntry as exc:  # its lease expires and the trainer leases the job again
                self.coord.skipped.skip(exc.reason, f"job {job!r:.80}: {exc}")
                continue
            out.append(lease)
        return out

    def renew(self, renewals: Sequence[tuple[str, int, str, int]]) -> list[int]:
        """Move on the deadline of each ``(job, token, holder, ms)`` by ``ms`` (the time since its last
        renewal, on the holder's clock; at most :data:`MAX_RENEW_MS`), fenced by the token and holder, never
        past the hold its trainer gave it: one round trip. The new deadlines; 0 where the lease is no longer
        the holder's to renew (admitted, given back, leased again, past its hold, or a damaged record)."""
        calls: list[tuple[list[str], list[str | int]]] = []
        for job, token, actor, ms in renewals:
            keys = [self._k("job", check_name(job, "job")), self._k("deadlines")]
            calls.append((keys, [int(token), check_name(actor, "actor"), job, max(0, min(int(ms), MAX_RENEW_MS))]))
        if not calls:
            return []
        return [int(x) for x in self._pipeline(lambda p: [self._renew(keys=k, args=a, client=p) for k, a in calls])]

    def queued(self, actor: str, *, limit: int = 1024) -> list[tuple[str, int]]:
        """The ``(job, token)`` of the leases waiting in ``actor``'s inbox that this board has not taken yet
        (a busy holder renews them too: they are its next batch). Malformed entries are skipped."""
        after = self._inbox_after.get(actor, "0-0")
        got = self._call(self.r.xrange, self.inbox(actor), min=f"({after}", max="+", count=limit)
        out = []
        for _eid, f in got or []:
            job, _, token = str(f.get("lease", "")).rpartition("|")
            if is_name(job) and token.isdigit():
                out.append((job, int(token)))
        return out

    def release(self, lease: Lease) -> bool:
        """Give a lease back early (the actor cannot serve it); the trainer re-leases it."""
        keys = [self._k("job", lease.job), self._k("deadlines")]
        return bool(self._call(self._release, keys=keys, args=[lease.token, lease.job]))

    def close(self) -> None:
        self.keys.close_binary()
