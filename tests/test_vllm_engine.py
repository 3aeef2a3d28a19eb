"""The vLLM actor on a real vLLM engine (vLLM's CPU build, in .venv/vllm: `make test-vllm`).

A chain of versions (fulls; deltas coded sparse and classed; a NaN and a -0.0 among the changed
words) is applied to real engines with the ``aurora`` weight-transfer backend, and checked three
ways: the engine's parameters read back from its worker equal ``replay`` of each version laid
out by :class:`~actor.engines.vllm.layout.VllmLayout`, bit for bit; greedy and sampled tokens (and their
log-probabilities) equal those of a vanilla vLLM engine started from the replay; and a prompt
cached under one version is never answered from that cache after the next is applied. Engines
start once per module (each start is ~20-30 s on 2 cores).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import aurora_store
from actor.engines.vllm.layout import Geometry, VllmLayout, narrow
from actor.updater import Updater
from aurora_store.bucket.replay import replay
from aurora_store.bucket.run import Run
from aurora_store.errors import CorruptError, LayoutError
from aurora_store.rl.models import build_model, tiny_config

pytestmark = pytest.mark.vllm
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

CFG = {**tiny_config(256, hidden=128, layers=2, heads=4, kv_heads=2), "max_position_embeddings": 512}
PROMPTS = [[1, 40, 41, 42, 43], [1, 77, 3, 90], [1, *range(100, 140)]]
NAN, NEG_ZERO = 0x7FC1, 0x8000  # a quiet NaN with a payload, and -0.0, as BF16 words
NAN_TENSOR = "model.layers.0.mlp.down_proj.weight"


def perturb(sd: dict[str, torch.Tensor], seed: int, density: float = 0.02) -> dict[str, torch.Tensor]:
    """A training-like step: ``density`` of each tensor's elements move by a few ULPs."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in sd.items():
        flat = t.clone().view(-1)
        pick = torch.rand(flat.numel(), generator=g) < density
        noise = torch.randn(flat.numel(), generator=g) * flat.float().abs().clamp(min=1e-3) * 0.05
        flat[pick] = (flat.float()[pick] + noise[pick]).to(t.dtype)
        out[name] = flat.view(t.shape)
    return out


def with_words(sd: dict[str, torch.Tensor], name: str, at: list[int], words: list[int]) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in sd.items()}
    out[name].view(-1).view(torch.int16)[torch.tensor(at)] = torch.tensor(words, dtype=torch.int32).to(torch.int16)
    return out


def publish_chain(uri: str, config: dict[str, Any], seed: int = 0, *, nan: bool = True) -> Run:
    """v0 full; v1 sparse delta; v2 classed delta setting a NaN and a -0.0; v3 full (the NaN gone); v4
    classed; v5 sparse."""
    run = aurora_store.open_run(uri, full_every=1000, segment_bytes=16 << 10)
    run.files.put("config.json", json.dumps(config).encode())
    sd = {k: v.detach().clone() for k, v in build_model(config, seed=seed, dtype=torch.bfloat16).state_dict().items()}
    plan = [("full", "classed"), ("delta", "sparse"), ("delta", "classed"), ("full", "classed")]
    plan += [("delta", "classed"), ("delta", "sparse")]
    for v, (kind, codec) in enumerate(plan):
        if v:
            sd = perturb(sd, seed * 100 + v)
        if v == 2 and nan:
            sd = with_words(sd, NAN_TENSOR, [5, 6], [NAN, NEG_ZERO])
        if v == 3 and nan:  # a NaN weight makes every output NaN: the versions generation is compared on hold none
            sd = with_words(sd, NAN_TENSOR, [5], [0x3C00])
        run.config = dataclasses.replace(run.config, codec=codec)
        info = run.publish(sd, kind=kind)
        assert (info.version, info.kind) == (v, kind)
    return run


def vllm_layout_words(run: Run, version: int, layout: VllmLayout) -> list[dict[str, np.ndarray]]:
    """``replay`` of ``version`` laid out as vLLM's parameters on each rank (vocabulary padding zero)."""
    state = run.materialize_words(version)
    ranks: list[dict[str, np.ndarray]] = [
        {p: np.zeros(shape, dtype="<u2") for p, (shape, _) in layout.params.items()} for _ in range(layout.tp_size)
    ]
    for s in layout.specs:
        hf = np.asarray(state.words[s.name]).reshape(s.shape)
        for reg in layout.regions(s.name, write=True):
            narrow(ranks[reg.rank][reg.param], reg.dim, reg.param_start, reg.length)[...] = narrow(
                hf, reg.dim, reg.hf_start, reg.length
            )
    return ranks


