"""Publishers in separate processes race for one version: exactly one commits, nothing is corrupted."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aurora_store
from aurora_store.testing.processes import wait_for
from tests.conftest import Root
from tests.helpers import bits_equal, state_dict, step

RACER = textwrap.dedent(
    """
    import json, os, sys, time
    import aurora_store
    from tests.helpers import state_dict, step
    uri, opts, seed, go = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    run = aurora_store.open_run(uri, storage_options=opts)
    run.resume()  # load version 0, as a live trainer holds it
    open(f"{go}.ready-{seed}", "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(go):  # start together
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.001)
    try:
        info = run.publish(step(state_dict(), seed), version=1)
        print(json.dumps({"won": info.version_hash}))
    except aurora_store.ConflictError as exc:
        print(json.dumps({"lost": str(exc)}))
    """
)


@pytest.mark.slow
def test_processes_racing_for_one_version(root: Root, tmp_path: Path) -> None:
    if root.backend == "memory":
        pytest.skip("memory:// lives in one process; test_store races threads on it")
    aurora_store.open_run(root.uri, storage_options=root.storage_options).publish(state_dict())
    go = tmp_path / "go"
    repo = Path(__file__).resolve().parents[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, root.uri, json.dumps(root.storage_options), str(100 + i), str(go)],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]

    def ready() -> bool:  # every racer holds version 0
        assert all(p.poll() is None for p in procs), "a racer exited before the start"
        return len(list(tmp_path.glob("go.ready-*"))) == len(procs)

    wait_for(ready, "the racers to get ready", 120, 0.01)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    winners = [i for i, r in enumerate(results) if "won" in r]
    assert len(winners) == 1, results
    assert all("committed by another publisher" in r["lost"] for r in results if "lost" in r), results
    fresh = aurora_store.open_run(root.uri, storage_options=root.storage_options)
    assert fresh.versions() == [0, 1]
    assert fresh.manifest(1).version_hash == results[winners[0]]["won"]
    assert bits_equal(fresh.materialize(1), step(state_dict(), 100 + winners[0]))
