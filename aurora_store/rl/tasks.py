"""RL tasks: prompts with a verifiable answer and an exact-match reward. No torch, no I/O.

A task is any object with ``name``, ``prompts(rng, n)``, ``reward(prompt, completion)`` and
``demos(rng, n)`` (prompt/answer pairs for the short supervised warm start). The trainer
draws prompts from it and the actors score completions with it, so both name it the same
way: a built-in name (``arith``, ``reverse``) or ``package.module:factory``, where
``factory()`` returns the task. Prompts travel inside jobs as JSON, so a task's prompts
must be plain strings.
"""

from __future__ import annotations

import importlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from aurora_store.rl.errors import TaskError

MAX_PROMPT_IDS = 1 << 20


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt: ``text`` (as ``ids``, the tokens the model is given) goes to the model,
    ``answer`` to the reward function only."""

    id: str
    text: str
    answer: str
    ids: tuple[int, ...] = ()
    """The prompt's token ids, chat template applied: the trainer tokenizes once, jobs carry them."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "text": self.text, "answer": self.answer}
        if self.ids:
            d["ids"] = list(self.ids)
        return d

    @classmethod
    def from_dict(cls, d: object) -> Prompt:
        """A prompt from a job's JSON (hostile: another process wrote it)."""
        if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in ("id", "text", "answer")):
            raise TaskError(f"a prompt is an object with string id, text and answer; got {str(d)[:120]!r}")
        ids = d.get("ids", [])
        if (
            not isinstance(ids, list)
            or len(ids) > MAX_PROMPT_IDS
            or not all(type(i) is int and 0 <= i < 1 << 31 for i in ids)
        ):
            raise TaskError(f"prompt {d['id'][:80]!r}: ids must be a list of token ids")
        return cls(d["id"], d["text"], d["answer"], tuple(ids))


@runtime_checkable
class Task(Protocol):
    name: str

    def prompts(self, rng: random.Random, n: int) -> list[Prompt]: ...

    def reward(self, prompt: Prompt, completion: str) -> float: ...

    def demos(self, rng: random.Random, n: int) -> list[tuple[str, str]]: ...


class ExactMatch(ABC):
    """A task whose prompts each have one right answer: reward 1 for it (whitespace aside), else 0.
    Subclasses draw one ``(prompt text, answer)`` pair in :meth:`draw`."""

    name = "exact-match"

    @abstractmethod
    def draw(self, rng: random.Random) -> tuple[str, str]:
        """One prompt text and its answer."""

    def prompts(self, rng: random.Random, n: int) -> list[Prompt]:
        out = []
        for _ in range(n):
            text, answer = self.draw(rng)
            out.append(Prompt(f"{text}{rng.getrandbits(32):08x}", text, answer))
        return out

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if completion.strip() == prompt.answer else 0.0

    def demos(self, rng: random.Random, n: int) -> list[tuple[str, str]]:
        return [self.draw(rng) for _ in range(n)]


class Arithmetic(ExactMatch):
    """``a+b=`` with operands below ``limit``."""

    name = "arith"

    def __init__(self, limit: int = 10) -> None:
        self.limit = limit

    def draw(self, rng: random.Random) -> tuple[str, str]:
        a, b = rng.randrange(self.limit), rng.randrange(self.limit)
        return f"{a}+{b}=", str(a + b)


class Reverse(ExactMatch):
    """Reverse a short lowercase word: ``rev abc:`` → ``cba``."""

    name = "reverse"

    def __init__(self, max_len: int = 5) -> None:
        self.max_len = max_len

    def draw(self, rng: random.Random) -> tuple[str, str]:
        word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, self.max_len)))
        return f"rev {word}:", word[::-1]


BUILTIN: dict[str, type[ExactMatch]] = {"arith": Arithmetic, "reverse": Reverse}


def import_object(spec: str, what: str, usage: str) -> Any:
    """The object ``package.module:attr`` names (a user's task factory or reward); a TaskError
    naming ``what`` when ``spec`` is not of that form (``usage`` says what is) or cannot be imported."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise TaskError(f"{what} {spec!r}: give {usage}")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as exc:  # ImportError, AttributeError, or whatever the user's module raises on import
        raise TaskError(f"{what} {spec!r}: cannot import it: {exc}") from None


def load_task(spec: str) -> Task:
    """A built-in task by name, or ``package.module:factory`` called with no arguments."""
    if spec in BUILTIN:
        return BUILTIN[spec]()
    factory = import_object(spec, "task", f"a built-in name ({', '.join(BUILTIN)}) or 'package.module:factory'")
    attr = spec.partition(":")[2]
    try:
        task: object = factory()
    except TypeError as exc:  # not callable, or it wants arguments
        raise TaskError(f"task {spec!r}: {attr} cannot be called with no arguments: {exc}") from None
    if not isinstance(task, Task):
        raise TaskError(f"task {spec!r}: {type(task).__name__} lacks name, prompts(), reward() or demos()")
    return cast(Task, task)


class PromptSource(Protocol):
    """Where a trainer's prompts come from, step by step (a data set, or a task)."""

    skipped: int
    """Prompts dropped for being too long."""

    def for_step(self, step: int, n: int) -> list[Prompt]:
        """Step ``step``'s ``n`` prompts (steps count from 1); the same on every call and every restart."""
        ...

    def position(self, step: int, n: int) -> dict[str, Any]:
        """Where the run is after ``step`` steps, for the trainer state."""
        ...


class TaskPrompts:
    """A task's prompts, drawn from a generator seeded by the run's seed and the step."""

    skipped = 0

    def __init__(self, task: Task, encode: Callable[[str], list[int]], *, seed: int) -> None:
        self.task = task
        self.encode = encode
        self.seed = seed

    def for_step(self, step: int, n: int) -> list[Prompt]:
        prompts = self.task.prompts(random.Random(f"{self.seed}:{step}"), n)
        return [Prompt(p.id, p.text, p.answer, tuple(self.encode(p.text))) for p in prompts]

    def position(self, step: int, n: int) -> dict[str, Any]:
        return {"task": self.task.name}
