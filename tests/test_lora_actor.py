"""An actor serving a LoRA run on the torch engine (issue 36): the base built from the run's own
attachments, each version's adapter written into the adapter's parameters in place, and a batch
never generated with a half-written adapter."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

import aurora_store
from actor import assemble
from actor.config import EngineConfig
from actor.updater import Updater
from aurora_store.errors import CorruptError
from aurora_store.format.keys import file_key
from aurora_store.format.weights import full_digest
from aurora_store.rl.errors import ModelError
from aurora_store.tensors import to_words
from aurora_store.testing.damage import overwrite
from tests.lora_runs import IDS, lora_run


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    specs, words = to_words({k: v.detach().cpu() for k, v in tensors.items()})
    return full_digest(specs, words).hex()


def _engine(run: Any, engine: Literal["torch", "vllm"] = "torch") -> Any:
    files = assemble.run_files(run, run.latest())
    spec = assemble.run_spec(run, files)
    return assemble.engine(run, spec, files, EngineConfig(engine=engine), "a1")


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # PEFT asks transformers
def test_the_engine_holds_the_runs_base_and_each_versions_adapter_bit_exact(tmp_path: Path) -> None:
    import peft
    from transformers import AutoModelForCausalLM

    from aurora_store.cli import main

    run, _ = lora_run(f"file://{tmp_path}/run")
    eng = _engine(run)
    assert set(eng.live.tensors) == set(run.materialize(0)), "the live tensors are the adapter's, by its names"
    up = Updater(run, region="home", live=eng.live)
    up.bootstrap(0)
    up.stage(2)
    assert up.apply() is not None and up.applied is not None and up.applied.version == 2
    assert _digest(eng.live.tensors) == run.manifest(2).weights_digest
    out = tmp_path / "v2"
    assert main(["replay", run.uri, "--version", "2", "--out", str(out)]) == 0
    base = AutoModelForCausalLM.from_pretrained(out / "base", torch_dtype=torch.bfloat16)
    fresh = peft.PeftModel.from_pretrained(base, out, autocast_adapter_dtype=False).eval()  # BF16 adapter, as served
    with torch.no_grad():
        assert torch.equal(eng.model(input_ids=IDS).logits, fresh(input_ids=IDS).logits), "what a replay computes"
    got = eng.generate([[5, 6, 7]], samples=2, max_new_tokens=4, temperature=0.0, seed=0)
    assert len(got[0]) == 2 and all(len(c.token_ids) == len(c.logprobs) >= 1 for c in got[0])


def test_readers_only_ever_see_whole_adapter_versions(tmp_path: Path) -> None:
    run, _ = lora_run(f"file://{tmp_path}/run", versions=10, lr=1e-3)
    whole = {run.manifest(v).weights_digest for v in range(10)}
    eng = _engine(run)
    up = Updater(run, region="home", live=eng.live)
    up.bootstrap(0)
    seen: list[str] = []
    stop = threading.Event()

    def batches() -> None:
        while not stop.is_set():
            with up.lock.read(), torch.no_grad():  # a generation batch: the adapter it computes with
                eng.model(input_ids=IDS[:1, :4])
                seen.append(_digest(eng.live.tensors))

    t = threading.Thread(target=batches)
    t.start()
    try:
        for v in range(1, 10):
            up.stage(v)
            up.apply()
    finally:
        stop.set()
        t.join()
    assert seen and set(seen) <= whole, "a batch saw a half-written adapter"
    assert _digest(eng.live.tensors) == run.manifest(9).weights_digest


def test_an_engine_is_refused_for_a_damaged_base_or_a_rank_above_its_own(tmp_path: Path) -> None:
    run, _ = lora_run(f"file://{tmp_path}/run", versions=1)  # rank 4
    files = assemble.run_files(run, run.latest())
    spec = assemble.run_spec(run, files)
    # refused before vLLM is imported or started (this venv has no vLLM): the rank, and what to start with
    with pytest.raises(ModelError, match=r"rank 4, above the rank this engine is started with \(1\).* 8 or more"):
        assemble.engine(run, spec, files, EngineConfig(engine="vllm", vllm_max_lora_rank=1), "a1")
    with pytest.raises(ModelError, match="vLLM takes a max LoRA rank of 1, 8, 16.*; 12 is none of them"):
        assemble.engine(run, spec, files, EngineConfig(engine="vllm", vllm_max_lora_rank=12), "a1")
    key = file_key("lora-base-00001-of-00001.safetensors")
    data = run.store.get(key, max_bytes=1 << 24)
    overwrite(run.store, key, data[:-2] + bytes([data[-2] ^ 1, data[-1]]))
    with pytest.raises(CorruptError, match="sha256"):
        _engine(aurora_store.open_run(run.uri))  # a new reader: nothing of the base verified yet
