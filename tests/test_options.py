"""Every role's flags come from its config dataclass: one default, one help text, one place."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from actor.config import SyncConfig, WorkerConfig
from aurora_store.options import add_options, build, field_docs, option
from relay.config import RelayConfig
from trainer.config import DEMO_GIVES, DemoConfig, TrainerConfig

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [TrainerConfig, DemoConfig, WorkerConfig, SyncConfig, RelayConfig]


def _leaf_fields(cls: type) -> Iterator[tuple[type, dataclasses.Field[Any]]]:
    """(owning class, field) of every option of ``cls``, sections included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _leaf_fields(hints[f.name])
        else:
            yield cls, f


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_option_is_documented_and_listed_in_help(cls: type) -> None:
    parser = argparse.ArgumentParser(prog="x")
    add_options(parser, cls)
    text = " ".join(parser.format_help().split())
    for owner, f in _leaf_fields(cls):
        assert f"--{f.name.replace('_', '-')}" in text, f"{owner.__name__}.{f.name}"
        doc = field_docs(owner)[f.name]
        assert " ".join(doc.rstrip(".").split()[:4]) in text, f"{owner.__name__}.{f.name}'s docstring is its help"


def test_defaults_come_from_the_dataclass_alone() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, TrainerConfig)
    cfg = build(TrainerConfig, parser.parse_args(["--store", "memory://r", "--redis", "redis://x", "--run-id", "r"]))
    assert cfg == TrainerConfig(store="memory://r", redis="redis://x", run_id="r")
    cfg = build(
        TrainerConfig,
        parser.parse_args(
            [
                "--store",
                "s",
                "--redis",
                "r",
                "--run-id",
                "i",
                "--lr",
                "0.1",
                "--no-steal",
                "--storage-options",
                '{"a": 1}',
            ]
        ),
    )
    assert (cfg.optim.lr, cfg.schedule.steal, cfg.storage_options) == (0.1, False, {"a": 1})
    assert cfg.optim.sft_steps == TrainerConfig(store="", redis="", run_id="").optim.sft_steps


def test_the_environment_can_give_a_required_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AURORA_REDIS", "redis://from-env:6379/0")
    parser = argparse.ArgumentParser()
    add_options(parser, RelayConfig)
    cfg = build(RelayConfig, parser.parse_args(["--source", "a", "--dest", "b", "--dest-region", "eu"]))
    assert cfg.redis == "redis://from-env:6379/0"


def test_the_demo_sets_the_trainers_connection_itself() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, DemoConfig)
    add_options(parser, TrainerConfig, exclude=DEMO_GIVES)
    args = parser.parse_args(["--store", "a", "b", "c", "--steps", "3", "--json"])
    demo = build(DemoConfig, args)
    cfg = build(TrainerConfig, args, store="home", redis="redis://e", run_id="d")
    assert (demo.store, demo.json, cfg.steps, cfg.store, cfg.region) == (["a", "b", "c"], True, 3, "home", "home")
    with pytest.raises(SystemExit):
        parser.parse_args(["--store", "a", "b"])  # three URIs or none


@pytest.mark.parametrize(
    ("argv", "lr", "new_tokens", "steps"),
    [
        ([], 1.2e-5, 4, 250),  # the recipe: the built-in model on a built-in task
        (["--model", "./mine"], 1e-6, 1024, 40),  # a user's model: the trainer's own defaults
        (["--data", "x.jsonl", "--lr", "1.2e-5"], 1.2e-5, 1024, 40),  # what is typed is kept
        (["--max-new-tokens", "9"], 1.2e-5, 9, 250),
    ],
)
def test_the_demo_recipe_is_for_the_built_in_model_only(
    argv: list[str], lr: float, new_tokens: int, steps: int
) -> None:
    from aurora_store.cli import build_parser
    from trainer.cli import _resolve_recipe

    args = build_parser().parse_args(["demo", *argv])
    _resolve_recipe(args)
    cfg = build(TrainerConfig, args, store="home", redis="redis://e", run_id="d")
    assert (cfg.optim.lr, cfg.sampling.max_new_tokens, cfg.steps) == (lr, new_tokens, steps)


@pytest.mark.parametrize(
    "argv",
    [["--steps", "x"], ["--storage-options", "[1]"], ["--storage-options", "{"], ["--engine", "onnx"], []],
)
def test_bad_values_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, TrainerConfig if "--engine" not in argv else WorkerConfig)
    base = ["--store", "s", "--redis", "r", "--run-id", "i"] if argv else []
    if "--engine" in argv:
        base = ["--store", "s", "--region", "eu", "--redis", "r", "--run-id", "i", "--worker-id", "w"]
    with pytest.raises(SystemExit) as err:
        parser.parse_args(base + argv)
    assert err.value.code == 2 and "error" in capsys.readouterr().err


def test_an_undocumented_field_is_refused() -> None:
    @dataclass(kw_only=True, slots=True)
    class Bad:
        documented: int = 1
        """It says what it is."""
        silent: int = field(default=2, metadata=option(flag="--quiet"))

    with pytest.raises(TypeError, match="Bad.silent has no docstring"):
        add_options(argparse.ArgumentParser(), Bad)


@pytest.mark.parametrize("command", ["train", "demo", "actor", "relay", "bench"])
def test_help_answers_without_torch(command: str) -> None:
    code = (
        f"import contextlib, sys\nfrom aurora_store import cli\nwith contextlib.suppress(SystemExit):\n"
        f"    cli.main([{command!r}, '--help'])\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
