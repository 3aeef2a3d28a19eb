"""The job board on a real redis-server: leases, fencing, admission exactly once, throughput, and the
indexes that let a sweep read only what changed (deadlines, untaken leases)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import JobError
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.lease import Lease, now_ms
from aurora_store.coord.results import INLINE_MAX, Ref, Result
from aurora_store.rl.tasks import Prompt
from aurora_store.testing.processes import wait_for

H0, H1 = "0" * 63 + "a", "1" * 63 + "b"
HASHES = {0: H0, 1: H1}


@pytest.fixture
def board(redis_url: str, run_id: str) -> JobBoard:
    """A board on a fresh Redis server, and one on a Redis Cluster (keys hash-tagged, actor streams sharded)."""
    return JobBoard(Coordinator(redis_url, run_id))


def prompt(i: int) -> dict[str, str]:
    return Prompt(f"p{i}", f"{i}+1=", str(i + 1)).to_dict()


def submit(board: JobBoard, lease: Lease, actor: str, version: int = 0, vhash: str = H0) -> Result:
    board.results.submit(lease, actor=actor, version=version, version_hash=vhash, payload=b"\x00payload\xff")
    return board.results.read("0-0", block_ms=10)[-1]


def test_post_take_submit_admit_once(board: JobBoard) -> None:
    jobs = board.post(1, 0, [prompt(i) for i in range(5)], {"a": 3, "b": 2}, lease_s=30, tag="t")
    assert Counter(jobs.values()) == {"a": 3, "b": 2}
    got = board.take("a", max_jobs=10, block_s=0.1)
    assert [le.prompt for le in got] == [prompt(0), prompt(1), prompt(2)] and all(le.version == 0 for le in got)
    res = submit(board, got[0], "a")
    assert board.admit(res, HASHES) == "ok"
    assert board.admit(res, HASHES) == "duplicate", "a result is admitted once, however often it arrives"
    assert {j.job for j in board.open_jobs()} == set(jobs) - {got[0].job}


def test_reassigned_lease_fences_out_the_old_holder(board: JobBoard) -> None:
    board.post(1, 0, [prompt(0)], {"a": 1}, lease_s=30, tag="t")
    old = board.take("a", max_jobs=1, block_s=0.1)[0]
    board.lease(old.job, "b", version=0, lease_s=30)  # the trainer moved it to b
    new = board.take("b", max_jobs=1, block_s=0.1)[0]
    assert new.token > old.token
    assert board.admit(submit(board, old, "a"), HASHES) == "stale_lease"
    assert board.admit(submit(board, new, "b"), HASHES) == "ok"


def test_revoked_entries_are_not_handed_out(board: JobBoard) -> None:
    board.post(1, 0, [prompt(0)], {"a": 1}, lease_s=30, tag="t")
    board.lease("t:1:0", "b", version=0, lease_s=30)  # re-leased before a took it
    assert board.take("a", max_jobs=5, block_s=0.05) == []
    assert len(board.take("b", max_jobs=5, block_s=0.05)) == 1


def test_expired_wrong_version_and_wrong_hash_are_refused(board: JobBoard) -> None:
    board.post(1, 0, [prompt(0), prompt(1)], {"a": 2}, lease_s=0.05, tag="t")
    late, other = board.take("a", max_jobs=2, block_s=0.1)
    wait_for(lambda: now_ms() > late.deadline_ms, "the 50 ms lease to run out", timeout=5)
    assert board.admit(submit(board, late, "a"), HASHES) == "expired"
    board.lease(other.job, "a", version=0, lease_s=30)
    fresh = board.take("a", max_jobs=1, block_s=0.1)[0]
    assert board.admit(submit(board, fresh, "a", version=1, vhash=H1), HASHES) == "wrong_version"
    assert board.admit(submit(board, fresh, "a", version=0, vhash="f" * 64), HASHES) == "wrong_version_hash"
    assert board.admit(submit(board, fresh, "a"), HASHES) == "ok", "refusals change nothing"


def test_admitted_job_cannot_be_leased_again(board: JobBoard) -> None:
    board.post(1, 0, [prompt(0)], {"a": 1}, lease_s=30, tag="t")
    lease = board.take("a", max_jobs=1, block_s=0.1)[0]
    assert board.admit(submit(board, lease, "a"), HASHES) == "ok"
    assert board.lease(lease.job, "b", version=0, lease_s=30) == 0
    with pytest.raises(JobError):
        board.lease("t:9:9", "b", version=0, lease_s=30)  # unknown job without a prompt


def test_release_hands_the_job_back(board: JobBoard) -> None:
    board.post(1, 0, [prompt(0)], {"a": 1}, lease_s=30, tag="t")
    lease = board.take("a", max_jobs=1, block_s=0.1)[0]
    assert board.release(lease)
    assert board.open_jobs()[0].deadline_ms == 0
    assert board.release(lease) and board.open_jobs()[0].deadline_ms == 0, "a second release changes nothing"
    assert board.admit(submit(board, lease, "a"), HASHES) == "expired"


def test_concurrent_admission_admits_once(board: JobBoard) -> None:
    board.post(1, 0, [prompt(0)], {"a": 1}, lease_s=30, tag="t")
    lease = board.take("a", max_jobs=1, block_s=0.1)[0]
    res = submit(board, lease, "a")
    outcomes: list[str] = []
    threads = [threading.Thread(target=lambda: outcomes.append(board.admit(res, HASHES))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["duplicate"] * 7 + ["ok"]


def test_malformed_results_are_refused(board: JobBoard) -> None:
    good = {"job": "x", "token": "1", "actor": "a", "version": "0", "version_hash": H0}
    sha = "ab" * 32
    ref = {"ref": f"results/{sha}.bin", "sha256": sha, "size": "10", "region": "eu"}
    entries = [
        ({"job": "x", "token": "not-a-number", "actor": "a"}, "bad_token"),
        ({"nothing": "here"}, "bad_job"),
        ({**good}, "bad_payload"),  # neither inline nor a reference
        ({**good, "bin": b"\x00" * (INLINE_MAX + 1)}, "payload_too_large"),
        ({**good, "version": "xyz", "bin": b"x"}, "bad_version"),
        ({**good, "version_hash": "h0", "bin": b"x"}, "bad_version_hash"),
        ({**good, "job": b"\xff\xfe", "bin": b"x"}, "bad_job"),
        ({**good, "actor": "a" * 300, "bin": b"x"}, "bad_actor"),
        ({**good, **ref, "ref": "versions/0000000000/manifest.json"}, "bad_payload"),
        ({**good, **ref, "ref": f"results/{'cd' * 32}.bin"}, "bad_payload"),  # not the object of its hash
        ({**good, **ref, "sha256": "AB" * 32, "ref": f"results/{'AB' * 32}.bin"}, "bad_payload"),
        ({**good, **ref, "size": "-1"}, "bad_size"),
        ({**good, **ref, "region": "e u"}, "bad_region"),
    ]
    for fields, _ in entries:
        board.rb.xadd(board.coord.key("results"), fields)
    results = board.results.read("0-0", block_ms=10, count=100)
    assert [board.admit(r, HASHES) for r in results] == [why for _, why in entries]
    assert all(r.malformed is not None for r in results)
    board.results.discard([r.id for r in results])
    assert board.r.xlen(board.coord.key("results")) == 0, "dropped results leave the stream"


def test_a_payload_goes_inline_or_by_reference(board: JobBoard) -> None:
    board.post(1, 0, [prompt(0), prompt(1)], {"a": 2}, lease_s=30, tag="t")
    first, second = board.take("a", max_jobs=2, block_s=0.1)
    data = bytes(range(256)) * 4
    board.results.submit(first, actor="a", version=0, version_hash=H0, payload=data)
    ref = Ref("eu", f"results/{'ab' * 32}.bin", "ab" * 32, 1234)
    board.results.submit(second, actor="a", version=0, version_hash=H0, ref=ref)
    inline, by_ref = board.results.read("0-0", block_ms=10)
    assert inline.inline == data and inline.ref is None, "bytes come back exactly"
    assert by_ref.ref == ref and by_ref.inline is None
    with pytest.raises(JobError):
        board.results.submit(first, actor="a", version=0, version_hash=H0, payload=data, ref=ref)


def test_reads_of_the_results_stream_are_bounded_in_bytes(board: JobBoard) -> None:
    board.post(1, 0, [prompt(0)], {"a": 1}, lease_s=30, tag="t")
    (lease,) = board.take("a", max_jobs=1, block_s=0.1)
    for _ in range(200):
        board.results.submit(lease, actor="a", version=0, version_hash=H0, payload=b"\x01" * INLINE_MAX)
    got = board.results.read("0-0", block_ms=10)
    assert 0 < sum(len(r.inline or b"") for r in got) <= 4 << 20, "one read returns at most READ_BYTES"


def test_the_sweep_indexes_hold_only_open_leases(board: JobBoard) -> None:
    jobs = board.post(1, 0, [prompt(i) for i in range(4)], {"a": 2, "b": 2}, lease_s=0.05, tag="t")
    assert set(board.untaken()) == set(jobs), "nothing is taken yet"
    taken = board.take("a", max_jobs=2, block_s=0.1)
    assert set(board.untaken()) == set(jobs) - {le.job for le in taken}
    wait_for(lambda: len(board.expired(now_ms())) == 4, "the 50 ms leases to run out", timeout=5)
    board.lease(taken[0].job, "b", version=0, lease_s=30)
    assert taken[0].job not in board.expired(now_ms()), "a new lease moves its deadline on"
    (fresh,) = [le for le in board.take("b", max_jobs=10, block_s=0.1) if le.job == taken[0].job]
    assert board.admit(submit(board, fresh, "b"), HASHES) == "ok"
    assert fresh.job not in board.expired(now_ms()) and fresh.job not in board.untaken(), "admitted: untracked"
    board.drop_jobs(list(jobs))
    assert board.expired(now_ms()) == [] and board.untaken() == {} and board.open_jobs() == []
    assert not any(board.r.exists(board.coord.key("job", j)) for j in jobs), "dropped jobs leave Redis"


def test_a_step_of_leases_is_one_round_trip(redis_server: Any) -> None:
    import redis

    board = JobBoard(Coordinator(redis_server.url, "jobs-test"))
    probe = redis.Redis(port=redis_server.port)
    before = probe.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    board.post(1, 0, [prompt(i) for i in range(300)], {"a": 300}, lease_s=30, tag="t")
    after = probe.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert after - before == 300 and len(board.take("a", max_jobs=500, block_s=0.1)) == 300


def test_inbox_entries_are_deleted_once_taken(board: JobBoard) -> None:
    board.post(1, 0, [prompt(i) for i in range(3)], {"a": 3}, lease_s=30, tag="t")
    assert len(board.take("a", max_jobs=2, block_s=0.1)) == 2
    assert board.r.xlen(board.inbox("a")) == 1
    fresh = JobBoard(board.coord)  # a restarted actor reads its inbox from the start
    assert [le.job for le in fresh.take("a", max_jobs=5, block_s=0.1)] == ["t:1:2"]
    board.r.xadd(board.inbox("a"), {"lease": "no-token-here"})
    board.r.xadd(board.inbox("a"), {"junk": "x"})
    assert fresh.take("a", max_jobs=5, block_s=0.1) == [], "damaged inbox entries are skipped"
    assert board.coord.skipped.counts["bad_inbox"] == 2


def test_a_claim_checks_and_marks_each_job_in_one_step(board: JobBoard) -> None:
    """An actor claims what its listener read from its inbox a while ago (a batch may have run since, or
    the process was paused). Jobs the trainer dropped (trained on) or leased to another meanwhile are not
    this actor's, and claiming them writes nothing. The check and the mark of each job are one script, sent
    in one round trip: a mark after a separate read re-made a dropped job's record (seen in CI as a job
    hash with no step, after an actor was paused between the two)."""
    from bench.fleet.actors import RoundTrips

    board.post(1, 0, [prompt(i) for i in range(3)], {"a": 3}, lease_s=30, tag="t")
    ((_key, entries),) = board.keys.xread({board.inbox("a"): "0-0"})
    board.drop_jobs(["t:1:0"])
    board.lease("t:1:1", "b", version=0, lease_s=30)
    trips = RoundTrips()
    try:
        before = trips.now()
        claimed = board.claim("a", entries)
        sent = trips.now() - before - 1  # each reading of the counter counts itself
    finally:
        trips.close()
    assert [le.job for le in claimed] == ["t:1:2"] and claimed[0].prompt == prompt(2)
    if not board.keys.cluster:  # a cluster's pipeline sends once to each node it touches
        assert sent == 1, "one round trip for the whole claim"
    assert board.r.exists(board._k("job", "t:1:0")) == 0, "a dropped job is not made again"
    assert board.r.hget(board._k("job", "t:1:1"), "taken_token") is None, "b's lease is b's to take"
    assert board.r.hget(board._k("job", "t:1:2"), "taken_token") == str(claimed[0].token)
    assert set(board.untaken()) == {"t:1:1"}
    assert board.r.xlen(board.inbox("a")) == 0, "every entry read is deleted"


def test_long_gone_actors_leave_no_keys(board: JobBoard) -> None:
    board.post(1, 0, [prompt(0)], {"a": 1}, lease_s=30, tag="t")
    board.notices.tell("a", "t:1:0", "expired")
    board.throughputs.report("a", 10, 1.0, beta=0.5)
    board.forget_actors(["a", "bad name"])
    assert not board.r.exists(board.inbox("a"), board.notices.key("a")) and board.throughputs.read()[0] == {}


@pytest.mark.parametrize("bad", ["", "has space", "a|b", "x" * 300, "{a}"])
def test_bad_actor_ids_are_refused(board: JobBoard, bad: str) -> None:
    with pytest.raises(JobError):
        board.take(bad, max_jobs=1, block_s=0.01)


def test_throughput_ema_and_probation(board: JobBoard) -> None:
    assert not board.throughputs.joined("a"), "a new actor is not rejoining"
    assert board.throughputs.report("a", 100, 1.0, beta=0.5) == 100
    assert board.throughputs.report("a", 300, 1.0, beta=0.5) == 200
    assert board.throughputs.joined("a"), "an actor with a measured throughput that registers again is rejoining"
    taus, probation = board.throughputs.read()
    assert taus == {"a": 200} and probation == {"a"}
    board.throughputs.report("a", 200, 1.0, beta=0.5)
    assert board.throughputs.read()[1] == set(), "finishing a batch ends probation"
    with pytest.raises(JobError):
        board.throughputs.report("a", 10, 0.0, beta=0.5)


def test_a_result_too_large_is_refused_before_redis(board: JobBoard) -> None:
    board.post(1, 0, [prompt(0)], {"a": 1}, lease_s=30, tag="t")
    lease = board.take("a", max_jobs=1, block_s=0.1)[0]
    with pytest.raises(JobError):
        board.results.submit(lease, actor="a", version=0, version_hash=H0, payload=b"y" * (INLINE_MAX + 1))
    with pytest.raises(JobError):
        board.results.submit(lease, actor="a", version=0, version_hash=H0)
    assert board.results.read("0-0", block_ms=10) == []


def test_bytes_that_are_not_utf8_are_hostile_input_not_a_crash(board: JobBoard) -> None:
    coord, raw = board.coord, board.rb
    raw.hset(coord.key("workers"), b"w\xff", b'{"role": "actor\xfe"}')
    coord.workers.heartbeat("w\ufffd", 30)
    raw.xadd(coord.key("events", "eu"), {b"type": b"commit\xff", b"version": b"1"})
    raw.xadd(board.inbox("a"), {b"lease": b"t:1:0|\xff"})
    raw.xadd(board.notices.key("a"), {b"reason": b"\xc3\x28"})
    board.post(1, 0, [prompt(0)], {"a": 1}, lease_s=30, tag="t")
    (lease,) = board.take("a", max_jobs=5, block_s=0.1)
    board.results.submit(lease, actor="a", version=0, version_hash=H0, payload=bytes(range(256)))
    assert board.results.last_id() != "0-0", "the stream of binary results reads as ids"
    assert [e.type for e in coord.regions.events("eu", "0-0", block_ms=10)] == ["invalid"]
    assert board.notices.read("a", "0-0") == []
    assert coord.workers.registrations() == {} or all(
        isinstance(d, dict) for d in coord.workers.registrations().values()
    )
    assert coord.skipped.counts["bad_type"] == 1 and coord.skipped.counts["bad_inbox"] == 1
