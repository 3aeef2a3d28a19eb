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
them and it checks them.

Results are hostile input (:mod:`aurora_store.coord.wire`). Each one is removed from the
stream once the trainer has admitted or dropped it (:meth:`JobBoard.discard`), and an
admitted job's prompt is dropped with it, so Redis holds only the steps in flight. A drop the
actor can act on is told to it (:meth:`JobBoard.tell`, :meth:`JobBoard.notices`).
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aurora_store.coord import wire
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import JobError
from aurora_store.coord.schedule import ema

RESULTS_MAXLEN = 100_000
ADMITTED_TTL_S = 3600.0
"""An admitted job's record is kept this long (to refuse late duplicates), then Redis drops it."""
MAX_RESULT_BYTES = 8 << 20
"""A result payload above this is refused by the actor before it reaches Redis (and by the trainer unread)."""
MAX_FENCE_START = 10**13
"""Fencing tokens start at a random offset below this (tokens stay below 10^14: Lua prints them exactly)."""
NOTICES_MAXLEN = 64
"""Notices kept per actor."""

# KEYS: job, fence, inbox, open set.  ARGV: job id, actor, deadline_ms, step, version, prompt JSON or '',
# a random start for the fencing counter if Redis has none
_LEASE = """
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'admitted' then return 0 end
if ARGV[6] == '' and not state then return -1 end
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('SET', KEYS[2], ARGV[7]) end
local token = redis.call('INCR', KEYS[2])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'step', ARGV[4], 'prompt', ARGV[6]) end
redis.call('HSET', KEYS[1], 'actor', ARGV[2], 'token', token, 'deadline_ms', ARGV[3], 'version', ARGV[5],
           'state', 'leased')
redis.call('HINCRBY', KEYS[1], 'leases', 1)
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[1] .. '|' .. token)
return token
"""

