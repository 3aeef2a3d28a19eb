"""RL on a user's model, tokenizer, data set and reward, with real processes: `aurora train --model DIR
--data FILE --reward math` and two `aurora actor` processes on a tiny HF Qwen3 with a BPE tokenizer
made here and a GSM8K-format data set written here. The trainer is SIGKILLed mid-epoch and restarted:
every step trains on exactly the prompts the data order gives it, none skipped or repeated. The last
version, replayed, loads with transformers, and its greedy tokens are the actor engine's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from actor import assemble
from actor.config import EngineConfig
from actor.updater import Updater
from aurora_store.bucket.audit import audit
from aurora_store.bucket.replay import replay
from aurora_store.bucket.run import open_run
from aurora_store.rl.data import PromptPool, read_records
from aurora_store.testing.processes import wait_for
from tests.helpers import readme_commands
from tests.test_rl_loop import Loop

pytestmark = pytest.mark.slow
DATA = Path(__file__).parent / "data" / "gsm8k_tiny.jsonl"
PROMPTS, STEPS = 8, 9
"""50 prompts, 8 a step: epoch 0 ends inside step 7, so the restart and the epoch boundary both happen."""


@pytest.fixture
def loop(tmp_path: Path, redis_server: object) -> Loop:  # type: ignore[misc]
    world = Loop(tmp_path, redis_server.url)  # type: ignore[attr-defined]
    yield world
    world.stop()


def _trainer(loop: Loop, model: Path, reward: str = "math", steps: int = STEPS) -> object:
    return loop.trainer(
        "--model",
        str(model),
        "--data",
        str(DATA),
        "--data-format",
        "gsm8k",
        "--reward",
        reward,
        "--steps",
        str(steps),
        "--max-new-tokens",
        "8",
        "--lr",
        "1e-4",
        "--full-every",
        "100",
        "--admissions-log",
        str(loop.tmp / "admissions.jsonl"),
    )


def _actor(loop: Loop, wid: str) -> object:
    argv = ["-m", "aurora_store.cli", "actor", "--store", loop.store, "--region", "home", "--redis", loop.redis]
    return loop._spawn(wid, [*argv, "--run-id", loop.run_id, "--worker-id", wid, "--heartbeat-s", "3"])


def test_train_a_users_model_on_its_data_with_math_verify(
    loop: Loop, hf_models: dict[str, Path], tmp_path: Path
) -> None:
    first = _trainer(loop, hf_models["qwen3"])
    _actor(loop, "a0")
    _actor(loop, "a1")
    run = open_run(loop.store)
    wait_for(lambda: (run.latest() or 0) >= 4, "version 4", 300)
    first.kill()  # type: ignore[attr-defined]
    first.wait(10)  # type: ignore[attr-defined]
    at_kill = open_run(loop.store).latest()
    assert at_kill is not None
    second = _trainer(loop, hf_models["qwen3"])
    loop.finish(second, "trainer", timeout=400)  # type: ignore[arg-type]

    run = open_run(loop.store)
    assert run.versions() == list(range(STEPS + 1)) and audit(run).ok
    spec = json.loads(run.files.get("aurora_run.json"))
    assert (spec["reward"], spec["tokenizer"], spec["chat_template"], spec["sampling"]["max_new_tokens"]) == (
        "math",
        "hf",
        True,
        8,
    )

    # every step trained on exactly the prompts of its positions in the data order, across the restart
    pool = PromptPool(read_records(str(DATA), data_format="gsm8k"), lambda text: [0], max_prompt_tokens=1, seed=0)
    # (the killed trainer had posted, and partly admitted, two steps ahead: the one that trained a step
    # is the restarted trainer wherever both posted it; job ids are "tag:step:i")
    admitted: dict[tuple[str, int], list[str]] = defaultdict(list)
    for line in (loop.tmp / "admissions.jsonl").read_text().splitlines():  # both trainers append to it
        row = json.loads(line)
        admitted[(row["trainer"], row["step"])].append(row["prompt"])
    last = next(tag for tag, step in admitted if step == STEPS)
    for step in range(1, STEPS + 1):
        tag = last if (last, step) in admitted else next(t for t, s in admitted if s == step)
        assert sorted(admitted[(tag, step)]) == sorted(p.id for p in pool.for_step(step, PROMPTS)), step
    assert len({tag for tag, _ in admitted}) == 2, "two trainers took part"
    reports = loop.steps()
    reported = {r["step"] for r in reports}
    assert set(range(at_kill + 1, STEPS + 1)) <= reported and set(range(1, STEPS + 1)) - reported <= {at_kill}
    assert all(r["stats"]["tokens"] > 0 for r in reports)
    assert all(r["stats"]["entropy"] > 0 for r in reports if r["stats"]["micro_batches"])
    assert all(r["reward_failures"] == {} for r in reports), "math-verify never failed"

    # the last version, replayed, is a HF directory; its greedy tokens are the actor engine's
    from transformers import AutoModelForCausalLM

    out = tmp_path / "last"
    replay(run, STEPS, str(out))
    hf = AutoModelForCausalLM.from_pretrained(out)
    files = assemble.run_files(run, run.latest())
    rs = assemble.run_spec(run, files)
    tok = assemble.tokenizer(rs, files)
    engine = assemble.engine(run, rs, files, EngineConfig(), "check")
    Updater(run, region="home", live=engine.live).bootstrap(STEPS)
    ids = tok.prompt_ids(pool.for_step(1, 1)[0].text)
    sampled = engine.generate([ids], samples=1, max_new_tokens=8, temperature=0, seed=0)[0][0]
    greedy = hf.generate(
        torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=list(rs.eos_ids), pad_token_id=tok.pad_id
    )[0, len(ids) :].tolist()
    assert list(sampled.token_ids) == greedy


def test_a_user_reward_function_trains_the_model(loop: Loop, hf_models: dict[str, Path], tmp_path: Path) -> None:
    """A reward with a signal on a random model (the length of the completion): versions really change, a
    Llama (untied) this time, and the last version replayed generates what the actor's engine does."""
    from transformers import AutoModelForCausalLM

    trainer = _trainer(loop, hf_models["llama"], reward="tests.reward_fns:length_over_ten", steps=3)
    _actor(loop, "a0")
    loop.finish(trainer, "trainer", timeout=400)  # type: ignore[arg-type]
    run = open_run(loop.store)
    assert run.versions() == [0, 1, 2, 3] and audit(run).ok
    assert any(run.manifest(v).stats.changed > 0 for v in (1, 2, 3)), "the policy moved"
    reports = loop.steps()
    assert any(r["stats"]["micro_batches"] > 0 and r["stats"]["grad_norm"] > 0 for r in reports)
    out = tmp_path / "last"
    replay(run, 3, str(out))
    files = assemble.run_files(run, run.latest())
    rs = assemble.run_spec(run, files)
    tok = assemble.tokenizer(rs, files)
    engine = assemble.engine(run, rs, files, EngineConfig(), "check")
    Updater(run, region="home", live=engine.live).bootstrap(3)
    ids = tok.prompt_ids("Ava has 3 apples and finds 4 more. How many apples does Ava have now?")
    sampled = engine.generate([ids], samples=1, max_new_tokens=8, temperature=0, seed=0)[0][0]
    hf = AutoModelForCausalLM.from_pretrained(out)
    greedy = hf.generate(
        torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=list(rs.eos_ids), pad_token_id=tok.pad_id
    )[0, len(ids) :].tolist()
    assert list(sampled.token_ids) == greedy


def test_the_readmes_commands_parse_and_its_demo_runs_on_a_users_model(
    hf_models: dict[str, Path], tmp_path: Path
) -> None:
    """Every command of the README's "Train your own model" parses; its `aurora demo` runs, on
    the tiny Qwen3 and the GSM8K-format data here, with fewer steps and tokens for time."""
    from aurora_store.cli import build_parser

    commands = readme_commands("Train your own model")
    assert [c[1] for c in commands] == ["demo", "train", "relay", "actor", "replay"]
    for argv in commands:
        build_parser().parse_args(argv[1:])  # SystemExit (a usage error) fails the test
    places = {"./Qwen3-0.6B": str(hf_models["qwen3"]), "./gsm8k/train.jsonl": str(DATA)}
    demo = [places.get(a, a) for a in commands[0][1:]]
    fast = ["--steps", "3", "--max-new-tokens", "8", "--prompts", "4", "--sft-steps", "2", "--group", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", *demo, *fast, "--json", "--workdir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["versions_verified"] >= 3 * 4  # every version in every region
    assert summary["reward_rose"] is None, "3 steps are too few to tell"
    assert summary["reward_failures"] == {} and Path(summary["report"]).exists()
