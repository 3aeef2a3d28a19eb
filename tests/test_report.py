"""The HTML run report: eight well-formed SVG charts, escaped strings, degenerate data, shape errors."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trainer.charts import rolling_median
from trainer.report import render_report, write_report

SVG = "{http://www.w3.org/2000/svg}"


def realistic(steps: int = 20) -> dict[str, Any]:
    actors = {"us-east/a0": "us-east", "us-east/a1": "us-east", "eu-west/a0": "eu-west", "ap-south/a0": "ap-south"}
    return {
        "title": "run 2025-06-01 qwen-0.5b grpo",
        "summary": {"steps": steps, "reward first": 0.12, "reward last": 0.61, "versions verified": steps},
        "steps": [
            {
                "step": s,
                "version": s + 1,
                "reward_mean": 0.12 + 0.5 * (1 - math.exp(-s / 6)),
                "delta_bytes": 40_000_000 + 1_000_000 * (s % 3),
                "full_bytes": 988_000_000 if s % 5 == 0 else 0,  # 0: no full snapshot this version
                "density": 0.04 + 0.01 * math.sin(s),
                "publish_s": 1.5 + 0.1 * s,
                "entropy": 2.0 - 0.05 * s,
                "kl": 0.001 * s,
                "clip_frac": None if s % 4 == 0 else 0.02,  # None: a step that trained nothing
                "response_len": 180.0 + 3 * s,
            }
            for s in range(steps)
        ],
        "apply": [
            {"version": v, "region": region, "actor": actor, "seconds": 2.0 + (len(region) % 4) + 0.1 * (v % 4)}
            for v in range(1, steps + 1)
            for actor, region in actors.items()
        ],
        "shares": {
            a: [{"step": s, "prompts": 64 + 16 * i + (s % 4)} for s in range(steps)] for i, a in enumerate(actors)
        },
    }


def svgs(text: str) -> list[ET.Element]:
    """Each <svg> element, parsed on its own, so one malformed chart cannot hide behind another."""
    return [ET.fromstring(m) for m in re.findall(r"<svg\b.*?</svg>", text, flags=re.S)]


def notes(text: str) -> list[str]:
    return re.findall(r'<p class="note">(.*?)</p>', text)


def check(text: str) -> list[ET.Element]:
    """The whole page and every chart are well-formed; there are always eight charts, each titled."""
    ET.fromstring(text.split("\n", 1)[1])  # after the doctype, the page is XML too
    charts = svgs(text)
    assert len(charts) == 8
    for svg in charts:
        assert svg.tag == f"{SVG}svg"
        title = svg.find(f"{SVG}title")
        assert title is not None and title.text
    return charts


def test_realistic_report(tmp_path: Path) -> None:
    path = str(tmp_path / "report.html")
    assert write_report(realistic(), path) == path
    text = Path(path).read_text(encoding="utf-8")
    assert not (tmp_path / "report.html.tmp").exists()
    assert "<script" not in text and "http://" not in text.replace("http://www.w3.org/", "")  # no JS, no assets
    charts = check(text)
    titles = [svg.find(f"{SVG}title").text for svg in charts]  # type: ignore[union-attr]
    assert titles == [
        "Mean reward per step",
        "Bytes per version",
        "Changed fraction per version",
        "Entropy and KL per completion token",
        "Tokens whose ratio was clipped",
        "Mean completion length",
        "Publish to apply, per region (slowest actor)",
        "Share of work per step",
    ]
    reward, size, _, policy, clipped, length, apply, share = ("".join(svg.itertext()) for svg in charts)
    assert "entropy" in policy and "KL to version 0" in policy and "nats" in policy and "tokens" in length
    assert "clip" in clipped
    assert len(charts[4].findall(f"{SVG}circle")) == 15, "steps that trained nothing have no clip fraction"
    assert "step" in reward and "mean reward" in reward and "0.4" in reward
    assert "delta" in size and "full" in size and "100M" in size and "1G" in size  # log ticks, readable
    assert "us-east" in apply and "eu-west" in apply and "ap-south" in apply
    assert all(a in share for a in ("us-east/a0", "eu-west/a0"))
    assert len(charts[0].findall(f"{SVG}circle")) == 20  # one marker per step
    assert len(charts[6].findall(f"{SVG}polyline")) == 3  # one series per region
    assert len(charts[7].findall(f"{SVG}rect")) > 20 * 4  # stacked: a segment per actor per step
    assert notes(text) == [
        "skipped 16 value(s) &lt;= 0 on the log axis",  # the versions with no full snapshot
        "Dots: each version; lines: the median of 9 versions around each.",
    ]
    assert "<td>versions verified</td>" in text.replace("th>", "td>") and "0.61" in text
    assert len(re.findall(r"<td>\d+(\.\d+)?%</td>", text)) == 4  # total-share table, one row per actor


def test_apply_takes_the_slowest_actor_per_region() -> None:
    data = {
        "apply": [
            {"version": 1, "region": "r", "actor": "a", "seconds": 1.0},
            {"version": 1, "region": "r", "actor": "b", "seconds": 9.0},
            {"version": 2, "region": "r", "actor": "a", "seconds": 9.0},
            {"version": 2, "region": "r", "actor": "b", "seconds": float("nan")},
        ]
    }
    chart = check(render_report(data))[6]
    ys = {c.get("cy") for c in chart.findall(f"{SVG}circle")}
    assert len(ys) == 1  # both versions plot at 9 s; the NaN does not replace a real value


def test_entropy_and_kl_are_named_and_an_unmeasured_kl_says_why() -> None:
    data = realistic(6)
    for row in data["steps"]:
        row["kl"] = None  # no reference model
    text = render_report(data)
    policy = "".join(check(text)[3].itertext())
    assert "entropy" in policy and "KL to version 0" in policy, "a legend, even with one line drawn"
    assert any("--kl-coef" in n for n in notes(text))
    assert not any("--kl-coef" in n for n in notes(render_report(realistic(6))))


def test_publish_to_apply_draws_every_version_under_its_rolling_median() -> None:
    """One slow version (a spike) is a dot; the line is the median around it, so it does not jump."""
    data = {
        "apply": [{"version": v, "region": "eu", "actor": "a", "seconds": 9.0 if v == 10 else 1.0} for v in range(20)]
    }
    chart = check(render_report(data))[6]
    dots = {float(c.get("cy", "nan")) for c in chart.findall(f"{SVG}circle")}
    assert len(chart.findall(f"{SVG}circle")) == 20 and len(dots) == 2
    (line,) = chart.findall(f"{SVG}polyline")
    ys = {float(xy.split(",")[1]) for xy in (line.get("points") or "").split()}
    assert ys == {max(dots)}, "the line stays at 1 s (SVG's y grows downwards)"


@settings(max_examples=80, deadline=None)
@given(ys=st.lists(st.floats(-1e6, 1e6), max_size=30), window=st.integers(1, 12))
@example(ys=[5e-324, 5e-324], window=2)  # halving each first rounded their mean to 0 (found by a CI run)
@example(ys=[1.7e308, 1.7e308], window=2)  # adding them first overflows
def test_a_rolling_median_keeps_its_points_and_stays_in_range(ys: list[float], window: int) -> None:
    points = [(float(i), y) for i, y in enumerate(ys)]
    out = rolling_median(points, window)
    assert [x for x, _ in out] == [x for x, _ in points]
    for i, (_, y) in enumerate(out):
        near = ys[max(0, i - window // 2) : i + window // 2 + 1]
        assert min(near) <= y <= max(near)
    if window == 1:
        assert out == points


def test_shares_sit_next_to_the_speeds_that_explain_them() -> None:
    data = realistic(4)
    actors = list(data["shares"])
    data["slowdowns"] = {actors[0]: 1, actors[1]: 2, actors[2]: 3.3}  # the last actor: not emulated, not listed
    text = render_report(data)
    assert "<th>generation slowed</th><th>share by speed alone</th>" in text
    rows = re.findall(r"<tr><td><span.*?</tr>", text)
    cells = [re.findall(r"<td>([^<]*)</td>", r) for r in rows]
    assert [c[-2:] for c in cells[:3]] == [["none", "55.5%"], ["2x", "27.7%"], ["3.3x", "16.8%"]]
    assert cells[3][-2:] == ["-", "-"]
    assert "only generation is slowed" in text
    assert "share by speed alone" not in render_report(realistic(4)), "no slowdowns, no speed columns"


def test_hostile_strings_are_escaped(tmp_path: Path) -> None:
    evil = "<script>alert(1)</script>"
    data = realistic(3)
    data["title"] = evil
    data["summary"] = {evil: evil, "quote": '"><img src=x onerror=alert(1)>'}
    data["shares"] = {evil: [{"step": 0, "prompts": 1}], "ctl\x00\x1b\ud800": [{"step": 0, "prompts": 1}]}
    data["apply"] = [
        {"version": 1, "region": evil, "actor": evil, "seconds": 1.0},
        {"version": 1, "region": "r&d", "actor": "a", "seconds": 1.0},
    ]
    text = Path(write_report(data, str(tmp_path / "r.html"))).read_text(encoding="utf-8")
    check(text)
    assert "<script" not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "r&amp;d" in text
    assert "&quot;&gt;&lt;img" in text and "ctl\ufffd\ufffd\ufffd" in text


DEGENERATE: dict[str, dict[str, Any]] = {
    "empty": {},
    "empty lists": {"title": "", "summary": {}, "steps": [], "apply": [], "shares": {}},
    "single point": {
        "steps": [{"step": 0, "reward_mean": 0.5, "delta_bytes": 10, "full_bytes": 10, "density": 0.0}],
        "apply": [{"version": 0, "region": "r", "actor": "a", "seconds": 0.0}],
        "shares": {"a": [{"step": 0, "prompts": 5}]},
    },
    "missing values": {"steps": [{"step": 0}, {"step": 1, "reward_mean": None}]},
    "non-finite": {
        "summary": {"nan": math.nan, "inf": math.inf},
        "steps": [
            {"step": 0, "reward_mean": math.nan, "delta_bytes": math.inf, "density": -math.inf},
            {"step": 1, "reward_mean": 1.0, "delta_bytes": 5, "density": 0.5},
        ],
        "apply": [{"version": 0, "region": "r", "actor": "a", "seconds": math.nan}],
        "shares": {"a": [{"step": 0, "prompts": math.inf}], "b": [{"step": 0, "prompts": -3}]},
    },
    "log axis non-positive only": {"steps": [{"step": s, "delta_bytes": -s, "full_bytes": 0} for s in range(3)]},
    "huge": {
        "summary": {"big": 10**5000},
        "steps": [
            {"step": 0, "reward_mean": -1.7e308, "delta_bytes": 10**400, "full_bytes": 1.7e308, "density": 1e308},
            {"step": 10**400, "reward_mean": 1.7e308, "delta_bytes": 1e-320, "full_bytes": 1, "density": 5e-324},
            {"step": 2, "version": -(2**62), "reward_mean": 0.0, "delta_bytes": 1, "density": 0.0},
        ],
        "shares": {"a": [{"step": 0, "prompts": 1e308}], "b": [{"step": 0, "prompts": 1e308}]},
    },
    "equal and tiny": {"steps": [{"step": 5, "reward_mean": 1e20, "density": 1e-300} for _ in range(4)]},
    "zero work": {"shares": {"a": [{"step": 0, "prompts": 0}], "b": [{"step": 0, "prompts": 0}]}},
    "many actors": {"shares": {f"actor-{i:03d}-with-a-very-long-name": [{"step": 0, "prompts": i}] for i in range(40)}},
}


@pytest.mark.parametrize("data", DEGENERATE.values(), ids=DEGENERATE.keys())
def test_degenerate_data_still_renders(data: dict[str, Any]) -> None:
    text = render_report(data)
    check(text)
    assert "nan" not in "".join(re.findall(r'="([^"]*)"', text)).lower()  # no NaN coordinates


def test_degenerate_notes() -> None:
    text = render_report(DEGENERATE["non-finite"])
    assert "skipped 1 point(s) with a missing or non-finite value" in notes(text)
    assert "skipped 2 negative or non-finite share value(s)" in notes(text)
    assert "no data" in render_report({})
    assert "skipped 6 value(s) &lt;= 0 on the log axis" in notes(
        render_report(DEGENERATE["log axis non-positive only"])
    )
    assert "+26 more" in render_report(DEGENERATE["many actors"])
    assert "integer of 16610 bits" in render_report(DEGENERATE["huge"])


BAD: dict[str, tuple[Any, str]] = {
    "not a mapping": ([], "report data must be a mapping"),
    "title not str": ({"title": 3}, "title must be a str"),
    "summary not mapping": ({"summary": [1]}, "summary must be a mapping"),
    "summary value": ({"summary": {"x": [1]}}, r"summary\[.x.\] must be str, int or float"),
    "steps not a list": ({"steps": {"step": 0}}, "steps must be a list"),
    "step not a mapping": ({"steps": [3]}, r"steps\[0\] must be a mapping"),
    "step missing step": ({"steps": [{"step": 0}, {"version": 1}]}, r"steps\[1\] is missing 'step'"),
    "step not int": ({"steps": [{"step": 1.5}]}, r"steps\[0\].step must be an int"),
    "step is bool": ({"steps": [{"step": True}]}, r"steps\[0\].step must be an int"),
    "reward a string": ({"steps": [{"step": 0, "reward_mean": "0.5"}]}, r"steps\[0\].reward_mean must be a number"),
    "apply missing region": ({"apply": [{"version": 1, "actor": "a", "seconds": 1}]}, "is missing 'region'"),
    "apply actor a list": ({"apply": [{"version": 1, "region": "r", "actor": [], "seconds": 1}]}, "actor must be"),
    "shares not a mapping": ({"shares": [["a", []]]}, "shares must be a mapping"),
    "shares key not str": ({"shares": {1: []}}, "shares keys must be str"),
    "share rows not a list": ({"shares": {"a": {"step": 0}}}, r"shares\['a'\] must be a list"),
    "share missing prompts": ({"shares": {"a": [{"step": 0}]}}, "is missing 'prompts'"),
    "rollback not a list": ({"rollbacks": {"version": 3}}, "rollbacks must be a list"),
    "slowdowns not a mapping": ({"slowdowns": [2.0]}, "slowdowns must be a mapping"),
    "slowdown a string": ({"slowdowns": {"a": "2x"}}, r"slowdowns\['a'\] must be a number"),
    "rollback missing target": ({"rollbacks": [{"version": 3, "abandons": [2]}]}, "is missing 'rolls_back_to'"),
    "rollback abandons text": (
        {"rollbacks": [{"version": 3, "rolls_back_to": 1, "abandons": "2"}]},
        r"rollbacks\[0\].abandons must be a list",
    ),
}


def test_rollbacks_are_listed(tmp_path: Path) -> None:
    """A restarted trainer's rollbacks get a table; a run without one says so."""
    none = render_report({})
    assert "No version rolled back" in none
    text = render_report({"rollbacks": [{"version": 7, "rolls_back_to": 4, "abandons": [5, 6]}]})
    assert "<td>7</td><td>4</td><td>5, 6</td>" in text


