"""A real ``redis-server`` on a free loopback port, without persistence, that a test or a benchmark
can kill, restart empty on the same port (every key lost, as after a failover to an empty replica)
and stop. The server runs in a process group of its own, so stopping it never leaves an orphan.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from types import TracebackType
from typing import IO, Self

from aurora_store.testing.processes import free_port, wait_until_answers


class RedisUnavailable(RuntimeError):
    """``redis-server`` is not installed (tests skip; benchmarks say so)."""


class RedisServer:
    """``redis-server --port P --save '' --appendonly no`` on 127.0.0.1; ``port`` 0 picks a free one."""

    def __init__(self, port: int = 0, *, log: IO[bytes] | None = None, exe: str | None = None) -> None:
        found = exe or shutil.which("redis-server")
        if found is None:
            raise RedisUnavailable("redis-server is not installed")
        self.exe = found
        self.port = port or free_port()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        """How many times a server was started on this port (1 + restarts)."""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, timeout: float = 20) -> Self:
        """Start an empty server and wait until it answers PING."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"redis-server already runs on port {self.port}")
        out = self.log if self.log is not None else subprocess.DEVNULL
        self.process = subprocess.Popen(self._args(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        import redis

        probe = redis.Redis(port=self.port, socket_timeout=1)
        try:
            wait_until_answers(probe.ping, self.process, "redis-server", errors=(redis.RedisError,), timeout=timeout)
        except RuntimeError:
            self.kill()
            raise
        finally:
            probe.close()
        return self

    def _args(self) -> list[str]:
        return [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]

    def kill(self) -> None:
        """SIGKILL the server (its whole process group) and wait for it; idempotent."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def restart(self) -> None:
        """Kill and start again on the same port: every key is gone."""
        self.kill()
        self.start()

    def flushall(self) -> None:
        """FLUSHALL: every key gone, connections kept (a lost state without a disconnect)."""
        import redis

        client = redis.Redis(port=self.port, socket_timeout=5)
        try:
            client.flushall()
        finally:
            client.close()

    def stop(self) -> None:
        self.kill()

    def __enter__(self) -> Self:
        return self if self.process is not None else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
