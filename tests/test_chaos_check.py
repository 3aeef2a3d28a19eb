"""``aurora bench chaos``'s invariant checker (`bench.chaos.check`, `bench.chaos.descent`): every invariant
holds on a clean run and fails on a planted violation, and what a naive check would flag wrongly passes.

Two kinds of input: hand-made manifests as JSON (what the checker reads of a bucket), and real runs
published with the project's own API into file:// directories (one per region), read back through
the same readers the bench uses, with a real admissions log and trainer log on disk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from aurora_store.bucket.run import open_run
from aurora_store.format import signing
from aurora_store.format.keys import manifest_key
from bench.chaos.bucket import RegionState, region_state
from bench.chaos.check import INVARIANTS, Verdict, check, pace, read_admissions, scan_logs
from bench.chaos.descent import Start, descent, read_starts
from tests.helpers import state_dict, step

STEPS, PROMPTS = 3, 2
NEW = Start("t1", None)
"""The start line of the one trainer process of a run without restarts."""


def _manifest(v: int, tag: str = "t1", **changes: Any) -> bytes:
    parent = None if v == 0 else {"version": v - 1, "version_hash": f"h{v - 1}"}
    doc = {"version": v, "step": v, "parent": parent, "meta": {"trainer": tag}, "version_hash": f"h{v}",
           "weights_digest": f"d{v}"}  # fmt: skip
    return json.dumps({**doc, **changes}, sort_keys=True).encode()


def _regions(**home_changes: dict[str, Any]) -> dict[str, RegionState]:
    manifests = {v: _manifest(v, **home_changes.get(str(v), {})) for v in range(STEPS + 1)}
    return {r: RegionState(list(manifests), dict(manifests), None, len(manifests)) for r in ("home", "eu", "ap")}


def _admissions(tag: str = "t1") -> list[dict[str, Any]]:
    """Every prompt of every step admitted once, each on the version before its step."""
    out = []
    for s in range(1, STEPS + 1):
        for i in range(PROMPTS):
            v = max(0, s - 2)
            out.append(
                {"trainer": tag, "step": s, "job": f"{tag}:{s}:{i}", "actor": "eu-0", "token": 10 * s + i,
                 "version": v, "version_hash": f"h{v}", "weights_digest": f"d{v}", "deadline_ms": 2000,
                 "admitted_ms": 1000}
            )  # fmt: skip
    return out


def _verdict(
    admissions: list[dict[str, Any]],
    regions: dict[str, RegionState] | None = None,
    starts: list[Start] | None = None,
    **kw: Any,
) -> Verdict:
    return check(
        admissions,
        regions or _regions(),
        steps=STEPS,
        prompts=PROMPTS,
        starts=[NEW] if starts is None else starts,
        **kw,
    )


def _only_fails(v: Verdict, invariant: str) -> None:
    assert not v.invariants[invariant], v.problems
    assert all(ok for name, ok in v.invariants.items() if name != invariant), v.problems


# ---------------------------------------------------------------- admissions and regions, hand-made


def test_a_clean_run_holds_every_invariant() -> None:
    v = _verdict(_admissions())
    assert v.invariants == dict.fromkeys(INVARIANTS, True) and v.lost == 0, v.problems
    assert v.details["trainer_starts"] == 1 and v.details["rollbacks"] == v.details["versions_abandoned"] == 0


def test_a_result_admitted_twice_fails_and_is_lost() -> None:
    adm = _admissions()
    v = _verdict([*adm, dict(adm[3])])
    _only_fails(v, "every_prompt_admitted_once")
    assert v.lost == 1 and "2 times" in v.problems["every_prompt_admitted_once"][0]


def test_a_prompt_never_admitted_fails_and_is_lost() -> None:
    v = _verdict(_admissions()[1:])
    _only_fails(v, "every_prompt_admitted_once")
    assert v.lost == 1 and "never admitted" in v.problems["every_prompt_admitted_once"][0]


def test_only_the_committing_incarnation_counts() -> None:
    """A killed trainer's admissions for a step it never committed do not stand in for the committer's,
    and (the case a check keyed on the step alone flags wrongly) do not count against it either."""
    adm = [r for r in _admissions() if r["step"] != 2] + [r for r in _admissions("t0") if r["step"] == 2]
    v = _verdict(adm)
    assert not v.invariants["every_prompt_admitted_once"] and v.lost == PROMPTS
    assert _verdict(adm, _regions(**{"2": {"meta": {"trainer": "t0"}}})).lost == 0
    killed = _admissions("t0")[: PROMPTS + 1]  # t0 admitted step 1 and part of step 2, then died uncommitted
    assert _verdict([*killed, *_admissions()]).invariants == dict.fromkeys(INVARIANTS, True)


@pytest.mark.parametrize(
    ("changes", "invariant"),
    [
        ({"version_hash": "h9"}, "admitted_leases_valid"),
        # a step's rollouts come from one of the two versions before it, never from its own
        ({"version": 3, "version_hash": "h3", "weights_digest": "d3"}, "admitted_leases_valid"),
        ({"admitted_ms": 3000}, "admitted_leases_valid"),  # after the lease's deadline
        ({"token": -1}, "admitted_leases_valid"),
        ({"weights_digest": "d9"}, "rollouts_from_committed_weights"),
        ({"weights_digest": None}, "rollouts_from_committed_weights"),
    ],
)
def test_a_bad_admission_fails_its_invariant(changes: dict[str, Any], invariant: str) -> None:
    adm = _admissions()
    adm[-1] = {**adm[-1], **changes}
    _only_fails(_verdict(adm), invariant)


def test_an_admission_of_an_uncommitted_version_fails_both_lease_and_weights() -> None:
    adm = _admissions()
    adm[0] = {**adm[0], "version": 9}
    v = _verdict(adm)
    assert not v.invariants["admitted_leases_valid"] and not v.invariants["rollouts_from_committed_weights"]


def test_an_admitted_forged_result_fails_and_a_refused_forgery_of_the_same_lease_does_not() -> None:
    adm = _admissions()
    r = adm[0]
    forged = {k: str(r[k]) for k in ("job", "token", "actor", "version_hash", "weights_digest")}
    _only_fails(_verdict(adm, forged=[forged]), "admitted_leases_valid")
    # the false positive a check matching forgeries by their lease would raise: a forgery of the same
    # lease with another digest (refused) does not taint the real result admitted after it
    assert _verdict(adm, forged=[{**forged, "weights_digest": "e" * 64}]).invariants == dict.fromkeys(INVARIANTS, True)


def test_admissions_without_a_deadline_are_counted_not_failed() -> None:
    """Records of a trainer that logged no deadline (older logs) are no violation; they are counted."""
    adm = [{k: val for k, val in r.items() if k not in ("deadline_ms", "admitted_ms")} for r in _admissions()]
    v = _verdict(adm)
    assert v.invariants == dict.fromkeys(INVARIANTS, True) and v.details["admissions_without_deadline"] == len(adm)


def test_regions_that_differ_or_lack_a_version_fail() -> None:
    regions = _regions()
    regions["eu"].manifests[2] = _manifest(2, weights_digest="forged")
    v = _verdict(_admissions(), regions)
    assert not v.invariants["regions_replay_bit_exact"] and v.invariants["versions_consecutive"]
    regions = _regions()
    regions["ap"].versions.remove(3)
    del regions["ap"].manifests[3]
    v = _verdict(_admissions(), regions)
    assert not v.invariants["versions_consecutive"] and not v.invariants["regions_replay_bit_exact"] and v.lost == 1
    regions = _regions(**{"1": {"step": 0}})
    assert not _verdict(_admissions(), regions).invariants["versions_consecutive"]
    regions = _regions()
    regions["home"].audit_error = "v2: sha256 mismatch"
    _only_fails(_verdict(_admissions(), regions), "regions_replay_bit_exact")


def test_admissions_log_with_a_torn_line_and_logs_scanned(tmp_path: Path) -> None:
    path = tmp_path / "admissions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _admissions()) + '{"trainer": "t1", "st')
    records, torn = read_admissions(path)
    assert records == _admissions() and torn == 1
    (tmp_path / "relay-eu.log").write_text(
        '[ 1.0] Traceback (most recent call last):\n[ 1.0]   File "x", line 1\n[ 1.0] ValueError: boom\n'
        "[ 2.0] aurora: error: s3://b/v/manifest.json: declares version 1, expected 3\n"
    )
    logs = scan_logs(tmp_path)
    assert logs["by_role"]["relay"] == {"tracebacks": 1, "fatal_errors": 1, "damage_detected": 1}
    assert logs["deaths"] == ["relay-eu.log: ValueError: boom", "relay-eu.log: aurora: error: s3://b/v/manifest."
                              "json: declares version 1, expected 3"]  # fmt: skip


# ---------------------------------------------------------------- descent, hand-made

A, B, C = "aaaaaaaa", "bbbbbbbb", "cccccccc"


def _docs(publishers: dict[int, str], **extra: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Manifests of versions 0.. (``publishers``: version -> trainer tag), with ``extra`` fields by version."""
    return {v: {**json.loads(_manifest(v, tag)), **extra.get(str(v), {})} for v, tag in publishers.items()}


