"""What ``aurora bench chaos`` observes and the invariants it checks at the end.

`check` is pure: the trainer's admissions log (one JSON object per admitted result), what each
region's bucket holds (committed versions, manifest bytes, its audit), the trainer processes' start
lines (`bench.chaos.descent`) and the run's shape give each invariant a verdict and count what was
lost; `scan_logs` counts what the roles said in their logs (what they detected, how they recovered,
what they died of).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.chaos.bucket import RegionState
from bench.chaos.descent import Start, descent, read_starts
from bench.chaos.schedule import WRITERS

if TYPE_CHECKING:
    from bench.chaos.faults import Faults

INVARIANTS = (
    "every_prompt_admitted_once",
    "admitted_leases_valid",
    "rollouts_from_committed_weights",
    "regions_replay_bit_exact",
    "versions_consecutive",
    "descent",
)
OPTIONAL_INVARIANTS = ("forged_notices_ignored", "metrics_kept_serving", "steps_at_pace")
"""Judged only when their faults came (or, for the pace, when fault-free steps measured it)."""
MAX_PROBLEMS = 20
"""Problems listed per invariant (all are counted)."""


@dataclass(slots=True)
class Verdict:
    invariants: dict[str, bool]
    lost: int
    details: dict[str, Any] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)

    def fail(self, name: str, problem: str) -> None:
        self.invariants[name] = False
        listed = self.problems.setdefault(name, [])
        if len(listed) < MAX_PROBLEMS:
            listed.append(problem)


def _docs(state: RegionState) -> dict[int, dict[str, Any]]:
    out = {}
    for v, raw in state.manifests.items():
        with contextlib.suppress(ValueError):
            doc = json.loads(raw)
            if isinstance(doc, dict):
                out[v] = doc
    return out


def check(
    admissions: list[dict[str, Any]],
    regions: Mapping[str, RegionState],
    *,
    steps: int,
    prompts: int,
    starts: Iterable[Start],
    forged: Iterable[Mapping[str, str]] = (),
) -> Verdict:
    """Every invariant of the run, and ``lost``: prompts of committed steps never admitted, results
    admitted twice, and versions 0..``steps`` missing in a region. ``starts``: every trainer
    process's start line."""
    verdict = Verdict(dict.fromkeys(INVARIANTS, True), 0)
    home = _docs(regions["home"])
    _admitted_once(verdict, admissions, home, steps, prompts)
    _leases(verdict, admissions, home, forged)
    _regions(verdict, regions, steps)
    _descent(verdict, regions, list(starts))
    return verdict


def _descent(verdict: Verdict, regions: Mapping[str, RegionState], starts: list[Start]) -> None:
    for region, st in regions.items():
        found = descent(_docs(st), starts)
        for problem in found.problems:
            verdict.fail("descent", f"{region}: {problem}")
        if region == "home":
            verdict.details.update(rollbacks=found.rollbacks, versions_abandoned=found.abandoned)
    verdict.details["trainer_starts"] = len(starts)


def _admitted_once(
    verdict: Verdict, admissions: list[dict[str, Any]], home: dict[int, dict[str, Any]], steps: int, prompts: int
) -> None:
    name = "every_prompt_admitted_once"
    seen = Counter((r.get("trainer"), r.get("job")) for r in admissions)
    twice = {k: n for k, n in seen.items() if n > 1}
    for (tag, job), n in sorted(twice.items(), key=str):
        verdict.fail(name, f"trainer {tag} admitted job {job} {n} times")
    by_step: dict[tuple[Any, Any], set[Any]] = {}
    for r in admissions:
        by_step.setdefault((r.get("trainer"), r.get("step")), set()).add(r.get("job"))
    never = 0
    for s in range(1, steps + 1):
        doc = home.get(s)
        if doc is None:
            verdict.fail(name, f"step {s}: version {s} is not committed at home")
            continue
        tag = (doc.get("meta") or {}).get("trainer")
        if not tag:
            verdict.fail(name, f"step {s}: version {s}'s manifest names no trainer incarnation (meta.trainer)")
            never += prompts
            continue
        jobs = by_step.get((tag, s), set())
        expected = {f"{tag}:{s}:{i}" for i in range(prompts)}
        missing, extra = expected - jobs, jobs - expected
        never += len(missing)
        if missing:
            verdict.fail(
                name, f"step {s} (trainer {tag}): {len(missing)} prompts never admitted: {sorted(missing)[:4]}"
            )
        if extra:
            verdict.fail(name, f"step {s} (trainer {tag}): admitted jobs that are not its prompts: {sorted(extra)[:4]}")
    dups = sum(n - 1 for n in twice.values())
    verdict.lost += never + dups
    verdict.details.update(admitted=len(admissions), never_admitted=never, admitted_twice=dups)


