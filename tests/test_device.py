"""Extraction and class lookup on the weights' device (:mod:`aurora_store.device`): the same arrays
as the host passes, the same bytes in the bucket, on CPU tensors here and on CUDA where there is one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import aurora_store
from aurora_store import device
from aurora_store.codec import classes
from aurora_store.codec.base import Lookup
from aurora_store.errors import CorruptError, StoreError
from aurora_store.format import dtypes
from aurora_store.tensors import word_views
from tests.helpers import bits_equal, state_dict, step

BF16 = dtypes.dtype("BF16").exponent
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def trained(n: int, seed: int, drift: float = 3e-6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    masters = torch.from_numpy(rng.normal(0, 0.02, n).astype(np.float32))
    after = masters + drift * torch.from_numpy(rng.choice(np.array([-1.0, 1.0], np.float32), n))
    return (
        masters.to(torch.bfloat16).view(torch.int16).numpy().view("<u2"),
        after.to(torch.bfloat16).view(torch.int16).numpy().view("<u2"),
    )


def on(dev: str, words: np.ndarray) -> torch.Tensor:
    if dev == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    return torch.from_numpy(words.view(np.int16).copy()).to(dev)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize(("n", "chunk"), [(1, device.CHUNK), (10_007, device.CHUNK), (300_001, 65_536)])
def test_extract_gives_the_host_pass_arrays(dev: str, n: int, chunk: int) -> None:
    old, new = trained(n, seed=n)
    if n == 1:
        new = old ^ np.uint16(1)
    got = device.extract(on(dev, old), on(dev, new), BF16, chunk=chunk)
    want = classes.extract(old, new, BF16)
    for field in ("positions", "classes", "ranks", "old", "new"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field
    assert got.old.dtype == np.dtype("<u2") and got.positions.dtype == np.int64


@pytest.mark.parametrize("dev", DEVICES)
def test_extract_of_equal_tensors_is_empty(dev: str) -> None:
    old, _ = trained(5000, seed=1)
    got = device.extract(on(dev, old), on(dev, old), BF16)
    assert got.positions.size == 0 and got.old.size == 0


def test_extract_refuses_mismatched_tensors() -> None:
    a = torch.zeros(4, dtype=torch.int16)
    with pytest.raises(StoreError, match="one shape"):
        device.extract(a, torch.zeros(5, dtype=torch.int16), BF16)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("chunk", [device.CHUNK, 40_000])
def test_locate_gives_the_host_pass_positions(dev: str, chunk: int) -> None:
    old, new = trained(200_003, seed=4)
    ex = classes.extract(old, new, BF16)
    order = np.argsort(ex.classes, kind="stable")
    present, counts = np.unique(ex.classes, return_counts=True)
    ranks = ex.ranks[order]
    got = device.locate(on(dev, old), Lookup(BF16, present, counts, ranks, "blk"), chunk=chunk)
    want = classes.locate(old, Lookup(BF16, present, counts, ranks, "blk"))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert np.array_equal(got[0], ex.positions)
    nothing = device.locate(on(dev, old), Lookup(BF16, present[:0], counts[:0], ranks[:0], "blk"), chunk=chunk)
    assert nothing[0].size == 0 and nothing[1].size == 0
    bad = ranks.copy()
    bad[-1] = old.size  # past the end of its class
    with pytest.raises(CorruptError, match="rank past"):
        device.locate(on(dev, old), Lookup(BF16, present, counts, bad, "blk"), chunk=chunk)


@pytest.mark.parametrize("dev", DEVICES)
def test_class_sizes_and_writes(dev: str) -> None:
    old, new = trained(50_000, seed=9)
    t = on(dev, old)
    assert np.array_equal(device.sizes(t, BF16), classes.sizes(old, BF16))
    at = np.flatnonzero(old != new)
    device.write(t, at, new[at])
    assert np.array_equal(t.cpu().numpy().view("<u2"), new)


def _keys(run: aurora_store.Run) -> list[list[str]]:
    return [[s.key for s in run.manifest(v).objects] for v in run.versions()]


@pytest.mark.parametrize("dev", DEVICES)
def test_a_run_published_from_the_device_is_the_run_published_from_the_host(tmp_path: Path, dev: str) -> None:
    """Same objects (content-addressed keys: same bytes) and the same weights, fulls and deltas alike."""
    if dev == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    runs = {
        where: aurora_store.open_run(f"file://{tmp_path}/{where}", segment_bytes=512, full_every=3, extract=where)
        for where in ("host", "device")
    }
    sd = state_dict(scale=4)
    history = []
    for i in range(6):
        history.append(sd)
        for where, run in runs.items():
            run.publish({k: v.to(dev) for k, v in sd.items()} if where == "device" else sd)
        sd = step(sd, i, lr=3e-5)
    assert _keys(runs["host"]) == _keys(runs["device"])
    kinds = [runs["device"].manifest(v).kind for v in range(6)]
    assert kinds == ["full", "delta", "delta", "full", "delta", "delta"]
    reader = aurora_store.open_run(runs["device"].uri)
    assert all(bits_equal(reader.materialize(v), history[v]) for v in range(6))


def test_word_views_share_memory_and_keep_the_device() -> None:
    sd = {"w": torch.randn(4, 4).to(torch.bfloat16), "b": torch.tensor([True, False]), "n": torch.arange(3)}
    specs, views = word_views(sd)
    assert [s.name for s in specs] == ["b", "n", "w"]
    assert views["w"].dtype == torch.int16 and views["b"].dtype == torch.uint8 and views["n"].dtype == torch.int64
    assert views["w"].data_ptr() == sd["w"].data_ptr()


def test_run_config_refuses_an_unknown_extract() -> None:
    with pytest.raises(StoreError, match="extract must be"):
        aurora_store.open_run("memory://x/run", extract="gpu")
