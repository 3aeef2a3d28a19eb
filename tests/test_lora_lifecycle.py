"""A LoRA run through what every run goes through (issue 36): relayed to another region, garbage
collected, its signing key rotated, audited. The base travels as the run's attachment, so each of
these must keep it whole and verifiable wherever the adapter versions go."""

from __future__ import annotations

from pathlib import Path

import torch

import aurora_store
from aurora_store.bucket import gc
from aurora_store.bucket.audit import audit
from aurora_store.bucket.lora_base import load_base
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.format import signing
from aurora_store.rl.runspec import NAME, RunSpec
from relay.worker import Relay
from tests.helpers import bits_equal
from tests.lora_runs import lora_run

VERSIONS = 8


def _keys() -> dict[str, tuple[bytes, bytes]]:
    return {name: signing.generate_keypair() for name in ("a", "b")}


def _lora(run: aurora_store.Run) -> object:
    latest = run.latest()
    assert latest is not None
    lora = RunSpec.from_bytes(run.reader.files(run.manifest(latest), names={NAME}.__contains__)[NAME]).artefact.lora
    assert lora is not None
    return lora


def _base_bits(run: aurora_store.Run) -> dict[str, bytes]:
    lora = _lora(run)
    base = load_base(run, run.manifest(run.latest()), lora.base_files, lora.base_digest)  # type: ignore[attr-defined]
    return {s.name: base.words[s.name].tobytes() for s in base.specs}


def test_a_lora_run_relays_collects_rotates_and_audits(tmp_path: Path) -> None:
    keys = _keys()
    home = f"file://{tmp_path}/home/run"
    a, b = (signing.load_signing_key(keys[k][0]) for k in ("a", "b"))
    run, _ = lora_run(home, VERSIONS, signing_key=a, full_every=3, rotations={5: b})
    verify_b = signing.load_verify_key(keys["b"][1])
    run = aurora_store.open_run(home, verify_key=verify_b)  # a reader that knows only the new key
    assert run.versions() == list(range(VERSIONS))
    report = audit(run)
    assert report.ok, report.first_error
    base = _base_bits(run)

    # relayed: the eu bucket gets the adapter versions and the base, both verifiable there
    eu = f"file://{tmp_path}/eu/run"
    relay = Relay(ObjectStore(home), ObjectStore(eu), None, source_region="home", dest_region="eu", verify_key=verify_b)
    assert relay.backfill() == list(range(VERSIONS))
    relay.close()
    there = aurora_store.open_run(eu, verify_key=verify_b)
    assert audit(there).ok and _base_bits(there) == base
    assert bits_equal(there.materialize(VERSIONS - 1), run.materialize(VERSIONS - 1))

    # collected: retired versions go, the base stays for every version kept
    signed = aurora_store.open_run(home, signing_key=b)  # gc signs its retention record with the run's key
    p = gc.plan(signed, gc.RetentionPolicy(keep_last=2, keep_fulls=1))
    assert p.retire, "something to retire"
    gc.apply(signed, p)
    kept = aurora_store.open_run(home, verify_key=verify_b)
    assert set(kept.versions()) < set(range(VERSIONS)) and kept.latest() == VERSIONS - 1
    assert audit(kept).ok and _base_bits(kept) == base
    latest = kept.materialize(VERSIONS - 1)
    assert latest and all(".lora_A." in k or ".lora_B." in k for k in latest)
    assert all(t.dtype == torch.bfloat16 for t in latest.values())
