"""A Redis writer against the trainer's dispatch (issue 25): a registration claiming any throughput,
an actor that hangs behind a beating heartbeat, and forged payload references. Real Redis, real
files (bytes counted by the store's own meter), the real dispatcher; the figures come from
``aurora bench dispatch`` (bench/fleet/dispatch.py), whose scenarios the last test runs small."""

from __future__ import annotations

import secrets
import uuid
from pathlib import Path
from typing import Any

import pytest

from aurora_store.coord.lease import Lease
from aurora_store.format import results as payloads
from aurora_store.testing.processes import wait_for

VHASH = "0" * 64
DIGEST = "d" * 32


def _dispatcher(redis_url: str, *, group: int = 2, tokens: int = 4, store: Any = None, **schedule: Any) -> Any:
    from aurora_store.coord.coordinator import Coordinator
    from aurora_store.coord.jobs import JobBoard
    from aurora_store.rl.sampling import SamplingConfig
    from trainer.config import ScheduleConfig
    from trainer.dispatch import Dispatcher

    coord = Coordinator(redis_url, f"w-{uuid.uuid4().hex[:6]}")
    d = Dispatcher(
        coord,
        JobBoard(coord),
        schedule=ScheduleConfig(**{"lease_s": 30.0, "sweep_s": 0.05, **schedule}),
        sampling=SamplingConfig(group=group, max_new_tokens=tokens),
        vocab_size=64,
        tag="t",
        stores={} if store is None else {"home": store},
    )
    d.published_version(0, VHASH, DIGEST)
    return d


def _actor(d: Any, wid: str, tau: float = 1000.0) -> None:
    d.coord.workers.register("actor", "home", worker_id=wid, ttl_s=60)
    d.coord.workers.update(wid, version=0)
    d.board.throughputs.report(wid, tau, 1.0, beta=0.5)


def _group(n: int = 2, tokens: int = 2) -> bytes:
    comp = ([5] * (tokens - 1) + [1], [-0.5] * tokens, "stop", 1.0)
    return payloads.encode([comp] * n, failures={}, weights_digest=DIGEST)


def _prompts(n: int, step: int = 1) -> list[Any]:
    from aurora_store.rl.tasks import Prompt

    return [Prompt(f"p{step}-{i}", f"{i}+1=", str(i + 1), (3, 4)) for i in range(n)]


def _held(d: Any, actor: str) -> int:
    return sum(a == actor for a in d.leases.holder.values())


def _serve(d: Any, actor: str) -> None:
    """``actor`` takes what is leased to it and submits a good result for each (an honest actor)."""
    for lease in d.board.take(actor, max_jobs=64, block_s=0):
        d.board.results.submit(lease, actor=actor, version=0, version_hash=VHASH, payload=_group())


# ---------------------------------------------------------------- bug 3: one fake actor starves training


def test_a_registration_claiming_any_throughput_gets_no_more_than_the_fleet_and_is_backed_off(
    redis_server: Any,
) -> None:
    """Issue 25, bug 3: a registration claiming 1e12 tokens/s that never takes a job took every job of
    every step (0 of 16 admitted in 40 s, 304 leases lost). Its report now counts for no more than the
    fleet's; throughput is measured from admitted work; a lease that expires backs its holder off."""
    # leases long enough that the honest actor, which submits as soon as it takes, never loses one on a
    # loaded machine (every lost lease is then the fake's); a backoff that outlasts the rest of step 1
    d = _dispatcher(redis_server.url, lease_s=3.0, backoff_s=6.0, steal=False)
    _actor(d, "a")
    _actor(d, "fake", tau=1e12)
    d.post(1, _prompts(16))
    assert _held(d, "fake") <= 8, f"a self-report is a first estimate, never above the fleet's: {d.leases.holder}"

    def step_done(step: int) -> bool:
        _serve(d, "a")
        d._collect_once()
        return len(d.admitted[step]) == 16

    wait_for(lambda: step_done(1), "step 1 admitted with a fake registration", timeout=20)
    assert {a.actor for a in d.admitted[1].values()} == {"a"}
    assert 1 <= d.dropped["lease_lost"] <= 8, "the fake's leases expired once, then went to the actor that works"
    pacing = d.leases.pacing
    assert pacing.rate("a") is not None and pacing.rate("fake") is None, "measured from admitted work only"
    assert pacing.backed_off("fake") and pacing.struck("fake")
    d.collect(1)

    d.post(2, _prompts(16, step=2))
    assert _held(d, "fake") == 0, "backed off: no new lease"
    wait_for(lambda: step_done(2), "step 2 admitted")
    d.collect(2)
    wait_for(lambda: not pacing.backed_off("fake"), "the fake's backoff over", timeout=15)
    d.post(3, _prompts(16, step=3))
    assert _held(d, "fake") == 1, "after its backoff, one job at a time until it delivers"
    wait_for(lambda: step_done(3), "step 3 admitted")
    assert d.dropped["lease_lost"] <= 9


