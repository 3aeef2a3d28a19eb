"""The run spec (``aurora_run.json``): the published artefact it names, and a schema that grows
without breaking readers (unknown optional fields ignored, unknown required ones refused)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import aurora_store
from actor import assemble
from aurora_store.rl.runspec import (
    FIRST,
    FORMAT,
    LORA_FORMAT,
    NAME,
    QUANTIZED_FORMAT,
    Artefact,
    LoraSpec,
    RunSpec,
    RunSpecError,
)
from aurora_store.rl.sampling import SamplingConfig

SPEC = RunSpec(
    tokenizer="aurora-char",
    chat_template=False,
    system_prompt=None,
    sampling=SamplingConfig(group=4, max_new_tokens=8),
    reward="task:arith",
    reward_timeout_s=5.0,
    eos_ids=(2,),
)


def _doc(**changes: Any) -> dict[str, Any]:
    doc = json.loads(SPEC.to_bytes())
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not _DROP}


_DROP = object()


def _read(doc: dict[str, Any]) -> RunSpec:
    return RunSpec.from_bytes(json.dumps(doc).encode())


def test_the_artefact_is_recorded_and_read_back() -> None:
    doc = json.loads(SPEC.to_bytes())
    assert doc["format"] == FORMAT and doc["artefact"] == {"kind": "weights", "dtype": "bfloat16"}
    assert RunSpec.from_bytes(SPEC.to_bytes()) == SPEC
    assert SPEC.artefact == Artefact(kind="weights", dtype="bfloat16")


def test_a_first_schema_document_is_bf16_weights() -> None:
    """A run an earlier trainer started (``aurora-run/1``, a closed set of fields) stays readable."""
    v1 = _doc(format=FIRST, artefact=_DROP, required=_DROP)
    assert _read(v1) == SPEC
    with pytest.raises(RunSpecError, match="not an aurora-run/1 document"):
        _read({**v1, "extra": 1})  # the first schema was closed


def test_an_unknown_optional_field_is_read_by_todays_actor(tmp_path: Path) -> None:
    """A newer trainer's field this actor does not know, unrequired: the actor reads the run as before."""
    doc = _doc(adapter_rank=16, artefact={"kind": "weights", "dtype": "bfloat16", "scales": "none"})
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    run.files.put(NAME, json.dumps(doc).encode())
    run.publish({"w": torch.zeros(4, dtype=torch.bfloat16)})
    spec = assemble.run_spec(run, assemble.run_files(run, 0))
    assert spec == SPEC


def test_an_unknown_required_field_is_refused() -> None:
    with pytest.raises(RunSpecError, match="requires 'adapter_rank', which this release does not understand"):
        _read(_doc(adapter_rank=16, required=["adapter_rank"]))
    assert _read(_doc(required=["artefact", "sampling"])) == SPEC  # known fields may be required


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        (_doc(artefact={"kind": "weights", "dtype": "float8_e4m3fn"}), "dtype 'float8_e4m3fn'"),
        (_doc(artefact={"kind": "lora", "dtype": "bfloat16"}), "a LoRA artefact is an aurora-run/3 document"),
        (_doc(format="aurora-run/3", artefact={"kind": "lora", "dtype": "bfloat16"}), "artefact.lora must hold"),
        (_doc(artefact={"dtype": "bfloat16"}), "artefact must name its kind and dtype"),
        (_doc(artefact=["weights"]), "artefact must name its kind and dtype"),
        (_doc(required="artefact"), "required must list"),
        (_doc(required=[1]), "required must list"),
        (_doc(required=["x"] * 65), "required must list"),
        (_doc(artefact=_DROP), "must have field 'artefact'"),
        (_doc(format="aurora-run/5"), "not an aurora-run/2"),
        (_doc(artefact={"kind": "quantized", "dtype": "bfloat16"}), "a quantized artefact is an aurora-run/4"),
        (_doc(format="aurora-run/4", artefact={"kind": "quantized", "dtype": "bfloat16"}), "must name its scheme"),
        (
            _doc(format="aurora-run/4", artefact={"kind": "quantized", "dtype": "bfloat16", "scheme": 8}),
            "must name its scheme",
        ),
        (
            _doc(format="aurora-run/4", artefact={"kind": "quantized", "dtype": "bfloat16", "scheme": "fp4-e2m1"}),
            "artefact scheme 'fp4-e2m1': this release publishes and reads",
        ),
        (
            _doc(
                format="aurora-run/4", artefact={"kind": "quantized", "dtype": "float16", "scheme": "int8-w8a8-channel"}
            ),
            "dtype 'float16'",
        ),
        (_doc(eos_ids=_DROP), "must have field 'eos_ids'"),
    ],
)
def test_hostile_documents_are_clear_errors(doc: dict[str, Any], match: str) -> None:
    with pytest.raises(RunSpecError, match=match):
        _read(doc)


def test_the_trainer_records_its_publish_dtype() -> None:
    from trainer.config import PublishConfig
    from trainer.publication import FullWeights, artefact_for

    spec = Artefact(kind="weights", dtype=PublishConfig().dtype)
    made = artefact_for(spec)
    assert isinstance(made, FullWeights) and made.dtype == torch.bfloat16
    model = torch.nn.Linear(3, 2)
    model.register_buffer("count", torch.zeros(5, dtype=torch.int64))
    assert made.full_bytes(model) == (3 * 2 + 2) * 2 + 5 * 8
    share = made.state_for_publish(model, group=None, keep_device=False)
    assert {s.name: s.dtype for s in share.specs} == {"bias": "BF16", "count": "I64", "weight": "BF16"}


