"""``aurora bench fuzz``: every target runs and finds nothing; the engine does count a crash and a hang."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aurora_store.errors import CorruptError
from aurora_store.testing.processes import deadline
from bench.fuzz import fuzz
from bench.fuzz.mutate import mutate_bytes, mutate_fields, mutate_json
from bench.fuzz.targets import BUILDERS

ROOT = Path(__file__).resolve().parent.parent
EXECS = 1500
TARGETS = ("manifest", "segment", "safetensors", "redis_events", "redis_results", "redis_docs", "attachments")


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    cmd = [sys.executable, "-m", "aurora_store.cli", "bench", "fuzz", "--json", "--execs", str(EXECS), "--seed", "1"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert r.stdout.strip(), r.stderr[-3000:]
    out: dict[str, Any] = json.loads(r.stdout)  # one JSON object, whatever the libraries under test print
    out["exit_status"] = r.returncode
    return out


@pytest.mark.slow
def test_report_shape(report: dict[str, Any]) -> None:
    assert report["bench"] == "fuzz" and report["seed"] == 1 and report["execs_per_target"] == EXECS
    assert tuple(report["targets"]) == TARGETS == tuple(BUILDERS)
    for name, t in report["targets"].items():
        assert t["name"] == name and t["functions"] and t["seeds"] > 0
        assert t["execs_per_s"] > 0 and t["peak_rss_mb"] >= 0 and 0 <= t["slowest_s"] <= report["timeout_s"]
        assert t["accepted"] + sum(t["errors"].values()) == t["executions"] - t["crashes"] - t["hangs"]
        assert set(t) >= {"crash_classes", "crash_examples", "hang_examples", "errors"}
    totals = report["totals"]
    assert totals["executions"] == sum(t["executions"] for t in report["targets"].values())
    assert totals["crashes"] == sum(t["crashes"] for t in report["targets"].values())
    assert isinstance(report["ok"], bool) and totals["wall_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", TARGETS)
def test_target_finds_no_crash_or_hang(report: dict[str, Any], name: str) -> None:
    t = report["targets"][name]
    assert "error" not in t, t.get("error")
    assert t["executions"] >= EXECS
    assert t["crashes"] == 0, (t["crash_classes"], t["crash_examples"][:2])
    assert t["hangs"] == 0, t["hang_examples"][:2]


@pytest.mark.slow
def test_every_target_reaches_past_its_first_check(report: dict[str, Any]) -> None:
    """Mutants are not all refused by the same check: the report sees several outcomes per target."""
    for name, t in report["targets"].items():
        assert t["accepted"] > 0 and t["errors"], name


@pytest.mark.slow
def test_ok_and_exit_status(report: dict[str, Any]) -> None:
    assert report["ok"] is True
    assert report["exit_status"] == 0


def _tiny(execute: Any) -> fuzz.Target[bytes]:
    return fuzz.Target("tiny", [b'{"a": 1}'], lambda rng, data: mutate_bytes(rng, data), execute)


def _picky(data: bytes) -> None:
    """A parser with a bug: a missing key escapes as KeyError, not as the project's error."""
    if data[:1] != b"{":
        raise CorruptError("not an object")
    if b"a" not in data:
        raise KeyError("a")


def test_an_exception_outside_the_family_is_a_crash() -> None:
    r = fuzz.fuzz(_tiny(_picky), 2000, 0, 2.0)
    assert r["crashes"] > 0 and r["hangs"] == 0
    assert r["errors"]["CorruptError"] > 0 and r["accepted"] > 0
    (where,) = r["crash_classes"]
    assert where.startswith("KeyError at tests/test_bench_fuzz.py:") and where.endswith("(_picky)")
    assert all(ex["error"] == "KeyError: 'a'" for ex in r["crash_examples"])
    whole = [ex["input"] for ex in r["crash_examples"] if "..." not in ex["input"]]
    with pytest.raises(KeyError):
        _picky(bytes.fromhex(whole[0]))  # the recorded input reproduces it
    assert not fuzz.passed(r, 2000)
    assert fuzz.passed(fuzz.fuzz(_tiny(lambda data: None), 200, 0, 2.0), 200)


def test_an_endless_loop_is_a_hang_and_the_run_goes_on() -> None:
    def spin(data: bytes) -> None:
        while len(data) > 9:
            pass

    before = signal.getsignal(signal.SIGALRM)
    t0 = time.perf_counter()
    r = fuzz.fuzz(_tiny(spin), 60, 0, 0.05)
    assert time.perf_counter() - t0 < deadline(120), "each hang was cut off (60 endless inputs)"
    assert 0 < r["hangs"] < 60 and r["crashes"] == 0 and r["accepted"] == 60 - r["hangs"]
    assert r["hang_examples"][0]["seconds"] >= 0.05 and len(bytes.fromhex(r["hang_examples"][0]["input"])) > 9
    assert not fuzz.passed(r, 60)
    assert signal.getsignal(signal.SIGALRM) == before


def test_fuzzing_is_deterministic_for_a_seed() -> None:
    def strip(r: dict[str, Any]) -> dict[str, Any]:
        return {k: r[k] for k in ("accepted", "errors", "crashes", "crash_classes", "crash_examples")}

    a, b = (fuzz.fuzz(_tiny(_picky), 500, 7, 2.0) for _ in range(2))
    for ex in a["crash_examples"] + b["crash_examples"]:
        ex.pop("seconds")
    assert strip(a) == strip(b)
    assert strip(fuzz.fuzz(_tiny(_picky), 500, 8, 2.0)) != strip(a)


def test_mutators_are_seeded_and_stay_in_bounds() -> None:
    doc = json.dumps({"a": [1, 2, {"b": "x"}], "c": None}).encode()
    rng, again = random.Random(3), random.Random(3)
    outs = [mutate_json(rng, doc) for _ in range(1000)]
    assert outs == [mutate_json(again, doc) for _ in range(1000)]
    assert len(set(outs)) > 700
    assert any(b"[[[[" in o for o in outs)  # nesting no encoder writes
    kept = [mutate_bytes(rng, doc, keep_length=True) for _ in range(300)]
    assert all(len(k) == len(doc) for k in kept) and len(set(kept)) > 200
    fields = [mutate_fields(rng, {"version": "1", "doc": '{"x": [1]}'}) for _ in range(300)]
    assert any(not isinstance(v, str) for f in fields for v in f.values())
    assert any(isinstance(v, str) and "\ud800" in v for f in fields for v in f.values())
