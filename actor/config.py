"""The actor's options: one dataclass per section, the one source of ``aurora actor``'s flags
(and of ``python -m actor.follow``'s, which take the weight-sync section only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from aurora_store.options import option


@dataclass(kw_only=True, slots=True)
class SyncConfig:
    """Where the actor's weights come from: its region's bucket, Redis, and how it reads."""

    store: str
    """This region's run URI (any fsspec URI)."""
    region: str
    """This region's name in Redis."""
    redis: str = field(metadata=option(env="AURORA_REDIS"))
    """Redis URL."""
    run_id: str
    """The run's name in Redis."""
    worker_id: str
    """This actor's id: a short name without spaces, '|' or braces, unique in the run."""
    fallback: str | None = None
    """Home run URI, read when the region's copy of a version is bad."""
    fallback_options: dict[str, Any] | None = field(
        default=None, metadata=option(metavar="JSON", env="AURORA_FALLBACK_OPTIONS")
    )
    """fsspec storage options of the fallback bucket, as a JSON object (default: --storage-options)."""
    verify_key: str | None = field(default=None, metadata=option(metavar="KEY", env="AURORA_VERIFY_KEY"))
    """The run's Ed25519 public key (a PEM file, or PEM text in the environment): refuse versions it
    did not sign. A signed run cannot be followed without it."""
    connections: int = 8
    """Parallel ranged GETs."""
    storage_options: dict[str, Any] = field(
        default_factory=dict, metadata=option(metavar="JSON", env="AURORA_STORAGE_OPTIONS")
    )
    """fsspec storage options of this region's bucket, as a JSON object (credentials belong in the environment)."""


@dataclass(kw_only=True, slots=True)
class RolloutConfig:
    """How the actor takes and serves jobs."""

    batch: int = 8
    """Prompts per generate() call."""
    beta: float = 0.5
    """Throughput EMA smoothing."""
    heartbeat_s: float = 5.0
    """Heartbeat lifetime in seconds (it beats three times in one): an actor silent this long counts
    as gone, and its jobs are leased to others."""
    slowdown: float = 1.0
    """Emulate hardware this many times slower (for demos and tests)."""


@dataclass(kw_only=True, slots=True)
class EngineConfig:
    """The rollout engine."""

    engine: Literal["torch", "vllm"] = "torch"
    """Rollout engine: torch (transformers, any device) or vllm (GPU)."""
    device: str = "cpu"
    """Torch engine device (cpu, cuda, cuda:1, ...)."""
    threads: int = 1
    """Torch intra-op threads."""
    tensor_parallel: int = 1
    """vLLM tensor-parallel size."""
    vllm_weight_transfer: Literal["auto", "native", "extension"] = "auto"
    """How versions reach vLLM's workers: native (vLLM's weight-transfer API, backend aurora),
    extension (the worker extension, for older vLLM), or auto (native where vLLM offers it)."""


@dataclass(kw_only=True, slots=True)
class WorkerConfig:
    """Everything ``aurora actor`` needs; how to sample and score comes from the run (aurora_run.json)."""

    sync: SyncConfig
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
