"""The RL loop with real processes: a trainer (``aurora train``), actors (``python -m actor.worker``),
a real redis-server and a bucket on disk. Faults: an actor killed mid-batch, a rogue actor
submitting under a forged version hash, a trainer killed and restarted, an actor paused
until it falls behind."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aurora_store.bucket.audit import audit
from aurora_store.bucket.run import open_run
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.jobs import JobBoard
from aurora_store.diagnostics import STACKS_SIGNAL
from aurora_store.format import results as payloads
from aurora_store.testing.processes import deadline, wait_for

REPO = Path(__file__).resolve().parents[1]
PROMPTS, GROUP = 8, 4
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
pytestmark = pytest.mark.slow


class Loop:
    """One run's processes; every one is stopped at the end of the test."""

    def __init__(self, tmp_path: Path, redis_url: str) -> None:
        self.tmp = tmp_path
        self.store = (tmp_path / "home").as_uri()
        self.admissions = tmp_path / "admissions.jsonl"
        """Every trainer's admissions log: the record of exactly-once (Redis keeps only the steps in flight)."""
        self.redis = redis_url
        self.run_id = "rl"
        self.coord = Coordinator(redis_url, self.run_id)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.redis_server: Any = None
        """The redis-server, which a test may restart."""
        self.env: dict[str, str] = {}
        """Added to every process's environment (AURORA_SIGNING_KEY, AURORA_VERIFY_KEY)."""
        self._log_of: dict[int, Path] = {}
        """Each process's log, by pid."""

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        p = subprocess.Popen([sys.executable, *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append(p)
        self._log_of[p.pid] = self.tmp / f"{name}.log"
        return p

    def _ask_for_stacks(self) -> None:
        """Every live role writes its threads' stacks to its log (SIGUSR1): waited for, up to 30 s (a role
        that dies of the signal, such as a torchrun launcher, writes none)."""
        asked = []
        for p in self.procs:
            if p.poll() is None:
                log = self._log_of[p.pid]
                asked.append((p, log, log.stat().st_size))
                p.send_signal(STACKS_SIGNAL)

        def written() -> bool:
            return all(
                p.poll() is not None or b"most recent call first" in log.read_bytes()[size:] for p, log, size in asked
            )

        with contextlib.suppress(AssertionError):  # what came is in the failure's logs either way
            wait_for(written, "every role's stacks", 30)

    def trainer(self, *extra: str) -> subprocess.Popen[bytes]:
        return self._spawn(
            "trainer",
            [
                "-m",
                "aurora_store.cli",
                "train",
                "--store",
                self.store,
                "--redis",
                self.redis,
                "--run-id",
                self.run_id,
                "--sft-steps",
                "40",
                "--prompts",
                str(PROMPTS),
                "--group",
                str(GROUP),
                "--lease-s",
                "20",
                "--state-every",
                "1",
                "--max-new-tokens",
                "4",
                "--lr",
                "5e-4",
                "--admissions-log",
                str(self.admissions),
                *extra,
            ],
        )

    def actor(self, wid: str, *extra: str) -> subprocess.Popen[bytes]:
        return self._spawn(
            wid,
            [
                "-m",
                "actor.worker",
                "--store",
                self.store,
                "--region",
                "home",
                "--redis",
                self.redis,
                "--run-id",
                self.run_id,
                "--worker-id",
                wid,
                "--heartbeat-s",
                "2",
                *extra,
            ],
        )

    def steps(self) -> list[dict[str, Any]]:
        return [doc for _id, doc in self.coord.notes("steps")]

    def jobs(self) -> dict[str, dict[str, str]]:
        keys = self.coord.r.keys(self.coord.key("job", "*"))
        return {k.rsplit(":job:", 1)[1]: self.coord.r.hgetall(k) for k in keys}

    def log(self, name: str, tail: int = 3000) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-tail:]

    def logs(self, tail: int = 3000) -> str:
        """Every role's log tail, for a failure's message."""
        return "\n".join(f"--- {p.stem} ---\n{self.log(p.stem, tail)}" for p in sorted(self.tmp.glob("*.log")))

    def wait(self, cond: Any, what: str, timeout: float) -> None:
        """Wait for an event (deadlines are generous: a loaded machine is slow, and
        AURORA_TEST_PATIENCE scales them); a timeout fails with every role's log tail."""
        try:
            wait_for(cond, what, timeout)
        except AssertionError as exc:
            pytest.fail(f"{exc}\n{self.logs()}")

    def finish(self, proc: subprocess.Popen[bytes], name: str, timeout: float = 420) -> None:
        """Wait for ``proc`` to exit 0. One that does not finish in time fails the test with every role's
        log, each ending in the stacks of its threads (SIGUSR1); the default leaves that failure time to
        be written before pytest's own timeout (600 s) ends the test without it."""
        try:
            rc = proc.wait(deadline(timeout))
        except subprocess.TimeoutExpired:
            self._ask_for_stacks()
            pytest.fail(f"{name} did not finish in {deadline(timeout):.0f} s:\n{self.logs(tail=20_000)}")
        assert rc == 0, f"{name} exited {rc}:\n{self.logs()}"

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait(10)


@pytest.fixture
def loop(tmp_path: Path, redis_server: Any) -> Iterator[Loop]:
    world = Loop(tmp_path, redis_server.url)
    world.redis_server = redis_server
    yield world
    world.stop()


def _admitted(loop: Loop) -> list[dict[str, Any]]:
    return [json.loads(line) for line in loop.admissions.read_text().splitlines()]


def _check_exactly_once(loop: Loop, steps: int) -> None:
    reports = loop.steps()
    assert [r["step"] for r in reports] == list(range(1, steps + 1))
    assert all(r["admitted"] == PROMPTS for r in reports), "every prompt of every step admitted once"
    for r in reports:  # the step's version lag is over its admitted results
        lag = r["version_lag"]
        assert lag["results"] == PROMPTS and 0 <= lag["p50"] <= lag["p99"] <= lag["max"] <= r["step"], r
    lines = _admitted(loop)
    per_trainer = Counter((a["trainer"], a["step"], a["job"]) for a in lines)
    assert max(per_trainer.values()) == 1, "no trainer admitted a job twice"
    for step in range(1, steps + 1):
        by = Counter(a["trainer"] for a in lines if a["step"] == step)
        assert PROMPTS in by.values() and max(by.values()) == PROMPTS, f"step {step}: {by}"
    jobs = loop.jobs()
    assert all(h["state"] == "admitted" for h in jobs.values() if int(h["step"]) <= steps)
    assert all(int(h["step"]) >= steps - 2 for h in jobs.values()), "older steps' jobs left Redis"


def test_a_role_sent_sigusr1_writes_its_threads_stacks_and_goes_on(loop: Loop) -> None:
    """What an operator (or this suite, when a role does not finish) asks a role that seems stuck."""
    trainer = loop.trainer("--steps", "2")
    loop.wait(lambda: "starts a new run" in loop.log("trainer"), "the trainer to start", 300)
    trainer.send_signal(STACKS_SIGNAL)
    loop.wait(lambda: "most recent call first" in loop.log("trainer", 20_000), "its threads' stacks in its log", 60)
    assert trainer.poll() is None, "it goes on"
    loop.actor("a")
    loop.finish(trainer, "trainer")


def test_actor_killed_mid_batch_and_forged_results(loop: Loop) -> None:
    rogue = "rogue"
    loop.coord.workers.register("actor", "home", worker_id=rogue, ttl_s=120)
    loop.coord.workers.update(rogue, version=0)
    trainer = loop.trainer("--steps", "5")
    slow = loop.actor("slow", "--slowdown", "100", "--batch", "2")  # alone at first: it must get work
    board = JobBoard(loop.coord)
    # the rogue takes what it is given and answers with a forged version hash, then leaves
    leases = []
    loop.wait(
        lambda: bool(leases.extend(board.take(rogue, max_jobs=64, block_s=0.2)) or leases), "the rogue's jobs", 900
    )
    forged = payloads.encode([([3], [-0.1], "stop", 1.0)] * GROUP, failures={}, weights_digest=None)
    for lease in leases:
        board.results.submit(lease, actor=rogue, version=lease.version, version_hash="0" * 64, payload=forged)
    loop.coord.workers.unregister(rogue)

    # kill the slow actor while it holds jobs it has taken and not answered
    def slow_busy() -> set[str]:
        return {
            j
            for j, h in loop.jobs().items()
            if h.get("actor") == "slow" and h.get("state") == "leased" and h.get("taken_token") == h.get("token")
        }

    loop.wait(lambda: bool(slow_busy()), "the slow actor to be mid-batch", 600)
    slow.kill()
    held = slow_busy()
    loop.actor("fast")
    loop.finish(trainer, "trainer")
    _check_exactly_once(loop, 5)
    dropped = loop.steps()[-1]["dropped"]
    assert dropped.get("wrong_version_hash", 0) == len(leases), dropped
    assert dropped.get("lease_lost", 0) >= 1, "the killed actor's leases were taken back"
    by_job = {a["job"]: a["actor"] for a in _admitted(loop)}
    assert held and all(by_job[j] == "fast" for j in held), "what the killed actor held was redone by the live one"


def test_a_batch_longer_than_its_lease_keeps_it_and_a_paused_holder_loses_it(loop: Loop) -> None:
    """A holder renews the leases of the jobs it runs: batches longer than ``--lease-s`` (up to several
    times) are admitted under the one lease each job got; once the holder stops (SIGSTOP: no heartbeat, no renewal)
    its jobs expire a lease later and another actor does them."""
    lease_ms = 2000
    trainer = loop.trainer("--steps", "2", "--lease-s", str(lease_ms / 1000))
    # ~12-40 ms of generation a batch here, x300: 3.6-12 s, one to six leases (longer under load, which is
    # why the test takes two steps, not more: each batch's time grows with the machine's load)
    slow = loop.actor("slow", "--slowdown", "300", "--batch", str(PROMPTS))
    loop.wait(lambda: len(loop.steps()) >= 1, "a step on the slow actor alone", 1200)
    assert loop.steps()[0]["dropped"].get("lease_lost", 0) == 0, loop.steps()[0]
    first = {j: h for j, h in loop.jobs().items() if h.get("step") == "1"}
    assert len(first) == PROMPTS and all(h["leases"] == "1" for h in first.values()), first
    held_ms = [int(h["admitted_ms"]) - int(h["taken_ms"]) for h in first.values()]
    assert all(int(h.get("renewals", 0)) >= 1 for h in first.values())
    # a batch lasts 300x its generation time: 3.6 s on a quiet machine here, 6-12 s loaded; what this proves
    # is that a job held longer than its lease (renewed) is admitted under the one lease it got
    assert max(held_ms) > lease_ms, f"a batch outlived its lease: {held_ms} ms"

    def slow_busy() -> set[str]:
        return {
            j
            for j, h in loop.jobs().items()
            if h.get("step") == "2" and h.get("actor") == "slow" and h.get("taken_token") == h.get("token")
        }

    loop.wait(lambda: bool(slow_busy()), "the slow actor to be mid-batch in step 2", 900)
    slow.send_signal(signal.SIGSTOP)
    held = slow_busy()
    loop.actor("fast")
    loop.finish(trainer, "trainer", timeout=900)
    _check_exactly_once(loop, 2)
    assert loop.steps()[-1]["dropped"].get("lease_lost", 0) >= 1, "the paused holder's leases expired"
    by_job = {a["job"]: a["actor"] for a in _admitted(loop)}
    assert all(by_job[j] == "fast" for j in held), (
        f"what the paused actor held was redone by the live one: {held} {by_job}\n{loop.log('slow')[-3000:]}"
    )


def test_trainer_killed_and_restarted_resumes_at_the_next_version(loop: Loop) -> None:
    """In a signed run: the keys reach every role from the environment, as PEM text. With a rollout
    correction, which keeps measuring the engine/trainer gap across the restart."""
    from aurora_store.format import signing

    private, public = signing.generate_keypair()
    loop.env = {"AURORA_SIGNING_KEY": private.decode(), "AURORA_VERIFY_KEY": public.decode()}
    actor = loop.actor("a")
    first = loop.trainer("--steps", "7", "--rollout-correction", "tis")
    run = open_run(loop.store, verify_key=public)
    loop.wait(lambda: (run.latest() or 0) >= 3, "version 3", 600)
    first.kill()
    first.wait(10)
    at_kill = open_run(loop.store, verify_key=public).latest()
    assert at_kill is not None
    second = loop.trainer("--steps", "7", "--rollout-correction", "tis")
    loop.finish(second, "trainer")
    run = open_run(loop.store, verify_key=public)
    assert run.versions() == list(range(8)), "no version skipped, none published twice"
    result = audit(run)
    assert result.ok and len(result.versions) == 8
    kid = signing.key_id(signing.load_verify_key(public))
    assert all(run.manifest(v).signature.key_id == kid for v in range(8))  # type: ignore[union-attr]
    assert run.manifest(0).run.signed_by == kid  # type: ignore[union-attr]
    after = [r["step"] for r in loop.steps() if r["step"] > at_kill]
    assert after == list(range(at_kill + 1, 8)), "the restarted trainer continued right after the last commit"
    trained = [r["stats"] for r in loop.steps() if r["stats"]["micro_batches"]]
    corrected = [s for s in trained if s["mismatch_abs"] is not None]
    # a step of rollouts from several versions has no one version to correct against: trained without
    # the correction, and said so; after the restart the rollouts' version is loaded from the run
    assert len(corrected) == len(trained) or "trained without the rollout correction" in loop.log("trainer")
    assert corrected and all(0 <= s["mismatch_abs"] < 0.05 for s in corrected), "torch engine and trainer agree"
    assert all(s["mismatch_kl"] is not None and s["corrected_frac"] is not None for s in corrected)
    # the state of the last version before the kill may not have been committed yet (it is saved
    # off the training thread): then the next version records the rollback to the state it used
    resumed = run.manifest(at_kill + 1).rolls_back_to
    assert f"resumes from the state of version {at_kill if resumed is None else resumed.version}" in loop.log("trainer")
    assert resumed is None or resumed.abandons == tuple(range(resumed.version + 1, at_kill + 1))
    # a SIGTERM stops the actor cleanly: no thread left reading from a client closed under it (issue 34)
    actor.send_signal(signal.SIGTERM)
    loop.finish(actor, "actor a after SIGTERM", timeout=120)
    said = loop.log("a")
    assert "Bad file descriptor" not in said and "Traceback" not in said, said


def test_a_trainer_killed_between_states_publishes_its_rollback(loop: Loop) -> None:
    """--state-every 4, SIGKILL once version 6 is committed, restart: the next version continues from
    version 4's state and says so (not silently from a chain that claims it descends from 6)."""
    loop.actor("a")
    first = loop.trainer("--steps", "9", "--state-every", "4")
    run = open_run(loop.store)
    loop.wait(lambda: (run.latest() or 0) >= 6, "version 6", 600)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    at_kill = open_run(loop.store).latest()
    assert at_kill is not None and at_kill >= 6
    saved = [v for v in open_run(loop.store).state.versions() if v <= at_kill]
    second = loop.trainer("--steps", "9", "--state-every", "4")
    loop.finish(second, "trainer")
    run = open_run(loop.store)
    assert run.versions() == list(range(10)) and audit(run).ok
    back = run.manifest(at_kill + 1).rolls_back_to
    if saved[-1] == at_kill:  # the kill came after version 8's state (the last step's) was committed
        assert back is None
    else:
        assert back is not None and back.version == saved[-1] and back.version % 4 == 0
        assert back.abandons == tuple(range(back.version + 1, at_kill + 1))
        assert back.version_hash == run.manifest(back.version).version_hash
    assert f"resumes from the state of version {saved[-1]}; latest committed version {at_kill}" in loop.log("trainer")


def test_redis_flushed_and_restarted_mid_run(loop: Loop) -> None:
    """Hole 7: FLUSHALL loses every job, lease, registration and region version without closing a
    connection. The trainer notices by the epoch and leases its unadmitted jobs again, the actor
    registers again. Then Redis goes away for two seconds and comes back empty: the trainer retries
    with backoff instead of exiting. Every prompt of every step is still admitted exactly once."""
    import json

    log = loop.tmp / "admissions.jsonl"
    trainer = loop.trainer("--steps", "8", "--admissions-log", str(log))
    loop.actor("a", "--slowdown", "5")
    run = open_run(loop.store)
    loop.wait(lambda: (run.latest() or 0) >= 2, "version 2", 600)
    loop.coord.r.flushall()
    loop.wait(lambda: (run.latest() or 0) >= 4, "version 4 after the flush", 600)
    loop.redis_server.kill()
    time.sleep(2)
    loop.redis_server.start()
    loop.finish(trainer, "trainer")
    assert run.versions() == list(range(9))
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    for step in range(1, 9):
        jobs = [r["job"] for r in rows if r["step"] == step]
        assert len(jobs) == PROMPTS == len(set(jobs)), f"step {step}: {jobs}"
    digests = {v: run.manifest(v).weights_digest for v in run.versions()}
    assert all(r["weights_digest"] == digests[r["version"]] for r in rows), "rollouts on committed weights"
    assert all(r["admitted_ms"] <= r["deadline_ms"] for r in rows), "no result admitted under an expired lease"
    trainer_log = loop.log("trainer")
    assert "lost its state" in trainer_log and "lost its state" in loop.log("a")
    assert trainer_log.count("Redis does not answer") == 1 and "Redis answers again" in trainer_log


def test_lagging_actor_catches_up_by_deltas_and_rejoins(loop: Loop) -> None:
    trainer = loop.trainer("--steps", "16", "--full-every", "100")  # fulls only where a chain outgrows one
    # steady is ten times slower, so a step lasts long enough for an actor that caught up to be handed work
    # (with both at full speed the tiny model's steps take ~40 ms, and the run can end before it is eligible)
    loop.actor("steady", "--slowdown", "10")
    lag = loop.actor("lag")
    run = open_run(loop.store)

    def lag_joined() -> bool:  # it must hold a version before it is paused, or it only bootstraps late
        return any(d["actor"] == "lag" for _id, d in loop.coord.notes("applied"))

    loop.wait(lambda: lag_joined() and (run.latest() or 0) >= 2, "the lagging actor to join, and version 2", 600)
    lag.send_signal(signal.SIGSTOP)  # a preempted host: no heartbeat, no progress
    paused_at = run.latest() or 0
    loop.wait(lambda: (run.latest() or 0) >= paused_at + 4, "the run to move on without it", 600)
    lag.send_signal(signal.SIGCONT)
    loop.finish(trainer, "trainer")
    applied = [d["version"] for _id, d in loop.coord.notes("applied") if d["actor"] == "lag"]
    jumps = [b - a for a, b in itertools.pairwise(applied)]
    assert max(jumps) >= 3, f"one apply carried it over several versions (delta catch-up): {applied}"
    caught_up = applied[jumps.index(max(jumps)) + 1]
    reports = loop.steps()
    behind = [r["shares"].get("lag", 0) for r in reports if paused_at + 3 <= r["step"] <= caught_up]
    after = [r["shares"].get("lag", 0) for r in reports if r["step"] > caught_up + 2]
    assert sum(behind) == 0, "no work while it was more than one version behind"
    assert after and sum(after) > 0, f"once it held v or v-1 again it got work: {applied}, {reports}"
    _check_exactly_once(loop, 16)


@pytest.mark.parametrize("kind", ["weights", "lora", "int8"], ids=["every-weight", "lora", "int8"])
def test_trainer_under_torchrun_with_fsdp2(loop: Loop, kind: str) -> None:
    """Two gloo ranks: FSDP2 shards the model, rank 0 runs the jobs, both publish their shards. A LoRA
    run (issue 36) shards the adapted model the same way: both ranks publish their share of the adapter
    alone, over the one base they agreed on. A run of INT8 weights (issue 37) gathers each projection
    to quantize it whole (rank 0 publishes it) and keeps the other tensors sharded."""
    lora = kind == "lora"
    adapter = {
        "weights": [],
        "lora": ["--lora-rank", "8", "--lora-alpha", "16", "--lora-targets", TARGETS, "--lr", "1e-2"],
        "int8": ["--publish-dtype", "int8-w8a8-channel"],
    }[kind]
    trainer = loop._spawn(
        "trainer",
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "aurora_store.cli",
            "train",
            "--store",
            loop.store,
            "--redis",
            loop.redis,
            "--run-id",
            loop.run_id,
            "--sft-steps",
            "60",
            "--prompts",
            str(PROMPTS),
            "--group",
            str(GROUP),
            "--steps",
            "3",
            "--state-every",
            "1",
            "--max-new-tokens",
            "4",
            "--admissions-log",
            str(loop.admissions),
            *adapter,
        ],
    )
    loop.actor("a")
    loop.finish(trainer, "trainer", timeout=900)
    run = open_run(loop.store)
    assert run.versions() == [0, 1, 2, 3] and audit(run).ok
    if lora:
        from aurora_store.bucket.lora_base import load_base
        from aurora_store.rl.runspec import NAME, RunSpec

        spec = RunSpec.from_bytes(run.reader.files(run.manifest(3), names={NAME}.__contains__)[NAME])
        assert spec.artefact.lora is not None and spec.artefact.lora.rank == 8
        load_base(run, run.manifest(3), spec.artefact.lora.base_files, spec.artefact.lora.base_digest)
        for v in range(4):
            names = {t.name for t in run.manifest(v).tensors}
            assert names and all(".lora_A." in n or ".lora_B." in n for n in names), f"version {v}: the adapter"
    if kind == "int8":
        for v in range(4):
            dtypes = {t.name: t.dtype for t in run.manifest(v).tensors}
            assert dtypes["model.layers.0.mlp.down_proj.weight"] == "I8", f"version {v}"
            assert dtypes["model.layers.0.mlp.down_proj.weight_scale"] == "F32"
            assert dtypes["model.embed_tokens.weight"] == "BF16"
        _same_as_one_process_quantizes(run, "int8-w8a8-channel")
    _check_exactly_once(loop, 3)
    # a step whose every group agreed on its rewards trains nothing: its delta is empty
    deltas = [m for m in map(run.manifest, (1, 2, 3)) if m.kind == "delta" and m.segments]
    assert deltas, "at least one delta version with changes"
    for m in deltas:
        ordinals = {int(seg.key.rsplit("/", 1)[1][:5]) % 2 for seg in m.segments}
        assert ordinals == {0, 1}, f"version {m.version}: segments from both ranks ({[s.key for s in m.segments]})"


