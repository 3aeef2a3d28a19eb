"""A restarted trainer never loses steps silently (issue 22, part 1).

The trainer saves the state of committed versions off the training thread, bound to the version's
hash and the run and signed like a version. A restart continues from the newest state it can verify;
when that is older than the latest version, the next version records ``rolls_back_to`` and the
versions it abandons. These tests drive the real :class:`~trainer.loop.Trainer` in this process (its
dispatcher needs a real Redis); the kill of a real trainer process is in ``test_rl_loop.py``.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import generate_latest

from aurora_store.bucket import gc
from aurora_store.bucket.audit import audit
from aurora_store.bucket.run import open_run
from aurora_store.bucket.state import StateName
from aurora_store.cli import main as aurora
from aurora_store.errors import ChainError, ConfigError, CorruptError, StoreError, UnauthenticatedError
from aurora_store.format import signing, trainer_state
from aurora_store.format.manifest import Rollback
from aurora_store.format.manifest_parser import parse_manifest
from aurora_store.testing.processes import wait_for
from trainer.config import OptimizerConfig, PublishConfig, TrainerConfig
from trainer.loop import Trainer
from trainer.state import TENSORS, load_state, saved_versions

ROWS = [[[3, 4, 5], [6, 7], [-1.0, -2.0], 1.0], [[3, 4, 5], [8, 9], [-1.5, -0.5], 0.0]]
BATCH: dict[str, Any] = {"rows": ROWS, "adv": [1.0, -1.0], "version": None}


def _config(tmp_path: Path, redis_url: str, *, state_every: int = 1, key: str | None = None) -> TrainerConfig:
    return TrainerConfig(
        store=(tmp_path / "run").as_uri(),
        redis=redis_url,
        run_id="resume",
        steps=50,
        optim=OptimizerConfig(sft_steps=0, lr=1e-2),
        publish=PublishConfig(state_every=state_every, signing_key=key, full_every=50),
    )


def _steps(trainer: Trainer, first: int, last: int) -> None:
    """Train and commit steps ``first..last`` as the loop does (without actors: one fixed batch)."""
    for step in range(first, last + 1):
        trainer.train_step(step, BATCH)
        trainer.commit(step)
    trainer.states.flush()


def _rolled_back(tmp_path: Path, redis_url: str) -> TrainerConfig:
    """A run whose trainer saved states every 3 versions and stopped after version 4; restarted, it
    published version 5 from version 3's state (rolling back version 4)."""
    cfg = _config(tmp_path, redis_url, state_every=3)
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 4)
    with Trainer(cfg) as second:
        second.start()
        _steps(second, 5, 5)
    return cfg


def _state_dir(tmp_path: Path, run: Any, version: int) -> Path:
    """Where the state of committed ``version`` lives on disk (named by the version's hash)."""
    return tmp_path / "run" / StateName.of(version, run.manifest(version).version_hash).dir


