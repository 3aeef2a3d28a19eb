"""Runs of quantized weights (issue 37), everywhere but vLLM (tests/test_vllm_quant.py): what the trainer
publishes, the torch actor serving it, replay as a quantized checkpoint or as BF16, and the refusals."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import aurora_store
from actor import assemble
from actor.config import EngineConfig
from actor.engines.dequantized import dequantized
from actor.updater import Updater
from aurora_store.bucket.replay import dequantized as replay_dequantized
from aurora_store.cli import main
from aurora_store.errors import StoreError
from aurora_store.format import dtypes
from aurora_store.format.manifest import TensorSpec
from aurora_store.format.weights import WeightState
from aurora_store.quant import schemes
from aurora_store.rl.models import build_model, tiny_config
from aurora_store.rl.runspec import RunSpecError
from aurora_store.rl.tokenizers import CharTokenizer
from aurora_store.tensors import to_words
from tests.quant_runs import IDS, SCHEMES, VOCAB, quantized_run, spec_of
from trainer.config import ModelConfig, PublishConfig, TrainerConfig
from trainer.policy import Policy, adapt
from trainer.publication import QuantizedWeights, artefact_for

PROJ = "model.layers.1.mlp.down_proj.weight"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_trainer_publishes_its_schemes_words_of_the_masters_and_bf16_for_the_rest(scheme: str) -> None:
    model = build_model(tiny_config(VOCAB), seed=2)
    made = artefact_for(spec_of(scheme).artefact)
    assert isinstance(made, QuantizedWeights)
    share = made.state_for_publish(model, group=None, keep_device=False)
    specs = {s.name: s for s in share.specs}
    params = dict(model.named_parameters())
    targets = schemes.quantized_names(params)
    assert len(targets) == 7 * 2, "every projection of both layers"
    for name, p in params.items():
        if name not in targets:
            assert specs[name].dtype == "BF16"
            assert np.array_equal(share.words[name], dtypes.bf16_words(p.detach().numpy()).reshape(-1))
            continue
        q = schemes.quantize(scheme, p.detach().numpy())
        scale = schemes.scale_of(name, q.scale_name)
        assert (specs[name].dtype, specs[scale].dtype, specs[scale].shape) == (q.dtype, "F32", q.scale.shape)
        assert np.array_equal(share.words[name], q.words.reshape(-1))
        assert np.array_equal(share.words[scale].view(np.float32), q.scale.reshape(-1))
    assert made.full_bytes(model) == sum(w.nbytes for w in share.words.values())


@settings(max_examples=40, deadline=None)
@given(
    scheme=st.sampled_from(SCHEMES),
    rows=st.integers(1, 300),
    cols=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
    spread=st.floats(1e-6, 1e3),
)
def test_the_engines_dequantization_is_the_schemes_bit_for_bit(
    scheme: str, rows: int, cols: int, seed: int, spread: float
) -> None:
    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * spread).astype(np.float32)
    q = schemes.quantize(scheme, w)
    words = torch.from_numpy(q.words).view(torch.float8_e4m3fn if q.dtype == "F8_E4M3" else torch.int8)
    got = dequantized(words, torch.from_numpy(q.scale)).numpy()
    assert np.array_equal(got.view(np.uint32), schemes.dequantize(q).view(np.uint32))


def _engine(run: Any) -> Any:
    files = assemble.run_files(run, run.latest())
    spec = assemble.run_spec(run, files)
    return assemble.engine(run, spec, files, EngineConfig(engine="torch"), "q1")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_torch_actor_follows_a_quantized_chain_and_computes_as_its_dequantized_replay(
    tmp_path: Path, scheme: str
) -> None:
    from transformers import AutoModelForCausalLM

    run, _ = quantized_run(f"file://{tmp_path}/run", scheme, 6, lr=3e-3, fulls=(4,), words_only=(2,))
    eng = _engine(run)
    assert eng.live.tensors[PROJ].dtype == (torch.float8_e4m3fn if scheme.startswith("fp8") else torch.int8)
    up = Updater(run, region="home", live=eng.live)
    up.bootstrap(0)
    logits = []
    for target in range(1, 6):  # deltas, one moving words and no scale (2), and a full version on the route
        up.stage(target)
        assert up.apply() is not None and up.applied is not None and up.applied.version == target
        assert up.live_digest() == run.manifest(target).weights_digest, "the words and scales as published"
        out = tmp_path / f"v{target}"
        assert main(["replay", run.uri, "--version", str(target), "--out", str(out), "--dequantize"]) == 0
        fresh = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            mine = eng.model(input_ids=IDS).logits
            assert torch.equal(mine, fresh(input_ids=IDS).logits), f"version {target}: what its replay computes"
        logits.append(mine)
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(logits)), "every version computes apart"


def test_replay_writes_the_quantized_checkpoint_or_bf16(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file

    run, _ = quantized_run(f"file://{tmp_path}/run", "int8-w8a8-channel", 3)
    state = run.materialize_words(2)
    out, deq = tmp_path / "q", tmp_path / "d"
    assert main(["replay", run.uri, "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == schemes.hf_quantization_config("int8-w8a8-channel")
    assert config["quantization_config"]["format"] == "int-quantized"
    loaded = load_file(out / "model.safetensors")
    assert loaded[PROJ].dtype == torch.int8 and loaded[PROJ.replace("weight", "weight_scale")].dtype == torch.float32
    _, tensors = to_words(loaded)
    assert tensors.keys() == state.words.keys()
    assert all(np.array_equal(tensors[n], state.words[n]) for n in tensors), "words and scales as published"
    record = json.loads((out / "aurora_replay.json").read_text())
    assert record["quantization"] == {"scheme": "int8-w8a8-channel", "layout": "quantized"}
    assert main(["replay", run.uri, "--version", "1", "--out", str(out), "--force"]) == 0, "its config.json is ours"
    assert main(["replay", run.uri, "--out", str(deq), "--dequantize"]) == 0
    bf16 = to_words(load_file(deq / "model.safetensors"))[1]
    assert not any(n.endswith("weight_scale") for n in bf16) and "quantization_config" not in json.loads(
        (deq / "config.json").read_text()
    )
    spec = next(t for t in run.manifest(2).tensors if t.name == PROJ)
    q = schemes.Quantized(
        state.words[PROJ].reshape(spec.shape),
        state.words[PROJ.replace("weight", "weight_scale")].view(np.float32).reshape(-1, 1),
        "weight_scale",
        "I8",
    )
    assert np.array_equal(bf16[PROJ], dtypes.bf16_words(schemes.dequantize(q)).reshape(-1))
    # a BF16 run has nothing to dequantize; a config.json changed by hand is not replay's to replace
    bf = aurora_store.open_run(f"file://{tmp_path}/bf16")
    model = build_model(tiny_config(VOCAB), seed=1)
    from trainer.publication import ModelPublisher

    ModelPublisher(bf, model).publish(step=0, kind="full")
    capsys.readouterr()
    assert main(["replay", bf.uri, "--out", str(tmp_path / "x"), "--dequantize"]) != 0
    assert "--dequantize is for a run of quantized weights" in capsys.readouterr().err
    (out / "config.json").write_text("{}")
    assert main(["replay", run.uri, "--out", str(out), "--force"]) != 0
    assert "config.json" in capsys.readouterr().err


def test_a_scale_that_does_not_fit_its_words_is_a_clear_error() -> None:
    words = np.zeros(8 * 4, np.uint8)
    specs = (TensorSpec("m.q_proj.weight", "I8", (8, 4)), TensorSpec("m.q_proj.weight_scale", "F32", (4, 1)))
    state = WeightState(specs, {"m.q_proj.weight": words, "m.q_proj.weight_scale": np.zeros(4, np.uint32)})
    with pytest.raises(StoreError, match=r"m.q_proj.weight_scale: F32 \[4, 1\], expected F32 \[8, 1\]"):
        replay_dequantized(state, "int8-w8a8-channel")


def test_lora_with_a_quantized_artefact_and_unknown_schemes_are_refused(tmp_path: Path) -> None:
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    model = build_model(tiny_config(64), seed=3)
    cfg = TrainerConfig(
        store=run.uri,
        redis="redis://unused",
        run_id="r",
        model=ModelConfig(lora_rank=4),
        publish=PublishConfig(dtype="int8-w8a8-channel"),
    )
    with pytest.raises(RunSpecError, match="--lora-rank with --publish-dtype int8-w8a8-channel"):
        adapt(run, Policy(model, CharTokenizer(), {}, 64), cfg, write=True)
    assert run.files.names() == [], "nothing attached"
    with pytest.raises(aurora_store.errors.UnsupportedError, match="quantization scheme 'fp4'"):
        schemes.layout("fp4", (4, 4))


def test_versions_that_are_not_what_the_run_spec_says_are_refused_by_the_actor(tmp_path: Path) -> None:
    """A run whose aurora_run.json says INT8 but whose versions hold BF16 projections (a trainer that
    lied, or a spec swapped in by hand and re-signed): the torch actor's live weights are INT8 words and
    scales, so bootstrapping on such a version is a LayoutError naming what is missing, and nothing is
    written."""
    from aurora_store.errors import LayoutError
    from aurora_store.rl.models import model_files
    from aurora_store.rl.runspec import NAME
    from trainer.publication import ModelPublisher

    run = aurora_store.open_run(f"file://{tmp_path}/run")
    model = build_model(tiny_config(VOCAB), seed=5)
    for name, data in {**model_files(model), **CharTokenizer().files()}.items():
        run.files.put(name, data)
    run.files.put(NAME, spec_of("int8-w8a8-channel").to_bytes())
    ModelPublisher(run, model).publish(step=0, kind="full")  # BF16 weights under an INT8 run spec
    eng = _engine(run)
    before = {k: v.clone() for k, v in eng.live.tensors.items()}
    with pytest.raises(LayoutError, match="do not match the version's: missing .*weight_scale"):
        Updater(run, region="home", live=eng.live).bootstrap(0)
    assert all(torch.equal(before[k], v) for k, v in eng.live.tensors.items()), "nothing written"
