"""What Redis pushes to one actor, read with one blocking call: its job inbox, its region's commits,
and the trainer's notices about its results; and the actor's heartbeat, on the same connection.

An idle actor is one connection and one loop: the beat (one ZADD, :class:`~aurora_store.coord.workers.Beat`)
and a blocking XREAD that waits until the next beat is due, sent together: one round trip and two
commands a beat period, and nothing else while no job comes but a look at the region's version every
``--check-s`` (a third command in that round trip on one server; on a Redis Cluster the region's
entry is on the control slot, not the actor's shard, so it is a round trip of its own, made
:data:`CLUSTER_LOOKS_APART` times less often). The listener thread only signals and hands over: inbox entries go to
the main loop (:meth:`Wakeups.jobs`, claimed there when :attr:`Wakeups.kick` is set), the stager checks
the region's version when :meth:`Wakeups.wait_commit` returns, and notices go to a callback. Each
signal is a hint to check, never trusted as the answer: a claimed entry is checked against its job,
what is staged or served is read and verified as before, and a slow periodic check by the stager is
the safety net under a lost commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from actor.config import RolloutConfig
from aurora_store.coord import wire
from aurora_store.coord.backoff import Backoff
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.notices import Notice
from aurora_store.coord.regions import RegionVersion
from aurora_store.coord.workers import Beat

log = logging.getLogger("aurora.actor")


class Wakeups:
    """The listener of one actor (``run`` on a thread of its own)."""

    def __init__(
        self,
        coord: Coordinator,
        worker_id: str,
        region: str,
        *,
        block_s: float,
        board: JobBoard | None = None,
        on_notices: Callable[[list[Notice]], None] | None = None,
        beat: Beat | None = None,
        beat_every_s: float | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        """Without a ``board`` it listens to the region's commits only (an actor that takes no jobs,
        as ``python -m actor.follow``). ``beat``: beaten on this thread every ``beat_every_s`` (the
        blocking read returns for it; a cheap beat goes with the next read); ``on_lost``: called when a
        beat says this worker's state in Redis is gone, or a full beat fails (register again)."""
        self.coord, self.board = coord, board
        self.worker_id = worker_id
        self.block_ms = max(int(block_s * 1000), 1)
        self.on_notices = on_notices
        self.beat, self.beat_every_s, self.on_lost = beat, beat_every_s or block_s, on_lost
        self._next_beat = time.monotonic()
        self.region = region
        self.look_every_s = block_s * (CLUSTER_LOOKS_APART if coord.keys.cluster else 1)
        """How often this listener looks at the region's version (see :data:`CLUSTER_LOOKS_APART`)."""
        self._next_look = time.monotonic()
        self.looked = False
        """Whether this listener has looked at the region's version yet (then the stager need not)."""
        self.committed: int | None = None
        """The region's newest committed version as this listener last heard it (a commit event, or its
        own look at the region's version every ``block_s``): where the stager looks, so an idle actor's
        look at Redis happens here, on the listener's connection. A hint: what is staged is verified."""
        self._jobs: deque[tuple[str, dict[str, str]]] = deque()
        self._jobs_lock = threading.Lock()
        self._backoff = Backoff(f"actor {worker_id}: listener", None, cap_s=15.0)  # the main loop says it
        self.kick = threading.Event()
        """Set when jobs may be waiting (or anything else the main loop should look at now)."""
        self._commits = threading.Condition()
        self._seq = 0
        self.commits = coord.regions.commits_key(region, worker_id)
        self.inbox = board.inbox(worker_id) if board is not None else None
        self.notices = board.notices.key(worker_id) if board is not None else None
        self._after: dict[str, str] = {self.commits: "$"}
        if self.inbox is not None and self.notices is not None:
            self._after |= {self.inbox: "0-0", self.notices: f"{int(time.time() * 1000)}-0"}
        self.round_trips = 0

    def rewind(self) -> None:
        """Read every stream from its start again (Redis lost its state: new ids may be below the old)."""
        self._after = dict.fromkeys(self._after, "0-0")
        with self._jobs_lock:
            self._jobs.clear()
        self.poke()

    def poke(self) -> None:
        """Wake every waiter as a commit would, and the main loop (something changed here: check again)."""
        self._bump()
        self.kick.set()

    def _bump(self) -> None:
        with self._commits:
            self._seq += 1
            self._commits.notify_all()

    def wait_commit(self, seen: int, timeout: float) -> int:
        """Wait until a commit (or a poke) newer than ``seen`` arrives, at most ``timeout`` s; the newest."""
        with self._commits:
            self._commits.wait_for(lambda: self._seq != seen, timeout=timeout)
            return self._seq

    @property
    def seq(self) -> int:
        with self._commits:
            return self._seq

    def jobs(self, at_most: int) -> list[tuple[str, dict[str, str]]]:
        """Up to ``at_most`` inbox entries the listener read, oldest first (the main loop claims them)."""
        with self._jobs_lock:
            return [self._jobs.popleft() for _ in range(min(at_most, len(self._jobs)))]

    def unread(self, entries: list[tuple[str, dict[str, str]]]) -> None:
        """Put back entries :meth:`jobs` gave that could not be claimed (Redis failed): first in line."""
        with self._jobs_lock:
            self._jobs.extendleft(reversed(entries))
        self.kick.set()

    @property
    def waiting(self) -> int:
        with self._jobs_lock:
            return len(self._jobs)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            deadline, look = None, False
            try:
                if self._after[self.commits] == "$":
                    self._after[self.commits] = self._last(self.commits)
                look = self._look_due()
                if look and self.coord.keys.cluster:  # the region's entry is on the control slot, not here
                    self._looked(self.coord.regions.version(self.region))
                    look = False
                deadline = self._beat_if_due()
                # wake up for the next beat; the look rides on the first beat after it is due
                due = self._next_look if self.beat is None else self._next_beat
                block = min(self.block_ms, max(1, int((due - time.monotonic()) * 1000)))
                first, got = self.coord.read_streams_after(
                    self._with_read(look, deadline), dict(self._after), block_ms=block, count=256
                )
                self.round_trips += 1
            except CoordinationError as exc:
                if stop.is_set():
                    return  # stopping: the client was closed under its blocked read ("Bad file descriptor")
                log.debug("actor %s: listener: %s", self.worker_id, exc)
                if deadline is not None:
                    self._next_beat = time.monotonic()  # the beat did not land: beat again first
                if look:
                    self._next_look = time.monotonic()
                stop.wait(self._backoff.failed(exc))  # the main loop says it (the same Redis fails it)
                continue
            self._backoff.succeeded()
            if look:
                self._looked(self.coord.regions.parse_version(self.region, first.pop(0)))
            if deadline is not None and self.beat is not None and not self.beat.landed(deadline, first[0] == 1):
                self._beat_full()  # its entry was gone: Redis lost its state, or this worker was pruned
            for key, entries in got.items():
                if not entries or key not in self._after:
                    continue
                self._after[key] = entries[-1][0]
                if key == self.inbox:
                    entries = entries + self._rest_of_burst(entries[-1][0])
                    with self._jobs_lock:
                        self._jobs.extend(entries)
                    self.kick.set()
                elif key == self.commits:
                    self._heard([e[1].get("version") for e in entries])
                    self._bump()
                elif self.board is not None and self.on_notices is not None:
                    self.on_notices(self.board.notices.parse(self.worker_id, entries))

    def _rest_of_burst(self, after: str) -> list[tuple[str, dict[str, str]]]:
        """The inbox entries posted with those just read: a blocked read is answered at the first job of a
        batch the trainer posts in one go, and the main loop would start a batch of one while the rest
        arrive. One more read, without blocking, when jobs came (never while idle)."""
        assert self.inbox is not None
        try:
            got = self.coord.read_streams({self.inbox: after}, block_ms=0, count=256)
        except CoordinationError:
            return []  # read with the next blocking read
        rest = [e for key, entries in got.items() if key == self.inbox for e in entries]
        if rest:
            self._after[self.inbox] = rest[-1][0]
        return rest

    def _heard(self, versions: list[object]) -> None:
        """Commit events' versions (hostile: anyone who can write Redis may have put them there)."""
        for v in versions:
            try:
                got = wire.version(v)
            except wire.BadEntry as exc:
                self.coord.skipped.skip(exc.reason, f"commit event of region {self.region}: {exc}")
                continue
            self.committed = got if self.committed is None else max(self.committed, got)

    def _with_read(self, look: bool, deadline: int | None) -> list[tuple[object, ...]]:
        """What goes to Redis in the blocking read's round trip: the look at the region's version, the beat."""
        commands: list[tuple[object, ...]] = []
        if look:
            commands.append(("HGETALL", self.coord.regions.version_key(self.region)))
        if deadline is not None:
            commands.append(self.coord.workers.cheap_beat(self.worker_id, deadline))
        return commands

    def _look_due(self) -> bool:
        """Whether to look at the region's version now (every ``look_every_s``: the safety net under a lost
        commit event); on one server the look goes with the next read, on a cluster it is a call of its own."""
        if time.monotonic() < self._next_look:
            return False
        self._next_look = time.monotonic() + self.look_every_s
        return True

    def _looked(self, rv: RegionVersion | None) -> None:
        self.looked = True
        if rv is not None and rv.version != self.committed:  # the region's word replaces what events said
            self.committed = rv.version  # (an event anyone wrote with a version from nowhere lasts one look)
            self._bump()

    def _beat_if_due(self) -> int | None:
        """Beat if a beat is due: a cheap beat's deadline (sent with the next read), or a full beat here."""
        if self.beat is None or time.monotonic() < self._next_beat:
            return None
        self._next_beat = time.monotonic() + self.beat_every_s
        deadline = self.beat.plan()
        if deadline is None:
            self._beat_full()
        return deadline

    def _beat_full(self) -> None:
        assert self.beat is not None
        try:
            lost = self.beat.full()
        except CoordinationError as exc:
            log.debug("actor %s: full beat: %s", self.worker_id, exc)
            lost = True  # the main loop registers again (and says what fails, from its own calls)
        if lost and self.on_lost is not None:
            self.on_lost()

    def _last(self, key: str) -> str:
        last = self.coord.call(self.coord.r.xrevrange, key, count=1)
        return last[0][0] if last else "0-0"


