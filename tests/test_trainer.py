"""Trainer pieces on real Redis and real tensors: gating, rebalancing, payload checks, GRPO math,
resumable state, and that the actor's log-probabilities are the trainer's."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import random
import uuid
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from actor.engines.torch import TorchEngine
from aurora_store.bucket.run import open_run
from aurora_store.bucket.state import StateName
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.results import Result
from aurora_store.errors import CorruptError, MissingError, StoreError
from aurora_store.format import results as payloads
from aurora_store.rl.errors import ModelError
from aurora_store.rl.models import build_model, tiny_config
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tasks import Prompt, TaskError, load_task
from aurora_store.rl.tokenizers import EOS, CharTokenizer
from trainer.config import ScheduleConfig
from trainer.dispatch import Dispatcher
from trainer.grpo import GRPOConfig, Sample, advantages, batch, loss, token_logprobs
from trainer.publication import ModelPublisher
from trainer.state import load_state, save_state, saved_versions

TOK = CharTokenizer()
GRPO = GRPOConfig(clip=0.2, kl_coef=0.0, temperature=1.0)


def tiny(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return build_model(tiny_config(TOK.vocab_size, hidden=32, layers=1, heads=2, kv_heads=1), seed=seed, dtype=dtype)


@pytest.fixture
def trainer(redis_server: Any) -> Dispatcher:
    coord = Coordinator(redis_server.url, f"t-{uuid.uuid4().hex[:6]}")
    d = Dispatcher(
        coord,
        JobBoard(coord),
        schedule=ScheduleConfig(),
        sampling=SamplingConfig(group=2, max_new_tokens=4),
        vocab_size=TOK.vocab_size,
        tag="t",
    )
    for v in range(3):  # versions 0..2 published (their digests unknown: "")
        d.published_version(v, str(v) * 64, "")
    return d


def actor(t: Dispatcher, wid: str, version: int, *, alive: bool = True, role: str = "actor") -> None:
    t.coord.workers.register(role, "home", worker_id=wid, ttl_s=30)
    t.coord.workers.update(wid, version=version)
    if not alive:
        t.coord.r.zrem(t.coord.key("alive"), wid)


def test_only_live_actors_holding_v_or_v_minus_1_are_eligible(trainer: Dispatcher) -> None:
    actor(trainer, "latest", 2)
    actor(trainer, "one-behind", 1)
    actor(trainer, "two-behind", 0)
    actor(trainer, "dead", 2, alive=False)
    actor(trainer, "relay-eu", 2, role="relay")
    trainer.coord.r.hset(trainer.coord.key("workers"), "old", json.dumps({"role": "actor", "version": 2}))
    trainer.coord.workers.heartbeat("old", 30)  # alive, but an actor of before push: no protocol, no work
    trainer.leases.roster.refresh()
    assert set(trainer.leases.eligible()) == {"latest", "one-behind"}


def test_idle_actor_takes_half_of_the_unstarted_jobs(trainer: Dispatcher) -> None:
    actor(trainer, "busy", 2)
    trainer.post(3, [Prompt(f"p{i}", f"{i}+1=", str(i + 1)) for i in range(6)])
    started = trainer.board.take("busy", max_jobs=2, block_s=0.1)  # two are under way
    actor(trainer, "idle", 2)
    trainer.leases.sweep()
    assert trainer.leases.stolen == 0, "jobs leased moments ago are on their way to their holder: not moved"
    trainer.leases.schedule = dataclasses.replace(trainer.leases.schedule, steal_after_s=0.0)
    trainer.leases.sweep()
    holders = {j.job: j.actor for j in trainer.board.open_jobs()}
    assert sorted(holders.values()).count("idle") == 2, "half of the four unstarted ones"
    assert all(holders[lease.job] == "busy" for lease in started), "started work is never taken away"
    assert trainer.leases.stolen == 2 and trainer.leases.holder == holders


def test_a_sweep_costs_the_same_round_trips_whatever_the_fleet(trainer: Dispatcher, redis_server: Any) -> None:
    import redis

    probe = redis.Redis(port=redis_server.port)

    def trips() -> int:
        return sum(v["calls"] for v in probe.info("commandstats").values())  # type: ignore[union-attr]

    costs = []
    for n in (4, 200):
        for i in range(n):
            actor(trainer, f"a{n}-{i}", 2)
        trainer.post(n, [Prompt(f"p{i}", "q", "a") for i in range(n)])
        trainer.leases.sweep()  # reads the new registrations once
        before = trips()
        trainer.leases.sweep()
        costs.append(trips() - before - 1)
    # at 204 actors some hold no job: one more read, of the unstarted jobs an idle actor might take over
    assert costs[1] <= costs[0] + 1 and max(costs) <= 12, f"a quiet sweep's commands (scripts' inside too): {costs}"


G = 2
DIGEST = "d" * 32


def payload(rows: list[tuple[list[int], list[float], str, float]], failures: dict[str, int] | None = None) -> bytes:
    return payloads.encode(rows, failures=failures or {}, weights_digest=DIGEST)


GOOD = ([5, EOS], [-0.5, -0.1], "stop", 1.0)


def verdict(t: Dispatcher, data: bytes) -> str | None:
    t.digests[0] = DIGEST
    ((_, why),) = t.payloads.decode_all([Result("1-0", "j", 1, "a", 0, "0" * 64, inline=data)])
    return why


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"{json: no}",
        payload([GOOD]),  # one completion, group is 2
        payload([GOOD, ([], [], "stop", 0.0)]),
        payload([GOOD, ([5] * 5, [-1.0] * 5, "length", 0.0)]),  # over max_new_tokens
        payload([GOOD, ([TOK.vocab_size], [-1.0], "stop", 0.0)]),
        payload([GOOD, ([-1], [-1.0], "stop", 0.0)]),
        payload([GOOD, ([5, EOS], [0.5, -0.1], "stop", 0.0)]),
        payload([GOOD, ([5, EOS], [math.nan, -0.1], "stop", 0.0)]),
        payload([GOOD, GOOD], {"error": 3}),  # more failures than completions
        payload([GOOD, GOOD])[:-1],
    ],
)
def test_hostile_payloads_are_refused(trainer: Dispatcher, bad: bytes) -> None:
    assert verdict(trainer, bad) == "bad_payload"
    assert verdict(trainer, payload([GOOD, GOOD])) is None
    assert verdict(trainer, payload([GOOD, GOOD], {"timeout": 2})) is None


def test_a_payload_from_other_weights_is_refused(trainer: Dispatcher) -> None:
    other = payloads.encode([GOOD, GOOD], failures={}, weights_digest="e" * 32)
    assert verdict(trainer, other) == "wrong_digest"


def test_advantages() -> None:
    assert advantages([1, 1, 1, 1]) == [0.0] * 4, "no signal in a group that all agrees"
    a = advantages([1, 0, 0, 0])
    assert a[0] > 0 > a[1] and abs(sum(a)) < 1e-9
    assert advantages([0.5]) == [0.0]


def test_grpo_step_raises_the_logprob_of_a_rewarded_completion() -> None:
    torch.manual_seed(0)
    model = tiny()
    prompt = tuple(TOK.encode("3+4="))
    good, bad = (10, EOS), (11, EOS)
    ids, attn, _comp, _ = batch([Sample(prompt, good, (0.0, 0.0), 1.0), Sample(prompt, bad, (0.0, 0.0), 0.0)])
    with torch.no_grad():
        before = token_logprobs(model, ids, attn, 1.0)
    samples = [
        Sample(prompt, t, tuple(before[i, len(prompt) - 1 : len(prompt) + 1].tolist()), r)
        for i, (t, r) in enumerate(((good, 1.0), (bad, 0.0)))
    ]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    value, sums = loss(model, samples, advantages([1.0, 0.0]), GRPO)
    assert sums.drift / sums.tokens < 1e-6, "on-policy: the ratio starts at 1"
    value.backward()
    opt.step()
    with torch.no_grad():
        after = token_logprobs(model, ids, attn, 1.0)
    p = len(prompt) - 1
    assert after[0, p] > before[0, p] and after[1, p] < before[1, p]


def test_logits_are_computed_only_where_completions_are_scored() -> None:
    """token_logprobs from a start position, where the model computes only those positions' logits
    (transformers' logits_to_keep), equals the same slice of the full computation."""
    model = tiny()
    assert "logits_to_keep" in inspect.signature(model.forward).parameters
    prompts = [tuple(TOK.encode("12+30=")), tuple(TOK.encode("7+8="))]
    samples = [Sample(p, (10, 11, EOS), (-1.0, -2.0, -0.5), r) for p, r in zip(prompts, (1.0, 0.0), strict=True)]
    ids, attn, _, _ = batch(samples)
    start = min(len(p) for p in prompts) - 1
    with torch.no_grad():
        full = token_logprobs(model, ids, attn, 0.7)
        part = token_logprobs(model, ids, attn, 0.7, start)
    assert part.shape == full[:, start:].shape
    torch.testing.assert_close(part, full[:, start:], rtol=0, atol=1e-5)


def test_clipped_ratio_gives_no_gradient_past_the_clip() -> None:
    model = tiny()
    prompt = tuple(TOK.encode("1+1="))
    ids, attn, _, _ = batch([Sample(prompt, (5,), (0.0,), 1.0)])
    with torch.no_grad():
        lp = float(token_logprobs(model, ids, attn, 1.0)[0, len(prompt) - 1])
    stale = Sample(prompt, (5,), (lp - 1.0,), 1.0)  # ratio e ≈ 2.7, beyond 1 + 0.2, advantage > 0
    value, sums = loss(model, [stale, Sample(prompt, (6,), (lp,), 0.0)], [1.0, 0.0], GRPO)
    value.backward()
    assert sums.clipped > 0
    assert all(p.grad is None or float(p.grad.abs().max()) == 0 for p in model.parameters())


def test_actor_logprobs_are_the_trainers() -> None:
    """The engine's sampled-token log-probabilities equal the trainer's for the same weights, so an
    on-policy importance ratio is 1 (prompts of different lengths, so several buckets)."""
    model = tiny(seed=3)
    engine = TorchEngine(model)
    prompts = [TOK.encode(t) for t in ("1+2=", "12+30=", "7+8=")]
    outs = engine.generate(prompts, samples=3, max_new_tokens=4, temperature=0.7, seed=1)
    samples = [Sample(tuple(p), c.token_ids, c.logprobs, 0.0) for p, cs in zip(prompts, outs, strict=True) for c in cs]
    assert all(len(cs) == 3 for cs in outs)
    assert all(c.finish_reason == ("stop" if c.token_ids[-1] == EOS else "length") for cs in outs for c in cs)
    _, sums = loss(model, samples, [0.0] * len(samples), GRPOConfig(clip=0.2, kl_coef=0.0, temperature=0.7))
    assert sums.drift / sums.tokens < 1e-5


def test_state_round_trip_and_refusals() -> None:
    run = open_run(f"memory://state-{uuid.uuid4().hex}/run")
    model, rng = tiny(seed=1), random.Random(5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    publisher = ModelPublisher(run, model)
    publisher.publish()
    model(input_ids=torch.tensor([[1, 5, 6]])).logits.sum().backward()
    opt.step()
    publisher.publish()
    rng.random()
    save_state(run, 1, model, opt, rng, {"note": "x"})
    expect_next = rng.random()
    assert saved_versions(run) == [1]

    model2, rng2 = tiny(seed=2), random.Random(0)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    saved = load_state(run, 1, model2, opt2, rng2)
    assert saved.extra == {"note": "x"} and rng2.random() == expect_next
    for (n, a), (_, b) in zip(model.named_parameters(), model2.named_parameters(), strict=True):
        assert torch.equal(a, b), n
        assert torch.equal(opt.state[a]["exp_avg_sq"], opt2.state[b]["exp_avg_sq"])
    other = tiny(seed=9)
    with pytest.raises(StoreError):
        save_state(run, 1, other, torch.optim.AdamW(other.parameters()), rng)  # a saved state is immutable
    with pytest.raises(StoreError):
        save_state(run, 0, other, opt, rng)  # an optimizer of another model
    with pytest.raises(MissingError):
        save_state(run, 2, model, opt, rng)  # a version that is not committed has no state
    run.state.commit(StateName.of(0, run.manifest(0).version_hash), b"{not json")
    with pytest.raises(CorruptError):
        load_state(run, 0, model2, opt2, rng2)
    with pytest.raises(CorruptError):
        load_state(run, 1, build_model(tiny_config(TOK.vocab_size, hidden=64)), opt2, rng2)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40))