def _rollback(to: int, v: int) -> dict[str, Any]:
    return {"version": to, "version_hash": f"h{to}", "abandons": list(range(to + 1, v))}


SEVEN = {v: A for v in range(7)} | {7: B}
"""A published versions 0..6; B, started after it died, published 7."""


def test_a_resume_from_the_latest_state_descends_from_the_parent() -> None:
    found = descent(_docs(SEVEN | {8: B}), [Start(A, None), Start(B, 6, 6)])
    assert found.problems == [] and found.rollbacks == 0


def test_a_resume_from_an_older_state_without_a_declared_rollback_fails() -> None:
    """B resumed from the state of version 4 (5 and 6 had none) and published 7 on parent 6."""
    found = descent(_docs(SEVEN), [Start(A, None), Start(B, 4, 6)])
    assert len(found.problems) == 1 and "descend from version 4, not from its parent 6" in found.problems[0]


def test_a_declared_rollback_passes_and_is_counted() -> None:
    docs = _docs(SEVEN | {8: B}, **{"7": {"rolls_back_to": _rollback(4, 7)}})
    found = descent(docs, [Start(A, None), Start(B, 4, 6)])
    assert found.problems == [] and (found.rollbacks, found.abandoned) == (1, 2)
    regions = {
        r: RegionState(sorted(docs), {v: json.dumps(d).encode() for v, d in docs.items()}) for r in ("home", "eu")
    }
    v = check([], regions, steps=8, prompts=0, starts=[Start(A, None), Start(B, 4, 6), Start(C, 8, 8)])
    assert v.invariants["descent"], v.problems
    assert (v.details["rollbacks"], v.details["versions_abandoned"], v.details["trainer_starts"]) == (1, 2, 3)