def test_a_registration_whose_pushed_jobs_move_before_it_starts_one_is_backed_off(redis_server: Any) -> None:
    """With stealing on (the default) the fake's unstarted jobs move to an idle actor after
    ``UNPROVEN_STEAL_S``, long before a lease expires: that move backs it off as an expiry would, so the
    next steps lease it nothing. (It got its share of every step again, and every step waited the
    0.5 s: ``aurora bench dispatch``'s fake scenario ran steps of 0.91 s against 0.27 s fault-free.)"""
    d = _dispatcher(redis_server.url, lease_s=30.0, backoff_s=30.0)
    _actor(d, "a")
    _actor(d, "fake", tau=1e12)
    pacing = d.leases.pacing
    for step in (1, 2, 3):
        d.post(step, _prompts(16, step=step))
        if step > 1:
            assert _held(d, "fake") == 0, f"step {step}: backed off, it gets no lease"

        def done(step: int = step) -> bool:
            _serve(d, "a")
            d._collect_once()
            return len(d.admitted[step]) == 16

        wait_for(done, f"step {step} admitted", timeout=20)
        assert {a.actor for a in d.admitted[step].values()} == {"a"}
        d.collect(step)
        assert pacing.backed_off("fake") and not pacing.proven("fake")
    assert d.dropped.get("lease_lost", 0) == 0, "moved before any lease expired"


def test_the_share_split_caps_any_actor_and_backoff_doubles_until_a_result() -> None:
    from aurora_store.coord.schedule import capped_split
    from trainer.pacing import Pacing

    assert capped_split(16, {"a": 1.0, "b": 3.0}, caps={"a": 8, "b": 8}) == {"a": 8, "b": 8}
    assert capped_split(16, {"a": 1.0, "b": 1.0, "c": 1.0}, caps={"b": 1}, hard={"b"}) == {"a": 8, "b": 1, "c": 7}
    assert capped_split(5, {"a": 1.0, "b": 1.0}, caps={"a": 1, "b": 1}, hard={"b"}) == {"a": 4, "b": 1}
    assert sum(capped_split(7, {"a": 2.0, "b": 1.0}, caps={"a": 1, "b": 1}, hard={"a", "b"}).values()) == 7

    now = [0.0]
    p = Pacing(backoff_s=2.0, sweep_s=0.25, clock=lambda: now[0])
    assert p.taus({"a": 1e12, "b": 100.0, "c": None}) == {"a": 100.0, "b": 100.0, "c": None}
    p.observe(["b"])
    now[0] = 10.0
    p.observe(["b"])
    p.credit("b", 500)
    assert p.rate("b") == pytest.approx(50.0, rel=0.05) and p.taus({"a": 1e12, "b": 1e12}) == {"a": 50.0, "b": 50.0}
    for wait in (2.0, 4.0, 8.0):
        p.strike("a")
        p.strike("a")  # leases expiring together are one strike
        assert p.backed_off("a")
        now[0] += wait - 0.01
        assert p.backed_off("a")
        now[0] += 0.02
        assert not p.backed_off("a")
    p.credit("a", 10)
    assert not p.struck("a") and p.proven("a")


