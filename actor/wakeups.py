"""What Redis pushes to one actor, read with one blocking call: its job inbox, its region's commits,
and the trainer's notices about its results.

An idle actor costs Redis one blocking XREAD every ``block_s`` (plus its heartbeat), instead of
polling the region's version and its inbox many times a second. The listener thread only
signals: the main loop takes its jobs when :attr:`Wakeups.kick` is set, the stager checks the
region's version when :meth:`Wakeups.wait_commit` returns, and notices go to a callback. Each
signal is a hint to check, never trusted as the answer: what is staged or served is read and
verified as before, and a slow periodic check by the waiters is the safety net under a lost
wake-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.notices import Notice

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
    ) -> None:
        """Without a ``board`` it listens to the region's commits only (an actor that takes no jobs,
        as ``python -m actor.follow``)."""
        self.coord, self.board = coord, board
        self.worker_id = worker_id
        self.block_ms = max(int(block_s * 1000), 1)
        self.on_notices = on_notices
        self.kick = threading.Event()
        """Set when jobs may be waiting (or anything else the main loop should look at now)."""
        self._commits = threading.Condition()
        self._seq = 0
        self.commits = coord.regions.commits_key(region)
        self.inbox = board.inbox(worker_id) if board is not None else None
        self.notices = board.notices.key(worker_id) if board is not None else None
        self._after: dict[str, str] = {self.commits: "$"}
        if self.inbox is not None and self.notices is not None:
            self._after |= {self.inbox: "0-0", self.notices: f"{int(time.time() * 1000)}-0"}
        self.round_trips = 0

    def rewind(self) -> None:
        """Read every stream from its start again (Redis lost its state: new ids may be below the old)."""
        self._after = dict.fromkeys(self._after, "0-0")
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

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                if self._after[self.commits] == "$":
                    self._after[self.commits] = self._last(self.commits)
                got = self.coord.read_streams(dict(self._after), block_ms=self.block_ms, count=256)
                self.round_trips += 1
            except CoordinationError as exc:
                if stop.is_set():
                    return  # stopping: the client was closed under its blocked read ("Bad file descriptor")
                log.debug("actor %s: listener: %s", self.worker_id, exc)
                stop.wait(1.0)
                continue
            for key, entries in got.items():
                if not entries or key not in self._after:
                    continue
                self._after[key] = entries[-1][0]
                if key == self.inbox:
                    self.kick.set()
                elif key == self.commits:
                    self._bump()
                elif self.board is not None and self.on_notices is not None:
                    self.on_notices(self.board.notices.parse(self.worker_id, entries))

    def _last(self, key: str) -> str:
        last = self.coord.call(self.coord.r.xrevrange, key, count=1)
        return last[0][0] if last else "0-0"
