"""The RL step loop of ``aurora bench e2e``: a trainer and actors with stand-in durations, real weight sync.

The trainer's step s waits until every actor has finished its batch for step s, "trains" for a fixed
time, then publishes version s. With one-step asynchrony (``async_level`` 1) the batch for step s may
run on any version >= s - 2: while the trainer trains step s - 1 on batch s - 1, actors generate batch
s on version s - 2. At each batch boundary an actor applies what it has staged and, if it still lacks
the version the next batch needs, waits for it (a stall); then it "generates" for a fixed time. How an
actor gets versions is the mode: `Synced` stages them from its region's bucket in the background (a
real `actor.updater.Updater`), `Instant` has them the moment the trainer publishes (no transfer cost).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from trainer.lag import summarize

if TYPE_CHECKING:
    from actor.updater import Updater
    from aurora_store.coord.coordinator import Coordinator
    from bench.fleet.churn import Event

POLL_S = 0.2
"""Longest a waiting thread goes without checking for a failure elsewhere or the stop signal."""
BLOCK_MS = 200
"""How long a stager blocks on Redis for its region's next event."""


class LoopError(RuntimeError):
    """A thread of the loop failed, or a step did not complete in time."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Timing:
    """The stand-ins' fixed durations and the step schedule."""

    generation_s: float
    """One actor's batch ("generation" stand-in: a sleep)."""
    training_s: float
    """One trainer step before it publishes ("training" stand-in: a sleep)."""
    warmup_steps: int
    """Steps before the timed ones (their batches need only version 0)."""
    timed_steps: int
    async_level: int = 1
    """Off-policy steps allowed: the batch for step s runs on a version >= s - 1 - async_level."""
    step_timeout_s: float = 1800.0
    """Longest wait for one step's batches before the run fails."""

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.timed_steps

    def need(self, step: int) -> int:
        """The oldest version the batch for ``step`` may run on."""
        return max(0, step - 1 - self.async_level)


class Weights(Protocol):
    """How one actor holds and advances its weights."""

    def applied(self) -> int:
        """The version the next batch would run on."""

    def boundary(self, need: int, stop: threading.Event) -> None:
        """At a safe point between batches: apply what is staged, and wait until ``applied() >= need``."""

    def threads(self, stop: threading.Event) -> list[tuple[str, Callable[[], None]]]:
        """Background work to run beside the actor (a stager) until ``stop`` is set."""


class _Failures:
    """The first failure of any thread the loop started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.error: tuple[str, BaseException] | None = None

    def failed(self, who: str, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = (who, exc)

    def check(self) -> None:
        if self.error is not None:
            who, exc = self.error
            raise LoopError(f"{who} failed: {type(exc).__name__}: {exc}") from exc


class VersionBox:
    """The newest version the trainer has published, for `Instant` actors."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.version = 0

    def publish(self, version: int) -> None:
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def wait_for(self, version: int, stop: threading.Event) -> int:
        with self._cond:
            while self.version < version and not stop.is_set():
                self._cond.wait(POLL_S)
            return self.version


class Instant:
    """Ideal: an actor holds every version the moment it is published; no byte moves, nothing is applied."""

    def __init__(self, box: VersionBox) -> None:
        self._box = box
        self._applied = 0

    def applied(self) -> int:
        return self._applied

    def boundary(self, need: int, stop: threading.Event) -> None:
        self._applied = self._box.wait_for(need, stop)

    def threads(self, stop: threading.Event) -> list[tuple[str, Callable[[], None]]]:
        return []


