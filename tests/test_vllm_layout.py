"""vLLM's fused, tensor-parallel layout: HF positions land bit-exact where vLLM's loaders put them.

The reference is :func:`fuse`, written here the way vLLM's weight loaders fill their
parameters (QKVParallelLinear, MergedColumnParallelLinear, RowParallelLinear,
VocabParallelEmbedding), independently of :mod:`actor.engines.vllm.layout`'s arithmetic.
"""

from __future__ import annotations

import functools
import json
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import aurora_store
from actor.engines.vllm.engine import completions, prompt_seeds
from actor.engines.vllm.layout import Geometry, VllmLayout
from actor.engines.vllm.weights import OPS, LocalRunner, Runner, VllmWeights, pack, unpack
from actor.updater import Updater
from aurora_store.errors import LayoutError, StoreError
from aurora_store.format.manifest import TensorSpec
from aurora_store.rl.models import build_model, tiny_config
from aurora_store.tensors import to_words, torch_dtype
from tests.helpers import bits_equal, step

CFG = tiny_config(98, hidden=64, layers=2, heads=4, kv_heads=2)
GEOM = Geometry.from_config(CFG)
Ranks = list[dict[str, torch.Tensor]]


@functools.cache
def _hf(seed: int, tied: bool) -> dict[str, torch.Tensor]:
    model = build_model({**CFG, "tie_word_embeddings": tied}, seed=seed, dtype=torch.bfloat16)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def hf(seed: int = 0, tied: bool = False) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in _hf(seed, tied).items()}


