"""``aurora config check FILE``: is a run's config file one every role can start from?

It reads the file as the roles do (:mod:`aurora_store.configfile`), builds every role's options
for every region it runs in, and prints what each would run with, or every problem at once
(exit 1). Nothing is contacted: buckets and Redis are the roles' business.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: Any) -> None:
    """Add ``aurora config`` and its ``check`` to the ``aurora`` parser."""
    p = sub.add_parser("config", help="check a run's config file (aurora.toml), which every role can read")
    inner = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    c = inner.add_parser(
        "check",
        help="validate FILE as every role reads it: keys, types, the regions' chain, what comes from the environment",
    )
    c.add_argument("file", metavar="FILE", help="the config file (TOML)")
    c.add_argument("--json", action="store_true", help="print one JSON object: regions, each role's options, warnings")
    c.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from aurora_store import config as configfile
    from aurora_store.redact import redact

    f, roles = configfile.check(args.file)
    if args.json:
        doc = {
            "ok": True,
            "file": f.path,
            "run_id": f.run_id,
            "home": f.home,
            "regions": {r.name: {"uri": redact(r.uri), "source": r.source} for r in f.regions.values()},
            "roles": [
                {"command": r.command, "region": r.region, "options": r.options, "from_env": r.from_env} for r in roles
            ],
            "warnings": list(f.warnings),
        }
        print(json.dumps(doc, default=str))
        return 0
    print(f"{f.path}: ok: run {f.run_id}, home region {f.home}, {len(f.regions)} region(s)")
    width = max(len(n) for n in f.regions)
    for r in f.regions.values():
        here = [f"aurora {c.command}" for c in roles if c.region == r.name]
        via = "" if r.source is None else f" (relayed from {r.source})"
        print(f"  {r.name:<{width}}  {redact(r.uri)}{via}: {', '.join(here)}")
    needs: dict[str, set[str]] = {}
    for c in roles:
        for dest, env in c.from_env.items():
            needs.setdefault(f"{dest.rsplit('.', 1)[-1]} (${env})", set()).add(c.command)
    for what, commands in sorted(needs.items()):
        print(f"  from the environment or a flag: {what}, for aurora {', '.join(sorted(commands))}")
    for w in f.warnings:
        print(f"aurora: warning: {f.path}: {w}", file=sys.stderr)
    return 0
