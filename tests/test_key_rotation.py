"""Key rotation without a new run (format aurora/4): a rotation version names the new key and is
signed by the old and the new one; a reader holding any of the run's keys verifies the whole run,
replayed, relayed and audited; forged rotations and the old key after its rotation are refused."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aurora_store
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.errors import CorruptError, StoreError, UnauthenticatedError
from aurora_store.format import signing
from aurora_store.format.keys import manifest_key, rotation_marker_key
from aurora_store.format.manifest import FORMAT_V4, Manifest, RunLineage, Signature
from aurora_store.format.manifest_parser import parse_manifest
from aurora_store.testing import damage
from relay.worker import Relay
from tests.test_cli import assert_bits_equal, aurora, load_dir

ROTATIONS = {3: "b", 6: "c"}
"""Version 3 rotates key a to b, version 6 key b to c (full_every=3: both are full; see the delta case)."""
VERSIONS = 9


@dataclass
class Keys:
    private: dict[str, bytes]
    public: dict[str, bytes]
    paths: dict[str, Path]

    def id(self, name: str) -> str:
        return signing.key_id(signing.load_verify_key(self.public[name]))


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    private, public, paths = {}, {}, {}
    for name in ("a", "b", "c", "x"):
        private[name], public[name] = signing.generate_keypair()
        paths[name] = tmp_path / f"{name}.pub"
        paths[name].write_bytes(public[name])
        (tmp_path / f"{name}.key").write_bytes(private[name])
    return Keys(private, public, paths)


def _state(i: int) -> dict[str, torch.Tensor]:
    w = torch.linspace(-1, 1, 4096).to(torch.bfloat16)
    b = torch.linspace(-2, 2, 300).to(torch.bfloat16)
    w[: 7 * i : 7] += 1
    b[i] = float(i)
    return {"b": b, "w": w}


def publish_rotated(
    uri: str, keys: Keys, *, n: int = VERSIONS, rotations: dict[int, str] = ROTATIONS, **kw: Any
) -> list[dict[str, torch.Tensor]]:
    """A run signed by key a, rotated as ``rotations`` says; the state dict of every version."""
    run = aurora_store.open_run(uri, signing_key=keys.private["a"], full_every=3, **kw)
    states = []
    for i in range(n):
        sd = _state(i)
        rotate = rotations.get(i)
        run.publish(sd, rotate_to=None if rotate is None else keys.private[rotate])
        states.append(sd)
    run.close()
    return states


@pytest.fixture
def rotated(tmp_path: Path, keys: Keys) -> tuple[str, list[dict[str, torch.Tensor]]]:
    uri = f"file://{tmp_path}/home/run"
    return uri, publish_rotated(uri, keys)


# ---------------------------------------------------------------- the format


def test_a_rotation_is_aurora_4_and_signed_by_both_keys(rotated: tuple[str, Any], keys: Keys) -> None:
    uri, _ = rotated
    run = aurora_store.open_run(uri, verify_key=keys.public["a"])
    formats = [run.manifest(v).format for v in range(VERSIONS)]
    assert [v for v, f in enumerate(formats) if f == FORMAT_V4] == [3, 6]
    assert all(f in ("aurora/2", "aurora/3") for v, f in enumerate(formats) if v not in ROTATIONS)
    signers = [run.manifest(v).run.signed_by for v in range(VERSIONS)]  # type: ignore[union-attr]
    assert signers == [keys.id("a")] * 3 + [keys.id("b")] * 3 + [keys.id("c")] * 3
    m = run.manifest(3)
    assert m.rotation is not None and m.signature is not None and m.rotation_signature is not None
    assert (m.rotation.previous, m.rotation.key_id) == (keys.id("a"), keys.id("b"))
    assert (m.signature.key_id, m.rotation_signature.key_id) == (keys.id("a"), keys.id("b"))
    assert run.store.exists(rotation_marker_key(3)) and not run.store.exists(rotation_marker_key(4))
    old, new = signing.verify_rotation(m, "test")
    assert signing.key_id(old) == keys.id("a") and signing.key_id(new) == keys.id("b")
    assert parse_manifest(m.to_bytes(), expect_version=3) == m


def test_a_rotation_may_be_a_delta(tmp_path: Path, keys: Keys) -> None:
    uri = f"file://{tmp_path}/run"
    states = publish_rotated(uri, keys, n=4, rotations={2: "b"})
    run = aurora_store.open_run(uri, verify_key=keys.public["b"])
    m = run.manifest(2)
    assert m.kind == "delta" and m.rotation is not None and m.format == FORMAT_V4
    for v in range(4):
        assert_bits_equal(run.materialize(v), states[v])


# ---------------------------------------------------------------- readers, replay


@pytest.mark.parametrize("key", ["a", "b", "c"])
def test_any_key_of_the_run_verifies_every_version(rotated: tuple[str, Any], keys: Keys, key: str) -> None:
    uri, states = rotated
    # in any order (a fresh reader per version: what a new actor does), and in order (what an actor that
    # follows the run does: it learns each rotation from the version itself)
    for v in [8, 0, 3, 5, 6, 2, 7]:
        fresh = aurora_store.open_run(uri, verify_key=keys.public[key])
        assert_bits_equal(fresh.materialize(v), states[v])
    follower = aurora_store.open_run(uri, verify_key=keys.public[key])
    for v in range(VERSIONS):
        assert_bits_equal(follower.materialize(v), states[v])


def test_a_key_that_is_not_the_runs_verifies_nothing(rotated: tuple[str, Any], keys: Keys) -> None:
    uri, _ = rotated
    for v in (0, 3, 8):
        with pytest.raises(UnauthenticatedError, match=f"the verify key given is {keys.id('x')}"):
            aurora_store.open_run(uri, verify_key=keys.public["x"]).manifest(v)


@pytest.mark.slow
@pytest.mark.parametrize("key", ["a", "c"])
def test_replay_before_at_and_after_a_rotation_with_either_key(
    rotated: tuple[str, Any], keys: Keys, tmp_path: Path, key: str
) -> None:
    uri, states = rotated
    for v in (2, 3, 5, 6, 8):
        out = tmp_path / f"out-{key}-{v}"
        r = aurora("replay", uri, "--version", str(v), "--out", str(out), "--verify-key", str(keys.paths[key]))
        assert r.returncode == 0, r.stderr
        assert_bits_equal(load_dir(out), states[v])
        assert json.loads((out / "aurora_replay.json").read_text())["version"] == v


def test_the_old_key_cannot_sign_after_its_rotation(rotated: tuple[str, Any], keys: Keys) -> None:
    uri, states = rotated
    old = aurora_store.open_run(uri, signing_key=keys.private["a"])
    with pytest.raises(UnauthenticatedError, match=f"signed by key {keys.id('c')}"):
        old.publish(_state(20))
    # an attacker holding key a (and write access to the bucket) appends a version signed by it
    honest = aurora_store.open_run(uri, signing_key=keys.private["c"])
    honest.publish(_state(21))
    m = honest.manifest(VERSIONS)
    forged = signing.seal(
        dataclasses.replace(m, run=RunLineage(m.run.origin, keys.id("a"))),  # type: ignore[union-attr]
        signing.load_signing_key(keys.private["a"]),
    )
    damage.overwrite(honest.store, manifest_key(VERSIONS), forged.to_bytes())
    for key in ("a", "b", "c"):
        with pytest.raises(UnauthenticatedError, match=f"the run's key at version {VERSIONS} is {keys.id('c')}"):
            aurora_store.open_run(uri, verify_key=keys.public[key]).materialize(VERSIONS)
    follower = aurora_store.open_run(uri, verify_key=keys.public["a"])
    assert_bits_equal(follower.materialize(VERSIONS - 1), states[-1])
    with pytest.raises(UnauthenticatedError):
        follower.manifest(VERSIONS)
    # nor can it start a rotation of its own from there
    forged_rot = signing.seal(
        dataclasses.replace(
            m,
            format=FORMAT_V4,
            run=RunLineage(m.run.origin, keys.id("x")),  # type: ignore[union-attr]
            rotation=signing.rotation(
                signing.load_signing_key(keys.private["a"]), signing.load_signing_key(keys.private["x"])
            ),
        ),
        signing.load_signing_key(keys.private["a"]),
        signing.load_signing_key(keys.private["x"]),
    )
    damage.overwrite(honest.store, manifest_key(VERSIONS), forged_rot.to_bytes())
    honest.store.put_if_absent(rotation_marker_key(VERSIONS), b"")
    for key in ("a", "c"):
        with pytest.raises(UnauthenticatedError, match=f"rotates from key {keys.id('a')}"):
            aurora_store.open_run(uri, verify_key=keys.public[key]).manifest(VERSIONS)


# ---------------------------------------------------------------- forged rotations


def _forge(uri: str, keys: Keys, how: str) -> None:
    """Replace the rotation at version 3 (a to b) by a forged one."""
    store = ObjectStore(uri)
    m = parse_manifest(store.get(manifest_key(3), max_bytes=1 << 22), expect_version=3)
    b, x = (signing.load_signing_key(keys.private[k]) for k in "bx")
    if how == "new-key-only":
        forged = dataclasses.replace(m, signature=signing.sign(m.version_hash, b))
    elif how == "unsigned-by-old":
        forged = dataclasses.replace(m, signature=None)
    elif how == "bad-old-signature":
        junk = base64.b64encode(bytes(64)).decode()
        forged = dataclasses.replace(m, signature=Signature("ed25519", keys.id("a"), junk))
    elif how == "bad-new-signature":
        forged = dataclasses.replace(m, rotation_signature=signing.sign(m.version_hash, b))  # the wrong domain
    elif how == "previous-not-the-parents-signer":
        forged = signing.seal(dataclasses.replace(m, rotation=signing.rotation(x, b)), x, b)
    else:
        raise AssertionError(how)
    damage.overwrite(store, manifest_key(3), forged.to_bytes())


FORGERIES = [
    "new-key-only",
    "unsigned-by-old",
    "bad-old-signature",
    "bad-new-signature",
    "previous-not-the-parents-signer",
]


@pytest.mark.slow
@pytest.mark.parametrize("how", FORGERIES)
def test_a_forged_rotation_is_refused_by_readers_replay_and_audit(
    rotated: tuple[str, Any], keys: Keys, tmp_path: Path, how: str
) -> None:
    uri, states = rotated
    _forge(uri, keys, how)
    for key in ("a", "b"):
        for v in (3, 4, 8):
            with pytest.raises(UnauthenticatedError):
                aurora_store.open_run(uri, verify_key=keys.public[key]).materialize(v)
    follower = aurora_store.open_run(uri, verify_key=keys.public["a"])
    assert_bits_equal(follower.materialize(2), states[2])  # what comes before it stays readable
    with pytest.raises(UnauthenticatedError):
        follower.manifest(3)
    r = aurora("replay", uri, "--version", "5", "--out", str(tmp_path / "o"), "--verify-key", str(keys.paths["a"]))
    assert r.returncode == 1 and "key" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()
    audited = aurora("audit", uri, "--json", "--verify-key", str(keys.paths["a"]))
    assert audited.returncode == 1
    doc = json.loads(audited.stdout)
    # KeyHistoryError (an UnauthenticatedError) where the forged rotation is met while learning the keys
    assert doc["first_error"]["version"] == 3
    assert doc["first_error"]["type"] in ("UnauthenticatedError", "KeyHistoryError"), doc["first_error"]
    assert [row["status"] for row in doc["versions"][:3]] == ["ok"] * 3


@pytest.mark.parametrize("how", ["new-key-only", "previous-not-the-parents-signer"])
def test_a_relay_refuses_a_forged_rotation(rotated: tuple[str, Any], keys: Keys, tmp_path: Path, how: str) -> None:
    uri, _ = rotated
    _forge(uri, keys, how)
    dest = f"file://{tmp_path}/eu/run"
    relay = Relay(
        ObjectStore(uri), ObjectStore(dest), None, source_region="home", dest_region="eu", verify_key=keys.public["a"]
    )
    for v in range(3):
        relay.copy_version(v)
    with pytest.raises(UnauthenticatedError):
        relay.copy_version(3)
    relay.close()
    assert not ObjectStore(dest).exists(manifest_key(3))


def test_a_forged_rotation_without_its_marker_is_refused(rotated: tuple[str, Any], keys: Keys) -> None:
    uri, _ = rotated
    _forge(uri, keys, "new-key-only")
    damage.delete(ObjectStore(uri), rotation_marker_key(3))
    for key in ("a", "b"):
        with pytest.raises(UnauthenticatedError):
            aurora_store.open_run(uri, verify_key=keys.public[key]).materialize(5)


# ---------------------------------------------------------------- relay, audit


def test_a_relay_copies_a_rotated_run_and_the_copy_verifies_with_either_key(
    rotated: tuple[str, Any], keys: Keys, tmp_path: Path, s3_server: Any
) -> None:
    uri, states = rotated
    dest = f"s3://{s3_server.new_bucket()}/runs/exp"
    opts = s3_server.options()
    relay = Relay(
        ObjectStore(uri),
        ObjectStore(dest, opts),
        None,
        source_region="home",
        dest_region="eu",
        verify_key=keys.public["c"],
    )
    assert relay.backfill() == list(range(VERSIONS))
    relay.close()
    there = ObjectStore(dest, opts)
    assert there.exists(rotation_marker_key(3)) and there.exists(rotation_marker_key(6))
    for key in ("a", "b", "c"):
        copy = aurora_store.open_run(dest, storage_options=opts, verify_key=keys.public[key])
        for v in (8, 1, 4):
            assert_bits_equal(copy.materialize(v), states[v])


def test_a_relay_process_copies_a_rotated_run(rotated: tuple[str, Any], keys: Keys, tmp_path: Path) -> None:
    uri, states = rotated
    dest = f"file://{tmp_path}/eu/run"
    r = aurora(
        "relay", "--source", uri, "--dest", dest, "--dest-region", "eu", "--once", "--verify-key", str(keys.paths["a"])
    )
    assert r.returncode == 0, r.stderr
    assert_bits_equal(aurora_store.open_run(dest, verify_key=keys.public["c"]).materialize(7), states[7])


@pytest.mark.slow
@pytest.mark.parametrize("key", ["a", "b", "c"])
def test_audit_passes_with_any_key_of_the_run(rotated: tuple[str, Any], keys: Keys, key: str) -> None:
    uri, _ = rotated
    r = aurora("audit", uri, "--json", "--verify-key", str(keys.paths[key]))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["versions"]
    assert [row["key_id"] for row in rows] == [keys.id("a")] * 4 + [keys.id("b")] * 3 + [keys.id("c")] * 2
    wrong = aurora("audit", uri, "--json", "--verify-key", str(keys.paths["x"]))
    assert wrong.returncode == 1


def test_gc_keeps_every_rotation(tmp_path: Path, keys: Keys) -> None:
    from aurora_store.bucket import gc

    uri = f"file://{tmp_path}/run"
    states = publish_rotated(uri, keys, n=12, rotations={4: "b"})
    run = aurora_store.open_run(uri, signing_key=keys.private["b"])
    plan = gc.plan(run, gc.RetentionPolicy(keep_last=2, keep_fulls=1, keep_states=1))
    assert 4 in plan.kept and plan.retire
    gc.apply(run, plan)
    for key in ("a", "b"):
        assert_bits_equal(aurora_store.open_run(uri, verify_key=keys.public[key]).materialize(11), states[11])


# ---------------------------------------------------------------- publishing a rotation


def test_the_new_key_alone_is_told_to_rotate(tmp_path: Path, keys: Keys) -> None:
    uri = f"file://{tmp_path}/run"
    publish_rotated(uri, keys, n=2, rotations={})
    run = aurora_store.open_run(uri, signing_key=keys.private["b"])
    with pytest.raises(UnauthenticatedError, match="--rotate-signing-key"):
        run.publisher.planner.check_signer()
    with pytest.raises(UnauthenticatedError, match="rotate"):
        run.publish(_state(5))


def test_a_restart_with_the_rotation_option_rotates_once(tmp_path: Path, keys: Keys) -> None:
    """What a trainer started with --signing-key a --rotate-signing-key b does, started twice."""
    uri = f"file://{tmp_path}/run"
    publish_rotated(uri, keys, n=2, rotations={})
    for restart in range(2):
        run = aurora_store.open_run(uri, signing_key=keys.private["a"])
        run.signing.rotate_to(keys.private["b"])
        run.publisher.planner.check_signer()
        run.resume()
        info = run.publish(_state(10 + restart))
        assert run.signer == keys.id("b")
        m = run.manifest(info.version)
        assert (m.rotation is not None) == (restart == 0) and m.run.signed_by == keys.id("b")  # type: ignore[union-attr]
        run.publish(_state(20 + restart))
        run.close()
    fresh = aurora_store.open_run(uri, verify_key=keys.public["a"])
    assert [fresh.manifest(v).rotation is not None for v in fresh.versions()] == [
        False,
        False,
        True,
        False,
        False,
        False,
    ]


def test_a_rotation_needs_a_signed_run_and_a_new_key(tmp_path: Path, keys: Keys) -> None:
    unsigned = aurora_store.open_run(f"file://{tmp_path}/u")
    unsigned.publish(_state(0))
    with pytest.raises(StoreError, match="current signing key"):
        unsigned.publish(_state(1), rotate_to=keys.private["b"])
    fresh = aurora_store.open_run(f"file://{tmp_path}/f", signing_key=keys.private["a"])
    with pytest.raises(StoreError, match="version 0 has no key to rotate from"):
        fresh.publish(_state(0), rotate_to=keys.private["b"])
    assert fresh.versions() == []
    with pytest.raises(StoreError, match="signing key itself"):
        fresh.publish(_state(0), rotate_to=keys.private["a"])


def test_the_trainer_option_reads_like_every_option(keys: Keys, tmp_path: Path) -> None:
    import argparse

    from aurora_store.config.options import build
    from trainer.cli import register
    from trainer.config import TrainerConfig

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "train",
            "--store",
            "file:///x",
            "--redis",
            "redis://h:1/0",
            "--run-id",
            "r",
            "--signing-key",
            str(tmp_path / "a.key"),
            "--rotate-signing-key",
            str(tmp_path / "b.key"),
        ]
    )
    cfg = build(TrainerConfig, args)
    assert cfg.publish.signing_key == str(tmp_path / "a.key")
    assert cfg.publish.rotate_signing_key == str(tmp_path / "b.key")


# ---------------------------------------------------------------- hostile manifests


def _rotation_doc(rotated: tuple[str, Any]) -> dict[str, Any]:
    uri, _ = rotated
    return json.loads(ObjectStore(uri).get(manifest_key(3), max_bytes=1 << 22))


def _b64(n: int) -> str:
    return base64.b64encode(bytes(range(n))).decode()


HOSTILE = {
    "bad-base64": lambda d: d["rotation"].update(public_key="!" * 43 + "="),
    "base64-of-31-bytes": lambda d: d["rotation"].update(public_key=_b64(31)),
    "base64-of-33-bytes": lambda d: d["rotation"].update(public_key=_b64(33)),
    "previous-key-too-long": lambda d: d["rotation"].update(previous_public_key=_b64(48)),
    "key-id-not-the-keys": lambda d: d["rotation"].update(key_id="0" * 16),
    "previous-id-not-the-keys": lambda d: d["rotation"].update(previous="0" * 16),
    "key-id-uppercase": lambda d: d["rotation"].update(key_id=d["rotation"]["key_id"].upper()),
    "rotates-to-itself": lambda d: d["rotation"].update(
        key_id=d["rotation"]["previous"], public_key=d["rotation"]["previous_public_key"]
    ),
    "run-not-signed-by-the-new-key": lambda d: d["run"].update(signed_by=d["rotation"]["previous"]),
    "rotation-extra-field": lambda d: d["rotation"].update(note="x"),
    "rotation-missing-field": lambda d: d["rotation"].pop("previous_public_key"),
    "rotation-not-an-object": lambda d: d.update(rotation=[1]),
    "rotation-null": lambda d: d.update(rotation=None),
    "no-rotation-signature": lambda d: d.pop("rotation_signature"),
    "rotation-signature-not-a-signature": lambda d: d.update(rotation_signature={"alg": "ed25519"}),
    "rotation-in-aurora-3": lambda d: d.update(format="aurora/3"),
    "rotation-in-version-0": lambda d: d.update(version=0, parent=None),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_rotation_fields_are_refused(rotated: tuple[str, Any], case: str) -> None:
    doc = _rotation_doc(rotated)
    HOSTILE[case](doc)
    with pytest.raises(CorruptError):
        parse_manifest(json.dumps(doc).encode())


def test_the_schema_takes_a_rotation_and_refuses_what_it_can_say(rotated: tuple[str, Any]) -> None:
    from tests.test_docs import SCHEMA_PATH, load

    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    doc = _rotation_doc(rotated)
    assert [e.message for e in validator.iter_errors(load(json.dumps(doc).encode()))] == []
    for case in (
        "bad-base64",
        "base64-of-33-bytes",
        "rotation-extra-field",
        "rotation-missing-field",
        "no-rotation-signature",
        "rotation-in-aurora-3",
        "rotation-not-an-object",
    ):
        d = _rotation_doc(rotated)
        HOSTILE[case](d)
        assert not validator.is_valid(load(json.dumps(d).encode())), case


_SEEDS = st.binary(min_size=32, max_size=32)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=_SEEDS, new=_SEEDS, version=st.integers(1, 10**10 - 1), signed=st.booleans())
def test_rotation_fields_round_trip(old: bytes, new: bytes, version: int, signed: bool) -> None:
    a, b = Ed25519PrivateKey.from_private_bytes(old), Ed25519PrivateKey.from_private_bytes(new)
    if signing.key_id(a.public_key()) == signing.key_id(b.public_key()):
        return
    m = _base_manifest(version)
    m = dataclasses.replace(
        m, format=FORMAT_V4, run=RunLineage("ab" * 32, signing.key_id(b.public_key())), rotation=signing.rotation(a, b)
    )
    sealed = signing.seal(m, a, b) if signed else signing.seal(m, None)
    parsed = parse_manifest(sealed.to_bytes(), expect_version=version)
    assert parsed == sealed and parsed.to_bytes() == sealed.to_bytes()
    if signed:
        signing.verify_rotation(parsed, "round trip")
    else:
        with pytest.raises(UnauthenticatedError):
            signing.verify_rotation(parsed, "round trip")


def _base_manifest(version: int) -> Manifest:
    from aurora_store.format.manifest import Parent, Stats

    return Manifest(
        version=version,
        kind="delta",
        parent=Parent(version - 1, "cd" * 32),
        created="2026-12-03T00:00:00Z",
        step=None,
        tensors=(),
        segments=(),
        index=None,
        stats=Stats(0, 0, 0, 0, 0),
        weights_digest="0" * 32,
    )


# ---------------------------------------------------------------- actors


@pytest.mark.parametrize("key", ["a", "c"])
def test_an_actor_follows_the_run_across_rotations(rotated: tuple[str, Any], keys: Keys, key: str) -> None:
    from actor.updater import Updater

    uri, states = rotated
    actor = Updater(aurora_store.open_run(uri, verify_key=keys.public[key]), region="home")
    actor.bootstrap(1)
    for v in range(2, VERSIONS):
        actor.stage(v)
        applied = actor.apply()
        assert applied is not None and applied.version == v
    assert_bits_equal({k: t.cpu() for k, t in actor.weights.items()}, states[-1])


def test_an_actor_refuses_a_forged_rotation_and_keeps_its_weights(rotated: tuple[str, Any], keys: Keys) -> None:
    from actor.updater import Updater

    uri, states = rotated
    _forge(uri, keys, "new-key-only")
    actor = Updater(aurora_store.open_run(uri, verify_key=keys.public["a"]), region="home")
    actor.bootstrap(2)
    with pytest.raises(UnauthenticatedError):
        actor.stage(4)
    assert actor.applied is not None and actor.applied.version == 2
    assert_bits_equal({k: t.cpu() for k, t in actor.weights.items()}, states[2])


# ---------------------------------------------------------------- the trainer


def _trainer_config(tmp_path: Path, redis_url: str) -> Callable[..., Any]:
    """A trainer's config for the run under ``tmp_path``, given its signing key and the key to rotate to."""
    from trainer.config import OptimizerConfig, PublishConfig, TrainerConfig

    def cfg(signing_key: str, rotate: str | None = None) -> TrainerConfig:
        return TrainerConfig(
            store=f"file://{tmp_path}/run",
            redis=redis_url,
            run_id="rotate",
            optim=OptimizerConfig(sft_steps=0),
            publish=PublishConfig(signing_key=signing_key, rotate_signing_key=rotate),
        )

    return cfg