def fuse(sd: dict[str, torch.Tensor], tp: int, tied: bool = False) -> Ranks:
    """vLLM's per-rank parameters for an HF state dict, as its weight loaders build them."""
    hd = CFG["head_dim"]
    q_rows, kv_rows = CFG["num_attention_heads"] // tp * hd, CFG["num_key_value_heads"] // tp * hd
    ranks: Ranks = [{} for _ in range(tp)]
    for r, out in enumerate(ranks):
        for name, t in sd.items():
            if ".k_proj." in name or ".v_proj." in name or ".up_proj." in name:
                continue
            if ".q_proj." in name:
                k, v = sd[name.replace("q_proj", "k_proj")], sd[name.replace("q_proj", "v_proj")]
                parts = [t[r * q_rows : (r + 1) * q_rows], k[r * kv_rows : (r + 1) * kv_rows]]
                out[name.replace("q_proj", "qkv_proj")] = torch.cat([*parts, v[r * kv_rows : (r + 1) * kv_rows]])
            elif ".gate_proj." in name:
                up, n = sd[name.replace("gate_proj", "up_proj")], t.shape[0] // tp
                out[name.replace("gate_proj", "gate_up_proj")] = torch.cat(
                    [t[r * n : (r + 1) * n], up[r * n : (r + 1) * n]]
                )
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                n = t.shape[1] // tp
                out[name] = t[:, r * n : (r + 1) * n].clone()
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                if tied and name == "lm_head.weight":
                    continue  # vLLM's lm_head *is* embed_tokens
                padded = -(-t.shape[0] // 64) * 64
                n = padded // tp
                full = torch.cat([t, torch.zeros(padded - t.shape[0], t.shape[1], dtype=t.dtype)])
                out[name] = full[r * n : (r + 1) * n].clone()
            else:
                out[name] = t.clone()
    return ranks


def garbage_like(ranks: Ranks, seed: int = 7) -> Ranks:
    """Same names and shapes, random bits: whatever ``load`` does not write stays visible."""
    g = torch.Generator().manual_seed(seed)
    return [
        {k: torch.randint(-(2**15), 2**15, v.shape, dtype=torch.int16, generator=g).view(v.dtype) for k, v in r.items()}
        for r in ranks
    ]


def same(a: Ranks, b: Ranks) -> bool:
    return len(a) == len(b) and all(bits_equal(x, y) for x, y in zip(a, b, strict=True))


def changed(sd: dict[str, torch.Tensor], changes: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in sd.items()}
    for name, (idx, words) in changes.items():
        out[name].view(-1).view(torch.int16)[torch.from_numpy(idx)] = torch.from_numpy(words.view("<i2").copy())
    return out


def loaded(tp: int, seed: int = 0, tied: bool = False) -> tuple[VllmWeights, Ranks, dict[str, torch.Tensor]]:
    sd = hf(seed, tied)
    ranks = garbage_like(fuse(sd, tp, tied))
    live = VllmWeights(Geometry.from_config({**CFG, "tie_word_embeddings": tied}), ranks=ranks)
    specs, words = to_words(sd)
    live.load(specs, words)
    return live, ranks, sd


def words_of(sd: dict[str, torch.Tensor], name: str) -> np.ndarray:
    return to_words({name: sd[name]})[1][name]


# ---------------------------------------------------------------- layout and load


@pytest.mark.parametrize("tp", [1, 2])
def test_layout_names_and_shapes_are_vllms(tp: int) -> None:
    sd = hf()
    specs, _ = to_words(sd)
    layout = VllmLayout(specs, GEOM, tp)
    want = {k: (tuple(v.shape), "BF16") for k, v in fuse(sd, tp)[0].items()}
    assert layout.params == want
    assert layout.params["model.layers.0.self_attn.qkv_proj.weight"][0] == ((64 + 32 + 32) // tp, 64)
    assert layout.params["model.embed_tokens.weight"][0] == (128 // tp, 64)  # 98 padded to 128


@pytest.mark.parametrize("tp", [1, 2])
def test_load_fills_every_rank_bit_exact_and_zeroes_vocab_padding(tp: int) -> None:
    live, ranks, sd = loaded(tp)
    assert same(ranks, fuse(sd, tp))
    specs, words = live.snapshot()
    assert specs == to_words(sd)[0]
    assert all(np.array_equal(words[k], w) for k, w in to_words(sd)[1].items())


@pytest.mark.parametrize("tp", [1, 2])
def test_at_returns_hf_words_at_every_position_in_any_order(tp: int) -> None:
    live, _, sd = loaded(tp)
    rng = np.random.default_rng(0)
    for name, t in sd.items():
        want = words_of(sd, name)
        assert np.array_equal(live.at(name, np.arange(t.numel())), want)
        perm = rng.permutation(t.numel())
        assert np.array_equal(live.at(name, perm), want[perm])
    assert live.at("model.norm.weight", np.zeros(0, np.int64)).shape == (0,)


@pytest.mark.parametrize("tp", [1, 2])
def test_writing_every_position_equals_fusing_the_new_model(tp: int) -> None:
    live, ranks, _ = loaded(tp)
    new = hf(seed=1)
    specs, words = to_words(new)
    live.commit(live.prepare({s.name: (np.arange(s.numel), words[s.name]) for s in specs}))
    assert same(ranks, fuse(new, tp))


@st.composite
def sparse_changes(draw: st.DrawFn) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    sd = _hf(0, False)
    names = draw(st.lists(st.sampled_from(sorted(sd)), min_size=1, max_size=6, unique=True))
    out = {}
    for name in names:
        numel = sd[name].numel()
        pos = draw(st.lists(st.integers(0, numel - 1), max_size=40, unique=True))
        pos += draw(st.sampled_from([[], [0], [numel - 1]]))
        idx = np.unique(np.array(pos, dtype=np.int64))
        words = draw(st.lists(st.integers(0, 0xFFFF), min_size=idx.size, max_size=idx.size))
        out[name] = (idx, np.array(words, dtype="<u2"))
    return out


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2]), changes=sparse_changes(), probe_seed=st.integers(0, 2**32 - 1))
def test_sparse_changes_land_where_vllm_would_load_them(
    tp: int, changes: dict[str, tuple[np.ndarray, np.ndarray]], probe_seed: int
) -> None:
    live, ranks, sd = loaded(tp)
    live.commit(live.prepare(changes))
    want = changed(sd, changes)
    assert same(ranks, fuse(want, tp))
    rng = np.random.default_rng(probe_seed)
    for name in changes:
        probe = np.sort(rng.choice(want[name].numel(), size=min(30, want[name].numel()), replace=False))
        assert np.array_equal(live.at(name, probe), words_of(want, name)[probe])


