"""``aurora bench chaos``: its invariant checker can fail (hand-made runs), its partitions cut and heal,
its Redis restarts empty, and a short seeded run of the whole system under faults keeps every invariant."""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.chaos_bucket import RegionState
from bench.chaos_check import INVARIANTS, check, read_admissions, scan_logs
from bench.chaos_gates import Gates
from bench.chaos_schedule import KINDS, schedule

REPO = Path(__file__).resolve().parents[1]
STEPS, PROMPTS = 3, 2


def _manifest(v: int, tag: str = "t1", **changes: Any) -> bytes:
    doc = {"version": v, "step": v, "meta": {"trainer": tag}, "version_hash": f"h{v}", "weights_digest": f"d{v}"}
    return json.dumps({**doc, **changes}, sort_keys=True).encode()


def _regions(**home_changes: dict[str, Any]) -> dict[str, RegionState]:
    manifests = {v: _manifest(v, **home_changes.get(str(v), {})) for v in range(STEPS + 1)}
    return {r: RegionState(list(manifests), dict(manifests), None, len(manifests)) for r in ("home", "eu", "ap")}


def _admissions(tag: str = "t1") -> list[dict[str, Any]]:
    """Every prompt of every step admitted once, each on the version before its step."""
    out = []
    for s in range(1, STEPS + 1):
        for i in range(PROMPTS):
            v = max(0, s - 2)
            out.append(
                {"trainer": tag, "step": s, "job": f"{tag}:{s}:{i}", "actor": "eu-0", "token": 10 * s + i,
                 "version": v, "version_hash": f"h{v}", "weights_digest": f"d{v}", "deadline_ms": 2000,
                 "admitted_ms": 1000}
            )  # fmt: skip
    return out


def _verdict(admissions: list[dict[str, Any]], regions: dict[str, RegionState] | None = None, **kw: Any) -> Any:
    return check(admissions, regions or _regions(), steps=STEPS, prompts=PROMPTS, **kw)


def test_a_clean_run_holds_every_invariant() -> None:
    v = _verdict(_admissions())
    assert v.invariants == dict.fromkeys(INVARIANTS, True) and v.lost == 0, v.problems


def test_a_result_admitted_twice_fails_and_is_lost() -> None:
    adm = _admissions()
    v = _verdict([*adm, dict(adm[3])])
    assert not v.invariants["every_prompt_admitted_once"] and v.lost == 1
    assert "2 times" in v.problems["every_prompt_admitted_once"][0]


def test_a_prompt_never_admitted_fails_and_is_lost() -> None:
    v = _verdict(_admissions()[1:])
    assert not v.invariants["every_prompt_admitted_once"] and v.lost == 1
    assert "never admitted" in v.problems["every_prompt_admitted_once"][0]


def test_only_the_committing_incarnation_counts() -> None:
    """A killed trainer's admissions for a step it never committed do not stand in for the committer's."""
    adm = [r for r in _admissions() if r["step"] != 2] + [r for r in _admissions("t0") if r["step"] == 2]
    v = _verdict(adm)
    assert not v.invariants["every_prompt_admitted_once"] and v.lost == PROMPTS
    assert _verdict(adm, _regions(**{"2": {"meta": {"trainer": "t0"}}})).lost == 0


@pytest.mark.parametrize(
    ("changes", "invariant"),
    [
        ({"version_hash": "h9"}, "admitted_leases_valid"),
        # a step's rollouts come from one of the two versions before it, never from its own
        ({"version": 3, "version_hash": "h3", "weights_digest": "d3"}, "admitted_leases_valid"),
        ({"admitted_ms": 3000}, "admitted_leases_valid"),  # after the lease's deadline
        ({"token": -1}, "admitted_leases_valid"),
        ({"weights_digest": "d9"}, "rollouts_from_committed_weights"),
        ({"weights_digest": None}, "rollouts_from_committed_weights"),
    ],
)
def test_a_bad_admission_fails_its_invariant(changes: dict[str, Any], invariant: str) -> None:
    adm = _admissions()
    adm[-1] = {**adm[-1], **changes}
    v = _verdict(adm)
    assert not v.invariants[invariant], v.problems
    assert all(ok for name, ok in v.invariants.items() if name != invariant), v.problems


