"""A training run as one standalone HTML file: a summary table and eight inline SVG charts (nine with
the engine/trainer log-probability gap a rollout correction measures).

No JavaScript, no external assets and no plotting dependency, so the file opens offline and can be
attached anywhere. The input is JSON-like (see `write_report`). Its shape is checked and a wrong shape
raises `ValueError`; bad values (NaN, inf, <= 0 on a log axis) are skipped and noted under their chart.
Every string from the data is escaped, and the document is well-formed XML as well as HTML.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from trainer.charts import Point, bar_chart, color, count, esc, line_chart, show

_CSS = (
    "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}figure{margin:1.5em 0}"
    ".note{color:#a60;font-size:90%}svg text{font-size:11px}svg .t{font-size:14px;font-weight:bold}"
)


def write_report(data: Mapping[str, Any], path: str) -> str:
    """Render `data` and write it to the local file `path` (atomically, by rename); returns `path`.

    `data` keys, all optional: "title" str; "summary" {str: str|int|float}; "steps" [{"step", "version",
    "reward_mean", "delta_bytes", "full_bytes", "density", "publish_s", and optionally "entropy", "kl",
    "clip_frac", "response_len", "mismatch_abs", "mismatch_kl"}]; "apply" [{"version", "region", "actor",
    "seconds"}]; "shares" {actor_id: [{"step", "prompts"}]}; "rollbacks" [{"version", "rolls_back_to",
    "abandons"}]: versions a restarted trainer published from an older state than their parent's;
    "slowdowns" {actor_id: factor >= 1}: how much each actor's generation was slowed (a demo's emulation).
    """
    text = render_report(data)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def render_report(data: Mapping[str, Any]) -> str:
    """The report as an HTML string; see `write_report` for the shape of `data`."""
    if not isinstance(data, Mapping):
        raise ValueError(f"report data must be a mapping, got {type(data).__name__}")
    title = data.get("title", "AuroraRL run report")
    if not isinstance(title, str):
        raise ValueError(f"title must be a str, got {type(title).__name__}")
    summary = _mapping(data.get("summary", {}), "summary")
    steps = [_step(r, f"steps[{i}]") for i, r in enumerate(_rows(data.get("steps", []), "steps"))]
    applies = [_apply(r, f"apply[{i}]") for i, r in enumerate(_rows(data.get("apply", []), "apply"))]
    shares = _shares(_mapping(data.get("shares", {}), "shares"))
    rollbacks = [_rollback(r, f"rollbacks[{i}]") for i, r in enumerate(_rows(data.get("rollbacks", []), "rollbacks"))]
    slowdowns = {a: _num(v, f"slowdowns[{a!r}]") for a, v in _mapping(data.get("slowdowns", {}), "slowdowns").items()}

    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(show(v, f'summary[{k!r}]'))}</td></tr>" for k, v in summary.items())
    parts = [f"<h1>{esc(title)}</h1>", f"<table>{rows}</table>" if rows else "<p>No summary.</p>"]
    reward = {"reward": [(s["step"], s["reward_mean"]) for s in steps]}
    parts.append(line_chart("Mean reward per step", "step", "mean reward", reward))
    sizes = {k: [(s["version"], s[f"{k}_bytes"]) for s in steps] for k in ("delta", "full")}
    parts.append(line_chart("Bytes per version", "version", "bytes (log scale)", sizes, log_y=True))
    density = {"density": [(s["version"], s["density"]) for s in steps]}
    parts.append(line_chart("Changed fraction per version", "version", "density", density))
    policy = {
        label: [(s["step"], s[k]) for s in steps if math.isfinite(s[k])]
        for label, k in (("entropy", "entropy"), ("KL to version 0", "kl"))
    }
    unmeasured = [] if policy["KL to version 0"] else [_NO_KL]
    parts.append(
        line_chart("Entropy and KL per completion token", "step", "nats", policy, legend=True, notes=unmeasured)
    )
    clipped = {"clip fraction": [(s["step"], s["clip_frac"]) for s in steps if math.isfinite(s["clip_frac"])]}
    parts.append(line_chart("Tokens whose ratio was clipped", "step", "fraction", clipped))
    lengths = {"tokens": [(s["step"], s["response_len"]) for s in steps if math.isfinite(s["response_len"])]}
    parts.append(line_chart("Mean completion length", "step", "tokens", lengths))
    gap = {
        label: [(s["step"], s[k]) for s in steps if math.isfinite(s[k])]
        for label, k in (("mean |Δ log p| per token", "mismatch_abs"), ("KL per sequence", "mismatch_kl"))
    }
    if any(gap.values()):  # measured with a rollout correction only
        parts.append(line_chart("Engine vs trainer log-probabilities at the rollout's weights", "step", "nats", gap))
    parts.append(
        line_chart(
            "Publish to apply, per region (slowest actor)",
            "version",
            "seconds",
            _apply_series(applies),
            legend=True,
            smooth=_SMOOTH,
            notes=[f"Dots: each version; lines: the median of {_SMOOTH} versions around each."],
        )
    )
    parts.append(_share_section(shares, slowdowns))
    parts.append(_rollback_section(rollbacks))
    body = "".join(parts)
    return (
        '<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml" lang="en"><head><meta charset="utf-8"/>'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"
    )


# ---- validation: wrong shapes raise, values become floats (bad ones NaN/inf, skipped later) ----


def _rows(value: Any, where: str) -> list[Mapping[str, Any]]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"{where} must be a list, got {type(value).__name__}")
    for i, row in enumerate(value):
        if not isinstance(row, Mapping):
            raise ValueError(f"{where}[{i}] must be a mapping, got {type(row).__name__}")
    return list(value)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise ValueError(f"{where} keys must be str, got {type(key).__name__}")
    return value


def _num(value: Any, where: str) -> float:
    """A number as a float: None is NaN (missing), an int too big for a float is +-inf."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} must be a number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _key(row: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in row:
        raise ValueError(f"{where} is missing {key!r}")
    return row[key]


