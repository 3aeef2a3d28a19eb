"""Rollout jobs in Redis: leases with deadlines and fencing tokens, results, throughput EMAs.

The trainer posts each step's prompts as jobs, each leased to one actor: the lease has a
deadline and a fencing token (a run-wide counter, new for every lease), and the job goes
to that actor's inbox. An actor takes its jobs, generates, and submits results tagged with
the token, the version it generated with and that version's hash. The trainer admits a
result only if the token is still the job's (a reassigned job fences out its old holder),
the deadline has not passed, and the version and hash match; everything else is dropped
and the job is leased again. Admission is one Lua script, so a job is admitted once.
Deadlines are on the trainer's clock: it sets them and it checks them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import JobError
from aurora_store.coord.schedule import ema

RESULTS_MAXLEN = 100_000
ADMITTED_TTL_S = 3600.0
"""An admitted job's record is kept this long (to refuse late duplicates), then Redis drops it."""
MAX_RESULT_BYTES = 8 << 20
"""A result payload above this is refused by the actor before it reaches Redis."""

# KEYS: job, fence, inbox, open set.  ARGV: job id, actor, deadline_ms, step, version, prompt JSON or ''
_LEASE = """
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'admitted' then return 0 end
if ARGV[6] == '' and not state then return -1 end
local token = redis.call('INCR', KEYS[2])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'step', ARGV[4], 'prompt', ARGV[6]) end
redis.call('HSET', KEYS[1], 'actor', ARGV[2], 'token', token, 'deadline_ms', ARGV[3], 'version', ARGV[5],
           'state', 'leased')
redis.call('HINCRBY', KEYS[1], 'leases', 1)
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[1] .. '|' .. token)
return token
"""

# KEYS: job, open set.  ARGV: job id, token, now_ms, version, how long an admitted job is kept (ms)
_ADMIT = """
local h = redis.call('HMGET', KEYS[1], 'state', 'token', 'deadline_ms', 'version')
if not h[1] then return 'unknown_job' end
if h[1] == 'admitted' then return 'duplicate' end
if h[2] ~= ARGV[2] then return 'stale_lease' end
if tonumber(ARGV[3]) > tonumber(h[3]) then return 'expired' end
if h[4] ~= ARGV[4] then return 'wrong_version' end
redis.call('HSET', KEYS[1], 'state', 'admitted', 'admitted_ms', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('SREM', KEYS[2], ARGV[1])
return 'ok'
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
        args = [job, actor, now_ms() + int(lease_s * 1000), step, version, body]
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
        """Jobs leased and not yet admitted."""
        out = []
        for job in sorted(self._call(self.r.smembers, self._k("open"))):
            fields = ("step", "version", "actor", "deadline_ms", "state", "token", "taken_token")
            h = self._call(self.r.hmget, self._k("job", job), *fields)
            if h[4] != "leased":
                self._call(self.r.srem, self._k("open"), job)
                continue
            out.append(OpenJob(job, int(h[0]), int(h[1]), h[2], int(h[3]), h[6] is not None and h[6] == h[5]))
        return out

    def results(self, after: str, *, block_ms: int = 500, count: int = 1000) -> list[Result]:
        """Results submitted after stream id ``after``; malformed entries are skipped (and counted)."""
        reply = self._call(self.r.xread, {self._k("results"): after}, count=count, block=block_ms)
        out = []
        for _stream, entries in reply or []:
            for eid, f in entries:
                try:
                    out.append(
                        Result(
                            eid,
                            f["job"],
                            int(f["token"]),
                            f["actor"],
                            int(f["version"]),
                            f["version_hash"],
                            json.loads(f["payload"]),
                        )
                    )
                except (KeyError, ValueError, TypeError):
                    out.append(Result(eid, f.get("job", ""), -1, f.get("actor", ""), -1, "", {"malformed": True}))
        return out

    def last_result_id(self) -> str:
        """The id to read results after to see only those submitted from now on."""
        last = self._call(self.r.xrevrange, self._k("results"), count=1)
        return last[0][0] if last else "0-0"

    def admit(self, res: Result, published: Mapping[int, str]) -> str:
        """'ok' if ``res`` is admitted now, else why not: unknown_job, duplicate, stale_lease,
        expired, wrong_version, wrong_version_hash or malformed."""
        if res.token < 0 or res.payload.get("malformed"):
            return "malformed"
        if published.get(res.version) != res.version_hash:
            return "wrong_version_hash"
        keys = [self._k("job", res.job), self._k("open")]
        args = [res.job, res.token, now_ms(), res.version, int(ADMITTED_TTL_S * 1000)]
        return str(self._call(self._admit, keys=keys, args=args))

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
                lease = Lease(job, int(token), int(h[3]), int(h[4]), int(h[5]), json.loads(h[6]))
            except (TypeError, ValueError, RecursionError):
                continue
            if not isinstance(lease.prompt, dict):
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
