"""The process supervisor of ``aurora bench chaos``: every role in a process group of its own, the dead
restarted after a seeded delay as systemd would, unexpected exits counted as crashes, all stopped at the end."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]


@dataclass(slots=True)
class Proc:
    name: str
    role: str
    region: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    retired: bool = False
    """Gone for good (stopped by the schedule, or finished): never restarted."""
    killed: bool = False
    """Its current incarnation was killed by the schedule: its exit is expected."""
    due: float | None = None
    """When it is restarted."""

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass(slots=True)
class Supervisor:
    """Starts every role in a process group of its own, restarts the dead after a seeded delay
    (counting unexpected exits as crashes), and stops them all."""

    t0: float
    rng: random.Random
    restart_s: tuple[float, float]
    make_actor: Callable[[str, str, str, float | None], Proc]
    """``(role, region, name, slowdown)`` -> the actor's `Proc`."""
    procs: dict[str, Proc] = field(default_factory=dict)
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False
    """The trainer exited 0: every step is committed."""
    pgids: list[int] = field(default_factory=list)
    """Every process group started (each role incarnation leads one)."""
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _pumps: list[threading.Thread] = field(default_factory=list)
    _serial: Counter[str] = field(default_factory=Counter)

    def add(self, p: Proc) -> None:
        with self._lock:
            self.procs[p.name] = p
            self._start(p)

    def _start(self, p: Proc) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **p.env}
        out = subprocess.PIPE
        p.popen = subprocess.Popen(
            [sys.executable, *p.argv], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        p.killed, p.due = False, None
        self.pgids.append(p.popen.pid)
        self.counts.setdefault(p.role, Counter())["started"] += 1
        assert p.popen.stdout is not None
        pump = threading.Thread(target=self._pump, args=(p.popen.stdout, open(p.log, "ab")), daemon=True)  # noqa: SIM115
        pump.start()
        self._pumps.append(pump)

    def _pump(self, out: IO[bytes], log: IO[bytes]) -> None:
        """Copy a child's output to its log, each line stamped with seconds since the run started."""
        with log:
            for line in out:
                log.write(f"[{time.monotonic() - self.t0:9.3f}] ".encode() + line)
                log.flush()

    def names(self, role: str) -> list[str]:
        with self._lock:
            return sorted(n for n, p in self.procs.items() if p.role == role and p.alive and not p.killed)

    def region_of(self, name: str) -> str:
        return self.procs[name].region

    def signal(self, name: str, sig: int) -> bool:
        """Send ``sig`` to ``name``'s process group (counted by signal); False if it is not running."""
        with self._lock:
            p = self.procs.get(name)
            if p is None or p.popen is None or not p.alive:
                return False
            self.counts[p.role][signal.Signals(sig).name] += 1
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, sig)
            return True

    def kill(self, name: str, sig: int, *, restart: bool) -> bool:
        """Kill ``name`` (an expected exit), to be restarted after a delay or, without ``restart``, gone."""
        with self._lock:
            if not self.signal(name, sig):
                return False
            p = self.procs[name]
            p.killed, p.retired = True, p.retired or not restart
            return True

    def spawn_actor(self, region: str, slowdown: float | None = None) -> str:
        role = "slow" if slowdown else "actor"
        with self._lock:
            n = self._serial[region + role]
            self._serial[region + role] += 1
            name = f"{region}-{'s' if slowdown else ''}{n}"
            self.add(self.make_actor(role, region, name, slowdown))
        return name

    def poll(self) -> None:
        """Notice exits (crashes and expected ones) and restart what is due."""
        now = time.monotonic()
        with self._lock:
            for p in self.procs.values():
                if p.popen is None or p.due is not None or p.retired or p.alive:
                    continue
                rc = p.popen.returncode
                if p.role == "trainer" and rc == 0:
                    p.retired = self.finished = True
                    continue
                if not p.killed:
                    self.counts[p.role]["crashed"] += 1
                    tail = p.log.read_text(errors="replace").splitlines()[-6:]
                    self.crashes.append({"name": p.name, "rc": rc, "at_s": round(now - self.t0, 1), "tail": tail})
                p.due = now + self.rng.uniform(*self.restart_s)
            for p in self.procs.values():
                if p.due is not None and p.due <= now and not p.retired:
                    self.counts[p.role]["restarted"] += 1
                    self._start(p)

    def stop_all(self) -> None:
        """SIGTERM every group, then SIGKILL every group (a leader's children too) after 15 s at most."""
        with self._lock:
            for p in self.procs.values():
                p.retired = True
                if p.popen is not None and p.alive:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.popen.pid, signal.SIGTERM)
                        os.killpg(p.popen.pid, signal.SIGCONT)  # a paused one must run to stop
        end = time.monotonic() + 15
        for p in self.procs.values():
            if p.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(max(0.1, end - time.monotonic()))
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait(10)
        for t in self._pumps:
            t.join(5)
