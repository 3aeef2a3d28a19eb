"""``aurora bench engine``: its flags (checked before any engine starts), and, on a real vLLM engine
(its CPU build, in .venv/vllm), the quick run's JSON: the engine that applied the deltas generates
what the engine reloaded by vLLM and the one restarted from the same version generate."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

CMD = [sys.executable, "-m", "aurora_store.cli", "bench", "engine"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--models", "gpt5"], "--models takes"),
        (["--models", ","], "--models takes"),
        (["--densities", "0"], "each density must be in"),
        (["--densities", "0.01,1.5"], "each density must be in"),
        (["--densities", "x"], "comma-separated numbers"),
        (["--versions", "0"], "versions"),
    ],
)
def test_bad_flags_are_refused_before_any_engine_starts(flags: list[str], message: str) -> None:
    got = subprocess.run([*CMD, *flags], capture_output=True, text=True, check=False, timeout=120)
    assert got.returncode != 0 and message in got.stderr and got.stdout == ""


@pytest.mark.vllm
def test_the_quick_run_applies_deltas_that_generate_as_a_reload_does() -> None:
    got = subprocess.run([*CMD, "--quick", "--json"], capture_output=True, text=True, check=False, timeout=900)
    assert got.returncode == 0, got.stderr[-3000:]
    r = json.loads(got.stdout)  # stdout holds the JSON object alone (vLLM's own logs go to stderr)
    assert r["bench"] == "engine" and r["device"] == "cpu" and r["vllm"].startswith("0.3")
    assert set(r["host"]) == {"cpu", "cores", "avx512", "amx"} and r["host"]["cores"] >= 1
    m = r["models"]["tiny"]
    assert m["same_tokens_as_reload"] is True
    (row,) = m["densities"].values()
    assert 0.005 < row["changed_fraction"] < 0.02
    assert 0 < row["delta_bytes_mean"] < m["full_bytes"] / 10
    for key in ("pause_ms", "stage_ms", "stage_in_worker_ms", "pause_scatter_ms", "pause_rebuild_ms"):
        assert len(row[key]["all"]) == 2 and all(x >= 0 and math.isfinite(x) for x in row[key]["all"])
    assert all(0 < w <= s for w, s in zip(row["stage_in_worker_ms"]["all"], row["stage_ms"]["all"], strict=True))
    for key in ("reload_ms", "repack_floor_ms"):
        assert len(m[key]["all"]) == 2 and all(x > 0 and math.isfinite(x) for x in m[key]["all"])
    assert m["restart_ms"] > m["reload_ms"]["median"], "a restart costs more than a reload"
    assert row["pause_vs_reload"] == pytest.approx(row["pause_ms"]["median"] / m["reload_ms"]["median"], rel=0.01)
    # the workers were handed the delta's bytes and its manifest, not the model's words
    assert 1 <= row["bytes_in_vs_delta"] < m["full_bytes"] / row["delta_bytes_mean"] / 10
    assert m["met"]["bytes_in_vs_delta"] == (row["bytes_in_vs_delta"] <= 2)
    assert set(m["rss_mb"]) == {"before_engine", "engine_started", "bootstrapped", "after_versions"}