def _same_as_one_process_quantizes(run: Any, scheme: str) -> None:
    """The latest version's words and scales are exactly what the scheme makes of the FP32 masters the
    trainer saved with it (its state at that version), however the trainer was sharded."""
    import numpy as np
    from safetensors.torch import load as st_load

    from aurora_store.quant import schemes
    from trainer.state import TENSORS

    latest = run.latest()
    state = next(n for n in run.state.names() if n.version == latest)
    masters = st_load(run.state.get(state, TENSORS, max_bytes=1 << 30))
    words = run.materialize_words(latest).words
    names = schemes.quantized_names(words)
    assert names
    for name in names:
        q = schemes.quantize(scheme, masters[f"model/{name}"].float().numpy())
        assert np.array_equal(words[name], q.words.reshape(-1)), name
        assert np.array_equal(words[schemes.scale_of(name, q.scale_name)].view(np.float32), q.scale.reshape(-1)), name


def test_a_quantized_run_trains_serves_and_resumes(loop: Loop) -> None:
    """Issue 37: ``--publish-dtype fp8-e4m3-block128`` publishes the projections as E4M3 words and block
    scales; the torch actor serves them (dequantized) and verifies every version it applies; a killed
    trainer resumes; the rollout correction compares the trainer's BF16 with the quantized rollouts;
    a trainer publishing BF16 cannot continue the run, and says what differs."""
    from aurora_store.rl.runspec import NAME, RunSpec

    fp8 = ("--publish-dtype", "fp8-e4m3-block128")
    actor = loop.actor("a", "--verify-live")
    first = loop.trainer("--steps", "4", "--rollout-correction", "tis", *fp8)
    run = open_run(loop.store)
    loop.wait(lambda: (run.latest() or 0) >= 2, "version 2", 600)
    first.kill()
    first.wait(10)
    second = loop.trainer("--steps", "4", "--rollout-correction", "tis", *fp8)
    loop.finish(second, "trainer")
    run = open_run(loop.store)
    assert run.versions() == list(range(5)) and audit(run).ok
    spec = RunSpec.from_bytes(run.reader.files(run.manifest(4), names={NAME}.__contains__)[NAME])
    assert (spec.artefact.kind, spec.artefact.scheme) == ("quantized", "fp8-e4m3-block128")
    for v in range(5):
        dtypes = {t.name: t.dtype for t in run.manifest(v).tensors}
        assert dtypes["model.layers.1.self_attn.q_proj.weight"] == "F8_E4M3", f"version {v}"
        assert dtypes["model.layers.1.self_attn.q_proj.weight_scale_inv"] == "F32"
        assert dtypes["model.norm.weight"] == "BF16"
    _same_as_one_process_quantizes(run, "fp8-e4m3-block128")
    trained = [r["stats"] for r in loop.steps() if r["stats"]["micro_batches"]]
    corrected = [s for s in trained if s["mismatch_abs"] is not None]
    assert corrected and all(math.isfinite(s["mismatch_abs"]) for s in corrected), "the mismatch is measured"
    third = loop.trainer("--steps", "5")
    assert third.wait(deadline(300)) != 0
    assert "this run was started with other settings (artefact:" in loop.log("trainer")
    actor.send_signal(signal.SIGTERM)
    loop.finish(actor, "actor a after SIGTERM", timeout=120)  # a verification that failed would have stopped it
    assert "live weights verified at version" in loop.log("a") and "Traceback" not in loop.log("a")


