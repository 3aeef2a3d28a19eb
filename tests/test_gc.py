"""Retention (``aurora gc``): what is kept and why, that kept versions still replay bit-exact and
audit, that a dry run deletes nothing, that an interrupted gc is finished by the next, hostile
retention records, Redis as the source of what actors hold, old offloaded result payloads (and
hostile names under ``results/``, left alone), and gc while a trainer publishes and a relay copies
(a real relay process, gc as real processes)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

import aurora_store
from aurora_store.bucket import gc
from aurora_store.bucket.audit import audit
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.results import put_payload
from aurora_store.bucket.retention import records
from aurora_store.bucket.state import StateName
from aurora_store.cli import main
from aurora_store.cli_gc import RESULTS_MAX_AGE_S, add_results_arguments
from aurora_store.coord.coordinator import Coordinator, RegionAnnouncer
from aurora_store.errors import CorruptError
from aurora_store.format import retention, signing, trainer_state
from aurora_store.format.keys import manifest_key
from aurora_store.format.retention import Retired
from aurora_store.testing import damage
from aurora_store.testing.processes import wait_for
from tests.conftest import Root
from tests.helpers import bits_equal

REPO = Path(__file__).resolve().parents[1]


def _publish(run: Any, n: int, seed: int = 0) -> dict[int, dict[str, torch.Tensor]]:
    """``n`` versions of two small tensors, about 2% changed a step; the weights of each, by version."""
    g = torch.Generator().manual_seed(seed)
    w = {
        "a": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "b": torch.randn(300, generator=g).to(torch.bfloat16),
    }
    out = {}
    for _ in range(n):
        info = run.publish(w)
        out[info.version] = {k: v.clone() for k, v in w.items()}
        for t in w.values():
            flat = t.view(-1)
            idx = torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() // 50)]
            flat[idx] += 1
    return out


def _kinds(run: Any) -> dict[int, str]:
    return {v: run.manifest(v).kind for v in run.versions()}


ORIGIN = "0" * 64


def _record(run: Any, retired: Retired, *, latest: int | None = None) -> tuple[str, bytes]:
    """An unsigned record of ``run`` (as gc writes one in an unsigned run), naming ``latest``
    (default: the run's latest version) as the latest committed."""
    latest = run.versions()[-1] if latest is None else latest
    return retention.encode(retired, 1_700_000_000_000, latest=latest, origin=run.reader.lineage().origin)


def test_gc_keeps_what_is_asked_and_every_kept_chain(tmp_path: Path) -> None:
    run = aurora_store.open_run((tmp_path / "r").as_uri(), full_every=4)
    weights = _publish(run, 14)  # fulls at 0, 4, 8, 12
    assert [v for v, k in _kinds(run).items() if k == "full"] == [0, 4, 8, 12]
    for s in (5, 9, 13):  # three saved trainer states (gc reads their documents, not their tensors)
        m = run.manifest(s)
        name = StateName.of(s, m.version_hash)
        run.state.put(name, "tensors.safetensors", b"x" * 10)
        tensors = trainer_state.TensorFile.of("tensors.safetensors", b"x" * 10)
        doc = trainer_state.new(s, m.version_hash, run.reader.lineage().origin, tensors, {"opt_steps": {}}, None)
        run.state.commit(name, doc.to_bytes())
    p = gc.plan(run, gc.RetentionPolicy(keep_last=2, keep_fulls=1, keep_states=2, holds={"actor a in eu": 10}))
    # 0: lineage; 12, 13: last 2; 12: last full; 10-13: at/after what the actor holds;
    # 9, 13: kept states; chains: 10 and 11 and 9 need 8
    assert sorted(p.kept) == [0, 8, 9, 10, 11, 12, 13]
    assert p.retire == [1, 2, 3, 4, 5, 6, 7]
    assert "which actor a in eu holds" in p.kept[10] and "in the chain of version" in p.kept[8]
    assert sorted(n.version for n in p.states_deleted) == [5] and p.states_kept == [9, 13]
    before = sorted(run.store.list_keys(""))
    assert gc.plan(run, gc.RetentionPolicy(keep_last=2, keep_fulls=1)).retire  # planning twice deletes nothing
    assert sorted(run.store.list_keys("")) == before

    counts = gc.apply(run, p)
    assert counts["versions"] == 7 and counts["states"] == 1
    fresh = aurora_store.open_run((tmp_path / "r").as_uri())
    assert fresh.versions() == [0, 8, 9, 10, 11, 12, 13]
    assert not any(k.startswith("versions/0000000003/") for k in fresh.store.list_keys("versions"))
    assert fresh.state.versions() == [9, 13]
    for v in fresh.versions():
        assert bits_equal(fresh.materialize(v), weights[v]), f"version {v} replays bit-exact after gc"
    result = audit(fresh)
    assert result.ok, result.first_error
    assert result.retired == 7 and all(r.status == "ok" for r in result.versions)
    found = records(fresh.reader)
    assert len(found.keys) == 1 and not found.bad and list(found.retired.ranges) == [(1, 7)]

    later = _publish(fresh, 3, seed=1)  # the run goes on; a second gc merges the records
    weights.update(later)
    p2 = gc.plan(fresh, gc.RetentionPolicy(keep_last=2, keep_fulls=1, keep_states=1))
    gc.apply(fresh, p2)
    found = records(fresh.reader)
    assert len(found.keys) == 1, "one record holds every retired version; the older one is gone"
    assert set(range(1, 8)) <= {v for v in range(20) if v in found.retired}
    assert audit(aurora_store.open_run((tmp_path / "r").as_uri())).ok


def test_a_gap_gc_did_not_make_still_fails_the_audit(tmp_path: Path) -> None:
    run = aurora_store.open_run((tmp_path / "r").as_uri(), full_every=4)
    _publish(run, 10)
    gc.apply(run, gc.plan(run, gc.RetentionPolicy(keep_last=2, keep_fulls=1)))
    assert run.versions() == [0, 8, 9]
    damage.delete(run.store, manifest_key(8))  # lost, not retired: 9 is a delta on it
    result = audit(aurora_store.open_run((tmp_path / "r").as_uri()))
    assert not result.ok and result.first_error is not None and result.first_error.version == 9


def test_an_interrupted_gc_is_finished_by_the_next(tmp_path: Path) -> None:
    run = aurora_store.open_run((tmp_path / "r").as_uri(), full_every=4)
    weights = _publish(run, 9)
    key, data = _record(run, Retired() | [1, 2, 3])
    run.store.put_if_absent(key, data)  # a gc wrote its intent, deleted version 2's manifest, then died
    damage.delete(run.store, manifest_key(2))
    left = [k for k in run.store.list_keys("versions/0000000002")]
    assert left, "version 2's objects are still there"
    p = gc.plan(run, gc.RetentionPolicy(keep_last=1, keep_fulls=1))
    assert 2 in p.leftovers and 1 in p.retire and 3 in p.retire
    gc.apply(run, p)
    assert run.store.list_keys("versions/0000000002") == []
    fresh = aurora_store.open_run((tmp_path / "r").as_uri())
    assert audit(fresh).ok
    assert bits_equal(fresh.materialize(8), weights[8])


def test_a_record_never_deletes_a_version_being_published(tmp_path: Path) -> None:
    run = aurora_store.open_run((tmp_path / "r").as_uri(), full_every=4)
    _publish(run, 5)
    in_flight = "versions/0000000005/00000-" + "ab" * 16 + ".seg"  # the next version's segment, uploaded ahead
    run.store.put_if_absent(in_flight, b"segment bytes")
    key, data = _record(run, Retired() | [5], latest=6)  # a forged (or confused) record
    run.store.put_if_absent(key, data)
    p = gc.plan(run, gc.RetentionPolicy(keep_last=1, keep_fulls=1))
    assert 5 not in p.leftovers and p.bad_records, "a record retiring the latest version or above is ignored"
    gc.apply(run, p)
    assert run.store.exists(in_flight)


def test_gc_refuses_to_delete_around_an_unreadable_manifest(tmp_path: Path) -> None:
    run = aurora_store.open_run((tmp_path / "r").as_uri(), full_every=4)
    _publish(run, 6)
    damage.overwrite(run.store, manifest_key(5), b"{not json")
    fresh = aurora_store.open_run((tmp_path / "r").as_uri())
    p = gc.plan(fresh, gc.RetentionPolicy(keep_last=1, keep_fulls=1))
    assert p.unreadable
    with pytest.raises(Exception, match="could not be read"):
        gc.apply(fresh, p)
    assert fresh.versions() == [0, 1, 2, 3, 4, 5]


HOSTILE_RECORDS = [
    b"",
    b"{",
    b'{"format": "aurora-retention/1", "created_ms": 1, "retired": [[0, 5]]}',
    b'{"format": "aurora-retention/1", "created_ms": 1, "retired": [[5, 3]]}',
    b'{"format": "aurora-retention/1", "created_ms": 1, "retired": [[1, 3], [2, 4]]}',
    b'{"format": "aurora-retention/1", "created_ms": 1, "retired": [[1, 99999999999]]}',
    b'{"format": "aurora-retention/1", "created_ms": 1, "retired": [[true, 2]]}',
    b'{"format": "aurora-retention/2", "created_ms": 1, "retired": []}',
    b'{"format": "aurora-retention/1", "created_ms": -1, "retired": []}',
    b'{"format": "aurora-retention/1", "created_ms": 1, "retired": {"1": 2}}',
    b"[" * 100_000,
]


@pytest.mark.parametrize("data", HOSTILE_RECORDS)
def test_hostile_retention_records_retire_nothing_and_fail_the_audit(tmp_path: Path, data: bytes) -> None:
    run = aurora_store.open_run((tmp_path / "r").as_uri(), full_every=4)
    _publish(run, 3)
    key = f"retention/0000000000001-{hashlib.sha256(data).hexdigest()[:32]}.json"
    with pytest.raises(CorruptError):
        retention.decode(data, key)
    damage.overwrite(run.store, key, data)
    found = records(run.reader)
    assert found.keys == [] and len(found.retired) == 0 and found.bad
    result = audit(run)
    assert not result.ok and result.bad_records


def test_a_record_under_another_name_is_refused() -> None:
    key, data = retention.encode(Retired() | [4], 1234, latest=5, origin=ORIGIN)
    assert retention.decode(data, key).retired.ranges == ((4, 4),)
    with pytest.raises(CorruptError, match="hash of its bytes"):
        retention.decode(data, key.replace(key.rsplit("-", 1)[1][:4], "ffff"))
    with pytest.raises(CorruptError, match="name's time"):
        retention.decode(data, "retention/0000000001235-" + key.rsplit("-", 1)[1])


@settings(max_examples=200, deadline=None)
@given(versions=st.sets(st.integers(1, 10**10 - 2), max_size=40), created=st.integers(0, 10**13 - 1))
def test_records_round_trip(versions: set[int], created: int) -> None:
    retired = Retired() | versions
    key, data = retention.encode(retired, created, latest=10**10 - 1, origin=ORIGIN)
    back = retention.decode(data, key)
    assert back.created_ms == created and back.retired == retired
    assert all(v in back.retired for v in versions) and len(back.retired) == len(versions)
    if versions:
        lo, hi = min(versions), max(versions)
        assert back.retired.covers(lo, hi) == (len(versions) == hi - lo + 1)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300))
