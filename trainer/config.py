"""The trainer's options: one dataclass per section, the one source of ``aurora train``'s flags.

``aurora train --help`` lists them by section, with the docstrings below as help
(:mod:`aurora_store.config.options`); ``aurora demo`` takes the same sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from aurora_store.config import RoleSchema, Table
from aurora_store.config.options import COUNT, NONNEGATIVE, PORT, SECONDS, Range, option
from aurora_store.errors import ConfigError
from aurora_store.metrics_http import ADDR_ENV, LOOPBACK
from aurora_store.rl.sampling import SamplingConfig


def names(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated names (blanks dropped)."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """The policy: a user's HF causal LM, or the built-in tiny Qwen3 (built from a config, nothing downloaded)."""

    model: str | None = field(default=None, metadata=option(metavar="PATH_OR_ID"))
    """A HF causal LM and its tokenizer: a local directory (read offline), a hub id (downloaded and
    cached by transformers), or a .gguf file (or a directory holding one), dequantized once to a BF16 HF
    directory by transformers' own GGUF loader. Default: the built-in tiny Qwen3 with a character tokenizer."""
    hidden: Annotated[int, Range(ge=4)] = 64
    """Hidden size of the built-in model (at least 4: one per attention head)."""
    layers: Annotated[int, COUNT] = 2
    """Decoder layers of the built-in model."""
    device: str = "auto"
    """Where the trainer computes: cpu, cuda, or auto (cuda when present; each torchrun rank takes its own GPU)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about a third more compute."""
    lora_rank: Annotated[int, Range(ge=0, le=4096)] = 0
    """Train a LoRA adapter of this rank (PEFT) on the frozen model instead of every weight; versions then
    hold the adapter only and the run carries the base once. 0: train every weight."""
    lora_alpha: Annotated[float, Range(gt=0, le=1e6)] = 32.0
    """The LoRA adapter's alpha (its update is scaled by alpha / rank)."""
    lora_targets: tuple[str, ...] = field(
        default=("q_proj", "k_proj", "v_proj", "o_proj"), metadata=option(metavar="NAMES", parse=names)
    )
    """The modules the adapter adapts, comma-separated (PEFT's target_modules: q_proj,v_proj,...)."""


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Where prompts come from: a data set, or a built-in task."""

    data: str | None = field(default=None, metadata=option(metavar="PATH"))
    """A data set: a JSONL, Parquet or CSV file, or a directory of them. Default: the built-in --task."""
    data_format: Literal["gsm8k", "math", "deepscaler"] | None = None
    """Column and gold-answer preset: gsm8k (question; answer ending in '#### N'), math (problem; the last
    \\boxed{} of solution), deepscaler (problem; answer)."""
    prompt_field: str | None = None
    """The prompt column (overrides the preset's)."""
    answer_field: str | None = None
    """The gold-answer column (overrides the preset's)."""
    task: str = "arith"
    """Built-in task (arith, reverse) or package.module:factory, when no --data is given."""
    max_prompt_tokens: Annotated[int, COUNT] = 1024
    """Prompts longer than this (chat template included) are skipped and counted, once, at load."""
    chat_template: bool = True
    """Apply the tokenizer's chat template to prompts, when it has one."""
    system_prompt: str | None = None
    """A system message before every prompt (with the chat template)."""


@dataclass(kw_only=True, slots=True)
class RewardConfig:
    """How actors score completions."""

    reward: str | None = None
    """math (math-verify on the final answer), exact, regex:PATTERN, task:NAME or package.module:function.
    Default: the built-in task's own, or math with a --data-format."""
    reward_timeout_s: Annotated[float, SECONDS] = 10.0
    """Longest one reward call may take on an actor; a call that raises or hangs scores 0 and is counted."""


@dataclass(kw_only=True, slots=True)
class StepConfig:
    """What each step asks of the actors."""

    prompts: Annotated[int, COUNT] = 32
    """Prompts per step."""


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """The GRPO loss, AdamW, and the supervised warm start before version 0 (built-in tasks only)."""

    lr: Annotated[float, Range(gt=0)] = 1e-6
    """AdamW learning rate of the RL steps, after the warm-up (1e-6 changes ~1% of an LLM's BF16 weights a step)."""
    warmup_steps: Annotated[int, NONNEGATIVE] = 0
    """Steps over which the learning rate rises linearly to --lr, then stays there."""
    max_grad_norm: Annotated[float, NONNEGATIVE] = 1.0
    """Clip the gradient's global norm to this (0: no clipping)."""
    clip: Annotated[float, Range(gt=0, le=1)] = 0.2
    """Importance ratios outside [1 - clip, 1 + clip] stop contributing gradient in the improving direction."""
    loss_norm: Literal["token", "sequence"] = "token"
    """token: every completion token weighs the same (DAPO, Dr. GRPO); sequence: each completion's mean over
    its tokens, then the mean over completions (GRPO)."""
    kl_coef: Annotated[float, NONNEGATIVE] = 0.0
    """Weight of the KL penalty to version 0 as published; 0 turns it off. On, it holds a second copy of the
    model (FP32 on CPU, the compute dtype on GPU) and a second forward pass per micro-batch."""
    rollout_correction: Literal["none", "tis", "mask"] = "none"
    """Correct for the engine sampling with other numerics than the trainer's: tis weighs each token by
    the truncated importance weight π_old/π_rollout (π_old: the trainer's own log-probability at the
    rollout's version), mask drops tokens whose weight is outside [1/cap, cap]; either measures the gap
    (mismatch metrics). Costs a frozen copy of the model and a forward pass per micro-batch. See docs/RL.md."""
    rollout_correction_cap: Annotated[float, Range(gt=1)] = 2.0
    """The rollout correction's cap on importance weights (> 1)."""
    micro_batch_tokens: Annotated[int, COUNT] = 16384
    """Token budget of one forward/backward micro-batch (padded rows x width); gradients accumulate over them."""
    sft_steps: Annotated[int, NONNEGATIVE] = 60
    """Supervised warm-start steps before version 0 (built-in tasks, which have demonstrations)."""
    sft_lr: Annotated[float, Range(gt=0)] = 3e-3
    """Learning rate of the warm start."""
    sft_batch: Annotated[int, COUNT] = 64
    """Demonstrations per warm-start step."""


@dataclass(kw_only=True, slots=True)
class PublishConfig:
    """How versions and resumable state go to the home bucket."""

    full_every: Annotated[int, COUNT] = 10
    """A full checkpoint every this many versions (or sooner, when a delta chain outgrows one)."""
    codec: Literal["classed", "sparse"] = "classed"
    """How deltas are coded: ``classed`` (positions within the parent's exponent classes, about 28%
    smaller; format aurora/3) or ``sparse`` (format aurora/2, for actors and relays on a release
    before aurora/3 while they are upgraded)."""
    dtype: Literal["bfloat16", "fp8-e4m3-block128", "int8-w8a8-channel"] = field(
        default="bfloat16", metadata=option(flag="--publish-dtype", aliases=("--dtype",))
    )
    """What each version's weights are published as, recorded in the run (aurora_run.json) for actors
    to build their engines from: ``bfloat16`` (every float tensor in BF16), or a quantization scheme
    (docs/FORMAT.md §6a) for the decoder's linear projections, everything else in BF16:
    ``fp8-e4m3-block128`` (E4M3 words, a scale per 128 x 128 block; what vLLM serves on GPUs) or
    ``int8-w8a8-channel`` (INT8 words, a scale per output channel; vLLM serves it on CPUs too). The
    trainer quantizes, deterministically; actors hold exactly the words and scales it published."""
    state_every: Annotated[int, COUNT] = 1
    """Save the resumable trainer state every this many versions (off the training thread, after each
    version's commit). With 1, a restart continues from exactly the latest version; with K > 1 it
    continues from the last saved state and the next version records the versions it abandons."""
    trust_unsigned_state: bool = False
    """Resume a signed run from an unsigned trainer state (format aurora-trainer-state/1, written by code
    from before states were signed). Off, a signed run never trusts one: anyone who can write the bucket
    can plant it. Give it once, to continue a run written by that code; every state saved after is signed."""
    signing_key: str | None = field(
        default=None, metadata=option(metavar="KEY", env="AURORA_SIGNING_KEY", file="signing_key")
    )
    """Sign every version with this Ed25519 private key (a PEM file, or PEM text in the environment;
    ``aurora keygen`` makes one). A run is signed or not from version 0 on: readers then refuse any
    version it did not sign."""
    rotate_signing_key: str | None = field(
        default=None, metadata=option(metavar="NEW_KEY", env="AURORA_ROTATE_SIGNING_KEY")
    )
    """Move the run to this new Ed25519 private key: the first version this trainer publishes is a key
    rotation, signed by ``signing_key`` (the run's key) and this one, and every version after it is
    signed by this one alone. Readers holding either public key verify the whole run
    (docs/OPERATIONS.md, "Rotating the signing key"). A restart with the option after the rotation
    just signs with the new key."""

    def __post_init__(self) -> None:
        for name in ("full_every", "state_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be a whole number of versions, at least 1; got {value!r}")

    @property
    def scheme(self) -> str | None:
        """The quantization scheme versions are published in, or None for BF16 weights."""
        return None if self.dtype == "bfloat16" else self.dtype

    @property
    def float_dtype(self) -> str:
        """The dtype of every float tensor published unquantized (all of them without a scheme)."""
        return "bfloat16"


@dataclass(kw_only=True, slots=True)
class ScheduleConfig:
    """Leases and the throughput-proportional split of each step's prompts."""

    lease_s: Annotated[float, SECONDS] = 30.0
    """Job lease length in seconds; an expired lease is given to another actor. An actor renews the leases
    of the jobs it is running, so a batch longer than this keeps them while its holder lives; one that stops
    renewing (killed, paused, cut off) loses them a lease after its last renewal."""
    max_hold_s: Annotated[float, SECONDS] = 1800.0
    """How long in all an actor may keep renewing a lease, in seconds: a batch still running then is leased
    again (a hung engine behind a living process holds its jobs no longer)."""
    alpha: Annotated[float, Range(gt=0, le=1)] = 0.5
    """Share multiplier for an actor that rejoined, until it finishes a batch (in (0, 1])."""
    sweep_s: Annotated[float, SECONDS] = 0.25
    """How often expired leases are re-leased and idle actors rebalanced, in seconds."""
    steal: bool = True
    """Idle eligible actors take over half of the not-yet-started jobs of the most loaded busy actor (one
    that has started a job and has others waiting)."""
    steal_after_s: Annotated[float, Range(ge=0, le=SECONDS.le)] = 2.0
    """Only jobs leased at least this long ago and not started are taken over (a job leased moments ago
    is on its way to its holder: moving it would race the holder and, under load, move it again)."""
    max_share: Annotated[float, Range(gt=0, le=1)] = 0.5
    """The largest fraction of the jobs placed at once that one actor gets while other actors are eligible
    (rounded up; what it would have had goes to the others by their throughput). In (0, 1]; 1: no cap."""
    backoff_s: Annotated[float, Range(ge=0, le=3600)] = 5.0
    """An actor whose lease expires without a result gets no new lease for this long, doubling with each
    further expiry (up to 10 min) until a result of its is admitted; until then it holds one job at a
    time. In [0, 3600]; 0: no backoff."""
    fetch_per_job: Annotated[float, Range(ge=1, le=1000)] = 4.0
    """Bytes of offloaded result payloads fetched per step: at most this many times the step's jobs times
    the largest payload one job can return (group x max new tokens); referenced payloads past it are
    dropped (``fetch_budget``) without a read. In [1, 1000]."""


@dataclass(kw_only=True, slots=True)
class TrainerConfig:
    """Everything ``aurora train`` needs."""

    store: str = field(metadata=option(file="home.uri"))
    """The home run's URI (any fsspec URI: s3://, gs://, file://, memory://)."""
    redis: str = field(metadata=option(env="AURORA_REDIS", file="redis"))
    """Redis URL: one server (``redis://``, ``rediss://``) or a Redis Cluster (``redis+cluster://host:port,...``)."""
    run_id: str = field(metadata=option(file="run_id"))
    """The run's name in Redis."""
    region: str = field(default="home", metadata=option(file="home.name"))
    """The home region's name in Redis."""
    storage_options: dict[str, Any] = field(
        default_factory=dict,
        metadata=option(metavar="JSON", env="AURORA_STORAGE_OPTIONS", file="home.storage_options"),
    )
    """fsspec storage options of the home bucket, as a JSON object (credentials belong in the environment)."""
    steps: Annotated[int, NONNEGATIVE] = 40
    """The last version to publish (version t is the policy after step t)."""
    admissions_log: str | None = field(default=None, metadata=option(metavar="PATH"))
    """Append one JSON line per admitted result to this file (trainer id, step, job, prompt id, actor, lease token
    and deadline, admission time, version, version hash, weights digest): an audit trail of what every
    step trained on."""
    result_regions: dict[str, Any] = field(
        default_factory=dict, metadata=option(metavar="JSON", env="AURORA_RESULT_REGIONS", file="other_regions")
    )
    """Other regions' buckets, as a JSON object ``{region: {"uri": URI, "storage_options": {...}}}``: actors
    there put result payloads too large for Redis in their own region's bucket, and the trainer reads them
    from it (the home region's is the trainer's own store). From a config file: every region's."""
    fleet_key: str | None = field(default=None, metadata=option(metavar="KEY", env="AURORA_FLEET_KEY"))
    """The fleet's Ed25519 public key (a PEM file, or PEM text in the environment): admit only results
    signed by actors holding a certificate it signed (``aurora actor-cert issue``). Without it results are
    not authenticated: anyone who can write Redis can submit in an actor's name (docs/SECURITY.md)."""
    revoked_actors: str | None = field(default=None, metadata=option(metavar="PATH"))
    """A revocation list (one ``serial:N`` or ``key:KEY_ID`` a line): results under these actor
    certificates are dropped. Read again within 5 s of a change, without a restart (needs --fleet-key)."""
    seed: Annotated[int, NONNEGATIVE] = 0
    """Seeds the model, the order of the data, the prompts of built-in tasks and the warm start."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: StepConfig = field(default_factory=StepConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Recorded in the run (aurora_run.json): actors sample as it says."""
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    metrics_port: Annotated[int | None, PORT] = None
    """Serve Prometheus metrics over HTTP on this port (/metrics; 0 or unset: off), on --metrics-addr;
    under torchrun each rank serves on this port plus its local rank."""
    metrics_addr: str = field(default=LOOPBACK, metadata=option(metavar="ADDR", env=ADDR_ENV))
    """The address --metrics-port binds: this host only by default; 0.0.0.0 (or one interface's address)
    for a Prometheus on another host, behind a firewall that lets only it in."""


@dataclass(kw_only=True, slots=True)
class DemoConfig:
    """``aurora demo``'s own options; the trainer's come from :class:`TrainerConfig`'s sections."""

    json: bool = False
    """End by printing one JSON object."""
    workdir: str | None = None
    """Where buckets, logs and the report go (default: a new directory under ./aurora-demo/, named for the
    time; a directory that holds an earlier demo's buckets is refused)."""
    redis: str | None = None
    """A real Redis URL (default: an embedded Redis-compatible server)."""
    store: list[str] | None = field(default=None, metadata=option(nargs=3, metavar="URI"))
    """Home and two regions' run URIs (default: local directories)."""
    slowdowns: str = "1,2,3.3"
    """Emulated slowness of the three actors (1 = full speed)."""
    actors: str = "home,eu,ap"
    """The regions that run an actor (comma-separated; every region gets its relay and is verified)."""
    engine: Literal["torch", "vllm"] = "torch"
    """The actors' rollout engine: torch, or vllm (vLLM installed in this Python: on a machine without a GPU,
    its CPU build, `make vllm-env`)."""


CONFIG_FILE = RoleSchema(
    command="train",
    cls=TrainerConfig,
    tables=(
        Table("trainer", ("",)),
        *(Table(s, (s,)) for s in ("model", "data", "reward", "rollout", "sampling", "optim", "publish", "schedule")),
    ),
    regions="home",
)
"""How ``aurora train --config aurora.toml`` reads the file: ``[trainer]`` holds the top-level options
(steps, seed, ...), and a table per section (``[model]``, ``[data]``, ...) that section's."""

DEMO_GIVES = frozenset({"store", "redis", "run_id", "region", "storage_options"})
"""The trainer options ``aurora demo`` sets itself."""

DEMO_RECIPE = {
    "steps": 250,
    "rollout.prompts": 64,
    "optim.lr": 1.2e-5,
    "optim.sft_steps": 100,
    "sampling.max_new_tokens": 4,
}
"""``aurora demo``'s defaults for the built-in tiny model, where real RL runs: sized so that on a
couple of CPU cores a delta stays a small fraction of a full copy and the reward rises by more
than twice its standard error within minutes (``tests/test_demo.py`` checks the rise; the README
gives a measured run)."""

REAL_GIVES = frozenset({"model.model", "data.data", "data.data_format", "data.prompt_field", "data.answer_field"})
"""The trainer options ``aurora demo-real`` sets itself: the model and the data set."""

REAL_RECIPE: dict[str, Any] = {
    "steps": 16,
    "rollout.prompts": 4,
    "sampling.group": 6,
    "sampling.max_new_tokens": 12,
    "sampling.temperature": 0.7,
    "optim.lr": 1e-4,
    "optim.rollout_correction": "tis",
    "reward.reward": "math",
    "optim.micro_batch_tokens": 2048,
}
"""``aurora demo-real``'s defaults: SmolLM2-135M-Instruct on one-digit word problems, sized for 2 CPU cores,
where the trainer's step (forward, backward and the rollout correction's forward over 24 sequences, ~17 s)
takes most of a step. The engines share the cores (a core each; this machine's AVX2 has no BF16 GEMM), so a
batch can take longer than a lease: its actor renews the leases while it runs."""

REAL_DEMO: dict[str, Any] = {"engine": "vllm", "slowdowns": "1,1,1", "actors": "home,eu"}
"""``aurora demo-real``'s demo options: two vLLM actors (home's and eu's; ap still gets every version by its
relay), no emulated slowness. Three engines and the trainer did not fit 2 cores and 24 GB: each engine holds
about 4 GB (worker, engine core, actor) and the trainer 7 GB, and the trainer was OOM-killed."""
