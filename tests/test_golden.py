"""The golden run (tests/data/golden): written once by earlier code, it must list, audit and
materialize bit-exact with every later version of the code. A format change bumps the format
version and keeps this run readable; it never rewrites it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from aurora_store import open_run
from aurora_store.bucket.audit import audit
from aurora_store.bucket.replay import replay
from aurora_store.format.keys import manifest_key
from aurora_store.format.manifest_parser import parse_manifest

GOLDEN = Path(__file__).parent / "data" / "golden"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())
KINDS = ["full", "delta", "delta", "full", "delta", "delta"]


@pytest.fixture
def run():  # type: ignore[no-untyped-def]
    with open_run((GOLDEN / "run").as_uri(), verify_key=str(GOLDEN / "key.pub")) as r:
        yield r


def _sha(words: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(words).tobytes()).hexdigest()


def test_lists_every_version(run) -> None:  # type: ignore[no-untyped-def]
    assert run.versions() == list(range(6))
    assert [run.manifest(v).kind for v in run.versions()] == KINDS
    assert all(run.manifest(v).signature is not None for v in run.versions())


def test_manifests_reencode_to_their_exact_bytes(run) -> None:  # type: ignore[no-untyped-def]
    for v in run.versions():
        raw = (GOLDEN / "run" / manifest_key(v)).read_bytes()
        assert parse_manifest(raw, expect_version=v).to_bytes() == raw


def test_audit_passes_with_the_verify_key(run) -> None:  # type: ignore[no-untyped-def]
    result = audit(run)
    assert result.ok, result.first_error
    assert [r.status for r in result.versions] == ["ok"] * 6


def test_materializes_bit_exact(run) -> None:  # type: ignore[no-untyped-def]
    for v in run.versions():
        state = run.materialize_words(v)
        want = EXPECTED[str(v)]
        assert (state.version_hash, state.digest.hex()) == (want["version_hash"], want["weights_digest"])
        assert {s.name: _sha(state.words[s.name]) for s in state.specs} == want["tensor_sha256"]


def test_replays_as_a_hf_directory(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "v5"
    result = replay(run, 5, str(out))
    assert result.version_hash == EXPECTED["5"]["version_hash"]
    loaded = load_file(str(out / "model.safetensors"))
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    got = {name: _sha(t.reshape(-1).view(ints[t.element_size()]).numpy()) for name, t in loaded.items()}
    assert got == EXPECTED["5"]["tensor_sha256"]
    assert (out / "config.json").read_bytes() == (GOLDEN / "run" / "files" / "config.json").read_bytes()
