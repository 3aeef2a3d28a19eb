"""``aurora bench quant`` (issue 37): its quick run, as a user runs it, measures what the quantized
artefacts change per step against BF16 on one trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", "bench", "quant", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_quick_run_compares_every_artefact_on_one_trace() -> None:
    done = _bench("--quick", "--json")
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout)
    assert r["model"] == "tiny" and len(r["steps"]) == 2
    mean = r["mean"]
    assert 0 < mean["bf16"]["words_changed"] < 1
    for scheme in ("fp8-e4m3-block128", "int8-w8a8-channel"):
        row = mean[scheme]
        assert 0 < row["words_changed"] < mean["bf16"]["words_changed"], "a 1-byte word moves less often"
        # quantizing the BF16 weights keeps most scales; quantizing the FP32 masters moves nearly all
        from_fp32 = mean[scheme.split("-")[0] + "-from-fp32"]
        assert row["scales_changed"] < 0.1 < from_fp32["scales_changed"]
        assert row["delta_bytes"] < row["delta_bytes_before_aurora6"], "sparse 1-byte words beat whole tensors"
    assert r["full_bytes"]["fp8"] < r["full_bytes"]["bf16"]


def test_an_unknown_model_is_refused_with_the_ones_there_are() -> None:
    done = _bench("--model", "llama-70b")
    assert done.returncode != 0 and "--model takes smollm2, tiny" in done.stderr
