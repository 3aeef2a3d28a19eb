"""A run of INT8 weights served by vLLM's CPU build (issue 37; `make test-vllm`).

The trainer publishes the decoder's projections as ``int8-w8a8-channel`` words and scales; the actor's
vLLM engine starts from ``aurora replay``'s quantized checkpoint (compressed-tensors W8A8, vLLM's
``CompressedTensorsW8A8Int8``) and applies every later version in place into the INT8 weights and
their scales, which vLLM's CPU kernel then repacks (:mod:`actor.engines.vllm.kernels`). Checked: the
engine's checkpoint-format tensors equal the version's words and scales bit for bit at every version
(deltas and a full version on the route), and greedy tokens and log-probabilities equal those of a
vanilla vLLM engine started from that version's replay. FP8 on vLLM needs a GPU (vLLM's CPU build has
no FP8 linear kernel without AMX-FP8): ``test_fp8_block_on_vllm`` is marked ``gpu``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from actor import assemble
from actor.config import EngineConfig
from actor.engines.vllm.layout import Geometry, VllmLayout, narrow
from actor.updater import Updater
from aurora_store.bucket.replay import replay
from aurora_store.bucket.run import Run
from aurora_store.rl.models import tiny_config
from tests.quant_runs import VOCAB, quantized_run

pytestmark = pytest.mark.vllm
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

CFG = {**tiny_config(VOCAB, hidden=128, layers=2, heads=4, kv_heads=2), "max_position_embeddings": 512}
SCHEME = "int8-w8a8-channel"
VERSIONS = 5
FULL = 3
WORDS_ONLY = 1
CHECKED = (WORDS_ONLY, 4)
"""Versions compared with a fresh engine: a delta that moves words and no scale, and a delta after the
full version."""
PROMPTS = [[1, 20, 21, 22, 23], [1, 30, 5, 40], [1, *range(2, 30)]]


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    tmp = tmp_path_factory.mktemp("vllm-int8")
    run, _ = quantized_run(
        f"file://{tmp}/run", SCHEME, VERSIONS, lr=0.02, config=CFG, fulls=(FULL,), words_only=(WORDS_ONLY,)
    )
    return run, tmp


def vanilla_greedy(model_dir: str) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """Greedy outputs of a vanilla vLLM engine started from ``model_dir`` (then shut down)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="bfloat16", max_model_len=512, enforce_eager=True, skip_tokenizer_init=True)
    try:
        params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        return [
            (
                tuple(o.outputs[0].token_ids),
                tuple(lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids, strict=True)),
            )
            for o in outs
        ]
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def reference(chain: tuple[Run, Path]) -> dict[int, list[Any]]:
    run, tmp = chain
    return {v: vanilla_greedy(replay(run, v, str(tmp / f"replay-{v}"), scheme=SCHEME).out) for v in CHECKED}


@pytest.fixture(scope="module")
def engine(chain: tuple[Run, Path]) -> Iterator[Any]:
    run, _ = chain
    eng = _engine(run, "int8-actor")
    yield eng
    eng.close()


def _engine(run: Run, worker: str) -> Any:
    files = assemble.run_files(run, run.latest())
    spec = assemble.run_spec(run, files)
    eng = assemble.engine(run, spec, files, EngineConfig(engine="vllm", vllm_max_model_len=512), worker)
    eng.stop_token_ids = []  # as the reference: every sample runs its 8 tokens
    return eng


def _greedy(engine: Any) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    out = engine.generate(PROMPTS, samples=1, max_new_tokens=8, temperature=0.0, seed=0)
    return [(c[0].token_ids, c[0].logprobs) for c in out]


def _engine_holds(engine: Any, run: Run, version: int, config: dict[str, Any] = CFG) -> None:
    """The engine's checkpoint-format parameters equal ``version``'s words and scales laid out as vLLM's."""
    layout = VllmLayout(run.manifest(version).tensors, Geometry.from_config(config), 1)
    state = run.materialize_words(version)
    (dump,) = engine._rpc("dump", ([list(layout.params)],))
    got = {p: np.asarray(w) for p, w in dump[1].items()}
    for s in layout.specs:
        hf = np.asarray(state.words[s.name]).reshape(s.shape)
        for reg in layout.regions(s.name, write=True):
            have = got[reg.param].reshape(layout.params[reg.param][0])
            want = narrow(hf, reg.dim, reg.hf_start, reg.length)
            assert np.array_equal(narrow(have, reg.dim, reg.param_start, reg.length), want), (
                f"{s.name} at version {version}"
            )


def test_the_run_publishes_int8_words_and_scales(chain: tuple[Run, Path]) -> None:
    run, _ = chain
    specs = {t.name: t for t in run.manifest(VERSIONS - 1).tensors}
    q = "model.layers.0.self_attn.q_proj"
    assert specs[f"{q}.weight"].dtype == "I8" and specs[f"{q}.weight_scale"].dtype == "F32"
    assert specs[f"{q}.weight_scale"].shape == (specs[f"{q}.weight"].shape[0], 1)
    assert specs["model.embed_tokens.weight"].dtype == "BF16" and specs["model.norm.weight"].dtype == "BF16"


