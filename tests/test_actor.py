"""The actor updater: bootstrap, cheapest catch-up, staging while generating, transactional apply."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import aurora_store
from actor.live import TensorWeights
from actor.updater import Updater
from aurora_store.coord.coordinator import Coordinator, RegionAnnouncer
from aurora_store.errors import CorruptError
from aurora_store.format.weights import full_digest
from aurora_store.tensors import to_words
from aurora_store.testing.damage import overwrite
from aurora_store.testing.processes import wait_for
from aurora_store.testing.redis_server import RedisServer
from tests.helpers import bits_equal, state_dict, step

REPO = Path(__file__).resolve().parents[1]


def publish(run: aurora_store.Run, n: int, start: int = 0, lr: float = 3e-5) -> list[dict[str, torch.Tensor]]:
    hist = []
    sd = state_dict(scale=4) if start == 0 else step(state_dict(scale=4), 5000 + start)
    for i in range(start, start + n):
        run.publish(sd)
        hist.append(sd)
        sd = step(sd, i, lr=lr)
    return hist


def digest_of(weights: dict[str, torch.Tensor]) -> str:
    specs, words = to_words({k: v.detach().cpu() for k, v in weights.items()})
    return full_digest(specs, words).hex()


@pytest.fixture
def run(tmp_path: Path) -> aurora_store.Run:
    return aurora_store.open_run(f"file://{tmp_path}/region/run", full_every=50, segment_bytes=256)


@pytest.mark.parametrize("lookup", ["host", "torch"])
def test_bootstrap_stage_apply(run: aurora_store.Run, lookup: str) -> None:
    """Staged versions decode against the live weights with the staged ones laid over them: classed
    lookups on the host, or with torch ops where the tensors live (what a GPU actor does)."""
    hist = publish(run, 6, lr=3e-6)  # a few % of elements change per step, as in RL fine-tuning
    assert "classed" in {b.codec for v in (3, 4, 5) for s in run.manifest(v).segments for b in s.blocks}
    up = Updater(run, region="eu", live=TensorWeights(lookup_on_device=lookup == "torch"))
    applied = up.bootstrap(2)
    assert (applied.version, applied.version_hash, applied.weights_digest) == (
        2,
        run.manifest(2).version_hash,
        run.manifest(2).weights_digest,
    )
    assert bits_equal(up.weights, hist[2]) and up.live_digest() == applied.weights_digest
    staged = up.stage()
    assert staged is not None and staged.version == 5
    assert bits_equal(up.weights, hist[2]), "staging never touches the live weights"
    # staging holds the union of the changed elements (position + new word each), not a second model
    union = 0
    for name in hist[0]:
        words = [to_words({name: hist[v][name]})[1][name] for v in (2, 3, 4, 5)]
        union += int(((words[0] != words[1]) | (words[1] != words[2]) | (words[2] != words[3])).sum())
    assert staged.changed == union > 0
    assert staged.nbytes <= union * (8 + 8)
    applied = up.apply()
    assert applied is not None and applied.version == 5
    assert bits_equal(up.weights, hist[5]) and up.live_digest() == run.manifest(5).weights_digest
    assert up.apply() is None  # nothing staged


def test_catch_up_takes_the_cheapest_path(tmp_path: Path) -> None:
    run = aurora_store.open_run(f"file://{tmp_path}/r", full_every=4, segment_bytes=256)
    hist = publish(run, 8, lr=3e-3)  # big steps: a full copy is cheaper than a long chain
    up = Updater(run, region="eu")
    up.bootstrap(1)
    plan = up.route(7)
    chain = [run.manifest(v) for v in range(2, 8)]
    last_full = max(m.version for m in chain if m.kind == "full")
    assert [m.version for m in plan] == list(range(last_full, 8))
    assert sum(m.stats.bytes for m in plan) <= sum(m.stats.bytes for m in chain)
    up.stage(7)
    up.apply()
    assert bits_equal(up.weights, hist[7])
    up2 = Updater(run, region="eu")
    up2.bootstrap(last_full)
    assert [m.version for m in up2.route(7)] == list(range(last_full + 1, 8))  # only deltas after a full


def test_failed_staging_leaves_live_weights_alone(tmp_path: Path, redis_server: RedisServer) -> None:
    home = aurora_store.open_run(f"file://{tmp_path}/home/run", segment_bytes=256)
    hist = publish(home, 4)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "aurora_store.cli",
            "relay",
            "--source",
            home.uri,
            "--dest",
            f"file://{tmp_path}/eu/run",
            "--dest-region",
            "eu",
            "--once",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    region = aurora_store.open_run(f"file://{tmp_path}/eu/run")
    seg = region.manifest(3).segments[0]
    overwrite(region.store, seg.key, b"corrupt" + region.store.get(seg.key, max_bytes=1 << 20)[7:])
    coord = Coordinator(redis_server.url, "exp")
    up = Updater(region, region="eu", coord=coord, worker_id="a1")
    up.bootstrap(1)
    before = up.live_digest()
    with pytest.raises(CorruptError, match=seg.key):
        up.stage(3)
    assert up.applied is not None and up.applied.version == 1 and up.live_digest() == before
    assert up.apply() is None
    reports = list(coord.reports())
    assert reports and reports[0]["worker"] == "a1" and seg.key in reports[0]["object"]
    # with the home bucket as a fallback, the same actor re-fetches and goes on
    up.fallback = home
    up.stage(3)
    up.apply()
    assert bits_equal(up.weights, hist[3])


def test_readers_only_ever_see_whole_versions(run: aurora_store.Run) -> None:
    hist = publish(run, 12, lr=1e-4)
    whole = {run.manifest(v).weights_digest for v in range(12)}
    up = Updater(run, region="eu")
    up.bootstrap(0)
    seen: list[str] = []
    stop = threading.Event()

    def checker() -> None:
        while not stop.is_set():
            with up.lock.read():  # a generation batch
                seen.append(digest_of(up.weights))

    t = threading.Thread(target=checker)
    t.start()
    try:
        for v in range(1, 12):
            up.stage(v)
            up.apply()
    finally:
        stop.set()
        t.join()
    assert seen and set(seen) <= whole, "a reader saw a half-applied model"
    assert bits_equal(up.weights, hist[11])


@dataclass
class FollowedRegion:
    """A region bucket with an announcing publisher, and the command of an `actor.follow` process for it."""

    run: aurora_store.Run
    coord: Coordinator
    args: list[str]
    worker_id: str

    def applied(self) -> Any:
        return self.coord.workers.registrations().get(self.worker_id, {}).get("version")

    def start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(self.args, cwd=REPO, stderr=subprocess.PIPE, text=True)


def followed_region(tmp_path: Path, redis_url: str, worker_id: str, *extra: str) -> FollowedRegion:
    """Versions 0-1 published to a region, announced in Redis, ready for an actor to follow."""
    run_id = f"exp-{uuid.uuid4().hex[:6]}"
    uri = f"file://{tmp_path}/eu/{run_id}"
    coord = Coordinator(redis_url, run_id)
    run = aurora_store.open_run(uri, segment_bytes=256)
    run.announcer = RegionAnnouncer(coord, "eu")
    publish(run, 2)
    args = [
        sys.executable,
        "-m",
        "actor.follow",
        "--store",
        uri,
        "--region",
        "eu",
        "--redis",
        redis_url,
        "--run-id",
        run_id,
        "--worker-id",
        worker_id,
        *extra,
    ]
    return FollowedRegion(run, coord, args, worker_id)


@pytest.mark.slow
def test_actor_process_killed_mid_run_resumes(tmp_path: Path, redis_server: RedisServer) -> None:
    region = followed_region(tmp_path, redis_server.url, "actor-1", "--connections", "4")
    run, coord = region.run, region.coord
    proc = region.start()
    try:
        wait_for(lambda: region.applied() == 1, "the actor to hold version 1")
        hist = publish(run, 3, start=2)
        proc.kill()  # mid-run: it may be anywhere in fetching, staging or applying
        proc.wait(10)
        hist += publish(run, 2, start=5)
        proc = region.start()
        wait_for(lambda: region.applied() == 6, "the restarted actor to reach version 6")
        info = coord.workers.registrations()["actor-1"]
        m = run.manifest(6)
        assert (info["version_hash"], info["digest"]) == (m.version_hash, m.weights_digest)
    finally:
        proc.kill()
        proc.wait(10)
    assert hist


@pytest.mark.slow
def test_actor_follows_through_a_redis_restart(tmp_path: Path, redis_server: RedisServer) -> None:
    region = followed_region(tmp_path, redis_server.url, "actor-2", "--verify-live")  # each version read back
    run, coord = region.run, region.coord
    proc = region.start()
    try:
        wait_for(lambda: region.applied() == 1, "the actor to hold version 1")
        redis_server.restart()  # registrations, versions and events are gone
        publish(run, 2, start=2)  # the region moves on; only the bucket knows everything
        wait_for(lambda: region.applied() == 3, "the actor to re-register and reach version 3 after the restart")
        assert coord.workers.registrations()["actor-2"]["version_hash"] == run.manifest(3).version_hash
        assert proc.poll() is None
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err, err
