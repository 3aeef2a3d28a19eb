"""Issue 39: ``aurora bench chaos`` across seeds (``--seeds``), the schedule file every run leaves and
``--replay`` runs again, and the evidence a failed invariant leaves. The parsers of what a user or a
file gives (seed lists, schedule files, their configs) refuse bad input with a ConfigError."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aurora_store.errors import ConfigError
from bench.chaos import schedule as chaos_schedule
from bench.chaos.config import Config, from_replayable, replayable
from bench.chaos.evidence import leave_evidence
from bench.chaos.schedule import KINDS, Planned, plan
from bench.chaos.sweep import parse_seeds

REPO = Path(__file__).resolve().parents[1]


def test_a_seed_plans_its_whole_schedule_before_the_first_fault() -> None:
    """Kinds, gaps and each fault's own seed come from the run's seed alone: the same seed plans the
    same schedule, and a fault's draws come from its own seed, never from what the faults before drew."""
    a, b = plan(7, 60, None, 2.0), plan(7, 60, None, 2.0)
    assert a == b and plan(8, 60, None, 2.0) != a
    assert {p.kind for p in a[: len(KINDS)]} == set(KINDS), "every kind once first"
    assert all(1.0 <= p.gap_s <= 3.0 for p in a)
    assert len({p.seed for p in a}) == len(a)
    first = a[5].rng()
    first.random()
    assert a[6].rng().random() == plan(7, 60, None, 2.0)[6].rng().random()


planned_lists = st.lists(
    st.builds(
        Planned,
        st.sampled_from(sorted(KINDS)),
        st.floats(0, 3600, allow_nan=False),
        st.integers(0, 2**63 - 1),
    ),
    max_size=30,
)


@given(planned_lists, st.integers(0, 10**6), st.integers(0, 500))
def test_a_schedule_file_round_trips(tmp_path_factory: Any, faults: list[Planned], seed: int, steps: int) -> None:
    path = tmp_path_factory.mktemp("sched") / "schedule.json"
    cfg = Config(seed=seed, steps=steps or None, kinds=("kill_actor", "partition") if seed % 2 else None)
    chaos_schedule.write(path, replayable(cfg), tuple(faults))
    config, back = chaos_schedule.read(str(path))
    assert back == tuple(faults)
    assert from_replayable(config, str(path)) == cfg


@pytest.mark.parametrize(
    "doc",
    [
        b"{",
        b"[]",
        b'{"format": "aurora-chaos-schedule/2", "config": {}, "faults": []}',
        {"config": [], "faults": []},
        {"config": {}, "faults": {}},
        {"config": {}, "faults": [{"kind": "nap", "gap_s": 1, "seed": 1}]},
        {"config": {}, "faults": [{"kind": "kill_actor", "gap_s": -1, "seed": 1}]},
        {"config": {}, "faults": [{"kind": "kill_actor", "gap_s": 1e9, "seed": 1}]},
        {"config": {}, "faults": [{"kind": "kill_actor", "gap_s": True, "seed": 1}]},
        {"config": {}, "faults": [{"kind": "kill_actor", "gap_s": 1, "seed": 2**63}]},
        {"config": {}, "faults": [{"kind": "kill_actor", "gap_s": 1, "seed": "1"}]},
        {"config": {}, "faults": [{"kind": "kill_actor", "gap_s": 1, "seed": 1, "extra": 0}]},
        {"config": {}, "faults": [[1, 2, 3]]},
    ],
    ids=lambda d: (d if isinstance(d, bytes) else json.dumps(d))[-40:],
)
def test_a_hostile_schedule_file_is_refused(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "schedule.json"
    data = doc if isinstance(doc, bytes) else json.dumps({"format": chaos_schedule.SCHEDULE_FORMAT, **doc}).encode()
    path.write_bytes(data)
    with pytest.raises(ConfigError, match="not a chaos schedule"):
        chaos_schedule.read(str(path))


@pytest.mark.parametrize(
    "config",
    [
        {"nap": 1},
        {"faults": "12"},
        {"faults": -1},
        {"faults": 1.5},
        {"faults": True},
        {"interval_s": float("inf")},
        {"interval_s": -0.5},
        {"steps": "x"},
        {"restart_s": [1]},
        {"restart_s": [1, "2"]},
        {"kinds": "kill_actor"},
        {"kinds": [1]},
        {"workdir": "/tmp/elsewhere"},
        {"planned": []},
    ],
    ids=lambda c: json.dumps(c)[:40],
)
def test_a_hostile_config_in_a_schedule_file_is_refused(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"config\."):
        from_replayable(config, "schedule.json")


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("1-10", list(range(1, 11))), ("3,7,9", [3, 7, 9]), ("1-3,8,2", [1, 2, 3, 8]), ("5", [5]), (" 4 - 4 ", None)],
)
def test_seeds_are_a_range_or_a_list(text: str, seeds: list[int] | None) -> None:
    if seeds is None:
        with pytest.raises(ConfigError):
            parse_seeds(text)
    else:
        assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a-b", "10-1", "1-", "-3", "1-5000", "1,,2", "1.5", "0x10"])