# ---------------------------------------------------------------- weak spot: a hung actor whose heartbeat beats


def test_an_actor_whose_leases_expire_under_a_beating_heartbeat_gets_no_new_work(redis_server: Any) -> None:
    """Issue 25, weak spot: a hung actor whose heartbeat thread still beats kept its share of every
    step, and every lease it got expired (1.1 s steps became 8.4 s with a 2 s lease). Liveness now
    follows progress: its heartbeat does not extend a lease, and once one expires it gets no new work
    while others can take it."""
    d = _dispatcher(redis_server.url, lease_s=0.5, backoff_s=30.0, steal=False)
    _actor(d, "a")
    _actor(d, "hung")
    d.post(1, _prompts(8))
    assert _held(d, "hung") == 4
    hung = d.board.take("hung", max_jobs=64, block_s=0)  # it starts its jobs, then hangs
    assert len(hung) == 4

    def beat_and_collect() -> bool:
        d.coord.workers.heartbeat("hung", 60)  # its heartbeat thread goes on
        _serve(d, "a")
        d._collect_once()
        return d.dropped["lease_lost"] >= 4

    wait_for(beat_and_collect, "the hung actor's leases expire despite its heartbeat", timeout=10)
    assert "hung" in d.coord.workers.alive(), "alive by its heartbeat"
    assert _held(d, "hung") == 0, f"its expired jobs go to the actor that delivers: {d.leases.holder}"
    wait_for(lambda: beat_and_collect() and len(d.admitted[1]) == 8, "step 1 admitted")
    assert {a.actor for a in d.admitted[1].values()} == {"a"}
    d.collect(1)
    d.post(2, _prompts(8, step=2))
    assert _held(d, "hung") == 0, "no new work while it made no progress"
    for lease in hung:  # it wakes up late: its results are refused, nothing is taken from the holder
        d.board.results.submit(lease, actor="hung", version=0, version_hash=VHASH, payload=_group())
    wait_for(lambda: beat_and_collect() and len(d.admitted[2]) == 8, "step 2 admitted")
    assert d.dropped["stale_lease"] + d.dropped["duplicate"] == 4


def test_a_started_job_of_an_unproven_holder_is_taken_over_when_overdue_not_after_its_lease(redis_server: Any) -> None:
    """A hung engine behind a beating heartbeat that joined late (nothing of it admitted yet) starts its
    jobs and never answers: its step used to wait a whole lease (30 s here). Once a job runs OVERDUE
    times the fleet's usual job (at least half a second), an idle proven actor takes it over, and the
    hung actor is backed off."""
    from trainer.leasing import FIRST_SAMPLES

    d = _dispatcher(redis_server.url, lease_s=30.0, steal_after_s=0.3, backoff_s=30.0)
    _actor(d, "a")
    n = FIRST_SAMPLES + 1  # a's first job is no sample: it was not proven yet
    d.post(1, _prompts(n))
    wait_for(lambda: (_serve(d, "a"), d._collect_once(), len(d.admitted[1]))[-1] == n, "step 1")
    assert d.leases.takeover_s() is not None
    d.collect(1)
    _actor(d, "hung")
    d.post(2, _prompts(8, step=2))
    assert _held(d, "hung") >= 1
    hung = d.board.take("hung", max_jobs=64, block_s=0)  # it starts its jobs, then hangs

    def collect() -> bool:
        d.coord.workers.heartbeat("hung", 60)  # its heartbeat thread goes on
        _serve(d, "a")
        d._collect_once()
        return len(d.admitted[2]) == 8

    wait_for(collect, "step 2 admitted, the hung actor's jobs taken over", timeout=20)
    assert {a.actor for a in d.admitted[2].values()} == {"a"} and d.leases.stolen >= len(hung)
    assert d.leases.pacing.backed_off("hung") and d.dropped["lease_lost"] == 0


