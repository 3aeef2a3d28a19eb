"""Relays as real `aurora relay` processes: backfill, cut-through, crash safety, two tiers, Redis loss."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import aurora_store.coord.coordinator
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.coord.coordinator import Coordinator, RegionAnnouncer
from aurora_store.errors import ChainError, MissingError
from aurora_store.format.keys import manifest_key
from aurora_store.testing.damage import overwrite
from aurora_store.testing.processes import wait_for
from aurora_store.testing.redis_server import RedisServer
from relay.worker import Relay
from tests.helpers import aurora, bits_equal, state_dict, step

REPO = Path(__file__).resolve().parents[1]


def publish(uri: str, n: int, *, coord: Coordinator | None = None, start: int = 0, **kw: Any) -> list[dict[str, Any]]:
    run = aurora_store.open_run(uri, full_every=3, segment_bytes=512, **kw)
    if coord is not None:
        run.announcer = RegionAnnouncer(coord, "home")
    hist = []
    sd = step(state_dict(), 1000 + start) if start else state_dict()
    for i in range(start, start + n):
        run.publish(sd)
        hist.append(sd)
        sd = step(sd, i)
    return hist


def objects_of(uri: str, version: int) -> list[str]:
    run = aurora_store.open_run(uri)
    m = run.manifest(version)
    return [o.key for o in m.objects]


def test_once_backfills_and_is_idempotent(tmp_path: Path) -> None:
    home, eu = f"file://{tmp_path}/home/run", f"file://{tmp_path}/eu/run"
    hist = publish(home, 5)
    r = aurora("relay", "--source", home, "--dest", eu, "--dest-region", "eu", "--once")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["copied_versions"] == [0, 1, 2, 3, 4] and out["objects_skipped"] == 0
    dest = aurora_store.open_run(eu)
    assert dest.versions() == [0, 1, 2, 3, 4]
    for v, sd in enumerate(hist):
        assert bits_equal(dest.materialize(v), sd)
        assert dest.store.get(manifest_key(v), max_bytes=1 << 20) == aurora_store.open_run(home).store.get(
            manifest_key(v), max_bytes=1 << 20
        )
    again = json.loads(aurora("relay", "--source", home, "--dest", eu, "--dest-region", "eu", "--once").stdout)
    assert again == {"copied_versions": [], "objects_copied": 0, "objects_skipped": 0, "bytes": 0}


def test_a_relay_commits_what_follows_its_own_commit_without_reading_the_destination(tmp_path: Path) -> None:
    """A commit event is one version (or a few) after the one the relay committed last: it copies them
    without listing the destination or reading back the parent manifest it wrote itself (those round
    trips were a quarter of a region's commit latency in ``aurora bench transfer --quick``), and a
    version that does not link to that parent is still refused."""
    home, eu = f"file://{tmp_path}/home/run", f"file://{tmp_path}/eu/run"
    publish(home, 4)
    relay = Relay(ObjectStore(home), ObjectStore(eu), None, source_region="home", dest_region="eu")
    relay.copy_version(0)
    relay.copy_version(1)  # reads the destination's identity (version 0's manifest) once
    read = relay.metrics.m.registry.get_sample_value
    labels = {"role": "relay", "region": "eu", "direction": "download", "bucket": "dest"}
    before = read("aurora_bucket_bytes_total", labels) or 0.0
    relay._handle("commit", 3, {})
    relay.close()
    assert aurora_store.open_run(eu).versions() == [0, 1, 2, 3]
    assert (read("aurora_bucket_bytes_total", labels) or 0.0) == before, "read from the destination"

    other = f"file://{tmp_path}/other/run"  # another history: its version 4's parent is not eu's version 3
    publish(other, 5, start=7)
    stranger = Relay(ObjectStore(other), ObjectStore(eu), None, source_region="home", dest_region="eu")
    stranger._advance(aurora_store.open_run(eu).manifest(3))
    with pytest.raises(ChainError):
        stranger.copy_version(4)
    stranger.close()
    assert aurora_store.open_run(eu).versions() == [0, 1, 2, 3]


def test_restart_after_a_crash_mid_copy_reuses_verified_objects(tmp_path: Path) -> None:
    """A relay died after copying some segments of a version: no manifest there, and the
    restarted relay copies only what is missing."""
    home, eu = f"file://{tmp_path}/home/run", f"file://{tmp_path}/eu/run"
    hist = publish(home, 3)
    src, dst = ObjectStore(home), ObjectStore(eu)
    relay = Relay(src, dst, None, source_region="home", dest_region="eu")
    relay.copy_version(0)
    relay.copy_version(1)
    m2 = aurora_store.open_run(home).manifest(2)
    assert len(m2.segments) >= 2
    for seg in m2.segments[: len(m2.segments) // 2]:
        relay.copy_object(seg)  # ... and then the process died
    half = len(m2.segments) // 2
    assert aurora_store.open_run(eu).versions() == [0, 1], "no manifest before all its segments"
    r = aurora("relay", "--source", home, "--dest", eu, "--dest-region", "eu", "--once")
    out = json.loads(r.stdout)
    assert out["copied_versions"] == [2]
    assert out["objects_skipped"] == half and out["objects_copied"] == len(m2.objects) - half
    assert bits_equal(aurora_store.open_run(eu).materialize(2), hist[2])


def test_announced_segments_copy_in_parallel_and_once(tmp_path: Path) -> None:
    """Announced segments go on the relay's pool; the commit waits for copies in flight instead of
    starting them again, and a failed announced copy is redone by the commit."""
    home, eu = f"file://{tmp_path}/home/run", f"file://{tmp_path}/eu/run"
    hist = publish(home, 3)
    relay = Relay(ObjectStore(home), ObjectStore(eu), None, source_region="home", dest_region="eu")
    relay.copy_version(0)
    relay.copy_version(1)
    m2 = aurora_store.open_run(home).manifest(2)
    futures = [relay.copy_announced(seg) for seg in m2.segments]
    assert all(f is not None for f in futures)
    relay.copy_version(2)
    assert relay.stats.copied == len(objects_of(home, 0)) + len(objects_of(home, 1)) + len(m2.objects)
    assert relay.stats.skipped == 0, "nothing was copied twice or found half-done"
    assert bits_equal(aurora_store.open_run(eu).materialize(2), hist[2])
    assert all(relay.copy_announced(seg) is None for seg in m2.segments), "verified: never started again"
    seg = m2.segments[0]  # a segment of a version not committed yet, which is not at the source
    missing = type(seg)(seg.key.replace("versions/0000000002/", "versions/0000000003/"), 10, "0" * 64)
    failed = relay.copy_announced(missing)
    assert failed is not None and isinstance(failed.exception(), MissingError)
    with pytest.raises(MissingError):
        relay.copy_object(missing)  # the commit path tries again and reports it
    relay.close()


def _remembered(relay: Relay) -> dict[int | None, int]:
    """How many verified objects the relay remembers, by version."""
    return {v: len(objects) for v, objects in relay._verified.items()}


def test_a_relay_remembers_only_the_versions_it_may_still_need(tmp_path: Path) -> None:
    """Hole (issue 22): a relay's set of verified objects gained every object it ever copied. Now a
    version's objects are forgotten once it is committed at the destination; gc on both sides and
    announcements of committed versions change nothing, and every version still arrives bit-exact."""
    from aurora_store.bucket import gc

    home, eu = f"file://{tmp_path}/home/run", f"file://{tmp_path}/eu/run"
    src_run = aurora_store.open_run(home, full_every=3, segment_bytes=512)
    relay = Relay(ObjectStore(home), ObjectStore(eu), None, source_region="home", dest_region="eu")
    sd, hist, most = state_dict(), [], 0
    for v in range(24):
        src_run.publish(sd)
        hist.append(sd)
        m = src_run.manifest(v)
        for seg in m.objects:  # cut-through: every object announced before the commit
            relay.copy_announced(seg)
        most = max(most, sum(_remembered(relay).values()))
        assert relay.copy_version(v)
        assert all(k is None or k > v for k in _remembered(relay)), f"version {v}'s objects forgotten at its commit"
        assert all(relay.copy_announced(seg) is None for seg in m.objects), "a committed version is not copied again"
        if v % 8 == 7:  # gc on both sides keeps the last two versions
            for uri in (home, eu):
                run = aurora_store.open_run(uri)
                gc.apply(run, gc.plan(run, gc.RetentionPolicy(keep_last=2, keep_fulls=1)))
            relay.backfill()  # copies the retention records; nothing retired comes back
        sd = step(sd, v)
    relay.close()
    largest = max(len(src_run.manifest(v).objects) for v in src_run.versions())
    assert sum(_remembered(relay).values()) == 0 and most <= largest, "bounded by one version in flight"
    dest = aurora_store.open_run(eu)
    assert dest.versions() == src_run.versions() and dest.versions()[-1] == 23
    for v in dest.versions():
        assert bits_equal(dest.materialize(v), hist[v]), f"version {v} arrives bit-exact after pruning"


def test_corrupt_object_at_the_destination_is_refused_not_overwritten(tmp_path: Path) -> None:
    home, eu = f"file://{tmp_path}/home/run", f"file://{tmp_path}/eu/run"
    publish(home, 2)
    key = objects_of(home, 1)[0]
    overwrite(ObjectStore(eu), key, b"garbage")
    r = aurora("relay", "--source", home, "--dest", eu, "--dest-region", "eu", "--once")
    assert r.returncode == 1 and key in r.stderr and "Traceback" not in r.stderr
    assert aurora_store.open_run(eu).versions() == [0]
    assert ObjectStore(eu).get(key, max_bytes=100) == b"garbage"


class RelayProcess:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aurora_store.cli", "relay", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        return err

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def relays() -> Iterator[Callable[..., RelayProcess]]:
    started: list[RelayProcess] = []

    def start(*args: str) -> RelayProcess:
        started.append(RelayProcess(*args))
        return started[-1]

    yield start
    for r in started:
        if r.proc.poll() is None:
            r.kill()


class ManifestWatcher(threading.Thread):
    """Checks, while relays run, that every manifest at a destination has all its objects there."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        self.store = ObjectStore(uri)
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.checks = 0

    def run(self) -> None:
        while not self.stop.is_set():
            keys = set(self.store.list_keys("versions"))
            for k in [k for k in keys if k.endswith("manifest.json")]:
                doc = json.loads(self.store.get(k, max_bytes=1 << 24))
                objs = [s["key"] for s in doc["segments"]] + ([doc["index"]["key"]] if doc["index"] else [])
                missing = [o for o in objs if o not in keys and not self.store.exists(o)]
                if missing:
                    self.violations.append(f"{k} committed before {missing}")
            self.checks += 1
            time.sleep(0.01)


def test_live_relays_cut_through_and_two_tiers(
    tmp_path: Path, redis_server: RedisServer, relays: Callable[..., RelayProcess]
) -> None:
    run_id = f"exp-{uuid.uuid4().hex[:6]}"
    home, eu, ap = (f"file://{tmp_path}/{r}/{run_id}" for r in ("home", "eu", "ap"))
    coord = Coordinator(redis_server.url, run_id)
    hist = publish(home, 1, coord=coord)  # version 0 exists before the relays start: they backfill it
    watcher = ManifestWatcher(eu)
    watcher.start()
    relays("--source", home, "--dest", eu, "--redis", redis_server.url, "--dest-region", "eu")
    relays("--source", eu, "--dest", ap, "--redis", redis_server.url, "--source-region", "eu", "--dest-region", "ap")
    wait_for(
        lambda: (coord.regions.version("ap") or aurora_store.coord.regions.RegionVersion(-1, "", "")).version == 0,
        "version 0 in ap",
    )
    hist += publish(home, 4, coord=coord, start=1)
    home_run = aurora_store.open_run(home)
    latest = home_run.manifest(4)
    for region, uri in (("eu", eu), ("ap", ap)):
        wait_for(
            lambda r=region: (
                (coord.regions.version(r) or aurora_store.coord.regions.RegionVersion(-1, "", "")).version == 4
            ),
            f"version 4 in {region}",
        )
        rv = coord.regions.version(region)
        assert rv is not None and rv.version_hash == latest.version_hash
        dest = aurora_store.open_run(uri)
        assert dest.versions() == [0, 1, 2, 3, 4]
        for v in range(5):
            assert bits_equal(dest.materialize(v), hist[v])
    watcher.stop.set()
    watcher.join()
    assert watcher.checks > 0 and not watcher.violations
    workers = coord.workers.registrations()
    assert sorted(w["region"] for w in workers.values() if w["role"] == "relay") == ["ap", "eu"]


def test_relay_survives_redis_losing_its_state(
    tmp_path: Path, redis_server: RedisServer, relays: Callable[..., RelayProcess]
) -> None:
    run_id = f"exp-{uuid.uuid4().hex[:6]}"
    home, eu = f"file://{tmp_path}/home/{run_id}", f"file://{tmp_path}/eu/{run_id}"
    coord = Coordinator(redis_server.url, run_id)
    hist = publish(home, 2, coord=coord)
    relay = relays("--source", home, "--dest", eu, "--redis", redis_server.url, "--dest-region", "eu")
    wait_for(lambda: aurora_store.open_run(eu).versions() == [0, 1], "versions 0-1 in eu")
    redis_server.restart()  # every key, stream and registration is gone
    assert coord.regions.version("eu") is None
    hist += publish(home, 2, coord=coord, start=2)  # the trainer goes on; its events land in an empty Redis
    wait_for(
        lambda: aurora_store.open_run(eu).versions() == [0, 1, 2, 3], "versions 2-3 in eu after the restart", timeout=90
    )
    wait_for(
        lambda: (coord.regions.version("eu") or aurora_store.coord.regions.RegionVersion(-1, "", "")).version == 3,
        "eu's version rebuilt in Redis",
        timeout=90,
    )
    assert relay.proc.poll() is None, relay.stop()
    assert bits_equal(aurora_store.open_run(eu).materialize(3), hist[3])


def test_relay_never_imports_torch() -> None:
    code = "import sys, relay.worker, relay.cli, aurora_store.coord.coordinator; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=dict(os.environ))
    assert out.stdout.strip() == "False", out.stderr


def test_publishing_does_not_depend_on_redis(tmp_path: Path) -> None:
    """With Redis down the trainer still commits; relays find the versions in the bucket."""
    from aurora_store.testing.processes import free_port

    home, eu = f"file://{tmp_path}/home/run", f"file://{tmp_path}/eu/run"
    dead = Coordinator(f"redis://127.0.0.1:{free_port()}/0", "exp")
    hist = publish(home, 3, coord=dead)
    assert aurora_store.open_run(home).versions() == [0, 1, 2]
    r = aurora("relay", "--source", home, "--dest", eu, "--dest-region", "eu", "--once")
    assert json.loads(r.stdout)["copied_versions"] == [0, 1, 2]
    assert bits_equal(aurora_store.open_run(eu).materialize(2), hist[2])


@pytest.mark.slow
def test_relay_process_killed_mid_copy(tmp_path: Path, s3_server: Any) -> None:
    """A real relay process copying over a slow link is killed with SIGKILL mid-version: the
    destination has some segments and no manifest; the restarted relay copies only the rest."""
    from bench.emulation.wan import Link, WanProxy

    bucket = s3_server.new_bucket()
    home = f"s3://{bucket}/run"
    hist = publish(home, 1, storage_options=s3_server.options())
    run = aurora_store.open_run(home, storage_options=s3_server.options(), segment_bytes=256)
    big = step(hist[0], 77, lr=3e-4)  # many changed elements: a delta of many small segments
    run.publish(big)
    n_objects = len(run.manifest(1).objects)
    assert n_objects >= 10
    eu = f"file://{tmp_path}/eu/run"
    host, port = s3_server.endpoint.removeprefix("http://").split(":")
    with WanProxy(host, int(port), Link(rtt_s=0.05, bandwidth_bps=2e5)) as slow:  # 25 kB/s
        opts = {**s3_server.options(), "client_kwargs": {"endpoint_url": slow.endpoint, "region_name": "us-east-1"}}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aurora_store.cli",
                "relay",
                "--source",
                home,
                "--dest",
                eu,
                "--dest-region",
                "eu",
                "--once",
                "--concurrency",
                "2",
                "--source-options",
                json.dumps(opts),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        dest = ObjectStore(eu)

        def copied() -> list[str]:
            return [k for k in dest.list_keys("versions/0000000001") if not k.endswith("manifest.json")]

        try:
            wait_for(lambda: len(copied()) >= 2 or proc.poll() is not None, "the relay to copy a few segments")
        finally:
            proc.kill()
            proc.wait(10)
    before = copied()
    assert 2 <= len(before) < n_objects, "killed mid-version"
    assert aurora_store.open_run(eu).versions() == [0], "no manifest before all its objects"
    r = aurora(
        "relay",
        "--source",
        home,
        "--dest",
        eu,
        "--dest-region",
        "eu",
        "--once",
        "--source-options",
        json.dumps(s3_server.options()),
    )
    out = json.loads(r.stdout)
    assert out["copied_versions"] == [1]
    assert out["objects_skipped"] >= len(before) and out["objects_copied"] == n_objects - out["objects_skipped"]
    assert bits_equal(aurora_store.open_run(eu).materialize(1), big)


def test_relay_survives_hostile_events_and_a_flushall(
    tmp_path: Path, redis_server: RedisServer, relays: Callable[..., RelayProcess]
) -> None:
    """Holes 4, 5, 7: malformed events are counted and skipped, an announced 'segment' that is a
    manifest is never copied, and a FLUSHALL (no disconnect) is noticed at once, not at the next
    periodic rescan: the relay rebuilds the region's version and registers again."""
    run_id = f"exp-{uuid.uuid4().hex[:6]}"
    home, eu = f"file://{tmp_path}/home/{run_id}", f"file://{tmp_path}/eu/{run_id}"
    coord = Coordinator(redis_server.url, run_id)
    publish(home, 1, coord=coord)
    relay = relays(
        "--source", home, "--dest", eu, "--redis", redis_server.url, "--dest-region", "eu", "--rescan-s", "600"
    )
    wait_for(lambda: aurora_store.open_run(eu).versions() == [0], "version 0 in eu")
    stream = coord.key("events", "home")
    seg = "versions/0000000001/00000-" + "ab" * 16 + ".seg"
    for fields in (
        {"type": "segment", "version": "1", "size": "10", "sha256": "ab" * 32},  # no key
        {"type": "segment", "version": "xyz", "key": seg, "size": "10", "sha256": "ab" * 32},
        {"type": "segment", "version": "1", "key": seg, "size": "abc", "sha256": "ab" * 32},
        {"type": "segment", "version": "1", "key": manifest_key(1), "size": "2", "sha256": "ab" * 32},
        {"type": "commit", "version": "-3", "version_hash": "0" * 64},
        {"type": "??"},
    ):
        coord.r.xadd(stream, fields)
    hist = publish(home, 2, coord=coord, start=1)
    wait_for(lambda: aurora_store.open_run(eu).versions() == [0, 1, 2], "versions 1-2 in eu")
    assert bits_equal(aurora_store.open_run(eu).materialize(2), hist[1])
    coord.r.flushall()
    wait_for(
        lambda: (coord.regions.version("eu") or aurora_store.coord.regions.RegionVersion(-1, "", "")).version == 2,
        "eu's version rebuilt after FLUSHALL, without waiting for the 600 s rescan",
        timeout=30,
    )
    wait_for(
        lambda: any(w["role"] == "relay" for w in coord.workers.registrations().values()), "the relay registered again"
    )
    assert relay.proc.poll() is None, relay.stop()
    err = relay.stop()
    assert "Traceback" not in err and "skipped" in err and "lost its state" in err, err[-2000:]


def test_a_relay_says_it_serves_only_once_its_startup_backfill_is_done(
    tmp_path: Path, redis_server: RedisServer, relays: Callable[..., RelayProcess]
) -> None:
    """Its registration appears at once (an operator sees it alive while it catches up) and says
    ``serving`` only when every version the source held at its start is committed at the destination:
    what a deployment (or a benchmark timing cut-through copies) waits for."""
    run_id = f"exp-{uuid.uuid4().hex[:6]}"
    home, eu = f"file://{tmp_path}/home/{run_id}", f"file://{tmp_path}/eu/{run_id}"
    coord = Coordinator(redis_server.url, run_id)
    publish(home, 6, coord=coord)
    seen: list[tuple[bool, list[int]]] = []

    def relay_says() -> bool:
        regs = [w for w in coord.workers.registrations().values() if w["role"] == "relay"]
        if regs:
            seen.append((regs[0].get("serving") is True, aurora_store.open_run(eu).versions()))
        return bool(regs) and regs[0].get("serving") is True

    relays("--source", home, "--dest", eu, "--redis", redis_server.url, "--dest-region", "eu")
    wait_for(relay_says, "the relay serving")
    assert all(versions == list(range(6)) for serving, versions in seen if serving)
    assert seen[-1] == (True, list(range(6)))


def test_a_junk_region_entry_or_a_redis_error_mid_event_does_not_kill_a_relay(
    tmp_path: Path, redis_server: RedisServer, relays: Callable[..., RelayProcess]
) -> None:
    """Issue 39 (a chaos sweep's relay died of `ConnectionError` while handling an event): a Redis error in
    the middle of an event is waited out like one while reading events (the buckets are the truth: the
    relay rescans). Here it is one anyone who can write Redis causes: eu's version entry overwritten with
    a string, so the commit script met WRONGTYPE on every commit; the script now replaces such junk."""
    run_id = f"exp-{uuid.uuid4().hex[:6]}"
    home, eu = f"file://{tmp_path}/home/{run_id}", f"file://{tmp_path}/eu/{run_id}"
    coord = Coordinator(redis_server.url, run_id)
    publish(home, 1, coord=coord)
    relay = relays(
        "--source", home, "--dest", eu, "--redis", redis_server.url, "--dest-region", "eu", "--rescan-s", "600"
    )
    wait_for(lambda: aurora_store.open_run(eu).versions() == [0], "version 0 in eu")
    coord.r.set(coord.key("region", "eu"), "junk")
    coord.r.set(coord.key("commits", "eu"), "junk")
    hist = publish(home, 2, coord=coord, start=1)
    wait_for(lambda: aurora_store.open_run(eu).versions() == [0, 1, 2], "versions 1-2 in eu")
    wait_for(
        lambda: (coord.regions.version("eu") or aurora_store.coord.regions.RegionVersion(-1, "", "")).version == 2,
        "eu's version entry rebuilt",
    )
    assert bits_equal(aurora_store.open_run(eu).materialize(2), hist[1])
    assert relay.proc.poll() is None, relay.stop()
    err = relay.stop()
    assert "Traceback" not in err and "aurora: error" not in err, err[-2000:]
