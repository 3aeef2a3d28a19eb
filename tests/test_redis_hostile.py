"""Everything the roles read from Redis is hostile, and Redis may lose it: damaged entries are
counted and skipped, announcements copy only a version's objects, results are dropped with the
reason (and the actor told), a lease is bound to its actor, a flush is noticed and every unadmitted
job leased again, and Redis holds only the steps in flight."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import aurora_store
from aurora_store.errors import CorruptError


def test_damaged_registrations_region_versions_and_events_are_counted_and_skipped(redis_server: Any) -> None:
    from aurora_store.coord.coordinator import Coordinator
    from aurora_store.coord.regions import RegionVersion

    coord = Coordinator(redis_server.url, f"h-{uuid.uuid4().hex[:6]}")
    coord.workers.register("actor", "home", worker_id="good")
    for wid, doc in (("bad-json", "{nope"), ("a-list", "[1]"), ("deep", "[" * 100_000), ("has space", "{}")):
        coord.r.hset(coord.key("workers"), wid, doc)
        coord.workers.heartbeat(wid)
    assert set(coord.workers.registrations()) == {"good"}
    coord.r.hset(coord.key("region", "eu"), mapping={"version": "xyz", "version_hash": "0" * 64, "kind": "full"})
    assert coord.regions.version("eu") is None
    assert coord.regions.commit("eu", 3, "3" * 64, "full"), (
        "a damaged entry is replaced, not a script error (chaos run)"
    )
    assert coord.regions.version("eu") == RegionVersion(3, "3" * 64, "full")
    coord.r.hset(coord.key("region", "ap"), mapping={"version": "3", "version_hash": "h", "kind": "full"})
    assert coord.regions.version("ap") is None
    coord.r.xadd(coord.key("events", "home"), {"type": "commit", "version": "xyz"})
    coord.r.xadd(coord.key("events", "home"), {"type": "segment", "version": "1", "size": "abc"})
    coord.r.xadd(coord.key("events", "home"), {"type": "commit", "version": "2", "version_hash": "0" * 64})
    events = coord.regions.events("home", "0-0", block_ms=10)
    assert [e.type for e in events] == ["invalid", "invalid", "commit"] and events[2].version == 2
    counts = coord.skipped.counts
    assert counts["registration_not_json"] == 1 and counts["registration_not_object"] == 1
    assert counts["registration_too_deep"] == 1 and counts["bad_worker_id"] == 1
    assert counts["bad_version"] == 2 and counts["bad_version_hash"] == 1 and counts["bad_key"] == 1


def _source(tmp_path: Path) -> Any:
    """A run with one version, for a relay to copy from."""
    run = aurora_store.open_run(f"file://{tmp_path}/a/run", full_every=2)
    w = {"w": torch.linspace(-1, 1, 4096).to(torch.bfloat16)}
    w["w"][0] += 1
    run.publish(w)
    return run


@pytest.mark.parametrize(
    "fields",
    [
        {"key": "versions/0000000001/manifest.json", "size": "10", "sha256": "ab" * 32},
        {"key": "versions/0000000001/notes.txt", "size": "10", "sha256": "ab" * 32},
        {"key": "versions/0000000002/00000-" + "ab" * 16 + ".seg", "size": "10", "sha256": "ab" * 32},
        {"size": "10", "sha256": "ab" * 32},
        {"key": "versions/0000000001/00000-" + "ab" * 16 + ".seg", "size": "abc", "sha256": "ab" * 32},
        {"key": "versions/0000000001/00000-" + "ab" * 16 + ".seg", "size": "10", "sha256": "zz"},
    ],
    ids=["manifest", "other-name", "other-version", "no-key", "bad-size", "bad-sha"],
)
def test_an_announcement_of_anything_but_a_versions_object_is_refused(tmp_path: Path, fields: dict[str, str]) -> None:
    from relay.worker import Relay

    a = _source(tmp_path)
    dest = aurora_store.open_run(f"file://{tmp_path}/eu/run")
    relay = Relay(a.store, dest.store, None, source_region="home", dest_region="eu")
    with pytest.raises(CorruptError):
        relay._handle("segment", 1, fields)
    relay.close()
    assert dest.store.list_keys("") == []


def _dispatcher(redis_url: str, group: int = 2) -> Any:
    from aurora_store.coord.coordinator import Coordinator
    from aurora_store.coord.jobs import JobBoard
    from aurora_store.rl.sampling import SamplingConfig
    from trainer.config import ScheduleConfig
    from trainer.dispatch import Dispatcher

    coord = Coordinator(redis_url, f"h-{uuid.uuid4().hex[:6]}")
    d = Dispatcher(
        coord,
        JobBoard(coord),
        schedule=ScheduleConfig(lease_s=30, sweep_s=0.05),
        sampling=SamplingConfig(group=group, max_new_tokens=4),
        vocab_size=64,
        tag="t",
    )
    d.published_version(0, "0" * 64, "d" * 32)
    return d


def _one_job(d: Any) -> Any:
    from aurora_store.rl.tasks import Prompt

    d.coord.workers.register("actor", "home", worker_id="a", ttl_s=30)
    d.coord.workers.update("a", version=0)
    # as an actor that registers (again) does: after a flush its inbox's new ids may be no higher than the
    # last it read (the same millisecond's, on a fast machine), so it reads the inbox from its start
    d.board.rewind("a")
    d.post(1, [Prompt("p", "1+1=", "2", (3, 4))])
    (lease,) = d.board.take("a", max_jobs=1, block_s=1)
    return lease


def _group(digest: str = "d" * 32, tokens: int = 2) -> bytes:
    from aurora_store.format import results as payloads

    comp = ([5] * (tokens - 1) + [1], [-0.5] * tokens, "stop", 1.0)
    return payloads.encode([comp] * 2, failures={}, weights_digest=digest)


GOOD_GROUP = _group()


def test_results_that_are_garbage_or_elsewhere_are_dropped_with_the_reason_and_removed(redis_server: Any) -> None:
    d = _dispatcher(redis_server.url)
    lease = _one_job(d)
    stream = d.board._k("results")
    base = {"job": lease.job, "token": str(lease.token), "actor": "a", "version": "0", "version_hash": "0" * 64}
    d.board.rb.xadd(stream, {**base, "bin": b"[1, 2]"})
    sha = "ab" * 32
    d.board.rb.xadd(stream, {**base, "ref": f"results/{sha}.bin", "sha256": sha, "size": "9", "region": "mars"})
    d.board.rb.xadd(stream, {**base, "bin": _group(digest="e" * 32)})
    d.board.results.submit(lease, actor="a", version=0, version_hash="0" * 64, payload=GOOD_GROUP)
    assert len(d.collect(1)) == 1
    assert d.dropped == {"bad_payload": 1, "unknown_region": 1, "wrong_digest": 1}
    assert d.board.r.xlen(stream) == 0, "every result read left the stream"
    notices = d.board.notices.read("a", "0-0")
    assert [n.reason for n in notices] == ["bad_payload", "unknown_region", "wrong_digest"], "told what it can fix"
    assert all(n.signature is None for n in notices), "no signing key: an unsigned run's notices"


def test_a_trainer_with_a_signing_key_signs_what_it_tells(redis_server: Any) -> None:
    from aurora_store.format import signing

    private, public = signing.generate_keypair()
    d = _dispatcher(redis_server.url)
    d.signer = lambda: signing.load_signing_key(private)
    lease = _one_job(d)
    base = {"job": lease.job, "token": str(lease.token), "actor": "a", "version": "0", "version_hash": "0" * 64}
    d.board.rb.xadd(d.board._k("results"), {**base, "bin": b"[1, 2]"})
    d.board.results.submit(lease, actor="a", version=0, version_hash="0" * 64, payload=GOOD_GROUP)
    assert len(d.collect(1)) == 1
    (told,) = d.board.notices.read("a", "0-0")
    assert told.reason == "bad_payload" and d.board.notices.verify("a", told, signing.load_verify_key(public))
    assert not d.board.notices.verify("b", told, signing.load_verify_key(public)), "bound to the actor it names"


# ---------------------------------------------------------------- 10. Redis holds only the steps in flight


def test_admitted_results_and_prompts_leave_redis(redis_server: Any) -> None:
    d = _dispatcher(redis_server.url)
    lease = _one_job(d)
    d.board.results.submit(lease, actor="a", version=0, version_hash="0" * 64, payload=GOOD_GROUP)
    assert len(d.collect(1)) == 1
    assert d.board.r.xlen(d.board._k("results")) == 0
    assert d.board.r.hget(d.board._k("job", lease.job), "prompt") is None, "an admitted job keeps no prompt"
    assert d.board.r.hget(d.board._k("job", lease.job), "state") == "admitted", "but refuses late duplicates"


# ---------------------------------------------------------------- 7. Redis losing its state without a disconnect


def test_a_flushall_is_noticed_and_every_unadmitted_job_leased_again(redis_server: Any) -> None:
    d = _dispatcher(redis_server.url)
    lease = _one_job(d)
    d.coord.epoch.check()
    d.coord.r.flushall()  # the lease, the inbox and the registration are gone
    d.coord.workers.register("actor", "home", worker_id="a", ttl_s=30)  # the actor notices too and registers again
    d.coord.workers.update("a", version=0)
    d.board.rewind("a")  # and reads its inbox from the start (see _one_job)
    d._last_sweep = 0.0
    d._collect_once()
    assert d.rebuilds == 1
    (again,) = d.board.take("a", max_jobs=1, block_s=1)
    assert again.job == lease.job and again.token != lease.token
    d.board.results.submit(lease, actor="a", version=0, version_hash="0" * 64, payload=GOOD_GROUP)  # before the flush
    d.board.results.submit(again, actor="a", version=0, version_hash="0" * 64, payload=GOOD_GROUP)
    assert [r.result.token for r in d.collect(1)] == [again.token]
    assert d.dropped["unknown_job"] + d.dropped["stale_lease"] == 1


def test_fencing_tokens_start_at_a_random_offset_after_a_flush(redis_server: Any) -> None:
    d = _dispatcher(redis_server.url)
    first = _one_job(d)
    d.coord.r.flushall()
    second = _one_job(d)
    assert first.token > 1000 and second.token > 1000 and first.token != second.token


# ---------------------------------------------------------------- weak spot: a lease is bound to its actor


def test_a_result_under_another_actors_name_is_refused(redis_server: Any) -> None:
    d = _dispatcher(redis_server.url)
    lease = _one_job(d)
    d.board.results.submit(lease, actor="b", version=0, version_hash="0" * 64, payload=GOOD_GROUP)  # b holds the token
    d.board.results.submit(lease, actor="a", version=0, version_hash="0" * 64, payload=GOOD_GROUP)
    assert [r.actor for r in d.collect(1)] == ["a"]
    assert d.dropped == {"wrong_actor": 1}


def test_an_actor_told_its_results_are_unusable_stops_and_one_told_they_are_late_goes_on(redis_server: Any) -> None:
    from actor.config import ActorConfig, SyncConfig
    from actor.outbox import MAX_REFUSED
    from actor.worker import Actor

    def worker(wid: str) -> Actor:
        store = f"memory://redis-hostile/{uuid.uuid4().hex}/run"
        aurora_store.open_run(store).publish({"w": torch.zeros(8, dtype=torch.bfloat16)})  # an unsigned run
        sync = SyncConfig(store=store, region="home", redis=redis_server.url, run_id="r", worker_id=wid)
        return Actor(ActorConfig(sync=sync))

    late, bad, framed = worker("late"), worker("bad"), worker("framed")
    for w in (late, bad, framed):  # each one's own submissions (their stream ids are what notices name)
        for i in range(MAX_REFUSED + 2):
            w.outbox.submitted[w.board.r.xadd(w.board._k("results"), {"job": f"j{i}"})] = None
    own = {w.wid: list(w.outbox.submitted) for w in (late, bad, framed)}
    for i in range(MAX_REFUSED + 2):
        late.board.notices.tell("late", f"j{i}", "expired", own["late"][i])
    for i in range(MAX_REFUSED):
        bad.board.notices.tell("bad", f"j{i}", "bad_payload", own["bad"][i])
        # a forger submits bad results in framed's name: the notices name the forger's results, not framed's
        framed.board.notices.tell("framed", f"j{i}", "wrong_digest", f"{i + 1}-0")
    for w in (late, bad, framed):
        w.outbox.told(w.board.notices.read(w.wid, "0-0"))
    assert not late.stop.is_set() and not late.refused
    assert bad.stop.is_set() and bad.refused
    assert not framed.stop.is_set(), "results forged in an actor's name never stop it"


def test_in_a_signed_run_only_the_trainers_signed_notices_stop_an_actor(redis_server: Any) -> None:
    """Issue 34, bug 4: anyone who can write Redis could read an actor's result ids from the results stream
    and add three ``revoked`` notices naming them: the actor stopped for good while the trainer dropped
    nothing. In a signed run the trainer signs its notices with the run's key; unsigned ones, ones signed by
    another key, and a signed one replayed are not acted on; three the trainer signed stop it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from actor.config import ActorConfig, SyncConfig
    from actor.outbox import MAX_REFUSED
    from actor.worker import Actor
    from aurora_store.format import signing

    private, public = signing.generate_keypair()
    key = signing.load_signing_key(private)
    store = f"memory://redis-hostile/{uuid.uuid4().hex}/run"
    aurora_store.open_run(store, signing_key=private).publish({"w": torch.zeros(8, dtype=torch.bfloat16)})
    sync = SyncConfig(
        store=store, region="home", redis=redis_server.url, run_id="r", worker_id="a", verify_key=public.decode()
    )
    w = Actor(ActorConfig(sync=sync))
    ids = [w.board.r.xadd(w.board._k("results"), {"job": f"j{i}"}) for i in range(2 * MAX_REFUSED + 1)]
    for rid in ids:
        w.outbox.submitted[rid] = None
    tell = w.board.notices.tell
    for i in range(MAX_REFUSED):
        tell("a", f"j{i}", "revoked", ids[i])  # unsigned: the forger has no key
        tell("a", f"j{i}", "revoked", ids[i], key=Ed25519PrivateKey.generate())  # another key
    tell("a", "jx", "revoked", ids[MAX_REFUSED], key=key)
    forged = w.board.notices.read("a", "0-0")
    w.outbox.told(forged + forged[-1:] * MAX_REFUSED)  # the signed one replayed: each result counts once
    assert not w.stop.is_set() and not w.outbox.refused
    for i in range(MAX_REFUSED + 1, 2 * MAX_REFUSED):
        tell("a", f"j{i}", "revoked", ids[i], key=key)
    w.outbox.told(w.board.notices.read("a", forged[-1].id))
    assert w.stop.is_set() and w.outbox.refused, "what the trainer signed stops it"