def test_an_idle_actor_holds_one_connection_and_beats_on_it(loop: Loop) -> None:
    """Issue 41: once a run's work is done, an actor holds one Redis connection (its listener's: the
    ones it opened to claim, renew and submit are closed when it falls idle), and beats on it, one
    ZADD a beat, its expiry moving on while nothing else runs."""
    actor = loop.actor("idle")
    loop.finish(loop.trainer("--steps", "2"), "trainer")
    r = loop.coord.r

    def conns() -> list[dict[str, Any]]:
        return [c for c in r.client_list() if c.get("name") == "aurora-actor-idle"]

    loop.wait(lambda: len(conns()) == 1, "the idle actor to hold one connection", 120)
    expiries: list[float] = []

    def beats() -> bool:
        held = conns()
        assert len(held) == 1, f"an idle actor holds one connection, it holds {held}"
        assert held[0]["cmd"] in ("xread", "zadd", "evalsha"), held[0]
        expiry = r.zscore(loop.coord.key("alive"), "idle")
        if expiry is not None and (not expiries or expiry != expiries[-1]):
            expiries.append(expiry)
        return len(expiries) >= 4

    loop.wait(beats, "three beats of the idle actor", 120)
    assert expiries == sorted(expiries)
    actor.send_signal(signal.SIGTERM)
    loop.finish(actor, "actor after SIGTERM", timeout=120)


