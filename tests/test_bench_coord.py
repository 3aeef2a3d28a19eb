"""``aurora bench coord``: the fleet-scale probe runs the real trainer and actor classes on a real
redis-server; on a small fleet its figures say what the design promises (push, O(changed) sweeps,
Redis holding only the steps in flight, binary results)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.fleet import coord


def idle_within_a_trip_a_second(row: dict) -> bool:
    """An idle actor's round trips come from its timers (heartbeat, the stream's block timeout), at
    most one a second: a count over the window measured, plus one trip at each edge of it per actor. A
    loaded machine only fires the timers late (a rate per wall second is the bench's figure, not a
    test's)."""
    idle, actors = row["idle"], row["actors"]
    return 0 < idle["round_trips"] <= actors * (idle["seconds"] * 1.0 + 2)


@pytest.mark.slow
def test_a_small_fleet_is_pushed_not_polled_and_redis_stays_bounded() -> None:
    out = coord.measure(coord.Config(rows="6x12x64,24x12x64", steps=3, idle_s=3.0))
    small, large = out["rows"]
    for row in (small, large):
        assert all(s["admitted"] == 12 and s["tokens"] == 12 * 8 * 64 for s in row["steps"])
        assert idle_within_a_trip_a_second(row), row["idle"]
        assert row["admission"]["admitted"] == row["admission"]["results"]
        assert row["admission"]["bytes_per_token_in_redis"] < 8.5, "int32 + float32 a token, and a small header"
    # refresh the roster, read expired leases, and (with idle actors, as at 24) the unstarted ones
    assert small["sweep"]["round_trips"] <= large["sweep"]["round_trips"] <= 3, "a sweep's cost is not the fleet's"
    memory = [s["memory_after"] for s in large["steps"]]
    assert max(memory) - min(memory) < 1 << 20, f"Redis holds only the steps in flight: {memory}"


@pytest.mark.slow
def test_results_above_the_inline_cap_go_by_reference_from_actors_in_other_processes() -> None:
    out = coord.measure(coord.Config(rows="2x4x8192", steps=2, idle_s=3.0, procs=2))
    (row,) = out["rows"]
    assert row["processes"] == 2 and all(s["admitted"] == 4 for s in row["steps"])
    assert row["admission"]["by_reference"] == row["admission"]["results"]
    assert row["bytes_per_token"] < 0.5, "only references and small fields cross Redis"
    assert idle_within_a_trip_a_second(row), ("counted in the actors' own processes", row["idle"])


@pytest.mark.slow
def test_the_command_prints_one_json_object() -> None:
    cmd = [sys.executable, "-m", "aurora_store.cli", "bench", "coord", "--rows", "2x2x16", "--steps", "1"]
    done = subprocess.run([*cmd, "--idle-s", "0.5", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["bench"] == "coord" and doc["rows"][0]["actors"] == 2
    bad = subprocess.run([*cmd[:-4], "--rows", "2x2", "--json"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "ACTORSxGROUPSxTOKENS" in bad.stderr


@pytest.mark.slow
def test_idle_actors_join_the_row_on_one_connection_each_and_a_cluster_row_splits_its_cpu() -> None:
    """Issue 41: ``--idle-actors`` adds the idle actor's own loop (listener and beat) in processes of their
    own, counted in the row; on a 3-master cluster the bench says how the CPU split over the masters."""
    out = coord.measure(coord.Config(rows="4x8x64", steps=1, idle_s=3.0, idle_actors=40, idle_procs=2, cluster=3))
    (row,) = out["rows"]
    assert (row["actors"], row["working_actors"], row["idle_actors"]) == (44, 4, 40)
    assert row["steps"][0]["admitted"] == 8, "the idle actors are leased nothing: the working ones serve the step"
    assert idle_within_a_trip_a_second(row), row["idle"]
    assert row["idle"]["connections_per_actor"] <= 2.5, "a cluster actor: its shard's node and the control node"
    split = row["idle"]["redis_cpu_split"]
    assert len(split["shares"]) == 3 and abs(sum(split["shares"]) - 1) < 0.01 and split["max_over_even"] >= 1
    at_period = row["redis_cpu_split_at_period"]  # a step and the idle rest of its period, each server's part
    assert len(at_period["shares"]) == 3 and abs(sum(at_period["shares"]) - 1) < 0.01
    assert "Redis Cluster of 3" in row["redis"]
