"""Every version is bound to its run and its key: another run's version is refused by readers and
relays even under the same key, a legacy run continues bound to its origin, and signing is one
switch fixed at version 0 that cannot be stripped or downgraded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import aurora_store
from aurora_store.errors import ChainError, UnauthenticatedError
from aurora_store.format.keys import manifest_key
from aurora_store.testing import damage
from tests.test_cli import aurora


def _like_pair() -> dict[str, torch.Tensor]:
    return {"w": torch.linspace(-1, 1, 4096).to(torch.bfloat16)}


def _pair(tmp_path: Path, key: bytes | None = None, n: int = 3) -> tuple[Any, Any]:
    """Two runs of the same model, signed by the same key (or both unsigned), ``n`` versions each."""
    runs = []
    for name in ("a", "b"):
        run = aurora_store.open_run(f"file://{tmp_path}/{name}/run", signing_key=key, full_every=2)
        w = _like_pair()
        for i in range(n):
            w["w"][i] += 1 if name == "a" else 2
            run.publish(w)
        runs.append(run)
    return runs[0], runs[1]


def _transplant(src: Any, dst: Any, version: int) -> None:
    """Put every object of ``src``'s ``version`` (its manifest too) in ``dst``'s place for it."""
    prefix = f"versions/{version:010d}/"
    for key in src.store.list_keys(prefix):
        damage.overwrite(dst.store, key, src.store.get(key, max_bytes=1 << 24))


def _signing_key() -> tuple[bytes, bytes]:
    from aurora_store.format.signing import generate_keypair

    return generate_keypair()


@pytest.mark.parametrize("version", [1, 2], ids=["delta", "full"])
def test_another_runs_version_is_refused_by_readers_even_under_the_same_key(tmp_path: Path, version: int) -> None:
    priv, pub = _signing_key()
    a, b = _pair(tmp_path, priv)
    assert a.manifest(version).kind == ("delta" if version == 1 else "full")
    _transplant(b, a, version)
    fresh = aurora_store.open_run(a.uri, verify_key=pub)
    with pytest.raises(ChainError, match="belongs to run"):
        fresh.materialize(version)
    with pytest.raises(ChainError, match="belongs to run"):
        fresh.manifest(version)  # what the actor's updater and replay read first
    audited = aurora("audit", a.uri, "--json", env={"AURORA_VERIFY_KEY": pub.decode()})
    rows = {r["version"]: r["status"] for r in json.loads(audited.stdout)["versions"]}
    assert audited.returncode == 1 and rows[version] == "failed" and rows[0] == "ok"


def test_the_relay_refuses_another_runs_version_and_commits_the_real_one_after(tmp_path: Path) -> None:
    from relay.worker import Relay

    priv, pub = _signing_key()
    a, b = _pair(tmp_path, priv)
    dest = aurora_store.open_run(f"file://{tmp_path}/eu/run", verify_key=pub)
    relay = Relay(a.store, dest.store, None, source_region="home", dest_region="eu", verify_key=pub)
    assert relay.copy_version(0) and relay.copy_version(1)
    real = {k: a.store.get(k, max_bytes=1 << 24) for k in a.store.list_keys("versions/0000000002/")}
    _transplant(b, a, 2)  # another run's full version 2 in the source
    with pytest.raises(ChainError):
        relay.copy_version(2)
    assert not dest.store.exists(manifest_key(2)), "nothing committed: the real version is not kept out"
    for k, data in real.items():
        damage.overwrite(a.store, k, data)
    assert relay.copy_version(2)
    assert (
        aurora_store.open_run(dest.uri, verify_key=pub).materialize_words(2).digest.hex()
        == a.manifest(2).weights_digest
    )


def test_the_relay_refuses_a_version_that_does_not_continue_the_destination(tmp_path: Path) -> None:
    from relay.worker import Relay

    a, b = _pair(tmp_path)
    dest = aurora_store.open_run(f"file://{tmp_path}/eu/run")
    Relay(b.store, dest.store, None, source_region="home", dest_region="eu").copy_version(0)  # b's origin at eu
    relay = Relay(a.store, dest.store, None, source_region="home", dest_region="eu")
    with pytest.raises(ChainError, match="the destination's run"):
        relay.copy_version(1)
    assert not dest.store.exists(manifest_key(1))


def test_a_legacy_run_stays_readable_and_continues_bound_to_its_origin(tmp_path: Path) -> None:
    import shutil

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    golden = Path(__file__).parent / "data" / "golden"
    shutil.copytree(golden / "run", tmp_path / "run")
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_golden", golden / "make_golden.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]  # the test vector's key: not a secret
    key = Ed25519PrivateKey.from_private_bytes(mod.SEED)
    uri = (tmp_path / "run").as_uri()
    run = aurora_store.open_run(uri, signing_key=key, full_every=3)
    latest = run.latest()
    assert run.manifest(latest).format == "aurora/1"
    sd = run.materialize(latest)
    name = next(n for n in sorted(sd) if sd[n].dtype == torch.bfloat16 and sd[n].numel())
    sd[name] = sd[name].clone()
    sd[name].view(-1)[0] += 1
    info = run.publish(sd)
    reader = aurora_store.open_run(uri, verify_key=str(golden / "key.pub"))
    m = reader.manifest(info.version)
    assert m.format in ("aurora/2", "aurora/3") and m.run is not None
    assert m.run.origin == reader.manifest(0).version_hash and m.run.signed_by == reader.manifest(0).signature.key_id  # type: ignore[union-attr]
    assert reader.materialize_words(info.version).digest.hex() == m.weights_digest
    with pytest.raises(UnauthenticatedError, match="give its public key"):
        aurora_store.open_run(uri).materialize(info.version)  # the legacy run was signed: so is its continuation


def test_a_signed_run_cannot_be_read_published_or_relayed_without_its_key(tmp_path: Path) -> None:
    from relay.worker import Relay

    priv, pub = _signing_key()
    a, _ = _pair(tmp_path, priv, n=2)
    assert a.manifest(0).run.signed_by == a.signer  # type: ignore[union-attr]
    with pytest.raises(UnauthenticatedError, match="give its public key"):
        aurora_store.open_run(a.uri).materialize(1)
    other_pub = _signing_key()[1]
    with pytest.raises(UnauthenticatedError, match="signed by key"):
        aurora_store.open_run(a.uri, verify_key=other_pub).materialize(1)
    dest = aurora_store.open_run(f"file://{tmp_path}/eu/run")
    with pytest.raises(UnauthenticatedError):
        Relay(a.store, dest.store, None, source_region="home", dest_region="eu").copy_version(0)
    assert dest.store.list_keys("") == []
    before = a.store.list_keys("")
    with pytest.raises(UnauthenticatedError, match="publish with its key"):
        aurora_store.open_run(a.uri).publish(_like_pair())
    with pytest.raises(UnauthenticatedError, match="signed by key"):
        aurora_store.open_run(a.uri, signing_key=_signing_key()[0]).publish(_like_pair())
    assert a.store.list_keys("") == before
    replay = aurora("replay", a.uri, "--out", str(tmp_path / "out"))
    assert replay.returncode == 1 and "give its public key" in replay.stderr
    assert (
        aurora("replay", a.uri, "--out", str(tmp_path / "out"), env={"AURORA_VERIFY_KEY": pub.decode()}).returncode == 0
    )


def test_an_unsigned_run_cannot_turn_signed(tmp_path: Path) -> None:
    a, _ = _pair(tmp_path, n=1)
    with pytest.raises(UnauthenticatedError, match="fixed at version 0"):
        aurora_store.open_run(a.uri, signing_key=_signing_key()[0]).publish(_like_pair())


@pytest.mark.parametrize("keep_signed_by", [True, False])
def test_a_stripped_signature_is_refused(tmp_path: Path, keep_signed_by: bool) -> None:
    priv, pub = _signing_key()
    a, _ = _pair(tmp_path, priv, n=2)
    doc = json.loads(a.store.get(manifest_key(1), max_bytes=1 << 20))
    doc["signature"] = None
    if not keep_signed_by:
        doc["run"]["signed_by"] = None  # claims the run is unsigned: but version 0 says it is signed
    body = {k: v for k, v in doc.items() if k not in ("version_hash", "signature")}
    from aurora_store.format.manifest import canonical

    doc["version_hash"] = hashlib.sha256(canonical(body)).hexdigest()
    damage.overwrite(a.store, manifest_key(1), canonical(doc))
    with pytest.raises((UnauthenticatedError, ChainError)):
        aurora_store.open_run(a.uri, verify_key=pub).manifest(1)
    with pytest.raises((UnauthenticatedError, ChainError)):
        aurora_store.open_run(a.uri).manifest(1)