def test_an_actor_redis_turns_away_says_so_once_and_joins_when_it_can(loop: Loop) -> None:
    """Issue 41: Redis refuses an actor (its ``maxclients`` reached): the actor says so in one line, retries
    with jittered backoff (no crash, no line per try), and joins once Redis has room; the run completes.
    Its metrics count it among the actors that could not join while it could not (``aurora_actor_joined``
    0, refusals counted by reason): the Redis that refuses it cannot be told."""
    from aurora_store.testing.processes import free_port
    from tests.monitoring import scrape, value

    trainer = loop.trainer("--steps", "2")
    loop.wait(lambda: "wait for an actor holding version 0" in loop.log("trainer"), "the trainer's version 0", 600)
    r = loop.coord.r
    r.config_set("maxclients", int(r.info("clients")["connected_clients"]))  # no room for one more
    refused = int(r.info("stats")["rejected_connections"])
    port = free_port()
    try:
        late = loop.actor("late", "--metrics-port", str(port))
        loop.wait(lambda: int(r.info("stats")["rejected_connections"]) >= refused + 3, "three refused tries", 300)
        shut_out: list[float] = []

        def counted() -> bool:
            try:
                samples = scrape(port)
            except OSError:
                return False  # not serving yet
            shut_out[:] = [
                value(samples, "aurora_actor_joined", actor="late"),
                value(samples, "aurora_actor_redis_failures_total", actor="late", reason="maxclients"),
            ]
            return shut_out[1] >= 1

        loop.wait(counted, "the refusals in the actor's metrics", 300)
        assert shut_out[0] == 0, "not joined while Redis turns it away"
    finally:
        r.config_set("maxclients", 10_000)
    assert late.poll() is None, "refused, the actor waits; it does not crash"
    loop.wait(lambda: value(scrape(port), "aurora_actor_joined", actor="late") == 1, "the actor to join", 300)
    loop.finish(trainer, "trainer")  # the actor joined and served the run
    said = loop.log("late")
    assert said.count("Redis turned it away (max number of clients reached)") == 1, said
    assert "Redis serves it again after" in said and "Traceback" not in said
    late.send_signal(signal.SIGTERM)
    loop.finish(late, "actor after SIGTERM", timeout=120)