@pytest.mark.parametrize(
    ("back", "wrong"),
    [
        (_rollback(3, 7), "trainer resumed from the state of 4"),
        ({**_rollback(4, 7), "version_hash": "h3"}, "not that version's"),
        ({**_rollback(4, 7), "abandons": [5]}, "not the versions between"),
        ({**_rollback(4, 7), "abandons": None}, "not the versions between"),
        ({"version": 9, "version_hash": "h9", "abandons": []}, "not committed here"),
        ("4", "not an object"),
    ],
)
def test_a_rollback_that_misstates_what_it_rolls_back_to_fails(back: Any, wrong: str) -> None:
    found = descent(_docs(SEVEN, **{"7": {"rolls_back_to": back}}), [Start(A, None), Start(B, 4, 6)])
    assert any(wrong in p for p in found.problems), found.problems


def test_a_rollback_declared_by_a_resume_from_the_parent_fails() -> None:
    found = descent(_docs(SEVEN, **{"7": {"rolls_back_to": _rollback(6, 7)}}), [Start(A, None), Start(B, 6, 6)])
    assert found.problems == []  # a rollback to the parent abandons nothing: consistent
    found = descent(_docs(SEVEN, **{"7": {"rolls_back_to": _rollback(5, 7)}}), [Start(A, None), Start(B, 6, 6)])
    assert any("declares a rollback to version 5" in p for p in found.problems)


def test_only_a_process_first_version_may_roll_back() -> None:
    found = descent(
        _docs(SEVEN | {8: B}, **{"8": {"rolls_back_to": _rollback(4, 8)}}), [Start(A, None), Start(B, 6, 6)]
    )
    assert len(found.problems) == 1 and "continues from its version 7" in found.problems[0]


def test_a_version_whose_trainer_logged_no_start_line_fails() -> None:
    found = descent(_docs(SEVEN), [Start(A, None)])
    assert len(found.problems) == 1 and "logged no start line: unknown origin" in found.problems[0]
    found = descent(_docs(SEVEN, **{"7": {"meta": {}}}), [Start(A, None)])
    assert len(found.problems) == 1 and "names no trainer" in found.problems[0]