def test_bad_seeds_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--seeds"):
        parse_seeds(text)


def test_a_failed_invariant_leaves_its_evidence(tmp_path: Path) -> None:
    """The first failed invariant, its problems, and the roles' log lines naming what they name."""
    (tmp_path / "trainer.log").write_text(
        "step 29 ok\nversions/0000000030/00000-ab.seg is truncated: publishing version 30 as a full version instead\n"
    )
    (tmp_path / "relay-eu.log").write_text("copied version 31\nrefused version 30: declares version 4\n")
    result = {
        "seed": 12,
        "invariants": {"every_prompt_admitted_once": True, "regions_replay_bit_exact": False, "descent": False},
        "problems": {
            "regions_replay_bit_exact": [
                "home: audit: v30: s3://b/runs/chaos/versions/0000000030/manifest.json: version 30: differs"
            ],
            "descent": ["loss rose"],
        },
    }
    path = leave_evidence(result, tmp_path)
    assert path == str(tmp_path / "evidence.json")
    doc = json.loads(Path(path).read_text())
    assert doc["invariant"] == "regions_replay_bit_exact" and doc["also_failed"] == ["descent"]
    assert doc["objects"] == ["versions/0000000030/manifest.json"] and doc["versions"] == [30]
    assert doc["log_lines"] == [
        "relay-eu.log: refused version 30: declares version 4",
        "trainer.log: versions/0000000030/00000-ab.seg is truncated: publishing version 30 as a full version instead",
    ]
    result["invariants"] = dict.fromkeys(result["invariants"], True)
    assert leave_evidence(result, tmp_path / "none") is None


def _bench(*argv: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", "bench", "chaos", "--json", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.stdout.strip(), out.stderr[-3000:]
    return out, json.loads(out.stdout.strip().splitlines()[-1])


def _faults_in_order(work: Path) -> list[str]:
    events = [json.loads(line) for line in (work / "chaos.jsonl").read_text().splitlines()]
    return [e["kind"] for e in events if e.get("event") == "fault"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_sweep_leaves_each_seeds_schedule_and_a_replay_runs_it_again(tmp_path: Path) -> None:
    """A sweep of one seed (the smallest sweep: each seed is one whole run) leaves its schedule file;
    ``--replay`` of that file injects the same faults in the same order and keeps every invariant."""
    kinds = "kill_actor,forged_result,corrupt_segment,replay_manifest"
    flags = ("--faults", "4", "--kinds", kinds, "--steps", "6", "--interval-s", "0.5", "--actors", "1")
    out, swept = _bench("--seeds", "11", *flags, "--settle-s", "120", "--workdir", str(tmp_path / "sweep"))
    (row,) = swept["rows"]
    summary = swept["summary"]
    assert row["seed"] == 11 and row["workdir"] == str(tmp_path / "sweep" / "seed-11")
    assert summary["seeds"] == 1 and summary["faults"] == row["faults"] >= 3, swept
    assert row["passed"] and summary["failed"] == [] and row["evidence"] is None, (row, out.stderr[-2000:])
    assert out.returncode == 0
    config, planned = chaos_schedule.read(row["schedule"])
    assert [p.kind for p in planned] == _faults_in_order(Path(row["workdir"]))
    assert config["seed"] == 11 and config["steps"] == 6

    out, again = _bench("--replay", row["schedule"], "--workdir", str(tmp_path / "again"))
    assert _faults_in_order(tmp_path / "again") == [p.kind for p in planned]
    assert chaos_schedule.read(again["schedule"])[1] == planned
    failing = {k: again["problems"].get(k) for k, ok in again["invariants"].items() if not ok}
    assert again["lost"] == 0 and not failing and out.returncode == 0, (failing, tmp_path)


def test_a_replay_of_a_file_that_is_not_a_schedule_says_so(tmp_path: Path) -> None:
    bad = tmp_path / "schedule.json"
    bad.write_text('{"format": "aurora-chaos-schedule/1", "config": {"faults": "many"}, "faults": []}')
    out = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", "bench", "chaos", "--replay", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert f"{bad}: config.faults must be int" in out.stderr, out.stderr
    both = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", "bench", "chaos", "--replay", str(bad), "--seeds", "1-2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert both.returncode != 0 and "--seeds and --replay" in both.stderr and "Traceback" not in both.stderr
