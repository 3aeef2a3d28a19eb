"""``aurora bench fuzz``: every parser of outside bytes under seeded mutations: crashes, hangs, peak memory.

Each target (:class:`bench.fuzz.target.Target`, built by :mod:`bench.fuzz.targets`) starts from
valid inputs made by the project's own writers and feeds mutants to the parsers a role runs on such
input: byte-level mutations, and structure-aware JSON ones (manifests re-hashed, so they reach the
checks behind the hash). Mutants that reach an outcome not seen before are kept and mutated
further. An exception outside :class:`~aurora_store.errors.AuroraError`'s family is a crash; an
execution over ``--timeout-s`` is a hang (a SIGALRM timer interrupts one stuck in Python;
faulthandler's watchdog ends a worker stuck in native code). Each target runs in a fresh process,
so its peak memory is its own and a segfault is a crash too. Deterministic for a seed: a crash's
``exec`` index reproduces it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import multiprocessing
import os
import random
import re
import resource
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from aurora_store.config.options import option, positive
from aurora_store.errors import AuroraError
from bench.fuzz.target import Target
from bench.output import Output, emit, overridden

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

FAMILY: tuple[type[BaseException], ...] = (AuroraError,)
"""What a parser may raise: every error family of the project (store, coordination, RL) is an AuroraError."""
EXAMPLES = 5
"""Crashing (and hanging) inputs kept per target."""
POOL = 512
POOL_BYTES = 16 << 10
"""Mutants kept for further mutation: those that reached a new outcome, up to this size (the pool stays small)."""
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    execs: int = 100_000
    """Executions per target."""
    seed: int = 0
    timeout_s: float = 2.0
    """An execution longer than this is a hang."""
    targets: tuple[str, ...] = ()
    """Targets to fuzz (empty: all)."""
    jobs: int = 0
    """Targets fuzzed at once, one process each (0: one per CPU)."""


class Hang(BaseException):
    """Raised by the timer in an execution over the limit (no ``except Exception`` swallows it)."""


def _alarm(signum: int, frame: object) -> None:
    raise Hang("interrupted by the timer: over the time limit")


# ---------------------------------------------------------------- the engine


def rss_mb() -> float:
    """Resident set size now (Linux), else the peak so far."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return max_rss_mb()


