"""``aurora bench state`` measures both modes in one run and writes real states (smoke test: the
figures themselves are the benchmark's, not asserted here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.store.state import Flags, measure


@pytest.mark.slow
def test_the_state_benchmark_measures_both_modes_in_one_run(tmp_path: Path) -> None:
    result = measure(Flags(steps=2, samples=2, tokens=8, workdir=str(tmp_path)))
    (row,) = result["models"]
    assert row["model"] == "demo" and row["saves"] == 2 and row["failed"] == 0
    assert 12.0 <= row["state_bytes_per_parameter"] < 13.0, "FP32 masters and two AdamW moments, plus headers"
    assert row["step_s_without_states"] > 0 and row["step_s_with_states"] > 0 and row["writer_s_per_state"] > 0
    assert set(result) >= {"training_thread_ok", "step_ratio_ok"}
    assert not list(tmp_path.iterdir()), "the benchmark's bucket is removed after it"
