"""Rewards scored in a process of their own, under a time limit per call.

A reward function is user code (``--reward package.module:function``) or a checker that can be
slow on hostile input (math-verify on a pathological expression). The actor scores through a
:class:`RewardPool`: one child process (started with ``spawn``, so it inherits no threads or
model) that loads the reward once and answers one call at a time. A call that raises, returns
something that is not a finite number, outlives the time limit or kills its process scores 0
and is counted by kind; the process is restarted when it hangs or dies. The actor never dies of
a reward and a step never waits more than the time limit per completion.

A process that dies is not a score. It may have been killed from outside: the OOM killer, or a
SIGTERM to the actor's process group, which reaches the child too. So a call that finds its
process dead is tried once more in a fresh one; only a completion that kills two processes scores
0 as ``crashed``. While the actor is stopping (``stop`` set) nothing is retried and
:meth:`RewardPool.score_group` answers None: the group was never scored, and no reward, not even
0, may stand for it (the actor gives its lease back instead of submitting).
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from aurora_store.rl.errors import TaskError

log = logging.getLogger("aurora.actor")
START_TIMEOUT_S = 120.0
"""How long the child may take to import and load the reward (math-verify brings sympy)."""
FAILURES = ("error", "invalid", "timeout", "crashed")


def _serve(spec: str, conn: Connection) -> None:
    """The child: load the reward, warm it up, then score each (prompt, completion, answer) it receives."""
    from aurora_store.rl.rewards import load_reward

    try:
        reward = load_reward(spec)
    except Exception as exc:  # reported to the parent, which refuses to start
        conn.send(("load_error", f"{type(exc).__name__}: {exc}"[:500]))
        return
    with contextlib.suppress(Exception):  # a reward may well refuse this input; only its import cost mattered
        reward("", "0", "0")  # imports and caches (math-verify's sympy) happen now, not in the first timed call
    conn.send(("ready", None))
    while True:
        try:
            prompt, completion, answer = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", reward(prompt, completion, answer)))
        except Exception as exc:  # user code: any failure scores 0 in the parent
            conn.send(("error", f"{type(exc).__name__}: {exc}"[:300]))


class RewardPool:
    """Scores completions with the reward ``spec`` in a child process, ``timeout_s`` per call; ``stop``
    is the actor's: once set, a dead process is not restarted."""

    def __init__(self, spec: str, *, timeout_s: float, stop: threading.Event | None = None) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self.stop = stop
        self.failures: Counter[str] = Counter()
        """Every failed call so far, by kind: error, invalid, timeout, crashed."""
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: Any = None
        self._conn: Connection | None = None
        self._start()

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(self.spec, child), name="aurora-reward", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(START_TIMEOUT_S):
            self._kill()
            raise TaskError(f"reward {self.spec!r}: its process did not start in {START_TIMEOUT_S:.0f} s")
        try:
            kind, detail = parent.recv()
        except EOFError:
            self._kill()
            raise TaskError(f"reward {self.spec!r}: its process died while loading it") from None
        if kind != "ready":
            self._kill()
            raise TaskError(f"reward {self.spec!r}: {detail}")

    @property
    def pid(self) -> int | None:
        """The reward process's pid, while one runs."""
        return self._proc.pid if self._conn is not None and self._proc is not None else None

    def _kill(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
        if self._proc is not None:
            self._proc.join(10)

    def score(self, prompt: str, completion: str, answer: str) -> tuple[float, str | None]:
        """(reward, None), or (0.0, the kind of failure). A call whose process died is tried once more
        in a fresh process, unless the actor is stopping."""
        value, failure = self._call(prompt, completion, answer)
        if failure == "crashed" and not self._stopping():
            log.warning("reward %s: its process died; trying the completion once more in a fresh one", self.spec)
            value, failure = self._call(prompt, completion, answer)
        if failure is None:
            return value, None
        self.failures[failure] += 1
        log.warning("reward %s: %s; scored 0", self.spec, failure)
        return 0.0, failure

    def score_group(
        self, prompt: str, completions: Sequence[str], answer: str
    ) -> tuple[list[float], Counter[str]] | None:
        """Each completion's reward and the failures by kind; None when a call crashed while the actor
        is stopping (its process died with the actor's: the group was never scored)."""
        rewards, failures = [], Counter[str]()
        for completion in completions:
            reward, failure = self.score(prompt, completion, answer)
            if failure == "crashed" and self._stopping():
                return None
            if failure is not None:
                failures[failure] += 1
            rewards.append(reward)
        return rewards, failures

    def _stopping(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def _call(self, prompt: str, completion: str, answer: str) -> tuple[float, str | None]:
        if self._conn is None:
            self._start()
        assert self._conn is not None
        t0 = time.monotonic()
        failure: str | None
        try:
            self._conn.send((prompt, completion, answer))
            if not self._conn.poll(self.timeout_s):
                failure, value = "timeout", 0.0
            else:
                kind, value = self._conn.recv()
                failure = None if kind == "ok" else "error"
        except (EOFError, OSError):
            failure, value = "crashed", 0.0
        if failure is None and not _finite_number(value):
            failure = "invalid"
        if failure is None:
            return float(value), None
        if failure in ("timeout", "crashed"):
            self._kill()  # the next call starts a fresh process
        log.debug("reward %s: %s after %.2f s", self.spec, failure, time.monotonic() - t0)
        return 0.0, failure

    def close(self) -> None:
        self._kill()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
