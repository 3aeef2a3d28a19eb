"""``aurora bench full`` on a small model in several shards: its JSON, and a materialize that is bit-exact."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest

from bench.store import full

pytestmark = pytest.mark.slow

SMALL = full.Config(layers=1, vocab=2048, repeats=1, shard_bytes=3 << 20)


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return full.measure(SMALL)


def test_json_shape(result: dict[str, Any]) -> None:
    assert result["bench"] == "full" and result["config"] == {
        "layers": 1,
        "vocab": 2048,
        "repeats": 1,
        "shard_bytes": 3 << 20,
        "seed": 0,
    }
    assert result["publish"]["model_bytes"] == result["materialize"]["model_bytes"] > 10 << 20
    for kind in ("publish", "materialize"):
        for key in ("ours_s", "safetensors_s", "ours_mb_s", "safetensors_mb_s"):
            assert result[kind][key] > 0 and math.isfinite(result[kind][key])
        assert result[kind]["ours_peak_mb"] >= 0 or math.isnan(result[kind]["ours_peak_mb"])
    ratios = result["ratios"]
    assert set(ratios) == set(full.TARGETS) == set(result["targets"])
    assert ratios["publish_vs_safetensors_save"] == pytest.approx(
        result["publish"]["ours_s"] / result["publish"]["safetensors_s"]
    )
    for name, target in result["targets"].items():
        assert target == {"max": full.TARGETS[name], "met": ratios[name] <= full.TARGETS[name]}


def test_the_version_is_several_shards_and_materializes_bit_exact(result: dict[str, Any]) -> None:
    assert result["materialize"]["shards"] > 2, "the model is spread over shards (and an index)"
    assert result["materialize"]["bit_exact"] is True


def test_the_command_prints_one_json_object_and_refuses_bad_flags() -> None:
    cmd = [sys.executable, "-m", "aurora_store.cli", "bench", "full"]
    ok = subprocess.run(
        [*cmd, "--json", "--vocab", "512", "--repeats", "1", "--seed", "3"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["config"]["vocab"] == 512 and out["config"]["seed"] == 3 and out["materialize"]["bit_exact"]
    bad = subprocess.run([*cmd, "--repeats", "0"], capture_output=True, text=True, check=False, timeout=120)
    assert bad.returncode == 2 and "repeats" in bad.stderr and "Traceback" not in bad.stderr
