"""What a store says and keeps tidy: a missing bucket, prefix or endpoint is not an empty run;
temporaries of killed writers are swept and live ones kept; the manifest cache is bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import aurora_store
from tests.test_cli import aurora


@pytest.mark.slow
def test_a_missing_bucket_prefix_or_endpoint_is_not_an_empty_run(s3_server: Any, tmp_path: Path) -> None:
    from aurora_store.testing.processes import free_port

    opts = json.dumps(s3_server.options())
    bucket = s3_server.new_bucket()
    missing = aurora("ls", "s3://no-such-bucket-aurora/run", "--storage-options", opts)
    assert missing.returncode == 1 and "bucket 'no-such-bucket-aurora' does not exist" in missing.stderr
    empty = aurora("ls", f"s3://{bucket}/no/run/here", "--storage-options", opts)
    assert empty.returncode == 1 and "nothing is stored under this URI" in empty.stderr
    dead = {**s3_server.options(f"http://127.0.0.1:{free_port()}"), "config_kwargs": {"retries": {"max_attempts": 1}}}
    down = aurora("ls", f"s3://{bucket}/run", "--storage-options", json.dumps(dead))
    assert down.returncode == 1 and "storage backend error" in down.stderr and "Traceback" not in down.stderr
    dest = f"file://{tmp_path}/eu/run"
    once = subprocess.run(
        [
            *RELAY,
            "--once",
            "--dest-region",
            "eu",
            "--source",
            f"s3://{bucket}/no",
            "--source-options",
            opts,
            "--dest",
            dest,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert once.returncode == 1 and "nothing is stored under this URI" in once.stderr, once.stderr


RELAY = (sys.executable, "-m", "aurora_store.cli", "relay")


def test_temporaries_of_killed_writers_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    import time

    from aurora_store.bucket.objectstore import ObjectStore

    store = ObjectStore(f"file://{tmp_path}/run")
    (tmp_path / "run" / "versions" / "0000000001").mkdir(parents=True)
    old = tmp_path / "run" / "versions" / "0000000001" / ".tmp-dead"
    live = tmp_path / "run" / "versions" / "0000000001" / ".tmp-live"
    mine = tmp_path / "run" / "versions" / "0000000001" / "notes.txt"
    for p in (old, live, mine):
        p.write_bytes(b"x")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    os.utime(mine, (time.time() - 3600, time.time() - 3600))
    assert store.sweep_temporaries() == 1
    assert not old.exists() and live.exists() and mine.exists()


def test_the_manifest_cache_is_bounded() -> None:
    run = aurora_store.open_run(
        f"memory://housekeeping/{uuid.uuid4().hex}/run", limits=aurora_store.Limits(cached_manifests=2)
    )
    w = {"w": torch.linspace(-1, 1, 4096).to(torch.bfloat16)}
    for i in range(5):
        w["w"][i] += 1
        run.publish(w)
    for v in range(5):
        run.manifest(v)
    assert len(run.reader._manifests) == 2 and list(run.reader._manifests) == [3, 4]