def test_tokenizer_round_trip(text: str) -> None:
    assert TOK.decode(TOK.encode(text)) == text
    assert TOK.decode([*TOK.encode(text, bos=False), EOS, 7, 8]) == text


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"[]",
        b"{",
        b'{"type": "x"}',
        b'{"type": "aurora-char", "chars": 5}',
        b'{"type": "aurora-char", "chars": "aa", "specials": ["<pad>", "<bos>", "<eos>"]}',
        b'{"type": "aurora-char", "chars": "ab", "specials": []}',
        b"\xff\xfe",
    ],
)
def test_hostile_tokenizer_files(blob: bytes) -> None:
    with pytest.raises(ModelError):
        CharTokenizer.from_json(blob)


def test_tokenizer_refuses_unknown_characters() -> None:
    with pytest.raises(ModelError):
        TOK.encode("é")
    assert json.loads(TOK.to_json())["type"] == "aurora-char"


@pytest.mark.parametrize(
    "spec", ["", "nope", "os:", ":x", "no.such.module:f", "json:nothing", "json:dumps", "os:sep", "json:JSONDecoder"]
)
def test_bad_task_specs(spec: str) -> None:
    with pytest.raises(TaskError):
        load_task(spec)


@pytest.mark.parametrize("doc", [None, [], {"id": "a", "text": "b"}, {"id": 1, "text": "b", "answer": "c"}])
def test_bad_prompt_documents(doc: Any) -> None:
    with pytest.raises(TaskError):
        Prompt.from_dict(doc)