def test_a_trainer_rotates_with_the_option_and_refuses_the_new_key_alone(
    redis_server: Any, tmp_path: Path, keys: Keys
) -> None:
    from trainer.loop import Trainer

    cfg = _trainer_config(tmp_path, redis_server.url)

    key = {k: str(tmp_path / f"{k}.key") for k in "ab"}
    with Trainer(cfg(key["a"])) as trainer:
        assert trainer.start() == 0
    with Trainer(cfg(key["b"])) as trainer, pytest.raises(UnauthenticatedError, match="--rotate-signing-key"):
        trainer.start()
    with Trainer(cfg(key["a"], rotate=key["b"])) as trainer:
        trainer.start()
        info = trainer.publisher.publish(step=1)
    with Trainer(cfg(key["a"], rotate=key["b"])) as trainer:  # restarted with the option still set
        trainer.start()
        trainer.publisher.publish(step=2)
    with Trainer(cfg(key["b"])) as trainer:
        trainer.start()
        trainer.publisher.publish(step=3)
    for pub in ("a", "b"):
        run = aurora_store.open_run(f"file://{tmp_path}/run", verify_key=keys.public[pub])
        assert [run.manifest(v).rotation is not None for v in run.versions()] == [False, True, False, False]
        assert run.manifest(info.version).run.signed_by == keys.id("b")  # type: ignore[union-attr]
        run.materialize(3)


