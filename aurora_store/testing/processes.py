"""Servers that tests and benchmarks start: free loopback ports, waiting for a condition or
for a server to answer, and a process's peak memory.

Every wait here ends at an event (a condition that holds, a server that answers), never at a
time; its deadline only bounds how long a failure takes to report, so deadlines are generous and one
knob scales them all: ``AURORA_TEST_PATIENCE`` (a factor, default 1), for a machine loaded past
what they allow (:func:`patience`, :func:`deadline`)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` and wait for it, killing it after 10 s; idempotent."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def patience() -> float:
    """How many times its stated deadline a wait may take: ``AURORA_TEST_PATIENCE`` (at least 1;
    anything else is refused, so a typo does not silently shorten every deadline)."""
    raw = os.environ.get("AURORA_TEST_PATIENCE", "").strip()
    if not raw:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        factor = float("nan")
    if not factor >= 1:  # NaN too
        raise ValueError(f"AURORA_TEST_PATIENCE={raw!r}: a factor of at least 1")
    return factor


def deadline(seconds: float) -> float:
    """``seconds`` scaled by :func:`patience`: what a test waits at most for an event."""
    return seconds * patience()


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 60, interval: float = 0.05) -> None:
    """Poll ``cond`` until it holds; AssertionError naming ``what`` after ``timeout`` seconds (scaled by
    :func:`patience`)."""
    limit = deadline(timeout)
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what} ({limit:.0f} s)"
        time.sleep(interval)


def wait_until_answers(
    probe: Callable[[], object],
    proc: subprocess.Popen[bytes] | None,
    what: str,
    *,
    errors: tuple[type[BaseException], ...] = (OSError,),
    timeout: float = 30,
) -> None:
    """Call ``probe`` until it returns without one of ``errors``; RuntimeError if ``proc`` (the
    server being started, when there is one) exits first or ``timeout`` seconds (scaled by
    :func:`patience`) pass."""
    end = time.monotonic() + deadline(timeout)
    while True:
        try:
            probe()
            return
        except errors:
            if (proc is not None and proc.poll() is not None) or time.monotonic() > end:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.05)


def peak_rss_mb(pid: int) -> float | None:
    """Peak resident memory of a live process, in MiB (Linux's VmHWM; None elsewhere or once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
