"""Data sets: JSONL, Parquet and CSV through pyarrow, the presets' gold answers, every bad row a
clear error naming its file and row, and the prompt order a resumed run continues exactly."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aurora_store.rl.data import DataError, PromptPool, Record, last_boxed, read_records

DATA = Path(__file__).parent / "data"
GSM8K = DATA / "gsm8k_tiny.jsonl"


def _jsonl(path: Path, rows: list[dict]) -> Path:  # type: ignore[type-arg]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_preset_reads_question_and_the_answer_after_hashes() -> None:
    records = read_records(str(GSM8K), data_format="gsm8k")
    assert len(records) == 50
    first = json.loads(GSM8K.read_text().splitlines()[0])
    assert records[0].prompt == first["question"] and first["answer"].endswith(f"#### {records[0].answer}")
    assert all(r.answer.lstrip("-").isdigit() for r in records)


def test_math_and_deepscaler_presets(tmp_path: Path) -> None:
    math = _jsonl(tmp_path / "m.jsonl", [{"problem": "p", "solution": "so \\boxed{\\frac{1}{2}} and \\boxed{3}"}])
    assert read_records(str(math), data_format="math")[0].answer == "3"
    ds = _jsonl(tmp_path / "d.jsonl", [{"problem": "p", "answer": "17"}, {"problem": "q", "answer": "x^2"}])
    assert [r.answer for r in read_records(str(ds), data_format="deepscaler")] == ["17", "x^2"]
    numbers = _jsonl(tmp_path / "n.jsonl", [{"problem": "p", "answer": 17}, {"problem": "q", "answer": 2.5}])
    assert [r.answer for r in read_records(str(numbers), data_format="deepscaler")] == ["17", "2.5"]
    mixed = _jsonl(tmp_path / "x.jsonl", [{"problem": "p", "answer": 17}, {"problem": "q", "answer": "x^2"}])
    with pytest.raises(DataError, match="x.jsonl: cannot read it as json.*in row 1"):
        read_records(str(mixed), data_format="deepscaler")
    assert last_boxed("\\boxed{a{b}c}") == "a{b}c" and last_boxed("\\boxed{open") is None


def test_parquet_csv_and_directories(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "set"
    (d / "sub").mkdir(parents=True)
    pq.write_table(pa.table({"q": ["one?", "two?"], "a": ["1", "2"]}), d / "a.parquet")
    (d / "sub" / "b.csv").write_text('q,a\n"three, with a comma?",3\n')
    _jsonl(d / "c.jsonl", [{"q": "four?", "a": "4"}])
    (d / "notes.txt").write_text("not data")
    records = read_records(str(d), prompt_field="q", answer_field="a")
    assert [(Path(r.file).name, r.row, r.prompt, r.answer) for r in records] == [
        ("a.parquet", 0, "one?", "1"),
        ("a.parquet", 1, "two?", "2"),
        ("c.jsonl", 0, "four?", "4"),
        ("b.csv", 0, "three, with a comma?", "3"),
    ]


@pytest.mark.parametrize(
    ("content", "args", "match"),
    [
        (b'{"question": "a?", "answer": "#### 1"}\n{"question": "", "answer": "#### 2"}\n', {}, "row 1: empty prompt"),
        (
            b'{"question": "a?", "answer": "#### 1"}\n{"question": "b?", "answer": "two"}\n',
            {},
            "row 1: column 'answer' has no gold",
        ),
        (
            b'{"question": "a?", "answer": "#### 1"}\n{"question": "b\xff?", "answer": "#### 2"}\n',
            {},
            "row 1: column 'question' is not valid UTF-8",
        ),
        (b'{"question": "a?", "answer": "#### 1"}\n{"question": oops}\n', {}, "cannot read it as json.*row 1"),
        (b'{"question": "a?", "answer": "#### 1"}\n', {"prompt_field": "problem"}, "no column 'problem'"),
        (b'{"question": 5, "answer": "#### 1"}\n', {}, "column 'question' holds int64, expected text"),
        (b'{"question": "a?", "answer": null}\n', {}, "row 0: no answer"),
        (b"", {}, "cannot read it as json|no column|no rows"),
    ],
)
def test_bad_data_names_the_file_and_row(tmp_path: Path, content: bytes, args: dict, match: str) -> None:  # type: ignore[type-arg]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError, match=match) as err:
        read_records(str(path), data_format="gsm8k", **args)
    assert str(path) in str(err.value)


def test_bad_paths_and_formats(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        read_records(str(tmp_path / "nope.jsonl"), data_format="gsm8k")
    (tmp_path / "x.txt").write_text("a")
    with pytest.raises(DataError, match="unknown data file type"):
        read_records(str(tmp_path / "x.txt"), data_format="gsm8k")
    with pytest.raises(DataError, match="no data files"):
        read_records(str(tmp_path), data_format="gsm8k")
    with pytest.raises(DataError, match="data format 'squad'"):
        read_records(str(GSM8K), data_format="squad")
    with pytest.raises(DataError, match="name the prompt and answer columns"):
        read_records(str(GSM8K))
    (tmp_path / "bad.csv").write_text('q,a\n"x",1\n"y"\n')
    with pytest.raises(DataError, match="bad.csv: cannot read it as csv.*Row #3"):
        read_records(str(tmp_path / "bad.csv"), prompt_field="q", answer_field="a")


def _records(n: int) -> list[Record]:
    return [Record("f", i, f"prompt {i} " + "x" * (i % 7), str(i)) for i in range(n)]


def test_long_prompts_are_dropped_once_and_counted() -> None:
    pool = PromptPool(_records(20), lambda text: list(range(len(text))), max_prompt_tokens=12, seed=0)
    assert pool.skipped == sum(1 for r in _records(20) if len(r.prompt) > 12)
    assert all(len(p.ids) <= 12 for p in pool.prompts)
    with pytest.raises(DataError, match="longer than 3 tokens"):
        PromptPool(_records(5), lambda text: list(range(len(text))), max_prompt_tokens=3, seed=0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(1, 12), st.integers(1, 25), st.integers(0, 3))
def test_steps_cover_each_epoch_exactly_once(prompts: int, per_step: int, steps: int, seed: int) -> None:
    pool = PromptPool(_records(prompts), lambda text: [1, 2], max_prompt_tokens=4, seed=seed)
    taken = [p for step in range(1, steps + 1) for p in pool.for_step(step, per_step)]
    per_epoch = Counter(p.id.rsplit("e", 1)[1] for p in taken)
    full_epochs = (steps * per_step) // prompts
    for epoch in range(full_epochs):
        ids = [p.id for p in taken if p.id.endswith(f"e{epoch}")]
        assert per_epoch[str(epoch)] == prompts and len(set(ids)) == prompts, "every prompt once per epoch"
    again = PromptPool(_records(prompts), lambda text: [1, 2], max_prompt_tokens=4, seed=seed)
    resumed = [p for step in range(1, steps + 1) for p in again.for_step(step, per_step)]
    assert resumed == taken, "a restarted trainer draws the same prompts for the same steps"
    pos = pool.position(steps, per_step)
    assert (pos["epoch"], pos["index"]) == divmod(steps * per_step, prompts) and pos["fingerprint"] == pool.fingerprint


def test_the_order_depends_on_the_seed_and_the_fingerprint_on_the_data() -> None:
    a = PromptPool(_records(30), lambda t: [1], max_prompt_tokens=4, seed=1)
    b = PromptPool(_records(30), lambda t: [1], max_prompt_tokens=4, seed=2)
    assert [p.id for p in a.for_step(1, 30)] != [p.id for p in b.for_step(1, 30)]
    assert a.fingerprint == b.fingerprint
    c = PromptPool(_records(31), lambda t: [1], max_prompt_tokens=4, seed=1)
    assert c.fingerprint != a.fingerprint