def test_random_bytes_are_no_record(data: bytes) -> None:
    key = f"retention/0000000000001-{hashlib.sha256(data).hexdigest()[:32]}.json"
    try:
        back = retention.decode(data, key)
    except CorruptError:
        return
    # bytes that do decode are a record: encoding it again gives the same record
    latest = back.latest if back.latest is not None else 10**10 - 1
    key2, data2 = retention.encode(back.retired, back.created_ms, latest=latest, origin=back.origin or ORIGIN)
    again = retention.decode(data2, key2)
    assert again.retired == back.retired and again.created_ms == back.created_ms


def _gc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "aurora_store.cli", "gc", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})}, timeout=120)


def test_gc_reads_only_the_live_workers_registrations(tmp_path: Path, redis_server: Any) -> None:
    """Hole (issue 22): ``Coordinator.versions_in_use()`` read every registration ever made (HGETALL). Now it reads
    the live workers' only, from the liveness registry: thousands of dead registrations cost nothing,
    live actors still protect what they hold, and a damaged live entry is still reported and counted."""
    run = aurora_store.open_run((tmp_path / "h").as_uri(), full_every=4)
    coord = Coordinator(redis_server.url, "h")
    run.announcer = RegionAnnouncer(coord, "home")
    _publish(run, 10)
    for i, v in enumerate((5, 7)):
        coord.workers.register("actor", "eu", worker_id=f"a{i}", ttl_s=60)
        coord.workers.update(f"a{i}", version=v)
    long_ago = int((time.time() - 600) * 1000)  # expired ten minutes ago, not pruned yet
    pad = "x" * 200
    pipe = coord.r.pipeline(transaction=False)
    for i in range(5000):
        doc = json.dumps({"role": "actor", "region": "eu", "protocol": 2, "version": 1, "pad": pad})
        pipe.hset(coord.key("workers"), f"dead{i}", doc)
        pipe.zadd(coord.key("alive"), {f"dead{i}": long_ago})
    pipe.hset(coord.key("workers"), "ghost", "{not json")  # a live worker whose registration is damaged
    pipe.zadd(coord.key("alive"), {"ghost": int((time.time() + 600) * 1000)})
    pipe.execute()

    coord.r.config_resetstat()
    held, unreadable = coord.versions_in_use()
    sent = int(coord.r.info("stats")["total_net_output_bytes"])
    assert held == {"actor a0 in eu": 5, "actor a1 in eu": 7, "region home": 9}, "dead registrations hold nothing"
    assert len(unreadable) == 1 and "ghost" in unreadable[0]
    assert coord.skipped.counts["registration_not_json"] == 1, "the damaged live entry is counted too"
    assert sent < 20_000, f"Redis sent {sent} bytes for 2 live workers among 5,000 dead ones (~1.3 MB of them)"

    p = gc.plan(run, gc.RetentionPolicy(keep_last=1, keep_fulls=1, holds=held))
    assert sorted(p.kept) == [0, 4, 5, 6, 7, 8, 9], "from what a0 holds on (and its chain); not what the dead held"
    assert 1 in p.retire