def test_tied_embeddings_share_one_parameter() -> None:
    live, ranks, sd = loaded(2, tied=True)
    assert "lm_head.weight" not in ranks[0] and same(ranks, fuse(sd, 2, tied=True))
    idx = np.array([0, 63, 64, 97])
    assert np.array_equal(live.at("lm_head.weight", idx), words_of(sd, "model.embed_tokens.weight")[idx])
    words = np.array([1, 2, 3, 4], dtype="<u2")
    live.commit(live.prepare({"lm_head.weight": (idx, words), "model.embed_tokens.weight": (idx, words)}))
    _, snap = live.snapshot()
    assert np.array_equal(snap["lm_head.weight"], snap["model.embed_tokens.weight"])
    assert np.array_equal(snap["lm_head.weight"][idx], words)


# ---------------------------------------------------------------- the updater on vLLM-layout weights


def native(obj: Any) -> bool:
    """Only what msgpack carries without extensions (as collective_rpc payloads must be)."""
    if isinstance(obj, dict):
        return all(isinstance(k, str) and native(v) for k, v in obj.items())
    if isinstance(obj, list):
        return all(native(x) for x in obj)
    return obj is None or isinstance(obj, str | int | float | bytes)


def wire(ranks: Ranks) -> Runner:
    """A runner that ships every payload and answer in packed form, as the vLLM engine does."""
    local = LocalRunner(ranks)

    def run(op: str, args: tuple[Any, ...]) -> list[Any]:
        sent = pack(args)
        assert native(sent)
        answers = [pack(OPS[op](r, p, local.stash[r], *unpack(sent))) for r, p in enumerate(local.ranks)]
        assert all(native(a) for a in answers)
        return list(unpack(answers))

    return run


@pytest.mark.parametrize(("tp", "over_wire"), [(1, False), (1, True), (2, False), (2, True)])
def test_updater_keeps_fused_weights_at_each_published_version(tp: int, over_wire: bool) -> None:
    run = aurora_store.open_run(f"memory://aurora-tests/{uuid.uuid4().hex}/run", full_every=4, segment_bytes=4096)
    hist = [hf()]
    for i in range(5):
        hist.append(step(hist[-1], i, lr=1e-3))
    for sd in hist:
        run.publish(sd)
    ranks = garbage_like(fuse(hist[0], tp))
    live = VllmWeights(GEOM, runner=wire(ranks), tp_size=tp) if over_wire else VllmWeights(GEOM, ranks=ranks)
    up = Updater(run, region="eu", live=live)
    held = up.bootstrap(1)
    assert up.live_digest() == held.weights_digest == run.manifest(1).weights_digest
    assert same(ranks, fuse(hist[1], tp))
    for target in (3, 5):  # deltas only; then through the full version 4
        staged = up.stage(target)
        assert staged is not None and staged.version == target
        assert same(ranks, fuse(hist[1 if target == 3 else 3], tp)), "staging never touches the live weights"
        held2 = up.apply()
        assert held2 is not None and held2.version == target
        assert same(ranks, fuse(hist[target], tp))
        assert up.live_digest() == run.manifest(target).weights_digest


# ---------------------------------------------------------------- hostile input


