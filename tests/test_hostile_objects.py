"""Objects planted in a bucket by a writer with access to it: a deeply nested index is one bad
version to audit and a clear error to replay; an actor reads a run's files only as a verified
manifest vouches for them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

import aurora_store
from aurora_store.errors import CorruptError
from aurora_store.format.keys import index_key, manifest_key
from aurora_store.format.manifest import Segment
from aurora_store.testing import damage
from tests.test_cli import aurora


def _weights(name: str = "w") -> dict[str, torch.Tensor]:
    return {name: torch.arange(8, dtype=torch.float32).to(torch.bfloat16)}


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


def test_the_actor_reads_attachments_only_as_the_manifest_vouches_for_them(tmp_path: Path) -> None:
    from actor import assemble

    run = aurora_store.open_run(f"file://{tmp_path}/run")
    run.files.put("task.json", b'{"task": "arith"}')
    run.publish(_weights())
    assert assemble.run_files(run, 0) == {"task.json": b'{"task": "arith"}'}
    damage.overwrite(run.store, "files/task.json", b'{"task": "reverse"}')
    with pytest.raises(CorruptError, match="files/task.json"):
        assemble.run_files(aurora_store.open_run(run.uri), 0)
    damage.overwrite(run.store, "files/extra.json", b"{}")  # a file no manifest names is never read
    damage.overwrite(run.store, "files/task.json", b'{"task": "arith"}')
    assert assemble.run_files(aurora_store.open_run(run.uri), 0) == {"task.json": b'{"task": "arith"}'}