def _masters(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def key(tmp_path: Path) -> Path:
    private, _ = signing.generate_keypair()
    path = tmp_path / "trainer.pem"
    path.write_bytes(private)
    return path


@pytest.mark.slow
def test_every_version_has_a_state_and_a_restart_is_exact(redis_server: Any, tmp_path: Path, key: Path) -> None:
    cfg = _config(tmp_path, redis_server.url, key=str(key))
    with Trainer(cfg) as first:
        assert first.start() == 0
        _steps(first, 1, 3)
        at_three = _masters(first)
        assert first.states.cost.saves == 4 and first.states.cost.failed == 0
        assert first.states.cost.bytes > 0
    run = open_run(cfg.store, signing_key=str(key))
    assert run.state.versions() == [0, 1, 2, 3]
    name = StateName.of(3, run.manifest(3).version_hash)
    assert (tmp_path / "run" / "trainer" / f"state-0000000003-{run.manifest(3).version_hash[:16]}").is_dir()
    doc = trainer_state.parse(run.state.get_commit(name, max_bytes=1 << 20), expect_version=3, what="state 3")
    assert doc.version_hash == run.manifest(3).version_hash and doc.origin == run.manifest(0).version_hash
    assert doc.signature is not None and doc.signature.key_id == run.manifest(3).signature.key_id  # type: ignore[union-attr]
    with Trainer(cfg) as second:
        assert second.start() == 3
        assert second.weights_version == 3 and second.rollback is None
        assert _same(_masters(second), at_three), "the exact weights of the latest version"
        _steps(second, 4, 4)
    m4 = open_run(cfg.store, signing_key=str(key)).manifest(4)
    assert m4.rolls_back_to is None and m4.format != "aurora/4", "an ordinary version keeps the older format"


def test_a_restart_from_an_older_state_records_the_rollback(redis_server: Any, tmp_path: Path, key: Path) -> None:
    """--state-every 4, the trainer stops after version 6: version 7 continues from version 4's state
    and says so, in its manifest, in ``aurora ls`` and ``aurora audit``, and in a metric."""
    cfg = _config(tmp_path, redis_server.url, state_every=4, key=str(key))
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 4)
        at_four = _masters(first)
        _steps(first, 5, 6)
    run = open_run(cfg.store, signing_key=str(key))
    assert run.state.versions() == [0, 4]
    with Trainer(cfg) as second:
        assert second.start() == 6
        assert second.weights_version == 4
        assert _same(_masters(second), at_four), "continues from version 4's masters, not version 6's"
        assert second.rollback == Rollback(4, run.manifest(4).version_hash, (5, 6))
        _steps(second, 7, 7)
        metrics = generate_latest(second.metrics.m.registry).decode()
    assert "aurora_trainer_rollbacks_total 1.0" in metrics and "aurora_trainer_abandoned_versions_total 2.0" in metrics
    m7 = open_run(cfg.store, signing_key=str(key)).manifest(7)
    assert m7.format == "aurora/4" and m7.parent is not None and m7.parent.version == 6
    assert m7.rolls_back_to == Rollback(4, run.manifest(4).version_hash, (5, 6))
    assert audit(open_run(cfg.store, signing_key=str(key))).ok, "actors and auditors treat it as an ordinary version"