LORA = LoraSpec(
    rank=16,
    alpha=32.0,
    targets=("q_proj", "v_proj"),
    base_digest="0123456789abcdef" * 2,
    base_files=("lora-base-00001-of-00002.safetensors", "lora-base-00002-of-00002.safetensors"),
)


def _lora_doc(**lora: Any) -> dict[str, Any]:
    doc = json.loads(dataclasses.replace(SPEC, artefact=Artefact(kind="lora", lora=LORA)).to_bytes())
    doc["artefact"]["lora"].update(lora)
    doc["artefact"]["lora"] = {k: v for k, v in doc["artefact"]["lora"].items() if v is not _DROP}
    return doc


def test_a_lora_run_is_an_aurora_run_3_document_and_a_weights_run_stays_2() -> None:
    """Issue 36: a LoRA artefact bumps the schema; a run of full weights is written as before, so the
    actors of the release before keep reading it."""
    spec = dataclasses.replace(SPEC, artefact=Artefact(kind="lora", lora=LORA))
    doc = json.loads(spec.to_bytes())
    assert doc["format"] == LORA_FORMAT and doc["artefact"]["lora"]["targets"] == ["q_proj", "v_proj"]
    assert RunSpec.from_bytes(spec.to_bytes()) == spec
    assert json.loads(SPEC.to_bytes())["format"] == FORMAT
    assert spec.differences(SPEC) and "artefact" in spec.differences(SPEC)[0]


@pytest.mark.parametrize("scheme", ["fp8-e4m3-block128", "int8-w8a8-channel"])
def test_a_quantized_run_is_an_aurora_run_4_document(scheme: str) -> None:
    """Issue 37: a quantized artefact bumps the schema, so an actor of a release before refuses the run
    (it reads aurora-run/1 to /3 only) rather than serve its words as BF16 weights; a weights artefact
    ignores a scheme it does not need."""
    spec = dataclasses.replace(SPEC, artefact=Artefact(kind="quantized", scheme=scheme))
    doc = json.loads(spec.to_bytes())
    assert doc["format"] == QUANTIZED_FORMAT
    assert doc["artefact"] == {"kind": "quantized", "dtype": "bfloat16", "scheme": scheme}
    assert RunSpec.from_bytes(spec.to_bytes()) == spec
    assert any(d.startswith("artefact:") for d in spec.differences(SPEC))
    with pytest.raises(RunSpecError, match="kind 'quantized' and its scheme go together"):
        Artefact(kind="weights", scheme=scheme)
    doc = json.loads(SPEC.to_bytes())
    doc["artefact"]["scheme"] = scheme
    assert _read(doc).artefact == Artefact()


@given(
    rank=st.integers(1, 4096),
    alpha=st.floats(min_value=1e-6, max_value=1e6, allow_nan=False),
    targets=st.lists(st.from_regex(r"[a-z_][a-z0-9_.]{0,20}", fullmatch=True), min_size=1, max_size=8, unique=True),
    digest=st.from_regex(r"[0-9a-f]{32}", fullmatch=True),
    files=st.integers(1, 40),
)
def test_lora_specs_round_trip(rank: int, alpha: float, targets: list[str], digest: str, files: int) -> None:
    from aurora_store.format.keys import lora_base_file

    lora = LoraSpec(
        rank=rank,
        alpha=alpha,
        targets=tuple(targets),
        base_digest=digest,
        base_files=tuple(lora_base_file(i, files) for i in range(files)),
    )
    spec = dataclasses.replace(SPEC, artefact=Artefact(kind="lora", lora=lora))
    assert RunSpec.from_bytes(spec.to_bytes()) == spec


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        (_lora_doc(rank=0), "rank must be an integer in"),
        (_lora_doc(rank=True), "rank must be an integer in"),
        (_lora_doc(rank=1 << 70), "rank must be an integer in"),
        (_lora_doc(alpha=0), r"alpha must be a number in \(0, 1e6\]"),
        (_lora_doc(alpha="2"), "alpha must be a number"),
        (_lora_doc(targets=[]), "targets must name 1 to 64"),
        (_lora_doc(targets=["q_proj", "q_proj"]), "distinct"),
        (_lora_doc(targets=["q_proj; rm -rf /"]), "is not a module name"),
        (_lora_doc(targets=[3]), "is not a module name"),
        (_lora_doc(targets="q_proj"), "must be arrays"),
        (_lora_doc(base_digest="ABC"), "base_digest must be 32 lowercase hex"),
        (_lora_doc(base_files=[]), "base_files must list 1 to"),
        (_lora_doc(base_files=["../../etc/passwd"]), "base_files must be 'lora-base-00001-of-00001.safetensors'"),
        (
            _lora_doc(base_files=["lora-base-00002-of-00002.safetensors", "lora-base-00001-of-00002.safetensors"]),
            "in order",
        ),
        (_lora_doc(base_files=["x"] * 10_001), "must be arrays"),
        (_lora_doc(extra=1), "artefact.lora must hold exactly"),
        (_lora_doc(rank=_DROP), "artefact.lora must hold exactly"),
        ({**_lora_doc(), "artefact": {"kind": "weights", "dtype": "bfloat16", "lora": LORA.to_dict()}}, None),
    ],
)
def test_hostile_lora_tables_are_clear_errors(doc: dict[str, Any], match: str | None) -> None:
    if match is None:  # a weights artefact ignores a lora table it does not need (an unknown field, unrequired)
        assert _read(doc).artefact == Artefact()
        return
    with pytest.raises(RunSpecError, match=match):
        _read(doc)
