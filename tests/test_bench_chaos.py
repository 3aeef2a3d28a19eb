"""``aurora bench chaos``: its schedule is seeded, its partitions cut and heal, its Redis restarts empty,
a trainer kill lands between a version's commit and its state, and a short seeded run of the whole system
under faults keeps every invariant (the checker itself: tests/test_chaos_check.py)."""

from __future__ import annotations

import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from aurora_store.format.keys import manifest_key
from bench.chaos.bucket import Bucket
from bench.chaos.check import INVARIANTS, OPTIONAL_INVARIANTS
from bench.chaos.faults import Faults
from bench.chaos.gates import Gates
from bench.chaos.schedule import KINDS, WRITERS, kinds_of, schedule
from bench.chaos.supervisor import Proc, Supervisor

if TYPE_CHECKING:
    from aurora_store.testing.moto import S3Server
    from aurora_store.testing.redis_server import RedisServer

REPO = Path(__file__).resolve().parents[1]


def test_the_schedule_draws_every_kind_first_and_is_seeded() -> None:
    first = schedule(random.Random(7), len(KINDS))
    assert sorted(first) == sorted(KINDS)
    assert schedule(random.Random(7), 40) == schedule(random.Random(7), 40) != schedule(random.Random(8), 40)


def test_the_trainer_is_killed_the_instant_a_new_version_is_committed(
    tmp_path: Path, redis_server: RedisServer, s3_server: S3Server
) -> None:
    """``trainer_kill_before_state``: a re-announced old commit is no moment; the next version's commit is,
    and the kill says that version was committed and had no state yet."""
    import redis

    home = Bucket("home", s3_server, s3_server.new_bucket(), "runs/chaos/")
    home.put(manifest_key(0), b"{}")
    sup = Supervisor(0.0, random.Random(0), (60.0, 60.0), lambda *a: pytest.fail("no actor is spawned"))
    gates, events = Gates(), list[dict[str, Any]]()
    r = redis.Redis(port=redis_server.port, decode_responses=True)
    try:
        sup.add(Proc("trainer", "trainer", "home", ["-c", "import time; time.sleep(60)"], {}, tmp_path / "t.log"))
        faults = Faults(random.Random(0), sup, {"home": home}, gates, redis_server, "chaos", 4, events.append)
        doc = faults.inject("trainer_kill_before_state")
        assert doc == {"event": "fault", "kind": "trainer_kill_before_state", "target": "trainer",
                       "moment": "before_state"}  # fmt: skip
        end = time.monotonic() + 1
        while time.monotonic() < end:  # version 0 again: already committed before the fault
            r.xadd("aurora:chaos:events:home", {"type": "commit", "version": "0"})
            time.sleep(0.1)
        assert sup.procs["trainer"].alive and not faults.kills
        home.put(manifest_key(1), b"{}")
        end = time.monotonic() + 20
        while not faults.kills and time.monotonic() < end:
            r.xadd("aurora:chaos:events:home", {"type": "commit", "version": "1"})
            time.sleep(0.1)
        kill = faults.kills[0]
        assert (
            kill["moment"] == "before_state" and kill["killed"] and kill["seen"] == {"type": "commit", "version": "1"}
        )
        assert kill["committed"] and not kill["state_saved"] and events[-1] == kill
        popen = sup.procs["trainer"].popen
        assert popen is not None and popen.wait(10) == -signal.SIGKILL
        assert faults.injected["trainer_kill_before_state"] == 1 and sup.counts["trainer"]["SIGKILL"] == 1
    finally:
        r.close()
        sup.stop_all()
        gates.close()


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(4096), b"")]).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def _talk(port: int, timeout: float = 30.0) -> bytes:
    """Send a ping through the gate: the echo, b"" if the gate closed the connection, b"timeout" if nothing
    came back within ``timeout`` (long by default: a loaded machine answers late, never wrongly)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"ping")
        try:
            return s.recv(4)
        except (TimeoutError, ConnectionError):
            return b"timeout"


def test_a_partition_refuses_or_holds_connections_and_heals(echo: int) -> None:
    gates = Gates()
    try:
        port = gates.add("eu", ("127.0.0.1", echo))
        held = socket.create_connection(("127.0.0.1", port), timeout=30)
        held.sendall(b"ping")
        assert held.recv(4) == b"ping" == _talk(port)
        gates.partition("eu", "refuse")
        assert held.recv(4) == b"", "an open connection dies with the partition"
        assert _talk(port) == b""
        gates.partition("eu", "hang")
        assert _talk(port, timeout=0.5) == b"timeout"
        gates.partition("eu", None)
        assert _talk(port) == b"ping"
        assert gates.counts["eu:refuse"] == 1 and gates.counts["eu:hang"] == 1
    finally:
        gates.close()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_redis_server_restarts_empty_on_its_port() -> None:
    import redis

    from aurora_store.testing.redis_server import RedisServer

    with RedisServer() as server:
        client = redis.Redis(port=server.port)
        client.set("k", "v")
        server.flushall()
        assert client.get("k") is None
        client.set("k", "v")
        port = server.port
        server.restart()
        client.close()
        client = redis.Redis(port=server.port)  # the old connection died with the server
        assert server.port == port and client.get("k") is None and server.starts == 2
        client.close()
    assert server.process is None


def _chaos(workdir: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``aurora bench chaos --json`` as a process (its logs in ``workdir``): the process and its JSON."""
    argv = ["bench", "chaos", "--json", *flags, "--settle-s", "120", "--workdir", str(workdir)]
    out = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", *argv], cwd=REPO, capture_output=True, text=True, timeout=400
    )
    assert out.stdout.strip(), out.stderr[-3000:]
    return out, json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_short_seeded_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    flags = ("--seed", "5", "--faults", "12", "--steps", "6", "--interval-s", "0.5", "--actors", "1")
    out, result = _chaos(tmp_path, *flags)
    for key in ("seed", "faults_requested", "faults_injected", "recoveries", "lost", "invariants", "steps"):
        assert key in result
    assert result["seed"] == 5 and result["steps"] == 6 and result["workdir"] == str(tmp_path)
    assert set(INVARIANTS) <= set(result["invariants"]) <= {*INVARIANTS, *OPTIONAL_INVARIANTS}
    assert len(result["faults_injected"]) >= 6, result["faults_injected"]
    # issue 34: the trainer restarted into a key rotation while its storage was cut; the rotation committed,
    # and every region replays with the run's first key (regions_replay_bit_exact: the audit's key)
    assert {"rotate_key", "trainer_storage_outage"} <= set(result["faults_injected"]), result["faults_injected"]
    rotations = result["details"]["key_rotations"]
    assert rotations and all(r["committed"] for r in rotations), rotations
    assert result["versions"] == {"home": 7, "eu": 7, "ap": 7}, result["notes"]
    failing = {k: result["problems"].get(k) for k, ok in result["invariants"].items() if not ok}
    assert result["lost"] == 0 and not failing, (failing, result["processes"]["crashes"], tmp_path)
    assert out.returncode == 0
    assert result["orphans"] == 0, result["notes"]


