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
from typing import Annotated, Any

import pytest

from actor.config import ActorConfig, SyncConfig
from aurora_store.config.options import COUNT, add_options, base_type, build, field_docs, leaves, option, ranges
from relay.config import RelayConfig
from trainer.config import DEMO_GIVES, DemoConfig, TrainerConfig

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [TrainerConfig, DemoConfig, ActorConfig, SyncConfig, RelayConfig]


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
    add_options(parser, TrainerConfig if "--engine" not in argv else ActorConfig)
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


# ------------------------------------------------------------ ranges (issue 25, bug 8)

ROLE_CONFIGS = [TrainerConfig, ActorConfig, RelayConfig]


@pytest.mark.parametrize("cls", ROLE_CONFIGS, ids=lambda c: c.__name__)
def test_every_numeric_option_of_every_role_has_a_range(cls: type) -> None:
    numeric = [dest for _, dest, _, tp, _ in leaves(cls) if base_type(tp)[0] in (int, float)]
    assert numeric and set(numeric) == set(ranges(cls)), set(numeric) - set(ranges(cls))


@pytest.mark.parametrize(
    ("flag", "bad"),
    [
        ("--prompts", "0"),
        ("--state-every", "0"),
        ("--lease-s", "-1"),
        ("--lease-s", "nan"),
        ("--sweep-s", "inf"),
        ("--lr", "0"),
        ("--top-p", "1.5"),
        ("--seed", str(2**64)),
        ("--metrics-port", "70000"),
    ],
)
def test_out_of_range_flags_stop_the_trainer_before_it_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, bad: str
) -> None:
    from aurora_store.cli import build_parser, main
    from aurora_store.errors import ConfigError

    run = tmp_path / "run"
    argv = ["train", "--store", run.as_uri(), "--redis", "redis://127.0.0.1:1/0", "--run-id", "x", flag, bad]
    with pytest.raises(ConfigError, match=f"^{flag}: expected "):
        build(TrainerConfig, build_parser().parse_args(argv))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"aurora: error: {flag}: expected" in err and "Traceback" not in err, err
    assert not run.exists(), "nothing is written"


@pytest.mark.parametrize(
    ("table", "key", "bad"),
    [
        ("rollout", "prompts", "0"),
        ("publish", "state_every", "0"),
        ("schedule", "lease_s", "-1"),
        ("schedule", "lease_s", "nan"),
        ("schedule", "lease_s", "inf"),
        ("optim", "micro_batch_tokens", "-5"),
        ("sampling", "temperature", "0"),
        ("actor", "heartbeat_s", "0.0"),
        ("actor", "beta", "1.0"),
        ("actor", "connections", "0"),
        ("relay", "concurrency", "0"),
        ("relay", "rescan_s", "-inf"),
    ],
)
def test_out_of_range_values_in_a_config_file_are_config_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, key: str, bad: str
) -> None:
    from aurora_store.cli import main

    path = tmp_path / "aurora.toml"
    path.write_text(
        f'run_id = "r"\nhome = "us"\n[regions.us]\nuri = "file:///b/us/r"\n[regions.eu]\nuri = "file:///b/eu/r"\n'
        f"[{table}]\n{key} = {bad}\n"
    )
    assert main(["config", "check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: {table}.{key}: expected " in err and "Traceback" not in err, err


def test_out_of_range_values_from_the_environment_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from aurora_store.errors import ConfigError

    @dataclass(kw_only=True, slots=True)
    class Opts:
        every: Annotated[int, COUNT] = field(default=1, metadata=option(env="AURORA_TEST_EVERY"))
        """How often."""

    monkeypatch.setenv("AURORA_TEST_EVERY", "0")
    parser = argparse.ArgumentParser()
    add_options(parser, Opts)
    with pytest.raises(
        ConfigError, match=r"--every \(or \$AURORA_TEST_EVERY, which is set\): expected an integer >= 1"
    ):
        build(Opts, parser.parse_args([]))
    assert build(Opts, parser.parse_args(["--every", "3"])).every == 3


# ------------------------------------------------------------ a private key on the command line (issue 25)


@pytest.mark.parametrize(
    ("command", "flag", "env"),
    [("train", "--signing-key", "AURORA_SIGNING_KEY"), ("actor", "--identity-key", "AURORA_IDENTITY_KEY")],
)
def test_a_private_key_typed_on_the_command_line_is_warned_of(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    flag: str,
    env: str,
) -> None:
    from aurora_store.cli import build_parser
    from aurora_store.format import signing

    private, _ = signing.generate_keypair()
    pem = private.decode()
    base = ["--store", "memory://x/r", "--redis", "redis://x", "--run-id", "r"]
    if command == "actor":
        base += ["--region", "eu", "--worker-id", "w", "--identity-cert", "c.json"]
    args = build_parser().parse_args([command, *base, flag, pem])
    err = capsys.readouterr().err
    assert f"warning: {flag} was given a private key's text on the command line" in err, err
    assert "process list" in err and f"${env}" in err and "path" in err and "PRIVATE KEY" not in err
    assert getattr(args, "publish.signing_key" if command == "train" else "identity_key") == pem, "taken all the same"
    key = tmp_path / "k.pem"
    key.write_bytes(private)
    build_parser().parse_args([command, *base, flag, str(key)])
    monkeypatch.setenv(env, pem)
    build_parser().parse_args([command, *base])
    assert capsys.readouterr().err == "", "a path, or the text in the environment, is what is asked for"