def engine_words(engine: Any, layout: VllmLayout) -> list[dict[str, np.ndarray]]:
    """Every vLLM parameter of every rank, read back from the workers as words."""
    dumps = sorted(engine._rpc("dump", ([list(layout.params) for _ in range(layout.tp_size)],)), key=lambda d: d[0])
    return [{p: np.asarray(w).reshape(layout.params[p][0]) for p, w in d[1].items()} for d in dumps]


def assert_engine_holds(engine: Any, run: Run, version: int, layout: VllmLayout) -> None:
    want, got = vllm_layout_words(run, version, layout), engine_words(engine, layout)
    for rank, (w, g) in enumerate(zip(want, got, strict=True)):
        assert w.keys() == g.keys()
        for p in w:
            assert np.array_equal(w[p], g[p]), f"rank {rank} {p} differs from version {version}"


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Run, Path]]:
    d = tmp_path_factory.mktemp("vllm-chain")
    run = publish_chain(f"file://{d}/run", CFG)
    formats = {run.manifest(v).format for v in range(6)}
    assert len(formats) == 2, f"the chain covers both delta formats, got {formats}"
    yield run, d


@pytest.fixture(scope="module")
def mapped(chain: tuple[Run, Path]) -> Iterator[Any]:
    from actor.engines.vllm.engine import VllmEngine

    run, d = chain
    out = replay(run, 0, str(d / "engine-v0")).out
    engine = VllmEngine(out, max_model_len=512, weight_transfer="native", enable_prefix_caching=True)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def layout(chain: tuple[Run, Path]) -> VllmLayout:
    run, _ = chain
    return VllmLayout(run.manifest(0).tensors, Geometry.from_config(CFG), 1)


def vanilla(model_dir: str, **kw: Any) -> Any:
    from vllm import LLM

    return LLM(model=model_dir, dtype="bfloat16", max_model_len=512, enforce_eager=True, skip_tokenizer_init=True, **kw)


def greedy(llm: Any, prompts: list[list[int]]) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=12, temperature=0.0, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(tuple(o.outputs[0].token_ids), sampled_logprobs(o.outputs[0])) for o in outs]


def sampled_logprobs(c: Any) -> tuple[float, ...]:
    """The log-probability vLLM reported for each token it sampled in completion ``c``."""
    return tuple(lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True))


# ---------------------------------------------------------------- mapped mode


def test_mapped_engine_holds_every_version_bit_exact(mapped: Any, chain: tuple[Run, Path], layout: VllmLayout) -> None:
    run, _ = chain
    assert (mapped.native, mapped.mode) == (True, "mapped")
    up = Updater(run, region="local", live=mapped.live)
    up.bootstrap(0)
    assert_engine_holds(mapped, run, 0, layout)
    for v in range(1, 6):
        staged = up.stage(v)
        assert staged is not None and staged.version == v
        applied = up.apply()
        assert applied is not None and applied.version == v
        assert_engine_holds(mapped, run, v, layout)
        assert up.live_digest() == run.manifest(v).weights_digest
        if v == 2:
            assert mapped.live.at(NAN_TENSOR, np.array([5, 6])).tolist() == [NAN, NEG_ZERO]


