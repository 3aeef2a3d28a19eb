"""The fault schedule of ``aurora bench chaos``: every fault kind, its weight, and the seeded draw."""

from __future__ import annotations

from typing import Any

# fmt: off
KINDS = {
    "kill_actor": 3, "kill_relay": 2, "kill_trainer": 2, "redis_restart": 1, "redis_flush": 1, "partition": 2,
    "slow_actor": 1, "actor_join": 1, "actor_leave": 1, "corrupt_segment": 1, "truncate_segment": 1,
    "delete_segment": 1, "replay_manifest": 1, "forge_manifest": 1, "forged_result": 2, "malformed_event": 2,
    "hostile_entry": 1, "pause_actor": 1, "trainer_kill_before_state": 2,
}
# fmt: on
"""Every fault kind and its weight in the draw after each kind has come once."""


def schedule(rng: Any, n: int) -> list[str]:
    """``n`` fault kinds: every kind once in a seeded order first, then weighted draws."""
    kinds = list(KINDS)
    rng.shuffle(kinds)
    return (kinds + rng.choices(list(KINDS), weights=list(KINDS.values()), k=max(0, n - len(kinds))))[:n]
