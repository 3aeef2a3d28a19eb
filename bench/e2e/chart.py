"""The chart of an ``aurora bench e2e --world four-regions`` result: step time per step for each mode, in the
run report's style (inline SVG from `trainer.charts`, no JavaScript), with the modes' table and the churn."""

from __future__ import annotations

from typing import Any

from trainer.charts import esc, line_chart

CSS = (
    "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f4f4f4}"
    ".note{color:#a60;font-size:90%}svg text{font-size:11px}svg .t{font-size:14px;font-weight:bold}"
)


def render(result: dict[str, Any]) -> str:
    modes = result["modes"]
    order = sorted(modes, key=lambda m: m == "full")  # full last: each mode keeps its color in both charts
    series = {m: [(float(s["step"]), float(s["step_time_s"])) for s in modes[m]["steps"]] for m in order}
    chart = line_chart(
        "Step time per step, each mode (same churn schedule; log scale)", "step", "seconds", series, True
    )
    deltas = {m: p for m, p in series.items() if m != "full"}
    chart += line_chart("Step time per step without full broadcast (linear scale)", "step", "seconds", deltas)
    rows = []
    for m, r in modes.items():
        regions = r.get("regions", {})
        slow = max(regions, key=lambda k: regions[k]["staged_s"]["p95"] or 0.0, default=None)
        p95 = (
            "-"
            if slow is None or regions[slow]["staged_s"]["p95"] is None
            else f"{regions[slow]['staged_s']['p95']:.2f}"
        )
        usd = r.get("usd_per_1000_steps")
        rows.append(
            f"<tr><td>{esc(m)}</td><td>{r['step_time_s']:.3f}</td><td>{r['vs_ideal']:.3f}</td>"
            f"<td>{esc(slow or '-')}</td><td>{p95}</td>"
            f"<td>{'-' if usd is None else f'{usd:.4f}'}</td></tr>"
        )
    churn = ", ".join(f"step {e['step']}: {e['kind']} {e['actor']}" for e in result["churn"]["events"]) or "none"
    targets = "".join(
        f"<li>{'met' if t.get('met') else 'missed'}: {esc(t['definition'])} (value {_value(t.get('value'))})</li>"
        for t in result["targets"].values()
    )
    body = (
        f"<h1>aurora bench e2e --world four-regions</h1><p>{esc(result['model'])}, "
        f"{result['actors_per_region']} actors per region; generation {result['generation_s']:.2f} s, "
        f"training {result['training_s']:.2f} s. {esc(result['note'])}</p>{chart}"
        "<table><tr><th>mode</th><th>step s</th><th>vs ideal</th><th>slowest region (staged p95)</th>"
        f"<th>staged p95 s</th><th>$ per 1,000 steps</th></tr>{''.join(rows)}</table>"
        f"<p class=note>churn: {esc(churn)}</p><ul>{targets}</ul>"
    )
    return (
        "<!DOCTYPE html><html><head><meta charset=utf-8>"
        f"<title>e2e four-regions</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )


def write(result: dict[str, Any], path: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(result))
    return path


def _value(v: object) -> str:
    """A target's value as a reader wants it: four significant digits, not a float's seventeen."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)
