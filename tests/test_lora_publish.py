"""Publishing a LoRA run (issue 36): PEFT wraps a frozen base the run carries, and each version holds
the adapter's matrices only, bit-exact in the run's dtype, as full versions and deltas."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import aurora_store
from aurora_store.bucket.lora_base import load_base
from aurora_store.rl.adapters import adapter_state
from aurora_store.rl.errors import ModelError
from aurora_store.rl.models import build_model, tiny_config
from aurora_store.rl.runspec import Artefact
from aurora_store.rl.tokenizers import CharTokenizer
from aurora_store.tensors import host_words, word_views
from trainer.adapter import LoraSettings, attach, round_base, wrap
from trainer.config import ModelConfig, TrainerConfig
from trainer.policy import Policy, adapt
from trainer.publication import LoraAdapter, ModelPublisher, artefact_for

SETTINGS = LoraSettings(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))


def _bits(state: dict[str, torch.Tensor]) -> dict[str, bytes]:
    specs, views = word_views({k: v.detach().to(torch.bfloat16) for k, v in state.items()})
    return {s.name: host_words(views[s.name]).tobytes() for s in specs}


def test_a_lora_run_publishes_the_adapter_over_the_base_it_carries(tmp_path: Path) -> None:
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    model = build_model(tiny_config(64), seed=3)
    round_base(model, torch.bfloat16)
    base_bits = _bits(dict(model.state_dict()))
    lora = attach(run, model, SETTINGS, torch.bfloat16)
    policy = wrap(model, SETTINGS)
    artefact = artefact_for(Artefact(kind="lora", lora=lora))
    assert isinstance(artefact, LoraAdapter)
    publisher = ModelPublisher(run, policy, artefact=artefact)

    v0 = publisher.publish(step=0, kind="full")
    names = set(adapter_state(policy))
    assert names and all(".lora_A.weight" in n or ".lora_B.weight" in n for n in names)
    import peft

    assert _bits(adapter_state(policy)) == _bits(peft.get_peft_model_state_dict(policy)), "PEFT's saved names"
    assert set(run.materialize(0)) == names, "a version holds the adapter only"
    assert artefact.full_bytes(policy) == sum(t.numel() * 2 for t in adapter_state(policy).values())

    trainable = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    for step in (1, 2, 3):
        loss = policy(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        info = publisher.publish(step=step)  # Adam moves most of an adapter's elements: full or delta, as cheaper
        assert info.version == step
        assert _bits(run.materialize(step)) == _bits(adapter_state(policy)), "bit-exact in BF16"
    assert run.manifest(3).stats.elements == sum(t.numel() for t in adapter_state(policy).values())
    # the base never moved, and the run carries exactly it, under the digest the spec names
    frozen = {k.removeprefix("base_model.model."): v for k, v in policy.state_dict().items() if "lora_" not in k}
    assert _bits({k.replace(".base_layer", ""): v for k, v in frozen.items()}) == base_bits
    base = load_base(run, run.manifest(3), lora.base_files, lora.base_digest)
    assert {s.name: base.words[s.name].tobytes() for s in base.specs} == {
        k: v for k, v in base_bits.items() if k in {s.name for s in base.specs}
    }
    assert v0.version == 0


def test_unknown_targets_and_a_bad_rank_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    model = build_model(tiny_config(64), seed=3)
    with pytest.raises(ModelError, match=r"LoRA targets qkv_proj: no module .*its linear layers: .*q_proj"):
        wrap(model, LoraSettings(rank=4, alpha=8.0, targets=("qkv_proj",)))
    for target in ("lm_head", "embed_tokens"):  # PEFT would save the layer whole; vLLM serves neither
        with pytest.raises(ModelError, match=f"LoRA targets {target}: not a linear layer of the decoder"):
            wrap(model, LoraSettings(rank=4, alpha=8.0, targets=("q_proj", target)))
    cfg = TrainerConfig(
        store=run.uri,
        redis="redis://unused",
        run_id="r",
        model=ModelConfig(lora_rank=4, lora_targets=("v_proj", "lm_head")),
    )
    with pytest.raises(ModelError, match="LoRA targets lm_head"):  # the trainer's path: before the base is attached
        adapt(run, Policy(model, CharTokenizer(), {}, 64), cfg, write=True)
    with pytest.raises(ModelError, match="rank must be an integer in"):
        attach(run, model, LoraSettings(rank=0, alpha=8.0, targets=("q_proj",)), torch.bfloat16)
    with pytest.raises(ModelError, match="is not a module name"):
        attach(run, model, LoraSettings(rank=4, alpha=8.0, targets=("q_proj/../x",)), torch.bfloat16)
    assert run.files.names() == [], "nothing attached"
