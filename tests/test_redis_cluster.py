"""Issue 41: Redis Cluster URLs, the run's key layout over a cluster's slots, and the client made on first
use, on a real 3-master cluster."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from aurora_store.coord.clients import parse_cluster
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.keyspace import SHARDS, shard_of, shard_tags
from aurora_store.testing.redis_cluster import RedisCluster


def test_cluster_urls_name_seeds_credentials_and_tls() -> None:
    t = parse_cluster("rediss+cluster://ops:p%40ss@10.0.0.1:7000,[::1]:7001/0?ssl_cert_reqs=none")
    assert t.nodes == (("10.0.0.1", 7000), ("::1", 7001)) and t.tls
    assert (t.username, t.password, dict(t.options)) == ("ops", "p@ss", {"ssl_cert_reqs": "none"})
    t = parse_cluster("redis+cluster://:secret@h:1")
    assert (t.username, t.password, t.tls) == (None, "secret", False)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+cluster://", "host:port"),
        ("redis+cluster://h", "host:port"),
        ("redis+cluster://h:0", "host:port"),
        ("redis+cluster://h:99999", "host:port"),
        ("redis+cluster://h:1,,h:2", "host:port"),
        ("redis+cluster://:pw@h:1/3", "database 0"),
        ("redis+cluster://h:1?password=x", "unknown option"),
        ("redis+cluster://:hunter2@h:x", "host:port"),
        ("redis+cluster://h:\u00b2", "host:port"),  # a digit to str.isdigit, not to int()
        ("redis+cluster://h:\uff11\uff12", "host:port"),
    ],
)
def test_bad_cluster_urls_are_refused_by_name_without_the_password(url: str, why: str) -> None:
    with pytest.raises(CoordinationError, match=why) as err:
        Coordinator(url, "exp")
    assert "hunter2" not in str(err.value) and "password=x" not in str(err.value)


@given(st.text(max_size=200))
def test_any_text_after_the_scheme_is_a_cluster_or_a_coordination_error(rest: str) -> None:
    try:
        t = parse_cluster("redis+cluster://" + rest)
    except CoordinationError:
        return
    assert t.nodes and all(0 < p < 65536 and h for h, p in t.nodes)


def test_shard_slots_are_spread_evenly_and_an_actors_streams_share_one() -> None:
    run = f"r-{uuid.uuid4().hex[:6]}"
    slots = [key_slot(tag.encode()) for tag in shard_tags(run)]
    bounds = [k * REDIS_CLUSTER_HASH_SLOTS // SHARDS for k in range(SHARDS + 1)]
    assert all(bounds[k] <= s < bounds[k + 1] for k, s in enumerate(slots)), "shard k in the k-th range of slots"
    board = JobBoard(Coordinator("redis+cluster://127.0.0.1:1", run))  # nothing is sent: made on first use
    for actor in ("a", "actor-eu-7", "x" * 100):
        keys = [board.inbox(actor), board.notices.key(actor), board.coord.regions.commits_key("eu", actor)]
        keys.append(board.coord.workers.alive_key(actor))
        assert len({key_slot(k.encode()) for k in keys}) == 1, "one XREAD, and the beat sent with it, read one slot"
        assert key_slot(keys[0].encode()) == slots[shard_of(actor)]
    control = {key_slot(board.coord.key(*p).encode()) for p in [("job", "t:1:0"), ("fence",), ("workers",), ("epoch",)]}
    assert len(control) == 1, "the control keys share one slot"
    used = {shard_of(f"actor-{i}") for i in range(1000)}
    assert len(used) == SHARDS, "a fleet spreads over every shard"


def test_an_unreachable_cluster_fails_the_first_command_not_the_constructor() -> None:
    coord = Coordinator("redis+cluster://127.0.0.1:1", "exp")
    with pytest.raises(CoordinationError, match="127.0.0.1:1"):
        coord.ping()


def test_a_cluster_run_spreads_its_actor_streams_over_the_masters(redis_cluster: RedisCluster) -> None:
    run = f"r-{uuid.uuid4().hex[:6]}"
    coord = Coordinator(redis_cluster.url, run)
    board = JobBoard(coord)
    actors = [f"a{i}" for i in range(30)]
    coord.regions.commit("eu", 1, "a" * 64, "full")
    board.post(1, 1, [{"q": str(i)} for i in range(30)], dict.fromkeys(actors, 1), lease_s=30, tag="t")
    masters = {redis_cluster.master_of(board.inbox(a)).port for a in actors}
    assert len(masters) == 3, "the inboxes of 30 actors live on every master"
    for a in actors:
        coord.workers.register("actor", "eu", worker_id=a, ttl_s=30)
    assert {redis_cluster.master_of(coord.workers.alive_key(a)).port for a in actors} == masters, "so do their beats"
    assert coord.workers.alive() == set(actors), "who is alive is read from every shard"
    coord.workers.unregister("a29")
    assert coord.workers.alive() == set(actors[:29]) and "a29" not in coord.workers.registrations(alive_only=False)
    for a in actors:
        (lease,) = board.take(a, max_jobs=5, block_s=1)
        assert lease.step == 1
        got = coord.read_streams({coord.regions.commits_key("eu", a): "0-0"}, block_ms=10)
        assert [f["version"] for _, f in next(iter(got.values()))] == ["1"], "each shard has the commit"
    coord.workers.update("a0", version=1)
    coord.regions.commit("us", 1, "b" * 64, "full")
    in_use, unreadable = coord.versions_in_use()
    assert in_use == {"actor a0 in eu": 1, "region eu": 1, "region us": 1} and not unreadable, "gc's scan finds all"