def _int(row: Mapping[str, Any], key: str, where: str) -> float:
    value = _key(row, key, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}.{key} must be an int, got {type(value).__name__}")
    return _num(value, f"{where}.{key}")


def _step(row: Mapping[str, Any], where: str) -> dict[str, float]:
    out = {"step": _int(row, "step", where)}
    out["version"] = _int(row, "version", where) if "version" in row else out["step"]
    for key in ("reward_mean", "delta_bytes", "full_bytes", "density", "publish_s", *_POLICY):
        out[key] = _num(row.get(key), f"{where}.{key}")
    return out


_NO_KL = "KL to version 0 is measured only with a reference model (--kl-coef > 0); this run had none."
_SMOOTH = 9
"""Versions in the rolling median of the publish-to-apply chart (one version's time is noisy)."""

_POLICY = ("entropy", "kl", "clip_frac", "response_len", "mismatch_abs", "mismatch_kl")
"""Per-step policy metrics (optional: a step that trained nothing has none)."""


def _rollback(row: Mapping[str, Any], where: str) -> tuple[int, int, list[int]]:
    """``{"version": V, "rolls_back_to": S, "abandons": [...]}``: version V continues from S's state."""
    abandons = _key(row, "abandons", where)
    if not isinstance(abandons, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in abandons):
        raise ValueError(f"{where}.abandons must be a list of versions")
    _int(row, "version", where), _int(row, "rolls_back_to", where)  # checked: ints, not bools
    return row["version"], row["rolls_back_to"], abandons


def _rollback_section(rollbacks: list[tuple[int, int, list[int]]]) -> str:
    """The versions a restarted trainer published from an older state than their parent's."""
    if not rollbacks:
        return "<h2>Restarts</h2><p>No version rolled back: every version continues from its parent's state.</p>"
    rows = "".join(
        f"<tr><td>{v}</td><td>{back}</td><td>{esc(', '.join(map(str, gone)))}</td></tr>" for v, back, gone in rollbacks
    )
    return (
        "<h2>Restarts</h2><p>Versions a restarted trainer trained from an older state than their parent's "
        "(its newest usable state); the abandoned versions' steps were not continued.</p>"
        f"<table><tr><th>version</th><th>trained from the state of</th><th>abandons</th></tr>{rows}</table>"
    )


def _apply(row: Mapping[str, Any], where: str) -> tuple[float, str, str, float]:
    names = []
    for key in ("region", "actor"):
        if not isinstance(value := _key(row, key, where), str | int) or isinstance(value, bool):
            raise ValueError(f"{where}.{key} must be a str or int, got {type(value).__name__}")
        names.append(show(value, where))
    return _int(row, "version", where), names[0], names[1], _num(_key(row, "seconds", where), f"{where}.seconds")


