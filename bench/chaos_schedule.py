"""The fault schedule of ``aurora bench chaos``: every fault kind, its weight, and the seeded draw."""

from __future__ import annotations

from typing import Any

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
