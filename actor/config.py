"""The actor's options: one dataclass per section, the one source of ``aurora actor``'s flags
(and of ``python -m actor.follow``'s, which take the weight-sync section only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from aurora_store.config import HOST, RoleSchema, Table
from aurora_store.config.options import COUNT, PORT, SECONDS, Range, option
from aurora_store.errors import ConfigError
from aurora_store.metrics_http import ADDR_ENV, LOOPBACK


@dataclass(kw_only=True, slots=True)
class SyncConfig:
    """Where the actor's weights come from: its region's bucket, Redis, and how it reads."""

    store: str = field(metadata=option(file="region.uri"))
    """This region's run URI (any fsspec URI)."""
    region: str = field(metadata=option(file="region.name"))
    """This region's name in Redis."""
    redis: str = field(metadata=option(env="AURORA_REDIS", file="redis"))
    """Redis URL: one server (``redis://``, ``rediss://``) or a Redis Cluster (``redis+cluster://host:port,...``)."""
    run_id: str = field(metadata=option(file="run_id"))
    """The run's name in Redis."""
    worker_id: str = field(metadata=option(env="AURORA_WORKER_ID", file=HOST))
    """This actor's id: a short name without spaces, '|' or braces, unique in the run."""
    fallback: str | None = field(default=None, metadata=option(file="fallback.uri"))
    """Home run URI, read when the region's copy of a version is bad."""
    fallback_options: dict[str, Any] | None = field(
        default=None, metadata=option(metavar="JSON", env="AURORA_FALLBACK_OPTIONS", file="fallback.storage_options")
    )
    """fsspec storage options of the fallback bucket, as a JSON object (default: --storage-options)."""
    verify_key: str | None = field(
        default=None, metadata=option(metavar="KEY", env="AURORA_VERIFY_KEY", file="verify_key")
    )
    """The run's Ed25519 public key (a PEM file, or PEM text in the environment): refuse versions it
    did not sign. A signed run cannot be followed without it."""
    connections: Annotated[int, Range(ge=1, le=256)] = 8
    """Parallel ranged GETs (1 to 256)."""
    verify_live: bool = False
    """After the bootstrap and every apply, read the engine's weights back and check their digest against
    the version's manifest (O(model) per version: for audits and tests). A mismatch stops the actor."""
    storage_options: dict[str, Any] = field(
        default_factory=dict,
        metadata=option(metavar="JSON", env="AURORA_STORAGE_OPTIONS", file="region.storage_options"),
    )
    """fsspec storage options of this region's bucket, as a JSON object (credentials belong in the environment)."""


@dataclass(kw_only=True, slots=True)
class RolloutConfig:
    """How the actor takes and serves jobs."""

    batch: Annotated[int, COUNT] = 8
    """Prompts per generate() call."""
    beta: Annotated[float, Range(ge=0, lt=1)] = 0.5
    """Throughput EMA smoothing: the weight of the past, in [0, 1)."""
    heartbeat_s: Annotated[float, SECONDS] = 20.0
    """Heartbeat lifetime in seconds (it beats two and a half times in one): an actor silent this long
    counts as gone, and its jobs are leased to others. A beat is one ZADD, sent with the listener's
    blocking read on the one connection an idle actor holds: at 20 s an idle actor costs Redis one
    wake-up every 8 s (0.32 commands a second with its look at the region's version), and a Redis Cluster
    failover within the default ``cluster-node-timeout`` (15 s) takes no actor for dead. Lower it to
    take work back from a dead actor sooner, at a cost in Redis CPU proportional to the beat rate."""
    check_s: Annotated[float, SECONDS] = 15.0
    """How often an idle actor looks at its region's version without being woken (the safety net under
    push: jobs and commits wake it at once); a look at the bucket, not at Redis."""
    inline_bytes: Annotated[int, Range(ge=0, le=64 << 10)] = 64 << 10
    """Result payloads up to this many bytes go through Redis; larger ones are put in this region's
    bucket (``results/``) and only their reference goes through Redis. At most 65536."""
    slowdown: Annotated[float, Range(ge=1, le=1000)] = 1.0
    """Emulate hardware this many times slower (for demos and tests; 1 to 1000)."""


