"""``aurora bench catchup``: a lagging actor's Updater takes the cheaper of the delta chain and the latest
full version plus the chain after it, and the path it takes reaches the target bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.transfer import catchup


def test_lagging_actor_takes_the_cheaper_path() -> None:
    cfg = catchup.Config(layers=0, vocab=512, ks=(1, 4, 12), versions=12, full_every=5)
    out = catchup.measure(cfg)
    assert out["full_versions"] == [0, 5, 10]
    short, mid, long_ = (out["ks"][str(k)] for k in cfg.ks)
    # one version behind, no full version in the window: the single delta
    assert short["choice"] == "chain" and short["full_plus_chain_bytes"] is None
    assert short["choice_bytes"] == short["chain_bytes"] == short["deltas_only_chain_bytes"]
    # a full version in the window: the chain through it fetches it too, so the full plus what follows wins
    for r in (mid, long_):
        assert r["latest_full"] == 10 and r["choice"] == "full+chain"
        assert r["choice_bytes"] == r["full_plus_chain_bytes"] < r["chain_bytes"]
    # every target of every K, and the staged path's weights digest is the published one
    for r in out["ks"].values():
        assert r["ratio_to_cheaper"] == 1.0 and r["digest_matches"]
        assert r["sweep"]["worst_ratio_to_cheaper"] <= catchup.TARGET
    assert out["ks"]["1"]["sweep"]["targets"] == 12 and out["ks"]["12"]["sweep"]["targets"] == 1
    assert out["target"]["met"] and out["worst_ratio_to_cheaper"] == 1.0
    assert 0 < out["changed_fraction_per_version_mean"] < out["changed_fraction_over_first_ten"] < 1


def test_lags_beyond_the_run_are_refused() -> None:
    with pytest.raises(ValueError, match="every K must be in"):
        catchup.measure(catchup.Config(layers=0, vocab=64, ks=(5,), versions=3))


@pytest.mark.slow
def test_the_command_prints_one_json_object() -> None:
    cmd = [sys.executable, "-m", "aurora_store.cli", "bench", "catchup", "--quick", "--vocab", "256"]
    out = subprocess.run(
        [*cmd, "--ks", "1,3", "--versions", "6", "--full-every", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["bench"] == "catchup" and sorted(doc["ks"]) == ["1", "3"] and doc["target"]["met"] is True
    bad = subprocess.run([*cmd, "--ks", "1,0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "must be >= 1" in bad.stderr
