"""``aurora train`` and ``aurora demo``: registered through the ``aurora.commands`` entry point.

Arguments are parsed before torch is imported, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any


def _trainer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", default="arith", help="built-in task (arith, reverse) or package.module:factory")
    p.add_argument("--steps", type=int, default=40, help="versions to publish after version 0")
    p.add_argument("--prompts", type=int, default=32, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--sft-steps", type=int, default=60, help="supervised warm-start steps before version 0")
    p.add_argument("--full-every", type=int, default=10, help="a full checkpoint every this many versions")
    p.add_argument("--state-every", type=int, default=5, help="save resumable trainer state every this many versions")
    p.add_argument("--lease-s", type=float, default=30.0, help="job lease length")
    p.add_argument("--seed", type=int, default=0)


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="run the GRPO trainer against a home bucket and Redis")
    p.add_argument("--store", required=True, help="the home run's URI")
    p.add_argument("--redis", default=os.environ.get("AURORA_REDIS"), required="AURORA_REDIS" not in os.environ)
    p.add_argument("--run-id", required=True)
    p.add_argument("--region", default="home")
    p.add_argument("--storage-options", type=json.loads, default={})
    _trainer_args(p)
    p.set_defaults(handler=train_main)

    p = sub.add_parser("demo", help="the whole RL loop on one machine: trainer, relays, actors in three regions")
    p.add_argument("--json", action="store_true", help="end by printing one JSON object")
    p.add_argument("--workdir", help="where buckets, logs and the report go (default: a new temporary directory)")
    p.add_argument("--redis", help="a real Redis URL (default: an embedded Redis-compatible server)")
    p.add_argument(
        "--store", nargs=3, metavar="URI", help="home and two regions' run URIs (default: local directories)"
    )
    p.add_argument("--slowdowns", default="1,2,3.3", help="emulated slowness of the three actors (1 = full speed)")
    _trainer_args(p)
    p.set_defaults(handler=demo_main)


def _config(args: argparse.Namespace, **kw: Any) -> Any:
    from trainer.loop import TrainerConfig

    return TrainerConfig(
        task=args.task,
        steps=args.steps,
        prompts_per_step=args.prompts,
        group=args.group,
        lr=args.lr,
        sft_steps=args.sft_steps,
        full_every=args.full_every,
        state_every=args.state_every,
        lease_s=args.lease_s,
        seed=args.seed,
        **kw,
    )


def train_main(args: argparse.Namespace) -> int:
    from trainer.loop import StepReport, Trainer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = _config(
        args,
        store=args.store,
        redis=args.redis,
        run_id=args.run_id,
        region=args.region,
        storage_options=args.storage_options,
    )

    def show(rep: StepReport) -> None:
        print(
            json.dumps(
                {
                    "step": rep.step,
                    "version": rep.version,
                    "reward": round(rep.reward_mean, 4),
                    "bytes": rep.delta_bytes,
                    "dropped": rep.dropped,
                }
            ),
            flush=True,
        )

    Trainer(cfg, on_step=show).train()
    return 0


def demo_main(args: argparse.Namespace) -> int:
    from trainer.demo import run_demo

    summary = run_demo(args, _config)
    if args.json:
        print(json.dumps(summary))
    return 0
