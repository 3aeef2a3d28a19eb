"""Prometheus, for real: a real ``prometheus`` scrapes a short live run (trainer, relay, an actor in
each region, real processes and a real redis-server) and every PromQL expression of the Grafana
dashboard is evaluated through its HTTP API; the scrape config docs/OPERATIONS.md gives and the
alert rules the project ships pass ``promtool check``, and the rules' ``promtool test rules`` unit
tests show each alert firing when it should and staying quiet when the run is healthy.

Skipped, saying why, only where ``prometheus``/``promtool`` are not installed (``make test``
installs Debian's package when it runs as root with apt-get).
"""

from __future__ import annotations

import math
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aurora_store.testing.processes import wait_for
from aurora_store.testing.prometheus import (
    PrometheusServer,
    PrometheusUnavailable,
    Series,
    executable,
    promtool,
    scrape_config,
)
from tests.monitoring import REPO, Samples, World, dashboard, panel_queries, value

RULES = REPO / "infra" / "prometheus" / "aurora-alerts.yml"
RULE_TESTS = REPO / "infra" / "prometheus" / "aurora-alerts.test.yml"
OPERATIONS = REPO / "docs" / "OPERATIONS.md"
DROPPED = "aurora_trainer_results_dropped_total"
REJECTED = "aurora_artifacts_rejected_total"
SKIPPED = "aurora_redis_entries_skipped_total"
SCRAPE_S = 1.0
"""The live run's scrape (and rule evaluation) interval."""


@pytest.fixture(scope="module")
def prometheus_installed() -> None:
    try:
        executable("prometheus")
        executable("promtool")
    except PrometheusUnavailable as exc:
        pytest.skip(str(exc))


def rate_interval(scrape_s: float, interval_s: float) -> float:
    """Grafana's ``$__rate_interval``: max($__interval + the data source's scrape interval, 4 x the
    scrape interval) -- at least four scrapes, so a rate always has two samples to work with."""
    return max(interval_s + scrape_s, 4 * scrape_s)


def grafana(expr: str, *, region: str, rate_s: float) -> str:
    """``expr`` with the dashboard's variables substituted as Grafana does: ``$region`` by the
    selected value (``.*``, the variable's ``allValue``, for "All"), ``$__rate_interval`` by a duration."""
    out = expr.replace("$__rate_interval", f"{int(rate_s * 1000)}ms").replace("$region", region)
    assert "$" not in out, f"a variable the test does not know in {expr}"
    return out


# ------------------------------------------------------------ the docs' scrape config, and the rules