class Synced:
    """A real actor's weights: a stager thread fetches, verifies and decodes the region's newest version
    while the actor generates; the actor applies it at the next batch boundary.

    The stager stages only while nothing staged waits to be applied, so an apply never waits on a fetch
    in flight; a version that appears meanwhile is staged right after the apply (a full version skips
    those in between: the updater plans the cheapest path to the newest)."""

    def __init__(self, up: Updater, coord: Coordinator, region: str) -> None:
        self.up, self.coord, self.region = up, coord, region
        self._staged = threading.Event()
        self._applied = threading.Event()
        self.staged_at: list[tuple[int, float]] = []
        """(version, when) each time the stager finished staging."""
        self.applied_at: list[tuple[int, float]] = []
        """(version, when) each time the actor applied a version at a batch boundary."""
        self.joined_at = 0.0
        """When it applied its first version (0: from the start; a joining actor: when its bootstrap ended)."""

    def applied(self) -> int:
        assert self.up.applied is not None
        return self.up.applied.version

    def boundary(self, need: int, stop: threading.Event) -> None:
        while True:
            staged = self.up.staged
            if staged is not None and staged.version > self.applied():
                self.up.apply()
                self.applied_at.append((self.applied(), time.perf_counter()))
                self._applied.set()
            if self.applied() >= need or stop.is_set():
                return
            self._staged.wait(POLL_S)
            self._staged.clear()

    def threads(self, stop: threading.Event) -> list[tuple[str, Callable[[], None]]]:
        return [("stager", functools.partial(self._stage_loop, stop))]

    def _stage_loop(self, stop: threading.Event) -> None:
        after = self.coord.regions.last_event_id(self.region)
        while not stop.is_set():
            latest = self.up.latest()
            applied = self.applied()
            if latest is not None and latest > applied:
                staged = self.up.staged
                if staged is None or staged.version <= applied:
                    done = self.up.stage(latest)
                    if done is not None:
                        self.staged_at.append((done.version, time.perf_counter()))
                    self._staged.set()
                else:  # wait for the actor to apply what is staged, then stage what came since
                    self._applied.wait(POLL_S)
                    self._applied.clear()
                continue
            events = self.coord.regions.events(self.region, after, block_ms=BLOCK_MS)
            if events:
                after = events[-1].id


@dataclass(slots=True)
class Batch:
    actor: str
    step: int
    version: int
    """The version it ran on."""
    stall_s: float
    """Time at the boundary before it: applying and waiting for the version it needed."""
    start: float
    end: float


class _Board:
    """Which actors have finished their batch for each step, and which actors the trainer waits for.

    An actor is a member from its first step on until it is preempted; the trainer's step waits for the
    batches of the members whose first step it has reached. A preempted actor's batches are dropped."""

    def __init__(self, actors: list[str]) -> None:
        self._cond = threading.Condition()
        self._first = dict.fromkeys(actors, 1)
        self._left: set[str] = set()
        self.waiting = 1
        """The step the trainer waits for (or will wait for next)."""
        self.batches: dict[int, list[Batch]] = {}

    def done(self, batch: Batch) -> None:
        with self._cond:
            if batch.actor in self._left:
                return
            self.batches.setdefault(batch.step, []).append(batch)
            self._cond.notify_all()

    def join(self, actor: str) -> int:
        """Add ``actor`` from the step after the one the trainer waits for; returns that step."""
        with self._cond:
            first = self.waiting + 1
            self._first[actor] = first
            return first

    def begin(self, step: int) -> None:
        """The trainer waits for ``step`` from now on (a joiner from now on starts with the next one)."""
        with self._cond:
            self.waiting = step

    def leave(self, actor: str) -> None:
        with self._cond:
            self._left.add(actor)
            self._cond.notify_all()

    def _missing(self, step: int) -> bool:
        done = {b.actor for b in self.batches.get(step, ())}
        return any(a not in done and a not in self._left and first <= step for a, first in self._first.items())

    def wait(self, step: int, timeout_s: float, check: Callable[[], None]) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self.waiting = step
            while self._missing(step):
                check()
                if time.monotonic() > deadline:
                    raise LoopError(f"the batches of step {step} were not done within {timeout_s:.0f} s")
                self._cond.wait(POLL_S)


@dataclass(frozen=True, slots=True)
class Churn:
    """Spot churn for `run_steps`: the schedule, and how a mode makes a joining actor's weights (blocking:
    a bootstrap from its region's bucket, or at once in the ideal mode)."""

    events: list[Event]
    join: Callable[[str, str], Weights]
    """``join(actor, region)``."""


def _actor(
    name: str, w: Weights, timing: Timing, base: int, board: _Board, stop: threading.Event, first: int = 1
) -> None:
    for step in range(first, timing.total_steps + 1):
        t0 = time.perf_counter()
        w.boundary(base + timing.need(step), stop)
        start = time.perf_counter()
        if stop.is_set():
            return
        version = w.applied()
        if stop.wait(timing.generation_s):  # the generation stand-in
            return
        board.done(Batch(name, step, version, start - t0, start, time.perf_counter()))


