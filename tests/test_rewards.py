"""Rewards: final-answer extraction, math-verify, exact, regex, task and user functions, and the
actor's reward process surviving rewards that raise, hang, lie or die."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from actor.rewards import RewardPool
from aurora_store.rl.errors import TaskError
from aurora_store.rl.rewards import final_answer, load_reward
from aurora_store.rl.tasks import load_task
from aurora_store.testing.processes import deadline, wait_for


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("so the answer is \\boxed{72}. Then 5", "72"),
        ("first \\boxed{1} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("work...\n#### 1,250\nthanks", "1,250"),
        ("she has 3 left, and 12 in all", "12"),
        ("-7.5 degrees", "-7.5"),
        ("nothing numeric", None),
    ],
)
def test_the_final_answer_of_a_completion(completion: str, answer: str | None) -> None:
    assert final_answer(completion) == answer


@pytest.mark.parametrize(
    ("completion", "gold", "reward"),
    [
        ("\\boxed{72}", "72", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("the total is 18 dollars", "18", 1.0),
        ("it is 3/4", "0.75", 1.0),
        ("\\boxed{\\frac{1}{2}}", "\\frac12", 1.0),
        ("\\boxed{73}", "72", 0.0),
        ("no idea", "5", 0.0),
    ],
)
def test_math_reward_compares_final_answers(completion: str, gold: str, reward: float) -> None:
    assert load_reward("math")("q", completion, gold) == reward


def test_exact_regex_task_and_user_rewards() -> None:
    assert load_reward("exact")("q", " 42\n", "42") == 1.0 and load_reward("exact")("q", "420", "42") == 0.0
    rx = load_reward(r"regex:answer: (\d+)")
    assert rx("q", "answer: 3, no, answer: 42", "42") == 1.0 and rx("q", "answer: 3", "42") == 0.0
    assert rx("q", "nothing", "42") == 0.0
    assert load_reward("task:arith")("3+4=", "7", "7") == 1.0
    assert load_reward("tests.reward_fns:length_over_ten")("q", "abcde", "") == 0.5


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "nope",
        "regex:(",
        "task:nope",
        "no.such.module:f",
        "tests.reward_fns:missing",
        "tests.reward_fns:NOT_CALLABLE",
    ],
)
def test_bad_reward_specs(spec: str) -> None:
    with pytest.raises(TaskError):
        load_reward(spec)


def test_a_users_module_that_fails_on_import_is_a_task_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('the user module is broken')\n")
    (tmp_path / "bad_syntax_tasks.py").write_text("def factory(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TaskError, match="reward 'broken_rewards:f': cannot import it: the user module is broken"):
        load_reward("broken_rewards:f")
    with pytest.raises(TaskError, match="task 'bad_syntax_tasks:factory': cannot import it"):
        load_task("bad_syntax_tasks:factory")


def test_the_reward_process_scores_and_survives_every_failure() -> None:
    with RewardPool("tests.reward_fns:length_over_ten", timeout_s=5) as pool:
        assert pool.score("q", "abcdefghij", "") == (1.0, None)
    for spec, kind in (
        ("tests.reward_fns:raises", "error"),
        ("tests.reward_fns:nan", "invalid"),
        ("tests.reward_fns:text", "invalid"),
        ("tests.reward_fns:dies", "crashed"),
    ):
        with RewardPool(spec, timeout_s=5) as pool:
            assert pool.score("q", "a completion", "") == (0.0, kind), spec
            assert pool.score("q", "another", "") == (0.0, kind), "the pool goes on after a failure"
            assert pool.failures == {kind: 2}


def test_a_hanging_reward_is_cut_off_at_its_time_limit() -> None:
    with RewardPool("tests.reward_fns:hangs", timeout_s=0.5) as pool:
        t0 = time.monotonic()
        assert pool.score("q", "slow", "") == (0.0, "timeout")
        assert time.monotonic() - t0 < deadline(30), "cut off, not left hanging"
        assert pool.score("q", "0", "") == (0.0, None), "a fresh process serves the next call"
        assert pool.failures == {"timeout": 1}


def test_a_reward_that_cannot_load_is_refused_at_start() -> None:
    with pytest.raises(TaskError, match="cannot import"):
        RewardPool("no.such.module:f", timeout_s=1)


def _kill_reward_process(pool: RewardPool) -> None:
    """SIGTERM the pool's child, as a SIGTERM to the actor's process group does, and wait until it is gone."""
    pid = pool.pid
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: _gone(pid), f"reward process {pid} to end", 10)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_reward_process_killed_from_outside_is_no_score_the_call_is_retried() -> None:
    """Hole (issue 22): the reward child killed from outside (the OOM killer, a signal to the process
    group) scored its in-flight completion 0 as if the completion had earned it."""
    with RewardPool("tests.reward_fns:length_over_ten", timeout_s=5) as pool:
        _kill_reward_process(pool)
        assert pool.score("q", "abcdefghi", "") == (0.9, None), "tried again in a fresh process: the real score"
        assert pool.failures == {}
    with RewardPool("tests.reward_fns:dies", timeout_s=5) as pool:  # a completion that kills every process
        assert pool.score("q", "fatal", "") == (0.0, "crashed")
        assert pool.failures == {"crashed": 1}


def test_a_reward_process_killed_while_the_actor_stops_leaves_the_group_unscored() -> None:
    stop = threading.Event()
    with RewardPool("tests.reward_fns:length_over_ten", timeout_s=5, stop=stop) as pool:
        assert pool.score_group("q", ["abcde", "abcdefghijkl"], "") == ([0.5, 1.0], {})
        _kill_reward_process(pool)
        stop.set()  # what the actor's SIGTERM handler does
        assert pool.score_group("q", ["abcde", "abcdefghijkl"], "") is None, "never a group of zeros"
        assert pool.pid is None, "no fresh process is started for an actor that is stopping"
