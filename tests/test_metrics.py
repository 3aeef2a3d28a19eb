"""Prometheus metrics: the helper (a registry per process, served over HTTP), the bytes a store
moves, every role scraped while a real run goes on (trainer, relay to a second region, an actor
there, a real redis-server), and the Grafana dashboard and the docs checked against the code."""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from actor.metrics import SPECS as ACTOR
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.errors import CorruptError, LimitError, MissingError, UnauthenticatedError
from aurora_store.metrics import BUCKET_BYTES, COMMON, Metrics, MetricsError, Spec, reason_of
from aurora_store.metrics_http import LOOPBACK, MAX_CONNECTIONS, MetricsServer
from aurora_store.testing.processes import free_port, wait_for
from relay.metrics import SPECS as RELAY
from tests.monitoring import REPO, Samples, World, dashboard, panel_queries, parse, present, scrape, value
from trainer.metrics import SPECS as TRAINER

ALL: tuple[Spec, ...] = (*COMMON, *TRAINER, *RELAY, *ACTOR)

# ------------------------------------------------------------ the helper, in process


def test_registries_are_per_process_object_and_served() -> None:
    extra = Spec("aurora_test_things_total", "counter", "Things.", ("kind",))
    a, b = Metrics("relay", "eu", (extra,)), Metrics("relay", "eu", (extra,))  # same names: no collision
    a.counter(extra).labels("x").inc(2)
    boom = Spec("aurora_test_boom", "gauge", "Fails to read.")
    b2 = Metrics("actor", "ap", (boom,))
    b2.pull(boom, lambda: 1 / 0)  # a reader that fails drops its family from that scrape, nothing more
    port = free_port()
    a.serve(port)
    try:
        got = scrape(port)
        assert value(got, "aurora_test_things_total", kind="x") == 2
        assert value(got, "aurora_role_info", role="relay", region="eu") == 1
        with pytest.raises(MetricsError, match=f"--metrics-port {port}"):
            b.serve(port)  # the port is taken: a clear error at start
    finally:
        a.close()
    other = free_port()
    b2.serve(other)
    try:
        got = scrape(other)
        assert value(got, "aurora_role_info", role="actor") == 1 and not present(got, "aurora_test_boom")
    finally:
        b2.close()
    a.serve(None)  # off
    assert a.server is None
    with pytest.raises(ValueError, match="not a gauge"):
        a.gauge(extra)


def test_idle_connections_hold_no_thread_and_metrics_still_answer() -> None:
    """Issue 25: every role's /metrics bound 0.0.0.0 with a thread per connection and no idle timeout
    (1,500 idle connections gave a relay 1,508 threads). Now it binds loopback, one thread serves every
    connection, at most MAX_CONNECTIONS are open (a new one closes the oldest idle one), and an idle one
    is closed after its timeout."""
    m = Metrics("relay", "eu")
    port = free_port()
    before = threading.active_count()
    m.serve(port)
    idle: list[socket.socket] = []
    try:
        assert m.server is not None and m.server.address == LOOPBACK, "loopback unless --metrics-addr says otherwise"
        for _ in range(400):  # connections that never send a request
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        assert value(scrape(port), "aurora_role_info", role="relay", region="eu") == 1, "a scrape still gets in"
        assert threading.active_count() <= before + 1, f"{threading.active_count() - before} threads for /metrics"
        assert m.server.connections <= MAX_CONNECTIONS
        for sock in idle[:300]:  # the oldest were closed to make room for the newest
            sock.settimeout(5)
            assert sock.recv(1) == b""
    finally:
        for sock in idle:
            sock.close()
        m.close()
    assert threading.active_count() <= before, "close() ends the server's thread"
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, timeout_s=0.5)
    try:
        quiet = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")  # half a request, never finished
        assert quiet.recv(1) == b"" and slow.recv(1) == b"", "idle connections are closed (not left to time out: 10 s)"
        quiet.close()
        slow.close()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as bad:
            bad.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert bad.recv(64).startswith(b"HTTP/1.1 405")
    finally:
        server.close()


