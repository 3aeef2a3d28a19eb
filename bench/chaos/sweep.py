"""``aurora bench chaos --seeds A-B``: one chaos run per seed, one after the other, and what they add up to.

Each seed's run keeps its own work directory (``WORKDIR/seed-N``) with its logs, its schedule file (to
run it again with ``--replay``), its result and, when an invariant failed, the evidence of the first one
(`bench.chaos.evidence`). The sweep's JSON has a row per seed and a summary; it exits non-zero when any
seed lost a prompt or failed an invariant.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aurora_store.errors import ConfigError
from bench.chaos.config import Config

MAX_SEEDS = 1000


def parse_seeds(text: str) -> list[int]:
    """``1-10`` (both ends included) or ``3,7,9`` (or both: ``1-3,8``): distinct seeds, in order."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ConfigError(f"--seeds {text!r:.60}: expected a range such as 1-10 or a list such as 3,7,9")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first or last - first >= MAX_SEEDS:
            raise ConfigError(f"--seeds {text!r:.60}: {part} is not a range of at most {MAX_SEEDS} seeds")
        seeds += [s for s in range(first, last + 1) if s not in seeds]
    if len(seeds) > MAX_SEEDS:
        raise ConfigError(f"--seeds {text!r:.60}: at most {MAX_SEEDS} seeds")
    return seeds


def passed(result: dict[str, Any]) -> bool:
    """A chaos run passes when it lost nothing and every invariant held."""
    return not result["lost"] and all(result["invariants"].values())


def sweep(cfg: Config, seeds: list[int], measure: Callable[[Config], dict[str, Any]]) -> dict[str, Any]:
    """Run ``measure`` on ``cfg`` with each seed, each in a work directory of its own."""
    t0 = time.monotonic()
    base = Path(cfg.workdir or tempfile.mkdtemp(prefix="aurora-chaos-sweep-"))
    rows = []
    for seed in seeds:
        result = measure(dataclasses.replace(cfg, seed=seed, workdir=str(base / f"seed-{seed}")))
        rows.append(
            {
                "seed": seed,
                "passed": passed(result),
                "faults": sum(result["faults_injected"].values()),
                "faults_requested": result["faults_requested"],
                "lost": result["lost"],
                "invariants": result["invariants"],
                "seconds": result["seconds"],
                "workdir": result["workdir"],
                "schedule": result["schedule"],
                "evidence": result["evidence"],
            }
        )
    failing: Counter[str] = Counter(name for r in rows for name, ok in r["invariants"].items() if not ok)
    return {
        "bench": "chaos-sweep",
        "rows": rows,
        "summary": {
            "seeds": len(rows),
            "passed": sum(r["passed"] for r in rows),
            "failed": [r["seed"] for r in rows if not r["passed"]],
            "faults": sum(r["faults"] for r in rows),
            "lost": sum(r["lost"] for r in rows),
            "invariants_failed": dict(failing),
            "seconds": round(time.monotonic() - t0, 1),
            "workdir": str(base),
        },
    }


def render_sweep(swept: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = swept["summary"]
    table = Table(title=f"chaos sweep: {s['passed']} of {s['seeds']} seeds passed, lost {s['lost']}, {s['seconds']} s")
    for col in ("seed", "faults", "lost", "failed invariants", "seconds", "replay"):
        table.add_column(col)
    for r in swept["rows"]:
        bad = ", ".join(n for n, ok in r["invariants"].items() if not ok) or "-"
        table.add_row(str(r["seed"]), str(r["faults"]), str(r["lost"]), bad, str(r["seconds"]), r["schedule"])
    Console().print(table)