# KEYS: job, open set.  ARGV: job id, token, now_ms, version, how long an admitted job is kept (ms), actor
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
return 'ok:' .. h[3]
"""

# KEYS: job.  ARGV: token.  A holder gives its lease back: the trainer re-leases it on its next sweep.
_RELEASE = """
local h = redis.call('HMGET', KEYS[1], 'state', 'token')
if h[1] ~= 'leased' or h[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'deadline_ms', 0)
return 1
"""


@dataclass(frozen=True, slots=True)
class Lease:
    """A job as its holder sees it."""

    job: str
    token: int
    step: int
    version: int
    deadline_ms: int
    prompt: dict[str, Any]
    """The job's document as its poster gave it (the trainer's prompt, as JSON)."""


@dataclass(frozen=True, slots=True)
class Result:
    """A submitted result, as read back by the trainer."""

    id: str
    job: str
    token: int
    actor: str
    version: int
    version_hash: str
    payload: dict[str, Any]
    malformed: str | None = None
    """Why the entry is unusable (its fields or payload failed their checks), None if it parsed."""


def parse_result(eid: str, f: dict[str, Any]) -> Result:
    """A results-stream entry as the trainer may act on it; a damaged one comes back with
    ``malformed`` set to the reason (and whatever of job and actor could be read), never raises."""
    try:
        job = wire.name(f.get("job"), "job")
        actor = wire.name(f.get("actor"), "actor")
        token = wire.uint(f.get("token"), "token")
        version = wire.version(f.get("version"))
        version_hash = wire.hex64(f.get("version_hash"), "version_hash")
        payload = wire.json_object(f.get("payload"), "payload", MAX_RESULT_BYTES)
    except wire.BadEntry as exc:
        raw_job, raw_actor = f.get("job"), f.get("actor")
        bad_job = raw_job[:200] if isinstance(raw_job, str) else ""
        bad_actor = raw_actor[:200] if isinstance(raw_actor, str) else ""
        return Result(eid, bad_job, -1, bad_actor, -1, "", {}, exc.reason)
    return Result(eid, job, token, actor, version, version_hash, payload)


@dataclass(frozen=True, slots=True)
class Notice:
    """What the trainer told an actor about one of its results."""

    id: str
    job: str
    reason: str
    result: str = ""
    """The stream id of the result it is about."""


@dataclass(frozen=True, slots=True)
class OpenJob:
    job: str
    step: int
    version: int
    actor: str
    deadline_ms: int
    taken: bool
    """Whether the holder has taken it from its inbox (started it)."""


def now_ms() -> int:
    return int(time.time() * 1000)


class JobBoard:
    """The job, lease, result and throughput keys of one run (under the coordinator's prefix)."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.r = coord.r
        self._lease = self.r.register_script(_LEASE)
        self._admit = self.r.register_script(_ADMIT)
        self._release = self.r.register_script(_RELEASE)

    def _k(self, *parts: str) -> str:
        return self.coord.key(*parts)

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        return self.coord.call(fn, *args, **kw)

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
        _check_name(actor, "actor")
        keys = [self._k("job", job), self._k("fence"), self._k("inbox", actor), self._k("open")]
        body = json.dumps(dict(prompt)) if prompt is not None else ""
        args = [job, actor, now_ms() + int(lease_s * 1000), step, version, body, secrets.randbelow(MAX_FENCE_START)]
        token = int(self._call(self._lease, keys=keys, args=args))
        if token < 0:
            raise JobError(f"job {job!r} does not exist; give its prompt to post it")
        return token

    def post(
        self,
        step: int,
        version: int,
        prompts: Sequence[Mapping[str, Any]],
        shares: Mapping[str, int],
        *,
        lease_s: float,
        tag: str,
    ) -> dict[str, str]:
        """Lease ``prompts`` to actors, ``shares[actor]`` each in order; returns job id -> actor."""
        if sum(shares.values()) != len(prompts):
            raise JobError(f"shares sum to {sum(shares.values())} but step {step} has {len(prompts)} prompts")
        out: dict[str, str] = {}
        it = iter(enumerate(prompts))
        for actor, n in shares.items():
            for _ in range(n):
                i, p = next(it)
                job = f"{tag}:{step}:{i}"
                self.lease(job, actor, version=version, lease_s=lease_s, step=step, prompt=p)
                out[job] = actor
        return out

    def open_jobs(self) -> list[OpenJob]:
        """Jobs leased and not yet admitted; a damaged job record is counted and dropped from the open set
        (a job the trainer posted is leased again by its sweep)."""
        out = []
        for job in sorted(self._call(self.r.smembers, self._k("open"))):
            fields = ("step", "version", "actor", "deadline_ms", "state", "token", "taken_token")
            h = self._call(self.r.hmget, self._k("job", job), *fields)
            if h[4] != "leased":
                self._call(self.r.srem, self._k("open"), job)
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
                self._call(self.r.srem, self._k("open"), job)
                continue
            out.append(parsed)
        return out

    def results(self, after: str, *, block_ms: int = 500, count: int = 1000) -> list[Result]:
        """Results submitted after stream id ``after``, parsed as hostile input: a damaged entry comes
        back with :attr:`Result.malformed` set (so the reader moves past it and counts it)."""
        reply = self._call(self.r.xread, {self._k("results"): after}, count=count, block=block_ms)
        return [parse_result(eid, f) for _stream, entries in reply or [] for eid, f in entries]

    def discard(self, ids: Sequence[str]) -> None:
        """Remove results from the stream once admitted or dropped: Redis keeps only those in flight."""
        if ids:
            self._call(self.r.xdel, self._k("results"), *ids)

    def tell(self, actor: str, job: str, reason: str, result: str = "") -> None:
        """Tell ``actor`` that the result ``result`` (its stream id) for ``job`` was dropped, and why
        (a short stream per actor). The actor counts only notices of results it submitted: anyone
        who can write Redis can submit in its name, but not under its results' stream ids."""
        try:
            _check_name(actor, "actor")
        except JobError:
            return  # no actor of this run has that name: nobody to tell
        self._call(
            self.r.xadd,
            self._k("notices", actor),
            {"job": job, "reason": reason, "result": result},
            maxlen=NOTICES_MAXLEN,
            approximate=True,
        )

    def notices(self, actor: str, after: str) -> list[Notice]:
        """What the trainer told ``actor`` after stream id ``after`` (damaged entries skipped)."""
        reply = self._call(self.r.xread, {self._k("notices", actor): after}, count=NOTICES_MAXLEN)
        out = []
        for _s, entries in reply or []:
            for eid, f in entries:
                reason = f.get("reason")
                if isinstance(reason, str) and reason.isidentifier() and len(reason) <= 64:
                    out.append(Notice(eid, str(f.get("job", ""))[:200], reason, str(f.get("result", ""))[:64]))
                else:
                    self.coord.skipped.skip("bad_notice", f"notice {eid} of {actor}")
        return out

    def last_result_id(self) -> str:
        """The id to read results after to see only those submitted from now on."""
        last = self._call(self.r.xrevrange, self._k("results"), count=1)
        return last[0][0] if last else "0-0"

    def admit(self, res: Result, published: Mapping[int, str]) -> str:
        """'ok' if ``res`` is admitted now, else why not: unknown_job, duplicate, stale_lease,
        wrong_actor, expired, wrong_version, wrong_version_hash or the reason it is malformed."""
        return self.admit_within(res, published)[0]

    def admit_within(self, res: Result, published: Mapping[int, str]) -> tuple[str, int | None, int]:
        """:meth:`admit`, the deadline of the lease it was admitted under (None if refused) and the
        time (ms) the admission was judged at."""
        at = now_ms()
        if res.malformed is not None:
            return res.malformed, None, at
        if published.get(res.version) != res.version_hash:
            return "wrong_version_hash", None, at
        keys = [self._k("job", res.job), self._k("open")]
        args = [res.job, res.token, at, res.version, int(ADMITTED_TTL_S * 1000), res.actor]
        why, _, deadline = str(self._call(self._admit, keys=keys, args=args)).partition(":")
        return why, (int(deadline) if why == "ok" and deadline.isdigit() else None), at

    def forget(self, jobs: Sequence[str]) -> None:
        """Drop jobs (a restarted trainer drops its predecessor's unadmitted ones)."""
        for job in jobs:
            self._call(self.r.delete, self._k("job", job))
            self._call(self.r.srem, self._k("open"), job)

    # ------------------------------------------------------------ actor side

    def take(self, actor: str, *, max_jobs: int, block_s: float = 1.0) -> list[Lease]:
        """Up to ``max_jobs`` jobs leased to ``actor``, waiting up to ``block_s`` for the first.
        Entries whose lease was revoked since (re-leased elsewhere, admitted) are skipped, and so
        are malformed job records: their leases expire and the trainer leases them again."""
        _check_name(actor, "actor")
        inbox = self._k("inbox", actor)
        first = self._call(self.r.blpop, [inbox], timeout=max(block_s, 0.01))
        if first is None:
            return []
        entries = [first[1]]
        if max_jobs > 1:
            entries += self._call(self.r.lpop, inbox, max_jobs - 1) or []
        out = []
        for entry in entries:
            job, _, token = entry.rpartition("|")
            h = self._call(
                self.r.hmget, self._k("job", job), "state", "token", "actor", "step", "version", "deadline_ms", "prompt"
            )
            if h[0] != "leased" or h[1] != token or h[2] != actor:
                continue
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
            except wire.BadEntry as exc:
                self.coord.skipped.skip(exc.reason, f"job {job!r:.80}: {exc}")
                continue
            out.append(lease)
            self._call(self.r.hset, self._k("job", job), mapping={"taken_token": token, "taken_ms": now_ms()})
        return out

    def submit(self, lease: Lease, *, actor: str, version: int, version_hash: str, payload: Mapping[str, Any]) -> str:
        """Post a result for ``lease``; the trainer decides whether to admit it."""
        try:
            body = json.dumps(payload, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise JobError(f"result for job {lease.job!r} is not plain JSON: {exc}") from None
        if len(body) > MAX_RESULT_BYTES:
            raise JobError(f"result for job {lease.job!r} is {len(body)} bytes, over {MAX_RESULT_BYTES}")
        fields = {
            "job": lease.job,
            "token": lease.token,
            "actor": actor,
            "version": version,
            "version_hash": version_hash,
            "payload": body,
        }
        return str(self._call(self.r.xadd, self._k("results"), fields, maxlen=RESULTS_MAXLEN, approximate=True))

    def release(self, lease: Lease) -> bool:
        """Give a lease back early (the actor cannot serve it); the trainer re-leases it."""
        return bool(self._call(self._release, keys=[self._k("job", lease.job)], args=[lease.token]))

    # ------------------------------------------------------------ throughput

    def report_throughput(self, actor: str, tokens: float, elapsed_s: float, *, beta: float) -> float:
        """Fold a finished batch into ``actor``'s EMA (only the actor writes its own) and end its probation."""
        try:
            prev = self._call(self.r.hget, self._k("tau"), actor)
            tau = ema(float(prev) if prev is not None else None, tokens, elapsed_s, beta)
        except ValueError as exc:
            raise JobError(f"actor {actor}: {exc}") from None
        self._call(self.r.hset, self._k("tau"), actor, repr(tau))
        self._call(self.r.srem, self._k("probation"), actor)
        return tau

    def joined(self, actor: str) -> bool:
        """Note that ``actor`` (re)joined: one already measured goes on probation. True if rejoining."""
        if self._call(self.r.hexists, self._k("tau"), actor):
            self._call(self.r.sadd, self._k("probation"), actor)
            return True
        return False

    def throughputs(self) -> tuple[dict[str, float], set[str]]:
        """Every actor's EMA (tokens/s) and the set on probation."""
        raw = self._call(self.r.hgetall, self._k("tau"))
        taus = {}
        for a, v in raw.items():
            try:
                tau = float(v)
            except ValueError:
                continue
            if math.isfinite(tau) and tau > 0:  # a damaged entry counts as unmeasured
                taus[a] = tau
        return taus, set(self._call(self.r.smembers, self._k("probation")))


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not name or len(name) > 200 or any(c in name for c in " |\n{}"):
        raise JobError(f"{what} id must be a short name without spaces, '|' or braces, got {name!r}")
    return name
