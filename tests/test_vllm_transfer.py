"""The aurora weight-transfer backend on CPU: both of its modes, on real tensors, without vLLM.

``mapped``: the worker-side :class:`~actor.engines.vllm.transfer.TransferCore` receives the writes that
vLLM's ``update_weights`` would carry (packed as they cross its msgpack channel) into vLLM-layout
parameters, which must end bit-exact at every version. ``patches``: vLLM's own
``load_checkpoint_weight_patches`` cannot run here, so :func:`vllm_loader_stand_in` writes each
patch in checkpoint coordinates into a model whose parameters carry HF names, which is what
vLLM's loader does for an unfused layout; the host copy, the NaN refusal and the broken state are
what is under test. The real engine runs in ``test_vllm_layout.py``'s GPU test.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import aurora_store
from actor.engines.vllm.engine import choose_transfer, model_specs
from actor.engines.vllm.patch_weights import VllmPatchWeights
from actor.engines.vllm.transfer import (
    AuroraUpdateInfo,
    TransferCore,
    patch_values,
    register,
    split_runner,
    unavailable,
)
from actor.engines.vllm.weights import VllmWeights, pack
from actor.updater import Updater
from aurora_store.bucket.replay import replay
from aurora_store.errors import LayoutError, StoreError, UnsupportedError
from aurora_store.format.manifest import TensorSpec
from aurora_store.rl.models import build_model
from aurora_store.tensors import to_words
from tests.helpers import bits_equal, step
from tests.test_vllm_layout import CFG, GEOM, fuse, garbage_like, hf, native, same, wire


def module_of(params: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A module whose named_parameters() are ``params`` (same storage), as a worker's model."""
    root = torch.nn.Module()
    for name, t in params.items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
    return root


def vllm_loader_stand_in(model: torch.nn.Module, patches: list[tuple[Any, ...]]) -> None:
    """What vLLM's load_checkpoint_weight_patches does for a model whose parameters are the checkpoint's:
    sparse patches write their positions, dense ones (no positions) the whole tensor."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, shape, dtype, values, index in patches:
            p = params[name]
            assert tuple(p.shape) == shape and p.dtype == dtype
            if index is None:
                p.view(-1).view(torch.int16).copy_(values.view(torch.int16))
            else:
                p.view(-1)[index] = values


def pushed_to(cores: list[TransferCore], log: list[str] | None = None) -> Any:
    """``push(op, *args)`` as the engine's: one update_info, packed, received by every worker."""

    def push(op: str, *args: Any) -> None:
        info = AuroraUpdateInfo(op=op, args=pack(list(args)))
        assert native(info.args), "update_info must cross vLLM's msgpack channel as plain types"
        if log is not None:
            log.append(op)
        for core in cores:
            core.receive(info.op, info.args)

    return push


def history(n: int) -> tuple[Any, list[dict[str, torch.Tensor]]]:
    run = aurora_store.open_run(f"memory://aurora-tests/{uuid.uuid4().hex}/run", full_every=4, segment_bytes=4096)
    hist = [hf()]
    for i in range(n):
        hist.append(step(hist[-1], i, lr=1e-3))
    for sd in hist:
        run.publish(sd)
    return run, hist


# ---------------------------------------------------------------- mapped: writes through update_weights


@pytest.mark.parametrize("tp", [1, 2])
def test_mapped_writes_through_the_backend_keep_fused_weights_at_each_version(tp: int) -> None:
    run, hist = history(5)
    ranks = garbage_like(fuse(hist[0], tp))
    cores = [TransferCore(module_of(ranks[r]), rank=lambda r=r: r) for r in range(tp)]
    for c in cores:
        c.init("mapped")
    ops: list[str] = []
    live = VllmWeights(GEOM, runner=split_runner(tp, pushed_to(cores, ops), wire(ranks)), tp_size=tp)
    up = Updater(run, region="eu", live=live)
    up.bootstrap(1)
    assert same(ranks, fuse(hist[1], tp)) and set(ops) == {"write"}
    for target in (3, 5):  # deltas, then through the full version 4
        assert up.stage(target) is not None
        assert same(ranks, fuse(hist[1 if target == 3 else 3], tp)), "staging never touches the live weights"
        assert up.apply() is not None
        assert same(ranks, fuse(hist[target], tp))
        assert up.live_digest() == run.manifest(target).weights_digest
    assert {"stage", "commit"} <= set(ops) and "gather" not in ops, "reads go through the worker extension"


def test_the_core_refuses_unknown_ops_modes_and_commits_of_nothing() -> None:
    core = TransferCore(module_of({"w": torch.zeros(4, dtype=torch.bfloat16)}), rank=lambda: 0)
    with pytest.raises(StoreError, match="unknown op"):
        core.receive("exec", [])
    with pytest.raises(StoreError, match="mode"):
        core.init("everything")
    with pytest.raises(UnsupportedError, match="checkpoint weight patches"):
        core.init("patches")  # no loader to hand patches to
    with pytest.raises(StoreError, match="no staged write"):
        core.receive("commit", pack(["nope"]))


# ---------------------------------------------------------------- patches: vLLM's loaders place the changes


def patch_engine(sd: dict[str, torch.Tensor], log: list[str] | None = None) -> tuple[VllmPatchWeights, dict]:
    """Live weights over a worker whose model has ``sd``'s tensors, holding garbage until a load."""
    gpu = {k: torch.full_like(v, 3.0) for k, v in sd.items()}  # the worker's model, HF-named
    core = TransferCore(module_of(gpu), rank=lambda: 0, apply_patches=vllm_loader_stand_in)
    core.init("patches")
    specs, _ = to_words(sd)
    return VllmPatchWeights(specs, pushed_to([core], log)), gpu


