"""Verifiable rewards: ``f(prompt, completion, answer) -> float``, named by a spec.

- ``math``: HF's math-verify compares the completion's final answer (its last ``\\boxed{}``,
  else ``#### N``, else its last number) with the gold answer; 1.0 or 0.0;
- ``exact``: the completion, stripped, equals the answer;
- ``regex:PATTERN``: the last match of PATTERN in the completion (its first group if it has
  one) equals the answer;
- ``task:NAME``: a task's own reward (``arith``, ``reverse``, or ``package.module:factory``);
- ``package.module:function``: any function called as ``function(prompt, completion, answer)``.

A reward function is untrusted code as far as an actor is concerned: actors run it in a
process of their own under a time limit (``actor.rewards``), so one that raises or hangs
scores 0 and is counted, never kills an actor.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from aurora_store.rl.data import last_boxed
from aurora_store.rl.errors import TaskError
from aurora_store.rl.tasks import Prompt, import_object, load_task

Reward = Callable[[str, str, str], float]
"""``reward(prompt text, completion text, gold answer) -> float``."""

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def final_answer(completion: str) -> str | None:
    """The answer a completion ends on: its last ``\\boxed{}``, else what follows ``####``, else
    its last number; None if it has none."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    _, sep, tail = completion.rpartition("####")
    if sep and tail.strip():
        return tail.strip().split("\n", 1)[0].strip()
    numbers = _NUMBER.findall(completion)
    return numbers[-1].replace(",", "") if numbers else None


def math_reward(prompt: str, completion: str, answer: str) -> float:
    """1.0 if math-verify finds the completion's final answer equal to the gold one, else 0.0."""
    from math_verify import parse, verify

    found = final_answer(completion)
    if found is None:
        return 0.0
    # math-verify times itself out with signal.alarm, which only the main thread may use; elsewhere
    # the caller's own time limit (the actor's reward process) is the bound
    main = threading.current_thread() is threading.main_thread()
    limits: dict[str, object] = {} if main else {"parsing_timeout": None}
    gold = parse(_latex(answer), **limits)
    guess = parse(_latex(found), **limits)
    return 1.0 if gold and guess and verify(gold, guess, **({} if main else {"timeout_seconds": None})) else 0.0


def _latex(text: str) -> str:
    """As math-verify reads answers best: inside ``$...$`` unless already delimited."""
    return text if "$" in text or "\\(" in text else f"${text}$"


def exact_reward(prompt: str, completion: str, answer: str) -> float:
    return 1.0 if completion.strip() == answer.strip() else 0.0


def regex_reward(pattern: str) -> Reward:
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise TaskError(f"reward 'regex:{pattern}': not a regular expression: {exc}") from None

    def reward(prompt: str, completion: str, answer: str) -> float:
        matches = list(rx.finditer(completion))
        if not matches:
            return 0.0
        last = matches[-1]
        got = last.group(1) if rx.groups else last.group(0)
        return 1.0 if got is not None and got.strip() == answer.strip() else 0.0

    return reward


def task_reward(spec: str) -> Reward:
    task = load_task(spec)

    def reward(prompt: str, completion: str, answer: str) -> float:
        return float(task.reward(Prompt("", prompt, answer), completion))

    return reward


def load_reward(spec: str) -> Reward:
    """The reward function ``spec`` names (see the module docstring); TaskError if there is none."""
    if not isinstance(spec, str) or not spec:
        raise TaskError(f"a reward is named by a non-empty string, got {spec!r}")
    if spec == "math":
        return math_reward
    if spec == "exact":
        return exact_reward
    if spec.startswith("regex:"):
        return regex_reward(spec.removeprefix("regex:"))
    if spec.startswith("task:"):
        return task_reward(spec.removeprefix("task:"))
    fn = import_object(spec, "reward", "math, exact, regex:PATTERN, task:NAME or 'package.module:function'")
    if not callable(fn):
        raise TaskError(f"reward {spec!r}: {spec.partition(':')[2]} is not callable")
    return fn