def test_builtin_tasks_reward_exact_answers() -> None:
    for name in ("arith", "reverse"):
        task = load_task(name)
        for p in task.prompts(random.Random(0), 20):
            assert task.reward(p, p.answer) == 1.0 and task.reward(p, p.answer + "0") == 0.0
            TOK.encode(p.text)


@pytest.mark.parametrize(
    "config",
    [
        None,
        [],
        {},
        {"model_type": 5},
        {**tiny_config(98), "hidden_size": "64"},
        {**tiny_config(98), "hidden_size": 0},
        {**tiny_config(98), "num_hidden_layers": True},
        {**tiny_config(98), "vocab_size": 2**40},
        {**tiny_config(98), "hidden_size": 65536, "num_hidden_layers": 4096},  # ~ 1e14 parameters
        {**tiny_config(98), "model_type": "no-such-architecture"},
    ],
)
def test_hostile_model_configs_are_refused_before_allocating(config: Any) -> None:
    with pytest.raises(ModelError):
        build_model(config)


def test_a_trainer_releases_what_it_holds(redis_server: Any, tmp_path: Any) -> None:
    """``Trainer.close`` (and ``with Trainer(...)``) closes the admissions log, the run's pool, the
    Redis connections and the dispatcher; closing twice is harmless."""
    from trainer.config import OptimizerConfig, TrainerConfig
    from trainer.loop import Trainer

    cfg = TrainerConfig(
        store=f"file://{tmp_path}/run",
        redis=redis_server.url,
        run_id="close",
        admissions_log=str(tmp_path / "admissions.jsonl"),
        optim=OptimizerConfig(sft_steps=0),
    )
    with Trainer(cfg) as trainer:
        assert trainer.start() == 0
        log = trainer._admissions
        assert log is not None and not log.closed
    assert log.closed and trainer._admissions is None
    trainer.close()
    assert open_run(cfg.store).versions() == [0]


def test_a_step_whose_rollouts_no_copy_holds_trains_without_the_correction(redis_server: Any, tmp_path: Any) -> None:
    """With a rollout correction on, a batch of rollouts from a version neither the policy nor its
    frozen copy holds (after a restart), or from several versions, is trained without the correction
    (logged) instead of stopping the trainer."""
    from trainer.config import OptimizerConfig, TrainerConfig
    from trainer.loop import Trainer

    cfg = TrainerConfig(
        store=f"file://{tmp_path}/run",
        redis=redis_server.url,
        run_id="tis",
        optim=OptimizerConfig(sft_steps=0, rollout_correction="tis"),
    )
    with Trainer(cfg) as trainer:
        assert trainer.start() == 0
        rows = [[[3, 4, 5], [6, 7], [-1.0, -2.0], r] for r in (1.0, 0.0)]
        for version in (7, None):
            reward, _, stats = trainer.train_step(1, {"rows": rows, "adv": [1.0, -1.0], "version": version})
            assert reward == 0.5 and stats.tokens == 4 and math.isfinite(stats.entropy)