@dataclass(kw_only=True, slots=True)
class EngineConfig:
    """The rollout engine."""

    engine: Literal["torch", "vllm"] = "torch"
    """Rollout engine: torch (transformers, any device) or vllm (a GPU, or vLLM's CPU build: `make vllm-env`)."""
    device: str = "cpu"
    """Torch engine device (cpu, cuda, cuda:1, ...)."""
    threads: Annotated[int, COUNT] = 1
    """Torch intra-op threads."""
    tensor_parallel: Annotated[int, COUNT] = 1
    """vLLM tensor-parallel size."""
    vllm_weight_transfer: Literal["auto", "native", "extension", "patches"] = "auto"
    """How versions reach vLLM's workers: native (vLLM's weight-transfer API, backend aurora, written in
    place), patches (the same API, through vLLM's own loaders: any layout, no NaN values), extension (the
    worker extension, for older vLLM), or auto (native where vLLM offers it, patches for layouts not
    mapped here)."""
    vllm_prefix_caching: bool = True
    """vLLM's prefix cache: a group's samples and prompts sharing a system prompt are prefilled once. It is
    reset after every applied version (no KV block of older weights is served)."""
    vllm_max_model_len: Annotated[int | None, COUNT] = None
    """vLLM's context length (default: the model's); a shorter one needs a smaller KV cache."""
    vllm_max_lora_rank: Annotated[int | None, COUNT] = None
    """A LoRA run on vLLM: the largest adapter rank the engine is started for (1, 8, 16, 32, 64, 128, 256,
    320 or 512; default: the smallest of them that holds the run's rank). A run whose rank is above it is
    refused before the engine starts."""

    def __post_init__(self) -> None:
        for name in ("threads", "tensor_parallel", "vllm_max_model_len", "vllm_max_lora_rank"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"engine: {name} must be a positive integer, got {value!r}")


@dataclass(kw_only=True, slots=True)
class ActorConfig:
    """Everything ``aurora actor`` needs; how to sample and score comes from the run (aurora_run.json)."""

    sync: SyncConfig
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    metrics_port: Annotated[int | None, PORT] = None
    """Serve Prometheus metrics over HTTP on this port (/metrics; 0 or unset: off), on --metrics-addr."""
    metrics_addr: str = field(default=LOOPBACK, metadata=option(metavar="ADDR", env=ADDR_ENV))
    """The address --metrics-port binds: this host only by default; 0.0.0.0 (or one interface's address)
    for a Prometheus on another host, behind a firewall that lets only it in."""
    identity_key: str | None = field(default=None, metadata=option(metavar="KEY", env="AURORA_IDENTITY_KEY"))
    """This actor's Ed25519 private key (a PEM file, or PEM text in the environment): it signs every result.
    A trainer with a fleet key admits only signed results (``aurora actor-cert issue`` makes the key)."""
    identity_cert: str | None = field(default=None, metadata=option(metavar="CERT", env="AURORA_IDENTITY_CERT"))
    """This actor's certificate, signed by the fleet key (a file, or the JSON document in the environment);
    it names this actor's worker id and key. Given with --identity-key."""

    def __post_init__(self) -> None:
        if (self.identity_key is None) != (self.identity_cert is None):
            raise ConfigError("--identity-key and --identity-cert go together: give both or neither")


CONFIG_FILE = RoleSchema(
    command="actor",
    cls=ActorConfig,
    tables=(Table("actor", ("", "sync", "rollout", "engine"), per_region=True),),
    regions="each",
)
"""How ``aurora actor --config aurora.toml --region R`` reads the file: ``[actor]`` holds its options of
every section (batch, engine, device, connections, ...) by name, and ``[regions.R.actor]`` wins for
region R. The worker id is per host: ``--worker-id`` or ``$AURORA_WORKER_ID``."""
