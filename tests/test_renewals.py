"""Leases renewed by their holder while its jobs run (``JobBoard.renew``, ``actor.renewals``), on a real
redis-server: fenced by token and holder, never past the trainer's hold, never for a lease given back,
admitted or moved; hostile job records are left alone; an idle renewer sends nothing."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from actor.renewals import Renewer
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.jobs import MAX_RENEW_MS, JobBoard
from aurora_store.coord.lease import Lease
from aurora_store.coord.results import Result
from aurora_store.rl.tasks import Prompt
from aurora_store.testing.processes import wait_for

H0 = "0" * 63 + "a"


@pytest.fixture
def board(redis_server: Any) -> JobBoard:
    return JobBoard(Coordinator(redis_server.url, "renew-test"))


def one(board: JobBoard, *, lease_s: float = 30, hold_s: float = 3600) -> Lease:
    board.post(1, 0, [Prompt("p", "1+1=", "2").to_dict()], {"a": 1}, lease_s=lease_s, tag="t", hold_s=hold_s)
    return board.take("a", max_jobs=1, block_s=0.1)[0]


def deadline(board: JobBoard, lease: Lease) -> tuple[int, int]:
    """The job's deadline in its record and in the sweep's index."""
    rec = int(board.r.hget(board.keys.key("job", lease.job), "deadline_ms") or -1)
    score = board.r.zscore(board.keys.key("deadlines"), lease.job)
    return rec, -1 if score is None else int(score)


def test_a_renewal_moves_the_deadline_on_by_the_time_given_in_the_record_and_the_index(board: JobBoard) -> None:
    lease = one(board)
    assert board.renew([(lease.job, lease.token, "a", 1500)]) == [lease.deadline_ms + 1500]
    assert deadline(board, lease) == (lease.deadline_ms + 1500, lease.deadline_ms + 1500)
    assert board.r.hget(board.keys.key("job", lease.job), "renewals") == "1"
    assert board.renew([(lease.job, lease.token, "a", MAX_RENEW_MS * 10)]) == [
        lease.deadline_ms + 1500 + MAX_RENEW_MS
    ], "capped"


def test_only_the_holder_under_its_token_renews(board: JobBoard) -> None:
    lease = one(board)
    forged = Lease(lease.job, lease.token + 1, lease.step, lease.version, lease.deadline_ms, lease.prompt)
    assert board.renew([(lease.job, lease.token, "b", 1000), (forged.job, forged.token, "a", 1000)]) == [0, 0]
    board.lease(lease.job, "b", version=0, lease_s=30)  # moved to b: a's token is stale
    assert board.renew([(lease.job, lease.token, "a", 1000)]) == [0]
    assert deadline(board, lease)[0] <= lease.deadline_ms + 30_000


def test_no_renewal_past_the_hold_nor_of_a_lease_given_back_or_admitted(board: JobBoard) -> None:
    lease = one(board, lease_s=10, hold_s=12)
    hold = board.renew([(lease.job, lease.token, "a", 60_000)])[0]
    assert 0 < hold <= lease.deadline_ms + 2_000 + 50, "not past the trainer's hold"
    assert board.renew([(lease.job, lease.token, "a", 1000)]) == [0], "at its hold it is not renewed"
    released = one(board)
    board.release(released)
    assert board.renew([(released.job, released.token, "a", 1000)]) == [0] and deadline(board, released) == (0, 0)
    admitted = one(board)
    board.results.submit(admitted, actor="a", version=0, version_hash=H0, payload=b"\x00p")
    res: Result = board.results.read("0-0", block_ms=10)[-1]
    assert board.admit(res, {0: H0}) == "ok"
    assert board.renew([(admitted.job, admitted.token, "a", 1000)]) == [0]
    assert board.r.zscore(board.keys.key("deadlines"), admitted.job) is None, "an admitted job is not tracked again"


def test_a_lease_the_trainer_stopped_tracking_is_not_tracked_again(board: JobBoard) -> None:
    lease = one(board)
    board.settle([lease.job])
    assert board.renew([(lease.job, lease.token, "a", 1000)]) == [0]
    assert deadline(board, lease) == (lease.deadline_ms, -1)


@pytest.mark.parametrize(
    "record",
    [
        {"deadline_ms": "soon"},
        {"hold_until_ms": "later"},
        {"deadline_ms": "-5"},
        {"state": "admitted"},
    ],
)
def test_hostile_job_records_are_not_renewed(board: JobBoard, record: dict[str, str]) -> None:
    lease = one(board)
    board.r.hset(board.keys.key("job", lease.job), mapping=record)
    before = board.r.hgetall(board.keys.key("job", lease.job))
    assert board.renew([(lease.job, lease.token, "a", 1000)]) == [0]
    assert board.r.hgetall(board.keys.key("job", lease.job)) == before


def test_a_lease_of_an_older_trainer_without_a_hold_is_not_renewed(board: JobBoard) -> None:
    lease = one(board)
    board.r.hdel(board.keys.key("job", lease.job), "hold_until_ms")
    assert board.renew([(lease.job, lease.token, "a", 1000)]) == [0]


def test_the_renewer_keeps_its_leases_until_the_trainer_is_done_with_them(board: JobBoard) -> None:
    lease = one(board, lease_s=0.6)
    renewer = Renewer(board, "a")
    assert renewer.period_s() is None and renewer.renew() == 0, "holding nothing, it sends nothing"
    renewer.hold([lease])
    period = renewer.period_s()
    assert period is not None and period <= 0.2, "a third of what the lease had left"
    stop = threading.Event()
    thread = threading.Thread(target=renewer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: renewer.renewed >= 3, "three renewals", 60)
        assert deadline(board, lease)[0] > lease.deadline_ms
        board.release(lease)
        wait_for(lambda: renewer.held == [], "the lease given back to be let go", 60)
    finally:
        stop.set()
        renewer.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_a_busy_renewer_keeps_the_leases_waiting_in_its_inbox_too(board: JobBoard) -> None:
    prompts = [Prompt(f"p{i}", "1+1=", "2").to_dict() for i in range(3)]
    board.post(1, 0, prompts, {"a": 3}, lease_s=30, tag="t")
    running = board.take("a", max_jobs=1, block_s=0.1)
    waiting = {j: t for j, t in board.queued("a")}
    assert len(running) == 1 and len(waiting) == 2 and running[0].job not in waiting
    before = {j: deadline(board, Lease(j, t, 1, 0, 0, {}))[0] for j, t in waiting.items()}
    renewer = Renewer(board, "a")
    renewer.hold(running)

    def moved() -> bool:
        after = {j: deadline(board, Lease(j, t, 1, 0, 0, {}))[0] for j, t in waiting.items()}
        return all(after[j] > before[j] for j in waiting)

    wait_for(lambda: renewer.renew() == 3 and moved(), "the running lease and the two waiting moved on", 30)
    board.r.hset(board.keys.key("job", running[0].job), "state", "admitted")
    assert renewer.renew() == 2 and renewer.held == [], "the lease done with is let go"
    assert renewer.renew() == 0, "holding nothing, it renews nothing (it takes what waits when it is free)"


def test_renewals_work_on_the_embedded_server() -> None:
    from aurora_store.coord.embedded import EmbeddedRedis

    with EmbeddedRedis() as server:
        board = JobBoard(Coordinator(server.url, "renew-embedded"))
        lease = one(board)
        assert board.renew([(lease.job, lease.token, "a", 700)]) == [lease.deadline_ms + 700]
        assert board.queued("a") == []
        board.close()


def test_a_submitted_lease_is_no_longer_renewed(board: JobBoard) -> None:
    lease = one(board)
    renewer = Renewer(board, "a")
    renewer.hold([lease])
    stale = Lease(lease.job, lease.token - 1, lease.step, lease.version, lease.deadline_ms, lease.prompt)
    renewer.done(stale)
    assert renewer.held == [lease.job], "only the lease under its own token is let go"
    renewer.done(lease)
    assert renewer.held == [] and renewer.renew() == 0, "submitted: the trainer has a lease's time to admit it"