def test_a_replayed_rotation_manifest_stops_a_restart_with_how_to_repair(
    redis_server: Any, tmp_path: Path, keys: Keys
) -> None:
    """Issue 39: the manifest of an older rotation version replaced by another version's bytes. No version
    signed after it can be verified from this bucket, so a restarting trainer cannot go on: it stops
    naming that manifest and how to repair it (before, a bare 'cannot be verified'); put back, it resumes."""
    from trainer.loop import Trainer

    cfg = _trainer_config(tmp_path, redis_server.url)

    key = {k: str(tmp_path / f"{k}.key") for k in "ab"}
    with Trainer(cfg(key["a"])) as trainer:
        trainer.start()
    with Trainer(cfg(key["a"], rotate=key["b"])) as trainer:
        trainer.start()
        trainer.publisher.publish(step=1)  # version 1 rotates a -> b
    with Trainer(cfg(key["b"])) as trainer:
        trainer.start()
        trainer.publisher.publish(step=2)
        trainer.publisher.publish(step=3)
    path = tmp_path / "run" / manifest_key(1)
    real = path.read_bytes()
    path.write_bytes((tmp_path / "run" / manifest_key(2)).read_bytes())
    with Trainer(cfg(key["b"])) as trainer, pytest.raises(UnauthenticatedError) as err:
        trainer.start()
    said = str(err.value)
    assert "key rotation at version 1" in said and "copy its verified manifest" in said and str(path) in said
    path.write_bytes(real)
    with Trainer(cfg(key["b"])) as trainer:
        assert trainer.start() == 3