def test_ls_and_audit_show_a_rollback(redis_server: Any, tmp_path: Path, capsys: Any) -> None:
    cfg = _rolled_back(tmp_path, redis_server.url)
    capsys.readouterr()
    assert aurora(["ls", cfg.store]) == 0
    out = capsys.readouterr().out
    assert "rolls back to 3 (abandons 4)" in out, out
    assert aurora(["ls", cfg.store, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    row = next(r for r in rows if r["version"] == 5)
    assert row["rolls_back_to"] == {"version": 3, "abandons": [4]}
    assert aurora(["audit", cfg.store, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rollbacks"] == [{"version": 5, "rolls_back_to": 3, "abandons": [4]}]


@pytest.mark.parametrize("damage", ["tensors", "unsigned", "other_key", "other_version", "missing_tensors"])
def test_a_damaged_or_planted_latest_state_is_refused(
    redis_server: Any, tmp_path: Path, key: Path, damage: str
) -> None:
    """An attacker with write access to the home prefix (or a torn disk) cannot make a restarted
    trainer load a state the run's trainer did not write for that version: it falls back to the
    newest state that verifies and records the rollback."""
    cfg = _config(tmp_path, redis_server.url, key=str(key))
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 3)
    run = open_run(cfg.store, signing_key=str(key))
    d3 = _state_dir(tmp_path, run, 3)
    doc = json.loads((d3 / "state.json").read_bytes())
    if damage == "tensors":
        blob = bytearray((d3 / TENSORS).read_bytes())
        blob[-1] ^= 1
        (d3 / TENSORS).write_bytes(bytes(blob))
    elif damage == "missing_tensors":
        (d3 / TENSORS).unlink()
    elif damage == "unsigned":
        doc["signature"] = None
        (d3 / "state.json").write_bytes(json.dumps(doc).encode())
    elif damage == "other_key":
        other = signing.load_signing_key(signing.generate_keypair()[0])
        tensors = trainer_state.TensorFile(**doc["tensors"])
        forged = trainer_state.new(3, doc["version_hash"], doc["origin"], tensors, doc["trainer"], other)
        (d3 / "state.json").write_bytes(forged.to_bytes())
    else:  # version 2's genuine state planted as version 3's
        shutil.rmtree(d3)
        shutil.copytree(_state_dir(tmp_path, run, 2), d3)
        two = json.loads((d3 / "state.json").read_bytes())
        two["version"] = 3
        (d3 / "state.json").write_bytes(json.dumps(two).encode())
    expected = {
        "tensors": CorruptError,
        "missing_tensors": StoreError,
        "unsigned": UnauthenticatedError,
        "other_key": UnauthenticatedError,
        "other_version": ChainError,
    }[damage]
    with Trainer(cfg) as second:
        assert second.start() == 3
        assert second.weights_version == 2
        assert second.rollback is not None and second.rollback.version == 2 and second.rollback.abandons == (3,)
        with pytest.raises(expected):
            load_state(run, 3, second.model, second.opt, random.Random())


def test_an_unsigned_run_reads_a_legacy_state_as_earlier_code_wrote_it(redis_server: Any, tmp_path: Path) -> None:
    cfg = _config(tmp_path, redis_server.url)
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 2)
    d2 = _state_dir(tmp_path, open_run(cfg.store), 2)
    doc = json.loads((d2 / "state.json").read_bytes())
    legacy = {"format": trainer_state.LEGACY, "version": 2, **doc["trainer"]}
    (d2 / "state.json").write_bytes(json.dumps(legacy).encode())
    with Trainer(cfg) as second:  # an unsigned run: a legacy state is read as earlier code wrote it
        assert second.start() == 2 and second.weights_version == 2


def test_a_signed_run_never_trusts_a_planted_unsigned_state(redis_server: Any, tmp_path: Path, key: Path) -> None:
    """Issue 34, bug 3: every signed state deleted and an unsigned state of the old format planted with weights
    of the attacker's choosing. The restart refuses it (no state it can trust: it stops, saying why and how a
    run written by earlier code continues) and publishes nothing; with --trust-unsigned-state, the operator's
    explicit word for a run written before states were signed, it resumes from it."""
    cfg = _config(tmp_path, redis_server.url, key=str(key))
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 2)
    run = open_run(cfg.store, signing_key=str(key))
    d2 = _state_dir(tmp_path, run, 2)
    doc = json.loads((d2 / "state.json").read_bytes())
    legacy = tmp_path / "run" / StateName(2).dir  # the name earlier code gave a state: its version alone
    shutil.copytree(d2, legacy)  # (the attacker's own weights would go in its tensors: these are the run's)
    for v in (0, 1, 2):
        shutil.rmtree(_state_dir(tmp_path, run, v))
    planted = {"format": trainer_state.LEGACY, "version": 2, **doc["trainer"]}
    (legacy / "state.json").write_bytes(json.dumps(planted).encode())
    with Trainer(cfg) as second, pytest.raises(StoreError, match="--trust-unsigned-state"):
        second.start()
    assert open_run(cfg.store).versions() == [0, 1, 2], "nothing published from it"
    cfg.publish.trust_unsigned_state = True
    with Trainer(cfg) as third:
        assert third.start() == 2 and third.weights_version == 2


def test_a_version_without_a_resumable_state_is_not_committed(redis_server: Any, tmp_path: Path) -> None:
    """Issue 34, bug 5: the states cannot be written (here ``trainer/`` is a file), the versions can. The
    trainer used to commit versions 0-6, log each failed state, and leave a run no restart could resume.
    Version 0 is not committed when its state fails (the run has none), and the trainer stops saying so;
    once the bucket is writable, a restart starts the run."""
    cfg = _config(tmp_path, redis_server.url)
    blocked = tmp_path / "run" / "trainer"
    blocked.parent.mkdir(parents=True)
    blocked.write_bytes(b"not a directory")
    with Trainer(cfg) as first, pytest.raises(StoreError, match="version 0 is not committed"):
        first.start()
    assert open_run(cfg.store).versions() == [], "nothing a restart could not resume"
    blocked.unlink()
    with Trainer(cfg) as second:
        assert second.start() == 0
        _steps(second, 1, 1)
    assert open_run(cfg.store).versions() == [0, 1]


def test_states_that_keep_failing_stop_the_trainer_and_a_restart_rolls_back(redis_server: Any, tmp_path: Path) -> None:
    """With a state saved (version 0's), versions go on committing while later states fail (a restart rolls
    back to it), until MAX_FAILED_SAVES in a row stop the trainer, saying why."""
    from trainer.state import MAX_FAILED_SAVES

    cfg = _config(tmp_path, redis_server.url)
    states = tmp_path / "run" / "trainer"
    with Trainer(cfg) as first:
        assert first.start() == 0
        states.rename(tmp_path / "aside")
        states.write_bytes(b"not a directory")
        with pytest.raises(StoreError, match=f"{MAX_FAILED_SAVES} trainer states in a row could not be saved"):
            _steps(first, 1, MAX_FAILED_SAVES + 1)
    committed = open_run(cfg.store).versions()
    assert committed == list(range(MAX_FAILED_SAVES + 1)), "each version whose state failed still committed"
    states.unlink()
    (tmp_path / "aside").rename(states)
    with Trainer(cfg) as second:
        assert second.start() == MAX_FAILED_SAVES
        assert second.weights_version == 0 and second.rollback is not None
        assert second.rollback.abandons == tuple(range(1, MAX_FAILED_SAVES + 1))


def test_gc_keeps_only_states_that_verify(redis_server: Any, tmp_path: Path, key: Path) -> None:
    """Issue 34, bug 7: a create-only writer without any key plants ``state.json`` = junk under the correctly
    tagged names of versions 5 and 6, which have no state (the tags are public manifest hashes). gc kept the
    junk as the newest two states and deleted the real ones; the restart failed. A state counts as kept only
    once it verifies: the real ones stay and the restart resumes from version 4's."""
    cfg = _config(tmp_path, redis_server.url, state_every=4, key=str(key))
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 6)
    run = open_run(cfg.store, signing_key=str(key))
    assert saved_versions(run) == [0, 4]
    for v in (5, 6):
        run.store.put_if_absent(f"{StateName.of(v, run.manifest(v).version_hash).dir}/state.json", b'{"junk": 1}')
    p = gc.plan(run, gc.RetentionPolicy(keep_last=1, keep_fulls=1, keep_states=2, holds={}))
    assert p.states_kept == [0, 4] and len(p.bad_states) == 2, p.bad_states
    gc.apply(run, p)
    assert 4 in saved_versions(run)
    with Trainer(cfg) as second:
        assert second.start() == 6 and second.weights_version == 4


