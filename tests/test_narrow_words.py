"""Deltas of 1-byte words (issue 37 part 2, format aurora/6): a quantized version's FP8 and INT8 words
are coded sparse (FP8 also classed), losslessly for every bit pattern (E4M3's NaN 0x7F / 0xFF and -0.0
0x80 included), applied in place by an actor, and only versions that need it are written as aurora/6."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import aurora_store
from actor.updater import Updater
from aurora_store.bucket.audit import audit
from aurora_store.errors import CorruptError
from aurora_store.format.keys import manifest_key
from aurora_store.format.manifest_parser import parse_manifest
from tests.helpers import bits_equal

SPECIALS = torch.tensor([0x7F, 0xFF, 0x80, 0x00, 0x7E, 0xFE], dtype=torch.uint8)
"""E4M3's NaN of each sign, -0.0, +0.0 and the largest finite values of each sign, as words."""


def _history(versions: int = 5) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(7)
    words = torch.from_numpy(rng.integers(0, 256, (96, 200)).astype(np.uint8))
    ints = torch.from_numpy(rng.integers(-127, 128, (96, 200)).astype(np.int8))
    scales = torch.rand(1, 2, generator=torch.Generator().manual_seed(3))
    out = []
    for v in range(versions):
        if v:
            words = words.clone()
            flat = words.view(-1)
            flat[torch.from_numpy(rng.choice(flat.numel(), 60, replace=False))] ^= 5
            flat[v * 10 : v * 10 + SPECIALS.numel()] = SPECIALS.roll(v)  # the special patterns move around
            ints = ints.clone()
            ints.view(-1)[torch.from_numpy(rng.choice(ints.numel(), 40, replace=False))] += 1
            scales = scales.clone()
            scales[0, v % 2] *= 1.001
        out.append(
            {
                "model.layers.0.mlp.down_proj.weight": words.view(torch.float8_e4m3fn),
                "model.layers.0.mlp.down_proj.weight_scale_inv": scales,
                "model.layers.0.mlp.up_proj.weight": ints,
                "model.norm.weight": torch.ones(200, dtype=torch.bfloat16),
            }
        )
    return out


def _publish(uri: str, history: list[dict[str, torch.Tensor]]) -> aurora_store.Run:
    run = aurora_store.open_run(uri, full_every=100)
    for sd in history:
        run.publish(sd)
    return run


def test_fp8_and_int8_deltas_are_coded_sparse_and_read_back_bit_exact(tmp_path: Path) -> None:
    history = _history()
    run = _publish(f"file://{tmp_path}/run", history)
    run = aurora_store.open_run(run.uri)
    for v in range(1, len(history)):
        m = run.manifest(v)
        coded = {(m.tensors[b.tensor].dtype, b.codec) for s in m.segments for b in s.blocks}
        assert ("I8", "sparse") in coded and ("F8_E4M3", "dense") not in coded, coded
        assert m.format == "aurora/6" and m.stats.bytes < 2000, (m.format, m.stats.bytes)
    for v, sd in enumerate(history):
        assert bits_equal(run.materialize(v), sd), f"version {v}"
    assert audit(run).ok


def test_an_actor_applies_fp8_and_int8_deltas_in_place(tmp_path: Path) -> None:
    history = _history()
    run = _publish(f"file://{tmp_path}/run", history)
    up = Updater(aurora_store.open_run(run.uri), region="here")
    up.bootstrap(0)
    for v in range(1, len(history)):
        up.stage(v)
        assert up.apply() is not None
        assert up.verify() == (run.manifest(v).weights_digest, "written")  # read back where they live
    assert bits_equal(up.weights, history[-1])
    assert up.weights["model.layers.0.mlp.down_proj.weight"].dtype == torch.float8_e4m3fn


def test_only_a_version_that_codes_1_byte_words_is_written_as_aurora_6(tmp_path: Path) -> None:
    history = _history(3)
    history[2] = {**history[1], "model.norm.weight": history[1]["model.norm.weight"] * 2}  # BF16 moves alone
    run = _publish(f"file://{tmp_path}/run", history)
    assert run.manifest(1).format == "aurora/6" and run.manifest(2).format in ("aurora/2", "aurora/3")


def test_a_sparse_1_byte_block_in_an_earlier_format_is_refused(tmp_path: Path) -> None:
    run = _publish(f"file://{tmp_path}/run", _history(2))
    raw = (tmp_path / "run" / manifest_key(1)).read_bytes()
    assert b'"format":"aurora/6"' in raw
    with pytest.raises(CorruptError, match=r"sparse coding of dtype (I8|F8_E4M3) needs format aurora/6"):
        parse_manifest(raw.replace(b'"format":"aurora/6"', b'"format":"aurora/5"'), expect_version=1)
    assert audit(aurora_store.open_run(run.uri)).ok, "nothing committed changed"