def test_a_version_a_worker_cannot_stage_leaves_the_engine_on_its_version(
    mapped: Any, chain: tuple[Run, Path], layout: VllmLayout
) -> None:
    """Versions are decoded inside the worker from their bytes: a damaged one is refused there, every rank
    drops it, and the engine holds and serves the version it had; the next good one goes on."""
    from actor.stager import Base, Staged

    run, _ = chain
    up = Updater(run, region="local", live=mapped.live)
    up.bootstrap(3)  # full; then 4 (a classed delta) and 5 (a sparse one)
    assert isinstance(up.stage(4), Staged), "decoded in the workers, not on the host"
    up.apply()
    m = run.manifest(5)
    bad = [bytearray(d) for d in run.reader.fetch_all(m)]
    for b in bad:
        b[len(b) // 2] ^= 0x5A
    applied = run.manifest(4)
    with pytest.raises(CorruptError, match="rank 0"):
        mapped.live.stage_version(
            Base(4, applied.version_hash, applied.weights_digest), m, [memoryview(b) for b in bad]
        )
    assert_engine_holds(mapped, run, 4, layout)
    assert up.verify() == (applied.weights_digest, "written"), "read back at the positions version 4 wrote"
    up.stage(5)
    up.apply()
    assert_engine_holds(mapped, run, 5, layout)
    assert up.verify() == (run.manifest(5).weights_digest, "written")


@pytest.fixture(scope="module")
def fresh(chain: tuple[Run, Path]) -> Iterator[Any]:
    """A vanilla vLLM engine (no aurora backend) started from ``replay`` of version 5."""
    run, d = chain
    llm = vanilla(replay(run, 5, str(d / "fresh-v5")).out, enable_prefix_caching=False)
    yield llm
    llm.llm_engine.engine_core.shutdown()


def test_tokens_after_a_delta_equal_a_fresh_engines(mapped: Any, fresh: Any, chain: tuple[Run, Path]) -> None:
    """Greedy tokens and their log-probabilities, and seeded samples, after version 5 was applied as a
    delta on version 4 equal those of an engine started from version 5: what the engine computes
    from (its repacked kernels on CPU) follows the written weights."""
    from vllm import SamplingParams

    run, _ = chain
    up = Updater(run, region="local", live=mapped.live)
    up.bootstrap(4)
    before = greedy(mapped.llm, PROMPTS)
    up.stage(5)
    assert up.apply() is not None
    after, want = greedy(mapped.llm, PROMPTS), greedy(fresh, PROMPTS)
    assert after == want
    assert after != before, "version 5 changes what the model computes (else this test proves nothing)"
    params = SamplingParams(n=3, max_tokens=12, temperature=1.0, seed=7, logprobs=0)
    inputs = [{"prompt_token_ids": p} for p in PROMPTS]
    mine, theirs = (
        [[(c.token_ids, sampled_logprobs(c)) for c in o.outputs] for o in llm.generate(inputs, params, use_tqdm=False)]
        for llm in (mapped.llm, fresh)
    )
    assert mine == theirs


def test_a_prompt_cached_under_one_version_is_recomputed_after_the_next(
    mapped: Any, fresh: Any, chain: tuple[Run, Path]
) -> None:
    """With prefix caching on, a prompt's KV blocks computed under version 4 are not reused after version
    5 is applied: its log-probabilities are those of an engine that only ever applied version 5."""
    from vllm import SamplingParams

    run, _ = chain
    up = Updater(run, region="local", live=mapped.live)
    up.bootstrap(4)
    prompt = [{"prompt_token_ids": [1, *[(7 * i) % 250 + 3 for i in range(300)]]}]
    params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=0)
    mapped.llm.generate(prompt, params, use_tqdm=False)
    again = mapped.llm.generate(prompt, params, use_tqdm=False)[0]
    assert again.num_cached_tokens > 0, "the prompt is served from the prefix cache under one version"
    up.stage(5)
    up.apply()
    after = mapped.llm.generate(prompt, params, use_tqdm=False)[0]
    assert after.num_cached_tokens == 0
    want = fresh.generate(prompt, params, use_tqdm=False)[0]
    assert after.outputs[0].token_ids == want.outputs[0].token_ids
    assert sampled_logprobs(after.outputs[0]) == sampled_logprobs(want.outputs[0])