def max_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def _where(exc: BaseException) -> str:
    """The deepest frame of the project (not this engine) ``exc`` passed, and the raising frame if elsewhere."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.name != "_alarm"]
    ours = [f for f in frames if f.filename.startswith(ROOT) and "/.venv/" not in f.filename]
    ours = [f for f in ours if not f.filename.endswith(os.path.join("bench", "fuzz.py"))] or ours
    if not frames:
        return "?"
    f = ours[-1] if ours else frames[-1]
    out = f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} ({f.name})"
    last = frames[-1]
    if last is not f:
        out += f" via {os.path.basename(last.filename)}:{last.lineno} ({last.name})"
    return out


def _execute(fn: Callable[[Any], object], case: Any, timeout_s: float) -> tuple[float, str, BaseException | None]:
    t0 = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            out = fn(case)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Hang as exc:
        return time.perf_counter() - t0, "hang", exc
    except FAMILY as exc:
        return time.perf_counter() - t0, type(exc).__name__, exc
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a crash: what the run reports
        return time.perf_counter() - t0, "crash", exc
    return time.perf_counter() - t0, out if isinstance(out, str) else "accepted", None


def _size(x: Any, top: bool = True) -> int:
    """Bytes of text an input holds (what a Target's cases carry; shared context objects not counted)."""
    if isinstance(x, (bytes, str)):
        return len(x)
    if isinstance(x, dict):
        return sum(_size(k, False) + _size(v, False) for k, v in x.items())
    if isinstance(x, (tuple, list)):
        return sum(_size(v, False) for v in x)
    if top and dataclasses.is_dataclass(x):
        return sum(_size(getattr(x, f.name), False) for f in dataclasses.fields(x))
    return 0


_SHAPE = re.compile(r"[0-9a-f]{6,}|[0-9]+|'[^']*'|\"[^\"]*\"")


def _example(i: int, target: Target[Any], case: Any, exc: BaseException | None, dt: float) -> dict[str, Any]:
    return {
        "exec": i,
        "error": f"{type(exc).__name__}: {exc}"[:400] if exc is not None else f"ran {dt:.2f} s",
        "where": _where(exc) if exc is not None else None,
        "seconds": round(dt, 4),
        "input": target.show(case),
    }


def fuzz(target: Target[Any], execs: int, seed: int, timeout_s: float) -> dict[str, Any]:
    """Run ``execs`` mutants of ``target``'s seeds through it, in this process; its JSON-ready report."""
    rng = random.Random(f"{seed}:{target.name}")
    outcomes: Counter[str] = Counter()
    crash_classes: Counter[str] = Counter()
    crashes: list[dict[str, Any]] = []
    hangs: list[dict[str, Any]] = []
    pool: list[Any] = []
    seen: set[tuple[str, str]] = set()
    n_crash = n_hang = 0
    slowest = 0.0
    watchdog = max(30.0, 10 * timeout_s)
    armed = -watchdog
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for seed_case in target.seeds:  # warm up (lazy imports, caches) before the baseline is taken
            _execute(target.execute, seed_case, max(10.0, 5 * timeout_s))
        rss0, max0 = rss_mb(), max_rss_mb()
        peak = rss0
        t0 = time.perf_counter()
        for i in range(execs):
            now = time.perf_counter()
            if now - armed > 1.0:  # re-armed once a second: it fires only if one execution never returns
                faulthandler.dump_traceback_later(watchdog, exit=True)
                armed = now
            base = pool[rng.randrange(len(pool))] if pool and rng.random() < 0.3 else rng.choice(target.seeds)
            case = target.mutate(rng, base)
            dt, label, exc = _execute(target.execute, case, timeout_s)
            slowest = max(slowest, dt)
            if i % 256 == 0:
                peak = max(peak, rss_mb())
            if label == "hang" or dt > timeout_s:
                n_hang += 1
                if len(hangs) < EXAMPLES:
                    hangs.append(_example(i, target, case, exc, dt))
            elif label == "crash":
                assert exc is not None
                n_crash += 1
                crash_classes[f"{type(exc).__name__} at {_where(exc)}"] += 1
                if len(crashes) < EXAMPLES:
                    crashes.append(_example(i, target, case, exc, dt))
            else:
                outcomes[label] += 1
                shape = (label, _SHAPE.sub("#", str(exc)[:80]) if exc is not None else "")
                if shape not in seen and len(seen) < 20_000 and _size(case) <= POOL_BYTES:
                    seen.add(shape)
                    if len(pool) < POOL:
                        pool.append(case)
                    else:
                        pool[rng.randrange(POOL)] = case
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()
    seconds = time.perf_counter() - t0
    if max_rss_mb() > max0:  # a spike between samples raised the process's peak
        peak = max(peak, max_rss_mb())
    return {
        "name": target.name,
        "functions": list(target.functions),
        "seeds": len(target.seeds),
        "executions": execs,
        "seconds": seconds,
        "execs_per_s": execs / seconds if seconds > 0 else None,
        "crashes": n_crash,
        "hangs": n_hang,
        "peak_rss_mb": max(0.0, peak - rss0),
        "rss_start_mb": rss0,
        "slowest_s": slowest,
        "accepted": outcomes.pop("accepted", 0),
        "errors": dict(outcomes.most_common()),
        "crash_classes": dict(crash_classes.most_common()),
        "crash_examples": crashes,
        "hang_examples": hangs,
    }


def _worker(name: str, execs: int, seed: int, timeout_s: float, conn: Connection) -> None:
    os.dup2(2, 1)  # what the parsers' libraries print goes to stderr: stdout carries the one JSON object
    sys.stdout = sys.stderr
    try:
        from bench.fuzz.targets import build

        t0 = time.perf_counter()
        target = build(name, seed)
        setup = time.perf_counter() - t0
        result = fuzz(target, execs, seed, timeout_s)
        result["setup_s"] = setup
    except Exception:  # the harness failed: reported as such, not lost with the process
        result = {"name": name, "executions": 0, "crashes": 0, "hangs": 0, "error": traceback.format_exc()[-3000:]}
    conn.send(result)
    conn.close()


def _died(name: str, code: int | None) -> dict[str, Any]:
    native = code is not None and code < 0
    why = (
        f"killed by signal {-(code or 0)}: a crash in native code" if native else "stopped by the watchdog (see stderr)"
    )
    return {"name": name, "executions": 0, "crashes": int(native), "hangs": int(not native), "error": f"worker {why}"}


def passed(report: dict[str, Any], execs: int) -> bool:
    """A target's verdict: every execution ran, none crashed or hung, and the harness itself did not fail."""
    return report["crashes"] == 0 and report["hangs"] == 0 and "error" not in report and report["executions"] == execs


def measure(cfg: Config) -> dict[str, Any]:
    """Fuzz every target of ``cfg``, each in a fresh process, ``cfg.jobs`` at a time."""
    from multiprocessing.connection import wait

    from bench.fuzz.targets import BUILDERS

    names = list(cfg.targets or BUILDERS)
    jobs = cfg.jobs or max(1, min(len(names), os.cpu_count() or 1))
    ctx = multiprocessing.get_context("spawn")
    todo = list(names)
    running: dict[Any, tuple[str, Any]] = {}
    done: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    while todo or running:
        while todo and len(running) < jobs:
            name = todo.pop(0)
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(name, cfg.execs, cfg.seed, cfg.timeout_s, send), name=f"fuzz-{name}")
            p.start()
            send.close()
            running[recv] = (name, p)
        for ready in wait(list(running)):
            conn: Any = ready
            name, p = running.pop(conn)
            result: dict[str, Any] | None = None
            with contextlib.suppress(EOFError):  # EOF: the worker died before it reported
                result = conn.recv()
            p.join()
            done[name] = result if result is not None else _died(name, p.exitcode)
    wall = time.perf_counter() - t0
    targets = {n: done[n] for n in names}
    return {
        "bench": "fuzz",
        "seed": cfg.seed,
        "execs_per_target": cfg.execs,
        "timeout_s": cfg.timeout_s,
        "jobs": jobs,
        "targets": targets,
        "totals": {
            "executions": sum(r["executions"] for r in targets.values()),
            "crashes": sum(r["crashes"] for r in targets.values()),
            "hangs": sum(r["hangs"] for r in targets.values()),
            "peak_rss_mb": max((r.get("peak_rss_mb", 0.0) for r in targets.values()), default=0.0),
            "wall_s": wall,
        },
        "ok": all(passed(r, cfg.execs) for r in targets.values()),
    }


