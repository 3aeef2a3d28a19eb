"""The schedule benchmark: its JSON in-process for a small run, determinism, and the CLI entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aurora_store.config.options import build
from bench.fleet import schedule
from bench.output import parser_for

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--steps", "12", "--batch", "32", "--seed", "3"]


def _flags(argv: list[str]) -> schedule.Flags:
    """The benchmark's flags from ``argv``, parsed as ``aurora bench schedule`` parses them."""
    flags: schedule.Flags = build(schedule.Flags, parser_for("schedule", schedule.Flags).parse_args(argv))
    return flags


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert schedule.run(_flags(["--json", *argv])) == 0
    out = capsys.readouterr().out
    result: dict[str, Any] = json.loads(out)
    return result


def test_json_keys_and_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, *SMALL)
    assert r["bench"] == "schedule"
    assert {"steps": 12, "batch": 32, "seed": 3}.items() <= r["params"].items()
    assert r["params"]["events"] == {"slowdown": 6, "leave": 3, "back": 6}
    ratio = r["makespan_ratio"]
    assert {"ema_vs_ideal", "uniform_vs_ideal", "true_split_vs_ideal", "last_rate_vs_ideal"} <= ratio.keys()
    assert all(v >= 1.0 for k, v in ratio.items() if k.endswith("_vs_ideal")), ratio
    assert ratio["ema_vs_ideal"] <= ratio["uniform_vs_ideal"]
    assert ratio["true_split_vs_ideal"] <= ratio["ema_vs_ideal"]
    assert r["target"] == {
        "ema_vs_ideal_max": 1.10,
        "met": ratio["ema_vs_ideal"] <= 1.10,
        "trainer_policy": "ema_steal",
        "trainer_policy_met": ratio["ema_steal_vs_ideal"] <= 1.10,
    }
    assert ratio["ema_steal_vs_ideal"] <= ratio["ema_vs_ideal"], "taking over unstarted work only helps"
    assert set(r["mean_makespan"]) == {"ideal", "true_split", "ema_steal", "last_rate", "ema", "uniform"}
    assert isinstance(r["transient"]["note"], str) and r["transient"]["steps"]

    series = r["series"]
    assert [s["step"] for s in series] == list(range(12))
    for s in series:
        m = s["makespan"]
        assert all(m[p] >= m["ideal"] * (1 - 1e-12) for p in m), s
        assert sum(s["ema_shares"].values()) == sum(s["true_shares"].values()) == 32
        assert s["makespan"]["ideal"] == pytest.approx(s["tokens"] / sum(s["speeds"].values()))
    assert "mid" not in series[3]["speeds"] and "mid" in series[6]["ema_shares"]
    assert series[5]["speeds"]["fading"] == 0.8 and series[6]["speeds"]["fading"] == 0.2
    assert series[0]["ema_shares"] == series[0]["true_shares"], "a calibration batch at join: step 0 splits by speed"


def test_json_is_deterministic_for_a_seed(capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _run(capsys, *SMALL), _run(capsys, *SMALL)
    assert a == b
    c = _run(capsys, "--steps", "12", "--batch", "32", "--seed", "4")
    assert c["series"][0]["tokens"] != a["series"][0]["tokens"]


def test_ema_tracks_a_slowdown() -> None:
    """After the slowdown the EMA's estimate halves its error each step (beta 0.5) and the split follows."""
    r = schedule.simulate(schedule.Config(steps=20, batch=64, seed=0))
    s = r["params"]["events"]["slowdown"]
    taus = [row["ema_tau_used"]["fading"] for row in r["series"][s : s + 5]]
    assert taus == pytest.approx([0.8, 0.5, 0.35, 0.275, 0.2375])
    shares = [row["ema_shares"]["fading"] for row in r["series"][s : s + 5]]
    assert shares == sorted(shares, reverse=True) and shares[0] > shares[-1]


def test_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert schedule.run(_flags(SMALL)) == 0
    out = capsys.readouterr().out
    assert "ema_vs_ideal" in out and "fading -> 0.2" in out


@pytest.mark.parametrize(
    "argv", [["--steps", "0"], ["--batch", "-1"], ["--beta", "1"], ["--beta", "nan"], ["--alpha", "0"], ["--seed", "x"]]
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        _flags(argv)


def test_bad_parameters_raise() -> None:
    with pytest.raises(ValueError, match="beta"):
        schedule.simulate(schedule.Config(beta=1.0))
    with pytest.raises(ValueError, match="alpha"):
        schedule.simulate(schedule.Config(alpha=0.0))


def test_aurora_bench_schedule_json_subprocess() -> None:
    aurora = Path(sys.executable).with_name("aurora")
    assert aurora.exists(), f"no console script next to {sys.executable}"
    r = subprocess.run(
        [str(aurora), "bench", "schedule", "--json", *SMALL],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["bench"] == "schedule"
    assert result["makespan_ratio"]["ema_vs_ideal"] <= result["makespan_ratio"]["uniform_vs_ideal"]
