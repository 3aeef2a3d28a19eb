"""Actors prove who they are: fleet-signed certificates, signed results, the trainer's identity gate.

On a real redis-server with the real dispatcher, outbox and identity gate: a Redis writer who copies
a lease's token and actor name cannot get a result admitted (unsigned, signed with another key,
certified by another fleet, replayed for another lease, revoked, expired), the holder's own result
still is, and a forged result never takes the lease from its holder. Hostile certificate bytes give
clean drop reasons. The last test runs a real trainer and a real actor process with identities."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from actor.identity import Identity
from actor.outbox import Outbox
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.lease import Lease
from aurora_store.coord.results import MAX_CERT_FIELD, Ref, Result, parse_result
from aurora_store.errors import ConfigError
from aurora_store.format import identity as ident
from aurora_store.format import results as payloads
from aurora_store.format import signing
from aurora_store.format.identity import REASONS
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tasks import Prompt
from aurora_store.rl.tokenizers import EOS, CharTokenizer
from trainer.config import ScheduleConfig
from trainer.dispatch import Dispatcher
from trainer.identity import ResultGate

TOK = CharTokenizer()
DIGEST = "d" * 32
VHASH = "0" * 64
GOOD = ([5, EOS], [-0.5, -0.1], "stop", 1.0)
NOW = int(time.time())


def payload(reward: float = 1.0) -> bytes:
    row = (GOOD[0], GOOD[1], GOOD[2], reward)
    return payloads.encode([row, row], failures={}, weights_digest=DIGEST)


def cert_for(
    actor: str,
    key: Ed25519PrivateKey,
    fleet: Ed25519PrivateKey,
    *,
    run: str = "*",
    not_before: int = NOW - 60,
    not_after: int = NOW + 3600,
    serial: int = 1,
) -> bytes:
    return ident.issue(
        actor, key.public_key(), fleet, run=run, not_before=not_before, not_after=not_after, serial=serial
    ).encode()


class World:
    """A trainer's dispatcher with a fleet key, on a real Redis, and the actors' side of the board."""

    def __init__(self, redis_url: str, tmp: Path, *, fleet: bool = True, revoked: Path | None = None) -> None:
        self.run = f"id-{uuid.uuid4().hex[:6]}"
        self.coord = Coordinator(redis_url, self.run)
        self.board = JobBoard(self.coord)
        self.fleet = Ed25519PrivateKey.generate()
        self.store = ObjectStore((tmp / "home").as_uri())
        self.gate = ResultGate(
            self.fleet.public_key() if fleet else None, self.run, revoked=str(revoked) if revoked else None
        )
        self.gate.reload_s = 0.0
        self.d = Dispatcher(
            self.coord,
            self.board,
            schedule=ScheduleConfig(),
            sampling=SamplingConfig(group=2, max_new_tokens=4),
            vocab_size=TOK.vocab_size,
            tag="t",
            stores={"home": self.store},
            identity=self.gate,
        )
        self.d.published_version(0, VHASH, DIGEST)
        self.keys: dict[str, Ed25519PrivateKey] = {}

    def actor(self, wid: str, **cert: Any) -> Outbox:
        """A registered actor holding version 0, with its key and a certificate for it."""
        self.coord.workers.register("actor", "home", worker_id=wid, ttl_s=60)
        self.coord.workers.update(wid, version=0)
        key = self.keys[wid] = Ed25519PrivateKey.generate()
        identity = Identity(key, cert_for(wid, key, self.fleet, **cert), actor=wid, run=self.run)
        return self.outbox(wid, identity)

    def outbox(self, wid: str, identity: Identity | None, inline_bytes: int = 1 << 16) -> Outbox:
        return Outbox(
            self.board, self.store, wid, "home", inline_bytes=inline_bytes, on_refused=lambda: None, identity=identity
        )

    def post(self, n: int, step: int = 1) -> None:
        self.d.post(step, [Prompt(f"p{step}-{i}", f"{i}+1=", str(i + 1)) for i in range(n)])

    def take(self, wid: str) -> list[Lease]:
        return self.board.take(wid, max_jobs=64, block_s=0.5)

    def drain(self) -> None:
        """Read, check and admit or drop every result in the stream."""
        while self.coord.r.xlen(self.board.results.key):
            self.d._collect_once()

    def forge(self, lease: Lease, actor: str, data: bytes, *, cert: bytes | None, sig: str | None) -> None:
        """What anyone who can write Redis can submit: a copied token and actor name."""
        job = self.coord.r.hgetall(self.coord.key("job", lease.job))
        stolen = Lease(lease.job, int(job["token"]), lease.step, lease.version, 0, {})
        self.board.results.submit(stolen, actor=actor, version=0, version_hash=VHASH, payload=data, cert=cert, sig=sig)

    def sign(self, key: Ed25519PrivateKey, lease: Lease, actor: str, data: bytes) -> str:
        msg = ident.result_message(
            run=self.run,
            job=lease.job,
            token=lease.token,
            actor=actor,
            version=0,
            version_hash=VHASH,
            payload_sha256=hashlib.sha256(data).hexdigest(),
        )
        return ident.sign_result(key, msg)

    def admitted(self, step: int = 1) -> dict[str, str]:
        return {job: a.actor for job, a in self.d.admitted.get(step, {}).items()}


@pytest.fixture
def world(redis_server: Any, tmp_path: Path) -> World:
    return World(redis_server.url, tmp_path)


def test_forged_results_with_a_copied_token_are_dropped_and_the_holder_is_admitted(world: World) -> None:
    holder = world.actor("a-1")
    world.post(1)
    (lease,) = world.take("a-1")
    forged = payload(reward=0.0)
    real_cert = holder.identity.cert  # type: ignore[union-attr]
    attacker = Ed25519PrivateKey.generate()
    other_fleet = Ed25519PrivateKey.generate()
    world.forge(lease, "a-1", forged, cert=None, sig=None)  # as before identities
    world.forge(lease, "a-1", forged, cert=real_cert, sig=world.sign(attacker, lease, "a-1", forged))
    own_cert = cert_for("a-1", attacker, other_fleet)  # a certificate the attacker made for its key
    world.forge(lease, "a-1", forged, cert=own_cert, sig=world.sign(attacker, lease, "a-1", forged))
    self_signed = cert_for("a-1", attacker, attacker)
    world.forge(lease, "a-1", forged, cert=self_signed, sig=world.sign(attacker, lease, "a-1", forged))
    # a real signature by the holder, over another payload than the one sent
    world.forge(lease, "a-1", forged, cert=real_cert, sig=world.sign(world.keys["a-1"], lease, "a-1", payload()))
    world.drain()
    assert dict(world.d.dropped) == {"unsigned": 1, "bad_signature": 2, "uncertified": 2}
    assert world.admitted() == {} and world.d.leases.holder == {lease.job: "a-1"}, "the lease stays with its holder"
    holder.submit(lease, 0, VHASH, payload())
    world.drain()
    assert world.admitted() == {lease.job: "a-1"}
    assert world.gate.cert_checks == 3, "three distinct certificates, each verified once (then cached)"


def test_a_certified_actor_cannot_submit_as_another(world: World) -> None:
    world.actor("a-1")
    other = world.actor("a-2")  # certified too, but for its own name
    world.post(4)
    lease = world.take("a-1")[0]
    data = payload()
    world.forge(lease, "a-1", data, cert=other.identity.cert, sig=world.sign(world.keys["a-2"], lease, "a-1", data))  # type: ignore[union-attr]
    world.drain()
    assert dict(world.d.dropped) == {"wrong_cert_actor": 1}


def test_a_signed_result_replayed_for_another_lease_is_dropped(world: World) -> None:
    box = world.actor("a-1")
    world.post(2)
    first, second = world.take("a-1")
    box.submit(first, 0, VHASH, payload())
    entries: Any = world.coord.keys.rb.xrange(world.board.results.key)
    entry = entries[-1][1]
    # the same signed entry, resubmitted under the other job and its token (what a Redis writer can do)
    replay = {**entry, b"job": second.job.encode(), b"token": str(second.token).encode()}
    world.coord.keys.rb.xadd(world.board.results.key, replay)
    world.drain()
    assert world.admitted() == {first.job: "a-1"}
    assert dict(world.d.dropped) == {"bad_signature": 1}
    assert world.d.leases.holder == {second.job: "a-1"}


@pytest.mark.parametrize(
    ("window", "run", "reason"),
    [
        ((NOW - 7200, NOW - 3600), "*", "cert_expired"),
        ((NOW + 3600, NOW + 7200), "*", "cert_not_yet_valid"),
        ((NOW - 60, NOW + 3600), "another-run", "wrong_cert_run"),
    ],
)
def test_certificates_out_of_their_window_or_run_are_dropped(
    world: World, window: tuple[int, int], run: str, reason: str
) -> None:
    world.actor("a-1")
    world.post(1)
    (lease,) = world.take("a-1")
    key = world.keys["a-1"]
    cert = cert_for("a-1", key, world.fleet, not_before=window[0], not_after=window[1], run=run)
    data = payload()
    world.forge(lease, "a-1", data, cert=cert, sig=world.sign(key, lease, "a-1", data))
    world.drain()
    assert dict(world.d.dropped) == {reason: 1}
    with pytest.raises(ConfigError, match=reason):  # the actor itself refuses to start with it
        Identity(key, cert, actor="a-1", run=world.run)


def test_a_revoked_actor_is_dropped_without_a_restart(redis_server: Any, tmp_path: Path) -> None:
    revoked = tmp_path / "revoked.txt"
    revoked.write_text("# revoked actor certificates\n")
    world = World(redis_server.url, tmp_path, revoked=revoked)
    box = world.actor("a-1", serial=41)
    world.post(3)
    leases = world.take("a-1")
    box.submit(leases[0], 0, VHASH, payload())
    world.drain()
    revoked.write_text("serial:41  # a-1's host was compromised\n")
    box.submit(leases[1], 0, VHASH, payload())
    world.drain()
    assert world.admitted() == {leases[0].job: "a-1"} and dict(world.d.dropped) == {"revoked": 1}
    reissued = world.actor("a-1", serial=42)  # a new certificate, and a new key: the old key revoked too
    revoked.write_text(f"serial:41\nkey:{signing.key_id(world.keys['a-1'].public_key())}\n")
    reissued.submit(leases[2], 0, VHASH, payload())
    world.drain()
    assert dict(world.d.dropped) == {"revoked": 2}
    revoked.write_text("not a revocation\n")  # a bad list later: the last good one stays in force
    reissued.submit(leases[2], 0, VHASH, payload())
    world.drain()
    assert dict(world.d.dropped) == {"revoked": 3}
    with pytest.raises(ConfigError, match="line 1"):  # a bad list at start stops the trainer
        ResultGate(world.fleet.public_key(), world.run, revoked=str(revoked))


def test_a_forged_reference_is_refused_before_any_fetch(world: World) -> None:
    box = world.actor("a-1")
    box.inline_bytes = 16  # every payload goes to the bucket, its reference through Redis
    world.post(2)
    first, second = world.take("a-1")
    data = payload()
    ref = Ref("home", f"results/{hashlib.sha256(data).hexdigest()}.bin", hashlib.sha256(data).hexdigest(), len(data))
    box.submit(first, 0, VHASH, data)  # signed, offloaded: fetched and admitted
    world.board.results.submit(second, actor="a-1", version=0, version_hash=VHASH, ref=ref)  # unsigned reference
    fetched = world.d.payloads.fetched_bytes
    world.drain()
    assert world.admitted() == {first.job: "a-1"} and dict(world.d.dropped) == {"unsigned": 1}
    assert world.d.payloads.fetched_bytes - fetched == len(data), "only the signed result's payload was fetched"


def test_a_certified_insider_who_reads_the_holders_token_gets_nothing_admitted_nor_fetched(world: World) -> None:
    """Issue 25, weak spot: fencing tokens are readable in Redis. On a run whose actors are signed, a
    certified actor (a compromised host, with its own key and certificate) that copies the holder's
    token still gets nothing admitted: under its own name it is not the holder, under the holder's it
    cannot sign. Its reference is never fetched, and the lease stays with the holder, whose result is
    admitted."""
    holder = world.actor("a-1")
    world.post(1)
    (lease,) = world.take("a-1")
    insider = world.actor("a-2")
    token = int(str(world.coord.r.hget(world.coord.key("job", lease.job), "token")))  # anyone can read it
    stolen = Lease(lease.job, token, lease.step, lease.version, lease.deadline_ms, {})
    forged = payload(reward=0.0)
    insider.submit(stolen, 0, VHASH, forged)  # signed by the insider, in its own name: inline
    insider.inline_bytes = 16
    insider.submit(stolen, 0, VHASH, payload(reward=0.5))  # and by reference
    key = world.keys["a-2"]
    world.forge(lease, "a-1", forged, cert=insider.identity.cert, sig=world.sign(key, lease, "a-1", forged))  # type: ignore[union-attr]
    fetched = world.d.payloads.fetched_bytes
    world.drain()
    assert world.admitted() == {} and world.d.leases.holder == {lease.job: "a-1"}, "the lease stays with its holder"
    assert dict(world.d.dropped) == {"wrong_actor": 2, "wrong_cert_actor": 1}
    assert world.d.payloads.fetched_bytes == fetched, "the insider's reference is never fetched"
    holder.submit(lease, 0, VHASH, payload())
    world.drain()
    assert world.admitted() == {lease.job: "a-1"}


def test_a_malformed_entry_does_not_take_the_lease_when_identities_are_on(world: World) -> None:
    world.actor("a-1")
    world.post(1)
    (lease,) = world.take("a-1")
    world.coord.r.xadd(world.board.results.key, {"job": lease.job, "actor": "a-1", "token": "x"})
    world.drain()
    assert dict(world.d.dropped) == {"bad_token": 1} and world.d.leases.holder == {lease.job: "a-1"}


def test_without_a_fleet_key_results_are_admitted_as_before(
    redis_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "aurora.trainer"):
        world = World(redis_server.url, tmp_path, fleet=False)
    assert [r.message for r in caplog.records if "not authenticated" in r.message], "said once at start"
    unsigned = world.outbox("a-1", None)
    world.coord.workers.register("actor", "home", worker_id="a-1", ttl_s=60)
    world.coord.workers.update("a-1", version=0)
    world.post(1)
    (lease,) = world.take("a-1")
    unsigned.submit(lease, 0, VHASH, payload())
    world.drain()
    assert world.admitted() == {lease.job: "a-1"}


# ---------------------------------------------------------------- the certificate format, hostile


FLEET = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
ACTOR = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
CERT = ident.issue("a-1", ACTOR.public_key(), FLEET, run="*", not_before=NOW - 60, not_after=NOW + 3600, serial=9)


def _doc(**change: Any) -> bytes:
    doc = json.loads(CERT.encode())
    doc.update(change)
    for k in [k for k, v in change.items() if v is ...]:
        del doc[k]
    return ident.canonical(doc)


HOSTILE = [
    b"",
    b"null",
    b"[]",
    b"{}",
    b"{" * 5000,
    b'{"a":NaN}',
    CERT.encode() + b" ",
    b" " + CERT.encode(),
    CERT.encode().replace(b'"actor":"a-1"', b'"actor": "a-1"'),
    CERT.encode()[:-1],
    CERT.encode() + b"x" * 2000,
    "é".encode() * 100,
    _doc(format="aurora-actor-cert/2"),
    _doc(actor="bad name"),
    _doc(actor=""),
    _doc(actor="a" * 201),
    _doc(actor=7),
    _doc(key="00" * 31),
    _doc(key="G" * 64),
    _doc(key=None),
    _doc(run="bad run"),
    _doc(not_before=-1),
    _doc(not_before=True),
    _doc(not_after=1.5),
    _doc(not_after=CERT.not_before),
    _doc(not_after=1 << 41),
    _doc(serial="9"),
    _doc(serial=1 << 60),
    _doc(issuer="x"),
    _doc(sig="A" * 88),
    _doc(sig=None),
    _doc(extra=1),
    _doc(sig=...),
    _doc(key="ff" * 32),  # not a point of the curve (or not this signature's key)
]


@pytest.mark.parametrize("raw", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_certificates_are_clean_drop_reasons(raw: bytes) -> None:
    gate = ResultGate(FLEET.public_key(), "r")
    why = gate.check(Result("1-0", "j", 1, "a-1", 0, VHASH, inline=b"x", cert=raw, sig="A" * 86 + "=="))
    assert why in ("bad_cert", "uncertified"), why
    with pytest.raises(ident.CertError):
        ident.verify_cert(ident.parse_cert(raw), FLEET.public_key())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1200) | st.sampled_from(HOSTILE), st.integers(0, 400), st.binary(min_size=1, max_size=8))
def test_fuzzed_certificates_and_signatures_never_raise(raw: bytes, at: int, junk: bytes) -> None:
    gate = ResultGate(FLEET.public_key(), "r")
    mutated = CERT.encode()[:at] + junk + CERT.encode()[at + len(junk) :]
    for cert in (raw, mutated):
        for sig in (base64.b64encode(junk).decode(), "A" * 86 + "==", junk.decode("latin-1")):
            assert gate.check(Result("1-0", "j", 1, "a-1", 0, VHASH, inline=b"x", cert=cert, sig=sig)) in REASONS


@settings(max_examples=50, deadline=None)
@given(
    st.from_regex(r"[A-Za-z0-9_.:@+=\-]{1,40}", fullmatch=True),
    st.from_regex(r"\*|[A-Za-z0-9][A-Za-z0-9_.\-]{0,30}", fullmatch=True),
    st.integers(0, ident.MAX_TIME_S - 1),
    st.integers(1, 1 << 30),
    st.integers(0, ident.MAX_SERIAL),
)
def test_certificate_round_trip(actor: str, run: str, not_before: int, span: int, serial: int) -> None:
    not_after = min(not_before + span, ident.MAX_TIME_S)
    cert = ident.issue(
        actor, ACTOR.public_key(), FLEET, run=run, not_before=not_before, not_after=not_after, serial=serial
    )
    assert ident.parse_cert(cert.encode()) == cert and len(cert.encode()) <= ident.MAX_CERT_BYTES
    ident.verify_cert(cert, FLEET.public_key())
    assert cert.covers(now_s=not_before, run=run if run != "*" else "any") is None
    assert cert.covers(now_s=not_after, run="x") == "cert_expired"


def test_certificate_bytes_are_exact() -> None:
    """The canonical form, pinned: a change to it is a format change (docs/FORMAT.md)."""
    body = CERT.encode()
    assert body.startswith(b'{"actor":"a-1","format":"aurora-actor-cert/1","issuer":"')
    assert json.loads(body)["key"] == signing.raw_public(ACTOR.public_key()).hex()
    assert ident.result_message(
        run="r", job="t:1:0", token=3, actor="a-1", version=2, version_hash="a" * 64, payload_sha256="b" * 64
    ) == (
        b'aurora-result/1\x00{"actor":"a-1","job":"t:1:0","payload_sha256":"'
        + b"b" * 64
        + b'","run":"r","token":3,"version":2,"version_hash":"'
        + b"a" * 64
        + b'"}'
    )


def test_result_entries_old_and_new_read_back() -> None:
    old = {
        b"job": b"t:1:0",
        b"actor": b"a-1",
        b"token": b"3",
        b"version": b"0",
        b"version_hash": VHASH.encode(),
        b"bin": b"x",
    }
    got = parse_result(b"1-0", old)
    assert got.malformed is None and got.cert is None and got.sig is None, "an entry without them is unsigned"
    signed = parse_result(b"1-1", {**old, b"cert": CERT.encode(), b"sig": b"A" * 86 + b"=="})
    assert signed.cert == CERT.encode() and signed.sig == "A" * 86 + "=="
    huge = parse_result(b"1-2", {**old, b"cert": b"x" * (1 << 20), b"sig": b"\xff" * 5000})
    assert huge.malformed is None and huge.cert is not None and len(huge.cert) == MAX_CERT_FIELD
    assert MAX_CERT_FIELD > ident.MAX_CERT_BYTES, "an over-long certificate is still seen to be over-long"
    assert ResultGate(FLEET.public_key(), "r").check(huge) == "bad_cert"


def test_an_actor_refuses_a_key_and_certificate_that_do_not_match() -> None:
    other = Ed25519PrivateKey.generate()
    with pytest.raises(ConfigError, match="not this actor's key"):
        Identity(other, CERT.encode(), actor="a-1", run="r")
    with pytest.raises(ConfigError, match="names actor 'a-1'"):
        Identity(ACTOR, CERT.encode(), actor="a-2", run="r")


# ---------------------------------------------------------------- real processes


REPO = Path(__file__).resolve().parents[1]


def _cli(*argv: str, cwd: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "aurora_store.cli", *argv], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
def test_a_certified_actor_process_gets_its_results_admitted(redis_server: Any, tmp_path: Path) -> None:
    from tests.test_rl_loop import Loop, _check_exactly_once

    _cli("keygen", "--out", str(tmp_path / "fleet"), cwd=REPO)
    issued = json.loads(
        _cli(
            "actor-cert",
            "issue",
            "--fleet-key",
            str(tmp_path / "fleet.key"),
            "--actor",
            "certified",
            "--out",
            str(tmp_path / "certs"),
            "--run",
            "rl",
            "--json",
            cwd=REPO,
        )
    )
    loop = Loop(tmp_path, redis_server.url)
    try:
        trainer = loop.trainer("--steps", "2", "--fleet-key", str(tmp_path / "fleet.pub"))
        loop.actor("certified", "--identity-key", issued["key"], "--identity-cert", issued["cert"])
        loop.finish(trainer, "trainer")
        _check_exactly_once(loop, 2)
        assert {a["actor"] for a in json.loads("[" + ",".join(loop.admissions.read_text().splitlines()) + "]")} == {
            "certified"
        }
        assert "not authenticated" not in loop.log("trainer")
    finally:
        loop.stop()


def test_the_identity_benchmark_measures_both_in_one_run() -> None:
    from bench.fleet.identity import Flags, measure

    out = measure(Flags(results=8, group=2, tokens=4, reps=1))
    a = out["admission"]
    assert out["sign_us"] > 0 and out["check_us"] > 0 and out["cert_us"] > 0
    assert a["signed_results_per_s"] > 0 and a["signed_over_unsigned"] == pytest.approx(
        a["signed_results_per_s"] / a["unsigned_results_per_s"], rel=0.01
    )


def test_identity_options_come_from_the_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from aurora_store.cli import main

    monkeypatch.chdir(tmp_path)  # where a role started here finds the files the config names
    path = tmp_path / "aurora.toml"
    path.write_text(
        'run_id = "exp1"\nhome = "us"\n[regions.us]\nuri = "file:///b/us/exp1"\n'
        '[trainer]\nfleet_key = "fleet.pub"\nrevoked_actors = "revoked.txt"\n'
        '[actor]\nidentity_key = "eu-0.key"\nidentity_cert = "eu-0.cert"\n'
    )
    assert main(["config", "check", str(path)]) == 1, "issue 34: the files it names do not exist"
    err = capsys.readouterr().err
    for name in ("fleet.pub", "revoked.txt", "eu-0.key", "eu-0.cert"):
        assert f"{name} does not exist" in err, err
    os.mkfifo(tmp_path / "revoked.txt")
    assert main(["config", "check", str(path)]) == 1 and "revoked.txt is not a regular file" in capsys.readouterr().err
    (tmp_path / "revoked.txt").unlink()
    for name in ("fleet.pub", "revoked.txt", "eu-0.key", "eu-0.cert"):
        (tmp_path / name).write_text("x")
    assert main(["config", "check", str(path), "--json"]) == 0
    roles = {r["command"]: r["options"] for r in json.loads(capsys.readouterr().out)["roles"]}
    assert (roles["train"]["fleet_key"], roles["train"]["revoked_actors"]) == ("fleet.pub", "revoked.txt")
    assert (roles["actor"]["identity_key"], roles["actor"]["identity_cert"]) == ("eu-0.key", "eu-0.cert")


@pytest.mark.parametrize("days", ["inf", "nan", "0", "-1", "1e12"])
def test_a_validity_that_cannot_be_written_is_refused_with_a_clear_error(
    days: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 34: ``aurora actor-cert issue --days inf`` ended in an OverflowError traceback."""
    from aurora_store.cli import main

    assert main(["keygen", "--out", str(tmp_path / "fleet")]) == 0
    argv = [
        "actor-cert",
        "issue",
        "--fleet-key",
        str(tmp_path / "fleet.key"),
        "--actor",
        "a",
        "--out",
        str(tmp_path / "c"),
    ]
    rc = main([*argv, "--days", days])
    err = capsys.readouterr().err
    assert rc != 0 and "--days must be a number of days above 0" in err and "Traceback" not in err, err
    assert not (tmp_path / "c").exists(), "nothing written"


def test_files_named_for_identities_are_refused_when_they_are_not_regular_files(tmp_path: Path) -> None:
    """Issue 34: a revocation list that is a FIFO hung the trainer at start (open() waits for a writer);
    a certificate or a model file that is one would hang an actor or feed it forever."""
    from actor.identity import read_cert
    from aurora_store.rl.gguf import _sha256

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        ResultGate(Ed25519PrivateKey.generate().public_key(), "r", revoked=str(fifo))
    with pytest.raises(ConfigError, match="not a regular file"):
        read_cert(str(fifo))
    with pytest.raises(OSError, match="not a regular file"):
        _sha256(str(fifo))
