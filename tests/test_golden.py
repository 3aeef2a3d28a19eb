"""The golden runs (tests/data/golden*): each written once by earlier code, they must list, audit
and materialize bit-exact with every later version of the code. A format change bumps the format
version and keeps these runs readable; it never rewrites them.

- ``golden``: format aurora/1, tiny tensors, every dtype and special bit pattern;
- ``golden_sparse``: format aurora/2, deltas coded by the ``sparse`` codec with symbol streams
  split by exponent (written before the ``classed`` codec existed);
- ``golden_lora``: a LoRA run (``aurora-run/3``): its frozen base an attachment named by its digest,
  its versions a PEFT adapter's matrices, replayed as a PEFT adapter directory over that base."""

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

DATA = Path(__file__).parent / "data"
RUNS = {
    "golden": (["full", "delta", "delta", "full", "delta", "delta"], "aurora/1"),
    "golden_sparse": (["full", "delta", "delta", "delta"], "aurora/2"),
    "golden_lora": (["full", "delta", "delta", "full", "delta"], "aurora/2"),
}


@pytest.fixture(params=sorted(RUNS))
def golden(request):  # type: ignore[no-untyped-def]
    root = DATA / request.param
    with open_run((root / "run").as_uri(), verify_key=str(root / "key.pub")) as r:
        yield request.param, root, r, json.loads((root / "expected.json").read_text())


def _sha(words: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(words).tobytes()).hexdigest()


def test_lists_every_version(golden) -> None:  # type: ignore[no-untyped-def]
    name, _, run, _ = golden
    kinds, fmt = RUNS[name]
    assert run.versions() == list(range(len(kinds)))
    assert [run.manifest(v).kind for v in run.versions()] == kinds
    assert all(run.manifest(v).signature is not None for v in run.versions())
    assert {run.manifest(v).format for v in run.versions()} == {fmt}


def test_sparse_golden_codes_split_symbol_streams(golden) -> None:  # type: ignore[no-untyped-def]
    name, _, run, _ = golden
    blocks = [b for v in run.versions() for s in run.manifest(v).segments for b in s.blocks]
    assert {b.codec for b in blocks} <= {"sparse", "dense"}
    if name == "golden_sparse":  # what this run pins: a split the decoder must rebuild from the parent
        assert any(b.codec == "sparse" and b.header.split > 0 for b in blocks)


def test_manifests_reencode_to_their_exact_bytes(golden) -> None:  # type: ignore[no-untyped-def]
    _, root, run, _ = golden
    for v in run.versions():
        raw = (root / "run" / manifest_key(v)).read_bytes()
        assert parse_manifest(raw, expect_version=v).to_bytes() == raw


def test_audit_passes_with_the_verify_key(golden) -> None:  # type: ignore[no-untyped-def]
    _, _, run, _ = golden
    result = audit(run)
    assert result.ok, result.first_error
    assert [r.status for r in result.versions] == ["ok"] * len(run.versions())


def test_materializes_bit_exact(golden) -> None:  # type: ignore[no-untyped-def]
    _, _, run, expected = golden
    for v in run.versions():
        state = run.materialize_words(v)
        want = expected[str(v)]
        assert (state.version_hash, state.digest.hex()) == (want["version_hash"], want["weights_digest"])
        assert {s.name: _sha(state.words[s.name]) for s in state.specs} == want["tensor_sha256"]


def test_replays_as_a_hf_directory(golden, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import torch
    from safetensors.torch import load_file

    _, root, run, expected = golden  # a LoRA run's version too: its adapter's matrices (PEFT's layout below)
    last = run.versions()[-1]
    out = tmp_path / f"v{last}"
    result = replay(run, last, str(out))
    assert result.version_hash == expected[str(last)]["version_hash"]
    loaded = load_file(str(out / "model.safetensors"))
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    got = {name: _sha(t.reshape(-1).view(ints[t.element_size()]).numpy()) for name, t in loaded.items()}
    assert got == expected[str(last)]["tensor_sha256"]
    assert (out / "config.json").read_bytes() == (root / "run" / "files" / "config.json").read_bytes()


def _lora() -> tuple[Path, dict[str, object]]:
    root = DATA / "golden_lora"
    return root, json.loads((root / "expected.json").read_text())


def test_lora_golden_names_its_base_and_adapter_in_its_run_spec() -> None:
    from aurora_store.bucket.lora_base import load_base
    from aurora_store.rl.runspec import NAME, RunSpec

    root, expected = _lora()
    with open_run((root / "run").as_uri(), verify_key=str(root / "key.pub")) as run:
        files = run.reader.files(run.manifest(4), names={NAME}.__contains__)
        spec = RunSpec.from_bytes(files[NAME])
        lora = spec.artefact.lora
        assert spec.artefact.kind == "lora" and lora is not None
        assert (lora.rank, lora.alpha, lora.targets) == (4, 8.0, ("q_proj", "v_proj"))
        assert lora.base_digest == expected["base_digest"]
        base = load_base(run, run.manifest(4), lora.base_files, lora.base_digest)  # recomputed and checked
        assert {s.name: _sha(base.words[s.name]) for s in base.specs} == expected["base_sha256"]


def test_lora_golden_replays_as_a_peft_adapter(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from aurora_store.bucket.replay import ADAPTER, BASE_DIR, Adapter
    from aurora_store.rl.runspec import NAME, RunSpec

    root, expected = _lora()
    with open_run((root / "run").as_uri(), verify_key=str(root / "key.pub")) as run:
        lora = RunSpec.from_bytes(run.reader.files(run.manifest(4), names={NAME}.__contains__)[NAME]).artefact.lora
        assert lora is not None
        shape = Adapter(lora.rank, lora.alpha, lora.targets, lora.base_files, lora.base_digest)
        replay(run, 4, str(tmp_path / "v4"), adapter=shape)
    sha = lambda t: _sha(t.reshape(-1).view(torch.int16).numpy())  # noqa: E731
    adapter = load_file(str(tmp_path / "v4" / ADAPTER))
    want = expected["4"]
    assert isinstance(want, dict)
    assert {k: sha(t) for k, t in adapter.items()} == want["tensor_sha256"]
    base = load_file(str(tmp_path / "v4" / BASE_DIR / "model.safetensors"))
    assert {k: sha(t) for k, t in base.items() if t.is_floating_point()} == expected["base_sha256"]
