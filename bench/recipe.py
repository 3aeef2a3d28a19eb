"""Whether ``aurora demo``'s recipe learns: the demo as a user runs it, judged as its README promises.

Runs ``aurora demo --json`` (a process of its own, embedded Redis, local buckets: the main job) with
the recipe's defaults, 250 GRPO steps on the built-in tiny model, unless ``--steps``/``--lr`` are
given, and reports what a user is promised: the reward rises by more than twice its standard error
(mean of the first and the last five steps), every version verifies in all three regions, deltas
change at most a tenth of the weights and are at most an eighth of a full copy. Also the trend of the
reward over every step (least-squares slope and its t statistic), which a short run judges better
than its first and last steps.

The 250-step run takes 5-7 minutes on 2 CPU cores, so the suite runs a 60-step variant at a higher
learning rate (``tests/test_demo.py``) and this benchmark keeps the recipe itself.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from aurora_store.config.options import option, positive
from aurora_store.errors import StoreError
from bench.output import Output, emit

DENSITY_MAX = 0.10
"""Mean changed fraction of a delta the recipe must stay under."""
DELTA_OVER_FULL_MAX = 1 / 8
"""Mean delta bytes over a full version's bytes the recipe must stay under."""


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench recipe``."""

    steps: int | None = field(default=None, metadata=option(parse=positive))
    """GRPO steps (default: the recipe's 250)."""
    lr: float | None = None
    """RL learning rate (default: the recipe's)."""
    workdir: str | None = None
    """Where the demo's buckets, logs and report go (default: a temporary directory, deleted after)."""
    timeout_s: float = 1800.0
    """Longest the demo may run before the benchmark kills it and fails."""


def trend(rewards: list[float]) -> tuple[float, float]:
    """The least-squares slope of ``rewards`` over their step index, and its t statistic (0 when the
    rewards are a perfect line or too few to tell)."""
    n = len(rewards)
    if n < 3:
        return 0.0, 0.0
    xs = range(n)
    mx, my = (n - 1) / 2, statistics.fmean(rewards)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, rewards, strict=True)) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, rewards, strict=True))
    se = math.sqrt(residual / (n - 2) / sxx)
    return slope, (slope / se if se > 0 else 0.0)


def demo(flags: Flags, workdir: str) -> tuple[dict[str, Any], float]:
    """``aurora demo --json`` in a session of its own (killed whole on a timeout): its summary and wall time."""
    argv = [sys.executable, "-m", "aurora_store.cli", "demo", "--json", "--workdir", workdir]
    argv += ["--steps", str(flags.steps)] if flags.steps is not None else []
    argv += ["--lr", repr(flags.lr)] if flags.lr is not None else []
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=flags.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise StoreError(f"aurora demo did not finish in {flags.timeout_s:.0f} s:\n{err[-3000:]}") from None
    if proc.returncode != 0 or not out.strip():
        raise StoreError(f"aurora demo exited {proc.returncode}:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1]), time.monotonic() - t0


def measure(flags: Flags) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="aurora-bench-recipe-") as tmp:
        summary, wall = demo(flags, flags.workdir or tmp)
    rewards = [row["reward"] for row in summary["per_step"]]
    slope, t = trend(rewards)
    steps = summary["steps"]
    delta_over_full = summary["delta_bytes_mean"] / summary["full_bytes"]
    return {
        "bench": "recipe",
        "steps": steps,
        "lr": flags.lr,
        "wall_s": round(wall, 1),
        "reward_first": summary["reward_first"],
        "reward_last": summary["reward_last"],
        "reward_stderr": summary["reward_stderr"],
        "reward_slope_per_step": round(slope, 6),
        "reward_slope_t": round(t, 2),
        "density_mean": summary["density_mean"],
        "delta_over_full": round(delta_over_full, 4),
        "versions_verified": summary["versions_verified"],
        "reward_rose": bool(summary["reward_rose"]),
        "every_version_verified": summary["versions_verified"] == 3 * (steps + 1),
        "density_ok": 0 < summary["density_mean"] <= DENSITY_MAX,
        "delta_ok": 0 < delta_over_full <= DELTA_OVER_FULL_MAX,
        "report": summary["report"] if flags.workdir else None,
    }


def run(flags: Flags) -> int:
    def render(r: dict[str, Any]) -> None:
        print(
            f"{r['steps']} steps in {r['wall_s']} s: reward {r['reward_first']} -> {r['reward_last']} "
            f"(± {r['reward_stderr']}; slope t {r['reward_slope_t']}); density {r['density_mean']}, "
            f"delta/full {r['delta_over_full']}; rose {r['reward_rose']}, verified {r['every_version_verified']}, "
            f"density ok {r['density_ok']}, delta ok {r['delta_ok']}"
        )

    return emit(measure(flags), flags, render)
