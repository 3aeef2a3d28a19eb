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
        (["--density", "0"], "--density must be in"),
        (["--density", "1.5"], "--density must be in"),
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
    m = r["models"]["tiny"]
    assert m["same_tokens_as_reload"] is True
    assert 0.005 < m["changed_fraction"] < 0.02
    assert 0 < m["delta_bytes_mean"] < m["full_bytes"] / 10
    for key in ("pause_ms", "reload_ms", "stage_ms", "pause_scatter_ms", "pause_rebuild_ms"):
        assert len(m[key]["all"]) >= 2 and all(x >= 0 and math.isfinite(x) for x in m[key]["all"])
    assert m["pause_ms"]["median"] > 0 and m["reload_ms"]["median"] > 0
    assert m["restart_ms"] > m["reload_ms"]["median"], "a restart costs more than a reload"
    assert m["pause_vs_reload"] == pytest.approx(m["pause_ms"]["median"] / m["reload_ms"]["median"], rel=0.01)
    assert m["met"] == (m["pause_vs_reload"] <= r["models"]["tiny"]["target_pause_vs_reload"])
