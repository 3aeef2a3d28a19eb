"""The fault schedule of ``aurora bench chaos``: every fault kind, its weight, the seeded draw, and the
schedule file a run leaves so that the same schedule can be run again (``--replay FILE``)."""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aurora_store.errors import ConfigError

# fmt: off
KINDS = {
    "kill_actor": 3, "kill_relay": 2, "kill_trainer": 2, "redis_restart": 1, "redis_flush": 1, "partition": 2,
    "slow_actor": 1, "actor_join": 1, "actor_leave": 1, "corrupt_segment": 1, "truncate_segment": 1,
    "delete_segment": 1, "replay_manifest": 1, "forge_manifest": 1, "forged_result": 2, "malformed_event": 2,
    "hostile_entry": 1, "pause_actor": 1, "trainer_kill_before_state": 2, "forged_flood": 1,
    "inflated_registration": 1, "forged_retention": 1, "forged_notice": 1, "garbage_scrape": 1,
    "trainer_storage_outage": 1, "rotate_key": 1,
}
# fmt: on
"""Every fault kind and its weight in the draw after each kind has come once."""

WRITERS = (
    "forged_result", "forged_flood", "inflated_registration", "slow_actor", "forged_retention", "malformed_event",
    "hostile_entry", "forged_notice", "garbage_scrape",
)  # fmt: skip
"""The faults anyone who can write to Redis or a bucket causes, killing and cutting nothing (``slow_actor``
is a hung actor whose heartbeat goes on): under these alone training must not slow down."""

SCHEDULE_FORMAT = "aurora-chaos-schedule/1"
MAX_FAULTS = 100_000


def kinds_of(names: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The kinds ``--kinds`` names, ``writers`` standing for the writer family; None: every kind."""
    if names is None:
        return None
    return tuple(dict.fromkeys(k for n in names for k in (WRITERS if n == "writers" else (n,))))


def schedule(rng: Any, n: int, only: tuple[str, ...] | None = None) -> list[str]:
    """``n`` fault kinds (of ``only``, if given): every kind once in a seeded order first, then weighted draws."""
    unknown = sorted(set(only or ()) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {sorted(KINDS)}")
    kinds = [k for k in KINDS if only is None or k in only]
    rng.shuffle(kinds)
    weights = [KINDS[k] for k in kinds]
    return (kinds + rng.choices(list(kinds), weights=weights, k=max(0, n - len(kinds))))[:n]


@dataclass(frozen=True, slots=True)
class Planned:
    """One fault of a schedule: its kind, the wait before it, and the seed of its own draws (its
    targets), so that what one fault draws never shifts what the next one does."""

    kind: str
    gap_s: float
    seed: int

    def rng(self) -> random.Random:
        return random.Random(self.seed)


def plan(seed: int, n: int, only: tuple[str, ...] | None, interval_s: float) -> tuple[Planned, ...]:
    """The whole schedule of a seed, drawn before the first fault: kinds (:func:`schedule`), gaps
    (uniform in [0.5, 1.5] x ``interval_s``) and each fault's seed. A run injects exactly this, so a run
    of the same seed, or of the file :func:`write` leaves, injects the same faults in the same order
    after the same waits. Where a fault's target depends on the system at that moment (the newest
    version, which actor is alive), a rerun draws the same numbers but may find another target."""
    rng = random.Random(seed)
    kinds = schedule(rng, n, only)
    return tuple(Planned(k, round(rng.uniform(0.5, 1.5) * interval_s, 3), rng.getrandbits(63)) for k in kinds)


def write(path: Path, config: dict[str, Any], planned: tuple[Planned, ...]) -> None:
    """Leave the schedule and the config it ran under at ``path`` (JSON), for ``--replay``."""
    doc = {"format": SCHEDULE_FORMAT, "config": config, "faults": [dataclasses.asdict(p) for p in planned]}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def read(path: str) -> tuple[dict[str, Any], tuple[Planned, ...]]:
    """A schedule file :func:`write` left: (the config it ran under, its faults). ConfigError, naming
    the file and the field, for anything else."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{path}: not a chaos schedule: {why}"[:400])

    try:
        with open(path, "rb") as f:
            raw = f.read(64 << 20)
        doc = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise bad(str(exc)) from None
    if not isinstance(doc, dict) or doc.get("format") != SCHEDULE_FORMAT:
        raise bad(f"format must be {SCHEDULE_FORMAT!r}")
    config, faults = doc.get("config"), doc.get("faults")
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise bad("config must be an object")
    if not isinstance(faults, list) or len(faults) > MAX_FAULTS:
        raise bad(f"faults must be a list of at most {MAX_FAULTS}")
    planned = []
    for i, f in enumerate(faults):
        if not isinstance(f, dict) or set(f) != {"kind", "gap_s", "seed"}:
            raise bad(f"faults[{i}] must be an object of kind, gap_s and seed")
        kind, gap, seed = f["kind"], f["gap_s"], f["seed"]
        if kind not in KINDS:
            raise bad(f"faults[{i}].kind {kind!r} is not a fault kind")
        if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 <= gap <= 3600:
            raise bad(f"faults[{i}].gap_s must be a number of seconds in [0, 3600]")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise bad(f"faults[{i}].seed must be an integer in [0, 2**63)")
        planned.append(Planned(kind, float(gap), seed))
    return config, tuple(planned)
