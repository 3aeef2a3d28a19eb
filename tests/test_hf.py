"""A user's own HF model and tokenizer through the pipeline: version 0 is the checkpoint's own BF16
bits (tied embeddings published once), the run records what rebuilds model and tokenizer, `aurora
replay` writes a directory transformers loads, and an actor assembled from the bucket alone samples
exactly what transformers' own greedy generation produces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from actor import assemble
from actor.config import EngineConfig
from actor.updater import Updater
from aurora_store.bucket.replay import replay
from aurora_store.bucket.run import Run, open_run
from aurora_store.rl.errors import ModelError
from aurora_store.rl.runspec import NAME as RUN_SPEC
from aurora_store.rl.runspec import RunSpec, RunSpecError
from aurora_store.rl.sampling import SamplingConfig
from tests.helpers import bits_equal
from trainer.config import DataConfig, ModelConfig, TrainerConfig
from trainer.policy import check_resume, new_policy, record, run_spec
from trainer.publication import ModelPublisher

INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _cfg(model_dir: Path, **data: Any) -> TrainerConfig:
    return TrainerConfig(
        store="memory://unused",
        redis="redis://unused",
        run_id="hf",
        model=ModelConfig(model=str(model_dir)),
        data=DataConfig(**data),
        sampling=SamplingConfig(group=2, max_new_tokens=8),
    )


def _publish_v0(model_dir: Path, tmp_path: Path, **data: Any) -> tuple[Run, Any, RunSpec]:
    cfg = _cfg(model_dir, **data)
    policy = new_policy(cfg)
    run = open_run(f"file://{tmp_path}/run")
    spec = run_spec(cfg, policy)
    record(run, policy, spec)
    assert ModelPublisher(run, policy.model).publish(step=0, kind="full").kind == "full"
    return run, policy, spec


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_version_0_is_the_checkpoints_own_bits(hf_models: dict[str, Path], arch: str, tmp_path: Path) -> None:
    run, policy, _ = _publish_v0(hf_models[arch], tmp_path)
    assert all(p.dtype == torch.float32 for p in policy.model.parameters()), "FP32 masters"
    published = run.materialize(0)
    ckpt = load_file(str(hf_models[arch] / "model.safetensors"))
    assert set(published) == set(ckpt), "the checkpoint's tensors, and nothing twice"
    assert ("lm_head.weight" in published) == (arch == "llama"), "a tied lm_head is published once, as embed_tokens"
    assert bits_equal(published, ckpt), "version 0 is the checkpoint's own BF16 bits"
    names = run.files.names()
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", RUN_SPEC} <= set(names)
    assert "chat_template.jinja" in names or "chat_template" in run.files.get("tokenizer_config.json").decode()


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_a_replayed_version_loads_with_transformers(hf_models: dict[str, Path], arch: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, _, _ = _publish_v0(hf_models[arch], tmp_path)
    out = tmp_path / "replayed"
    replay(run, 0, str(out))
    mine = AutoModelForCausalLM.from_pretrained(out)
    theirs = AutoModelForCausalLM.from_pretrained(hf_models[arch])
    assert mine.dtype == torch.bfloat16 and mine.config.tie_word_embeddings == theirs.config.tie_word_embeddings
    ids = torch.tensor([[5, 17, 40, 3, 99]])
    assert torch.equal(mine(input_ids=ids).logits, theirs(input_ids=ids).logits)
    tok_mine, tok_theirs = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(hf_models[arch])
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    assert tok_mine.apply_chat_template(chat, add_generation_prompt=True) == tok_theirs.apply_chat_template(
        chat, add_generation_prompt=True
    )


def test_an_actor_built_from_the_bucket_samples_what_transformers_generates(
    hf_models: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    run, policy, spec = _publish_v0(hf_models["qwen3"], tmp_path, system_prompt="You are a careful solver.")
    files = assemble.run_files(run, run.latest())
    got = assemble.run_spec(run, files)
    assert got == spec and got.chat_template and got.eos_ids == (policy.tokenizer.eos_ids)
    tok = assemble.tokenizer(got, files)
    text = "Ava has 3 apples and finds 4 more. How many apples does Ava have now?"
    ids = tok.prompt_ids(text)
    assert ids == policy.tokenizer.prompt_ids(text) and "You are a careful solver." in tok.tok.decode(ids)  # type: ignore[attr-defined]
    engine = assemble.engine(run, got, files, EngineConfig(), "a0")
    Updater(run, region="home", live=engine.live).bootstrap()
    (sampled,) = engine.generate([ids], samples=1, max_new_tokens=12, temperature=0, seed=0)[0:1]
    out = tmp_path / "replayed"
    replay(run, 0, str(out))
    hf = AutoModelForCausalLM.from_pretrained(out)
    greedy = hf.generate(
        torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=list(got.eos_ids), pad_token_id=tok.pad_id
    )[0, len(ids) :].tolist()
    assert list(sampled[0].token_ids) == greedy, "the same tokens, the same stop"
    assert len(set(greedy)) > 1, "a real continuation, not one repeated token"


def test_a_restarted_trainer_must_keep_the_runs_settings(hf_models: dict[str, Path], tmp_path: Path) -> None:
    run, policy, spec = _publish_v0(hf_models["qwen3"], tmp_path)
    other = run_spec(
        TrainerConfig(
            store="memory://x",
            redis="r",
            run_id="hf",
            model=ModelConfig(model=str(hf_models["qwen3"])),
            sampling=SamplingConfig(group=4, max_new_tokens=8),
        ),
        policy,
    )
    check_resume(run, spec, spec)
    with pytest.raises(RunSpecError, match="sampling.group: 2 -> 4"):
        check_resume(run, spec, other)


def test_models_that_cannot_load_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="cannot load a causal LM"):
        new_policy(_cfg(tmp_path / "empty"))
    with pytest.raises(ModelError, match="cannot load a causal LM"):
        new_policy(_cfg(tmp_path / "missing"))


def test_a_tied_config_over_two_published_embeddings_is_refused_before_an_engine_is_built(
    hf_models: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 34: a run whose config ties the embeddings but publishes ``lm_head`` and ``embed_tokens`` as
    two tensors that differ reached the actor as two tensors on one parameter and failed at decode."""
    from aurora_store.rl.errors import ModelError

    cfg = _cfg(hf_models["qwen3"])
    policy = new_policy(cfg)
    run = open_run(f"file://{tmp_path}/run")
    spec = run_spec(cfg, policy)
    record(run, policy, spec)
    state = {k: v.detach().to(torch.bfloat16).clone() for k, v in policy.model.state_dict().items()}
    state["lm_head.weight"] += 1  # the head diverged from the embedding it is tied to
    run.publish(state)
    files = assemble.run_files(run, 0)
    with pytest.raises(ModelError, match="ties the word embeddings"):
        assemble.engine(run, assemble.run_spec(run, files), files, EngineConfig(), "a0")