def test_the_schedule_draws_only_the_kinds_asked_for() -> None:
    writers = schedule(random.Random(3), 20, kinds_of(("writers",)))
    assert set(writers) == set(WRITERS) and len(writers) == 20
    assert set(schedule(random.Random(3), 5, ("forged_flood",))) == {"forged_flood"}
    with pytest.raises(ValueError, match="unknown fault kinds"):
        schedule(random.Random(3), 5, ("nap",))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_redis_and_bucket_writers_lose_nothing_and_cost_at_most_a_steps_leases(tmp_path: Path) -> None:
    """Issue 25's writer faults alone (result floods under real holders' names and tokens, an inflated
    registration, a hung actor whose heartbeat goes on, a forged retention record, malformed entries):
    nothing lost, every invariant, and the fake and the hung actor cost at most one step's worth of
    leases under the faults (before the fixes the fake alone lost 304 in 40 s and made a step take
    30 s; a loaded machine may let an honest actor's lease or two expire). The 2x pace itself is a
    timing target, judged by the benchmark (``pace`` in its JSON; the note of issue 25 gives the
    figures), not by this test: on a loaded CI machine fault-free steps alone vary threefold."""
    flags = ("--seed", "1", "--kinds", "writers", "--faults", "8", "--calm-steps", "6", "--steps", "45")
    out, result = _chaos(tmp_path, *flags)
    assert set(result["faults_injected"]) <= set(WRITERS) and len(result["faults_injected"]) >= 5
    assert {"forged_flood", "inflated_registration", "slow_actor", "forged_retention"} <= set(
        result["faults_injected"]
    ), result["faults_injected"]
    # issue 34: forged notices stop no actor; /metrics answers a real scrape after garbage
    assert {"forged_notices_ignored", "metrics_kept_serving"} <= set(result["invariants"]), result["invariants"]
    assert result["details"]["garbage_scrapes"].get("True", 0) >= 1, result["details"]["garbage_scrapes"]
    pace = result["pace"]
    timed = "steps_at_pace"
    failing = {k: result["problems"].get(k) for k, ok in result["invariants"].items() if not ok and k != timed}
    assert result["lost"] == 0 and not failing, (failing, pace, tmp_path)
    assert pace["baseline_s"] > 0 and pace["max_ratio"] is not None and isinstance(pace["held"], bool)
    assert len(pace["per_step_s"]) >= 40
    steps = [json.loads(line[line.index("{") :]) for line in (tmp_path / "trainer.log").read_text().splitlines()
             if '"step": ' in line and "{" in line]  # fmt: skip
    calm, last = next(r for r in steps if r["step"] == 6), steps[-1]
    lost_leases = last["dropped"].get("lease_lost", 0) - calm["dropped"].get("lease_lost", 0)
    assert last["step"] == 45 and lost_leases <= 8, (calm, last, pace)  # 8 prompts a step
    assert out.returncode in (0, 1)  # 1: the pace was not held on this (possibly loaded) machine