def _leases(
    verdict: Verdict,
    admissions: list[dict[str, Any]],
    home: dict[int, dict[str, Any]],
    forged: Iterable[Mapping[str, str]],
) -> None:
    lease, weights = "admitted_leases_valid", "rollouts_from_committed_weights"
    fields = ("job", "token", "actor", "version_hash", "weights_digest")
    fakes = {tuple(str(f.get(k)) for k in fields) for f in forged}
    no_deadline = 0
    for r in admissions:
        what = f"trainer {r.get('trainer')} job {r.get('job')} (actor {r.get('actor')}, token {r.get('token')})"
        step, version, token = r.get("step"), r.get("version"), r.get("token")
        m = home.get(version) if isinstance(version, int) else None
        if tuple(str(r.get(k)) for k in fields) in fakes:
            verdict.fail(lease, f"{what}: a forged result was admitted")
        if not (isinstance(token, int) and token > 0):
            verdict.fail(lease, f"{what}: lease token {token!r}")
        if m is None:
            verdict.fail(lease, f"{what}: version {version!r} is not committed at home")
            verdict.fail(weights, f"{what}: version {version!r} is not committed at home")
            continue
        if r.get("version_hash") != m.get("version_hash"):
            verdict.fail(lease, f"{what}: version hash {r.get('version_hash')} is not version {version}'s")
        if isinstance(step, int) and isinstance(version, int) and not max(0, step - 2) <= version <= step - 1:
            verdict.fail(lease, f"{what}: step {step} trained on version {version}, outside [step-2, step-1]")
        deadline, admitted = r.get("deadline_ms"), r.get("admitted_ms")
        if deadline is None:
            no_deadline += 1
        elif not (isinstance(admitted, int) and isinstance(deadline, int) and admitted <= deadline):
            verdict.fail(lease, f"{what}: admitted at {admitted} after its lease expired at {deadline}")
        digest = r.get("weights_digest")
        if digest != m.get("weights_digest"):
            verdict.fail(weights, f"{what}: generated on weights {digest}, not version {version}'s")
    verdict.details["admissions_without_deadline"] = no_deadline


def _regions(verdict: Verdict, regions: Mapping[str, RegionState], steps: int) -> None:
    exact, consecutive = "regions_replay_bit_exact", "versions_consecutive"
    want = list(range(steps + 1))
    missing_total = 0
    for region, st in regions.items():
        if st.audit_error is not None or st.audited != len(st.versions):
            verdict.fail(exact, f"{region}: audit: {st.audit_error or f'{st.audited} of {len(st.versions)} checked'}")
        missing = sorted(set(want) - set(st.versions))
        extra = sorted(set(st.versions) - set(want))
        missing_total += len(missing)
        if missing or extra:
            verdict.fail(consecutive, f"{region}: versions missing {missing[:10]}, beyond the run {extra[:10]}")
        for v, doc in sorted(_docs(st).items()):
            if doc.get("step") != v or doc.get("version") != v:
                verdict.fail(
                    consecutive,
                    f"{region}: version {v}'s manifest says version {doc.get('version')}, step {doc.get('step')}",
                )
    home = regions["home"]
    for v in home.versions:
        differ = [r for r, st in regions.items() if st.manifests.get(v) != home.manifests.get(v)]
        if differ:
            verdict.fail(exact, f"version {v}: manifest bytes in {differ} differ from home's (or are missing)")
    verdict.lost += missing_total
    verdict.details["versions_missing"] = missing_total