def test_hostile_positions_and_names_are_refused() -> None:
    live, ranks, sd = loaded(2)
    before = [{k: v.clone() for k, v in r.items()} for r in ranks]
    name = "model.layers.0.self_attn.q_proj.weight"
    numel = sd[name].numel()
    for bad in (np.array([numel]), np.array([-1]), np.array([0.5]), np.zeros((2, 2), np.int64)):
        with pytest.raises(LayoutError):
            live.at(name, bad)
        with pytest.raises(LayoutError):
            live.prepare({name: (bad, np.zeros(bad.shape, "<u2"))})
    with pytest.raises(LayoutError, match="not in this model"):
        live.at("model.layers.9.mlp.up_proj.weight", np.array([0]))
    with pytest.raises(LayoutError, match="word"):
        live.prepare({name: (np.array([0, 1]), np.array([1, 2], dtype="<u4"))})
    with pytest.raises(LayoutError, match="word"):
        live.prepare({name: (np.array([0, 1]), np.array([1], dtype="<u2"))})
    assert same(ranks, before)


def test_unsupported_tensor_parallel_layouts_are_refused() -> None:
    specs, words = to_words(hf())
    with pytest.raises(LayoutError, match="divisible by 3"):
        VllmWeights(GEOM, ranks=[{}] * 3).load(specs, words)
    with pytest.raises(LayoutError, match="replicates KV heads"):
        VllmLayout(specs, GEOM, 4)
    odd = (*specs, TensorSpec("model.layers.0.mlp.router.weight", "BF16", (4, 64)))
    VllmLayout(odd, GEOM, 1)  # one rank: anything maps 1:1
    with pytest.raises(LayoutError, match="no known tensor-parallel placement"):
        VllmLayout(odd, GEOM, 2)
    no_k = tuple(s for s in specs if s.name != "model.layers.1.self_attn.k_proj.weight")
    with pytest.raises(LayoutError, match="fuses"):
        VllmLayout(no_k, GEOM, 1)
    with pytest.raises(LayoutError, match="does not fit"):
        VllmLayout(specs, Geometry(4, 4, 16), 1)  # the checkpoint has 2 KV heads, not 4
    with pytest.raises(LayoutError):
        Geometry.from_config({"hidden_size": 64})
    with pytest.raises(StoreError):
        VllmWeights(GEOM)


def test_load_refuses_mismatched_engine_params_without_writing() -> None:
    sd = hf()
    specs, words = to_words(sd)
    for mangle in ("drop", "shape", "extra"):
        ranks = garbage_like(fuse(sd, 2))
        if mangle == "drop":
            del ranks[1]["model.norm.weight"]
        elif mangle == "shape":
            ranks[1]["model.layers.0.mlp.down_proj.weight"] = torch.zeros(64, 192, dtype=torch.bfloat16)
        else:
            ranks[0]["model.layers.0.mlp.experts"] = torch.zeros(3, dtype=torch.bfloat16)
        before = [{k: v.clone() for k, v in r.items()} for r in ranks]
        live = VllmWeights(GEOM, ranks=ranks)
        with pytest.raises(LayoutError, match="rank"):
            live.load(specs, words)
        assert same(ranks, before)
        with pytest.raises(StoreError, match="load"):
            live.at("model.norm.weight", np.array([0]))
    live = VllmWeights(GEOM, ranks=garbage_like(fuse(sd, 2)))
    with pytest.raises(LayoutError, match="words"):
        live.load(specs, {**words, "model.norm.weight": words["model.norm.weight"][:3]})


def test_a_runner_answering_for_the_wrong_ranks_is_refused() -> None:
    local = LocalRunner(fuse(hf(), 2))

    def lying(op: str, args: tuple[Any, ...]) -> list[Any]:
        return [(0, res) for _, res in local(op, args)]

    specs, words = to_words(hf())
    with pytest.raises(LayoutError, match="ranks"):
        VllmWeights(GEOM, runner=lying, tp_size=2).load(specs, words)


# ---------------------------------------------------------------- engine helpers (no vllm needed)


