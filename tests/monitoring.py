"""What tests/test_metrics.py and tests/test_prometheus.py share: a live run of real role processes
(``aurora train``, ``relay``, ``actor``), each serving its metrics on a free loopback port, reading
those metrics, and the Grafana dashboard's queries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from prometheus_client.parser import text_string_to_metric_families

from aurora_store.metrics_http import ADDR_ENV
from aurora_store.testing.processes import free_port

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "infra" / "grafana" / "aurora-dashboard.json"

Samples = list[tuple[str, dict[str, str], float]]


def parse(text: str) -> Samples:
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return parse(r.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there are none)."""
    return sum(v for n, lab, v in samples if n == name and labels.items() <= lab.items())


def present(samples: Samples, name: str) -> bool:
    return any(n == name for n, _, _ in samples)


class World:
    """Role processes started with ``python -m aurora_store.cli ARGV --metrics-port P`` (bound to
    127.0.0.1), each logging to ``tmp/NAME.log``; :meth:`stop` (or leaving the ``with``) ends them."""

    def __init__(self, tmp: Path, redis_url: str) -> None:
        self.tmp, self.redis = tmp, redis_url
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}

    def reserve(self, name: str) -> int:
        """The metrics port ``name`` will serve on once spawned (known before it starts)."""
        return self.ports.setdefault(name, free_port())

    def spawn(self, name: str, *argv: str) -> None:
        port = self.reserve(name)
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        cmd = [sys.executable, "-m", "aurora_store.cli", *argv, "--metrics-port", str(port)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", ADDR_ENV: "127.0.0.1"}
        self.procs[name] = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def scrape(self, name: str) -> Samples | None:
        """The role's metrics, None while it is not serving yet (it must still be running)."""
        proc = self.procs[name]
        assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{self.log(name)}"
        try:
            return scrape(self.ports[name])
        except (urllib.error.URLError, ConnectionError):
            return None

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panel_queries(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str, str]]:
    """(panel title, legend, PromQL) of every query of every panel, rows' panels included."""
    for p in panels:
        yield from panel_queries(p.get("panels", []))  # rows hold panels of their own
        for t in p.get("targets", []):
            yield p["title"], t.get("legendFormat", ""), t["expr"]
