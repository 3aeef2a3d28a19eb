"""``aurora actor``: registered through the ``aurora.commands`` entry point.

Its flags come from :mod:`actor.config`; torch loads only once they are parsed, so
``aurora actor --help`` answers at once.
"""

from __future__ import annotations

import argparse
from typing import Any

from actor.config import CONFIG_FILE, ActorConfig
from aurora_store import config as configfile
from aurora_store.config.options import add_options, build

configfile.declare(CONFIG_FILE)


def register(sub: Any) -> None:
    p = sub.add_parser("actor", help="run a rollout actor: generate on leased jobs, stage and apply new versions")
    configfile.add_flag(p)
    add_options(p, ActorConfig, defaults=configfile.defaults("actor"))
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from actor.worker import run

    return run(build(ActorConfig, args))