def test_a_publisher_never_rotates_back_to_a_key_the_run_used(rotated: tuple[str, Any], keys: Keys) -> None:
    uri, _ = rotated
    run = aurora_store.open_run(uri, signing_key=keys.private["c"])
    with pytest.raises(StoreError, match="signed this run before"):
        run.publish(_state(30), rotate_to=keys.private["a"])
    assert run.versions() == list(range(VERSIONS))


# ---------------------------------------------------------------- readers that live long (issue 34)


def _eventually(read: Any, what: str) -> None:
    """Poll (wait_for) until ``read()`` stops raising UnauthenticatedError: a reader relists after a
    backoff, never at once."""
    from aurora_store.testing.processes import wait_for

    def reads() -> bool:
        try:
            read()
        except UnauthenticatedError:
            return False
        return True

    wait_for(reads, what)


def test_a_storage_error_while_a_reader_learns_a_rotation_is_retried(
    rotated: tuple[str, Any], keys: Keys, tmp_path: Path
) -> None:
    """The rotation's manifest is not there as a file while a long-running reader first scans the run (a
    storage fault: here it is briefly a directory, so the reader's listing finds a marker without its
    manifest); once it is back, the same reader reads every version."""
    uri, states = rotated
    path = tmp_path / "home" / "run" / manifest_key(3)
    saved = path.read_bytes()
    path.unlink()
    path.mkdir()
    reader = aurora_store.open_run(uri, verify_key=keys.public["a"])
    assert_bits_equal(reader.materialize(2), states[2])
    with pytest.raises(UnauthenticatedError):
        reader.manifest(5)
    path.rmdir()
    path.write_bytes(saved)
    _eventually(lambda: reader.manifest(8), "the same reader after the fault")
    for v in range(VERSIONS):
        assert_bits_equal(reader.materialize(v), states[v])


