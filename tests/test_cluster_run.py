"""Issue 41: a run on a real Redis Cluster (3 masters, a replica each) with real trainer and actor
processes, and the master of the run's control slot killed mid-run: its replica is promoted, the run
completes with every prompt of every step admitted exactly once, both actors are alive and registered
after it (an actor whose beats the failover held past its lifetime loses its leases, as the design says,
and beats its way back), and the logs say what happened."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from aurora_store.bucket.run import open_run
from aurora_store.coord.jobs import JobBoard
from aurora_store.testing.redis_cluster import RedisCluster
from aurora_store.testing.redis_server import RedisUnavailable
from tests.test_rl_loop import Loop, _check_exactly_once

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster() -> Iterator[RedisCluster]:
    try:
        made = RedisCluster(masters=3, replicas=1)
    except RedisUnavailable:
        pytest.skip("redis-server and redis-cli are not installed")
    with made:
        yield made


def test_a_run_on_a_redis_cluster_survives_a_master_failover(tmp_path: Path, cluster: RedisCluster) -> None:
    loop = Loop(tmp_path, cluster.url)
    try:
        trainer = loop.trainer("--steps", "6")
        loop.actor("a")
        loop.actor("b", "--slowdown", "3")
        run = open_run(loop.store)
        loop.wait(lambda: (run.latest() or 0) >= 2, "version 2", 600)
        control = loop.coord.keys.key("epoch")
        before = cluster.master_of(control)
        killed = cluster.kill_master_of(control)
        assert killed is before and cluster.master_of(control) is not before, "a replica serves the slot now"
        loop.finish(trainer, "trainer")
        _check_exactly_once(loop, 6)
        assert run.versions() == list(range(7))
        after = {r["actor"] for r in map(json.loads, loop.admissions.read_text().splitlines()) if r["step"] >= 4}
        assert after and after <= {"a", "b"}, after
        loop.wait(lambda: {"a", "b"} <= set(loop.coord.workers.registrations()), "both actors alive after it", 120)
        trainer_log = loop.log("trainer")
        assert "learning its slot map again" in trainer_log and "Redis answers again" in trainer_log
        board = JobBoard(loop.coord)
        assert {cluster.master_of(board.inbox(a)) for a in ("a", "b")} <= set(cluster.primaries())
    finally:
        loop.stop()
