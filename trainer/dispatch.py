"""The trainer's side of the job board: posting each step's prompts as leased jobs, sweeping
expired and orphaned leases, letting idle actors take over unstarted work, and admitting results.

Jobs are leased to eligible actors (alive, holding the latest version or the one before) in
proportion to their throughput EMAs; expired or orphaned leases are leased again with a new
fencing token. A result is admitted only after its payload passes every check (it is hostile
input: another process wrote it), and every prompt of a step is admitted exactly once.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, defaultdict

from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.jobs import JobBoard, OpenJob, Result, now_ms
from aurora_store.coord.schedule import effective, split
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tasks import Prompt
from trainer.config import ScheduleConfig

log = logging.getLogger("aurora.trainer")
FAILURES = ("error", "invalid", "timeout", "crashed")
"""The kinds of reward failure an actor may report (``actor.rewards``)."""


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
    ) -> None:
        self.coord, self.board = coord, board
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
        self.dropped: Counter[str] = Counter()
        self.reward_failures: Counter[str] = Counter()
        """Reward calls that failed on the actors (scored 0), by kind, over the admitted results."""
        self.stolen = 0
        self._after = "0-0"
        self._last_sweep = 0.0
        self._warned = time.monotonic()  # warn after 30 s without an eligible actor, not at once

    def forget_predecessor(self) -> None:
        """A restarted trainer drops its predecessor's unadmitted jobs: their results are not its own."""
        self.board.forget([j.job for j in self.board.open_jobs()])
        self._after = self.board.last_result_id()

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
        self._assign(turn=step)

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
        todo, self.pending = self.pending, {}
        it = iter(todo.items())
        for actor, n in shares.items():
            for _ in range(n):
                job, (step, prompt) = next(it)
                self.board.lease(
                    job, actor, version=version, lease_s=self.schedule.lease_s, step=step, prompt=prompt.to_dict()
                )

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
        """Block until every prompt of ``step`` has one admitted result."""
        while len(self.admitted[step]) < len(self.step_jobs[step]):
            for res in self.board.results(self._after, block_ms=int(self.schedule.sweep_s * 1000)):
                self._after = res.id
                self._consider(res)
            if time.monotonic() - self._last_sweep >= self.schedule.sweep_s:
                self._last_sweep = time.monotonic()
                self._sweep()
        for old in [s for s in self.step_jobs if s < step - 2]:  # long trained: late results are unknown jobs
            del self.step_jobs[old]
        return list(self.admitted.pop(step).values())

    def _consider(self, res: Result) -> None:
        step = next((s for s, jobs in self.step_jobs.items() if res.job in jobs), None)
        if step is None:
            self.dropped["unknown_job"] += 1
            return
        why = self._check_payload(res)
        if why is None:
            why = self.board.admit(res, self.published)
        if why == "ok":
            self.admitted[step][res.job] = res
            self.reward_failures.update(res.payload.get("reward_failures", {}))
            return
        self.dropped[why] += 1
        if why in ("malformed", "wrong_version", "wrong_version_hash", "bad_payload"):
            # the holder produced something unusable: lease the prompt again now
            self.pending[res.job] = (step, self.step_jobs[step][res.job])

    def _check_payload(self, res: Result) -> str | None:
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