def docs_scrape_config() -> str:
    """The scrape config docs/OPERATIONS.md gives for the Terraform example: the ```yaml block that
    follows the ``<!-- prometheus.yml ... -->`` marker (so the doc and what is checked cannot drift)."""
    text = OPERATIONS.read_text()
    m = re.search(r"<!-- prometheus\.yml[^>]*-->\s*```yaml\n(?P<body>.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert m, "docs/OPERATIONS.md shows the example's prometheus.yml after a <!-- prometheus.yml --> marker"
    return m.group("body")


def test_promtool_checks_the_docs_scrape_config_and_the_rules_it_loads(
    prometheus_installed: None, tmp_path: Path
) -> None:
    config = docs_scrape_config()
    assert "aurora-alerts.yml" in config, "the docs' config loads the alert rules the project ships"
    for job in ("aurora-trainer", "aurora-relay", "aurora-actor"):
        assert f"job_name: {job}" in config
    (tmp_path / "prometheus.yml").write_text(config)
    shutil.copy(RULES, tmp_path / "aurora-alerts.yml")  # where the docs say to put it: beside prometheus.yml
    checked = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    out = checked.stdout + checked.stderr
    assert checked.returncode == 0, out
    assert "SUCCESS" in out and "aurora-alerts.yml" in out, f"the rule file was checked too:\n{out}"
    rules = promtool("check", "rules", str(RULES))
    assert rules.returncode == 0, rules.stdout + rules.stderr

    bad = tmp_path / "bad.yml"  # and promtool is no rubber stamp: a typo in a rule fails the check
    expr = "max by (region, actor) (aurora_actor_version_lag) > 2"
    assert expr in RULES.read_text()
    bad.write_text(RULES.read_text().replace(expr, expr.replace("_lag)", "_lag{)")))
    assert promtool("check", "rules", str(bad)).returncode != 0


def test_each_alert_fires_when_it_should_and_not_when_the_run_is_healthy(prometheus_installed: None) -> None:
    """``promtool test rules`` on the unit tests committed beside the rules (series fed in, alerts
    expected at given times: each alert firing on its trouble, and none on a healthy run)."""
    out = promtool("test", "rules", str(RULE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    tests = RULE_TESTS.read_text()
    alerts = set(re.findall(r"^\s*- alert: (\w+)", RULES.read_text(), re.MULTILINE))
    assert alerts == {
        "AuroraActorLagging",
        "AuroraRegionNotReceiving",
        "AuroraTrainerNotPublishing",
        "AuroraResultsDropped",
        "AuroraTargetDown",
        "AuroraArtifactsRejected",
    }
    for alert in alerts:  # each one proven both ways: expected firing somewhere, and expected silent
        fired = re.findall(rf"alertname: {alert}\n\s+exp_alerts:\n\s+- exp_labels", tests)
        silent = re.findall(rf"alertname: {alert}\n\s+exp_alerts: \[\]", tests)
        assert fired and silent, f"{alert}: the rule tests show it firing ({len(fired)}) and silent ({len(silent)})"


# ------------------------------------------------------------ a live run, scraped by a real Prometheus


@dataclass
class Run:
    """What the roles said directly (not through Prometheus) just before (``a``) and just after
    (``b``) the last two scrapes: a counter or version Prometheus holds at the end lies between."""

    a: dict[str, Samples]
    b: dict[str, Samples]

    def between(self, role: str, name: str, got: float, **labels: str) -> bool:
        return value(self.a[role], name, **labels) <= got <= value(self.b[role], name, **labels)


History = list[list[Series]]
"""One instant vector per evaluation time, oldest first; the last is 'now'."""


def by(series: list[Series], *labels: str) -> dict[tuple[str, ...], float]:
    out = {tuple(s.labels.get(k, "") for k in labels): s.value for s in series}
    assert len(out) == len(series), f"series repeat the labels {labels}: {series}"
    return out


def ever(history: History, pred: Callable[[Series], bool]) -> bool:
    return any(pred(s) for vec in history for s in vec)


def rates_ok(history: History) -> bool:
    """A rate is a number, never negative (counters do not go backwards in this run)."""
    return all(math.isfinite(s.value) and s.value >= 0 for vec in history for s in vec)


def counts_ok(history: History) -> bool:
    """Events in a window (increase(), and a new series' whole count): numbers, never negative."""
    return rates_ok(history)


def quantile_ok(history: History, top: float) -> bool:
    """A histogram quantile is NaN where nothing was observed in the window, else in [0, top] (it
    interpolates inside the buckets of aurora_store.metrics.SECONDS), and something was observed."""
    seen = [s.value for vec in history for s in vec if not math.isnan(s.value)]
    return bool(seen) and all(0 <= v <= top for v in seen)


Check = Callable[[list[Series], History, Run], None]
BYTES = "aurora_bucket_bytes_total"
ACTORS = {("eu", "eu-0"), ("home", "home-0")}


def checks() -> dict[tuple[str, str], Check]:
    """What each dashboard query must return in this run, by (panel title, legend): ``now`` is its
    instant vector at the end, ``h`` the ones at every second of the run, ``run`` what the roles
    said directly just before and after the end."""

    def published(now: list[Series], h: History, run: Run) -> None:
        got = by(now, "region")
        assert set(got) == {("home",)}, got  # only the trainer publishes, in home
        v = got[("home",)]
        assert v >= 3 and run.between("trainer", "aurora_trainer_published_version", v)
        assert run.between("trainer", "aurora_trainer_steps_total", v), "a version per step since version 0"

    def relayed(now: list[Series], h: History, run: Run) -> None:
        got = by(now, "region")
        assert set(got) == {("eu",)}, got
        v = got[("eu",)]
        assert v >= 3 and run.between("relay", "aurora_relay_region_version", v)
        assert v <= value(run.b["trainer"], "aurora_trainer_published_version"), "eu holds only what home has"

    def region_lag(now: list[Series], h: History, run: Run) -> None:
        got = by(now, "region")
        assert set(got) == {("eu",)} and 0 <= got[("eu",)] <= value(
            run.b["trainer"], "aurora_trainer_published_version"
        )

    def actor_lag(now: list[Series], h: History, run: Run) -> None:
        got = by(now, "region", "actor")
        assert set(got) == ACTORS and all(v >= 0 for v in got.values()), got

    def actor_applied(now: list[Series], h: History, run: Run) -> None:
        got = by(now, "region", "actor")
        assert set(got) == ACTORS, got
        for (_, actor), v in got.items():
            assert v >= 3 and run.between(actor, "aurora_actor_version", v, actor=actor), (actor, v)
        assert got[("eu", "eu-0")] <= value(run.b["relay"], "aurora_relay_region_version"), "only what eu holds"

    def bytes_per_s(now: list[Series], h: History, run: Run) -> None:
        moved = {("trainer", "upload"), ("relay", "download"), ("relay", "upload"), ("actor", "download")}
        assert moved <= set(by(now, "role", "direction")) and rates_ok(h), now
        seen = {(s.labels["role"], s.labels["direction"]) for vec in h for s in vec if s.value > 0}
        assert moved <= seen, f"each moved bytes while Prometheus watched: {seen}"
        relay = run.b["relay"]  # and what the relay says it copied is what it wrote to eu, at most
        assert 0 < value(relay, "aurora_relay_copied_bytes_total") <= value(relay, BYTES, direction="upload")

    def quantile(now: list[Series], h: History, run: Run) -> None:
        assert len(now) == 1, now
        assert quantile_ok(h, 600.0), h

    def relay_copy_p95(now: list[Series], h: History, run: Run) -> None:
        assert set(by(now, "region")) == {("eu",)}
        assert quantile_ok(h, 600.0)

    def throughput(now: list[Series], h: History, run: Run) -> None:
        got = by(now, "region", "actor")
        assert set(got) == ACTORS and all(v > 0 for v in got.values()), got

    def admitted(now: list[Series], h: History, run: Run) -> None:
        assert len(now) == 1 and rates_ok(h)
        assert value(run.a["trainer"], "aurora_trainer_results_admitted_total") > 0
        assert ever(h, lambda s: s.value > 0), "results were admitted while Prometheus watched"

    def dropped(now: list[Series], h: History, run: Run) -> None:
        assert ("unknown_job",) in by(now, "reason") and counts_ok(h)
        forged = [s.value for vec in h for s in vec if s.labels["reason"] == "unknown_job"]
        assert max(forged) == 1, f"the one result the test forged shows as one drop in a window: {forged}"

    def taken_back(name: str) -> Check:
        def check(now: list[Series], h: History, run: Run) -> None:
            assert len(now) == 1 and rates_ok(h)
            if value(run.b["trainer"], name) == 0:  # every actor kept beating and finished in time
                assert not ever(h, lambda s: s.value > 0)

        return check

    def rejected(now: list[Series], h: History, run: Run) -> None:
        got = by(now, "role", "region", "reason")
        assert set(got) == {("relay", "eu", "corrupt")} and counts_ok(h), got
        assert got[("relay", "eu", "corrupt")] == 0, "nothing refused since the repair"
        assert ever(h, lambda s: s.value > 0), "the damaged object was refused while Prometheus watched"

    def redis_skipped(now: list[Series], h: History, run: Run) -> None:
        assert {("relay", "bad_key"), ("relay", "bad_version")} <= set(by(now, "role", "reason")) and counts_ok(h)
        for reason in ("bad_key", "bad_version"):  # each forged once: one in a window, never more
            assert max(s.value for vec in h for s in vec if s.labels["reason"] == reason) == 1, reason

    return {
        ("Version per region", "{{region}} (trainer)"): published,
        ("Version per region", "{{region}} (relay)"): relayed,
        ("Region lag behind its source (versions)", "{{region}}"): region_lag,
        ("Actor version and lag", "lag {{region}}/{{actor}}"): actor_lag,
        ("Actor version and lag", "applied {{region}}/{{actor}}"): actor_applied,
        ("Bucket bytes/s by direction", "{{role}} {{direction}}"): bytes_per_s,
        ("Actor apply time", "p50"): quantile,
        ("Actor apply time", "p95"): quantile,
        ("Generation pause at a version switch", "p50"): quantile,
        ("Generation pause at a version switch", "p95"): quantile,
        ("Actor staging time", "p50"): quantile,
        ("Actor staging time", "p95"): quantile,
        ("Throughput EMA per actor", "{{region}}/{{actor}}"): throughput,
        ("Results admitted", "admitted"): admitted,
        ("Results dropped by reason", "{{reason}}"): dropped,
        ("Leases expired", "expired"): taken_back("aurora_trainer_leases_expired_total"),
        ("Leases expired", "stolen"): taken_back("aurora_trainer_jobs_stolen_total"),
        ("Artifacts rejected by reason", "{{role}} {{region}}: {{reason}}"): rejected,
        ("Relay copy time per version (p95)", "p95 {{region}}"): relay_copy_p95,
        ("Trainer publish time", "p50"): quantile,
        ("Trainer publish time", "p95"): quantile,
        ("Trainer publish time", "train p95"): quantile,
        ("Trainer publish time", "rollout wait p95"): quantile,
        ("Redis entries skipped", "{{role}}: {{reason}}"): redis_skipped,
    }


def forge(redis_url: str) -> None:
    """What a hostile or broken writer of the run's Redis keys does (the roles must count it): a
    result for a job that does not exist (the trainer drops it: unknown_job), and events the relay's
    coordinator skips: an announcement of an object that is no version's segment (bad_key) and a
    commit whose version is not a number (bad_version)."""
    from aurora_store.coord.coordinator import Coordinator
    from aurora_store.coord.jobs import JobBoard
    from aurora_store.coord.lease import Lease

    coord = Coordinator(redis_url, "rl")
    try:
        lease = Lease(job="t:999:0", token=1, step=999, version=0, deadline_ms=0, prompt={})
        JobBoard(coord).results.submit(lease, actor="intruder", version=0, version_hash="0" * 64, payload=b"[1]")
        events = coord.key("events", "home")
        seg = {"key": "versions/0000000001/notes.txt", "size": "10", "sha256": "ab" * 32}
        coord.r.xadd(events, {"type": "segment", "version": "1", **seg})
        coord.r.xadd(events, {"type": "commit", "version": "xyz"})
    finally:
        coord.r.close()


@pytest.mark.slow
def test_every_dashboard_query_answers_with_what_the_run_did(
    prometheus_installed: None, redis_server: Any, tmp_path: Path
) -> None:
    """The run: a trainer in home, an actor in home and one in eu, and a relay into eu that starts
    to find eu's copy of a version 0 object damaged (it refuses it, and retries every second) until
    the test repairs it, as an operator would after `aurora audit`; meanwhile the test forges a
    result and two Redis events. Prometheus scrapes every role each second from the start; once
    every role has done its part and two more scrapes have happened, each dashboard query is
    evaluated at every second of the run (what a Grafana panel over the run asks) and checked
    against what the roles said directly just before and just after."""
    import aurora_store
    from aurora_store.bucket.objectstore import ObjectStore
    from aurora_store.testing.damage import delete, overwrite

    home, eu = (tmp_path / "home" / "rl").as_uri(), (tmp_path / "eu" / "rl").as_uri()
    common = ("--redis", redis_server.url, "--run-id", "rl")
    trainer = ("--steps", "1000", "--sft-steps", "0", "--prompts", "4", "--group", "2", "--max-new-tokens", "4")
    with World(tmp_path, redis_server.url) as world:
        world.spawn("trainer", "train", "--store", home, *common, *trainer, "--lease-s", "20", "--lr", "5e-4")
        for actor, region, store in (("eu-0", "eu", eu), ("home-0", "home", home)):
            world.spawn(actor, "actor", "--store", store, "--region", region, "--worker-id", actor, *common)
        world.reserve("relay")
        jobs = {f"aurora-{name}": [f"127.0.0.1:{port}"] for name, port in world.ports.items()}
        (tmp_path / "prom").mkdir()
        config = scrape_config(jobs, interval_s=SCRAPE_S, rule_files=[str(RULES)])
        with PrometheusServer(config, tmp_path / "prom") as prom:
            started = time.time()
            roles = Roles(world)

            # eu's copy of version 0's first object is damaged before its relay starts
            run0 = aurora_store.open_run(home)
            wait_for(lambda: roles.poll() and bool(run0.versions()), "version 0 in home", 120, interval=0.2)
            key = run0.manifest(0).segments[0].key
            overwrite(ObjectStore(eu), key, b"damaged")
            relay = ("--source", home, "--dest", eu, "--dest-region", "eu", "--rescan-s", "1", *common)
            world.spawn("relay", "relay", *relay)
            refused = roles.until(lambda s: value(s["relay"], REJECTED, reason="corrupt") >= 1)
            wait_for(refused, "the relay to refuse the damaged object", 60, interval=0.2)
            prom.wait_for_scrapes(2, after=time.time(), interval_s=SCRAPE_S)  # Prometheus saw refusals
            delete(ObjectStore(eu), key)  # repaired: the relay's next scan copies version 0 and the rest
            repaired = time.time()
            forge(redis_server.url)

            try:
                wait_for(roles.until(lambda s: not missing(s)), "every role to do its part", 120, interval=0.2)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; still missing: {missing(roles.now)}") from None
            # the last refusal is out of the last window: the panel must be back at 0 at the end
            window = rate_interval(SCRAPE_S, SCRAPE_S) + SCRAPE_S
            wait_for(lambda: time.time() > repaired + window, "a window past the repair", window + 1)
            assert roles.poll()
            before = dict(roles.now)
            prom.wait_for_scrapes(2, after=time.time(), interval_s=SCRAPE_S)
            at = time.time()
            assert roles.poll()
            run = Run(before, dict(roles.now))
            _evaluate(prom, run, [*range_of(started, at), at], tmp_path)


class Roles:
    """Every role's metrics, scraped directly (not through Prometheus), the latest in ``now``."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.now: dict[str, Samples] = {}

    def poll(self) -> bool:
        """Scrape every role; False while one is not serving yet."""
        for name in self.world.procs:
            got = self.world.scrape(name)
            if got is None:
                return False
            self.now[name] = got
        return True

    def until(self, cond: Callable[[dict[str, Samples]], bool]) -> Callable[[], bool]:
        return lambda: self.poll() and cond(self.now)


def missing(s: dict[str, Samples]) -> list[str]:
    """What the run has not done yet, of what the queries are then checked against."""
    wanted = {
        "both actors at version 3": all(value(s[a], "aurora_actor_version") >= 3 for a in ("eu-0", "home-0")),
        "eu at version 3": value(s["relay"], "aurora_relay_region_version") >= 3,
        "results admitted": value(s["trainer"], "aurora_trainer_results_admitted_total") > 0,
        "the forged result dropped": value(s["trainer"], DROPPED, reason="unknown_job") == 1,
        "the forged events skipped": value(s["relay"], SKIPPED, reason="bad_version") == 1
        and value(s["relay"], SKIPPED, reason="bad_key") == 1,
    }
    return [what for what, ok in wanted.items() if not ok]


def range_of(start: float, end: float) -> list[float]:
    """Every scrape interval from ``start`` until before ``end``: a range query's steps."""
    return [start + i * SCRAPE_S for i in range(int((end - start) / SCRAPE_S))]


def _evaluate(prom: PrometheusServer, run: Run, instants: list[float], tmp: Path) -> None:
    doc = dashboard()
    queries = list(panel_queries(doc["panels"]))
    table = checks()
    assert {(t, legend) for t, legend, _ in queries} == set(table), "every query has its expectation here"
    for title, _, expr in queries:  # windows as Grafana sizes them, never a fixed one
        assert set(re.findall(r"\[([^\]]*)\]", expr)) <= {"$__rate_interval"}, f"{title}: {expr}"
    rate_s = rate_interval(SCRAPE_S, SCRAPE_S)
    report, failures = [], []
    for title, legend, expr in queries:
        q = grafana(expr, region=".*", rate_s=rate_s)
        history = [prom.query(q, t) for t in instants]
        final = history[-1]
        finite = [s.value for vec in history for s in vec if math.isfinite(s.value)]
        report.append(
            f"{title} / {legend}: {q}\n  at the end: {[(s.labels, s.value) for s in final]}\n"
            f"  over the run: min {min(finite, default=None)}, max {max(finite, default=None)}"
        )
        try:
            assert final, "no series"
            table[(title, legend)](final, history, run)
        except AssertionError as exc:
            failures.append(f"{title} / {legend}: {q}\n  at the end: {final}\n  {exc}")
    (tmp / "queries.txt").write_text("\n".join(report) + "\n")  # what each query returned, for the record
    print("\n".join(report))
    assert not failures, "\n".join(failures)

    # the region variable, as Grafana fills it (label_values(aurora_role_info, region)), and one region
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["region"]["definition"] == "label_values(aurora_role_info, region)"
    assert prom.label_values("region", "aurora_role_info") == ["eu", "home"]
    applied = next(e for t, lg, e in queries if (t, lg) == ("Actor version and lag", "applied {{region}}/{{actor}}"))
    eu_only = prom.query(grafana(applied, region="eu", rate_s=rate_s))
    assert [(s.labels["region"], s.labels["actor"]) for s in eu_only] == [("eu", "eu-0")]

    # the shipped rules ran on the real series without an error, and say what this run was
    rules = prom.rules()
    assert rules and all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    state = {r["name"]: r["state"] for r in rules if r["type"] == "alerting"}
    assert state["AuroraResultsDropped"] == "firing", state  # the forged result
    for name in ("AuroraRegionNotReceiving", "AuroraTrainerNotPublishing", "AuroraTargetDown"):
        assert state[name] == "inactive", state  # eu receives, the trainer publishes, every role answers
    # an actor may be 3 behind for a moment (eu's relay commits a burst after the repair): pending at most
    assert state["AuroraActorLagging"] in ("inactive", "pending"), state
