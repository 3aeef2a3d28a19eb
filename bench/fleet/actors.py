"""The fleet of ``aurora bench coord``: real ``actor.worker.Actor`` loops with an instant engine.

Each actor is the real :class:`actor.worker.Actor` (its Coordinator, JobBoard, Updater; its listener,
which beats, stager and renewer threads; its claim/serve/submit loop), built on a tiny published run, with
what the benchmark does not measure replaced: the engine answers at once with fixed completions
of ``tokens`` tokens (ids below the vocabulary, float32 log-probabilities), the reward scores 0
without a process, and the tokenizer decodes to nothing. A :class:`Fleet` is threads of one
process; :class:`Procs` spreads the actors over several processes (``python -m bench.fleet.actors``),
each a Fleet counting its own round trips, so one interpreter's lock does not throttle a fleet of
a thousand actors (five threads each) on a small machine.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from actor.config import ActorConfig, RolloutConfig, SyncConfig
from actor.engines.base import Completion
from actor.updater import Updater
from actor.wakeups import BEATS_PER_LIFETIME, listener
from actor.worker import Actor
from aurora_store.cli_parser import Parser
from aurora_store.rl.sampling import SamplingConfig


class InstantEngine:
    """Answers every prompt at once with ``samples`` copies of one fixed completion."""

    def __init__(self, tokens: int, vocab: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, vocab, tokens).tolist()
        lps = (-rng.exponential(1.0, tokens)).astype(np.float32).astype(np.float64).tolist()
        self.completion = Completion(tuple(ids), tuple(lps), "length")
        self.live: Any = None  # the updater's own tensors hold the weights

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        top_p: float = 1.0,
    ) -> list[list[Completion]]:
        return [[self.completion] * samples for _ in prompts]

    def applied(self, version: int, version_hash: str) -> None:
        pass


class _Tokenizer:
    def decode(self, ids: Sequence[int]) -> str:
        return ""

    def prompt_ids(self, text: str) -> list[int]:
        return [1, 2, 3]


class _Reward:
    """Every completion scores 0: the benchmark measures coordination, not rewards (the actor calls
    what :class:`actor.rewards.RewardPool` offers)."""

    def score(self, prompt: str, completion: str, answer: str) -> tuple[float, str | None]:
        return 0.0, None

    def score_group(self, prompt: str, completions: Sequence[str], answer: str) -> tuple[list[float], Counter[str]]:
        return [0.0] * len(completions), Counter()


class Fleet:
    """``n`` actors of one region, started on a run whose version 0 is published at ``store``."""

    def __init__(
        self, n: int, *, store: str, redis: str, run_id: str, tokens: int, group: int, vocab: int, first: int = 0
    ) -> None:
        self.workers: list[Actor] = []
        self.threads: list[threading.Thread] = []
        sampling = SamplingConfig(group=group, max_new_tokens=tokens)
        for i in range(first, first + n):
            cfg = ActorConfig(
                sync=SyncConfig(store=store, region="home", redis=redis, run_id=run_id, worker_id=f"actor-{i:04d}"),
                rollout=RolloutConfig(batch=8),  # the actor's defaults: heartbeat, check interval, inline cap
            )
            w = Actor(cfg)
            w.engine = InstantEngine(tokens, vocab, seed=i)
            w.follow(Updater(w.run, region="home", coord=w.coord, worker_id=w.wid))
            w.equip(tok=_Tokenizer(), vocab=vocab, sampling=sampling, rewards=_Reward())  # type: ignore[arg-type]
            held = w.up.bootstrap()
            w.coord.workers.register("actor", "home", worker_id=w.wid, ttl_s=cfg.rollout.heartbeat_s)
            w.board.throughputs.report(w.wid, 1000.0, 1.0, beta=cfg.rollout.beta)  # calibrated: all alike
            w.coord.workers.update(w.wid, version=held.version, version_hash=held.version_hash)
            self.workers.append(w)

    def start(self) -> None:
        for w in self.workers:
            t = threading.Thread(target=w.loop, name=f"bench-{w.wid}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        for w in self.workers:
            w.halt()
        for t in self.threads:
            t.join(timeout=30)
        # connections stay open: a listener blocked in its read ends when the server goes


class Listeners:
    """``n`` idle actors as Redis sees them: each is the idle actor's own loop and nothing else, the
    :class:`actor.wakeups.Wakeups` listener that blocks on the actor's inbox, notices and region commits
    and beats (a :class:`~aurora_store.coord.workers.Beat`) on its one connection, built as
    :class:`actor.worker.Actor` builds it (:func:`actor.wakeups.listener`), one thread each. They register
    as actors that hold no version yet (still bootstrapping, as the trainer sees them), so they are leased
    nothing: a real actor's whole loop is six threads, and ten thousand of those in a few interpreters on
    two cores spend their time fighting over the interpreter lock, not on Redis."""

    def __init__(self, n: int, *, redis: str, run_id: str, first: int = 0, **_: Any) -> None:
        from aurora_store.coord.coordinator import Coordinator
        from aurora_store.coord.jobs import JobBoard
        from aurora_store.coord.workers import Beat

        rollout = RolloutConfig()
        self.stop_event = threading.Event()
        self.wakes: list[Any] = []
        self.coords: list[Any] = []
        self.threads: list[threading.Thread] = []
        for i in range(first, first + n):
            wid = f"idle-{i:05d}"
            coord = Coordinator(redis, run_id, client_name=f"aurora-actor-{wid}")
            coord.workers.register("actor", "home", worker_id=wid, ttl_s=rollout.heartbeat_s)
            beat = Beat(coord.workers, wid, rollout.heartbeat_s)
            # no on_lost: the actor's main loop would register again, what a row whose Redis keeps its state
            # never needs
            self.wakes.append(listener(coord, wid, "home", rollout, board=JobBoard(coord), beat=beat))
            self.coords.append(coord)

    def start(self) -> None:
        """Start the listeners spread over one beat period, as actors that started at different times beat
        (all at once, their first beats would be one burst a period, not the fleet's steady rate)."""
        period = RolloutConfig().heartbeat_s / BEATS_PER_LIFETIME
        for wake in self.wakes:
            t = threading.Thread(target=wake.run, args=(self.stop_event,), daemon=True)
            t.start()
            self.threads.append(t)
            time.sleep(period / max(len(self.wakes), 1))

    def stop(self) -> None:
        self.stop_event.set()  # each ends at its next wake-up; the server's end ends the rest


class RoundTrips:
    """Round trips every redis-py client of this process makes (a pipeline's batch is one)."""

    def __init__(self) -> None:
        import redis.connection

        self._n = itertools.count()
        self._cls = redis.connection.AbstractConnection
        self._orig = self._cls.send_packed_command
        counter, orig = self._n, self._orig

        def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            next(counter)
            return orig(conn, command, check_health)

        self._cls.send_packed_command = counted  # type: ignore[method-assign]

    def now(self) -> int:
        return next(self._n)  # each read costs one, subtracted by the readers

    def close(self) -> None:
        self._cls.send_packed_command = self._orig  # type: ignore[method-assign]


class Procs:
    """``n`` actors in ``procs`` processes; :meth:`trips` is the round trips they have made so far."""

    def __init__(self, n: int, procs: int, *, workdir: str, listeners: bool = False, **fleet: Any) -> None:
        """``listeners``: each process runs :class:`Listeners` (idle actors) instead of a :class:`Fleet`."""
        self.dir = Path(workdir)
        kind = "idle" if listeners else "fleet"
        self.procs: list[subprocess.Popen[bytes]] = []
        self._seq: list[int] = []
        self.kind = kind
        chunk = -(-n // procs)
        for k, first in enumerate(range(0, n, chunk)):
            argv = [
                sys.executable,
                "-m",
                "bench.fleet.actors",
                "--n",
                str(min(chunk, n - first)),
                "--first",
                str(first),
            ]
            argv += ["--out", str(self.dir / f"{kind}-{k}.json"), "--spec", json.dumps(fleet)]
            argv += ["--listeners"] if listeners else []
            log = open(self.dir / f"{kind}-{k}.log", "wb")  # noqa: SIM115
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
            self._seq.append(-1)
        self._wait(time.monotonic() + 600)

    def _read(self, k: int) -> dict[str, int] | None:
        try:
            return dict(json.loads((self.dir / f"{self.kind}-{k}.json").read_text()))
        except (OSError, ValueError):
            return None

    def _wait(self, deadline: float) -> int:
        total = 0
        for k, proc in enumerate(self.procs):
            while True:
                got = self._read(k)
                if got is not None and got["seq"] > self._seq[k]:
                    self._seq[k] = got["seq"]
                    total += got["trips"]
                    break
                if proc.poll() is not None:
                    log = f"{self.dir}/{self.kind}-{k}.log"
                    raise RuntimeError(f"fleet process {k} exited {proc.returncode}: see {log}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"fleet process {k} did not answer: see {self.dir}/{self.kind}-{k}.log")
                time.sleep(0.02)
        return total

    def trips(self) -> int:
        if self.kind == "idle":
            raise RuntimeError("idle actors' processes are not asked their round trips: Redis counts them")
        for proc in self.procs:
            proc.send_signal(signal.SIGUSR1)
        return self._wait(time.monotonic() + 600)  # thousands of threads a process: its main thread waits

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@dataclass(kw_only=True, slots=True)
class ProcessFlags:
    """The command line of one process of a :class:`Procs` fleet (``python -m bench.fleet.actors``)."""

    n: int
    """Actors this process runs."""
    first: int
    """Index of its first actor in the fleet."""
    out: str
    """The file it writes its round trips to, when ready and on SIGUSR1."""
    spec: dict[str, Any]
    """The Fleet's keyword arguments, as a JSON object."""
    listeners: bool = False
    """Run :class:`Listeners` (idle actors), not a :class:`Fleet`."""


THREAD_STACK = 512 * 1024
"""Stack of each thread of a fleet process (six an actor: a 10,000-actor fleet is 60,000 threads)."""


def main(argv: list[str] | None = None) -> int:
    """One process of a :class:`Procs` fleet: build, say ready (its round trips so far), start, and
    answer SIGUSR1 with its round trips until SIGTERM."""
    import logging

    from aurora_store.config.options import add_options, build

    p = Parser(prog="python -m bench.fleet.actors")
    add_options(p, ProcessFlags)
    args: ProcessFlags = build(ProcessFlags, p.parse_args(argv))
    logging.getLogger("aurora").setLevel(logging.ERROR)
    threading.stack_size(THREAD_STACK)
    trips = RoundTrips()
    fleet: Fleet | Listeners = (Listeners if args.listeners else Fleet)(args.n, first=args.first, **args.spec)
    stop = threading.Event()
    seq = itertools.count()

    def report(*_: Any) -> None:
        tmp = f"{args.out}.tmp"
        Path(tmp).write_text(json.dumps({"seq": next(seq), "trips": trips.now()}))
        os.replace(tmp, args.out)

    signal.signal(signal.SIGUSR1, report)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    fleet.start()
    report()
    while not stop.is_set() and os.getppid() == parent:  # the bench gone (killed): so is its fleet
        stop.wait(0.1)
    fleet.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