def test_versions_differ(chain: tuple[Run, Path], reference: dict[int, list[Any]]) -> None:
    """The comparison below proves something only if the versions compute apart; version 1 moves words
    and no scale (what the engine must repack from the words alone)."""
    run, _ = chain
    assert reference[CHECKED[0]] != reference[CHECKED[1]]
    a, b = run.materialize_words(0), run.materialize_words(WORDS_ONLY)
    moved = [n for n in a.words if n.endswith("weight") and not np.array_equal(a.words[n], b.words[n])]
    assert moved and all(n.endswith("q_proj.weight") for n in moved)
    assert all(np.array_equal(a.words[n], b.words[n]) for n in a.words if n.endswith("weight_scale"))


def test_every_version_applies_in_place_and_serves_as_a_fresh_engine(
    engine: Any, chain: tuple[Run, Path], reference: dict[int, list[Any]]
) -> None:
    run, _ = chain
    up = Updater(run, region="local", live=engine.live)
    assert up.bootstrap(0).version == 0
    _engine_holds(engine, run, 0)
    assert _greedy(engine) != reference[WORDS_ONLY], "version 0 computes apart from version 1"
    for target in range(1, VERSIONS):
        up.stage(target)
        assert up.apply() is not None and up.applied is not None and up.applied.version == target
        assert up.live_digest() == run.manifest(target).weights_digest
        _engine_holds(engine, run, target)
        if target in reference:
            assert _greedy(engine) == reference[target], f"version {target}"


def test_transformers_loads_the_int8_replay_with_the_published_words(chain: tuple[Run, Path]) -> None:
    """The replay is a compressed-tensors checkpoint transformers loads too (compressed-tensors, which vLLM
    brings, installed): its INT8 weights are the run's words. (transformers holds the scales in the
    model's dtype, BF16: compute with it is not bit-exact with vLLM's, whose FP32 scales are the run's.)"""
    import torch
    from transformers import AutoModelForCausalLM

    from aurora_store.tensors import to_words

    run, tmp = chain
    out = replay(run, VERSIONS - 1, str(tmp / "hf-int8"), scheme=SCHEME).out
    model = AutoModelForCausalLM.from_pretrained(out)
    state = run.materialize_words(VERSIONS - 1).words
    params = dict(model.named_parameters())
    names = [n for n in state if n.endswith("proj.weight")]
    assert len(names) == 14
    for name in names:
        assert params[name].dtype == torch.int8
        assert np.array_equal(to_words({name: params[name].detach()})[1][name], state[name]), name


def test_an_fp8_run_is_refused_by_vllms_cpu_build_before_it_starts(tmp_path: Path) -> None:
    """vLLM's CPU build has no FP8 linear kernel: the actor says so (and what serves the run) up front."""
    import torch

    from aurora_store.errors import UnsupportedError

    if torch.cuda.is_available():
        pytest.skip("a GPU serves FP8")
    run, _ = quantized_run(f"file://{tmp_path}/run", "fp8-e4m3-block128", 1, config=CFG)
    with pytest.raises(UnsupportedError, match="FP8 weights, which vLLM's CPU build cannot serve.*--engine torch"):
        _engine(run, "fp8-actor")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="vLLM serves block FP8 on CUDA only (its CPU build has no FP8 kernel)")
def test_fp8_block_on_vllm(tmp_path: Path) -> None:
    """The same on vLLM's block-FP8 layers (CUDA): E4M3 words and block scales written in place at every
    version, and the engine computing as a fresh engine on each checked version's replay."""
    config = {**tiny_config(VOCAB, hidden=256, layers=2, heads=4, kv_heads=2), "max_position_embeddings": 512}
    scheme = "fp8-e4m3-block128"  # hidden 256, 4 heads: q 256 rows, k and v 128, whole 128-row blocks
    run, _ = quantized_run(
        f"file://{tmp_path}/run", scheme, VERSIONS, lr=0.02, config=config, fulls=(FULL,), words_only=(WORDS_ONLY,)
    )
    want = {v: vanilla_greedy(replay(run, v, str(tmp_path / f"replay-{v}"), scheme=scheme).out) for v in CHECKED}
    eng = _engine(run, "fp8-actor")
    try:
        up = Updater(run, region="local", live=eng.live)
        up.bootstrap(0)
        _engine_holds(eng, run, 0, config)
        for target in range(1, VERSIONS):
            up.stage(target)
            assert up.apply() is not None
            assert up.live_digest() == run.manifest(target).weights_digest
            _engine_holds(eng, run, target, config)
            if target in want:
                assert _greedy(eng) == want[target], f"version {target}"
    finally:
        eng.close()