def read_admissions(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The admissions log's records and how many lines were not JSON objects (a torn last line of a
    killed trainer is one)."""
    out: list[dict[str, Any]] = []
    bad = 0
    if not path.exists():
        return out, bad
    for line in path.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(doc, dict):
            out.append(doc)
        else:
            bad += 1
    return out, bad


# ---------------------------------------------------------------- what the roles said

PATTERNS = {
    "trainer_resumed": r"resuming|resumed",
    "redis_state_lost": r"lost its state",
    "redis_unreachable": r"does not answer|Error \d+ connecting|Connection refused|Connection reset",
    "fallback_reads": r"from the fallback",
    "actor_rejoined": r"rejoined at version",
    "staging_failed": r"staging failed|cannot reach version",
    "relay_refused": r"relay \w+: refused",
    "relay_catch_up": r"will catch up|will retry on the next scan",
    "entries_skipped": r"skipped [^(]*\(",
    "results_refused": r"the trainer dropped its result|refused \d+ results",
    "damage_detected": r"sha256|is truncated|declares version|signed by key|does not verify|missing fields|unsigned",
    "tracebacks": r"^Traceback \(most recent call last\)",
    "fatal_errors": r"^aurora: error:",
    "actor_stopped_by_notices": r"refused \d+ results in a row",
    "unverified_notices": r"is not signed by the run's key: not acted on",
}
_COMPILED = {k: re.compile(p) for k, p in PATTERNS.items()}


def scan_logs(workdir: Path) -> dict[str, Any]:
    """Per role (the log's name up to its first '-'), how many lines matched each pattern, and the last
    line of every traceback (what a role died of)."""
    counts: dict[str, Counter[str]] = {}
    deaths: list[str] = []
    for log in sorted(workdir.glob("*.log")):
        role = log.stem.split("-", 1)[0]
        c = counts.setdefault(role, Counter())
        lines = log.read_text(errors="replace").splitlines()
        in_tb = False
        for line in lines:
            text = line.split("] ", 1)[-1]
            for k, rx in _COMPILED.items():
                if rx.search(text):
                    c[k] += 1
            if text.startswith("Traceback (most recent call last)"):
                in_tb = True
            elif text.startswith("aurora: error:") or (
                in_tb and text and not text.startswith((" ", "During handling", "The above exception"))
            ):
                deaths.append(f"{log.name}: {text[:300]}")
                in_tb = False
    return {"by_role": {r: dict(c) for r, c in counts.items() if c}, "deaths": deaths[:40]}


# ---------------------------------------------------------------- the end of a run


def _judge_notices_scrapes_rotations(verdict: Verdict, faults: Faults, said: Counter[str], home: RegionState) -> None:
    """Issue 34's faults: no actor stops on a notice the trainer did not sign (the chaos run drops none
    of an honest actor's results), the trainer's /metrics answers a real scrape after every garbage
    one (None: the trainer was restarting, which says nothing of the endpoint), and whether each
    injected key rotation committed (a version at home is signed by its key)."""
    if faults.injected["forged_notice"]:
        verdict.invariants["forged_notices_ignored"] = True
        if said["actor_stopped_by_notices"]:
            verdict.fail("forged_notices_ignored", f"{said['actor_stopped_by_notices']} actor(s) stopped on notices")
    if faults.injected["garbage_scrape"]:
        verdict.invariants["metrics_kept_serving"] = True
        for s in faults.scrapes:
            if s.get("answered") is False:
                verdict.fail("metrics_kept_serving", f"no answer to a scrape after garbage variant {s['variant']}")
    verdict.details["garbage_scrapes"] = Counter(str(s.get("answered", "not sent")) for s in faults.scrapes)
    signers = {(d.get("run") or {}).get("signed_by") for d in _docs(home).values()}
    verdict.details["key_rotations"] = [{**r, "committed": r["to"] in signers} for r in faults.rotations]


def summarize(
    *,
    seed: int,
    requested: int,
    steps: int,
    prompts: int,
    faults: Faults,
    counts: dict[str, Counter[str]],
    crashes: list[dict[str, Any]],
    admissions: Path,
    regions: dict[str, RegionState],
    work: Path,
    t0: float,
    notes: list[str],
    extra: dict[str, Any],
    calm_steps: int = 0,
) -> dict[str, Any]:
    """The run's JSON: what was injected, what recovered, the verdicts, and where the logs are."""
    records, torn = read_admissions(admissions)
    if torn:
        notes.append(f"{torn} lines of the admissions log are not JSON (a trainer killed mid-write)")
    starts = read_starts(work / "trainer.log")
    verdict = check(records, regions, steps=steps, prompts=prompts, starts=starts, forged=faults.forged_results)
    paced = pace(records, calm_steps, set(faults.injected))
    if paced["held"] is not None:
        verdict.invariants["steps_at_pace"] = paced["held"]
        if not paced["held"]:
            verdict.problems["steps_at_pace"] = [
                f"step {s} took {t:.2f} s to admit, over {PACE_BOUND}x the slowest fault-free step "
                f"({paced['baseline_s']:.2f} s)"
                for s, t in paced["per_step_s"].items()
                if s > calm_steps and t > PACE_BOUND * paced["baseline_s"]
            ][:MAX_PROBLEMS]
    if verdict.details.get("admissions_without_deadline"):
        notes.append("admission records carry no deadline_ms: lease expiry is checked by the trainer's admit only")
    logs = scan_logs(work)
    said: Counter[str] = Counter()
    for by_role in logs["by_role"].values():
        said.update(by_role)
    _judge_notices_scrapes_rotations(verdict, faults, said, regions["home"])
    zero: Counter[str] = Counter()
    return {
        "bench": "chaos",
        "seed": seed,
        "faults_requested": requested,
        "faults_injected": dict(sorted(faults.injected.items())),
        "recoveries": {
            "role_restarts": sum(c["restarted"] for c in counts.values()),
            "trainer_resumes": counts.get("trainer", zero)["started"] - 1,
            "role_crashes": sum(c["crashed"] for c in counts.values()),
            "redis_rebuilds": said["redis_state_lost"],
            "fallback_reads": said["fallback_reads"],
            "relay_catch_ups": said["relay_catch_up"],
            "actor_rejoins": said["actor_rejoined"],
            "damage_detected": said["damage_detected"],
        },
        "trainer_kills": _trainer_kills(faults.kills),
        "lost": verdict.lost,
        "invariants": verdict.invariants,
        "problems": verdict.problems,
        "details": verdict.details,
        "steps": steps,
        "pace": paced,
        "versions": {r: len(st.versions) for r, st in regions.items()},
        "seconds": round(time.monotonic() - t0, 1),
        "processes": {"by_role": {r: dict(c) for r, c in counts.items()}, "crashes": crashes[:30]},
        "logs": logs,
        **extra,
        "notes": notes,
        "workdir": str(work),
    }


PACE_BOUND = 2.0
"""Under faults of the writer family alone, each step is admitted within this many times the fault-free pace."""


def pace(admissions: list[dict[str, Any]], calm_steps: int, injected: set[str]) -> dict[str, Any]:
    """Each step's admission time (from the last admission of the step before to its own last, one
    trainer incarnation; 0 when it came first) against the fault-free baseline: the slowest of steps
    3..``calm_steps`` (step 2 waits for actors still calibrating), all admitted before the first fault.
    The slowest, not the median: a step of a small run takes a fraction of a second and varies
    threefold between fault-free steps, where a writer fault that costs anything costs a lease (8 s)
    or every step. ``held``: every later step kept within :data:`PACE_BOUND` times it; None where
    that is not asked (no calm steps, or a fault outside the writer family: kills and partitions
    are allowed to cost time)."""
    last: dict[tuple[Any, int], int] = {}
    for r in admissions:
        step, at = r.get("step"), r.get("admitted_ms")
        if isinstance(step, int) and isinstance(at, int):
            key = (r.get("trainer"), step)
            last[key] = max(last.get(key, at), at)
    per_step: dict[int, float] = {}
    for (tag, step), at in sorted(last.items(), key=lambda kv: kv[0][1]):
        before = last.get((tag, step - 1))
        if before is not None:
            per_step[step] = max(0, at - before) / 1000
    calm = sorted(t for s, t in per_step.items() if 3 <= s <= calm_steps)
    baseline = calm[-1] if calm else None
    after = {s: t for s, t in per_step.items() if s > calm_steps}
    asked = baseline is not None and baseline > 0 and bool(injected) and injected <= set(WRITERS)
    return {
        "baseline_s": baseline,
        "calm_steps": calm_steps,
        "per_step_s": per_step,
        "max_ratio": max(after.values()) / baseline if baseline and after else None,
        "bound": PACE_BOUND,
        "held": all(t <= PACE_BOUND * baseline for t in after.values()) if asked and baseline else None,
    }


def _trainer_kills(kills: list[dict[str, Any]]) -> dict[str, int]:
    """How the trainer kills that waited for a version's event landed: killed at all, after that
    version's commit, and after its commit but before its state was saved."""
    mine = [k for k in kills if k.get("target") == "trainer" and k.get("killed")]
    return {
        "killed": len(mine),
        "after_commit": sum(bool(k.get("committed")) for k in mine),
        "committed_without_state": sum(bool(k.get("committed")) and not k.get("state_saved") for k in mine),
    }
