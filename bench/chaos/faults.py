"""The fault injector of ``aurora bench chaos``: a seeded injector of every fault kind of
`bench.chaos.schedule`.

`Faults` draws each fault's target from the schedule's `random.Random`, remembers every byte it damaged
and every result it forged, and puts the storage back before the final checks. Partitions go through
the region's `bench.chaos.gates.Gates`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from aurora_store.format import signing
from aurora_store.format.keys import manifest_key
from aurora_store.format.manifest import canonical
from bench.chaos.bucket import Bucket
from bench.chaos.gates import TRAINER_GATE, Gates


def _scrape(port: int) -> bool | None:
    """Whether a real scrape of ``port`` is answered 200 within 10 s; None: refused (the trainer is
    restarting), which says nothing about the endpoint."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return bool(resp.status == 200)
    except ConnectionRefusedError:
        return None
    except urllib.error.URLError as exc:
        return None if isinstance(exc.reason, ConnectionRefusedError) else False
    except OSError:
        return False


class Roles(Protocol):
    """What the injector needs of the supervisor."""

    def names(self, role: str) -> list[str]: ...
    def kill(self, name: str, sig: int, *, restart: bool) -> bool: ...
    def spawn_actor(self, region: str, slowdown: float | None = None) -> str: ...
    def region_of(self, name: str) -> str: ...
    def signal(self, name: str, sig: int) -> bool: ...


@dataclass(slots=True)
class Timer:
    due: float
    what: str
    fn: Callable[[], object]