CLUSTER_LOOKS_APART = 4
"""On a Redis Cluster a listener looks at its region's version every this many ``--check-s`` (1 minute
by default). The look is the net under a commit event the listener did not get: on one server the
event is written with the version, in one script, and the look rides in the beat's round trip; on a
cluster the event is copied to the actor's shard after the commit, so the look catches a copy lost to a
failed node, and it is a round trip to the master of the control slot: every ``--check-s``, with
10,000 idle actors on 3 masters, it gave that master 1.53x an even share of their Redis CPU."""

BEATS_PER_LIFETIME = 2.5
"""Beats in one heartbeat lifetime (``--heartbeat-s``): one late beat still leaves the actor alive."""


def listener(
    coord: Coordinator,
    worker_id: str,
    region: str,
    rollout: RolloutConfig,
    *,
    board: JobBoard,
    beat: Beat,
    on_lost: Callable[[], None] | None = None,
    on_notices: Callable[[list[Notice]], None] | None = None,
) -> Wakeups:
    """The listener an actor runs, its one idle loop: it beats with ``beat`` (:data:`BEATS_PER_LIFETIME` a
    ``--heartbeat-s``) and blocks on the actor's inbox, notices and region commits until the next beat,
    and looks at the region's version every ``--check-s``."""
    return Wakeups(
        coord,
        worker_id,
        region,
        block_s=rollout.check_s,
        board=board,
        on_notices=on_notices,
        beat=beat,
        beat_every_s=rollout.heartbeat_s / BEATS_PER_LIFETIME,
        on_lost=on_lost,
    )
