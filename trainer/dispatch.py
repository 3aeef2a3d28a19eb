"""The trainer's side of the job board: posting each step's prompts as leased jobs, sweeping
expired and orphaned leases, letting idle actors take over unstarted work, and admitting results.

Jobs are leased to eligible actors (alive, holding the latest version or the one before) in
proportion to their throughput EMAs; expired or orphaned leases are leased again with a new
fencing token. A result is admitted only after its payload passes every check (it is hostile
input: another process wrote it), and every prompt of a step is admitted exactly once. Every
result read is removed from the stream once admitted or dropped; a drop is counted by reason,
logged once a minute per reason, and told to the actor that submitted it.

Redis may lose its state (a flush, a failover to an empty replica): the sweep checks the run's
epoch, and when it changed the trainer leases again every unadmitted job of its current steps
and moves the home region's version back to what its bucket holds. A Redis that does not
answer is retried with backoff, said once when it goes and once when it is back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import IO, TypeVar

from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.jobs import JobBoard, OpenJob, Result, now_ms
from aurora_store.coord.schedule import effective, split
from aurora_store.coord.wire import Tally
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tasks import Prompt
from trainer.config import ScheduleConfig

log = logging.getLogger("aurora.trainer")
T = TypeVar("T")
FAILURES = ("error", "invalid", "timeout", "crashed")
"""The kinds of reward failure an actor may report (``actor.rewards``)."""
RELEASE = ("bad_payload", "wrong_version", "wrong_version_hash", "wrong_digest")
"""Drops after which the prompt is leased again at once (its holder produced something unusable)."""
TELL = frozenset({"bad_payload", "wrong_version", "wrong_version_hash", "wrong_digest", "wrong_actor", "expired"})
"""Drops the submitting actor is told of: it can act on them (fix itself, or stop)."""


class Dispatcher:
    """Posts, sweeps and admits the jobs of one trainer (run on rank 0 only)."""

    def __init__(
        self,
        coord: Coordinator,
        board: JobBoard,
        *,
        schedule: ScheduleConfig,
        sampling: SamplingConfig,
        vocab_size: int,
        tag: str,
        admissions: IO[str] | None = None,
    ) -> None:
        self.coord, self.board = coord, board
        self.digests: dict[int, str] = {}
        """Version -> its weights digest (results carry the digest of the weights they were generated on)."""
        self.admissions = admissions
        """Where each admitted result is recorded, one JSON line (``--admissions-log``)."""
        self.schedule, self.sampling = schedule, sampling
        self.vocab_size = vocab_size
        self.tag = tag
        self.published: dict[int, str] = {}
        """Version -> hash of the versions results may be admitted at."""
        self.pending: dict[str, tuple[int, Prompt]] = {}
        """Jobs waiting for a lease: job id -> (step, prompt)."""
        self.step_jobs: dict[int, dict[str, Prompt]] = defaultdict(dict)
        """Each step's jobs and their prompts (this trainer posted them: no need to ask Redis)."""
        self.admitted: dict[int, dict[str, Result]] = defaultdict(dict)
        self.closed: set[int] = set()
        """Steps whose results were collected: nothing more is admitted for them."""
        self.dropped: Counter[str] = Counter()
        self.drops = Tally(log, "results")
        """Results dropped, by reason (``dropped`` also counts leases taken back, as ``lease_lost``)."""
        self.admitted_total = 0
        """Results admitted by this dispatcher."""
        self.reward_failures: Counter[str] = Counter()
        """Reward calls that failed on the actors (scored 0), by kind, over the admitted results."""
        self.stolen = 0
        self._after = "0-0"
        self._last_sweep = 0.0
        self._warned = time.monotonic()  # warn after 30 s without an eligible actor, not at once
        self._down_since: float | None = None
        self.rebuilds = 0
        """Times Redis lost its state and this trainer re-posted its jobs."""
        self.on_lost: Callable[[], None] | None = None
        """Called when Redis lost its state, after the jobs are re-posted (the trainer re-announces its version)."""

    def forget_predecessor(self) -> None:
        """A restarted trainer drops its predecessor's unadmitted jobs: their results are not its own."""

        def forget() -> None:
            self.coord.check_epoch()
            self.board.forget([j.job for j in self.board.open_jobs()])
            self._after = self.board.last_result_id()

        self.retrying(forget)

    def retrying(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried with backoff while Redis does not answer (said once when it goes, once when back)."""
        backoff = 0.5
        while True:
            try:
                out = fn()
            except CoordinationError as exc:
                self._down(exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            self._up()
            return out

    def _down(self, exc: CoordinationError) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("Redis does not answer (%s); retrying with backoff", exc)

    def _up(self) -> None:
        if self._down_since is not None:
            log.warning("Redis answers again after %.1f s", time.monotonic() - self._down_since)
            self._down_since = None
            self._last_sweep = 0.0  # check the epoch at once: it may have come back empty

    def published_version(self, version: int, version_hash: str, weights_digest: str) -> None:
        """Results may now be admitted at ``version``."""
        self.published[version] = version_hash
        self.digests[version] = weights_digest

    def _rebuild(self) -> None:
        """Redis lost its state: lease again every unadmitted job of the current steps, read results
        from the start of the (new) stream."""
        self.rebuilds += 1
        n = 0
        for step, jobs in self.step_jobs.items():
            if step in self.closed:
                continue
            for job, prompt in jobs.items():
                if job not in self.admitted.get(step, {}) and job not in self.pending:
                    self.pending[job] = (step, prompt)
                    n += 1
        self._after = "0-0"
        log.warning("Redis lost its state: leasing %d unadmitted jobs again", n)
        if self.on_lost is not None:
            self.on_lost()

    def _eligible(self) -> dict[str, float]:
        """Actors that may get work now, with their split weights."""
        latest = max(self.published)
        taus, probation = self.board.throughputs()
        ok = {}
        for wid, doc in self.coord.workers().items():
            if doc.get("role") == "actor" and doc.get("version") in (latest, latest - 1):
                ok[wid] = taus.get(wid)
        return effective(ok, probation, self.schedule.alpha)

    def post(self, step: int, prompts: list[Prompt]) -> None:
        """Lease ``step``'s prompts to the eligible actors (those that are waiting get them on a sweep)."""
        for i, p in enumerate(prompts):
            job = f"{self.tag}:{step}:{i}"
            self.step_jobs[step][job] = p
            self.pending[job] = (step, p)
        try:
            self._assign(turn=step)
        except CoordinationError as exc:  # the prompts stay pending: the next sweep places them
            self._down(exc)

    def _assign(self, *, turn: int) -> None:
        if not self.pending:
            return
        weights = self._eligible()
        if not weights:
            if time.monotonic() - self._warned > 30:
                self._warned = time.monotonic()
                log.warning(
                    "%d prompts wait for an actor holding version %d or %d",
                    len(self.pending),
                    max(self.published),
                    max(self.published) - 1,
                )
            return
        version = max(self.published)
        shares = split(len(self.pending), weights, turn=turn)
        it = iter(list(self.pending.items()))
        for actor, n in shares.items():
            for _ in range(n):
                job, (step, prompt) = next(it)
                self.board.lease(
                    job, actor, version=version, lease_s=self.schedule.lease_s, step=step, prompt=prompt.to_dict()
                )
                del self.pending[job]  # only once leased: a Redis failure midway leaves the rest pending

    def _sweep(self) -> None:
        """Re-lease jobs whose lease expired or whose actor is gone; place pending prompts; let idle
        actors take over half of the not-yet-started jobs of the actor with the most of them."""
        alive = set(self.coord.workers())
        now = now_ms()
        jobs = self.board.open_jobs()
        for j in jobs:
            if j.job in self.pending or j.job not in self.step_jobs.get(j.step, ()):
                continue
            if j.deadline_ms < now or j.actor not in alive:
                self.pending[j.job] = (j.step, self.step_jobs[j.step][j.job])
                self.dropped["lease_lost"] += 1
        self._assign(turn=int(now // 1000))
        if self.schedule.steal:
            self._rebalance([j for j in jobs if j.job not in self.pending and j.actor in alive])

    def _rebalance(self, jobs: list[OpenJob]) -> None:
        busy = {j.actor for j in jobs}
        untaken: dict[str, list[OpenJob]] = defaultdict(list)
        for j in jobs:
            if not j.taken and j.deadline_ms > 0:
                untaken[j.actor].append(j)
        version = max(self.published)
        for thief in sorted(set(self._eligible()) - busy):
            if not untaken:
                return
            donor = max(sorted(untaken), key=lambda a: len(untaken[a]))
            n = (len(untaken[donor]) + 1) // 2
            moved, untaken[donor] = untaken[donor][-n:], untaken[donor][:-n]
            if not untaken[donor]:
                del untaken[donor]
            for j in moved:
                if self.board.lease(j.job, thief, version=version, lease_s=self.schedule.lease_s):
                    self.stolen += 1

    def collect(self, step: int) -> list[Result]:
        """Block until every prompt of ``step`` has one admitted result (retrying Redis with backoff)."""
        while len(self.admitted[step]) < len(self.step_jobs[step]):
            self.retrying(self._collect_once)
        for old in [s for s in self.step_jobs if s < step - 2]:  # long trained: late results are unknown jobs
            del self.step_jobs[old]
            self.closed.discard(old)
        self.closed.add(step)
        return list(self.admitted.pop(step).values())

    def _collect_once(self) -> None:
        if time.monotonic() - self._last_sweep >= self.schedule.sweep_s:
            self._last_sweep = time.monotonic()
            if self.coord.check_epoch() | self.coord.state_lost():  # both: each clears what it saw
                self._rebuild()
            self._sweep()
        results = self.board.results(self._after, block_ms=int(self.schedule.sweep_s * 1000))
        for res in results:
            self._after = res.id
            self._consider(res)
        self.board.discard([r.id for r in results])

    def _consider(self, res: Result) -> None:
        step = next((s for s, jobs in self.step_jobs.items() if res.job in jobs), None)
        if step is None:
            self._drop(res, res.malformed or "unknown_job")
            return
        why = res.malformed or self._check_payload(res)
        if why is None and (step in self.closed or res.job in self.admitted.get(step, {})):
            why = "duplicate"
        deadline, at = None, now_ms()
        if why is None:
            why, deadline, at = self.board.admit_within(res, self.published)
        if why == "ok":
            self.admitted[step][res.job] = res
            self.admitted_total += 1
            self.reward_failures.update(res.payload.get("reward_failures", {}))
            self._record(step, res, deadline, at)
            return
        self._drop(res, why)
        unusable = why in RELEASE or res.malformed is not None
        if unusable and step not in self.closed and res.job not in self.admitted.get(step, {}):  # lease it again now
            self.pending[res.job] = (step, self.step_jobs[step][res.job])

    def _drop(self, res: Result, why: str) -> None:
        self.dropped[why] += 1
        self.drops.skip(why, f"result {res.id} for job {res.job!r:.80} from actor {res.actor!r:.80}")
        if why in TELL and res.actor:
            with contextlib.suppress(CoordinationError):  # telling is a courtesy; the drop stands
                self.board.tell(res.actor, res.job, why, res.id)

    def _record(self, step: int, res: Result, deadline_ms: int | None, admitted_ms: int) -> None:
        if self.admissions is None:
            return
        line = {
            "trainer": self.tag,
            "step": step,
            "job": res.job,
            "prompt": self.step_jobs[step][res.job].id,
            "actor": res.actor,
            "token": res.token,
            "version": res.version,
            "version_hash": res.version_hash,
            "weights_digest": res.payload.get("weights_digest"),
            "deadline_ms": deadline_ms,
            "admitted_ms": admitted_ms,
        }
        self.admissions.write(json.dumps(line) + "\n")
        self.admissions.flush()

    def _check_payload(self, res: Result) -> str | None:
        digest = res.payload.get("weights_digest")
        if digest is not None and digest != self.digests.get(res.version):
            return "wrong_digest"
        comps = res.payload.get("completions")
        if not isinstance(comps, list) or len(comps) != self.sampling.group:
            return "bad_payload"
        vocab = self.vocab_size
        for c in comps:
            if not isinstance(c, dict):
                return "bad_payload"
            toks, lps, r = c.get("tokens"), c.get("logprobs"), c.get("reward")
            if not (isinstance(toks, list) and isinstance(lps, list) and len(toks) == len(lps) >= 1):
                return "bad_payload"
            too_long = len(toks) > self.sampling.max_new_tokens
            if too_long or not all(isinstance(t, int) and 0 <= t < vocab for t in toks):
                return "bad_payload"
            if not all(isinstance(x, (int, float)) and math.isfinite(x) and x <= 0 for x in lps):
                return "bad_payload"
            if not isinstance(r, (int, float)) or not math.isfinite(r):
                return "bad_payload"
        failures = res.payload.get("reward_failures", {})
        if not isinstance(failures, dict) or not all(
            k in FAILURES and type(v) is int and 0 <= v <= len(comps) for k, v in failures.items()
        ):
            return "bad_payload"
        return None
