"""The seeded word-problem data set ``aurora demo-real`` trains on: reproducible, read by the
trainer's ``gsm8k`` preset, every answer right for its question and scored by the ``math`` reward."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aurora_store.rl.data import read_records
from aurora_store.rl.rewards import math_reward
from trainer import word_problems


def solve(question: str) -> int:
    """The answer, worked out from the question's own words (independently of the generator)."""
    n = [int(x) for x in re.findall(r"\d+", question)]
    if "gave away" in question:
        return n[0] - n[1]
    if "in each" in question:
        return n[0] * n[1]
    return n[0] + n[1]


def test_the_same_seed_writes_the_same_file_and_another_seed_another(tmp_path: Path) -> None:
    a = word_problems.write(tmp_path / "a.jsonl", 300, seed=4).read_bytes()
    assert word_problems.write(tmp_path / "b.jsonl", 300, seed=4).read_bytes() == a
    assert word_problems.write(tmp_path / "c.jsonl", 300, seed=5).read_bytes() != a


def test_every_answer_is_right_and_the_math_reward_checks_it(tmp_path: Path) -> None:
    path = word_problems.write(tmp_path / "p.jsonl", 400, seed=1)
    records = read_records(str(path), data_format="gsm8k")
    assert len(records) == 400
    kinds = {re.sub(r"\d+", "#", r.prompt.split("?")[0])[:12] for r in records}
    assert len(kinds) > 5, "the problems are of several kinds"
    for r in records[:60]:
        want = solve(r.prompt)
        assert r.answer == str(want) and 0 <= want <= 25
        assert math_reward(r.prompt, f"There are {want} in all.", r.answer) == 1.0
        assert math_reward(r.prompt, f"{want + 1}", r.answer) == 0.0
    assert all(r.answer == str(solve(r.prompt)) for r in records)


def test_a_data_set_needs_a_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one"):
        word_problems.write(tmp_path / "none.jsonl", 0)
