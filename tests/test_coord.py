"""Coordination on a real redis-server and on the embedded server: one behaviour, one code path."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.embedded import EmbeddedRedis
from aurora_store.coord.errors import CoordinationError
from aurora_store.format.manifest import Segment
from aurora_store.testing.processes import free_port, wait_for, wait_until_answers
from aurora_store.testing.redis_server import RedisServer


@pytest.fixture(params=["redis-server", "embedded", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "embedded":
        with EmbeddedRedis() as server:
            yield server.url
    elif request.param == "cluster":
        yield request.getfixturevalue("redis_cluster").url
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield server.url


def test_versions_advance_atomically_and_never_back(redis_url: str) -> None:
    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    assert c.regions.version("eu") is None
    assert c.regions.commit("eu", 3, "a" * 64, "delta")
    assert not c.regions.commit("eu", 2, "b" * 64, "delta")  # stale: ignored, no event
    assert not c.regions.commit("eu", 3, "c" * 64, "delta")
    rv = c.regions.version("eu")
    assert rv is not None and (rv.version, rv.version_hash) == (3, "a" * 64)
    events = c.regions.events("eu", "0-0", block_ms=10)
    assert [(e.type, e.version) for e in events] == [("commit", 3)]


def test_a_region_key_of_another_type_is_a_damaged_entry_not_a_redis_failure(redis_url: str) -> None:
    """Anyone who can write Redis may leave a string where a region's hash belongs: every reader of the
    region's version (an actor's updater, its listener on a cluster, gc) counts it and goes on."""
    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    assert c.regions.commit("us", 2, "a" * 64, "full")
    c.r.set(c.regions.version_key("eu"), "junk")
    assert c.regions.version("eu") is None
    assert c.skipped.counts["bad_region"] == 1
    held, unreadable = c.versions_in_use()
    assert held == {"region us": 2}
    assert unreadable == ["region 'eu': its version entry is damaged"]


def test_announcements_wake_waiting_workers(redis_url: str) -> None:
    import threading

    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    after = c.regions.last_event_id("home")
    seg = Segment("versions/0000000004/00000-" + "0" * 32 + ".seg", 123, "f" * 64)
    writer = threading.Timer(0.2, c.regions.announce, args=("home", 4, seg))
    writer.start()
    t0 = time.monotonic()
    events = c.regions.events("home", after, block_ms=5000)
    woke = time.monotonic() - t0
    writer.join()  # its reply too, before the server goes away
    assert woke < 4, "a blocked reader wakes on the announcement, not on its timeout"
    assert [(e.type, e.version, e.fields["key"], e.fields["size"]) for e in events] == [("segment", 4, seg.key, "123")]


def test_workers_register_heartbeat_and_expire(redis_url: str) -> None:
    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    a = c.workers.register("actor", "eu", ttl_s=0.3, info={"gpu": "A10"})
    b = c.workers.register("relay", "eu", ttl_s=30)
    c.workers.update(a, version=7)
    assert c.workers.registrations()[a] == {**c.workers.registrations()[a], "role": "actor", "gpu": "A10", "version": 7}
    wait_for(lambda: a not in c.workers.registrations(), "the heartbeat to expire", 10)
    assert b in c.workers.registrations() and a in c.workers.registrations(alive_only=False)
    c.report(b, "eu", 7, "s3://x/versions/0000000007/a.seg", "sha256 mismatch")
    assert [r["object"] for r in c.reports()] == ["s3://x/versions/0000000007/a.seg"]


def test_password_protected_redis() -> None:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--requirepass", "s3cret"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ok = Coordinator(f"redis://:s3cret@127.0.0.1:{port}/0", "exp")
        wait_until_answers(ok.ping, proc, "redis-server", errors=(CoordinationError,), timeout=20)
        assert ok.regions.commit("home", 0, "a" * 64, "full")
        with pytest.raises(CoordinationError) as err:
            Coordinator(f"redis://:wrong@127.0.0.1:{port}/0", "exp").ping()
        assert "wrong" not in str(err.value), "passwords never appear in errors"
    finally:
        proc.kill()
        proc.wait(10)


def test_bad_urls_and_unreachable_servers() -> None:
    with pytest.raises(CoordinationError, match="run id"):
        Coordinator("redis://127.0.0.1:1/0", "has space")
    with pytest.raises(CoordinationError, match="bad Redis URL"):
        Coordinator("http://nope", "exp")
    with pytest.raises(CoordinationError, match="127.0.0.1:1"):
        Coordinator("redis://127.0.0.1:1/0", "exp").ping()


def test_the_roster_reads_only_what_changed(redis_url: str) -> None:
    from aurora_store.coord.roster import Roster

    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    ids = [c.workers.register("actor", "eu", worker_id=f"a{i}", ttl_s=30) for i in range(50)]
    roster = Roster(c)
    first = roster.refresh()
    # one round trip a refresh (what changed, on the control slot, and who died, from the alive sets, in
    # one pipeline), and one more when workers join (their expiries)
    assert first.reloaded and first.joined == set(ids) and roster.round_trips == 2
    quiet = roster.refresh()
    assert not (quiet.joined or quiet.gone or quiet.reloaded) and roster.round_trips == 3
    c.workers.update("a3", version=7)
    assert roster.refresh().joined == set() and roster.docs["a3"]["version"] == 7, "an update is read, alone"
    short = c.workers.register("actor", "eu", worker_id="short", ttl_s=0.2)
    assert roster.refresh().joined == {short}
    wait_for(lambda: short in roster.refresh().gone or short not in roster.docs, "its heartbeat to expire", 10)
    n = roster.round_trips
    assert c.workers.heartbeat(short, 30) is False, "a late beat brings it back (Redis kept its state)"
    assert roster.refresh().joined == {short}
    c.workers.unregister("a0")
    assert roster.refresh().gone == {"a0"}
    c.r.hset(c.key("workers"), "a5", "{not json")
    c.workers.update("a6", version=1)  # marks a6 changed; a5's damage is seen when a5 changes
    c.r.zadd(c.key("roster"), {"a5": 10**9})
    assert "a5" in roster.refresh().gone and c.skipped.counts["registration_not_json"] == 1
    assert roster.round_trips == n + 4, "one round trip a refresh, one more for the one that came back"


def test_the_roster_reloads_when_redis_loses_its_state(redis_url: str) -> None:
    from aurora_store.coord.roster import Roster

    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    for i in range(5):
        c.workers.register("actor", "eu", worker_id=f"a{i}", ttl_s=30)
    roster = Roster(c)
    roster.refresh()
    c.r.flushall()
    c.workers.register("actor", "eu", worker_id="b", ttl_s=30)
    got = roster.refresh()
    assert got.reloaded and set(roster.docs) == {"b"} and got.gone == {f"a{i}" for i in range(5)}


def test_a_beat_says_when_the_registration_is_gone(redis_url: str) -> None:
    from aurora_store.coord.roster import Roster

    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    a = c.workers.register("actor", "eu", ttl_s=0.1)
    assert c.workers.heartbeat(a, 0.1) is False
    roster = Roster(c, prune_after_s=0.1)
    wait_for(lambda: a in roster.refresh().pruned, "the worker, dead 0.1 s past its beat, to be pruned", 10)
    assert c.workers.registrations(alive_only=False) == {}
    assert c.workers.heartbeat(a, 30) is True and c.epoch.lost(), "the worker learns its state is gone"
    c.workers.register("actor", "eu", worker_id=a, ttl_s=30)
    assert c.workers.heartbeat(a, 30) is False and a in c.workers.registrations()


def test_a_cheap_beat_is_one_zadd_and_falls_back_to_the_full_beat_when_it_must(redis_url: str) -> None:
    """Issue 41: a beat is one ZADD whose score is the deadline on Redis's clock (reckoned from the
    offset the last full beat measured); the full beat's two scripts run for the first beat, for a beat
    that may come after the expiry (the roster must see the worker back) and when the ZADD finds no
    entry (Redis lost its state: the beat says so)."""
    from aurora_store.coord.roster import Roster
    from aurora_store.coord.workers import MARGIN_S, Beat

    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    a = c.workers.register("actor", "eu", ttl_s=30)
    beat = Beat(c.workers, a, 30)
    assert beat() is False and (beat.fulls, beat.cheaps) == (1, 0), "the first beat measures Redis's clock"
    # the node that holds its expiry (the actor's shard's, on a cluster)
    server = c.r.get_redis_connection(c.r.get_node_from_key(c.workers.alive_key(a))) if c.keys.cluster else c.r

    def stats() -> dict[str, int]:  # calls by command (the embedded server has no INFO: nothing to count)
        try:
            got = server.info("commandstats")
        except redis.ResponseError:
            return {}
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in got.items()}

    before = stats()
    for _ in range(3):
        assert beat() is False
    after = stats()
    assert beat.cheaps == 3
    if before:
        assert after["zadd"] == before.get("zadd", 0) + 3, "one ZADD a beat"
        assert after.get("evalsha", 0) == before.get("evalsha", 0), "and no script"

    def redis_ms() -> int:
        sec, usec = server.time()
        return int(sec) * 1000 + int(usec) // 1000

    # the deadline is on Redis's clock: between its clock before and after the beat, plus the lifetime
    # (to within the offset's error), however long a loaded machine takes between the calls
    t0 = redis_ms()
    assert beat() is False and beat.cheaps == 4
    t1 = redis_ms()
    expiry = c.r.zscore(c.workers.alive_key(a), a)
    assert expiry is not None and t0 + 30_000 - MARGIN_S * 1000 < expiry < t1 + 30_000 + MARGIN_S * 1000
    # a beat that may come after its expiry is full: the roster sees the worker back
    short = c.workers.register("actor", "eu", worker_id="short", ttl_s=0.2)
    late = Beat(c.workers, short, 0.2)
    late()
    roster = Roster(c)
    roster.refresh()
    wait_for(lambda: short not in roster.refresh().joined and short not in roster.docs, "its expiry", 10)
    full = late.fulls
    late.ttl_ms = 30_000
    assert late() is False and late.fulls == full + 1
    assert short in roster.refresh().joined, "back, as the full beat marks it"
    # Redis lost its state: the ZADD finds no entry, and the full beat says the state is gone
    c.r.flushall()
    assert beat() is True and c.epoch.lost()


def test_commits_wake_a_blocked_actor_once_per_version(redis_url: str) -> None:
    import threading

    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    seg = Segment("versions/0000000001/00000-" + "0" * 32 + ".seg", 1, "f" * 64)
    for _ in range(5):
        c.regions.announce("eu", 1, seg)  # segments go to the relays' stream only
    writer = threading.Timer(0.2, c.regions.commit, args=("eu", 1, "a" * 64, "delta"))
    writer.start()
    t0 = time.monotonic()
    got = c.read_streams({c.regions.commits_key("eu"): "0-0"}, block_ms=5000)
    woke = time.monotonic() - t0
    writer.join()  # the commit's reply may still be on its way when the reader wakes: not after teardown
    assert woke < 4, "woken by the commit, not by the timeout"
    (entries,) = got.values()
    assert [(f["type"], f["version"]) for _, f in entries] == [("commit", "1")]


def test_the_listener_hears_commits_and_the_regions_word_replaces_a_hostile_event(redis_url: str) -> None:
    """Issue 41: the stager follows the version the listener heard (commit events, and its own look at
    the region every --check-s). A commit event anyone wrote with a version from nowhere is believed only
    until the next look, where the region's own version replaces it; a malformed one is counted, skipped."""
    import threading

    from actor.wakeups import Wakeups

    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    c.regions.commit("eu", 3, "a" * 64, "full")
    wake = Wakeups(c, "a1", "eu", block_s=0.2)
    wake.look_every_s = 6.0  # long enough to see the planted event believed before the look corrects it
    stop = threading.Event()
    t = threading.Thread(target=wake.run, args=(stop,), daemon=True)
    t.start()
    try:
        wait_for(lambda: wake.committed == 3, "the listener's first look", 10)
        commits = c.regions.commits_key("eu", "a1")  # the stream a1 blocks on (its shard's copy on a cluster)
        c.r.xadd(commits, {"type": "commit", "version": "not-a-number"})
        c.r.xadd(commits, {"type": "commit", "version": str(10**9)})
        wait_for(lambda: wake.committed == 10**9, "the planted event, heard", 10)
        wait_for(lambda: wake.committed == 3, "the next look: the region's word", 10)
        c.regions.commit("eu", 4, "b" * 64, "delta")
        wait_for(lambda: wake.committed == 4, "a real commit, heard", 10)
        assert sum(c.skipped.counts.values()) >= 1, "the malformed event was counted"
    finally:
        stop.set()
        t.join(5)


