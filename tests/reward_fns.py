"""Reward functions for the tests, named as ``tests.reward_fns:NAME`` (user code, as a user writes it)."""

from __future__ import annotations

import os
import time


def length_over_ten(prompt: str, completion: str, answer: str) -> float:
    return min(len(completion) / 10, 1.0)


def raises(prompt: str, completion: str, answer: str) -> float:
    raise RuntimeError("a buggy reward")


def hangs(prompt: str, completion: str, answer: str) -> float:
    if completion == "0":  # lets the warm-up call through, then hangs on real completions
        return 0.0
    time.sleep(3600)
    return 1.0


def nan(prompt: str, completion: str, answer: str) -> float:
    return float("nan")


def text(prompt: str, completion: str, answer: str) -> str:
    return "one"


def dies(prompt: str, completion: str, answer: str) -> float:
    if completion == "0":
        return 0.0
    os._exit(3)


NOT_CALLABLE = 5
