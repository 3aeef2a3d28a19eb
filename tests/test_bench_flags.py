"""Every benchmark's flags come from its ``Flags`` dataclass, like the roles': one default, one help
text, one place; flags left out keep the preset's values, and ``--help`` says what those are."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from aurora_store.config.options import build, field_docs
from bench.cli import BENCHMARKS
from bench.e2e import e2e
from bench.output import Output, overridden, parser_for
from bench.transfer import transfer


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_flags_are_a_documented_dataclass_and_left_out_give_its_defaults(name: str) -> None:
    module = importlib.import_module(BENCHMARKS[name][0])
    flags = module.Flags
    assert issubclass(flags, Output) and dataclasses.is_dataclass(flags) and hasattr(flags, "__slots__")
    docs = field_docs(flags)
    assert all(docs.get(f.name) for f in dataclasses.fields(flags)), "every flag has its help in a docstring"
    parser = parser_for(name, flags, module.__doc__, getattr(module, "PRESETS", None))
    assert build(flags, parser.parse_args([])) == flags()
    assert build(flags, parser.parse_args(["--json"])).json is True


def test_flags_left_out_keep_the_preset_and_given_ones_replace_it() -> None:
    parser = parser_for("transfer", transfer.Flags)
    flags = build(
        transfer.Flags, parser.parse_args(["--quick", "--layers", "5", "--modes", "delta_relay, full_relay,"])
    )
    cfg = transfer.config_from(flags)
    assert cfg == dataclasses.replace(transfer.QUICK, layers=5, modes=("delta_relay", "full_relay"))
    assert transfer.config_from(build(transfer.Flags, parser.parse_args([]))) == transfer.FULL
    assert overridden(e2e.QUICK, e2e.Flags(seed=7)) == dataclasses.replace(e2e.QUICK, seed=7)


def test_help_shows_what_each_preset_sets() -> None:
    text = parser_for("e2e", e2e.Flags, presets=e2e.PRESETS).format_help()
    assert f"--quick: --layers {e2e.QUICK.layers} --vocab {e2e.QUICK.vocab}" in " ".join(text.split())
    with pytest.raises(SystemExit):
        parser_for("transfer", transfer.Flags).parse_args(["--layers", "0"])