@dataclass(slots=True)
class Faults:
    """Injects faults of every kind into the world; every target drawn from ``rng``."""

    rng: Any
    roles: Roles
    buckets: dict[str, Bucket]
    gates: Gates
    redis: Any
    """The `aurora_store.testing.redis_server.RedisServer`."""
    run_id: str
    group: int
    """Completions per prompt (a forged result has as many)."""
    record: Callable[[dict[str, Any]], None]
    """Called with every fault and every restore, as they happen (the run's event log)."""
    injected: Counter[str] = field(default_factory=Counter)
    forged_results: list[dict[str, str]] = field(default_factory=list)
    kills: list[dict[str, Any]] = field(default_factory=list)
    """Every kill that a moment was waited for, as it landed (target, moment, what it saw, committed...)."""
    timers: list[Timer] = field(default_factory=list)
    trainer_env: dict[str, str] = field(default_factory=dict)
    """The trainer's environment (its `bench.chaos.supervisor.Proc`'s, read at every restart): a rotation
    puts the key to rotate to there, and the key it rotated to once that committed."""
    metrics_port: int | None = None
    """The trainer's /metrics port."""
    scrapes: list[dict[str, Any]] = field(default_factory=list)
    """Each garbage scrape and whether the endpoint answered a real scrape after it."""
    rotations: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextlib.contextmanager
    def _r(self) -> Iterator[Any]:
        import redis

        r = redis.Redis(port=self.redis.port, decode_responses=True, socket_timeout=5)
        try:
            yield r
        finally:
            r.close()

    def _k(self, *parts: str) -> str:
        return ":".join(("aurora", self.run_id, *parts))

    def later(self, delay: float, what: str, fn: Callable[[], object]) -> None:
        with self._lock:
            self.timers.append(Timer(time.monotonic() + delay, what, fn))

    def tick(self, *, everything: bool = False) -> None:
        """Run the timers that are due (all of them with ``everything``): heals, restores, departures."""
        with self._lock:
            due = [t for t in self.timers if everything or t.due <= time.monotonic()]
            self.timers = [t for t in self.timers if t not in due]
        for t in sorted(due, key=lambda t: t.due):
            t.fn()
            self.record({"event": "undo", "what": t.what})

    def inject(self, kind: str, rng: Any = None) -> dict[str, Any]:
        """Inject one fault of ``kind``, its targets drawn from ``rng`` when given (a planned fault's own,
        `bench.chaos.schedule.Planned`) and from then on; returns what was done (``skipped`` when there
        was no target)."""
        if rng is not None:
            self.rng = rng
        try:
            doc = getattr(self, kind)()
        except Exception as exc:  # a fault that could not be placed is noted, never fatal to the run
            doc = {"skipped": f"{type(exc).__name__}: {exc}"[:300]}
        doc = {"event": "fault", "kind": kind, **doc}
        if "skipped" not in doc:
            self.injected[kind] += 1
        self.record(doc)
        return doc

    # ------------------------------------------------------------ processes

    def _watch(self, stream: str, want: Callable[[dict[str, str]], bool], timeout: float) -> dict[str, str] | None:
        """Block until an entry of ``stream`` posted from now on satisfies ``want``; None on timeout."""
        after, end = "$", time.monotonic() + timeout
        with self._r() as r:
            while time.monotonic() < end:
                with contextlib.suppress(Exception):
                    for _s, entries in r.xread({self._k(*stream.split(":")): after}, block=200, count=100) or []:
                        for eid, f in entries:
                            after = eid
                            if want(f):
                                return dict(f)
        return None

    def _kill_when(self, name: str, doc: dict[str, Any], wait: Callable[[], dict[str, str] | None] | None) -> None:
        """SIGKILL ``name`` once ``wait()`` returns (at once without one), on a thread of its own; for the
        trainer, say whether the version whose event it waited for was committed, and its state saved,
        when it died."""

        def go() -> None:
            seen = wait() if wait is not None else None
            killed = self.roles.kill(name, signal.SIGKILL, restart=True)
            out: dict[str, Any] = {"event": "kill", "target": name, "moment": doc.get("moment"), "killed": killed}
            if seen is not None:
                out["seen"] = {k: seen.get(k) for k in ("type", "version")}
                if name == "trainer" and seen.get("version", "").isdigit():
                    time.sleep(0.5)
                    v = int(seen["version"])
                    out["committed"] = self.buckets["home"].exists(manifest_key(v))
                    out["state_saved"] = self.buckets["home"].has_state(v)
            self.kills.append(out)
            self.record(out)

        threading.Thread(target=go, name=f"kill {name}", daemon=True).start()

    def _after(
        self, stream: str, kind: str, timeout: float, delay: float = 0.0, newer: int = -1
    ) -> Callable[[], dict[str, str] | None]:
        """A wait for the next ``kind`` event of ``stream`` of a version above ``newer``, then ``delay`` s."""

        def want(f: dict[str, str]) -> bool:
            v = f.get("version", "")
            return f.get("type") == kind and v.isdigit() and int(v) > newer

        def wait() -> dict[str, str] | None:
            seen = self._watch(stream, want, timeout)
            time.sleep(delay)
            return seen

        return wait

    def _generating(self, actor: str) -> dict[str, str] | None:
        """Wait (8 s at most) until ``actor`` holds a lease it has taken and not answered: it is generating."""
        end = time.monotonic() + 8
        with self._r() as r:
            while time.monotonic() < end:
                with contextlib.suppress(Exception):
                    for job in r.smembers(self._k("open")):
                        h = r.hmget(self._k("job", job), "actor", "state", "token", "taken_token")
                        if h[0] == actor and h[1] == "leased" and h[2] is not None and h[2] == h[3]:
                            return {"type": "generating", "job": job}
                time.sleep(0.05)
        return None

    def kill_actor(self) -> dict[str, Any]:
        name = self.rng.choice(self.roles.names("actor"))
        moment, delay = self.rng.choice(["any", "generating", "fetching"]), self.rng.uniform(0, 0.3)
        waits = {
            "any": None,
            "generating": lambda: self._generating(name),
            "fetching": self._after(f"events:{self.roles.region_of(name)}", "commit", 15, delay),
        }
        doc = {"target": name, "moment": moment}
        self._kill_when(name, doc, waits[moment])
        return doc

    def kill_relay(self) -> dict[str, Any]:
        """Mid-copy: just after a segment was announced at home."""
        name = self.rng.choice(self.roles.names("relay"))
        doc = {"target": name, "moment": "copying"}
        self._kill_when(name, doc, self._after("events:home", "segment", 15, self.rng.uniform(0, 0.1)))
        return doc

    def kill_trainer(self) -> dict[str, Any]:
        """At any moment, mid-commit (its next version's first segment is announced: the manifest is not
        written yet) or just after a commit (while it saves its state)."""
        names = self.roles.names("trainer")
        if not names:
            return {"skipped": "no trainer running"}
        moment = self.rng.choice(["any", "mid_commit", "after_commit"])
        want = {"mid_commit": "segment", "after_commit": "commit"}.get(moment)
        doc = {"target": names[0], "moment": moment}
        latest = max(self.buckets["home"].versions(), default=-1)  # not a re-announced old commit
        self._kill_when(names[0], doc, self._after("events:home", want, 20, newer=latest) if want else None)
        return doc

    def trainer_kill_before_state(self) -> dict[str, Any]:
        """SIGKILL the trainer the instant its next version's commit is announced, with no delay: the
        moment a trainer that saved its state after the commit would lose it. A single-process
        trainer commits a version only once its state is saved, so it must resume exactly (or, for a
        version whose state was not due, --state-every above 1, declare its rollback)."""
        names = self.roles.names("trainer")
        if not names:
            return {"skipped": "no trainer running"}
        doc = {"target": names[0], "moment": "before_state"}
        latest = max(self.buckets["home"].versions(), default=-1)  # not a re-announced old commit
        self._kill_when(names[0], doc, self._after("events:home", "commit", 20, newer=latest))
        return doc

    def slow_actor(self) -> dict[str, Any]:
        region = self.rng.choice(list(self.buckets))
        name = self.roles.spawn_actor(region, slowdown=self.rng.choice([200.0, 400.0]))
        stay = self.rng.uniform(20, 40)
        self.later(stay, f"{name} leaves", lambda: self.roles.kill(name, signal.SIGTERM, restart=False))
        return {"target": name, "stays_s": round(stay, 1)}

    def pause_actor(self) -> dict[str, Any]:
        """A preempted host: SIGSTOP (no heartbeat, no progress), SIGCONT some seconds later."""
        name = self.rng.choice(self.roles.names("actor"))
        hold = self.rng.uniform(5, 15)
        self.roles.signal(name, signal.SIGSTOP)
        self.later(hold, f"{name} resumes", lambda: self.roles.signal(name, signal.SIGCONT))
        return {"target": name, "seconds": round(hold, 1)}

    def actor_join(self) -> dict[str, Any]:
        if len(self.roles.names("actor")) >= 10:
            return {"skipped": "enough actors"}
        return {"target": self.roles.spawn_actor(self.rng.choice(list(self.buckets)))}

    def actor_leave(self) -> dict[str, Any]:
        names = self.roles.names("actor")
        if len(names) <= 2:
            return {"skipped": "too few actors to let one go"}
        name = self.rng.choice(names)
        self.roles.kill(name, signal.SIGTERM, restart=False)
        return {"target": name}

    # ------------------------------------------------------------ Redis

    def redis_restart(self) -> dict[str, Any]:
        self.redis.restart()
        return {"port": self.redis.port}

    def redis_flush(self) -> dict[str, Any]:
        self.redis.flushall()
        return {}

    def partition(self) -> dict[str, Any]:
        free = sorted(r for r, mode in self.gates.mode.items() if mode is None and r != TRAINER_GATE)
        if not free:
            return {"skipped": "every region is partitioned"}
        region, mode = self.rng.choice(free), self.rng.choice(["refuse", "hang"])
        hold = self.rng.uniform(2, 6)
        self.gates.partition(region, mode)
        self.later(hold, f"heal {region}", lambda: self.gates.partition(region, None))
        return {"target": region, "mode": mode, "seconds": round(hold, 1)}

    def forged_result(self) -> dict[str, Any]:
        """A result no actor of the run submitted: a made-up job, or a real open job answered under
        the wrong version hash, with a digest of no version (``impersonate``: three times in a row, in
        its holder's name), or in the name of another actor."""
        variants = ["made_up", "wrong_hash", "wrong_digest", "wrong_actor", "impersonate"]
        with self._r() as r:
            jobs = sorted(r.smembers(self._k("open")))
            job = self.rng.choice(jobs) if jobs else None
            h = r.hgetall(self._k("job", job)) if job else {}
            variant = self.rng.choice(variants if h else ["made_up"])
            version = h.get("version", "0")
            m = json.loads(self.buckets["home"].get(manifest_key(int(version))))
            sent = []
            for _ in range(3 if variant == "impersonate" else 1):
                digest = self.rng.randbytes(32).hex() if variant in ("wrong_digest", "impersonate") else None
                comp = {"tokens": [3], "logprobs": [-0.1], "finish": "length", "reward": 1.0}
                payload = {"completions": [comp] * self.group, "weights_digest": digest or m["weights_digest"]}
                fields = {
                    "job": job if job and variant != "made_up" else f"forged:{self.rng.randrange(10**6)}:0",
                    "token": h.get("token", "") if variant != "made_up" else str(self.rng.randrange(1, 10**9)),
                    "actor": "forger" if variant in ("made_up", "wrong_actor") else h.get("actor", "forger"),
                    "version": version,
                    "version_hash": self.rng.randbytes(32).hex() if variant == "wrong_hash" else m["version_hash"],
                    "payload": json.dumps(payload),
                }
                r.xadd(self._k("results"), fields)
                forged = {k: fields[k] for k in ("job", "token", "actor", "version", "version_hash")}
                sent.append({**forged, "weights_digest": payload["weights_digest"]})
        self.forged_results += sent
        return {"variant": variant, **sent[0], "copies": len(sent)}

    def forged_flood(self) -> dict[str, Any]:
        """A Redis writer floods the results stream for some seconds, 16 entries a second, each under the
        name and fencing token of a real open job's holder (read from Redis, as anyone who can write
        there can) but with a wrong version hash or a damaged payload. Each used to take the lease
        from its holder, whose real result was then dropped as stale (issue 25, bug 1)."""
        seconds = self.rng.uniform(4, 8)
        rng = random.Random(self.rng.random())  # the flood's own draws: the schedule's stay seeded

        def flood() -> None:
            end = time.monotonic() + seconds
            with self._r() as r:
                while time.monotonic() < end:
                    jobs = sorted(r.smembers(self._k("open")))
                    for job in rng.sample(jobs, min(len(jobs), 4)):
                        h = r.hgetall(self._k("job", job))
                        if not h.get("actor"):
                            continue
                        fields = {
                            "job": job,
                            "token": h.get("token", ""),
                            "actor": h["actor"],
                            "version": h.get("version", "0"),
                            "version_hash": rng.randbytes(32).hex(),
                            "payload": rng.choice(["{", json.dumps({"completions": [], "ref": "results/none"})]),
                        }
                        r.xadd(self._k("results"), fields)
                        with self._lock:
                            self.forged_results.append(
                                {k: fields[k] for k in ("job", "token", "actor", "version", "version_hash")}
                            )
                    time.sleep(0.25)

        threading.Thread(target=flood, name="forged flood", daemon=True).start()
        return {"seconds": round(seconds, 1), "per_s": 16}

    def inflated_registration(self) -> dict[str, Any]:
        """A registration in an actor's form that claims 10^12 tokens/s and never takes a job, kept
        eligible for some seconds (it beats and says it holds home's latest version, as an attacker's
        script would) (issue 25, bug 3: the trainer gave it every prompt and waited out every lease)."""
        from aurora_store.coord.coordinator import Coordinator

        region = self.rng.choice(list(self.buckets))
        stay = self.rng.uniform(15, 30)
        wid = f"actor-{region}-inflated"

        def pose() -> None:
            coord = Coordinator(self.redis.url, self.run_id)
            end = time.monotonic() + stay
            try:
                coord.workers.register("actor", region, ttl_s=2.0, worker_id=wid)
                while time.monotonic() < end:
                    with contextlib.suppress(Exception):  # Redis may be restarting: try again next beat
                        versions = self.buckets["home"].versions()
                        if versions:
                            m = json.loads(self.buckets["home"].get(manifest_key(versions[-1])))
                            coord.workers.update(wid, version=versions[-1], version_hash=m["version_hash"])
                        coord.call(coord.r.hset, coord.key("tau"), wid, repr(1e12))
                        coord.workers.heartbeat(wid, ttl_s=2.0)
                    time.sleep(0.3)
            finally:
                coord.close()

        threading.Thread(target=pose, name="inflated registration", daemon=True).start()
        return {"target": wid, "stays_s": round(stay, 1), "claims_tokens_per_s": 1e12}

    def forged_retention(self) -> dict[str, Any]:
        """An unsigned retention record in a region's bucket that retires the next versions, before they
        exist (issue 25, bug 7: relays skipped real versions and audits passed); removed later."""
        region = self.rng.choice(list(self.buckets))
        b = self.buckets[region]
        latest = max(b.versions(), default=0)
        created = int(time.time() * 1000)
        doc = {"format": "aurora-retention/1", "created_ms": created, "retired": [[latest + 1, latest + 50]]}
        data = (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()
        key = f"retention/{created:013d}-{hashlib.sha256(data).hexdigest()[:32]}.json"
        b.put(key, data)
        hold = self._hold()
        self.later(hold, f"{region}: forged retention record removed", lambda: b.put(key, None))
        return {"target": region, "retires": [latest + 1, latest + 50], "removed_after_s": round(hold, 1)}

    def malformed_event(self) -> dict[str, Any]:
        region = self.rng.choice(list(self.buckets))
        variants: list[dict[str, str]] = [
            {"type": "commit"},
            {"type": "commit", "version": "xyz", "version_hash": "0" * 64},
            {"type": "segment", "version": "3"},
            {"type": "segment", "version": "1", "key": "../../../etc/passwd", "size": "10", "sha256": "0" * 64},
            {"type": "commit", "version": "99999999", "version_hash": "1" * 64, "kind": "delta"},
            {"version": "-5", "junk": "\x00\xff"},
        ]
        i = self.rng.randrange(len(variants))
        with self._r() as r:
            r.xadd(self._k("events", region), variants[i])
        return {"target": region, "variant": i}

    def hostile_entry(self) -> dict[str, Any]:
        variant = self.rng.choice(["registration", "throughput", "region_version"])
        with self._r() as r:
            if variant == "registration":
                r.hset(self._k("workers"), "evil{x}", "[not a registration")
            elif variant == "throughput":
                r.hset(self._k("tau"), self.rng.choice(self.roles.names("actor")), "nan")
            else:
                r.hset(self._k("region", self.rng.choice(sorted(self.buckets))), "version", "xyz")
        return {"variant": variant}

    def forged_notice(self) -> dict[str, Any]:
        """Three notices that an actor's own latest results were refused (``revoked``), added to its notice
        stream by someone who can write Redis: unsigned, or with a signature of the right shape by no key
        of the run (issue 34, bug 4: the actor stopped for good, rc 3). It acts only on notices it verifies."""
        actors = self.roles.names("actor")
        if not actors:
            return {"skipped": "no actor is running"}
        actor = self.rng.choice(actors)
        with self._r() as r:
            mine = [eid for eid, f in r.xrevrange(self._k("results"), count=200) if f.get("actor") == actor][:3]
            results = mine + [f"{int(time.time() * 1000)}-{i}" for i in range(3 - len(mine))]
            signed = self.rng.random() < 0.5
            for result in results:
                fields = {"job": f"forged:{self.rng.randrange(10**6)}:0", "reason": "revoked", "result": result}
                if signed:
                    fields.update(key_id=self.rng.randbytes(8).hex(), sig="A" * 86 + "==")
                r.xadd(self._k("notices", actor), fields)
        return {"target": actor, "results": results, "of_its_own": len(mine), "junk_signature": signed}

    def garbage_scrape(self) -> dict[str, Any]:
        """Bytes no HTTP client sends, to the trainer's /metrics (issue 34, bug 6: one request ended the
        server thread and every later scrape hung); a real scrape follows, on a thread of its own."""
        variants = [
            b"GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=a.b\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),
            b"GET /" + b"A" * 70000 + b" HTTP/1.1\r\n\r\n",
            b"POST /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        ]
        i = self.rng.randrange(len(variants))
        port = self.metrics_port
        if port is None:
            return {"skipped": "the trainer serves no /metrics"}

        def go() -> None:
            out: dict[str, Any] = {"variant": i}
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    sock.sendall(variants[i])
                    with contextlib.suppress(OSError):
                        sock.recv(256)
            except OSError as exc:  # refused: the trainer is restarting, nothing was sent
                out["sent"] = f"not sent: {exc}"[:120]
                self.scrapes.append(out)
                return
            out["answered"] = _scrape(port)
            self.scrapes.append(out)
            self.record({"event": "scrape", **out})

        threading.Thread(target=go, name="garbage scrape", daemon=True).start()
        return {"target": f"127.0.0.1:{port}", "variant": i}

    # ------------------------------------------------------------ the trainer's storage and key

    def trainer_storage_outage(self) -> dict[str, Any]:
        """The trainer alone loses home's bucket for some seconds (new connections refused or held, open
        ones dropped): its publishes and state saves fail, it holds back what it cannot save, and it
        stops with a clear error only if saves keep failing (a restart resumes)."""
        if self.gates.mode.get(TRAINER_GATE) is not None:
            return {"skipped": "the trainer's storage is already cut"}
        mode, hold = self.rng.choice(["refuse", "hang"]), self.rng.uniform(2, 8)
        self._cut_trainer(mode, hold)
        return {"mode": mode, "seconds": round(hold, 1)}

    def _cut_trainer(self, mode: str, hold: float) -> None:
        self.gates.partition(TRAINER_GATE, mode)
        self.later(hold, "heal the trainer's storage", lambda: self.gates.partition(TRAINER_GATE, None))

    def rotate_key(self) -> dict[str, Any]:
        """A key rotation under storage errors: the trainer is restarted with a new key to rotate to while
        its storage is cut for a few seconds; readers holding the run's first key follow it (issue 34). A
        second rotation waits for the first to commit (the trainer is then told the new key alone)."""
        if self.rotations and not self._rotated(self.rotations[-1]["to"]):
            return {"skipped": "the last rotation has not committed yet"}
        if self.rotations:
            self.trainer_env["AURORA_SIGNING_KEY"] = self.trainer_env.pop("AURORA_ROTATE_SIGNING_KEY")
        private, public = signing.generate_keypair()
        to = signing.key_id(signing.load_verify_key(public))
        self.trainer_env["AURORA_ROTATE_SIGNING_KEY"] = private.decode()
        self.rotations.append({"to": to})
        mode, hold = self.rng.choice(["refuse", "hang"]), self.rng.uniform(1, 4)
        if self.gates.mode.get(TRAINER_GATE) is None:
            self._cut_trainer(mode, hold)
        killed = self.roles.kill("trainer", signal.SIGKILL, restart=True)
        return {"to": to, "storage": mode, "seconds": round(hold, 1), "trainer_killed": killed}

    def _rotated(self, key_id: str) -> bool:
        """Whether home's latest version is signed by ``key_id`` (the rotation to it committed)."""
        versions = self.buckets["home"].versions()
        if not versions:
            return False
        doc = json.loads(self.buckets["home"].get(manifest_key(versions[-1])))
        return bool((doc.get("run") or {}).get("signed_by") == key_id)

    # ------------------------------------------------------------ storage

    def _damage(self, b: Bucket, key: str, data: bytes | None, restore_s: float) -> None:
        """Put ``data`` at ``key`` (delete it for None) and put the original back ``restore_s`` later."""
        b.damage(key, data)
        self.later(restore_s, f"restore {b.region}/{key}", lambda: b.restore(key))

    def _pick_version(self, b: Bucket, first: int = 0) -> int:
        """One of the last three versions (what readers fetch now) or of the chain from the latest full
        version on (what every actor that starts or falls behind reads)."""
        versions = [v for v in b.versions() if v >= first]
        if not versions:
            raise LookupError(f"no committed version >= {first} in {b.region}")
        chain = versions[-3:]
        if self.rng.random() < 0.5:
            for i in range(len(versions) - 1, -1, -1):
                if json.loads(b.get(manifest_key(versions[i]))).get("kind") == "full":
                    chain = versions[i:]
                    break
        return int(self.rng.choice(chain))

    def _segment_fault(self, how: str) -> dict[str, Any]:
        """Flip a byte of, truncate or delete one segment (or shard, or index) of a version readers need."""
        b = self.buckets[self.rng.choice(list(self.buckets))]
        v = self._pick_version(b)
        m = json.loads(b.get(manifest_key(v)))
        keys = [s["key"] for s in m.get("segments", [])] + ([m["index"]["key"]] if m.get("index") else [])
        if not keys:
            raise LookupError(f"version {v} in {b.region} has no segments")
        key = self.rng.choice(keys)
        data = b.get(key)
        at = self.rng.randrange(len(data))
        bad = {"corrupt": data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1 :], "truncate": data[:at], "delete": None}
        self._damage(b, key, bad[how], self._hold())
        return {"target": f"{b.region}/{key}", "at": at if how != "delete" else None}

    def corrupt_segment(self) -> dict[str, Any]:
        return self._segment_fault("corrupt")

    def truncate_segment(self) -> dict[str, Any]:
        return self._segment_fault("truncate")

    def delete_segment(self) -> dict[str, Any]:
        return self._segment_fault("delete")

    def replay_manifest(self) -> dict[str, Any]:
        b = self.buckets[self.rng.choice(list(self.buckets))]
        v = self._pick_version(b, first=1)
        old = self.rng.randrange(v)
        self._damage(b, manifest_key(v), b.get(manifest_key(old)), self._hold())
        return {"target": f"{b.region}/{manifest_key(v)}", "replayed": old}

    def forge_manifest(self) -> dict[str, Any]:
        b = self.buckets[self.rng.choice(list(self.buckets))]
        v = self._pick_version(b)
        doc = json.loads(b.get(manifest_key(v)))
        change = self.rng.choice(["meta", "weights_digest", "step"])
        if change == "meta":
            doc["meta"] = {**doc.get("meta", {}), "forged": "yes"}
        elif change == "weights_digest":
            doc["weights_digest"] = self.rng.randbytes(32).hex()
        else:
            doc["step"] = int(doc.get("step") or 0) + 1
        body = {k: val for k, val in doc.items() if k not in ("version_hash", "signature")}
        doc["version_hash"] = hashlib.sha256(canonical(body)).hexdigest()
        sig = self.rng.choice(["unsigned", "old_signature", "attacker_key"])
        if sig == "unsigned":
            doc.pop("signature", None)
        elif sig == "attacker_key":
            private, _ = signing.generate_keypair()
            doc["signature"] = signing.sign(doc["version_hash"], signing.load_signing_key(private)).to_dict()
        self._damage(b, manifest_key(v), canonical(doc), self._hold())
        return {"target": f"{b.region}/{manifest_key(v)}", "change": change, "signature": sig}

    def _hold(self) -> float:
        return float(self.rng.uniform(4, 12))

    def restore_all(self) -> int:
        """Put back every damaged object now; how many were still damaged."""
        return sum(b.restore(key) for b in self.buckets.values() for key in list(b.originals))
