"""A seeded data set of arithmetic word problems, as GSM8K-style JSONL (``question``; ``answer``
ending in ``#### N``), whose answers the ``math`` reward checks.

It is what ``aurora demo-real`` trains a small pretrained instruct model on: one-step problems
(a sum, more, left over, two kinds together, groups of) with one-digit numbers. Measured on vLLM
with SmolLM2-135M-Instruct at temperature 0.7, such problems are answered right 10-40% of the
time (harder ones, with two-digit numbers or two steps, under 6%), so a group of samples usually
holds both right and wrong answers and the reward has room to rise within a few dozen steps. The
same seed writes the same file.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena", "Mia", "Omar")
THINGS = ("apples", "books", "coins", "marbles", "pencils", "stickers", "shells", "cookies", "cards", "stamps")
COLOURS = (("red", "blue"), ("green", "yellow"), ("black", "white"))


def _sum(rng: random.Random, name: str, thing: str) -> tuple[str, int]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"What is {a} + {b}?", a + b


def _more(rng: random.Random, name: str, thing: str) -> tuple[str, int]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have?", a + b


def _left(rng: random.Random, name: str, thing: str) -> tuple[str, int]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"{name} had {a + b} {thing} and gave away {b}. How many {thing} are left?", a


def _both(rng: random.Random, name: str, thing: str) -> tuple[str, int]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    one, other = rng.choice(COLOURS)
    return f"A box has {a} {one} {thing} and {b} {other} {thing}. How many {thing} are in the box?", a + b


def _groups(rng: random.Random, name: str, thing: str) -> tuple[str, int]:
    a, b = rng.randint(2, 5), rng.randint(2, 5)
    return f"{name} has {a} bags with {b} {thing} in each bag. How many {thing} does {name} have?", a * b


KINDS: tuple[Callable[[random.Random, str, str], tuple[str, int]], ...] = (_sum, _more, _left, _both, _groups)


def problems(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` problems, each ``{"question": ..., "answer": "... #### N"}``."""
    if n < 1:
        raise ValueError(f"a data set needs at least one problem, got {n}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kind = rng.choice(KINDS)
        question, answer = kind(rng, rng.choice(NAMES), rng.choice(THINGS))
        out.append({"question": f"{question} Answer with the number only.", "answer": f"#### {answer}"})
    return out


def write(path: str | Path, n: int, seed: int = 0) -> Path:
    """Write :func:`problems` to ``path`` as JSONL; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(row) + "\n" for row in problems(n, seed)), encoding="utf-8")
    return p
