"""``aurora gc``: what retention would delete from a run (a dry run), or deletes it (``--apply``).

The plan is :mod:`aurora_store.bucket.gc`'s; this module asks Redis what live actors hold and
regions are at, refuses to delete versions on what it cannot read, and prints the plan. Offloaded
result payloads older than ``--results-max-age`` go with ``--apply`` whatever Redis says: no one
holds a payload once its result is admitted, and the age is the guard.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aurora_store.bucket.run import Run


RESULTS_MAX_AGE_S = 86400
"""How old (seconds) an offloaded result payload is before ``aurora gc`` deletes it, unless told
otherwise: a day, hours more than any lease (a result is admitted, or dropped, within its lease)."""


def add_results_arguments(p: argparse.ArgumentParser) -> None:
    """``aurora gc``'s options for offloaded result payloads (``results/``); imports nothing heavy,
    so the parser that calls it still answers ``--help`` at once."""
    p.add_argument(
        "--results-max-age",
        type=_seconds,
        default=RESULTS_MAX_AGE_S,
        metavar="SECONDS",
        help=f"delete offloaded result payloads (results/) older than this (default {RESULTS_MAX_AGE_S}: a day; "
        "0 keeps them all); needs no --redis",
    )


def _seconds(text: str) -> int:
    """An argparse type: a whole number of seconds, >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def gc(run: Run, args: argparse.Namespace) -> int:
    from aurora_store.bucket import gc as retention
    from aurora_store.errors import RetentionError

    holds, unreadable = _holds(args, run.uri)
    if not run.versions():
        run.store.require_run()
    p = retention.plan(
        run,
        retention.RetentionPolicy(
            keep_last=args.keep_last, keep_fulls=args.keep_fulls, keep_states=args.keep_states, holds=holds
        ),
    )
    # a parser without add_results_arguments (an older aurora_store.cli) gets the default
    results = retention.plan_results(run.store, args.results_max_age)
    counts: dict[str, int] | None = None
    results_deleted: int | None = None
    if args.apply:
        results_deleted = retention.apply_results(run.store, results)  # no Redis needed: the age is the guard
        problem = None
        if args.redis is None:
            problem = "--apply needs --redis (or $AURORA_REDIS): what live actors hold decides what may go"
        elif not holds:
            run_id = _run_id(args, run.uri)
            problem = f"Redis holds no region version and no live actor of run {run_id!r} (is --run-id right?)"
        elif unreadable:
            problem = (
                f"{len(unreadable)} Redis entr(ies) could not be read ({unreadable[0]}): what they hold is unknown"
            )
        if problem is not None:
            done = f"{results_deleted} old results/ payload(s) deleted, no version" if results_deleted else "nothing"
            raise RetentionError(f"gc {run.uri}: {done} deleted: {problem}")
        counts = retention.apply(run, p)
    if args.json:
        doc = {
            **p.to_dict(),
            "applied": counts is not None,
            "deleted": counts,
            "holds": holds,
            "unreadable": unreadable,
            "results": {**results.to_dict(), "deleted": results_deleted},
        }
        print(json.dumps(doc))
        return 0
    _show(p, holds, unreadable, counts, results, results_deleted)
    return 0


def _run_id(args: argparse.Namespace, uri: str) -> str:
    return args.run_id or uri.rstrip("/").rsplit("/", 1)[-1]


def _holds(args: argparse.Namespace, uri: str) -> tuple[dict[str, int] | None, list[str]]:
    if args.redis is None:
        return None, []
    from aurora_store.coord.coordinator import Coordinator

    coord = Coordinator(args.redis, _run_id(args, uri))
    try:
        return coord.versions_in_use()
    finally:
        coord.close()


def _spans(versions: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1-3, 7``."""
    from aurora_store.format.retention import Retired

    spans = (Retired() | versions).ranges
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans) or "none"


def _show(
    p: object,
    holds: dict[str, int] | None,
    unreadable: list[str],
    counts: dict[str, int] | None,
    results: object,
    results_deleted: int | None,
) -> None:
    from aurora_store.bucket.gc import RetentionPlan

    assert isinstance(p, RetentionPlan)
    print(
        f"gc {p.uri}: {len(p.committed)} committed versions: keep {len(p.kept)}, retire {len(p.retire)} "
        f"({p.freed_bytes:,} bytes); {len(p.states_deleted)} trainer state(s) to delete"
    )
    reasons: dict[str, list[int]] = {}
    for v, why in p.kept.items():
        reasons.setdefault(why, []).append(v)
    for why, vs in reasons.items():
        print(f"  keep {_spans(vs)}: {why}")
    print(f"  retire {_spans(p.retire)}")
    if p.leftovers:
        print(f"  finish retiring {_spans(list(p.leftovers))} (objects an interrupted gc left)")
    if p.stray_markers:
        print(f"  remove the key-rotation markers of {_spans(p.stray_markers)} (their versions rotate no key)")
    if holds is None:
        print("  Redis not asked (no --redis): what live actors hold was not considered")
    for bad in [*p.bad_records, *unreadable, *p.unreadable, *p.bad_states]:
        print(f"aurora: warning: {bad}", file=sys.stderr)
    _show_results(results, results_deleted)
    if counts is None:
        print("dry run: nothing deleted (--apply deletes)")
    else:
        print(
            f"deleted {counts['versions']} versions ({counts['objects']} objects), {counts['states']} trainer states, "
            f"{counts['records']} superseded retention records, {counts['markers']} stray key-rotation markers, "
            f"{counts['temporaries']} temporary files"
        )


_SHOWN = 20
"""Names of kept or foreign ``results/`` objects printed at most (a flood of them is counted)."""


def _show_results(r: object, deleted: int | None) -> None:
    from aurora_store.bucket.gc import ResultsPlan

    assert isinstance(r, ResultsPlan)
    if r.max_age_s == 0:
        print("  results/: not collected (--results-max-age 0)")
        return
    print(
        f"  results/: {len(r.expired)} payload(s) older than {r.max_age_s:,} s ({r.expired_bytes:,} bytes) to delete, "
        f"{r.young} younger kept"
    )
    for key in r.undated[:_SHOWN]:
        print(f"  keep {key!r}: the store reports no modification time for it that can be read")
    for key in r.foreign[:_SHOWN]:
        print(f"  leave {key!r} alone: not a payload's name (results/<sha256>.bin)")
    hidden = max(0, len(r.undated) - _SHOWN) + max(0, len(r.foreign) - _SHOWN)
    if hidden:
        print(f"  ... and {hidden} more kept or left alone under results/")
    if deleted is not None:
        print(f"deleted {deleted} results/ payload(s) ({r.expired_bytes:,} bytes)")
