"""The trainer's side of the job board: posting each step's prompts as leased jobs, sweeping
expired and orphaned leases, letting idle actors take over unstarted work, and admitting results.

Jobs are leased to eligible actors (alive, speaking this coordination protocol, holding the latest
version or the one before) in proportion to their throughput EMAs; expired or orphaned leases are
leased again with a new fencing token. A sweep costs a few round trips whatever the fleet: the
live actors come from :class:`~aurora_store.coord.roster.Roster` (what changed since the last
sweep), expired leases from the deadline index, and the holder of every lease is known here
(this trainer made them). A result is admitted only after its payload passes every check
(:mod:`trainer.admission`: it is hostile input), and every prompt of a step is admitted exactly
once. Before any payload is fetched, the result must name one of this trainer's open jobs, its
current holder and lease token, and the published version hash (all known here, no round trip),
and a step's fetches stay within ``fetch_per_job`` times its jobs' largest payloads: a Redis writer
cannot make the trainer read what no lease asked for (issue 25, bug 5). With a fleet key
(:mod:`trainer.identity`), only results signed by a certified actor are considered at all; a
forged one is dropped and its lease stays with its holder. Every result read is removed from the
stream once admitted or dropped; a drop is counted by reason, logged once a minute per reason, and
told to the actor that submitted it.

With :meth:`Dispatcher.start`, sweeping, reading, fetching and decoding run on a thread of their
own, so the training thread only waits for a step's last admission; without it :meth:`collect`
does the same work in the caller's thread.

Redis may lose its state (a flush, a failover to an empty replica): the sweep checks the run's
epoch, and when it changed the trainer leases again every unadmitted job of its current steps
and moves the home region's version back to what its bucket holds. A Redis that does not
answer is retried with backoff, said once when it goes and once when it is back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.results import Result
from aurora_store.coord.roster import Roster
from aurora_store.coord.wire import Tally
from aurora_store.format.identity import REASONS as IDENTITY_REASONS
from aurora_store.format.results import Rollouts
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tasks import Prompt
from trainer.admission import Payloads
from trainer.config import ScheduleConfig
from trainer.identity import ResultGate
from trainer.leasing import Leases

log = logging.getLogger("aurora.trainer")
T = TypeVar("T")
RELEASE = (
    "bad_payload",
    "wrong_version",
    "wrong_version_hash",
    "wrong_digest",
    "payload_unavailable",
    "payload_too_large",
    "rewards_crashed",
)
"""Drops after which the prompt is leased again at once (its holder produced something unusable)."""
TELL = frozenset(
    {
        "bad_payload",
        "unknown_format",
        "wrong_version",
        "wrong_version_hash",
        "wrong_digest",
        "wrong_actor",
        "expired",
        "payload_unavailable",
        "unknown_region",
        *IDENTITY_REASONS,
        "rewards_crashed",
    }
)
"""Drops the submitting actor is told of: it can act on them (fix itself, or stop)."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """An admitted result and its decoded rollouts."""

    result: Result
    rollouts: Rollouts

    @property
    def job(self) -> str:
        return self.result.job

    @property
    def actor(self) -> str:
        return self.result.actor


class Dispatcher:
    """Posts, sweeps and admits the jobs of one trainer (run on rank 0 only); its :attr:`leases` own the
    jobs and their holders, it owns admission and the collector thread."""

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
        stores: Mapping[str, ObjectStore] | None = None,
        identity: ResultGate | None = None,
        signer: Callable[[], Any] | None = None,
    ) -> None:
        self.coord, self.board = coord, board
        self.signer = signer
        """The run's signing key now (after a rotation, the new one): it signs the notices to actors."""
        self.identity = identity
        """Which results come from certified actors (None: no check, as before identities)."""
        self.digests: dict[int, str] = {}
        """Version -> its weights digest (results carry the digest of the weights they were generated on)."""
        self.admissions = admissions
        """Where each admitted result is recorded, one JSON line (``--admissions-log``)."""
        self.schedule, self.sampling = schedule, sampling
        self.vocab_size = vocab_size
        self.tag = tag
        self.payloads = Payloads(
            sampling=sampling,
            vocab_size=vocab_size,
            stores=stores or {},
            digests=self.digests.get,
            gate=identity.check if identity is not None and identity.on else None,
        )
        """Fetches, decodes and checks result payloads (and counts the CPU it spends)."""
        self.published: dict[int, str] = {}
        """Version -> hash of the versions results may be admitted at."""
        self.admitted: dict[int, dict[str, Admitted]] = defaultdict(dict)
        self.dropped: Counter[str] = Counter()
        self.drops = Tally(log, "results")
        """Results dropped, by reason (``dropped`` also counts leases taken back, as ``lease_lost``)."""
        self.admitted_total = 0
        """Results admitted by this dispatcher."""
        self.reward_failures: Counter[str] = Counter()
        """Reward calls that failed on the actors (scored 0), by kind, over the admitted results."""
        self.leases = Leases(board, Roster(coord), schedule=schedule, tag=tag, dropped=self.dropped)
        """This trainer's jobs, who holds them, and the sweep."""
        self.fetch_reserved: Counter[int] = Counter()
        """Step -> bytes of referenced payloads let through to a fetch (what its budget counts)."""
        self._after = "0-0"
        self._last_sweep = 0.0
        self._down_since: float | None = None
        self.rebuilds = 0
        """Times Redis lost its state and this trainer re-posted its jobs."""
        self.on_lost: Callable[[], None] | None = None
        """Called when Redis lost its state, after the jobs are re-posted (the trainer re-announces its version)."""
        self._lock = threading.RLock()
        self._progress = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # ------------------------------------------------------------ the collector thread

    def start(self) -> None:
        """Sweep, read, fetch, decode and admit on a thread of this dispatcher's own from now on."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._collector, name="aurora-admission", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the collector thread (:meth:`collect` then does the work in its caller's thread)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._stopping.clear()

    def close(self) -> None:
        self.stop()
        self.payloads.close()

    def _collector(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                self._collect_once()
            except CoordinationError as exc:
                self._down(exc)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception:  # a bug here must not silently stop admission: said, then retried
                log.exception("the admission thread failed; retrying in 1 s")
                self._stopping.wait(1.0)
                continue
            backoff = 0.5
            self._up()

    # ------------------------------------------------------------ Redis availability

    def forget_predecessor(self) -> None:
        """A restarted trainer drops its predecessor's unadmitted jobs: their results are not its own."""

        def forget() -> None:
            self.coord.epoch.check()
            self.board.forget([j.job for j in self.board.open_jobs()])
            self._after = self.board.results.last_id()

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
        with self._lock:
            self.published[version] = version_hash
            self.digests[version] = weights_digest
            self.leases.latest = max(self.published)

    def post(self, step: int, prompts: list[Prompt]) -> None:
        """Lease ``step``'s prompts to the eligible actors (those that are waiting get them on a sweep)."""
        with self._lock:
            self.leases.add(step, prompts)
            try:
                self.leases.place(turn=step)
            except CoordinationError as exc:  # the prompts stay pending: the next sweep places them
                self._down(exc)

    def _rebuild(self) -> None:
        """Redis lost its state: lease again every unadmitted job of the current steps, read results
        from the start of the (new) stream, read the whole roster again."""
        self.rebuilds += 1
        n = self.leases.rebuild(self.admitted)
        self._after = "0-0"
        log.warning("Redis lost its state: leasing %d unadmitted jobs again", n)
        if self.on_lost is not None:
            self.on_lost()

    # ------------------------------------------------------------ collecting

    def collect(self, step: int) -> list[Admitted]:
        """Block until every prompt of ``step`` has one admitted result (retrying Redis with backoff);
        then the jobs of steps trained on long ago leave Redis."""
        with self._lock:
            while len(self.admitted[step]) < len(self.leases.step_jobs[step]):
                if self._thread is not None:
                    self._progress.wait(1.0)
                else:
                    self.retrying(self._collect_once)
            old = self.leases.close(step)  # long trained: late results are unknown jobs
            for s in [s for s in self.fetch_reserved if s not in self.leases.step_jobs]:
                del self.fetch_reserved[s]
            if old:
                with contextlib.suppress(CoordinationError):  # the records expire by themselves anyway
                    self.board.drop_jobs(old)
            return list(self.admitted.pop(step).values())

    def _collect_once(self) -> None:
        with self._lock:
            if time.monotonic() - self._last_sweep >= self.schedule.sweep_s:
                self._last_sweep = time.monotonic()
                if self.coord.epoch.check() | self.coord.epoch.lost():  # both: each clears what it saw
                    self._rebuild()
                self.leases.sweep()
            after = self._after
        results = self.board.results.read(after, block_ms=int(self.schedule.sweep_s * 1000))
        if not results:
            return
        with self._lock:
            early = self._before_fetch(results)
        decoded = self.payloads.decode_all(results, early)
        with self._lock:
            if self._after == after:  # not rewound by a rebuild meanwhile
                self._after = results[-1].id
            self._consider_all(results, decoded)
            self._progress.notify_all()
        self.board.results.discard([r.id for r in results])

    def _before_fetch(self, results: list[Result]) -> list[str | None]:
        """Why each result is dropped before its payload is fetched or decoded, or None: it names none of
        this trainer's open jobs, or a job already admitted, or not the published version hash, or not
        the lease's holder and token (what the admission script would refuse after the fetch); or it
        references a payload over its step's fetch budget, or a second payload for the same job."""
        out: list[str | None] = []
        referenced: set[str] = set()
        for res in results:
            if res.malformed is not None:
                out.append(None)  # its own reason, as it always was
                continue
            step = self.leases.step_of(res.job)
            if step is None:
                why: str | None = "unknown_job"
            elif step in self.leases.closed or res.job in self.admitted.get(step, {}):
                why = "duplicate"
            elif self.published.get(res.version) != res.version_hash:
                why = "wrong_version_hash"
            elif not self.leases.holds(res.job, res.actor, res.token):
                why = "wrong_actor" if self.leases.tokens.get(res.job) == res.token else "stale_lease"
            else:
                why = None
            if why is None and step is not None and res.ref is not None:
                why = self._reserve_fetch(step, res, referenced)
            out.append(why)
        return out

    def _reserve_fetch(self, step: int, res: Result, referenced: set[str]) -> str | None:
        """Count ``res``'s referenced payload against its step's budget; why not, if it does not fit."""
        assert res.ref is not None
        if res.job in referenced:
            return "duplicate"  # one fetch per job per read: the holder sends one result per lease
        if res.ref.size > self.payloads.max_bytes:
            return "payload_too_large"
        budget = self.schedule.fetch_per_job * len(self.leases.step_jobs[step]) * self.payloads.max_bytes
        if self.fetch_reserved[step] + res.ref.size > budget:
            return "fetch_budget"
        self.fetch_reserved[step] += res.ref.size
        referenced.add(res.job)
        return None

    def _consider_all(self, results: list[Result], decoded: list[tuple[Rollouts | None, str | None]]) -> None:
        checked: list[tuple[Result, int, Rollouts]] = []
        for res, (rollouts, why) in zip(results, decoded, strict=True):
            step = self.leases.step_of(res.job)
            if step is None:
                self._drop(res, res.malformed or "unknown_job")
                continue
            if why is None and (step in self.leases.closed or res.job in self.admitted.get(step, {})):
                why = "duplicate"
            if why is not None or rollouts is None:
                self._refused(res, step, why or "bad_payload")
                continue
            checked.append((res, step, rollouts))
        verdicts = self.board.admit_many([r for r, _, _ in checked], self.published)
        for (res, step, rollouts), (why, deadline, at) in zip(checked, verdicts, strict=True):
            if why != "ok":
                self._refused(res, step, why)
                continue
            if res.job in self.admitted[step]:  # two results for one job in one read: the script said ok once
                self._drop(res, "duplicate")
                continue
            self.admitted[step][res.job] = Admitted(res, rollouts)
            self.leases.admitted(res.job, res.actor, rollouts.n_tokens)
            self.admitted_total += 1
            self.reward_failures.update(rollouts.failures)
            self._record(step, res, rollouts, deadline, at)

    def _refused(self, res: Result, step: int, why: str) -> None:
        self._drop(res, why)
        # Only the holder's own unusable result gives its lease up early: one under another name or an old
        # token (a forger's, or a slow former holder's) would otherwise take the job from the actor working
        # on it and get its result dropped as stale. Anyone else's is dropped and the lease stays. With
        # identities on, a malformed entry (which cannot be authenticated) is anyone's as well.
        ungated = self.identity is None or not self.identity.on
        unusable = why in RELEASE or (res.malformed is not None and ungated)
        if (
            unusable
            and self.leases.holds(res.job, res.actor, res.token)
            and step not in self.leases.closed
            and res.job not in self.admitted.get(step, {})
        ):
            self.leases.again(res.job, step)  # lease it again now

    def _drop(self, res: Result, why: str) -> None:
        self.dropped[why] += 1
        self.drops.skip(why, f"result {res.id} for job {res.job!r:.80} from actor {res.actor!r:.80}")
        if why in TELL and res.actor:
            with contextlib.suppress(CoordinationError):  # telling is a courtesy; the drop stands
                key = self.signer() if self.signer is not None else None
                self.board.notices.tell(res.actor, res.job, why, res.id, key=key)

    def _record(self, step: int, res: Result, rollouts: Rollouts, deadline_ms: int | None, admitted_ms: int) -> None:
        if self.admissions is None:
            return
        line = {
            "trainer": self.tag,
            "step": step,
            "job": res.job,
            "prompt": self.leases.step_jobs[step][res.job].id,
            "actor": res.actor,
            "token": res.token,
            "version": res.version,
            "version_hash": res.version_hash,
            "weights_digest": rollouts.weights_digest,
            "payload": "inline" if res.ref is None else res.ref.key,
            "deadline_ms": deadline_ms,
            "admitted_ms": admitted_ms,
        }
        self.admissions.write(json.dumps(line) + "\n")
        self.admissions.flush()
