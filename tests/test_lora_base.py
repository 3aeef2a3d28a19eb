"""A LoRA run's frozen base (issue 36): attached to the run once, named by its weight digest, and read
back only as the bits the run names, on every backend (the S3 one through moto's server)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import aurora_store
from actor import assemble
from aurora_store.bucket.lora_base import WrongBaseError, attach_base, base_files, load_base
from aurora_store.errors import ConflictError, CorruptError
from aurora_store.format.keys import file_key
from aurora_store.tensors import host_words, word_views
from aurora_store.testing.damage import overwrite


def _base(seed: int = 0) -> tuple[Any, dict[str, np.ndarray]]:
    g = torch.Generator().manual_seed(seed)
    state = {
        "model.embed_tokens.weight": torch.randn(32, 8, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.v_proj.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.ones(8, dtype=torch.float32),
    }
    specs, views = word_views(state)
    return specs, {k: host_words(v) for k, v in views.items()}


def _adapter() -> dict[str, torch.Tensor]:
    return {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(2, 8, dtype=torch.bfloat16)}


def test_a_base_attached_once_reads_back_bit_exact_under_its_digest(root: Any) -> None:
    run = aurora_store.open_run(root.uri, storage_options=root.storage_options)
    specs, words = _base()
    digest, files = attach_base(run, specs, words, file_bytes=200)  # several files: tensors never split
    assert len(files) >= 3 and files[0] == f"lora-base-00001-of-{len(files):05d}.safetensors"
    assert attach_base(run, specs, words, file_bytes=200) == (digest, files), "the same base again is a no-op"
    run.publish(_adapter())
    m = run.manifest(0)
    got = load_base(run, m, files, digest)
    assert [s.name for s in got.specs] == sorted(words)
    assert all(np.array_equal(got.words[k], v) for k, v in words.items())
    assert got.digest.hex() == digest
    assert set(assemble.run_files(run, 0)) == set(), "a role reading the run's small files leaves the base alone"


def test_a_different_base_is_refused_by_name_and_digest(tmp_path: Any) -> None:
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    specs, words = _base()
    digest, files = attach_base(run, specs, words)
    run.publish(_adapter())
    other_specs, other_words = _base(seed=1)
    with pytest.raises(WrongBaseError, match=f"has weight digest {digest}, the run names {'f' * 32}"):
        load_base(run, run.manifest(0), files, "f" * 32)
    with pytest.raises(ConflictError):
        attach_base(run, other_specs, other_words)  # attachments are immutable: another base, same names


def test_a_damaged_or_missing_base_file_is_corrupt_not_loaded(tmp_path: Any) -> None:
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    specs, words = _base()
    digest, files = attach_base(run, specs, words, file_bytes=200)
    run.publish(_adapter())
    m = run.manifest(0)
    with pytest.raises(CorruptError, match="lists no attachment lora-base-00009"):
        load_base(run, m, (*files, "lora-base-00009-of-00009.safetensors"), digest)
    key = file_key(files[1])
    data = run.store.get(key, max_bytes=1 << 20)
    overwrite(run.store, key, data[:-1] + bytes([data[-1] ^ 1]))  # one bit of a tensor flipped
    fresh = aurora_store.open_run(f"file://{tmp_path}/run")
    with pytest.raises(CorruptError, match="sha256"):
        load_base(fresh, fresh.manifest(0), files, digest)


def test_only_the_bases_own_names_are_base_files() -> None:
    assert base_files("lora-base-00001-of-00003.safetensors")
    for name in ("config.json", "lora-base-1-of-3.safetensors", "lora-base-00001-of-00003.safetensors.tmp", "x"):
        assert not base_files(name)
