"""A run of quantized weights through what every run goes through (issue 37): relayed to another
region, garbage collected, its signing key rotated, audited, replayed. Words and scales are tensors
like any other, so each must keep them bit-exact wherever the versions go."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aurora_store
from aurora_store.bucket import gc
from aurora_store.bucket.audit import audit
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.format import signing
from relay.worker import Relay
from tests.quant_runs import SCHEMES, quantized_run

VERSIONS = 8


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_quantized_run_relays_collects_rotates_and_audits(tmp_path: Path, scheme: str) -> None:
    keys = {name: signing.generate_keypair() for name in ("a", "b")}
    home = f"file://{tmp_path}/home/run"
    a, b = (signing.load_signing_key(keys[k][0]) for k in ("a", "b"))
    quantized_run(home, scheme, VERSIONS, signing_key=a, full_every=3, rotations={5: b}, words_only=(2,))
    verify_b = signing.load_verify_key(keys["b"][1])
    run = aurora_store.open_run(home, verify_key=verify_b)  # a reader that knows only the new key
    assert run.versions() == list(range(VERSIONS))
    assert {run.manifest(v).format for v in range(VERSIONS) if run.manifest(v).kind == "delta"} == {"aurora/6"}
    report = audit(run)
    assert report.ok, report.first_error
    latest = run.materialize_words(VERSIONS - 1)

    eu = f"file://{tmp_path}/eu/run"
    relay = Relay(ObjectStore(home), ObjectStore(eu), None, source_region="home", dest_region="eu", verify_key=verify_b)
    assert relay.backfill() == list(range(VERSIONS))
    relay.close()
    there = aurora_store.open_run(eu, verify_key=verify_b)
    assert audit(there).ok
    words = there.materialize_words(VERSIONS - 1).words
    assert words.keys() == latest.words.keys()
    assert all(np.array_equal(words[n], latest.words[n]) for n in words)

    signed = aurora_store.open_run(home, signing_key=b)  # gc signs its retention record with the run's key
    p = gc.plan(signed, gc.RetentionPolicy(keep_last=2, keep_fulls=1))
    assert p.retire, "something to retire"
    gc.apply(signed, p)
    kept = aurora_store.open_run(home, verify_key=verify_b)
    assert set(kept.versions()) < set(range(VERSIONS)) and kept.latest() == VERSIONS - 1
    assert audit(kept).ok
    again = kept.materialize_words(VERSIONS - 1).words
    assert all(np.array_equal(again[n], latest.words[n]) for n in again)
