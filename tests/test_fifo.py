"""A FIFO planted in a ``file://`` store or given as a config file (issue 25, bug 6): every reader
opens regular files only and reads a bounded number of bytes, so a role or command that meets one
exits promptly with a clear error (or skips the entry, where it reads a listing), never hangs.

Real FIFOs (``os.mkfifo``) in real stores, read by real ``aurora`` processes under a timeout: on
the code before the fix each of them waited forever for a writer.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aurora_store import open_run
from aurora_store.format.keys import manifest_key
from tests import helpers
from tests.helpers import state_dict, step

PROMPT_S = 60
"""Far above what any of these commands takes; a hang (the bug) runs into it."""
aurora = functools.partial(helpers.aurora, timeout=PROMPT_S)

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")


def fifo_in_place_of(path: str) -> None:
    os.unlink(path)
    os.mkfifo(path)


def three_versions(root: Path) -> str:
    """A run of versions 0 (full), 1 and 2 (deltas) in ``root``; its URI."""
    uri = f"file://{root}/run"
    run = open_run(uri, full_every=100)
    sd = state_dict(0)
    for v in range(3):
        run.publish(sd, kind="auto")
        sd = step(sd, v + 1)
    run.close()
    return uri


def test_a_fifo_segment_fails_audit_relay_and_replay_promptly(tmp_path: Path) -> None:
    uri = three_versions(tmp_path)
    run = open_run(uri)
    seg = run.manifest(1).segments[0]
    fifo_in_place_of(run.store.path(seg.key))
    url = run.store.url(seg.key)

    r = aurora("audit", uri)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not a regular file (a FIFO)" in r.stdout + r.stderr and seg.key in r.stdout + r.stderr

    dest = f"file://{tmp_path}/eu"
    r = aurora("relay", "--source", uri, "--dest", dest, "--dest-region", "eu", "--once")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert f"{url}: not a regular file (a FIFO)" in r.stderr
    assert open_run(dest).versions() == [0]  # nothing after the refused version was committed there

    r = aurora("replay", uri, "--version", "2", "--out", str(tmp_path / "out"))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "not a regular file (a FIFO)" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_fifo_manifest_is_reported_by_ls_and_gc(tmp_path: Path) -> None:
    uri = three_versions(tmp_path)
    run = open_run(uri)
    fifo_in_place_of(run.store.path(manifest_key(1)))

    r = aurora("ls", uri)
    assert "Traceback" not in r.stderr, r.stderr
    assert "not a regular file (a FIFO)" in r.stdout + r.stderr

    r = aurora("gc", uri, "--keep-last", "1", "--keep-fulls", "1")  # a dry run lists the unreadable manifest
    assert r.returncode == 0, r.stderr
    assert "not a regular file (a FIFO)" in r.stdout + r.stderr


def test_a_fifo_config_file_is_refused_by_config_check_and_roles(tmp_path: Path) -> None:
    conf = tmp_path / "aurora.toml"
    os.mkfifo(conf)
    r = aurora("config", "check", str(conf))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert f"{conf}: cannot read the config file: not a regular file (a FIFO)" in r.stderr
    r = aurora("relay", "--config", str(conf), "--once")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "not a regular file (a FIFO)" in r.stderr


def test_a_fifo_key_file_is_refused(tmp_path: Path) -> None:
    uri = three_versions(tmp_path)
    key = tmp_path / "k.pub"
    os.mkfifo(key)
    r = aurora("ls", uri, "--verify-key", str(key))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "not a regular file (a FIFO)" in r.stderr


def test_a_fifo_under_results_is_a_dropped_payload_not_a_stuck_admission(tmp_path: Path) -> None:
    """The trainer's payload fetchers read what actors wrote under ``results/``: a FIFO there (any
    name a result may reference) is one result dropped as ``payload_unavailable``, at once."""
    uri = three_versions(tmp_path)
    sha = "ab" * 32
    path = tmp_path / "run" / "results" / f"{sha}.bin"
    path.parent.mkdir()
    os.mkfifo(path)
    script = textwrap.dedent(
        f"""
        from aurora_store.bucket.objectstore import ObjectStore
        from aurora_store.coord.results import Ref, Result
        from aurora_store.rl.sampling import SamplingConfig
        from trainer.admission import Payloads

        store = ObjectStore({uri!r})
        res = Result("1-0", "job", 1, "actor", 0, "0" * 64, ref=Ref("home", "results/{sha}.bin", "{sha}", 100))
        p = Payloads(sampling=SamplingConfig(), vocab_size=16, stores={{"home": store}}, digests=lambda v: None)
        print(p.decode_all([res]))
        p.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(helpers.REPO)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=PROMPT_S)
    assert r.returncode == 0, r.stderr
    assert "[(None, 'payload_unavailable')]" in r.stdout
