"""The RL vocabulary's error family: a task, model config or tokenizer that cannot be used."""

from __future__ import annotations

from aurora_store.errors import AuroraError


class RLError(AuroraError, ValueError):
    """Base of the RL layer's errors."""


class TaskError(RLError):
    """A task could not be loaded or does not behave like one."""


class ModelError(RLError):
    """A model config or tokenizer is malformed, too large, or not what the run needs."""