def test_a_junk_rotation_planted_then_removed_does_not_stop_a_reader(tmp_path: Path, keys: Keys) -> None:
    """Junk and a key-rotation marker planted at the next version make a reader refuse it; once removed,
    the real version published there (here a rotation) is read by the same reader."""
    uri = f"file://{tmp_path}/run"
    states = publish_rotated(uri, keys, n=3, rotations={})
    store = ObjectStore(uri)
    store.put_if_absent(manifest_key(3), b"{junk")
    store.put_if_absent(rotation_marker_key(3), b"")
    reader = aurora_store.open_run(uri, verify_key=keys.public["a"])
    assert_bits_equal(reader.materialize(2), states[2])
    with pytest.raises(StoreError):
        reader.manifest(3)
    damage.delete(store, manifest_key(3))
    damage.delete(store, rotation_marker_key(3))
    run = aurora_store.open_run(uri, signing_key=keys.private["a"])
    run.resume()
    run.publish(_state(3), rotate_to=keys.private["b"])
    run.publish(_state(4))
    run.close()
    _eventually(lambda: reader.manifest(4), "the reader once the junk was removed")
    assert_bits_equal(reader.materialize(4), _state(4))


def test_a_reader_given_the_new_key_before_the_rotation_joins_once_it_commits(tmp_path: Path, keys: Keys) -> None:
    """An actor started with the new key (b) before the trainer rotates to it: refused at first (the run
    is still signed by a alone), it lists the run again (with a backoff) and reads it once b is rotated in."""
    uri = f"file://{tmp_path}/run"
    publish_rotated(uri, keys, n=3, rotations={})
    reader = aurora_store.open_run(uri, verify_key=keys.public["b"])
    with pytest.raises(UnauthenticatedError, match=f"the verify key given is {keys.id('b')}"):
        reader.manifest(2)
    run = aurora_store.open_run(uri, signing_key=keys.private["a"])
    run.resume()
    run.publish(_state(3), rotate_to=keys.private["b"])
    run.close()
    _eventually(lambda: reader.manifest(2), "a reader holding the rotated-in key")
    assert_bits_equal(reader.materialize(3), _state(3))