def test_two_trainers_interleaved_fail() -> None:
    """A continues after B published 7 (two live trainers): A's 8 descends from its own 6, not from 7."""
    found = descent(_docs(SEVEN | {8: A}), [Start(A, None), Start(B, 6, 6)])
    assert len(found.problems) == 1 and "continues from its own version 6, not from its parent 7" in found.problems[0]


def test_a_new_run_that_starts_above_version_zero_fails() -> None:
    found = descent(_docs(SEVEN), [Start(A, None), Start(B, None)])
    assert len(found.problems) == 1 and "started a new run" in found.problems[0]


def test_a_start_that_published_nothing_is_fine_and_conflicting_starts_fail() -> None:
    assert descent(_docs(SEVEN), [Start(A, None), Start(C, 5, 6), Start(B, 6, 6)]).problems == []
    found = descent(_docs(SEVEN), [Start(A, None), Start(B, 6, 6), Start(B, 4, 6)])
    assert any("two different start lines" in p for p in found.problems)


def test_start_lines_are_read_whatever_their_prefix(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    log.write_text(
        f"[    0.512] 2026-12-03 14:00:00,001 trainer.loop trainer {A} starts a new run at version 0\n"
        '[    3.000] {"step": 1, "version": 1}\n'
        f"[   20.250] trainer {B} resumes from the state of version 4; latest committed version 6\n"
        "[   21.000] trainer XYZ resumes from the state of version 4; latest committed version 6\n"
        f"[   22.000] WARNING trainer {C} resumes from the state of version x; latest committed version 6\n"
    )
    assert read_starts(log) == [Start(A, None), Start(B, 4, 6)]
    assert read_starts(tmp_path / "none.log") == []


# ---------------------------------------------------------------- real runs in file:// buckets


def _publish(uri: str, key: bytes, tag: str, n: int, seed: int) -> list[Any]:
    """``n`` more versions of a small model into ``uri``, each named ``tag``'s, as a trainer process would."""
    out = []
    sd = state_dict(seed)
    with open_run(uri, signing_key=key) as run:
        for i in range(n):
            latest = run.latest()
            out.append(run.publish(sd, step=0 if latest is None else latest + 1, meta={"trainer": tag}))
            sd = step(sd, seed * 100 + i)
    return out


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Any]:
    """A run of 4 versions (A published 0..2 and was killed; B resumed from the state of 2 and published
    3) at home, copied bit for bit to eu and ap; the admissions and trainer logs beside them."""
    private, public = signing.generate_keypair()
    home = tmp_path / "home"
    infos = _publish(home.as_uri(), private, A, 3, seed=1) + _publish(home.as_uri(), private, B, 1, seed=2)
    for region in ("eu", "ap"):
        shutil.copytree(home, tmp_path / region)
    lines = []
    for s in range(1, 4):
        tag, v = (A if s < 3 else B), max(0, s - 2)
        on = {"version": v, "version_hash": infos[v].version_hash, "weights_digest": infos[v].weights_digest}
        for i in range(PROMPTS):
            lines.append({"trainer": tag, "step": s, "job": f"{tag}:{s}:{i}", "actor": "eu-0", "token": s * 10 + i,
                          **on, "deadline_ms": 2000, "admitted_ms": 1000})  # fmt: skip
    (tmp_path / "admissions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "trainer.log").write_text(
        f"[    0.100] 2026-12-03 14:00:00,000 trainer.loop trainer {A} starts a new run at version 0\n"
        f"[   30.000] 2026-12-03 14:00:30,000 trainer.loop trainer {B} resumes from the state of version 2; "
        "latest committed version 2\n"
    )
    return {"dir": tmp_path, "public": public}


def _check_files(world: dict[str, Any]) -> Verdict:
    """The checker on what the files hold, read as the bench reads them at the end of a run."""
    d = world["dir"]
    regions = {r: region_state((d / r).as_uri(), {}, world["public"]) for r in ("home", "eu", "ap")}
    records, _ = read_admissions(d / "admissions.jsonl")
    return check(records, regions, steps=3, prompts=PROMPTS, starts=read_starts(d / "trainer.log"))


def test_a_published_run_on_disk_holds_every_invariant(world: dict[str, Any]) -> None:
    v = _check_files(world)
    assert v.invariants == dict.fromkeys(INVARIANTS, True) and v.lost == 0, v.problems
    assert v.details["trainer_starts"] == 2