def _ask(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


HOSTILE_REQUESTS = [
    b"GET http://[::1 HTTP/1.1\r\n\r\n",  # urlsplit: Invalid IPv6 URL
    b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=a.b\r\n\r\n",
    b"GET /metrics?name[]=%ff%fe HTTP/1.1\r\n\r\n",
    b"\xff\xfe\x00 / HTTP/1.1\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nAccept\r\n: :: \r\n\r\n",
]


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[MetricsServer]:
    """One server for every example: one request that kills it fails every example after."""
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0)
    yield server
    server.close()


@settings(max_examples=60, deadline=None)
@given(junk=st.one_of(st.sampled_from(HOSTILE_REQUESTS), st.binary(max_size=300).map(lambda b: b + b"\r\n\r\n")))
def test_any_bytes_get_an_answer_and_the_server_keeps_serving(hostile_server: MetricsServer, junk: bytes) -> None:
    """Issue 34, bug 6: ``GET http://[::1 HTTP/1.1`` or an OpenMetrics Accept header with a version that is
    not a number raised outside the handler's try: the server's thread ended and every later scrape hung."""
    got = _ask(hostile_server.port, junk)
    assert got == b"" or got.startswith(b"HTTP/1.1 "), got[:80]
    assert _ask(hostile_server.port, b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200"), "and serves on"


def test_rejection_reasons_name_the_refusal() -> None:
    assert reason_of(CorruptError("sha256 mismatch")) == "corrupt"
    assert reason_of(LimitError("too big")) == "over_limit"
    assert reason_of(MissingError("gone")) == "missing"
    assert reason_of(UnauthenticatedError("bad signature")) == "unauthenticated"
    assert reason_of(RuntimeError()) == "other"


@pytest.mark.parametrize("backend", ["memory", "file"])
def test_a_store_tells_its_meter_every_byte_it_moves(backend: str, tmp_path: Path) -> None:
    uri = f"memory://aurora-tests/{os.urandom(6).hex()}/run" if backend == "memory" else f"file://{tmp_path}/run"
    store = ObjectStore(uri)
    m = Metrics("actor", "eu")
    store.meter = m.meter("region")
    data = os.urandom(5000)
    assert store.put_if_absent("versions/a", data)
    assert not store.put_if_absent("versions/a", data)  # taken locally: nothing was sent
    assert bytes(store.get_sized("versions/a", len(data), 1024)) == data
    assert store.get("versions/a", max_bytes=10_000) == data
    got = parse(_text(m))
    name = BUCKET_BYTES.name
    assert value(got, name, direction="upload", bucket="region", role="actor", region="eu") == len(data)
    assert value(got, name, direction="download") == 2 * len(data)


def test_refused_objects_are_counted_by_the_relay_and_the_actor(tmp_path: Path) -> None:
    """A corrupt segment: the actor counts each refused read of its region's copy (then reads the
    fallback), the relay counts the version it refuses to copy."""
    import aurora_store
    from actor.metrics import ActorMetrics
    from actor.updater import Updater
    from aurora_store.testing.damage import overwrite
    from relay.worker import Relay
    from tests.helpers import state_dict, step

    home, eu = f"file://{tmp_path}/home/r", f"file://{tmp_path}/eu/r"
    run = aurora_store.open_run(home, full_every=10, segment_bytes=512)
    sd = state_dict()
    for i in range(3):
        run.publish(sd)
        sd = step(sd, i)
    relay = Relay(ObjectStore(home), ObjectStore(eu), None, source_region="home", dest_region="eu")
    for v in (0, 1):
        relay.copy_version(v)
    metrics = ActorMetrics("eu", "a")
    up = Updater(aurora_store.open_run(eu), region="eu", fallback=aurora_store.open_run(home), worker_id="a")
    up.on_refused = metrics.m.rejected
    up.bootstrap(0)
    overwrite(ObjectStore(eu), run.manifest(1).segments[0].key, b"garbage")
    assert up.stage(1) is not None and up.apply() is not None  # from the fallback
    got = parse(_text(metrics.m))
    assert value(got, "aurora_artifacts_rejected_total", role="actor", region="eu", reason="corrupt") == 2

    overwrite(ObjectStore(home), run.manifest(2).segments[0].key, b"garbage")
    relay._backfill_safely()  # what a live relay does on each scan: refused, counted, never fatal
    relay.close()
    got = parse(_text(relay.metrics.m))
    assert value(got, "aurora_artifacts_rejected_total", role="relay", reason="corrupt") == 1
    assert value(got, "aurora_relay_region_version", region="eu") == 1
    assert value(got, "aurora_relay_versions_committed_total") == 2


def _text(m: Metrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(m.registry).decode()


# ------------------------------------------------------------ the dashboard and the docs


def test_the_dashboard_names_only_metrics_the_roles_export() -> None:
    doc = dashboard()
    series = {s for spec in ALL for s in spec.series}
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "region" in variables
    queries = [
        ("templating region", variables["region"]["definition"]),
        *((t, e) for t, _, e in panel_queries(doc["panels"])),
    ]
    titles = {p["title"] for p in doc["panels"]}
    assert len(titles) == len(doc["panels"]) >= 12
    assert all(p["datasource"]["uid"] == "${datasource}" for p in doc["panels"])
    unknown = []
    for title, expr in queries:
        names = re.findall(r"\baurora_[a-z0-9_]+", expr)
        assert names, f"{title}: {expr} names no AuroraRL metric"
        unknown += [f"{title}: {n}" for n in names if n not in series]
    assert not unknown, "the dashboard names metrics no role exports:\n" + "\n".join(unknown)
    used = {n for _, e in queries for n in re.findall(r"\baurora_[a-z0-9_]+", e)}
    assert {
        "aurora_actor_apply_seconds_bucket",
        "aurora_relay_copy_seconds_bucket",
        "aurora_bucket_bytes_total",
    } <= used


def test_the_grafana_readme_describes_every_panel() -> None:
    text = (REPO / "infra" / "grafana" / "README.md").read_text()
    table = text[text.index("## Panels") :]
    rows = re.findall(r"^\| ([^|]+?) \| .+ \| [a-z, ]+ \|$", table, re.MULTILINE)
    assert rows[0] == "panel" and sorted(rows[1:]) == sorted(p["title"] for p in dashboard()["panels"])


def test_operations_lists_every_metric() -> None:
    text = (REPO / "docs" / "OPERATIONS.md").read_text()
    heading = re.search(r"^## (\d+\. )?Metrics.*$", text, re.MULTILINE)
    assert heading, "docs/OPERATIONS.md has a Metrics section"
    section = re.split(r"^## ", text[heading.end() :], flags=re.MULTILINE)[0]
    missing = [s.name for s in ALL if f"`{s.name}`" not in section]
    assert not missing, f"docs/OPERATIONS.md ## Metrics does not list {missing}"
    assert len({s.name for s in ALL}) == len(ALL), "a metric name declared twice"


# ------------------------------------------------------------ a live run, real processes


@pytest.fixture
def world(tmp_path: Path, redis_server: Any) -> Iterator[World]:
    w = World(tmp_path, redis_server.url)
    yield w
    w.stop()


@pytest.mark.slow
def test_every_role_serves_its_metrics_in_a_live_run(world: World, tmp_path: Path) -> None:
    home, eu = (tmp_path / "home" / "rl").as_uri(), (tmp_path / "eu" / "rl").as_uri()
    common = ("--redis", world.redis, "--run-id", "rl")
    world.spawn(
        "trainer",
        "train",
        "--store",
        home,
        *common,
        *("--steps", "60", "--sft-steps", "20", "--prompts", "8", "--group", "4", "--max-new-tokens", "4"),
        *("--lease-s", "20", "--lr", "5e-4"),
    )
    world.spawn("relay", "relay", "--source", home, "--dest", eu, "--dest-region", "eu", *common)
    world.spawn("actor", "actor", "--store", eu, "--region", "eu", "--worker-id", "eu-0", "--heartbeat-s", "2", *common)

    early: dict[str, Samples] = {}  # each role answers as it starts, before any version reached it

    def serving() -> bool:
        early.update({n: s for n in world.procs if n not in early and (s := world.scrape(n)) is not None})
        return len(early) == len(world.procs)

    wait_for(serving, "every role to serve its metrics", 90)
    assert all(value(s, "aurora_role_info", role=n) == 1 for n, s in early.items())

    actor: Samples = []

    def actor_moved_on() -> bool:
        actor[:] = world.scrape("actor") or []
        return value(actor, "aurora_actor_version", region="eu", actor="eu-0") >= 2

    wait_for(actor_moved_on, "the actor in eu to hold version 2", 150)
    trainer, relay = world.scrape("trainer"), world.scrape("relay")
    assert trainer is not None and relay is not None
    bytes_ = BUCKET_BYTES.name

    assert value(actor, "aurora_role_info", role="actor", region="eu") == 1
    assert value(actor, "aurora_actor_version_lag", region="eu", actor="eu-0") >= 0
    assert value(actor, bytes_, role="actor", direction="download", bucket="region") > 0
    assert value(actor, "aurora_actor_apply_seconds_count", actor="eu-0") >= 1
    applies = value(actor, "aurora_actor_apply_seconds_count")
    assert value(actor, "aurora_actor_generation_pause_seconds_count") == applies, "a pause for every switch"
    assert value(actor, "aurora_actor_stage_seconds_count") >= 1
    assert value(actor, "aurora_actor_throughput_ema_tokens_per_second", actor="eu-0") > 0  # from its calibration

    assert value(relay, "aurora_relay_region_version", region="eu") >= 1
    assert value(relay, "aurora_relay_copy_seconds_count", region="eu") >= 1
    assert value(relay, "aurora_relay_version_lag", region="eu") >= 0
    assert value(relay, bytes_, role="relay", direction="download", bucket="source") > 0
    assert value(relay, bytes_, role="relay", direction="upload", bucket="dest") > 0
    assert value(relay, "aurora_relay_objects_copied_total", region="eu") >= 1
    assert value(relay, "aurora_relay_copied_bytes_total") <= value(relay, bytes_, direction="upload")

    def trainer_admitted() -> bool:  # the step the actor's version 2 followed admitted its results
        nonlocal trainer
        trainer = world.scrape("trainer") or trainer
        return value(trainer, "aurora_trainer_results_admitted_total") > 0

    wait_for(trainer_admitted, "the trainer to admit results", 60)
    assert value(trainer, "aurora_trainer_published_version", region="home") >= 2
    assert value(trainer, bytes_, role="trainer", direction="upload", bucket="home") > 0
    assert value(trainer, "aurora_trainer_steps_total") >= 2
    assert value(trainer, "aurora_trainer_publish_seconds_count") == value(trainer, "aurora_trainer_steps_total")
    assert present(trainer, "aurora_trainer_leases_expired_total") and present(trainer, "aurora_trainer_pending_jobs")
    lag = {s: value(trainer, "aurora_trainer_result_version_lag", stat=s) for s in ("p50", "p99", "max")}
    assert 0 <= lag["p50"] <= lag["p99"] <= lag["max"] <= 2, lag  # one-step asynchrony: jobs of t+2 at version t
    assert value(actor, "aurora_actor_versions_skipped_total", actor="eu-0") >= 0
    assert value(trainer, "aurora_trainer_results_dropped_total") >= 0