def run_steps(
    weights: dict[str, Weights],
    publish: Callable[[int], dict[str, Any]],
    timing: Timing,
    check: Callable[[], None] = lambda: None,
    base_version: int = 0,
    churn: Churn | None = None,
) -> dict[str, Any]:
    """Run the loop: actors in threads, the trainer here. Every actor holds ``base_version`` at the start;
    ``publish(step)`` makes version ``base_version + step`` available and returns what to record about it;
    ``check`` raises if something outside the loop failed. With ``churn``, its events happen as the trainer
    starts waiting for their step: a preempted actor stops at once (its batch in flight is lost), a joining
    one is made by ``churn.join`` in a thread of its own and takes batches from the step after the one the
    trainer then waits for."""
    failures = _Failures()
    stop = threading.Event()
    board = _Board(list(weights))
    threads: list[threading.Thread] = []
    stops: dict[str, threading.Event] = {}
    by_step: dict[int, list[Event]] = {}
    for e in churn.events if churn is not None else ():
        by_step.setdefault(e.step, []).append(e)
    churned: list[dict[str, Any]] = []
    t_start = time.perf_counter()

    def start(name: str, fn: Callable[[], None]) -> None:
        def body() -> None:
            try:
                fn()
            except BaseException as exc:  # reported to the trainer, which raises it
                failures.failed(name, exc)
                stop.set()

        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        threads.append(t)

    def check_all() -> None:
        failures.check()
        check()

    def launch(name: str, w: Weights, first: int) -> None:
        own = stops[name] = threading.Event()
        for what, fn in w.threads(own):
            start(f"{what} {name}", fn)
        start(f"actor {name}", functools.partial(_actor, name, w, timing, base_version, board, own, first))

    def join(e: Event) -> None:
        assert churn is not None
        t0 = time.perf_counter()
        w = churn.join(e.actor, e.region)
        if stop.is_set():
            return
        ready = time.perf_counter()
        first = board.join(e.actor)
        churned.append(
            {"step": e.step, "kind": "join", "actor": e.actor, "region": e.region, "bootstrap_s": ready - t0}
            | {"ready_at_s": ready - t_start, "first_step": first, "version": w.applied()}
        )
        launch(e.actor, w, first)

    steps: list[dict[str, Any]] = []
    try:
        for name, w in weights.items():
            launch(name, w, 1)
        for step in range(1, timing.total_steps + 1):
            board.begin(step)
            for e in by_step.get(step, ()):
                if e.kind == "preempt":
                    board.leave(e.actor)
                    stops[e.actor].set()  # no warning: whatever it was doing is dropped
                    churned.append({"step": e.step, "kind": "preempt", "actor": e.actor, "region": e.region})
                else:
                    start(f"join {e.actor}", functools.partial(join, e))
            t0 = time.perf_counter()
            board.wait(step, timing.step_timeout_s, check_all)
            t1 = time.perf_counter()
            time.sleep(timing.training_s)  # the training stand-in
            t2 = time.perf_counter()
            info = publish(step)
            t3 = time.perf_counter()
            steps.append({"step": step, "trainer_waited_s": t1 - t0, "publish_s": t3 - t2, "end": t3 - t_start, **info})
        check_all()
    finally:
        stop.set()
        for own in list(stops.values()):
            own.set()
        for t in threads:
            t.join(120)
    out = _summary(steps, board.batches, timing, base_version)
    if churn is not None:
        out["churn"] = churned
    return out


def _summary(steps: list[dict[str, Any]], batches: dict[int, list[Batch]], timing: Timing, base: int) -> dict[str, Any]:
    """Per step: time since the previous step's end, stalls, versions used, the version lag of its batches
    (:mod:`trainer.lag`, p50/p99/max); means over the timed steps, and the lag over every timed batch."""
    out = []
    lags: dict[int, list[int]] = {}
    for i, s in enumerate(steps):
        bs = batches[s["step"]]
        lags[s["step"]] = [base + s["step"] - 1 - b.version for b in bs]
        prev_end = steps[i - 1]["end"] if i else 0.0
        out.append(
            {
                **s,
                "step_time_s": s["end"] - prev_end,
                "stall_max_s": max(b.stall_s for b in bs),
                "stall_mean_s": sum(b.stall_s for b in bs) / len(bs),
                "versions_used": sorted({b.version for b in bs}),
                "staleness_max": max(lags[s["step"]]),
                "version_lag": asdict(summarize(lags[s["step"]])),
                "stalls": {b.actor: b.stall_s for b in bs},
                "last_batch_region": max(bs, key=lambda b: b.end).actor.split("/", 1)[0],
            }
        )
    timed = out[timing.warmup_steps :]

    def mean(key: str) -> float:
        return sum(s[key] for s in timed) / len(timed)

    return {
        "step_time_s": mean("step_time_s"),
        "stall_max_s": mean("stall_max_s"),
        "stall_fraction": sum(s["stall_max_s"] for s in timed) / sum(s["step_time_s"] for s in timed),
        "trainer_waited_s": mean("trainer_waited_s"),
        "publish_s": mean("publish_s"),
        "staleness_max": max(s["staleness_max"] for s in timed),
        "version_lag": asdict(summarize([x for s in timed for x in lags[s["step"]]])),
        "steps": out,
    }
