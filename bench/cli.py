"""``aurora bench NAME``: registered through the ``aurora.commands`` entry point, like the roles.

Each benchmark is a module (:data:`MODULES`) with a ``Flags`` dataclass (its command line, derived by
:func:`aurora_store.options.add_options` as the roles' are), ``run(flags)``, and ``PRESETS`` when
some flags default to a preset's values (``--help`` shows them). It is imported only when it runs,
so ``aurora --help`` stays fast. Every benchmark prints one JSON object with ``--json`` and a table
otherwise.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

MODULES = {
    "codec": "bench.codec.codec",
    "transfer": "bench.transfer.transfer",
    "schedule": "bench.fleet.schedule",
    "e2e": "bench.e2e.e2e",
    "full": "bench.store.full",
    "chaos": "bench.chaos.chaos",
    "fuzz": "bench.fuzz.fuzz",
    "retention": "bench.store.retention",
    "engine": "bench.codec.engine",
    "state": "bench.store.state",
    "identity": "bench.fleet.identity",
    "recipe": "bench.recipe",
    "catchup": "bench.transfer.catchup",
    "coord": "bench.fleet.coord",
    "dispatch": "bench.fleet.dispatch",
}
"""Each benchmark's module (grouped by concern: bench/chaos, bench/fuzz, bench/e2e, ...)."""

BENCHMARKS = {
    "codec": "size and speed of the sparse BF16 codec; see --help",
    "transfer": "time to apply a version in every region over emulated WANs; see --help",
    "schedule": "step makespan of the EMA batch split vs uniform and ideal; see --help",
    "e2e": "RL step time with deltas+relays vs full broadcast vs no transfer, over emulated WANs; see --help",
    "full": "publish and materialize a full version against safetensors' own save and verified read; see --help",
    "chaos": "the whole system as real processes under a seeded schedule of faults; invariants checked; see --help",
    "fuzz": "every parser of outside bytes under mutated inputs: crashes, hangs, peak memory; see --help",
    "retention": "a run's storage with aurora gc every few versions against the same run never collected; see --help",
    "engine": "pause to apply a ~1%% delta on a real vLLM engine vs its full reload and a restart; see --help",
    "state": "what saving the trainer state of every version costs the training thread; see --help",
    "identity": "actor identities: sign and check microseconds per result, admission signed vs unsigned; see --help",
    "recipe": "whether aurora demo's recipe learns: reward rise, verified versions, delta sizes; see --help",
    "catchup": "a lagging actor's path to the latest version: delta chain vs latest full plus chain; see --help",
    "coord": "one Redis and one trainer against 8..1024 actors: round trips, Redis CPU, bytes, memory; see --help",
    "dispatch": "the trainer's dispatch against Redis writers: fake and hung actors, forged results; see --help",
}


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks (print JSON with --json)")
    names = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, about in BENCHMARKS.items():
        names.add_parser(name, add_help=False, help=about).set_defaults(handler=main, parses_rest=True)


def main(args: argparse.Namespace) -> int:
    """Import the benchmark's module, parse the rest of the command line (``args.rest``) into its
    ``Flags``, and run it."""
    from aurora_store.options import build
    from bench.output import parser_for

    module = importlib.import_module(MODULES[args.bench])
    parser = parser_for(args.bench, module.Flags, module.__doc__, getattr(module, "PRESETS", None))
    return int(module.run(build(module.Flags, parser.parse_args(args.rest))) or 0)
