"""Regression tests of the holes a hostile probe found (issue 10), one section per hole."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import aurora_store
from aurora_store.errors import CorruptError, StoreError
from aurora_store.format.keys import index_key, manifest_key
from aurora_store.format.manifest import Segment
from aurora_store.format.manifest_parser import parse_manifest
from aurora_store.testing import damage
from tests.test_cli import aurora


def _run() -> Any:
    return aurora_store.open_run(f"memory://holes/{uuid.uuid4().hex}/run")


def _weights(name: str = "w") -> dict[str, torch.Tensor]:
    return {name: torch.arange(8, dtype=torch.float32).to(torch.bfloat16)}


# ---------------------------------------------------------------- 1. the writer checks what the reader checks


@pytest.mark.parametrize(
    "args",
    [
        {"step": -1},
        {"step": 1.5},
        {"step": 2**70},
        {"step": True},
        {"meta": {"lr": 1}},
        {"meta": {"lr": float("nan")}},
        {"meta": {"k\ud800": "v"}},
        {"meta": {"k": "\ud800"}},
        {"meta": {"": "v"}},
        {"meta": {f"k{i}": "v" for i in range(1025)}},
        {"meta": ["not", "a", "mapping"]},
    ],
    ids=lambda a: repr(a)[:40],
)
def test_a_publish_the_readers_would_refuse_writes_nothing(args: dict[str, Any]) -> None:
    run = _run()
    with pytest.raises(StoreError):
        run.publish(_weights(), **args)
    assert run.store.list_keys("") == [], "refused before the first byte is written"
    run.publish(_weights(), step=0, meta={"lr": "1e-6"})  # the run goes on
    assert run.versions() == [0] and run.manifest(0).meta == {"lr": "1e-6"}


@pytest.mark.parametrize("name", ["__metadata__", "w\ud800", ""])
def test_a_tensor_name_the_readers_would_refuse_writes_nothing(name: str) -> None:
    run = _run()
    with pytest.raises(StoreError):
        run.publish(_weights(name))
    assert run.store.list_keys("") == []


@pytest.mark.parametrize(
    "change",
    [{"meta": {"k": "\ud800"}}, {"meta": {"\ud800": "v"}}, {"step": -1}],
    ids=["surrogate-value", "surrogate-key", "negative-step"],
)
def test_the_parser_refuses_by_the_same_rules(change: dict[str, Any]) -> None:
    run = _run()
    run.publish(_weights())
    m = dataclasses.replace(run.manifest(0), **change)
    data = dataclasses.replace(m, version_hash=m.compute_hash()).to_bytes()
    with pytest.raises(CorruptError):
        parse_manifest(data, expect_version=0)


# ---------------------------------------------------------------- 2. a deeply nested index: audit goes on


def _deep_index_run(tmp_path: Path) -> str:
    """Version 2 (full) of a five-version run gets an index nested 200,000 deep, rehashed so only
    its content is wrong (what a writer with bucket access could plant)."""
    uri = f"file://{tmp_path}/run"
    run = aurora_store.open_run(uri, full_every=2)
    w = _weights()
    for i in range(5):
        w["w"][i] += 1
        run.publish(w)
    m = run.manifest(2)
    deep = b'{"weight_map":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    sha = hashlib.sha256(deep).hexdigest()
    index = Segment(index_key(2, sha), len(deep), sha)
    damage.overwrite(run.store, index.key, deep)
    stats = dataclasses.replace(m.stats, bytes=m.stats.bytes - m.index.size + len(deep))  # type: ignore[union-attr]
    bad = dataclasses.replace(m, index=index, stats=stats)
    damage.overwrite(run.store, manifest_key(2), dataclasses.replace(bad, version_hash=bad.compute_hash()).to_bytes())
    return uri


def test_a_deeply_nested_index_is_one_bad_version_to_audit_and_a_clear_error_to_replay(tmp_path: Path) -> None:
    uri = _deep_index_run(tmp_path)
    audited = aurora("audit", uri, "--json")
    assert audited.returncode == 1 and "Traceback" not in audited.stderr
    rows = {r["version"]: r for r in json.loads(audited.stdout)["versions"]}
    assert rows[2]["status"] == "failed" and "not a safetensors index" in rows[2]["error"]
    assert rows[0]["status"] == rows[1]["status"] == rows[4]["status"] == "ok", "the other versions are checked"
    replayed = aurora("replay", uri, "--version", "2", "--out", str(tmp_path / "out"))
    assert replayed.returncode != 0 and "not a safetensors index" in replayed.stderr
    assert "Traceback" not in replayed.stderr and not (tmp_path / "out").exists()
    assert aurora("replay", uri, "--version", "4", "--out", str(tmp_path / "v4")).returncode == 0