def test_prompt_seeds_never_collide_with_child_seeds() -> None:
    seeds = prompt_seeds(5, prompts=7, samples=4)
    children = [s + i for s in seeds for i in range(4)]
    assert len(set(children)) == len(children)


def test_completions_from_vllm_outputs() -> None:
    def lp(x: float) -> SimpleNamespace:
        return SimpleNamespace(logprob=x)

    c1 = SimpleNamespace(
        index=1, token_ids=[7, 2], logprobs=[{7: lp(-0.5)}, {2: lp(-1.0), 9: lp(-0.1)}], finish_reason="stop"
    )
    c0 = SimpleNamespace(index=0, token_ids=[5], logprobs=[{5: lp(-0.25)}], finish_reason="length")
    got = completions([SimpleNamespace(outputs=[c1, c0])], samples=2)
    assert [c.token_ids for c in got[0]] == [(5,), (7, 2)]
    assert got[0][1].logprobs == (-0.5, -1.0) and got[0][1].finish_reason == "stop"
    with pytest.raises(StoreError, match="abort"):
        completions([SimpleNamespace(outputs=[SimpleNamespace(**{**vars(c0), "finish_reason": "abort"})])], 1)
    with pytest.raises(StoreError, match="samples"):
        completions([SimpleNamespace(outputs=[c0])], samples=2)


# ---------------------------------------------------------------- the real engine


def _vllm_and_cuda() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _vllm_and_cuda(), reason="needs vllm and a CUDA GPU")
@pytest.mark.parametrize("transfer", ["native", "extension"])
def test_vllm_engine_generates_and_applies_versions_in_place(tmp_path: Path, transfer: str) -> None:
    from actor.engines.vllm.engine import VllmEngine
    from aurora_store.bucket.replay import replay

    cfg = tiny_config(98, hidden=128, layers=2, heads=2, kv_heads=1)  # head_dim 64: every attention backend
    run = aurora_store.open_run(f"file://{tmp_path}/run", segment_bytes=4096)
    run.files.put("config.json", json.dumps(cfg).encode())
    sd = {k: v.detach().clone() for k, v in build_model(cfg, dtype=torch.bfloat16).state_dict().items()}
    for i in range(3):
        run.publish(sd)
        sd = step(sd, i, lr=1e-3)
    out = replay(run, 0, str(tmp_path / "v0"))
    from actor.engines.vllm.transfer import unavailable

    if transfer == "native" and unavailable() is not None:
        pytest.skip(f"this vLLM has no weight-transfer API: {unavailable()}")
    engine = VllmEngine(
        out.out, gpu_memory_utilization=0.2, max_model_len=64, weight_transfer=transfer, enable_prefix_caching=True
    )
    assert engine.native == (transfer == "native") and engine.mode == "mapped"
    up = Updater(run, region="local", live=engine.live)
    up.bootstrap(0)
    assert up.live_digest() == run.manifest(0).weights_digest
    got = engine.generate([[1, 40, 41], [1, 50]], samples=3, max_new_tokens=8, temperature=1.0, seed=0)
    assert [len(row) for row in got] == [3, 3]
    for c in (c for row in got for c in row):
        assert 0 < len(c.token_ids) == len(c.logprobs) <= 8 and all(x <= 0 for x in c.logprobs)
    assert up.stage() is not None
    held = up.apply()
    assert held is not None
    engine.applied(held.version, held.version_hash)
    assert up.live_digest() == run.manifest(2).weights_digest
    if hasattr(engine.llm, "get_weight_version"):
        assert engine.llm.get_weight_version() == f"2:{held.version_hash[:16]}"
    again = engine.generate([[1, 40, 41]], samples=1, max_new_tokens=8, temperature=0.0, seed=0)
    assert len(again[0][0].token_ids) > 0


# ---------------------------------------------------------------- quantized projections (issue 37)