def test_an_admitted_forged_result_fails() -> None:
    adm = _admissions()
    r = adm[0]
    forged = {k: str(r[k]) for k in ("job", "token", "actor", "version_hash", "weights_digest")}
    assert not _verdict(adm, forged=[forged]).invariants["admitted_leases_valid"]
    # a forgery of the same lease with another digest, refused, does not taint the real result admitted after it
    assert _verdict(adm, forged=[{**forged, "weights_digest": "e" * 64}]).invariants["admitted_leases_valid"]


def test_regions_that_differ_or_lack_a_version_fail() -> None:
    regions = _regions()
    regions["eu"].manifests[2] = _manifest(2, weights_digest="forged")
    v = _verdict(_admissions(), regions)
    assert not v.invariants["regions_replay_bit_exact"] and v.invariants["versions_consecutive"]
    regions = _regions()
    regions["ap"].versions.remove(3)
    del regions["ap"].manifests[3]
    v = _verdict(_admissions(), regions)
    assert not v.invariants["versions_consecutive"] and not v.invariants["regions_replay_bit_exact"] and v.lost == 1
    regions = _regions(**{"1": {"step": 0}})
    assert not _verdict(_admissions(), regions).invariants["versions_consecutive"]
    regions = _regions()
    regions["home"].audit_error = "v2: sha256 mismatch"
    assert not _verdict(_admissions(), regions).invariants["regions_replay_bit_exact"]


def test_admissions_log_with_a_torn_line_and_logs_scanned(tmp_path: Path) -> None:
    path = tmp_path / "admissions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _admissions()) + '{"trainer": "t1", "st')
    records, torn = read_admissions(path)
    assert records == _admissions() and torn == 1
    (tmp_path / "relay-eu.log").write_text(
        '[ 1.0] Traceback (most recent call last):\n[ 1.0]   File "x", line 1\n[ 1.0] ValueError: boom\n'
        "[ 2.0] aurora: error: s3://b/v/manifest.json: declares version 1, expected 3\n"
    )
    logs = scan_logs(tmp_path)
    assert logs["by_role"]["relay"] == {"tracebacks": 1, "fatal_errors": 1, "damage_detected": 1}
    assert logs["deaths"] == ["relay-eu.log: ValueError: boom", "relay-eu.log: aurora: error: s3://b/v/manifest."
                              "json: declares version 1, expected 3"]  # fmt: skip


def test_the_schedule_draws_every_kind_first_and_is_seeded() -> None:
    first = schedule(random.Random(7), len(KINDS))
    assert sorted(first) == sorted(KINDS)
    assert schedule(random.Random(7), 40) == schedule(random.Random(7), 40) != schedule(random.Random(8), 40)


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


def _talk(port: int, timeout: float = 1.0) -> bytes:
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
        held = socket.create_connection(("127.0.0.1", port), timeout=2)
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


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_short_seeded_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    argv = ["bench", "chaos", "--json", "--seed", "5", "--faults", "12", "--steps", "6", "--interval-s", "0.5"]
    argv += ["--actors", "1", "--settle-s", "120", "--workdir", str(tmp_path)]
    out = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", *argv], cwd=REPO, capture_output=True, text=True, timeout=400
    )
    assert out.stdout.strip(), out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("seed", "faults_requested", "faults_injected", "recoveries", "lost", "invariants", "steps"):
        assert key in result
    assert result["seed"] == 5 and result["steps"] == 6 and result["workdir"] == str(tmp_path)
    assert set(result["invariants"]) == set(INVARIANTS)
    assert len(result["faults_injected"]) >= 6, result["faults_injected"]
    assert result["versions"] == {"home": 7, "eu": 7, "ap": 7}, result["notes"]
    failing = {k: result["problems"].get(k) for k, ok in result["invariants"].items() if not ok}
    assert result["lost"] == 0 and not failing, (failing, result["processes"]["crashes"], tmp_path)
    assert out.returncode == 0
    assert result["orphans"] == 0, result["notes"]
