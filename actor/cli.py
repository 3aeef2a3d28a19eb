"""``aurora actor``: registered through the ``aurora.commands`` entry point.

Its flags come from :mod:`actor.config`; torch loads only once they are parsed, so
``aurora actor --help`` answers at once.
"""

from __future__ import annotations

import argparse
from typing import Any

from actor.config import WorkerConfig
from aurora_store.options import add_options, build


def register(sub: Any) -> None:
    p = sub.add_parser("actor", help="run a rollout actor: generate on leased jobs, stage and apply new versions")
    add_options(p, WorkerConfig)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from actor.worker import run

    return run(build(WorkerConfig, args))