def test_a_rotated_out_key_cannot_retire_a_version_a_reader_needs(
    rotated: tuple[str, Any], keys: Keys, tmp_path: Path
) -> None:
    """After a to b to c, whoever still holds key a writes a record retiring version 1, dated in a's era
    (latest=2). Version 2 is a delta on 1: retiring 1 would hide what a reader must apply to reach 2. The
    record is not honoured: a relay into a new region copies every version and the audit retires none."""
    from aurora_store.bucket.audit import audit
    from aurora_store.bucket.retention import records
    from aurora_store.format import retention
    from aurora_store.format.retention import Retired

    uri, states = rotated
    run = aurora_store.open_run(uri, verify_key=keys.public["c"])
    origin = run.reader.lineage().origin
    assert origin is not None and run.manifest(2).kind == "delta"
    old = signing.load_signing_key(keys.private["a"])
    run.store.put_if_absent(*retention.encode(Retired() | [1, 1], 5, latest=2, origin=origin, key=old))
    found = records(run.reader)
    assert 1 not in found.retired and "version 2" in found.bad[0], found.bad
    dest = f"file://{tmp_path}/new-region/run"
    relay = Relay(
        ObjectStore(uri), ObjectStore(dest), None, source_region="home", dest_region="new", verify_key=keys.public["c"]
    )
    assert relay.backfill() == list(range(VERSIONS))
    relay.close()
    assert_bits_equal(aurora_store.open_run(dest, verify_key=keys.public["b"]).materialize(2), states[2])
    home = audit(aurora_store.open_run(uri, verify_key=keys.public["a"]))
    assert home.retired == 0 and len(home.bad_records) == 1