def test_patches_follow_every_version_and_the_host_copy_matches_the_worker() -> None:
    run, hist = history(5)
    log: list[str] = []
    live, gpu = patch_engine(hist[1], log)
    up = Updater(run, region="eu", live=live)
    up.bootstrap(1)
    assert log == ["patch_stage", "patch_commit"] and bits_equal(gpu, hist[1])
    for target in (2, 5):
        assert up.stage(target) is not None and up.apply() is not None
        assert bits_equal(gpu, hist[target])
        assert up.live_digest() == run.manifest(target).weights_digest
    assert log.count("patch_stage") == log.count("patch_commit") >= 2
    _, snap = live.snapshot()
    assert all(np.array_equal(snap[k], to_words({k: hist[5][k]})[1][k]) for k in snap)


def test_a_load_writes_every_tensor_whole_in_parts() -> None:
    """Whatever the engine loaded or made of it (vLLM's CPU build repacks), a load leaves it holding the
    version: every tensor goes whole, in parts of about ``batch_bytes``, committed once."""
    sd = hf()
    live, gpu = patch_engine(sd)
    live.batch_bytes = 4096
    sent: list[str] = []
    inner = live.push

    def counting(op: str, *args: Any) -> None:
        sent.append(op)
        if op == "patch_stage":
            assert all(e[3] is None for e in args[1]), "whole tensors carry no positions"
        inner(op, *args)

    live.push = counting
    nan = {k: v.clone() for k, v in sd.items()}
    nan["model.norm.weight"].view(-1).view(torch.int16)[0] = 0x7FC1  # a whole tensor may hold any bits
    specs, words = to_words(nan)
    live.load(specs, words)
    assert sent.count("patch_commit") == 1 < sent.count("patch_stage")
    assert bits_equal(gpu, nan)


def test_nan_values_and_integer_tensors_are_refused_before_any_worker_sees_them() -> None:
    sd = hf()
    log: list[str] = []
    live, gpu = patch_engine(sd, log)
    live.load(*to_words(sd))
    log.clear()
    before = {k: v.clone() for k, v in gpu.items()}
    nan = np.array([0x7FC0], dtype="<u2")  # a BF16 quiet NaN: "unchanged" to vLLM's patches
    with pytest.raises(LayoutError, match="NaN"):
        live.prepare({"model.norm.weight": (np.array([0]), nan)})
    with pytest.raises(LayoutError, match="outside"):
        live.prepare({"model.norm.weight": (np.array([10**9]), np.array([1], dtype="<u2"))})
    with pytest.raises(LayoutError, match="not in the engine"):
        live.prepare({"model.nothing": (np.array([0]), np.array([1], dtype="<u2"))})
    with pytest.raises(LayoutError, match="floating tensors only"):
        patch_values(TensorSpec("steps", "I64", (2,)), np.zeros(2, dtype="<u8"))
    assert log == [] and bits_equal(gpu, before)


def test_a_loader_that_fails_half_way_leaves_the_engine_refusing_writes() -> None:
    sd = hf()
    core = TransferCore(module_of({k: v.clone() for k, v in sd.items()}), rank=lambda: 0)

    def failing(model: torch.nn.Module, patches: list[tuple[Any, ...]]) -> None:
        if any(index is not None for *_, index in patches):
            raise NotImplementedError("sparse checkpoint patches require a same-shaped floating-point copy")
        vllm_loader_stand_in(model, patches)

    core.apply_patches = failing
    core.init("patches")
    specs, words = to_words(sd)
    live = VllmPatchWeights(specs, pushed_to([core]))
    live.load(specs, words)
    change = {"model.norm.weight": (np.array([1]), np.array([0x4040], dtype="<u2"))}
    with pytest.raises(NotImplementedError):
        live.commit(live.prepare(change))
    assert live.at("model.norm.weight", np.array([1]))[0] == 0x3F80, "the host copy did not move"
    with pytest.raises(StoreError, match="unknown state.*restart"):
        live.prepare(change)


# ---------------------------------------------------------------- choosing the path, and the model directory


def test_without_vllm_auto_uses_the_extension_and_native_is_refused() -> None:
    specs, _ = to_words(hf())
    assert unavailable() is not None  # no vLLM on this machine
    register()  # a no-op without vLLM
    assert choose_transfer("auto", CFG, specs, 1) == (False, "mapped")
    assert choose_transfer("extension", CFG, specs, 2) == (False, "mapped")
    with pytest.raises(UnsupportedError, match="weight-transfer API"):
        choose_transfer("native", CFG, specs, 1)
    with pytest.raises(UnsupportedError, match="weight-transfer API"):
        choose_transfer("patches", CFG, specs, 1)
    with pytest.raises(StoreError, match="expected one of"):
        choose_transfer("fastest", CFG, specs, 1)
    experts = (*specs, TensorSpec("model.layers.0.mlp.experts.0.up_proj.weight", "BF16", (8, 64)))
    with pytest.raises(LayoutError, match="vLLM's own loaders"):
        choose_transfer("auto", CFG, experts, 1)


def test_the_engine_reads_the_replayed_directory_it_loads(tmp_path: Path) -> None:
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    run.files.put("config.json", json.dumps(CFG).encode())
    sd = {k: v.detach().clone() for k, v in build_model(CFG, dtype=torch.bfloat16).state_dict().items()}
    run.publish(sd)
    out = replay(run, 0, str(tmp_path / "v0"), shard_bytes=1 << 16)
    assert model_specs(out.out) == run.manifest(0).tensors
