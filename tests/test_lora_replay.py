"""Replaying a LoRA run (issue 36): a PEFT adapter directory that ``PeftModel.from_pretrained`` loads
over the base replayed beside it, and ``--merge``, one HF directory transformers loads; both compute
what the trainer's adapter does, and bad requests are clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import aurora_store
from aurora_store.cli import main
from aurora_store.rl.adapters import adapter_state
from tests.lora_runs import IDS, lora_run


def _lora_run(tmp_path: Path) -> tuple[Any, torch.nn.Module]:
    """A LoRA run of three versions whose adapter has moved away from its initialisation."""
    return lora_run(f"file://{tmp_path}/run")


def _rounded(policy: torch.nn.Module) -> torch.Tensor:
    """The trainer's logits with its adapter rounded to BF16, as version 2 holds it."""
    import peft

    state = {k: v.to(torch.bfloat16).float() for k, v in adapter_state(policy).items()}
    peft.set_peft_model_state_dict(policy, state)
    with torch.no_grad():
        return policy(input_ids=IDS).logits


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # PEFT asks transformers
def test_a_lora_version_replays_as_a_peft_adapter_over_its_base_and_merged(tmp_path: Path) -> None:
    import peft
    from transformers import AutoModelForCausalLM

    run, policy = _lora_run(tmp_path)
    want = _rounded(policy)
    out = tmp_path / "v2"
    assert main(["replay", run.uri, "--version", "2", "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["adapter_config.json", "adapter_model.safetensors", "aurora_replay.json", "base"]
    assert not any(n.startswith("lora-base-") for n in os.listdir(out / "base")), "the base files became weights"
    record = json.loads((out / "aurora_replay.json").read_text())
    assert record["lora"]["layout"] == "peft" and record["version"] == 2
    base = AutoModelForCausalLM.from_pretrained(out / "base", torch_dtype=torch.float32)
    loaded = peft.PeftModel.from_pretrained(base, out)
    with torch.no_grad():
        got = loaded(input_ids=IDS).logits
    assert torch.equal(got, want), "the same bits compute the same logits"

    merged_dir = tmp_path / "v2-merged"
    assert main(["replay", run.uri, "--version", "2", "--out", str(merged_dir), "--merge"]) == 0
    assert json.loads((merged_dir / "aurora_replay.json").read_text())["lora"]["layout"] == "merged"
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        m = merged(input_ids=IDS).logits
    base_only = AutoModelForCausalLM.from_pretrained(out / "base", torch_dtype=torch.float32)
    with torch.no_grad():
        b = base_only(input_ids=IDS).logits
    moved = (want - b).abs().max()
    assert moved > 1e-3, "the adapter changes what the model computes"
    assert (m - want).abs().max() < moved / 4, "merged: the adapter's effect, up to BF16 rounding of the merge"


def test_bad_replays_of_lora_and_full_runs_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = _lora_run(tmp_path)
    out = tmp_path / "v1"
    assert main(["replay", run.uri, "--version", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["replay", run.uri, "--version", "2", "--out", str(out), "--force"]) == 1
    assert "--force replaces full-weight replays only" in capsys.readouterr().err
    assert json.loads((out / "aurora_replay.json").read_text())["version"] == 1, "nothing replaced"
    full = aurora_store.open_run(f"file://{tmp_path}/full")
    full.publish({"w": torch.zeros(4, dtype=torch.bfloat16)})
    assert main(["replay", full.uri, "--out", str(tmp_path / "f"), "--merge"]) == 1
    assert "--merge is for a LoRA run" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()
