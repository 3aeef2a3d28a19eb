"""A real Prometheus server for tests: ``prometheus`` on a free loopback port with a config of the
test's own and a TSDB in a temporary directory, queried through its HTTP API; and ``promtool``.

Both come from the distribution (Debian's ``prometheus`` package, 2.42, ships ``promtool`` beside
it): :class:`PrometheusUnavailable` says so where they are not installed, so a test can skip with
that reason. The server runs in a process group of its own and never outlives :meth:`stop`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from aurora_store.testing.processes import free_port, wait_until_answers


class PrometheusUnavailable(RuntimeError):
    """``prometheus`` or ``promtool`` is not installed (tests skip with this message)."""


def executable(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; PrometheusUnavailable naming how to install it."""
    found = shutil.which(name)
    if found is None:
        raise PrometheusUnavailable(
            f"{name} is not installed (Debian/Ubuntu: apt-get install prometheus; `make test` does it as root)"
        )
    return found


def promtool(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS``, its output captured (the caller checks ``returncode``)."""
    return subprocess.run([executable("promtool"), *args], capture_output=True, text=True, timeout=timeout)


def scrape_config(
    jobs: Mapping[str, Sequence[str]],
    *,
    interval_s: float = 1.0,
    rule_files: Sequence[str] = (),
) -> str:
    """A ``prometheus.yml`` scraping ``jobs`` (job name -> ``host:port`` targets) every ``interval_s``
    seconds and evaluating ``rule_files`` as often. JSON, which is YAML."""
    interval = f"{int(interval_s * 1000)}ms"
    doc = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": list(rule_files),
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(targets)}]} for job, targets in jobs.items()
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


@dataclass(frozen=True, slots=True)
class Series:
    """One element of an instant vector: its labels and value (NaN where Prometheus says NaN)."""

    labels: dict[str, str]
    value: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.value)


class QueryError(RuntimeError):
    """Prometheus refused a query (bad PromQL, or an error while evaluating it)."""


class PrometheusServer:
    """``prometheus --config.file F --storage.tsdb.path D --web.listen-address 127.0.0.1:P``.

    ``workdir`` holds the config (written from ``config``), the TSDB and the server's log.
    """

    def __init__(self, config: str, workdir: Path, *, port: int = 0) -> None:
        self.exe = executable("prometheus")
        self.workdir = workdir
        self.port = port or free_port()
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(config)
        self.log_path = workdir / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> Self:
        """Start the server and wait until it says it is ready (``/-/ready``)."""
        args = [
            self.exe,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                args, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

        def ready() -> None:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                if r.status != 200:
                    raise OSError(f"not ready: {r.status}")

        try:
            wait_until_answers(ready, self.process, f"prometheus on port {self.port}", timeout=timeout)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}; its log:\n{self.log()}") from None
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL after 10 s; idempotent."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def __enter__(self) -> Self:
        return self if self.process is not None else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ the HTTP API

    def api(self, path: str, **params: str | Sequence[str]) -> Any:
        """``GET /api/v1/PATH?params``: the ``data`` of a ``success`` answer, QueryError otherwise."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
            body = json.load(exc)
        if body.get("status") != "success":
            raise QueryError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        """Evaluate ``expr`` at ``at`` (Unix seconds; now by default) with ``GET /api/v1/query``."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            return [Series({}, float(data["result"][1]))]
        if data["resultType"] != "vector":
            raise QueryError(f"{expr}: a {data['resultType']}, not an instant vector")
        return [Series(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]

    def label_values(self, label: str, match: str) -> list[str]:
        """``GET /api/v1/label/LABEL/values?match[]=MATCH``: what Grafana's ``label_values(MATCH, LABEL)`` asks."""
        return sorted(self.api(f"label/{label}/values", **{"match[]": [match]}))

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets, with ``health`` and ``lastScrape`` (RFC 3339)."""
        return list(self.api("targets", state="active")["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule, with its ``health``, ``lastError`` and, for alerts, ``state``."""
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def wait_for_scrapes(self, n: int, *, after: float, interval_s: float, timeout: float = 30) -> None:
        """Wait until every target has been scraped successfully ``n`` times since ``after`` (Unix
        seconds): its last scrape is at least ``n - 1`` intervals past ``after``, and healthy."""
        deadline = time.monotonic() + timeout
        while True:
            targets = self.targets()
            late = [
                t["scrapeUrl"]
                for t in targets
                if t["health"] != "up" or _unix(t["lastScrape"]) < after + (n - 1 + 0.1) * interval_s
            ]
            if targets and not late:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not scraped {n} times since {after:.3f}: {late}; targets: {targets}")
            time.sleep(interval_s / 4)


_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)")


def _unix(rfc3339: str) -> float:
    """Prometheus' timestamps (``2024-05-01T12:00:00.123456789Z``, or with an offset) as Unix seconds."""
    m = _RFC3339.fullmatch(rfc3339)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {rfc3339!r}")
    head, frac, zone = m.groups()
    base = datetime.fromisoformat(head + ("+00:00" if zone == "Z" else zone)).timestamp()
    return base + (float(frac) if frac else 0.0)