def test_every_overdue_job_of_a_hung_holder_moves_at_once(redis_server: Any) -> None:
    """The overdue jobs of a hung holder are dealt over the idle actors in one sweep, not one per idle
    actor per sweep: the step then waits one takeover and one batch (``aurora bench dispatch``'s hung
    scenario: its first step from 1.93 to 1.12 s)."""
    from trainer.leasing import FIRST_SAMPLES

    d = _dispatcher(redis_server.url, lease_s=30.0, backoff_s=30.0)
    _actor(d, "a")
    n = FIRST_SAMPLES + 1
    d.post(1, _prompts(n))
    wait_for(lambda: (_serve(d, "a"), d._collect_once(), len(d.admitted[1]))[-1] == n, "step 1")
    d.collect(1)
    _actor(d, "hung")
    d.post(2, _prompts(12, step=2))
    hung = d.board.take("hung", max_jobs=64, block_s=0)  # it starts its jobs, then hangs
    assert len(hung) >= 3

    def moved() -> bool:
        _serve(d, "a")
        d._collect_once()
        return _held(d, "hung") < len(hung)

    wait_for(moved, "the hung actor's jobs taken over", timeout=20)
    assert _held(d, "hung") == 0 and d.leases.stolen == len(hung), "all of them in the sweep that took one"
    wait_for(lambda: moved() or len(d.admitted[2]) == 12, "step 2 admitted")


# ---------------------------------------------------------------- bug 5: payloads fetched before any check


def _counting_store(tmp_path: Path) -> tuple[Any, dict[str, int]]:
    from aurora_store.bucket.objectstore import ObjectStore

    store = ObjectStore((tmp_path / "home").as_uri())
    read = {"download": 0, "upload": 0}

    def meter(direction: str, n: int) -> None:
        read[direction] += n

    store.meter = meter
    return store, read


def _drain(d: Any) -> None:
    while d.coord.r.xlen(d.board.results.key):
        d._collect_once()


def test_no_payload_is_fetched_before_its_job_lease_and_token_check(redis_server: Any, tmp_path: Path) -> None:
    """Issue 25, bug 5: 60 references to one 8 MiB object read 503 MB, and 40 for jobs that do not
    exist read 671 MB: payloads were fetched before any check. Now only a result naming one of the
    trainer's open jobs, its holder and its token is fetched, at most once a lease."""
    from aurora_store.bucket.results import put_payload
    from aurora_store.coord.results import Ref

    store, read = _counting_store(tmp_path)
    d = _dispatcher(redis_server.url, group=8, tokens=131072, store=store)  # 8 MiB is a size a job may return
    _actor(d, "a")
    d.post(1, _prompts(1))
    (lease,) = d.board.take("a", max_jobs=1, block_s=1)
    big = secrets.token_bytes(8 << 20)
    key, sha = put_payload(store, big)
    ref = Ref("home", key, sha, len(big))
    submit = d.board.results.submit
    for i in range(60):
        submit(Lease(lease.job, lease.token + 1 + i, 1, 0, 0, {}), actor="a", version=0, version_hash=VHASH, ref=ref)
    for i in range(40):
        submit(Lease(f"t:1:{100 + i}", 7, 1, 0, 0, {}), actor="a", version=0, version_hash=VHASH, ref=ref)
    for i in range(40):
        submit(Lease(f"x:{i}", 7, 1, 0, 0, {}), actor="mallory", version=0, version_hash=VHASH, ref=ref)
    read["download"] = 0
    _drain(d)
    assert read["download"] == 0, "nothing read for results no lease asked for"
    assert d.dropped == {"stale_lease": 60, "unknown_job": 80}, d.dropped
    assert d.leases.holds(lease.job, "a", lease.token), "and the lease stays with its holder"

    # a writer who reads the token from Redis (no fleet key): at most one fetch for the lease
    for _ in range(60):
        submit(lease, actor="a", version=0, version_hash=VHASH, ref=ref)
    _drain(d)
    assert read["download"] <= len(big) + 1, f"{read['download']} bytes read for one lease"
    good = _group(8, 100)
    key, sha = put_payload(store, good)
    # the unusable result gave the lease up: it is leased again at the next sweep
    wait_for(lambda: bool(d._collect_once()) or lease.job not in d.leases.pending, "the job leased again")
    (again,) = d.board.take("a", max_jobs=1, block_s=1)
    submit(again, actor="a", version=0, version_hash=VHASH, ref=Ref("home", key, sha, len(good)))
    wait_for(lambda: bool(d._collect_once()) or d.admitted_total == 1, "the holder's result admitted")


