"""``aurora bench retention``: with gc every few versions a run's storage stays bounded by what is
kept, however long it runs, and what is left audits."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.store import retention


def test_storage_stays_bounded_and_audits() -> None:
    cfg = retention.Config(
        versions=40, elements=1 << 16, full_every=5, gc_every=5, keep_last=3, keep_fulls=1, actor_lag=2
    )
    out = retention.measure(cfg)
    assert out["audit_ok"] and out["audit_retired"] == out["versions_retired"] > 20
    sizes = out["bytes_after_each_gc"]
    assert len(sizes) == 8
    assert max(sizes[2:]) < 1.5 * min(sizes[2:]), f"held bytes do not grow with the run: {sizes}"
    assert out["bytes_at_end"] < 0.4 * out["published_bytes"]
    assert out["versions_kept"] <= 1 + 1 + 3 + 5  # version 0, a full, the last 3, the actor's chain


@pytest.mark.slow
def test_the_command_prints_one_json_object() -> None:
    cmd = [sys.executable, "-m", "aurora_store.cli", "bench", "retention", "--versions", "6", "--elements", "4096"]
    out = subprocess.run([*cmd, "--gc-every", "3", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["bench"] == "retention" and doc["audit_ok"] is True
    bad = subprocess.run([*cmd, "--versions", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "must be >= 1" in bad.stderr