def test_sampled_logprobs_are_after_temperature(mapped: Any, chain: tuple[Run, Path]) -> None:
    """``logprobs_mode="processed_logprobs"``: the log-probability vLLM reports for a sampled token is
    that of the sampling distribution (temperature applied), as the trainer recomputes it."""
    run, _ = chain
    up = Updater(run, region="local", live=mapped.live)
    up.bootstrap(5)
    t = 0.6
    got = mapped.generate(PROMPTS, samples=4, max_new_tokens=16, temperature=t, seed=3)
    model = build_model(CFG, dtype=torch.bfloat16)
    state = run.materialize_words(5)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            p.view(-1).view(torch.int16).copy_(torch.from_numpy(np.asarray(state.words[name]).view("<i2")))
    diffs: dict[float, list[float]] = {t: [], 1.0: []}
    for prompt, comps in zip(PROMPTS, got, strict=True):
        for c in comps:
            ids = torch.tensor([prompt + list(c.token_ids)])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            for temp in diffs:
                lp = torch.log_softmax(logits / temp, dim=-1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
                diffs[temp] += (lp - torch.tensor(c.logprobs)).abs().tolist()
    at_t, at_1 = float(np.mean(diffs[t])), float(np.mean(diffs[1.0]))
    assert at_t < 0.05 and at_t * 4 < at_1, (at_t, at_1)
    assert math.isfinite(at_t)


# ---------------------------------------------------------------- patches mode


@pytest.fixture(scope="module")
def patched(chain: tuple[Run, Path]) -> Iterator[Any]:
    from actor.engines.vllm.engine import VllmEngine

    run, d = chain
    out = replay(run, 0, str(d / "patches-v0")).out
    engine = VllmEngine(out, max_model_len=512, weight_transfer="patches")
    yield engine
    engine.close()


def test_patches_mode_holds_every_version_through_vllms_loaders(
    patched: Any, fresh: Any, chain: tuple[Run, Path], layout: VllmLayout
) -> None:
    """The same chain through vLLM's own ``load_weights`` (checkpoint patches): bit-exact after every
    version it can carry; the NaN of version 2 is refused before anything is written (the engine
    stays at version 1), and the full version 3 lets it follow the chain again."""
    run, _ = chain
    assert (patched.native, patched.mode) == (True, "patches")
    up = Updater(run, region="local", live=patched.live)
    up.bootstrap(0)
    assert_engine_holds(patched, run, 0, layout)
    up.stage(1)
    up.apply()
    assert_engine_holds(patched, run, 1, layout)
    with pytest.raises(LayoutError, match="NaN"):
        up.stage(2)
    assert_engine_holds(patched, run, 1, layout)
    assert up.applied is not None and up.applied.version == 1
    for v in (4, 5):
        up.stage(v)
        assert up.apply() is not None
        assert_engine_holds(patched, run, v, layout)
        assert up.live_digest() == run.manifest(v).weights_digest
    assert greedy(patched.llm, PROMPTS) == greedy(fresh, PROMPTS)


# ---------------------------------------------------------------- tensor parallel, MoE


def test_tensor_parallel_2_holds_every_version_bit_exact(chain: tuple[Run, Path]) -> None:
    """Two tensor-parallel ranks on the CPU build (each bound to its own core): every rank's shard
    of every version bit-exact, and tokens equal a vanilla two-rank engine's on the last version."""
    from actor.engines.vllm.engine import VllmEngine

    run, d = chain
    engine = VllmEngine(replay(run, 0, str(d / "tp2-v0")).out, max_model_len=512, tensor_parallel_size=2)
    try:
        layout = VllmLayout(run.manifest(0).tensors, Geometry.from_config(CFG), 2)
        up = Updater(run, region="local", live=engine.live)
        up.bootstrap(0)
        for v in range(1, 6):
            up.stage(v)
            up.apply()
            assert_engine_holds(engine, run, v, layout)
        ours = greedy(engine.llm, PROMPTS)
    finally:
        engine.close()
    llm = vanilla(replay(run, 5, str(d / "tp2-v5")).out, tensor_parallel_size=2)
    try:
        assert ours == greedy(llm, PROMPTS)
    finally:
        llm.llm_engine.engine_core.shutdown()


MOE = {
    **CFG,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 64,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "norm_topk_prob": True,
    "mlp_only_layers": [],
}


def test_moe_model_follows_a_chain_through_checkpoint_patches(tmp_path: Path) -> None:
    """A tiny Qwen3-MoE: the layout is not mapped here (experts), so versions go to vLLM's own
    loaders as checkpoint patches; on the CPU build vLLM prepacks the experts after loading, and
    the engine's tokens after each delta equal a vanilla engine's started from that version."""
    from actor.engines.vllm.engine import VllmEngine

    run = publish_chain(f"file://{tmp_path}/run", MOE, seed=1, nan=False)
    engine = VllmEngine(replay(run, 0, str(tmp_path / "v0")).out, max_model_len=512)
    try:
        assert (engine.native, engine.mode) == (True, "patches")
        up = Updater(run, region="local", live=engine.live)
        up.bootstrap(4)
        before = greedy(engine.llm, PROMPTS)
        up.stage(5)
        up.apply()
        assert up.live_digest() == run.manifest(5).weights_digest
        ours = greedy(engine.llm, PROMPTS)
    finally:
        engine.close()
    llm = vanilla(replay(run, 5, str(tmp_path / "v5")).out)
    try:
        assert ours == greedy(llm, PROMPTS)
        assert ours != before
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_a_layout_the_actor_cannot_map_is_refused_when_the_engine_comes_up(tmp_path: Path) -> None:
    """Forced to write in place (``native``), an MoE model's experts have no mapping: the engine is
    refused with one LayoutError once vLLM has loaded it (the actor then ends), and its processes
    are shut down; before, the first bootstrap failed and was retried forever."""
    from actor.engines.vllm.engine import VllmEngine

    run = publish_chain(f"file://{tmp_path}/run", MOE, seed=2, nan=False)
    with pytest.raises(LayoutError, match="do not match|mismatched|not laid out|experts"):
        VllmEngine(replay(run, 0, str(tmp_path / "v0")).out, max_model_len=512, weight_transfer="native")


def test_a_seeded_batch_longer_than_one_steps_token_budget(mapped: Any, chain: tuple[Run, Path]) -> None:
    """Every request is seeded; on the CPU build a split prefill of a seeded request killed the engine
    core ("CPU Generator does not use offset") until chunked prefill was turned off there."""
    run, _ = chain
    Updater(run, region="local", live=mapped.live).bootstrap(5)
    prompts = [[1, *[(13 * i + p) % 250 + 3 for i in range(120)]] for p in range(48)]  # 5,808 prompt tokens
    got = mapped.generate(prompts, samples=4, max_new_tokens=4, temperature=1.0, seed=11)
    assert [len(row) for row in got] == [4] * 48
    assert got == mapped.generate(prompts, samples=4, max_new_tokens=4, temperature=1.0, seed=11), "seeded: same again"
