"""Across providers, as real processes: a signed run relayed from S3 (a moto server) into a GCS region
(fake-gcs-server) while an actor there follows it from ``gs://``, then relayed back into S3; every copy
audits and materializes bit-exact, and its manifests are the home region's, byte for byte."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import aurora_store
from aurora_store.cli import main
from aurora_store.coord.coordinator import Coordinator, RegionAnnouncer
from aurora_store.format.keys import manifest_key
from aurora_store.format.signing import generate_keypair
from aurora_store.testing.gcs import GcsServer
from aurora_store.testing.moto import S3Server
from aurora_store.testing.processes import wait_for
from aurora_store.testing.redis_server import RedisServer
from tests.helpers import bits_equal, state_dict, step

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_a_signed_run_relayed_s3_to_gcs_and_back(
    tmp_path: Path,
    s3_server: S3Server,
    gcs_server: GcsServer,
    redis_server: RedisServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = f"exp-{uuid.uuid4().hex[:6]}"
    s3, gs = s3_server.options(), gcs_server.options()
    home = f"s3://{s3_server.new_bucket()}/runs/{run_id}"
    eu = f"gs://{gcs_server.new_bucket()}/runs/{run_id}"
    back = f"s3://{s3_server.new_bucket()}/runs/{run_id}"
    private, public = generate_keypair()
    pub = tmp_path / "trainer.pub"
    pub.write_bytes(public)
    coord = Coordinator(redis_server.url, run_id)
    trainer = aurora_store.open_run(home, storage_options=s3, signing_key=private, full_every=3, segment_bytes=512)
    trainer.announcer = RegionAnnouncer(coord, "home")
    hist: list[dict[str, Any]] = []
    sd = state_dict()

    def publish(n: int) -> None:
        nonlocal sd
        for _ in range(n):
            trainer.publish(sd)
            hist.append(sd)
            sd = step(sd, len(hist))

    publish(2)  # before the relay starts: it backfills these
    common = ["--redis", redis_server.url, "--run-id", run_id, "--verify-key", str(pub)]
    relay = ["relay", "--source", home, "--dest", eu, "--dest-region", "eu", "--source-options", json.dumps(s3)]
    follow = ["--store", eu, "--storage-options", json.dumps(gs), "--region", "eu", "--worker-id", "eu-0"]
    logs = {name: tmp_path / f"{name}.log" for name in ("relay", "actor")}
    argv = {
        "relay": ["-m", "aurora_store.cli", *relay, "--dest-options", json.dumps(gs), *common],
        "actor": ["-m", "actor.follow", *follow, *common],
    }
    procs = {}
    for name, args in argv.items():
        with logs[name].open("wb") as log:  # the child keeps its own descriptor
            procs[name] = subprocess.Popen([sys.executable, *args], cwd=REPO, stderr=log)
    try:

        def applied() -> Any:
            for name, p in procs.items():
                assert p.poll() is None, f"the {name} exited: {logs[name].read_text()[-3000:]}"
            return coord.workers.registrations().get("eu-0", {}).get("version")

        wait_for(lambda: applied() == 1, "the actor in the GCS region to hold version 1", 180)
        publish(4)  # the live relay copies them as they are announced; the actor follows
        wait_for(lambda: applied() == 5, "the actor in the GCS region to hold version 5", 180)
        latest = trainer.manifest(5)
        reg = coord.workers.registrations()["eu-0"]
        assert (reg["version_hash"], reg["digest"]) == (latest.version_hash, latest.weights_digest)
        rv = coord.regions.version("eu")
        assert rv is not None and (rv.version, rv.version_hash) == (5, latest.version_hash)
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
    for name, log in logs.items():
        assert "Traceback" not in log.read_text(), f"{name}: {log.read_text()[-3000:]}"

    # the commands in this process (their imports are paid for once): the relay back, then each audit
    back_args = ["--dest-region", "back", "--once", "--verify-key", str(pub), "--source-options", json.dumps(gs)]
    assert main(["relay", "--source", eu, "--dest", back, *back_args, "--dest-options", json.dumps(s3)]) == 0
    assert json.loads(capsys.readouterr().out)["copied_versions"] == list(range(6))

    home_run = aurora_store.open_run(home, storage_options=s3, verify_key=public)
    for uri, opts in ((eu, gs), (back, s3)):
        assert main(["audit", uri, "--json", "--storage-options", json.dumps(opts), "--verify-key", str(pub)]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["first_error"] is None and [v["version"] for v in doc["versions"]] == list(range(6))
        assert all(v["signed"] for v in doc["versions"])
        copy = aurora_store.open_run(uri, storage_options=opts, verify_key=public)
        assert copy.versions() == list(range(6))
        for v, weights in enumerate(hist):
            assert bits_equal(copy.materialize(v), weights), f"{uri} version {v}"
            raw = copy.store.get(manifest_key(v), max_bytes=1 << 20)
            assert raw == home_run.store.get(manifest_key(v), max_bytes=1 << 20), f"{uri} manifest {v}"