def _quantized(scheme: str, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """What a trainer publishing ``scheme`` publishes of a model of ``config``, as HF tensors."""
    from aurora_store.rl.runspec import Artefact
    from aurora_store.tensors import from_words
    from trainer.publication import artefact_for

    model = build_model(config, seed=4)
    share = artefact_for(Artefact(kind="quantized", scheme=scheme)).state_for_publish(
        model, group=None, keep_device=False
    )
    return {s.name: from_words(s, share.words[s.name]) for s in share.specs}


@pytest.mark.parametrize("tp", [1, 2])
def test_int8_words_and_channel_scales_fuse_and_split_as_vllm_loads_them(tp: int) -> None:
    """INT8 words are laid out as BF16 weights are; per-channel scales [N, 1] fuse and split by output
    rows with their weights, and row-parallel layers (o_proj, down_proj) hold theirs whole on every rank."""
    sd = _quantized("int8-w8a8-channel", CFG)
    specs, words = to_words(sd)
    layout = VllmLayout(specs, GEOM, tp)
    want = fuse(sd, tp)
    assert layout.params["model.layers.0.self_attn.qkv_proj.weight_scale"] == (((64 + 32 + 32) // tp, 1), "F32")
    assert layout.params["model.layers.0.self_attn.o_proj.weight_scale"] == ((64, 1), "F32")
    assert layout.params["model.layers.0.mlp.gate_up_proj.weight"] == (((192 + 192) // tp, 64), "I8")
    assert {k: (tuple(v.shape), str(v.dtype)) for k, v in want[0].items()} == {
        k: (shape, str(torch_dtype(TensorSpec(k, dt, shape)))) for k, (shape, dt) in layout.params.items()
    }
    ranks = [{k: torch.full_like(v, 3) for k, v in r.items()} for r in want]
    VllmWeights(GEOM, ranks=ranks).load(specs, words)
    assert same(ranks, want)


def test_fp8_block_scales_fuse_by_blocks_and_parts_must_be_whole_blocks() -> None:
    config = tiny_config(98, hidden=256, layers=1, heads=4, kv_heads=2)  # q 256 rows, k and v 128: whole blocks
    sd = _quantized("fp8-e4m3-block128", config)
    specs, words = to_words(sd)
    geometry = Geometry.from_config(config)
    layout = VllmLayout(specs, geometry, 1)
    assert layout.params["model.layers.0.self_attn.qkv_proj.weight"] == ((512, 256), "F8_E4M3")
    assert layout.params["model.layers.0.self_attn.qkv_proj.weight_scale_inv"] == ((4, 2), "F32")
    assert layout.params["model.layers.0.mlp.gate_up_proj.weight_scale_inv"] == ((12, 2), "F32")
    assert layout.params["model.layers.0.mlp.down_proj.weight_scale_inv"] == ((2, 6), "F32")
    ranks = [
        {p: torch.zeros(shape, dtype=torch_dtype(TensorSpec(p, dt, shape))) for p, (shape, dt) in layout.params.items()}
    ]
    VllmWeights(geometry, ranks=ranks).load(specs, words)
    prefix = "model.layers.0.self_attn."
    fused = ranks[0][prefix + "qkv_proj.weight_scale_inv"]
    parts = [sd[prefix + f"{p}_proj.weight_scale_inv"] for p in "qkv"]
    assert torch.equal(fused, torch.cat(parts)), "q's two block rows, then k's, then v's"
    with pytest.raises(LayoutError, match=r"not whole 128-row blocks on each of 2 ranks"):
        VllmLayout(specs, geometry, 2)  # k's 128 rows split over 2 ranks: half blocks
    small = tiny_config(98, hidden=128, layers=1, heads=4, kv_heads=2)  # k and v 64 rows
    with pytest.raises(LayoutError, match=r"not whole 128-row blocks"):
        VllmLayout(to_words(_quantized("fp8-e4m3-block128", small))[0], Geometry.from_config(small), 1)
