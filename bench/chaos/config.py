"""The shape of one ``aurora bench chaos`` run: its schedule, the system's size and its time limits."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from aurora_store.errors import ConfigError
from bench.chaos.schedule import Planned


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    """One chaos run: the schedule, the system's size, and its time limits."""

    seed: int = 0
    faults: int = 30
    """Faults to inject."""
    interval_s: float = 2.0
    """Mean gap between faults (each gap is uniform in [0.5, 1.5] times this)."""
    steps: int | None = None
    """Trainer steps; None: one per 2 s of schedule, at least 6."""
    actors: int = 2
    """Actors per region at the start."""
    prompts: int = 8
    group: int = 4
    max_new_tokens: int = 4
    sft_steps: int = 30
    """Warm-start steps: enough that rewards differ within groups, so versions are real deltas."""
    lease_s: float = 8.0
    state_every: int = 2
    """The trainer's --state-every: with 2, a kill after an odd version's commit always resumes from an
    older state (a rollback the next version must declare), and one after an even version's commit
    does so when it lands before that version's state is committed (trainer_kill_before_state)."""
    heartbeat_s: float = 3.0
    slowdown: float = 25.0
    """Every actor's emulated slowdown, so that a batch lasts long enough to be interrupted."""
    bandwidth_bps: float = 1e9
    rtt_s: float = 0.01
    restart_s: tuple[float, float] = (0.5, 3.0)
    """A dead role is restarted after a delay drawn uniformly from this range."""
    start_timeout_s: float = 300.0
    """Longest wait for the trainer's first step before the schedule starts."""
    settle_s: float = 300.0
    """Longest wait, after the schedule, for the trainer to finish and every region to hold every version."""
    workdir: str | None = None
    kinds: tuple[str, ...] | None = None
    """The fault kinds to draw from (`bench.chaos.schedule.KINDS`); None: all of them."""
    planned: tuple[Planned, ...] | None = None
    """The schedule to inject (a schedule file's, ``--replay``); None: the one ``seed`` draws."""
    calm_steps: int = 0
    """Steps the trainer completes before the first fault: their admission times are the fault-free
    baseline that steps under faults of the writer family are held to (`bench.chaos.check.pace`)."""

    @property
    def total_steps(self) -> int:
        return self.steps or max(6, math.ceil(self.faults * self.interval_s / 2))


_NOT_REPLAYED = ("workdir", "planned")
"""What a schedule file does not carry: where the logs go (each run its own) and the faults (beside)."""


def replayable(cfg: Config) -> dict[str, Any]:
    """``cfg`` as a schedule file carries it (JSON-ready)."""
    d = dataclasses.asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items() if k not in _NOT_REPLAYED}


def from_replayable(doc: dict[str, Any], what: str) -> Config:
    """The inverse of :func:`replayable`, for a file anyone could have edited: every field known and of
    its type (numbers finite and not negative), else ConfigError naming ``what`` and the field."""
    fields = {f.name: f for f in dataclasses.fields(Config) if f.name not in _NOT_REPLAYED}
    out: dict[str, Any] = {}
    for name, value in doc.items():
        if name not in fields:
            raise ConfigError(f"{what}: config.{name:.60} is not a chaos setting")
        out[name] = _checked(value, str(fields[name].type), f"{what}: config.{name}")
    return Config(**out)


def _checked(value: Any, kind: str, where: str) -> Any:
    """``value`` as a field annotated ``kind`` holds it."""
    if value is None and kind.endswith("| None"):
        return None
    if kind.startswith("int") and type(value) is int and value >= 0:
        return value
    if kind == "float" and type(value) in (int, float) and 0 <= value < math.inf:
        return float(value)
    if kind == "tuple[float, float]" and isinstance(value, list) and len(value) == 2:
        return tuple(_checked(v, "float", where) for v in value)
    if kind.startswith("tuple[str, ...]") and isinstance(value, list) and all(isinstance(k, str) for k in value):
        return tuple(value)
    raise ConfigError(f"{where} must be {kind.replace('tuple', 'a list').replace(', ...', '')}, not {value!r:.60}")