def test_a_restart_with_the_retired_key_alone_is_told_it_was_retired(rotated: tuple[str, Any], keys: Keys) -> None:
    """Issue 34: restarting with the key rotated away from suggested to "rotate"; it says when it was retired."""
    uri, _ = rotated
    run = aurora_store.open_run(uri, signing_key=keys.private["a"])
    with pytest.raises(UnauthenticatedError, match=f"key {keys.id('a')} was retired at version 3") as err:
        run.publisher.planner.check_signer()
    assert f"signed by key {keys.id('c')} now" in str(err.value) and "--rotate-signing-key" not in str(err.value)


# ---------------------------------------------------------------- stray key-rotation markers (issue 34)


def _marker_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "key-rotation marker" in r.getMessage()]


def test_planted_markers_cost_a_reader_one_warning_and_gc_removes_them(
    rotated: tuple[str, Any], keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """Markers planted beside versions that rotate no key: a new reader reads every version, with one
    warning naming them (not one per marker, nor again when it learns the keys afresh); ``gc --apply``
    removes them and keeps the real rotations' markers and every version."""
    from aurora_store.bucket import gc

    uri, states = rotated
    store = ObjectStore(uri)
    planted = [v for v in range(VERSIONS) if v not in ROTATIONS]
    for v in planted:
        store.put_if_absent(rotation_marker_key(v), b"")
    store.put_if_absent(rotation_marker_key(VERSIONS + 5), b"")  # above the latest: a publish in progress
    reader = aurora_store.open_run(uri, verify_key=keys.public["a"])
    for v in range(VERSIONS):
        assert_bits_equal(reader.materialize(v), states[v])
    (warning,) = _marker_warnings(caplog)  # version 0's is not even read: no rotation can be there
    assert f"{len(planted) - 1} key-rotation marker(s)" in warning and "aurora gc --apply" in warning
    assert reader.reader.trust._not_rotations == set(planted) - {0}
    assert reader.reader.trust.relearn(reader.reader.lineage())  # learn the keys again: nothing re-read or re-warned
    reader.manifest(VERSIONS - 1)
    assert len(_marker_warnings(caplog)) == 1

    run = aurora_store.open_run(uri, signing_key=keys.private["c"])
    plan = gc.plan(run, gc.RetentionPolicy(keep_last=VERSIONS, keep_fulls=3, keep_states=1))
    assert plan.stray_markers == planted and plan.to_dict()["stray_markers"] == planted
    assert gc.apply(run, plan)["markers"] == len(planted)
    left = sorted(k for k in store.list_keys("versions") if k.endswith("/key-rotation"))
    assert left == [rotation_marker_key(v) for v in (*sorted(ROTATIONS), VERSIONS + 5)]
    caplog.clear()
    fresh = aurora_store.open_run(uri, verify_key=keys.public["b"])
    assert_bits_equal(fresh.materialize(VERSIONS - 1), states[-1])
    assert _marker_warnings(caplog) == []


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_a_marker_left_by_a_killed_rotation_is_removed_by_the_next_publish(
    tmp_path: Path, keys: Keys, caplog: pytest.LogCaptureFixture, s3_server: Any, backend: str
) -> None:
    """A trainer killed mid-rotation left version 3's marker but not its manifest; restarted without the
    rotation, it publishes version 3 with the same key and removes the marker first, saying so. Where no
    marker was left (every other start), it says nothing: an S3 delete of a missing key succeeds, so
    the publisher looks before it deletes."""
    opts = s3_server.options() if backend == "s3" else None
    uri = f"s3://{s3_server.new_bucket()}/runs/exp" if backend == "s3" else f"file://{tmp_path}/run"
    publish_rotated(uri, keys, n=3, rotations={}, storage_options=opts)
    assert _marker_warnings(caplog) == [], "no marker, no word of one"
    store = ObjectStore(uri, opts)
    store.put_if_absent(rotation_marker_key(3), b"")
    run = aurora_store.open_run(uri, signing_key=keys.private["a"], storage_options=opts)
    run.resume()
    run.publish(_state(3))
    run.publish(_state(4))
    run.close()
    assert not store.exists(rotation_marker_key(3))
    assert [m for m in _marker_warnings(caplog) if "removed" in m and "version 3" in m], _marker_warnings(caplog)
    caplog.clear()
    reader = aurora_store.open_run(uri, verify_key=keys.public["a"], storage_options=opts)
    assert_bits_equal(reader.materialize(4), _state(4))
    assert _marker_warnings(caplog) == []