@pytest.mark.parametrize(("data", "message"), BAD.values(), ids=BAD.keys())
def test_wrong_shape_raises(data: Any, message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=message):
        write_report(data, str(tmp_path / "r.html"))
    assert not list(tmp_path.iterdir())  # nothing written


numbers = st.one_of(st.none(), st.floats(), st.integers(-(2**1100), 2**1100))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {"step": st.integers(-(2**70), 2**70)},
            optional={k: numbers for k in ("reward_mean", "delta_bytes", "full_bytes", "density", "publish_s")},
        ),
        max_size=6,
    ),
    seconds=st.lists(st.tuples(st.integers(0, 3), st.sampled_from("ab"), numbers), max_size=6),
    prompts=st.dictionaries(
        st.text(max_size=5), st.lists(st.tuples(st.integers(0, 3), numbers), max_size=4), max_size=4
    ),
)
def test_any_numbers_render(
    rows: list[dict[str, Any]], seconds: list[tuple[int, str, Any]], prompts: dict[str, list[tuple[int, Any]]]
) -> None:
    data = {
        "steps": rows,
        "apply": [{"version": v, "region": r, "actor": "x", "seconds": s} for v, r, s in seconds],
        "shares": {a: [{"step": s, "prompts": p} for s, p in rows_] for a, rows_ in prompts.items()},
    }
    check(render_report(data))
