"""A LoRA run served by vLLM's CPU build with ``enable_lora`` (issue 36; `make test-vllm`).

The actor's vLLM engine (:mod:`actor.engines.vllm.lora`) loads the run's base once and each version's
adapter under an id of its own. Checked against a vanilla vLLM engine, started the same way, that loads
each version's ``aurora replay`` PEFT directory: the same greedy tokens and log-probabilities at every
version (deltas, and a full version on the route); batches racing swaps each run on one whole version,
and adapters no request names any more are unloaded; a staging that cannot load its adapter leaves the
served one serving. Both engines start once per module (~30 s each on 2 cores).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actor import assemble
from actor.config import EngineConfig
from actor.updater import Updater
from aurora_store.bucket.replay import BASE_DIR, Adapter, replay
from aurora_store.bucket.run import Run
from aurora_store.errors import StoreError
from aurora_store.rl.models import tiny_config
from tests.lora_runs import VOCAB, lora_run
from trainer.adapter import LoraSettings

pytestmark = pytest.mark.vllm
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

CFG = {**tiny_config(VOCAB, hidden=128, layers=2, heads=4, kv_heads=2), "max_position_embeddings": 512}
SETTINGS = LoraSettings(
    rank=8, alpha=16.0, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
)
VERSIONS = 6
PROMPTS = [[1, 20, 21, 22, 23], [1, 30, 5, 40], [1, *range(2, 30)]]


def _shape(run: Run) -> Adapter:
    files = assemble.run_files(run, run.latest())
    lora = assemble.run_spec(run, files).artefact.lora
    assert lora is not None
    return Adapter(lora.rank, lora.alpha, lora.targets, lora.base_files, lora.base_digest)


def _greedy(engine: Any) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    out = engine.generate(PROMPTS, samples=1, max_new_tokens=8, temperature=0.0, seed=0)
    return [(c[0].token_ids, c[0].logprobs) for c in out]


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    """A LoRA run whose adapter moves a lot each step (so versions sample apart), version 4 full."""
    tmp = tmp_path_factory.mktemp("vllm-lora")
    run, _ = lora_run(f"file://{tmp}/run", VERSIONS, lr=0.3, config=CFG, settings=SETTINGS, fulls=(4,))
    return run, tmp


@pytest.fixture(scope="module")
def reference(chain: tuple[Run, Path]) -> dict[int, list[tuple[tuple[int, ...], tuple[float, ...]]]]:
    """Each version's greedy outputs from a vanilla vLLM engine loading ``aurora replay``'s directories."""
    from vllm import LLM
    from vllm.lora.request import LoRARequest

    from actor.engines.vllm.engine import generate

    run, tmp = chain
    shape = _shape(run)
    dirs = {v: str(tmp / f"replay-{v}") for v in range(VERSIONS)}
    for v, d in dirs.items():
        replay(run, v, d, adapter=shape)
    llm = LLM(
        model=os.path.join(dirs[0], BASE_DIR),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=512,
        enforce_eager=True,
        enable_lora=True,
        max_lora_rank=8,
        max_loras=2,
        max_cpu_loras=4,
        enable_chunked_prefill=False,
        logprobs_mode="processed_logprobs",
        enable_prefix_caching=False,
        seed=0,
    )
    try:
        out = {}
        for v, d in dirs.items():
            got = generate(
                llm,
                PROMPTS,
                samples=1,
                max_new_tokens=8,
                temperature=0.0,
                seed=0,
                top_p=1.0,
                stop_token_ids=[],
                lora_request=LoRARequest(f"replay-{v}", v + 1, d),
            )
            out[v] = [(c[0].token_ids, c[0].logprobs) for c in got]
    finally:
        llm.llm_engine.engine_core.shutdown()
    return out


@pytest.fixture(scope="module")
def engine(chain: tuple[Run, Path]) -> Iterator[Any]:
    run, _ = chain
    files = assemble.run_files(run, run.latest())
    spec = assemble.run_spec(run, files)
    eng = assemble.engine(run, spec, files, EngineConfig(engine="vllm", vllm_max_model_len=512), "lora-actor")
    eng.stop_token_ids = []  # as the reference: every sample runs its 8 tokens
    yield eng
    eng.close()


def test_versions_differ(reference: dict[int, list[Any]]) -> None:
    """What the other tests compare would prove nothing if the versions sampled alike: each version's
    outputs (tokens and log-probabilities) are its own, and most sample other tokens too."""
    assert len({tuple(reference[v]) for v in range(VERSIONS)}) == VERSIONS
    tokens = [tuple(t for t, _ in reference[v]) for v in range(VERSIONS)]
    assert len(set(tokens)) >= VERSIONS - 1, tokens


def test_every_version_serves_as_a_fresh_engine_on_its_replay(
    engine: Any, chain: tuple[Run, Path], reference: dict[int, list[Any]]
) -> None:
    run, _ = chain
    up = Updater(run, region="local", live=engine.live)
    assert up.bootstrap(0).version == 0
    assert _greedy(engine) == reference[0]
    for target in (1, 2, 3, 5):  # 3 -> 5 is routed through full version 4 or through deltas
        up.stage(target)
        assert up.apply() is not None and up.applied is not None and up.applied.version == target
        assert up.verify()[0] == run.manifest(target).weights_digest  # the host copy the adapter was built from
        assert _greedy(engine) == reference[target], f"version {target}"
    assert engine.adapters.loaded() == {engine.adapters.serving.id}, "adapters no longer served are unloaded"
    assert os.listdir(engine.root) == [f"{engine.adapters.serving.id:08d}"]


def test_batches_racing_swaps_each_run_on_one_whole_version(
    engine: Any, chain: tuple[Run, Path], reference: dict[int, list[Any]]
) -> None:
    run, _ = chain
    up = Updater(run, region="local", live=engine.live)
    up.bootstrap(0)
    by_output = {tuple(reference[v]): v for v in reference}  # one version per output (test_versions_differ)
    seen: list[int] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def generate() -> None:
        try:
            while not done.is_set():
                out = _greedy(engine)
                assert tuple(out) in by_output, "a batch matched no version: a half-written or missing adapter"
                seen.append(by_output[tuple(out)])
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=generate)
    t.start()
    try:
        for target in range(1, VERSIONS):
            up.stage(target)  # loads the adapter while batches run
            up.apply()
            while (not seen or seen[-1] != target) and t.is_alive():  # a batch on it before the next swap
                done.wait(0.01)
    finally:
        done.set()
        t.join()
    assert not errors, errors
    assert seen == sorted(seen), f"batches never went back to an older version: {seen}"
    assert seen[-1] == VERSIONS - 1
    assert engine.adapters.loaded() == {engine.adapters.serving.id}


def test_a_staging_that_cannot_load_its_adapter_keeps_the_served_one(
    engine: Any, chain: tuple[Run, Path], reference: dict[int, list[Any]]
) -> None:
    run, _ = chain
    up = Updater(run, region="local", live=engine.live)
    up.bootstrap(1)
    served = engine.adapters.serving.id
    blocked = os.path.join(engine.root, f"{engine.adapters._next:08d}")
    Path(blocked).write_bytes(b"in the way")  # where the next adapter's directory would go: a real OS error
    with pytest.raises(StoreError, match="could not load the staged LoRA adapter.*keeps serving"):
        up.stage(2)
    assert up.staged is None and up.applied is not None and up.applied.version == 1
    assert engine.adapters.serving.id == served and _greedy(engine) == reference[1]
    os.remove(blocked)
    up.stage(2)  # the follower tries again: a new id, a new directory
    up.apply()
    assert _greedy(engine) == reference[2]