def test_the_bytes_fetched_for_a_step_are_bounded(redis_server: Any, tmp_path: Path) -> None:
    """Issue 25, bug 5: a step's fetches stay within ``fetch_per_job`` x its jobs x the largest payload
    a job returns; a reference past it is dropped unread, and one larger than a job can return too."""
    from aurora_store.bucket.results import put_payload
    from aurora_store.coord.results import Ref

    store, read = _counting_store(tmp_path)
    d = _dispatcher(redis_server.url, group=2, tokens=4, store=store, fetch_per_job=1.0)
    most = payloads.payload_size(2, 8)
    assert d.payloads.max_bytes == most
    _actor(d, "a")
    d.post(1, _prompts(2))
    first, second = d.board.take("a", max_jobs=2, block_s=1)
    key, sha = put_payload(store, secrets.token_bytes(most))
    junk = Ref("home", key, sha, most)  # the largest payload a job returns, undecodable
    key, sha = put_payload(store, secrets.token_bytes(most + 1))
    huge = Ref("home", key, sha, most + 1)
    read["download"] = 0

    def send(lease: Lease, ref: Ref) -> Lease | None:
        """The holder's own result; the lease it holds next for that job, if the result gave it up."""
        d.board.results.submit(lease, actor="a", version=0, version_hash=VHASH, ref=ref)
        _drain(d)
        wait_for(lambda: bool(d._collect_once()) or lease.job not in d.leases.pending, "a sweep")
        got = d.board.take("a", max_jobs=1, block_s=0.2)
        return got[0] if got else None

    again = send(first, junk)  # fetched: the budget is 2 jobs x 1 payload
    assert again is not None and again.job == first.job
    again = send(again, junk)
    assert again is not None
    assert read["download"] == 2 * most and d.dropped["bad_payload"] == 2
    assert send(second, junk) is None, "over the step's budget: dropped unread, the lease stays"
    assert d.dropped["fetch_budget"] == 1 and d.leases.holds(second.job, "a", second.token)
    send(again, huge)
    assert d.dropped["payload_too_large"] == 1, "larger than a job returns: never read"
    assert read["download"] == 2 * most, d.dropped


# ---------------------------------------------------------------- the bench's scenarios, small


@pytest.mark.slow
def test_the_dispatch_bench_holds_training_up_under_each_writer_fault() -> None:
    from bench.fleet import dispatch

    cfg = dispatch.Config(seconds=6.0, steps=4, lease_s=1.0, prompts=8)
    out = dispatch.measure(cfg)
    fake, hung, forged, refs = (out[k]["with_fault"] for k in ("fake", "hung", "forged", "refs"))
    assert fake["admitted"] >= 8 * 2 and fake["leases_lost"] <= 8 + 4, fake
    assert hung["steps_done"] == 4, hung
    assert forged["steps_done"] >= 2, forged
    assert refs["bytes_read"] <= (8 << 20) + 1 and out["refs"]["fault_free"]["admitted"] == 1, refs