@pytest.mark.slow
def test_aurora_gc_dry_runs_and_asks_redis_before_it_applies(tmp_path: Path, redis_server: Any) -> None:
    uri = (tmp_path / "home" / "g").as_uri()
    run = aurora_store.open_run(uri, full_every=4)
    coord = Coordinator(redis_server.url, "g")
    run.announcer = RegionAnnouncer(coord, "home")
    _publish(run, 10)
    out = _gc(uri, "--keep-last", "2", "--keep-fulls", "1", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["applied"] is False and doc["holds"] is None and doc["retire"] == [1, 2, 3, 4, 5, 6, 7]
    assert doc["results"] == {**gc.plan_results(run.store, DAY).to_dict(), "deleted": None}, "none offloaded"
    assert run.versions() == list(range(10)), "a dry run deletes nothing"
    out = _gc(uri, "--apply", env={"AURORA_REDIS": ""})
    assert out.returncode == 1 and "--apply needs --redis" in out.stderr
    other = _gc(uri, "--apply", "--redis", redis_server.url, "--run-id", "nope")
    assert other.returncode == 1 and "is --run-id right?" in other.stderr
    assert run.versions() == list(range(10))

    wid = coord.workers.register("actor", "eu", worker_id="a1", ttl_s=60)
    coord.workers.update(wid, version=5, version_hash="0" * 64)
    coord.r.hset(coord.key("workers"), "ghost", "{not json")
    coord.r.zadd(coord.key("alive"), {"ghost": int((time.time() + 600) * 1000)})  # alive: its expiry, in ms
    refused = _gc(uri, "--apply", "--redis", redis_server.url, "--keep-last", "2", "--keep-fulls", "1")
    assert refused.returncode == 1 and "could not be read" in refused.stderr, "a live worker holding who knows what"
    coord.r.zrem(coord.key("alive"), "ghost")
    done = _gc(uri, "--apply", "--redis", redis_server.url, "--keep-last", "2", "--keep-fulls", "1", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["applied"] and doc["holds"]["actor a1 in eu"] == 5 and doc["holds"]["region home"] == 9
    assert doc["results"]["deleted"] == 0 and doc["results"]["max_age_s"] == DAY
    assert run.versions() == [0, 4, 5, 6, 7, 8, 9], "everything from what a1 holds on, and 5's chain from 4"
    for flag, value in (("--keep-states", "0"), ("--keep-last", "0"), ("--keep-fulls", "x")):
        bad = _gc(uri, flag, value)
        assert bad.returncode == 2 and flag in bad.stderr
    text = _gc(uri, "--keep-last", "2")
    assert text.returncode == 0 and "Redis not asked" in text.stdout and "dry run" in text.stdout


def test_an_actor_paused_past_its_registration_catches_up_from_the_full_version_gc_left(
    tmp_path: Path, redis_server: Any
) -> None:
    """Issue 25, bug 4: an actor holding version 1 stops heartbeating (paused) until its registration
    expires; ``aurora gc`` then retires everything no live worker holds, 1 to 7. Woken up, its Updater
    asked for every manifest from 2 on and failed with MissingError forever; it now jumps to the full
    version gc kept (8) and the delta after it, and holds the latest version bit for bit."""
    from actor.updater import Updater

    uri = (tmp_path / "home" / "p").as_uri()
    run = aurora_store.open_run(uri, full_every=4)
    coord = Coordinator(redis_server.url, "p")
    run.announcer = RegionAnnouncer(coord, "home")
    weights = _publish(run, 2)
    actor = Updater(aurora_store.open_run(uri), region="home", coord=coord, worker_id="paused")
    actor.bootstrap(1)
    wid = coord.workers.register("actor", "home", worker_id="paused", ttl_s=0.5)
    coord.workers.update(wid, version=1, version_hash=run.manifest(1).version_hash)
    assert coord.versions_in_use()[0]["actor paused in home"] == 1
    weights.update(_publish(run, 8, seed=1))  # versions 2-9, fulls at 4 and 8; the actor is paused meanwhile
    wait_for(
        lambda: "actor paused in home" not in coord.versions_in_use()[0], "the paused actor's registration to lapse"
    )

    done = _gc(uri, "--apply", "--redis", redis_server.url, "--keep-last", "2", "--keep-fulls", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert run.versions() == [0, 8, 9], "gc retired every version the paused actor would have read"

    assert [m.version for m in actor.route(9)] == [8, 9]
    staged = actor.stage()  # the region's latest, from Redis
    assert staged is not None and staged.version == 9
    held = actor.apply()
    assert held is not None and held.version == 9
    assert held.weights_digest == run.manifest(9).weights_digest == actor.live_digest()
    assert bits_equal(actor.weights, weights[9])


def _signed_run(tmp_path: Path, versions: int) -> tuple[str, Path, Path, dict[int, dict[str, torch.Tensor]]]:
    """A signed run of ``versions`` versions (fulls every 4) at home: its URI, key files and weights."""
    private, public = signing.generate_keypair()
    key, pub = tmp_path / "run.key", tmp_path / "run.pub"
    key.write_bytes(private)
    pub.write_bytes(public)
    uri = (tmp_path / "home" / "s").as_uri()
    run = aurora_store.open_run(uri, full_every=4, signing_key=private)
    weights = _publish(run, versions)
    run.close()
    return uri, key, pub, weights


def _relay_once(source: str, dest: str, pub: Path | None) -> subprocess.CompletedProcess[str]:
    argv = ["relay", "--source", source, "--dest", dest, "--dest-region", "eu", "--once"]
    argv += [] if pub is None else ["--verify-key", str(pub)]
    return subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", *argv], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_forged_retention_records_hide_no_version_from_a_relay(tmp_path: Path) -> None:
    """Issue 25, bug 7: an unsigned record retiring versions 1 to a million, planted in a signed run's
    home bucket, made ``relay --once`` copy only version 0 of 0-5 and exit 0, and the region's audit
    pass. Records are now signed like versions and never retire the latest committed version or
    above: the relay copies every version, leaves the forged records behind, and the home audit
    reports each of them (unsigned in a signed run, signed by another key, retiring the future)."""
    uri, _key, pub, weights = _signed_run(tmp_path, 6)
    run = aurora_store.open_run(uri, verify_key=pub.read_bytes())
    origin = run.reader.lineage().origin
    assert origin is not None
    legacy = b'{"created_ms":1,"format":"aurora-retention/1","retired":[[1,1000000]]}\n'
    run.store.put_if_absent(f"retention/0000000000001-{hashlib.sha256(legacy).hexdigest()[:32]}.json", legacy)
    eu = (tmp_path / "eu" / "s").as_uri()
    r = _relay_once(uri, eu, pub)
    assert r.returncode == 0, r.stderr
    eu_run = aurora_store.open_run(eu, verify_key=pub.read_bytes())
    assert eu_run.versions() == [0, 1, 2, 3, 4, 5], "every version copied, none hidden by a forged record"

    # records of today's format, as an attacker with write access to the bucket (no run key) makes them
    run.store.put_if_absent(*retention.encode(Retired() | [1, 4], 2, latest=5, origin=origin))
    other = Ed25519PrivateKey.generate()
    run.store.put_if_absent(*retention.encode(Retired() | [1, 4], 3, latest=5, origin=origin, key=other))
    r = _relay_once(uri, eu, pub)
    assert r.returncode == 0, r.stderr
    assert eu_run.store.list_keys(retention.DIR) == [], "no forged record reaches the region"
    assert audit(eu_run).ok
    assert bits_equal(eu_run.materialize(5), weights[5])

    home = audit(aurora_store.open_run(uri, verify_key=pub.read_bytes()))
    assert not home.ok and len(home.bad_records) == 3, home.bad_records
    why = "\n".join(home.bad_records)
    assert "honoured only below version 4" not in why and "honoured only below version 0" in why
    assert "unsigned, in a run signed by key" in why and f"expected {run.reader.lineage().signed_by}" in why
    assert home.retired == 0

    # and in an unsigned run, where anyone may write a record: never one retiring the latest or above
    plain = aurora_store.open_run((tmp_path / "plain").as_uri(), full_every=100)
    _publish(plain, 6)
    plain_origin = plain.reader.lineage().origin
    assert plain_origin is not None
    ahead = retention.encode(Retired() | [1, 9], 4, latest=10, origin=plain_origin)
    plain.store.put_if_absent(*ahead)
    found = records(plain.reader)
    assert len(found.retired) == 0 and "not below the latest committed version 5" in found.bad[0]
    out = (tmp_path / "plain-eu").as_uri()
    assert _relay_once(plain.uri, out, None).returncode == 0
    assert aurora_store.open_run(out).versions() == list(range(6))


def test_gc_signs_its_record_in_a_signed_run_and_relays_honour_it(tmp_path: Path, redis_server: Any) -> None:
    """Issue 25, bug 7: in a signed run, ``aurora gc --apply`` signs its record with the run's key
    (and refuses, deleting nothing, without it or with another key); a relay to a new region then
    skips exactly the retired versions, places the record there once the region holds a version
    above them, and both audits pass. A record written by earlier code (format 1) is still honoured
    below the latest full version it leaves."""
    uri, key, pub, weights = _signed_run(tmp_path, 10)  # fulls at 0, 4, 8
    coord = Coordinator(redis_server.url, "s")
    run = aurora_store.open_run(uri, verify_key=pub.read_bytes())
    coord.regions.commit("home", 9, run.manifest(9).version_hash, "delta")
    args = [uri, "--apply", "--redis", redis_server.url, "--keep-last", "2", "--keep-fulls", "1"]
    args += ["--verify-key", str(pub)]
    unsigned = _gc(*args, env={"AURORA_SIGNING_KEY": ""})
    assert unsigned.returncode == 1 and "give gc the run's signing key" in unsigned.stderr, unsigned.stderr
    other = tmp_path / "other.key"
    other.write_bytes(signing.generate_keypair()[0])
    wrong = _gc(*args, "--signing-key", str(other))
    assert wrong.returncode == 1 and "nothing was deleted" in wrong.stderr, wrong.stderr
    assert run.versions() == list(range(10)) and run.store.list_keys(retention.DIR) == []
    done = _gc(*args, "--signing-key", str(key))
    assert done.returncode == 0, done.stderr
    assert run.versions() == [0, 8, 9]
    found = records(aurora_store.open_run(uri, verify_key=pub.read_bytes()).reader)
    assert found.retired.ranges == ((1, 7),) and not found.bad
    (record_key,) = found.keys
    doc = json.loads(run.store.get(record_key, max_bytes=1 << 20))
    assert doc["signature"]["key_id"] == run.reader.lineage().signed_by and doc["latest"] == 9

    eu = (tmp_path / "eu" / "s").as_uri()
    r = _relay_once(uri, eu, pub)
    assert r.returncode == 0, r.stderr
    eu_run = aurora_store.open_run(eu, verify_key=pub.read_bytes())
    assert eu_run.versions() == [0, 8, 9] and eu_run.store.list_keys(retention.DIR) == [record_key]
    for fresh in (aurora_store.open_run(uri, verify_key=pub.read_bytes()), eu_run):
        result = audit(fresh)
        assert result.ok and result.retired == 7, (result.first_error, result.bad_records)
    assert bits_equal(eu_run.materialize(9), weights[9])

    # a record of format 1 (earlier code) in the same signed run: what it retires below version 8 stands
    legacy = b'{"created_ms":2,"format":"aurora-retention/1","retired":[[1,7]]}\n'
    run.store.put_if_absent(f"retention/0000000000002-{hashlib.sha256(legacy).hexdigest()[:32]}.json", legacy)
    found = records(aurora_store.open_run(uri, verify_key=pub.read_bytes()).reader)
    assert found.retired.ranges == ((1, 7),) and not found.bad and len(found.keys) == 2


DAY = 86400
HOSTILE_RESULT_NAMES = [
    "results/" + "AB" * 32 + ".bin",  # upper-case hex
    "results/" + "ab" * 32 + ".bin.part",
    "results/" + "ab" * 31 + ".bin",  # 62 digits
    "results/nested/" + "cd" * 32 + ".bin",
    "results/notes.txt",
    "results/ünïcode name.bin",
]


def _payloads(store: ObjectStore, n: int) -> dict[str, int]:
    """``n`` offloaded payloads of different sizes, written as an actor writes them; their sizes by key."""
    out = {}
    for i in range(n):
        data = bytes([i]) * (100 + 37 * i)
        key, _ = put_payload(store, data)
        out[key] = len(data)
    return out


def test_gc_deletes_result_payloads_older_than_the_max_age(root: Root) -> None:
    store = ObjectStore(root.uri, root.storage_options)
    sizes = _payloads(store, 3)
    for name in HOSTILE_RESULT_NAMES:
        damage.overwrite(store, name, b"not a payload")
    store.put_if_absent("versions/0000000000/manifest.json", b"{}")  # never looked at by results gc

    fresh = gc.plan_results(store, DAY)
    assert fresh.expired == [] and fresh.young == 3 and fresh.undated == [], "written just now: kept"
    assert fresh.foreign == sorted(HOSTILE_RESULT_NAMES)
    later = gc.plan_results(store, DAY, now=time.time() + DAY + 60)  # a day and a minute from now
    assert dict(later.expired) == sizes and later.expired_bytes == sum(sizes.values()) and later.young == 0
    assert later.foreign == sorted(HOSTILE_RESULT_NAMES), "a hostile name is never a candidate, however old"
    assert later.to_dict() == {
        "max_age_s": DAY,
        "expired": 3,
        "expired_bytes": sum(sizes.values()),
        "young": 0,
        "undated": [],
        "foreign": sorted(HOSTILE_RESULT_NAMES),
    }
    assert sorted(store.list_keys("results")) == sorted([*sizes, *HOSTILE_RESULT_NAMES]), "planning deletes nothing"

    assert gc.apply_results(store, later) == 3
    assert store.list_keys("results") == sorted(HOSTILE_RESULT_NAMES), "only the payloads went"
    assert store.exists("versions/0000000000/manifest.json")
    gc.apply_results(store, later)  # a second apply finds them gone (S3 does not say whether a key was there)
    assert store.list_keys("results") == sorted(HOSTILE_RESULT_NAMES)
    off = gc.plan_results(store, 0, now=time.time() + 100 * DAY)
    assert off.expired == [] and off.foreign == [] and off.young == 0, "0: results are not even listed"
    with pytest.raises(ValueError, match=">= 0"):
        gc.plan_results(store, -1)


def test_the_age_is_the_files_mtime_and_a_dry_run_says_what_it_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = (tmp_path / "r").as_uri()
    run = aurora_store.open_run(uri, full_every=4)
    _publish(run, 3)
    sizes = _payloads(run.store, 4)
    old, young = sorted(sizes)[:3], sorted(sizes)[3:]
    for key in old:  # two days old, by the file's own modification time
        when = time.time() - 2 * DAY
        os.utime(run.store.path(key), (when, when))
    hostile = "results/\x1b[2J" + "ab" * 32 + ".bin"  # printed as a repr, never raw
    damage.overwrite(run.store, hostile, b"x")
    os.utime(run.store.path(hostile), (0, 0))

    p = gc.plan_results(run.store, DAY)
    assert sorted(k for k, _ in p.expired) == old and p.young == 1 and p.foreign == [hostile]
    assert gc.plan_results(run.store, 3 * DAY).expired == [], "younger than three days, all of them"

    assert main(["gc", uri, "--json"]) == 0  # the default max age, a day
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"] == {
        "max_age_s": DAY,
        "expired": 3,
        "expired_bytes": sum(sizes[k] for k in old),
        "young": 1,
        "undated": [],
        "foreign": [hostile],
        "deleted": None,
    }
    assert main(["gc", uri]) == 0
    text = capsys.readouterr().out
    assert f"results/: 3 payload(s) older than 86,400 s ({sum(sizes[k] for k in old):,} bytes) to delete" in text
    assert f"leave {hostile!r} alone: not a payload's name" in text and "dry run" in text
    assert "\x1b" not in text
    assert sorted(run.store.list_keys("results")) == sorted([*sizes, hostile]), "a dry run deletes nothing"

    # --apply without Redis: versions are refused as before; old payloads need no Redis, and go
    monkeypatch.delenv("AURORA_REDIS", raising=False)
    assert main(["gc", uri, "--apply"]) == 1
    err = capsys.readouterr().err
    assert "3 old results/ payload(s) deleted, no version deleted: --apply needs --redis" in err
    assert sorted(run.store.list_keys("results")) == sorted([*young, hostile])
    assert run.versions() == [0, 1, 2], "no version deleted"


def test_a_payload_without_a_readable_time_is_kept_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = (tmp_path / "r").as_uri()
    run = aurora_store.open_run(uri, full_every=4)
    _publish(run, 1)
    first, second, third = sorted(_payloads(run.store, 3))
    find = run.store.fs.find

    def listing(path: str, **kw: Any) -> Any:
        found = find(path, **kw)
        for p, info in found.items() if isinstance(found, dict) else ():
            if p.endswith(first.split("/")[-1]):  # no time at all
                info.pop("mtime")
                info.pop("created", None)
            elif p.endswith(second.split("/")[-1]):
                info.update(mtime="yesterday", created=float("nan"), LastModified="2026-13-45T99:00:00Z")
        return found

    monkeypatch.setattr(run.store.fs, "find", listing)  # fsspec's cached filesystem: main()'s store's too
    p = gc.plan_results(run.store, 1, now=time.time() + DAY)
    assert p.undated == [first, second] and [k for k, _ in p.expired] == [third]
    assert main(["gc", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"]["undated"] == [first, second]
    assert main(["gc", uri]) == 0
    text = capsys.readouterr().out
    for key in (first, second):
        assert f"keep {key!r}: the store reports no modification time for it that can be read" in text


def test_results_max_age_option() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_results_arguments(parser)
    assert parser.parse_args([]).results_max_age == RESULTS_MAX_AGE_S == DAY
    assert parser.parse_args(["--results-max-age", "0"]).results_max_age == 0
    for bad in ("-1", "1.5", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--results-max-age", bad])


@pytest.mark.slow
def test_gc_while_the_trainer_publishes_and_a_relay_copies(tmp_path: Path, redis_server: Any) -> None:
    """A publisher (the trainer's publishing path) in this process, a relay to eu as a real process,
    and `aurora gc --apply` on home and on eu, over and over, all at once; then both regions audit,
    and every version still there replays bit-exact."""
    home, eu = (tmp_path / "home" / "c").as_uri(), (tmp_path / "eu" / "c").as_uri()
    run = aurora_store.open_run(home, full_every=5)
    coord = Coordinator(redis_server.url, "c")
    run.announcer = RegionAnnouncer(coord, "home")
    weights = _publish(run, 2)
    log = open(tmp_path / "relay.log", "wb")  # noqa: SIM115 - the child owns it
    argv = [sys.executable, "-m", "aurora_store.cli", "relay", "--source", home, "--dest", eu, "--dest-region", "eu"]
    relay = subprocess.Popen(
        [*argv, "--redis", redis_server.url, "--run-id", "c", "--rescan-s", "0.5"],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    stop = threading.Event()
    failures: list[str] = []

    def publish() -> None:
        g = torch.Generator().manual_seed(3)
        w = {k: v.clone() for k, v in weights[max(weights)].items()}
        while not stop.is_set() and len(weights) < 40:
            for t in w.values():
                flat = t.view(-1)
                flat[torch.randperm(flat.numel(), generator=g)[:40]] += 1
            info = run.publish(w)
            weights[info.version] = {k: v.clone() for k, v in w.items()}
            time.sleep(0.05)

    def collect(uri: str) -> None:
        while not stop.is_set():
            out = _gc(
                uri, "--apply", "--redis", redis_server.url, "--run-id", "c", "--keep-last", "3", "--keep-fulls", "1"
            )
            if out.returncode != 0:
                failures.append(f"gc {uri}: {out.stderr[-800:]}")
                return

    threads = [threading.Thread(target=publish), threading.Thread(target=collect, args=(home,))]
    threads.append(threading.Thread(target=collect, args=(eu,)))
    try:
        wait_for(lambda: Coordinator(redis_server.url, "c").regions.version("eu") is not None, what="the relay starts")
        for t in threads:
            t.start()
        threads[0].join(timeout=240)
        assert not threads[0].is_alive(), "the publisher finished"
        latest = max(weights)
        wait_for(
            lambda: (rv := coord.regions.version("eu")) is not None and rv.version == latest,
            timeout=60,
            what=f"eu reaches version {latest}:\n{(tmp_path / 'relay.log').read_text()[-2000:]}",
        )
        stop.set()
        for t in threads[1:]:
            t.join(timeout=150)
        assert not failures, failures
        assert relay.poll() is None, (tmp_path / "relay.log").read_text()[-3000:]
        for uri in (home, eu):
            out = _gc(
                uri, "--apply", "--redis", redis_server.url, "--run-id", "c", "--keep-last", "3", "--keep-fulls", "1"
            )
            assert out.returncode == 0, out.stderr
            fresh = aurora_store.open_run(uri)
            result = audit(fresh)
            assert result.ok, (uri, result.first_error, result.bad_records)
            assert result.retired > 0, f"{uri}: gc retired versions while the run went on"
            for v in fresh.versions():
                assert bits_equal(fresh.materialize(v), weights[v]), f"{uri} version {v}"
        home_run, eu_run = aurora_store.open_run(home), aurora_store.open_run(eu)
        eu_retired = records(eu_run.reader).retired
        assert not [v for v in eu_run.versions() if v in eu_retired], "the relay copied no retired version back"
        assert home_run.versions()[-1] == eu_run.versions()[-1] == latest
        assert np.all(np.diff(eu_run.versions()) > 0)
    finally:
        stop.set()
        relay.terminate()
        try:
            relay.wait(20)
        except subprocess.TimeoutExpired:
            relay.kill()