def test_redis_memory_stays_flat_over_steps_of_real_sized_groups(redis_server: Any) -> None:
    """Hole 10, measured: groups of 8 completions of 1,000 tokens as actor/worker.py builds them
    (~64 KB each, the most that goes inline), 16 groups a step. Before the fix Redis grew by every
    step's results; now a step's jobs leave too, two steps after it was trained on."""
    import redis as redis_client

    from aurora_store.format import results as payloads
    from aurora_store.rl.tasks import Prompt

    d = _dispatcher(redis_server.url, group=8)
    d.payloads.sampling = d.sampling = dataclasses.replace(d.sampling, max_new_tokens=1000)
    d.coord.workers.register("actor", "home", worker_id="a", ttl_s=60)
    d.coord.workers.update("a", version=0)
    comp = ([7] * 1000, [-0.123456789] * 1000, "length", 1.0)
    payload = payloads.encode([comp] * 8, failures={}, weights_digest="d" * 32)
    r = redis_client.Redis(port=redis_server.port)
    used = []
    for step in range(1, 9):
        d.post(step, [Prompt(f"p{i}", "x", "y", (1, 2)) for i in range(16)])
        leases: list[Any] = []
        while len(leases) < 16:
            leases += d.board.take("a", max_jobs=16, block_s=1)
        for lease in leases:
            d.board.results.submit(lease, actor="a", version=0, version_hash="0" * 64, payload=payload)
        assert len(d.collect(step)) == 16
        used.append(r.info("memory")["used_memory"])
    grew = [u - used[2] for u in used[2:]]
    assert max(grew) < (256 << 10), f"Redis grew by {grew} bytes over 6 steps of ~1 MB"
    assert len(d.leases.step_jobs) == 3 and d.board.r.exists(d.board._k("job", "t:1:0")) == 0, (
        "old steps' jobs are gone"
    )


