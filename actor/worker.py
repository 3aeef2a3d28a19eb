"""``aurora actor`` (also ``python -m actor.worker``): the rollout actor process.

Builds its tokenizer, engine and reward from the run (``actor.assemble``), registers, keeps a
heartbeat, takes the jobs leased to it, generates on exactly the version each job names as the
run says to sample, scores completions with the run's reward in a process of its own under a
time limit (``actor.rewards``), and submits results tagged with lease token, version and
version hash, their payload packed (:mod:`aurora_store.format.results`) and, above
``--inline-bytes``, put in this region's bucket with only its reference through Redis. A
background thread stages the next version while the engine generates; the main loop applies
it between batches, never during one. An actor with no work applies whatever is staged, so one
that fell behind catches up by deltas and becomes eligible again once it holds the latest
version or the one before.

Nothing polls: one listener thread (:mod:`actor.wakeups`) blocks on this actor's inbox, its
region's commits and the trainer's notices, and beats with each blocking read (one ZADD, 2.5 times a
lifetime, in the read's round trip), on the one connection an idle actor holds (the others it opened while busy
are closed when it falls idle); the inbox entries it reads are claimed by the main loop; the
leases of the jobs it runs are renewed while they run (:mod:`actor.renewals`), so a batch longer
than a lease keeps them; and the listener's look at the region's version every ``--check-s`` is the
safety net under a lost commit event.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

import torch

from actor import assemble
from actor.batches import Batches
from actor.config import ActorConfig
from actor.follower import Follower
from actor.identity import Identity
from actor.metrics import ActorMetrics
from actor.outbox import Outbox
from actor.renewals import Renewer
from actor.rewards import RewardPool
from actor.updater import Applied, Updater, open_sync_runs
from actor.wakeups import listener
from aurora_store.cli_parser import Parser
from aurora_store.config.options import add_options, build
from aurora_store.coord.backoff import Backoff, reason
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.lease import Lease
from aurora_store.coord.workers import Beat
from aurora_store.diagnostics import dump_stacks_on_signal
from aurora_store.errors import (
    AuroraError,
    CorruptError,
    LayoutError,
    MissingError,
    StoreError,
    UnsupportedError,
)
from aurora_store.redact import setup_logging
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tokenizers import Tokenizer

log = logging.getLogger("aurora.actor")
T = TypeVar("T")
CLOSE_WAIT_S = 10.0
"""How long a stopping actor waits for its stager and renewer to finish before it closes the clients
they use."""


class Actor:
    """One actor's life: it joins the run (:meth:`setup`), takes what the listener hands over and serves
    it (:class:`actor.batches.Batches`) until stopped, registers again when Redis forgot it, and leaves
    owing nothing it can pay (:meth:`close`)."""

    def __init__(self, cfg: ActorConfig) -> None:
        self.cfg = cfg
        sync = cfg.sync
        self.wid = sync.worker_id
        self.coord = Coordinator(sync.redis, sync.run_id, client_name=f"aurora-actor-{self.wid}")
        self.board = JobBoard(self.coord)
        self.run, self.fallback = open_sync_runs(sync)
        self.metrics = ActorMetrics(sync.region, self.wid)
        """This actor's Prometheus metrics (served by ``aurora actor --metrics-port``)."""
        self.metrics.watch_redis(self.coord)
        self.run.store.meter = self.metrics.m.meter("region")
        if self.fallback is not None:
            self.fallback.store.meter = self.metrics.m.meter("fallback")
        self.stop = threading.Event()
        self.outbox = Outbox(
            self.board,
            self.run.store,
            self.wid,
            sync.region,
            inline_bytes=cfg.rollout.inline_bytes,
            on_refused=self.halt,
            identity=self._identity(),
            reader=self.run.reader,
            applied=self._applied_version,
        )
        """What this actor submitted, and what the trainer said of it."""
        self.beat = Beat(self.coord.workers, self.wid, cfg.rollout.heartbeat_s)
        """This actor's heartbeat: one ZADD a beat (beaten by the listener, on its connection)."""
        self.wake = listener(
            self.coord,
            self.wid,
            sync.region,
            cfg.rollout,
            board=self.board,
            beat=self.beat,
            on_lost=self._lost,
            on_notices=self.outbox.told,
        )
        self.renewer = Renewer(self.board, self.wid, max_period_s=cfg.rollout.heartbeat_s / 3)
        """The leases this actor holds, renewed while their jobs run."""
        self._reregister = threading.Event()
        """Set by the heartbeat when this actor's state in Redis is gone."""
        self.backoff = Backoff(f"actor {self.wid}", log)
        """How the main loop waits out a Redis that fails or turns it away."""
        self.rewards: RewardPool | None = None
        """The run's reward function in a process of its own (started by :meth:`setup`, ended by :meth:`close`)."""
        self.batches: Batches
        """Serves the leases this actor claims (made by :meth:`equip`, once the engine is up)."""

    def _identity(self) -> Identity | None:
        """This actor's key and certificate (``--identity-key``, ``--identity-cert``), checked; None if not given."""
        key, cert = self.cfg.identity_key, self.cfg.identity_cert
        if key is None or cert is None:
            return None
        return Identity.load(key, cert, actor=self.wid, run=self.cfg.sync.run_id)

    def _applied_version(self) -> int:
        up = getattr(self, "up", None)  # None until the engine is up
        return up.applied.version if up is not None and up.applied is not None else 0

    @property
    def broken(self) -> str | None:
        """Why the actor stopped on its own engine's state (``--verify-live`` found other weights)."""
        follower = getattr(self, "follower", None)  # None until the engine is up
        return follower.broken if follower is not None else None

    @property
    def refused(self) -> bool:
        """Whether the actor stopped because the trainer kept refusing its results."""
        return self.outbox.refused

    def halt(self) -> None:
        """Stop the loops (a signal, or the trainer refusing this actor's results): every waiter wakes."""
        self.stop.set()
        self.wake.poke()
        self.renewer.stop()

    def _wait_for_version(self) -> int:
        while not self.stop.is_set():
            with contextlib.suppress(StoreError):
                latest = self.run.latest()
                if latest is not None:
                    return latest
            self.stop.wait(0.2)
        raise SystemExit(0)

    def _run_files(self) -> dict[str, bytes]:
        """The run's files as the region's latest version lists them; from the fallback (home) bucket
        when the region's copy of that manifest or a file is damaged (another process's doing: the
        actor waits it out in :meth:`setup`, never dies of it)."""
        latest = self._wait_for_version()
        try:
            return assemble.run_files(self.run, latest)
        except (CorruptError, MissingError) as exc:
            if self.fallback is None:
                raise
            log.warning("actor %s: %s; reading the run's files from the fallback", self.wid, exc)
            return assemble.run_files(self.fallback, latest)

    def setup(self) -> None:
        files = self._retrying("read the run's files", self._run_files)
        spec = assemble.run_spec(self.run, files)
        tok = assemble.tokenizer(spec, files)
        self.rewards = RewardPool(spec.reward, timeout_s=spec.reward_timeout_s, stop=self.stop)
        self.engine = assemble.engine(self.run, spec, files, self.cfg.engine, self.wid)
        self.follow(
            Updater(
                self.run,
                region=self.cfg.sync.region,
                coord=self.coord,
                fallback=self.fallback,
                worker_id=self.wid,
                live=self.engine.live,
            )
        )
        applied = self._retrying("bootstrap", self.up.bootstrap)
        self._retrying(
            "register",
            lambda: self.coord.workers.register(
                "actor", self.cfg.sync.region, worker_id=self.wid, ttl_s=self.cfg.rollout.heartbeat_s
            ),
        )
        self.equip(tok=tok, vocab=assemble.vocab_size(self.run, files), sampling=spec.sampling, rewards=self.rewards)
        rejoined = self._retrying("join", lambda: self.board.throughputs.joined(self.wid))
        if not rejoined:
            self._retrying("calibrate", self.batches.calibrate)
        self._retrying(
            "say its version",
            lambda: self.coord.workers.update(self.wid, version=applied.version, version_hash=applied.version_hash),
        )
        self.follower.now_at(applied)
        self.metrics.joined(True)
        log.info("actor %s %s at version %d", self.wid, "rejoined" if rejoined else "joined", applied.version)

    def follow(self, up: Updater) -> None:
        """Follow the region's versions through ``up`` (over the engine's live weights): what
        :meth:`setup` does once the engine is up, and what a caller that builds the engine itself does."""
        self.up = up
        up.on_refused = self.metrics.m.rejected
        self.follower = Follower(
            up,
            self.wake,
            self.metrics,
            who=self.wid,
            stop=self.stop,
            check_s=self.cfg.rollout.check_s,
            verify_live=self.cfg.sync.verify_live,
            on_applied=self._applied,
            on_broken=self.halt,
        )
        """Stages and applies the region's versions for the engine."""

    def equip(self, *, tok: Tokenizer, vocab: int, sampling: SamplingConfig, rewards: RewardPool) -> None:
        """Serve leases (:attr:`batches`) on this actor's engine and followed weights with ``tok``, the model's
        ``vocab`` size, the run's ``sampling`` and ``rewards``: what :meth:`setup` does once the engine is up
        and :meth:`follow` was called, and what a caller that builds the engine itself does."""
        self.batches = Batches(
            self.wid,
            engine=self.engine,
            tok=tok,
            vocab=vocab,
            sampling=sampling,
            rewards=rewards,
            follower=self.follower,
            outbox=self.outbox,
            renewer=self.renewer,
            throughputs=self.board.throughputs,
            metrics=self.metrics,
            rollout=self.cfg.rollout,
            stop=self.stop,
        )

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` until it succeeds (or the actor is stopped): a damaged region, a Redis that is
        restarting, are waited out (with backoff, said once) instead of ending the actor. An engine
        that cannot hold the run's weights (a layout it cannot write, an unsupported engine) never
        will: that ends the actor at once, with the error."""
        backoff = Backoff(f"actor {self.wid}: {what}", log, base_s=1.0, cap_s=15.0)
        while True:
            try:
                got = fn()
                backoff.succeeded()
                return got
            except (LayoutError, UnsupportedError):
                raise
            except AuroraError as exc:
                if isinstance(exc, CoordinationError):
                    self.metrics.redis_failed(reason(exc))
                wait = backoff.failed(exc)
            if self.stop.wait(wait):
                raise SystemExit(0)

    def _applied(self, applied: Applied) -> None:
        """A version is the engine's now: tell the engine, and note it for the trainer's report."""
        self.engine.applied(applied.version, applied.version_hash)
        with contextlib.suppress(CoordinationError):
            self.coord.note(
                "applied",
                actor=self.wid,
                region=self.cfg.sync.region,
                version=applied.version,
                skipped=self.follower.skipped,
                ms=int(time.time() * 1000),
            )

    def _lost(self) -> None:
        """The listener's beat (on its thread and connection, so a long batch does not look like a dead
        actor, and an idle actor holds one connection) says this actor's state in Redis is gone (a flush,
        an empty failover, a pruned registration: no disconnect tells), or it failed: the main loop
        registers again."""
        self._reregister.set()
        self.wake.kick.set()

    def _register_again(self) -> None:
        self._reregister.clear()
        self.coord.workers.register(
            "actor", self.cfg.sync.region, worker_id=self.wid, ttl_s=self.cfg.rollout.heartbeat_s
        )
        assert self.up.applied is not None
        self.coord.workers.update(self.wid, version=self.up.applied.version, version_hash=self.up.applied.version_hash)
        self.board.rewind(self.wid)
        self.wake.rewind()

    def loop(self) -> None:
        self._threads = [
            threading.Thread(target=self.wake.run, args=(self.stop,), name="listener", daemon=True),
            threading.Thread(target=self.follower.run, name="stager", daemon=True),
            threading.Thread(target=self.renewer.run, args=(self.stop,), name="renewer", daemon=True),
        ]
        for t in self._threads:
            t.start()
        self.wake.kick.set()  # take whatever is waiting already
        while not self.stop.is_set():
            try:
                if self._reregister.is_set():
                    self._register_again()
                self.wake.kick.wait(self.cfg.rollout.check_s)  # woken by the listener; else the safety net
                self.wake.kick.clear()
                if self.stop.is_set():
                    break
                leases = self._claim()
                self.renewer.hold(leases)
                if leases:
                    self.follower.busy.set()
                    try:
                        self.batches.serve(leases)
                    except CoordinationError:
                        self.batches.abandon(leases)
                        raise
                    self.follower.busy.clear()
                    self.wake.kick.set()  # more may wait: take again before waiting
                elif self.up.staged is not None:  # idle: a safe point to apply whatever is staged
                    self.follower.apply()
                    self.wake.poke()
                elif not self.wake.waiting:
                    # idle: close what this loop, the stager or a setup opened (the listener's connection,
                    # busy in its blocking read, stays); every --check-s at most, when no work woke it
                    self.coord.release_idle()
            except CoordinationError as exc:
                if self.stop.is_set():
                    break  # stopping: what Redis could not be told is said once, by _leave
                self._reregister.set()
                self.follower.busy.clear()
                self.metrics.joined(False)
                self.metrics.redis_failed(reason(exc))
                self.stop.wait(self.backoff.failed(exc))  # jittered: a refused fleet does not return at once
                continue
            self.backoff.succeeded()
            self.metrics.joined(True)
        self._leave()

    def _claim(self) -> list[Lease]:
        """The leases of the inbox entries the listener handed over (up to a batch), still this actor's."""
        entries = self.wake.jobs(self.cfg.rollout.batch)
        if not entries:
            return []
        try:
            return self.board.claim(self.wid, entries)
        except CoordinationError:
            self.wake.unread(entries)  # claimed on the next try (a claim is checked against its job)
            raise

    def _leave(self) -> None:
        """What a stopping actor owes the trainer: every lease it still holds given back (the trainer
        leases those jobs again at once) and its registration removed. What Redis cannot be told (cut
        off, restarting) is said in one line: which leases, and when they and the registration expire
        on their own (then the trainer leases the jobs again and counts the actor gone)."""
        given = self.renewer.give_back_all()
        failed, error = given.failed, given.error
        try:
            self.coord.workers.unregister(self.wid)
            registered = False
        except CoordinationError as exc:
            registered, error = True, error or exc
        if error is None:
            if given.owed:
                log.info("actor %s: stopping; gave back %d leases", self.wid, given.owed)
            return
        now = time.time()
        said = []
        if failed:
            last = max(e for _, e in failed)
            jobs = ", ".join(lease.job for lease, _ in failed[:8]) + (", ..." if len(failed) > 8 else "")
            said.append(
                f"{len(failed)} leases not given back (jobs {jobs}) expire by {_utc(last)}, in "
                f"{max(0.0, last - now):.0f} s, and the trainer leases those jobs again then"
            )
        if registered:
            said.append(
                f"its registration expires within {self.cfg.rollout.heartbeat_s:.0f} s of its last heartbeat "
                "(the trainer then counts it gone)"
            )
        log.warning("actor %s: stopped without reaching Redis (%s): %s", self.wid, error, "; ".join(said))

    def close(self) -> None:
        """End what this actor started: its threads (given :data:`CLOSE_WAIT_S` to finish what they do,
        so none is left reading from a client closed under it), the reward process, its Redis clients."""
        self.halt()
        end = time.monotonic() + CLOSE_WAIT_S
        for t in getattr(self, "_threads", []):
            if t.name != "listener":  # it blocks up to --check-s on Redis; it ends quietly when stopped
                t.join(max(0.0, end - time.monotonic()))
        if self.rewards is not None:
            self.rewards.close()
            self.rewards = None
        self.board.close()
        self.coord.close()


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S UTC")


def run(cfg: ActorConfig) -> int:
    """Serve as an actor until SIGTERM or SIGINT."""
    setup_logging()
    dump_stacks_on_signal()
    torch.set_num_threads(cfg.engine.threads)
    w = Actor(cfg)
    w.metrics.m.serve(cfg.metrics_port, cfg.metrics_addr)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: w.halt())
    try:
        w.setup()
        w.loop()
    finally:
        w.close()
    if w.broken is not None:
        return 4
    return 3 if w.refused else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m actor.worker``: the same as ``aurora actor``."""
    p = Parser(prog="python -m actor.worker", description=__doc__)
    add_options(p, ActorConfig)
    return run(build(ActorConfig, p.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