def _shares(raw: Mapping[str, Any]) -> dict[str, dict[float, float]]:
    """Prompts per actor per step; repeated steps for one actor are added up."""
    out: dict[str, dict[float, float]] = {}
    for actor, rows in raw.items():
        per = out.setdefault(actor, {})
        for i, r in enumerate(_rows(rows, f"shares[{actor!r}]")):
            where = f"shares[{actor!r}][{i}]"
            step, prompts = _int(r, "step", where), _num(_key(r, "prompts", where), f"{where}.prompts")
            per[step] = per.get(step, 0.0) + prompts
    return out


def _apply_series(applies: list[tuple[float, str, str, float]]) -> dict[str, list[Point]]:
    """Per region, per version, the slowest actor; a version where every value is bad keeps one NaN to be noted."""
    worst: dict[str, dict[float, float]] = {}
    for version, region, _, seconds in applies:
        per = worst.setdefault(region, {})
        old = per.get(version, math.nan)
        per[version] = seconds if math.isnan(old) or (math.isfinite(seconds) and seconds > old) else old
    return {region: sorted(per.items()) for region, per in worst.items()}


def _share_section(shares: dict[str, dict[float, float]], slowdowns: dict[str, float]) -> str:
    """Chart 5 (each actor's fraction of the prompts in each step) and a table of totals per actor, with
    each actor's emulated slowdown and the share its speed alone would give where ``slowdowns`` has them."""
    good = {
        a: {s: p for s, p in per.items() if math.isfinite(s) and math.isfinite(p) and p >= 0}
        for a, per in shares.items()
    }
    dropped = sum(len(per) for per in shares.values()) - sum(len(per) for per in good.values())
    cats = sorted({s for per in good.values() for s in per})
    top = {s: max(per.get(s, 0.0) for per in good.values()) for s in cats}  # scale by it: sums cannot overflow
    norm = {s: sum(per.get(s, 0.0) / top[s] for per in good.values()) if top[s] > 0 else 0.0 for s in cats}
    frac = {a: [per.get(s, 0.0) / top[s] / norm[s] if norm[s] > 0 else 0.0 for s in cats] for a, per in good.items()}
    notes = [f"skipped {dropped} negative or non-finite share value(s)"] if dropped else []
    chart = bar_chart("Share of work per step", "step", "fraction of prompts", cats, frac, notes)
    totals = {a: sum(per.values()) for a, per in good.items()}
    grand = sum(totals.values())
    speeds = {a: 1 / d for a, d in slowdowns.items() if a in totals and math.isfinite(d) and d >= 1}
    fastest = sum(speeds.values())
    rows = "".join(
        f'<tr><td><span style="color:{color(i)}">\u25a0</span> {esc(a)}</td><td>{count(t)}</td>'
        f"<td>{_percent(t, grand)}</td>"
        + (
            f"<td>{_slowdown(slowdowns.get(a))}</td><td>{_percent(speeds.get(a, math.nan), fastest)}</td>"
            if speeds
            else ""
        )
        + "</tr>"
        for i, (a, t) in enumerate(totals.items())
    )
    head = "<tr><th>actor</th><th>prompts</th><th>share</th>"
    head += "<th>generation slowed</th><th>share by speed alone</th></tr>" if speeds else "</tr>"
    return f"{chart}<table>{head}{rows}</table>{_SHARES if speeds else ''}"


_SHARES = (
    '<p class="note">The demo slows each actor\'s generation by the factor shown, as slower hardware would. '
    "The trainer splits each step's prompts by each actor's measured throughput, and an idle actor takes "
    "over half of the not-yet-started jobs of the busiest one. The shares come out flatter than the speeds "
    "alone would give: only generation is slowed, not the rest of a job's time (fetching and applying "
    "versions between batches, encoding and posting results), the actors share this machine's cores with "
    "each other and the trainer, and a step's few prompts split into whole jobs.</p>"
)


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 and math.isfinite(whole) and math.isfinite(part) else "-"


def _slowdown(factor: float | None) -> str:
    return "-" if factor is None or not math.isfinite(factor) else ("none" if factor == 1 else f"{factor:g}x")