# ---------------------------------------------------------------- a crashed reward is no reward


def test_a_group_whose_reward_process_died_with_the_actor_is_never_admitted_as_zeros(redis_server: Any) -> None:
    """Hole (issue 22): a SIGTERM to an actor's process group kills its reward process too; the
    in-flight group was scored ``crashed`` (0 each) and submitted, and the trainer admitted those
    zeros as rewards. Now the stopping actor submits nothing, and the trainer drops a result most of
    whose rewards crashed (an older or hostile actor's), leasing the prompt again."""
    import os
    import signal

    from actor.config import ActorConfig, SyncConfig
    from actor.engines.base import Completion
    from actor.engines.torch import TorchEngine
    from actor.rewards import RewardPool
    from actor.updater import Applied, Updater
    from actor.worker import Actor
    from aurora_store.format import results as payloads
    from aurora_store.rl.models import build_model, tiny_config
    from aurora_store.rl.sampling import SamplingConfig
    from aurora_store.rl.tasks import Prompt
    from aurora_store.rl.tokenizers import CharTokenizer
    from aurora_store.testing.processes import wait_for

    d = _dispatcher(redis_server.url)
    d.coord.workers.register("actor", "home", worker_id="a", ttl_s=30)
    d.coord.workers.update("a", version=0)
    prompts = [Prompt(f"p{i}", "1+1=", "2", (3, 4)) for i in range(2)]
    d.post(1, prompts)

    def take(n: int) -> list[Any]:
        taken: list[Any] = []  # (again) leased at a sweep
        wait_for(
            lambda: bool(
                d._collect_once() or taken.extend(d.board.take("a", max_jobs=n, block_s=0)) or len(taken) >= n
            ),
            f"{n} leases",
        )
        return taken

    leases = take(2)
    sync = SyncConfig(
        store=f"memory://redis-hostile/{uuid.uuid4().hex}/run",
        region="home",
        redis=redis_server.url,
        run_id=d.coord.run_id,
        worker_id="a",
    )
    w = Actor(ActorConfig(sync=sync))
    w.rewards = RewardPool("tests.reward_fns:length_over_ten", timeout_s=5, stop=w.stop)
    w.engine = TorchEngine(build_model(tiny_config(64), seed=0))
    w.follow(Updater(w.run, region="home", coord=w.coord, worker_id="a"))
    w.equip(tok=CharTokenizer(), vocab=64, sampling=SamplingConfig(group=2), rewards=w.rewards)
    try:
        pid = w.rewards.pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)  # the process group's SIGTERM reaches the reward process ...
        w.halt()  # ... and the actor's handler
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or " Z " in Path(f"/proc/{pid}/stat").read_text(), "its end")
        comps = [Completion((5, 1), (-0.5, -0.5), "stop"), Completion((6, 1), (-0.5, -0.5), "stop")]
        applied = Applied(0, "0" * 64, "d" * 32)
        assert w.batches.submit_all(list(zip(leases, prompts, strict=True)), [comps, comps], applied) is None
    finally:
        w.close()
    assert d.board.results.read("0-0", block_ms=1) == [], "no result of zeros reached the trainer"
    again = take(2)
    assert sorted(x.job for x in again) == sorted(x.job for x in leases), "both jobs given back and leased again"
    lease = again[0]

    # what an actor without this fix (or a hostile one) sends: every reward crashed, scored 0
    crashed = payloads.encode(
        [([5, 1], [-0.5, -0.5], "stop", 0.0)] * 2, failures={"crashed": 2}, weights_digest="d" * 32
    )
    d.board.results.submit(lease, actor="a", version=0, version_hash="0" * 64, payload=crashed)
    wait_for(lambda: bool(d._collect_once() or d.dropped["rewards_crashed"]), "the result to be read")
    assert d.dropped["rewards_crashed"] == 1 and d.admitted_total == 0
    assert d.board.notices.read("a", "0-0")[0].reason == "rewards_crashed", "the actor is told"
    (again1,) = take(1)  # leased again at once (at the next sweep), with a new token
    assert again1.job == lease.job and again1.token != lease.token
    # half the group crashed (each completion killed two processes): those zeros are its scores
    half = payloads.encode(
        [([5, 1], [-0.5, -0.5], "stop", 0.0), ([5, 1], [-0.5, -0.5], "stop", 1.0)],
        failures={"crashed": 1},
        weights_digest="d" * 32,
    )
    d.board.results.submit(again1, actor="a", version=0, version_hash="0" * 64, payload=half)
    d.board.results.submit(again[1], actor="a", version=0, version_hash="0" * 64, payload=GOOD_GROUP)
    admitted = {r.job: r for r in d.collect(1)}
    assert list(admitted[lease.job].rollouts.rewards) == [0.0, 1.0] and d.reward_failures == {"crashed": 1}


