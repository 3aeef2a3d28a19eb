"""The run spec (``aurora_run.json``): the published artefact it names, and a schema that grows
without breaking readers (unknown optional fields ignored, unknown required ones refused)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import aurora_store
from actor import assemble
from aurora_store.rl.runspec import FIRST, FORMAT, NAME, Artefact, RunSpec, RunSpecError
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
        (_doc(artefact={"kind": "lora", "dtype": "bfloat16"}), "kind 'lora'"),
        (_doc(artefact={"dtype": "bfloat16"}), "artefact must name its kind and dtype"),
        (_doc(artefact=["weights"]), "artefact must name its kind and dtype"),
        (_doc(required="artefact"), "required must list"),
        (_doc(required=[1]), "required must list"),
        (_doc(required=["x"] * 65), "required must list"),
        (_doc(artefact=_DROP), "must have field 'artefact'"),
        (_doc(format="aurora-run/3"), "not an aurora-run/2"),
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