def test_the_listener_beats_in_its_reads_round_trip_and_says_when_its_state_is_gone(redis_url: str) -> None:
    """Issue 41: an idle actor wakes Redis once a beat: its cheap beat (one ZADD) goes in the same round
    trip as its blocking read, to the node of its shard. Counted where redis-py sends: every send of the
    listener's thread is one of its reads, a full beat's two scripts, or its first look at the stream's
    end (and, on a cluster, its look at the region's version, on the control slot). When Redis lost its
    state, the beat's ZADD finds no entry, the full beat says so, and the listener tells the actor."""
    import threading

    import redis.connection

    from actor.wakeups import Wakeups
    from aurora_store.coord.jobs import JobBoard
    from aurora_store.coord.workers import Beat

    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    c.regions.commit("eu", 1, "a" * 64, "full")
    a = c.workers.register("actor", "eu", worker_id="a1", ttl_s=1.5)
    beat = Beat(c.workers, a, 1.5)
    assert beat() is False  # a full beat (its scripts loaded: redis-py's first call of one takes three sends)
    lost = threading.Event()
    wake = Wakeups(c, a, "eu", block_s=30, board=JobBoard(c), beat=beat, beat_every_s=0.3, on_lost=lost.set)
    wake.look_every_s = 1000.0  # one look, at the start
    sends: list[str] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counted(conn: object, command: object, check_health: bool = True) -> None:
        if threading.current_thread().name == "listener":
            sends.append(str(command)[:80])
        return original(conn, command, check_health)  # type: ignore[arg-type]

    redis.connection.AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    stop = threading.Event()
    t = threading.Thread(target=wake.run, args=(stop,), name="listener", daemon=True)
    try:
        t.start()
        wait_for(lambda: beat.cheaps >= 5, "five cheap beats", 30)
        stop.set()
        c.regions.commit("eu", 2, "b" * 64, "delta")  # wakes the read it blocks in now
        t.join(10)
        assert not t.is_alive()
        looks = 1 if c.keys.cluster else 0  # on one server the look rides in the read's round trip
        fulls = beat.fulls - 1
        assert len(sends) == wake.round_trips + 2 * fulls + 1 + looks, "\n".join(sends)
        assert c.r.zscore(c.workers.alive_key(a), a) is not None
    finally:
        redis.connection.AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
        stop.set()
    # Redis lost its state: the next beat's ZADD finds no entry; the full beat sees the epoch gone
    stop = threading.Event()
    t = threading.Thread(target=wake.run, args=(stop,), name="listener", daemon=True)
    t.start()
    try:
        wait_for(lambda: beat.cheaps >= 6, "a cheap beat again", 30)
        c.r.flushall()
        wait_for(lost.is_set, "the listener to say this actor's state is gone", 30)
    finally:
        stop.set()
        c.regions.commit("eu", 3, "c" * 64, "delta")
        t.join(10)