def test_an_actor_starting_on_a_damaged_region_reads_the_run_files_from_its_fallback(
    redis_server: Any, tmp_path: Path
) -> None:
    """Another process replayed an old manifest over the region's latest: a starting actor reads the
    run's files from the fallback (home) bucket instead of dying; without a fallback the error is one
    its setup waits out (retried), not the process's end."""
    import shutil

    import aurora_store
    from actor.config import ActorConfig, SyncConfig
    from actor.worker import Actor
    from aurora_store.errors import CorruptError

    home = aurora_store.open_run((tmp_path / "home").as_uri())
    home.files.put("config.json", b'{"k": 1}')
    weights = {"w": torch.arange(8, dtype=torch.float32).to(torch.bfloat16)}
    home.publish(weights)
    weights["w"][0] += 1
    home.publish(weights)
    shutil.copytree(tmp_path / "home", tmp_path / "eu")
    v = tmp_path / "eu" / "versions"
    (v / "0000000001" / "manifest.json").write_bytes((v / "0000000000" / "manifest.json").read_bytes())

    def worker(fallback: str | None) -> Actor:
        sync = SyncConfig(
            store=(tmp_path / "eu").as_uri(),
            region="eu",
            redis=redis_server.url,
            run_id="damaged",
            worker_id="eu-0",
            fallback=fallback,
        )
        return Actor(ActorConfig(sync=sync))

    assert worker((tmp_path / "home").as_uri())._run_files()["config.json"] == b'{"k": 1}'
    with pytest.raises(CorruptError, match="declares version 0, expected 1"):
        worker(None)._run_files()


