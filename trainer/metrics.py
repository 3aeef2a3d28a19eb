"""The trainer's Prometheus metrics: the version it published, step and publish times, and what the
dispatcher admitted, dropped and leased again.

Bytes uploaded are the common ``aurora_bucket_bytes_total`` (``bucket="home"``). The dispatcher's
counts (results admitted and dropped by reason, leases taken back, jobs stolen) are read at scrape
time from what it keeps anyway. Under torchrun every rank serves its own (``--metrics-port`` plus
its local rank); only rank 0 dispatches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aurora_store.metrics import Metrics, Spec

if TYPE_CHECKING:
    from aurora_store.coord.coordinator import Coordinator
    from trainer.dispatch import Dispatcher
    from trainer.lag import VersionLag
    from trainer.state import SaveCost

PUBLISHED_VERSION = Spec(
    "aurora_trainer_published_version",
    "gauge",
    "The latest version the trainer committed in its home region.",
    ("region",),
)
STEPS = Spec("aurora_trainer_steps_total", "counter", "RL steps done (each publishes one version).")
PUBLISH_SECONDS = Spec(
    "aurora_trainer_publish_seconds",
    "histogram",
    "Time to publish one version after its step: extract the delta (or full), upload, commit the manifest.",
)
TRAIN_SECONDS = Spec("aurora_trainer_train_seconds", "histogram", "Time of one optimizer step on its rollouts.")
WAIT_SECONDS = Spec(
    "aurora_trainer_rollout_wait_seconds",
    "histogram",
    "Time a step waited until every prompt of it had an admitted result.",
)
ADMITTED = Spec("aurora_trainer_results_admitted_total", "counter", "Results admitted (one per prompt of a step).")
DROPPED = Spec(
    "aurora_trainer_results_dropped_total",
    "counter",
    "Results dropped, by reason: stale_lease, expired, wrong_actor, wrong_version, wrong_version_hash, "
    "wrong_digest, bad_payload, rewards_crashed, duplicate, unknown_job, what made the entry malformed, or, "
    "with a fleet key, why the result is not from a certified actor (unsigned, bad_cert, uncertified, "
    "revoked, cert_expired, cert_not_yet_valid, wrong_cert_run, wrong_cert_actor, bad_signature).",
    ("reason",),
)
LEASES_EXPIRED = Spec(
    "aurora_trainer_leases_expired_total",
    "counter",
    "Leases taken back and leased again: their deadline passed (or their actor gave them back) or their "
    "actor stopped beating.",
)
STOLEN = Spec(
    "aurora_trainer_jobs_stolen_total",
    "counter",
    "Not-yet-started jobs moved from the most loaded actor to an idle one.",
)
PENDING = Spec("aurora_trainer_pending_jobs", "gauge", "Prompts waiting for an eligible actor to be leased to.")
REWARD_FAILURES = Spec(
    "aurora_trainer_reward_failures_total",
    "counter",
    "Reward calls that failed on the actors (scored 0) in admitted results, by kind.",
    ("kind",),
)
ADMISSION_CPU = Spec(
    "aurora_trainer_admission_cpu_seconds_total",
    "counter",
    "CPU seconds the admission thread spent decoding and checking result payloads.",
)
ADMISSION_TOKENS = Spec(
    "aurora_trainer_admission_tokens_total",
    "counter",
    "Completion tokens decoded and checked (admission tokens/s: its rate over the CPU seconds' rate).",
)
PAYLOAD_FETCHED = Spec(
    "aurora_trainer_payload_fetched_bytes_total",
    "counter",
    "Bytes of result payloads fetched from regions' buckets (those too large to go through Redis).",
)
ROLLOUT_MISMATCH = Spec(
    "aurora_trainer_rollout_mismatch",
    "gauge",
    "The last trained step's gap between the engine's log-probabilities and the trainer's at the rollout's "
    "weights (--rollout-correction tis|mask): measure=abs is the mean |Δ log p| per token, measure=kl the "
    "sequence-level KL(rollout ‖ trainer), measure=corrected the fraction of tokens truncated or dropped.",
    ("measure",),
)
VERSION_LAG = Spec(
    "aurora_trainer_result_version_lag",
    "gauge",
    "The last step's admitted results' version lag (the latest version published when the step trained minus "
    "the version each result was generated with), stat=p50|p99|max over its results.",
    ("stat",),
)
STATE_SAVES = Spec(
    "aurora_trainer_state_saves_total",
    "counter",
    "Trainer states committed (one per --state-every versions), saved off the training thread.",
)
STATE_FAILURES = Spec(
    "aurora_trainer_state_failures_total",
    "counter",
    "Trainer states that could not be saved (a restart then continues from an older one and records a rollback).",
)
STATE_BLOCKED_SECONDS = Spec(
    "aurora_trainer_state_blocked_seconds_total",
    "counter",
    "Seconds the training thread spent on saving states: capturing them and waiting for the writer's copy.",
)
STATE_BYTES = Spec("aurora_trainer_state_bytes_total", "counter", "Bytes of trainer states written.")
ROLLBACKS = Spec(
    "aurora_trainer_rollbacks_total",
    "counter",
    "Versions published after a restart from an older state than their parent's (they record rolls_back_to).",
)
ABANDONED = Spec(
    "aurora_trainer_abandoned_versions_total",
    "counter",
    "Versions whose training a rollback abandoned (the steps a restart could not continue from).",
)
SPECS = (
    PUBLISHED_VERSION,
    STEPS,
    PUBLISH_SECONDS,
    TRAIN_SECONDS,
    WAIT_SECONDS,
    ADMITTED,
    DROPPED,
    LEASES_EXPIRED,
    STOLEN,
    PENDING,
    REWARD_FAILURES,
    ADMISSION_CPU,
    ADMISSION_TOKENS,
    PAYLOAD_FETCHED,
    ROLLOUT_MISMATCH,
    VERSION_LAG,
    STATE_SAVES,
    STATE_FAILURES,
    STATE_BLOCKED_SECONDS,
    STATE_BYTES,
    ROLLBACKS,
    ABANDONED,
)


class TrainerMetrics:
    """One trainer process's metrics; the loop feeds them once per step."""

    def __init__(self, region: str) -> None:
        self.m = Metrics("trainer", region, SPECS)
        self._version = self.m.gauge(PUBLISHED_VERSION).labels(region)
        self._steps = self.m.counter(STEPS)
        self._publish = self.m.histogram(PUBLISH_SECONDS)
        self._train = self.m.histogram(TRAIN_SECONDS)
        self._wait = self.m.histogram(WAIT_SECONDS)
        self._mismatch = self.m.gauge(ROLLOUT_MISMATCH)
        self._lag = self.m.gauge(VERSION_LAG)
        self._rollbacks = self.m.counter(ROLLBACKS)
        self._abandoned = self.m.counter(ABANDONED)

    def watch(self, coord: Coordinator) -> None:
        self.m.redis_skipped(coord.skipped.snapshot)

    def watch_dispatch(self, d: Dispatcher) -> None:
        """Export the dispatcher's own counts (read at scrape time; rank 0 only)."""
        self.m.pull(ADMITTED, lambda: d.admitted_total)
        self.m.pull(DROPPED, d.drops.snapshot)
        self.m.pull(LEASES_EXPIRED, lambda: d.dropped.get("lease_lost", 0))
        self.m.pull(STOLEN, lambda: d.leases.stolen)
        self.m.pull(PENDING, lambda: len(d.leases.pending))
        self.m.pull(REWARD_FAILURES, lambda: dict(d.reward_failures))  # one C-level copy: no torn read
        self.m.pull(ADMISSION_CPU, lambda: d.payloads.cpu_s)
        self.m.pull(ADMISSION_TOKENS, lambda: d.payloads.tokens)
        self.m.pull(PAYLOAD_FETCHED, lambda: d.payloads.fetched_bytes)

    def watch_states(self, cost: SaveCost) -> None:
        """Export what saving trainer states has cost (read at scrape time)."""
        self.m.pull(STATE_SAVES, lambda: cost.saves)
        self.m.pull(STATE_FAILURES, lambda: cost.failed)
        self.m.pull(STATE_BLOCKED_SECONDS, lambda: cost.training_thread_s)
        self.m.pull(STATE_BYTES, lambda: cost.bytes)

    def rolled_back(self, abandoned: int) -> None:
        self._rollbacks.inc()
        self._abandoned.inc(abandoned)

    def published(self, version: int) -> None:
        self._version.set(version)

    def step(
        self,
        *,
        version: int,
        publish_s: float,
        train_s: float,
        wait_s: float,
        mismatch: dict[str, float | None],
        lag: VersionLag | None = None,
    ) -> None:
        """One step done; ``mismatch``: the rollout correction's measures (None where not measured); ``lag``:
        its results' version lag (rank 0's; None on the other ranks)."""
        if lag is not None and lag.results:
            for stat in ("p50", "p99", "max"):
                self._lag.labels(stat).set(getattr(lag, stat))
        for measure, value in mismatch.items():
            if value is not None:
                self._mismatch.labels(measure).set(value)
        self._steps.inc()
        self._publish.observe(publish_s)
        self._train.observe(train_s)
        self._wait.observe(wait_s)
        self.published(version)