def test_a_region_key_of_another_type_does_not_stop_the_listener(redis_url: str) -> None:
    """Bad input read from Redis: the region's version key set to a string (anyone who can write Redis
    may do it). The listener's look counts it and goes on: its beat still lands and its read still hears
    the region's commits (the look rides in the read's round trip on one server)."""
    import threading

    from actor.wakeups import Wakeups
    from aurora_store.coord.jobs import JobBoard
    from aurora_store.coord.workers import Beat

    c = Coordinator(redis_url, f"run-{uuid.uuid4().hex[:6]}")
    c.r.set(c.regions.version_key("eu"), "junk")
    a = c.workers.register("actor", "eu", worker_id="a1", ttl_s=1.5)
    beat = Beat(c.workers, a, 1.5)
    wake = Wakeups(c, a, "eu", block_s=30, board=JobBoard(c), beat=beat, beat_every_s=0.3)
    wake.look_every_s = 0.3  # a look with every read
    stop = threading.Event()
    t = threading.Thread(target=wake.run, args=(stop,), daemon=True)
    t.start()
    try:
        wait_for(lambda: c.skipped.counts["bad_region"] >= 2 and beat.cheaps >= 2, "looks counted, beats landing", 30)
        assert wake.committed is None
        c.regions.commit("eu", 5, "a" * 64, "full")  # replaces the junk, and its event wakes the read
        wait_for(lambda: wake.committed == 5, "the commit, heard", 30)
    finally:
        stop.set()
        c.regions.commit("eu", 6, "b" * 64, "delta")
        t.join(10)