def test_an_actor_stopped_while_cut_off_from_redis_says_what_it_could_not_give_back(loop: Loop) -> None:
    """Issue 39: SIGTERM reaches an actor mid-batch while its Redis is unreachable. It exits 0, and its
    last words name the leases it could not give back and when they expire on their own (the trainer
    leases those jobs again then), not a bare 'Connection closed by server'."""
    loop.trainer("--steps", "3")
    slow = loop.actor("slow", "--slowdown", "100", "--batch", "2")

    def busy() -> set[str]:
        return {j for j, h in loop.jobs().items() if h.get("actor") == "slow" and h.get("state") == "leased"}

    loop.wait(lambda: bool(busy()), "the slow actor to be mid-batch", 900)
    held = busy()
    loop.redis_server.kill()
    slow.send_signal(signal.SIGTERM)
    try:
        rc = slow.wait(deadline(120))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the actor did not stop:\n{loop.logs()}")
    said = loop.log("slow")
    assert rc == 0, said
    last = [line for line in said.splitlines() if "stopped without reaching Redis" in line]
    assert last, said
    assert "leases not given back" in last[-1] and "expire by" in last[-1], last[-1]
    assert any(job in last[-1] for job in held), (held, last[-1])


def test_a_lora_run_trains_serves_and_resumes_its_adapter(loop: Loop) -> None:
    """Issue 36: ``--lora-rank`` trains a PEFT adapter over a frozen base the run carries; the actor
    serves it on the torch engine; a killed trainer resumes the adapter (and its optimizer) from its
    state over the base it reads back from the run; every version holds the adapter alone."""
    import torch

    from aurora_store.bucket.lora_base import load_base
    from aurora_store.rl.runspec import NAME, RunSpec
    from tests.helpers import bits_equal

    lora = ("--lora-rank", "8", "--lora-alpha", "16", "--lora-targets", TARGETS, "--lr", "1e-2")
    actor = loop.actor("a")
    first = loop.trainer("--steps", "5", "--rollout-correction", "tis", "--kl-coef", "0.01", *lora)
    run = open_run(loop.store)
    loop.wait(lambda: (run.latest() or 0) >= 2, "version 2", 600)
    first.kill()
    first.wait(10)
    second = loop.trainer("--steps", "5", "--rollout-correction", "tis", "--kl-coef", "0.01", *lora)
    loop.finish(second, "trainer")
    run = open_run(loop.store)
    assert run.versions() == list(range(6)) and audit(run).ok
    spec = RunSpec.from_bytes(run.reader.files(run.manifest(5), names={NAME}.__contains__)[NAME])
    assert spec.artefact.kind == "lora" and spec.artefact.lora is not None
    adapter = spec.artefact.lora
    assert (adapter.rank, adapter.alpha, ",".join(adapter.targets)) == (8, 16.0, TARGETS)
    for v in range(6):
        names = {t.name for t in run.manifest(v).tensors}
        assert names and all(".lora_A." in n or ".lora_B." in n for n in names), f"version {v} holds the adapter"
    load_base(run, run.manifest(5), adapter.base_files, adapter.base_digest)  # the base, as the run names it
    # a trainer state saves what training changes: the adapter and its moments, not the frozen base again
    from safetensors.torch import load as st_load

    from trainer.state import TENSORS

    state = next(n for n in run.state.names() if n.version == 5)
    saved = st_load(run.state.get(state, TENSORS, max_bytes=1 << 30))
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved), sorted(saved)[:3]
    assert {k for k in saved if k.startswith("opt/")}, "the adapter's moments"
    # the warm start trained the base; the adapter starts at PEFT's initialisation (B zero) and RL moves it
    b0 = {k: t for k, t in run.materialize(0).items() if ".lora_B." in k}
    assert b0 and bits_equal(b0, {k: torch.zeros_like(t) for k, t in b0.items()})
    assert any(run.manifest(v).stats.changed for v in range(1, 6)), "some step moved the adapter"
    trained = [r["stats"] for r in loop.steps() if r["stats"]["micro_batches"]]
    corrected = [s for s in trained if s["mismatch_abs"] is not None]
    assert corrected and all(0 <= s["mismatch_abs"] < 0.05 for s in corrected), "torch engine and trainer agree"
    # a trainer that would train every weight cannot continue it, and says why
    third = loop.trainer("--steps", "6")
    assert third.wait(deadline(300)) != 0
    assert "this run publishes a LoRA adapter; a trainer with no --lora-rank cannot continue it" in loop.log("trainer")
    actor.send_signal(signal.SIGTERM)
    loop.finish(actor, "actor a after SIGTERM", timeout=120)
    assert "Traceback" not in loop.log("a")