def test_a_result_logged_twice_on_disk_fails(world: dict[str, Any]) -> None:
    log = world["dir"] / "admissions.jsonl"
    log.write_text(log.read_text() + log.read_text().splitlines(keepends=True)[-1])
    v = _check_files(world)
    _only_fails(v, "every_prompt_admitted_once")
    assert v.lost == 1


def test_a_damaged_segment_in_a_region_fails_bit_exactness(world: dict[str, Any]) -> None:
    eu = world["dir"] / "eu"
    doc = json.loads((eu / manifest_key(3)).read_bytes())
    seg = eu / doc["segments"][0]["key"]
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0x5A
    seg.write_bytes(bytes(data))
    v = _check_files(world)
    _only_fails(v, "regions_replay_bit_exact")
    assert any(p.startswith("eu: audit") for p in v.problems["regions_replay_bit_exact"])


def test_a_version_missing_in_a_region_fails(world: dict[str, Any]) -> None:
    (world["dir"] / "ap" / manifest_key(3)).unlink()
    v = _check_files(world)
    assert not v.invariants["versions_consecutive"] and not v.invariants["regions_replay_bit_exact"] and v.lost == 1
    assert v.invariants["descent"] and v.invariants["every_prompt_admitted_once"]


def test_a_resume_from_an_older_state_on_disk_fails_descent(world: dict[str, Any]) -> None:
    """What a trainer of today does after losing version 2's state: it resumes from 1's and publishes
    3 on parent 2, declaring nothing."""
    log = world["dir"] / "trainer.log"
    log.write_text(log.read_text().replace("state of version 2", "state of version 1"))
    v = _check_files(world)
    _only_fails(v, "descent")
    assert {p.split(":")[0] for p in v.problems["descent"]} == {"home", "eu", "ap"}
    log.write_text(log.read_text().replace(B, C))  # B's start line is gone: its version 3 is of unknown origin
    assert "unknown origin" in _check_files(world).problems["descent"][0]


def _admitted(times_s: dict[int, float], tag: str = "t1") -> list[dict[str, Any]]:
    """An admissions log whose step ``s`` ends (its last admission) at ``times_s[s]`` seconds."""
    out = []
    for s, t in times_s.items():
        out += [
            {"trainer": tag, "step": s, "admitted_ms": int(t * 1000) - 50},
            {"trainer": tag, "step": s, "admitted_ms": int(t * 1000)},
        ]
    return out


def test_pace_holds_steps_to_twice_the_slowest_fault_free_one() -> None:
    ends = {1: 1.0, 2: 5.0, 3: 6.0, 4: 6.5, 5: 7.5, 6: 8.0, 7: 9.9, 8: 10.5}  # step 2: the start, not counted
    paced = pace(_admitted(ends), 5, {"forged_flood"})
    assert paced["baseline_s"] == 1.0 and paced["per_step_s"][2] == 4.0
    assert paced["held"] is True and paced["max_ratio"] == pytest.approx(1.9)
    slow = pace(_admitted({**ends, 9: 12.6}), 5, {"forged_flood", "slow_actor"})
    assert slow["held"] is False and slow["max_ratio"] == pytest.approx(2.1)


def test_pace_is_not_asked_of_kills_nor_without_calm_steps() -> None:
    ends = {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 30.0}
    assert pace(_admitted(ends), 4, {"kill_trainer", "forged_flood"})["held"] is None
    assert pace(_admitted(ends), 0, {"forged_flood"})["held"] is None
    assert pace(_admitted(ends), 4, set())["held"] is None
    assert pace(_admitted(ends), 4, {"forged_flood"})["held"] is False


def test_pace_counts_steps_of_one_trainer_incarnation_and_never_negative() -> None:
    log = _admitted({1: 1.0, 2: 2.0, 3: 3.0}, "t1") + _admitted({4: 50.0, 5: 51.0}, "t2")
    log.append({"trainer": "t2", "step": 6, "admitted_ms": 50_500})  # admitted before step 5's last
    log += [{"trainer": "t2", "step": "x", "admitted_ms": 1}, {"step": 7}]  # torn or foreign: ignored
    per = pace(log, 3, {"forged_flood"})["per_step_s"]
    assert 4 not in per and per[5] == 1.0 and per[6] == 0.0 and set(per) == {2, 3, 5, 6}
