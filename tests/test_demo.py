"""``aurora demo``, the main job, as a user runs it: a real process, embedded or real Redis."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from aurora_store.testing.processes import deadline

REPO = Path(__file__).resolve().parents[1]
AURORA = (sys.executable, "-m", "aurora_store.cli")
pytestmark = pytest.mark.slow


def demo(*args: str, timeout: float = 1200) -> dict[str, Any]:
    """``aurora demo --json ARGS`` in a session of its own: on a timeout the demo and every role it
    started are killed, so a slow run leaves no processes behind."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aurora_store.cli", "demo", "--json", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=deadline(timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"aurora demo did not finish in {deadline(timeout):.0f} s:\n{stderr[-3000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def test_a_short_recipe_learns_and_every_region_verifies(tmp_path: Path) -> None:
    """The recipe's promise on a run the suite can afford: 60 steps at 2.5x the recipe's learning rate
    (the 250-step recipe itself is ``aurora bench recipe``, 5-7 minutes), through the benchmark, which
    runs ``aurora demo --json`` as a user does and judges its summary."""
    recipe = ("--steps", "60", "--lr", "3e-5", "--workdir", str(tmp_path))
    proc = subprocess.run(
        # it kills the demo's session on overrun
        [*AURORA, "bench", "recipe", "--json", *recipe, "--timeout-s", str(round(deadline(1500)))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=deadline(1600),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert r["steps"] == 60 and r["every_version_verified"], r
    assert r["reward_rose"], f"the reward rises by more than twice its standard error: {r}"
    assert r["reward_last"] - r["reward_first"] > 2 * r["reward_stderr"] > 0
    assert r["reward_slope_t"] > 2, f"and its trend over every step is up: {r}"
    assert r["delta_ok"], "a delta is at most 1/8 of a full copy"
    assert 0 < r["density_mean"] <= 0.3, "a delta changes under a third of the weights (a tenth at the recipe's rate)"
    report = Path(r["report"]).read_text()
    svgs = re.findall(r"<svg.*?</svg>", report, flags=re.S)
    assert len(svgs) == 8
    for svg in svgs:
        ET.fromstring(svg)
    for name in ("actor-home", "actor-eu", "actor-ap"):
        assert name in report, "each actor's share of work is in the report"
    home = tmp_path / "buckets" / "home" / "run"
    states = sorted(p.name for p in (home / "trainer").iterdir())
    assert len(states) == 2 and states[-1].startswith("state-0000000060-"), "the newest two states, all a resume needs"
    assert len(list((home / "versions").iterdir())) == 61, "every version is kept"


def test_demo_against_a_real_redis_and_given_stores(tmp_path: Path, redis_server: Any) -> None:
    stores = [(tmp_path / r).as_uri() for r in ("a", "b", "c")]
    summary = demo(
        "--redis",
        redis_server.url,
        "--store",
        *stores,
        "--steps",
        "4",
        "--prompts",
        "8",
        "--sft-steps",
        "20",
        "--workdir",
        str(tmp_path / "work"),
    )
    assert summary["steps"] == 4 and summary["versions_verified"] == 15
    rows = summary["per_step"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert 0 <= r["reward"] <= 1 and r["reward_stderr"] >= 0
        if r["kind"] == "delta":  # a step whose groups all scored alike trains nothing and changes nothing
            assert 0 <= r["changed_fraction"] < 1
            assert (r["bytes_per_changed"] is None) == (r["changed_fraction"] == 0)
    assert any(r["kind"] == "delta" and r["changed_fraction"] > 0 and r["bytes_per_changed"] > 0 for r in rows)
    assert set(summary["apply_s"]) == {"home", "eu", "ap"}
    assert all(a["p50"] <= a["p95"] and a["versions"] >= 1 for a in summary["apply_s"].values())
    assert all((tmp_path / r / "versions").is_dir() for r in ("a", "b", "c"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--problems", "0"], "--problems must be at least 1"),
        (["--actors", "home,mars"], "--actors 'home,mars': name some of home, eu, ap"),
        (["--actors", "eu,eu"], "each once"),
        (["--actors", ","], "name some of"),
    ],
)
def test_demo_real_refuses_bad_flags_before_starting_anything(tmp_path: Path, flags: list[str], message: str) -> None:
    got = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", "demo-real", "--workdir", str(tmp_path), *flags],
        capture_output=True,
        text=True,
        check=False,
        timeout=deadline(300),
    )
    assert got.returncode != 0 and message in got.stderr
    assert list(tmp_path.iterdir()) == [], "nothing was written"