def test_a_failing_result_takes_the_lease_only_from_its_own_holder(redis_server: Any) -> None:
    """Issue 25, bug 1: a result that fails admission under the holder's name with another token, under
    the holder's token with another name, or from a former holder (an old token), is dropped and the lease
    stays with the actor working on it, whose result is then admitted (it was dropped as stale_lease: 16
    such entries a second admitted 0 of 8 results in 30 s). The holder's own failure still gives it up."""
    from aurora_store.rl.tasks import Prompt
    from aurora_store.testing.processes import wait_for

    d = _dispatcher(redis_server.url)
    lease = _one_job(d)
    stream = d.board._k("results")
    base = {"job": lease.job, "actor": "a", "version": "0", "version_hash": "0" * 64}
    forged = [
        {**base, "token": str(lease.token + 1), "bin": b"[1, 2]"},
        {**base, "actor": "mallory", "token": str(lease.token), "bin": b"[1, 2]"},
        {**base, "token": str(lease.token - 1), "bin": _group(digest="e" * 32)},
        {**base, "token": str(lease.token + 7), "version_hash": "f" * 64, "bin": GOOD_GROUP},
        {**base, "token": "not-a-token", "bin": GOOD_GROUP},
    ]
    for fields in forged:
        d.board.rb.xadd(stream, fields)
    wait_for(lambda: bool(d._collect_once()) or sum(d.dropped.values()) >= len(forged), "the forged results read")
    sweeps = d.leases.sweeps
    # a sweep (every 50 ms here): a lease taken back would be leased again at it
    wait_for(lambda: bool(d._collect_once()) or d.leases.sweeps > sweeps, "a sweep after the forged results")
    assert d.leases.holder.get(lease.job) == "a" and lease.job not in d.leases.pending, d.dropped
    d.board.results.submit(lease, actor="a", version=0, version_hash="0" * 64, payload=GOOD_GROUP)
    wait_for(lambda: bool(d._collect_once()) or d.admitted_total >= 1, "the holder's result admitted", timeout=20)
    assert d.admitted[1][lease.job].result.token == lease.token
    # the forged ones, each refused before its payload is decoded; nothing dropped the holder's (issue 25, bug 5)
    assert d.dropped == {"stale_lease": 2, "wrong_actor": 1, "wrong_version_hash": 1, "bad_token": 1}, d.dropped

    d.post(2, [Prompt("q", "2+2=", "4", (3, 4))])
    (own,) = d.board.take("a", max_jobs=1, block_s=1)
    d.board.results.submit(own, actor="a", version=0, version_hash="0" * 64, payload=_group(digest="e" * 32))
    wait_for(lambda: bool(d._collect_once()) or d.dropped["wrong_digest"] >= 1, "the holder's bad result read")
    assert own.job in d.leases.pending or d.leases.tokens.get(own.job) not in (None, own.token), (
        "the holder's own unusable result gives its lease up"
    )


@pytest.mark.parametrize("run_id", ["exp:notices", "a b", "{x}", "", "line\nbreak"])
def test_a_run_id_that_could_share_another_runs_keys_is_refused(run_id: str) -> None:
    """Issue 34: run ``exp:notices`` got ``aurora:exp:notices:results``, which is run ``exp``'s notice stream
    of an actor named ``results``. A run id cannot hold the separator of a key's parts."""
    from aurora_store.coord.errors import CoordinationError
    from aurora_store.coord.keyspace import Keyspace

    with pytest.raises(CoordinationError, match="run id must be a non-empty name without spaces, braces or colons"):
        Keyspace("redis://127.0.0.1:1/0", run_id)