def render(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"fuzz: {result['execs_per_target']:,} executions per target, seed {result['seed']}",
        caption="peak MB: RSS growth while fuzzing; errors: the project's own, as expected of hostile input",
    )
    for col in ("target", "execs", "execs/s", "crashes", "hangs", "peak MB", "slowest s", "accepted", "top errors"):
        table.add_column(col, justify="left" if col in ("target", "top errors") else "right")
    for name, r in result["targets"].items():
        errs = ", ".join(f"{k} {v}" for k, v in list(r.get("errors", {}).items())[:3])
        bad = "[red]{}[/]".format
        table.add_row(
            name,
            f"{r['executions']:,}",
            f"{r['execs_per_s']:,.0f}" if r.get("execs_per_s") else "-",
            bad(r["crashes"]) if r["crashes"] else "0",
            bad(r["hangs"]) if r["hangs"] else "0",
            f"{r.get('peak_rss_mb', 0.0):.1f}",
            f"{r.get('slowest_s', 0.0):.3f}",
            f"{r.get('accepted', 0):,}",
            errs or r.get("error", "")[-80:],
        )
    console.print(table)
    for name, r in result["targets"].items():
        for ex in r.get("crash_examples", []) + r.get("hang_examples", []):
            console.print(f"  [red]{name}[/] exec {ex['exec']}: {ex['error'][:160]} at {ex['where']}")
    console.print("  [green]ok[/]" if result["ok"] else "  [red]not ok[/]: crashes or hangs (see --json)")


def _targets(text: str) -> tuple[str, ...]:
    from bench.fuzz.targets import BUILDERS

    names = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [n for n in names if n not in BUILDERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown targets {unknown}; choose from {', '.join(BUILDERS)}")
    return names


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


_DEFAULT = Config()


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench fuzz``."""

    execs: int = field(default=_DEFAULT.execs, metadata=option(parse=positive))
    """Executions per target."""
    seed: int = _DEFAULT.seed
    """Mutation seed."""
    targets: tuple[str, ...] = field(default=_DEFAULT.targets, metadata=option(parse=_targets))
    """Comma-separated targets (default: all)."""
    timeout_s: float = field(default=_DEFAULT.timeout_s, metadata=option(parse=_seconds))
    """An execution over this is a hang."""
    jobs: int | None = field(default=None, metadata=option(parse=positive))
    """Targets fuzzed at once, a process each (default: one per CPU)."""


def run(args: Flags) -> int:
    result = measure(overridden(_DEFAULT, args))
    emit(result, args, lambda r: render(r, Console()))
    return 0 if result["ok"] else 1