def test_a_rollback_says_which_states_were_missing(
    redis_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34: after a deleted state the warning blamed "--state-every is above 1" with --state-every 1."""
    cfg = _config(tmp_path, redis_server.url)
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 3)
    shutil.rmtree(_state_dir(tmp_path, open_run(cfg.store), 3))
    with Trainer(cfg) as second:
        assert second.start() == 3 and second.weights_version == 2
    said = "\n".join(r.getMessage() for r in caplog.records if "abandons" in r.getMessage())
    assert "version(s) 3 missing: not saved, or deleted" in said and "--state-every" not in said, said


def test_gc_keeps_what_a_restart_needs(redis_server: Any, tmp_path: Path) -> None:
    """Retention with the smallest allowed policy, then a restart: no retired manifest is read."""
    cfg = _config(tmp_path, redis_server.url, state_every=2)
    cfg.publish.full_every = 3
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 5)
    run = open_run(cfg.store)
    p = gc.plan(run, gc.RetentionPolicy(keep_last=1, keep_fulls=1, keep_states=1, holds={}))
    gc.apply(run, p)
    assert p.retire, "something was retired"
    assert 3 in p.retire or 2 in p.retire
    with Trainer(cfg) as second:
        assert second.start() == 5
        assert second.weights_version == 4 and second.rollback is not None and second.rollback.abandons == (5,)
        _steps(second, 6, 6)
    assert open_run(cfg.store).manifest(6).rolls_back_to is not None


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_state_every_below_one_is_a_usage_error(tmp_path: Path, capsys: Any, value: str) -> None:
    argv = ["train", "--store", (tmp_path / "run").as_uri(), "--redis", "redis://127.0.0.1:1/0", "--run-id", "x"]
    try:
        rc = aurora([*argv, "--state-every", value])
    except SystemExit as exc:  # argparse: not an integer
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert rc in (1, 2) and "--state-every" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists(), "nothing written"
    with pytest.raises(ConfigError):
        PublishConfig(state_every=0)


def test_the_rollback_field_is_checked_by_the_parser(redis_server: Any, tmp_path: Path) -> None:
    _rolled_back(tmp_path, redis_server.url)
    raw = json.loads((tmp_path / "run" / "versions" / "0000000005" / "manifest.json").read_bytes())
    for bad in (
        {"version": 3, "version_hash": raw["rolls_back_to"]["version_hash"], "abandons": [4, 5]},
        {"version": 3, "version_hash": raw["rolls_back_to"]["version_hash"], "abandons": []},
        {"version": 4, "version_hash": raw["rolls_back_to"]["version_hash"], "abandons": []},
        {"version": 3, "version_hash": "zz", "abandons": [4]},
        {"version": -1, "version_hash": raw["rolls_back_to"]["version_hash"], "abandons": [4]},
        {"version": 3, "abandons": [4]},
        [3],
    ):
        with pytest.raises(CorruptError):
            parse_manifest(json.dumps({**raw, "rolls_back_to": bad}).encode(), expect_version=5)
    older = {k: v for k, v in raw.items() if k != "rolls_back_to"} | {"format": "aurora/3"}
    with pytest.raises(CorruptError):  # aurora/3 has no such field
        parse_manifest(json.dumps({**older, "rolls_back_to": raw["rolls_back_to"]}).encode(), expect_version=5)


def test_states_planted_above_the_latest_version_do_not_make_gc_drop_real_ones(
    redis_server: Any, tmp_path: Path
) -> None:
    """Someone with write access plants committed-looking states for versions that do not exist yet:
    gc neither counts them as the newest states (deleting the real ones) nor does a restart use them."""
    cfg = _config(tmp_path, redis_server.url)
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 3)
    run = open_run(cfg.store)
    for v in (10**9, 10**9 + 1):
        run.state.put(StateName(v), TENSORS, b"junk")
        run.state.commit(StateName(v), b'{"format": "aurora-trainer-state/2"}')
    p = gc.plan(run, gc.RetentionPolicy(keep_last=1, keep_fulls=1, keep_states=1, holds={}))
    assert p.states_kept == [3] and 10**9 not in {n.version for n in p.states_deleted}
    gc.apply(run, p)
    assert 3 in run.state.versions()
    with Trainer(cfg) as second:
        assert second.start() == 3 and second.weights_version == 3 and second.rollback is None


def test_a_trainer_killed_between_its_state_and_its_commit_resumes_exactly(
    redis_server: Any, tmp_path: Path, key: Path
) -> None:
    """A version is committed only after its state is saved, and the state is named by the version's
    hash: a trainer that dies in between leaves a state of a version that never committed, which the
    restarted trainer neither uses nor collides with when it publishes that version again."""
    cfg = _config(tmp_path, redis_server.url, key=str(key))
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 2)
        at_two = _masters(first)
        first.train_step(3, BATCH)
        held = first.publisher.publish(step=3, meta={"trainer": first.tag}, defer=True)
        first._save_state(3, held.version_hash)  # the state is saved; the process dies before the commit
        first.states.flush()
    run = open_run(cfg.store, signing_key=str(key))
    assert run.latest() == 2 and 3 in run.state.versions()
    with Trainer(cfg) as second:
        assert second.start() == 2
        assert second.weights_version == 2 and second.rollback is None
        assert _same(_masters(second), at_two)
        _steps(second, 3, 3)
    run = open_run(cfg.store, signing_key=str(key))
    v3 = run.manifest(3)
    assert v3.version_hash != held.version_hash and v3.rolls_back_to is None
    names = [n for n in run.state.names() if n.version == 3]
    assert sorted(n.tag for n in names) == sorted([held.version_hash[:16], v3.version_hash[:16]])  # type: ignore[type-var]
    p = gc.plan(run, gc.RetentionPolicy(keep_last=1, keep_fulls=1, keep_states=1, holds={}))
    assert StateName.of(3, held.version_hash) in p.states_deleted, "the orphan goes"
    gc.apply(run, p)
    assert [n.tag for n in run.state.names() if n.version == 3] == [v3.version_hash[:16]]
    with Trainer(cfg) as third:
        assert third.start() == 3 and third.weights_version == 3 and third.rollback is None


@pytest.mark.slow
@pytest.mark.parametrize("how", ["other_key", "replayed"])
def test_a_forged_latest_manifest_stops_the_restart_with_how_to_repair(
    redis_server: Any, tmp_path: Path, key: Path, how: str
) -> None:
    """Issue 34: the latest manifest replaced (signed by another key, or an older version's bytes replayed).
    The restart stops before it publishes anything or touches a state, naming the version and how to repair
    it; with the manifest put back, it resumes exactly where it was."""
    cfg = _config(tmp_path, redis_server.url, key=str(key))
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 2)
        masters = _masters(first)
    path = tmp_path / "run" / "versions" / f"{2:010d}" / "manifest.json"
    real = path.read_bytes()
    if how == "other_key":
        other, _ = signing.generate_keypair()
        m = parse_manifest(real, expect_version=2)
        path.write_bytes(signing.seal(m, signing.load_signing_key(other)).to_bytes())
    else:
        path.write_bytes((path.parent.parent / f"{1:010d}" / "manifest.json").read_bytes())
    states = sorted(p.name for p in (tmp_path / "run" / "trainer").iterdir())
    with Trainer(cfg) as second, pytest.raises((UnauthenticatedError, CorruptError)) as err:
        second.start()
    said = str(err.value)
    assert "latest version, 2, does not verify" in said and "copy its verified manifest" in said and str(path) in said
    assert open_run(cfg.store, signing_key=str(key)).versions() == [0, 1, 2]
    assert sorted(p.name for p in (tmp_path / "run" / "trainer").iterdir()) == states, "no state touched"
    path.write_bytes(real)
    with Trainer(cfg) as third:
        assert third.start() == 2 and third.weights_version == 2
        assert _same(_masters(third), masters)


@pytest.mark.slow
def test_a_forged_or_replayed_older_manifest_does_not_stop_a_restart(
    redis_server: Any, tmp_path: Path, key: Path, caplog: Any
) -> None:
    """Issue 39: while a restarted trainer resumes, it reads older manifests (the versions whose jobs'
    results may still come in, the parent's chain it diffs against). One forged (another key) and one
    replayed (an older version's bytes) are damage, as a corrupt segment is: never built on, said
    loudly (an error in the log, ``aurora_artifacts_rejected_total``), and the next version is full.
    Once the manifests are put back, the run audits clean: the full version says its count is unknown."""
    cfg = _config(tmp_path, redis_server.url, key=str(key))
    with Trainer(cfg) as first:
        first.start()
        _steps(first, 1, 5)
    run = open_run(cfg.store, signing_key=str(key))
    assert [run.manifest(v).kind for v in (4, 5)] == ["full", "delta"], "the premise: version 5's chain holds 4"
    versions = tmp_path / "run" / "versions"
    real = {v: (versions / f"{v:010d}" / "manifest.json").read_bytes() for v in (3, 4)}
    other, _ = signing.generate_keypair()
    forged = signing.seal(parse_manifest(real[4], expect_version=4), signing.load_signing_key(other))
    (versions / f"{4:010d}" / "manifest.json").write_bytes(forged.to_bytes())
    (versions / f"{3:010d}" / "manifest.json").write_bytes((versions / f"{1:010d}" / "manifest.json").read_bytes())
    with caplog.at_level(logging.WARNING), Trainer(cfg) as second:
        assert second.start() == 5 and second.weights_version == 5 and second.rollback is None
        _steps(second, 6, 7)
        metrics = generate_latest(second.metrics.m.registry).decode()
    said = caplog.text
    assert "publishing version 6 as a full version instead" in said
    assert "results of version 3's jobs will not be admitted" in said and "failed verification" in said
    rejected = re.findall(r'aurora_artifacts_rejected_total\{[^}]*role="trainer"[^}]*\} (\S+)', metrics)
    assert sum(float(n) for n in rejected) >= 3, metrics
    for v, data in real.items():
        (versions / f"{v:010d}" / "manifest.json").write_bytes(data)
    run = open_run(cfg.store, signing_key=str(key))
    m6 = run.manifest(6)
    assert (m6.kind, m6.stats.counted, m6.format) == ("full", False, "aurora/5")
    assert run.manifest(7).format != "aurora/5"
    assert audit(run).ok


def test_a_trainer_started_during_a_storage_outage_waits_for_its_bucket(
    redis_server: Any, s3_server: Any, tmp_path: Path, caplog: Any
) -> None:
    """Issue 39: a trainer (re)started while its bucket's endpoint does not answer waits for it, saying so,
    and starts once it answers, rather than exiting into its supervisor's restart loop."""
    from bench.chaos.gates import Gates

    gates = Gates()
    host, port = s3_server.endpoint.removeprefix("http://").split(":")
    gate = gates.add("home", (host, int(port)))
    opts = {
        **s3_server.options(),
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{gate}", "region_name": "us-east-1"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
    }
    cfg = replace(_config(tmp_path, redis_server.url), store=f"s3://{s3_server.new_bucket()}/run", storage_options=opts)
    started: list[int] = []
    errors: list[BaseException] = []
    caplog.set_level(logging.WARNING, logger="aurora.trainer")
    try:
        gates.partition("home", "refuse")
        with Trainer(cfg) as trainer:

            def start() -> None:
                try:
                    started.append(trainer.start())
                except BaseException as exc:
                    errors.append(exc)

            thread = threading.Thread(target=start, daemon=True)
            thread.start()
            wait_for(lambda: "bucket does not answer" in caplog.text or not thread.is_alive(), "the wait", timeout=120)
            assert not errors and not started, (errors, started)
            gates.partition("home", None)
            thread.join(300)
            assert not errors, errors
            assert started == [0]
        assert open_run(cfg.store, storage_options=opts).versions() == [0]
    finally:
        gates.close()
