"""Inline SVG charts for the run report: line and bar charts with their axes, legend and notes.

No plotting dependency and no JavaScript: each chart is one ``<figure>`` of well-formed SVG.
Values that cannot be drawn (NaN, inf, <= 0 on a log axis) are skipped and noted under the chart.
"""

from __future__ import annotations

import html
import math
import re
import sys
from typing import Any

Point = tuple[float, float]
Axis = tuple[float, float, list[tuple[float, str]]]  # lo, hi (in axis space), ticks as (position, label)

_W, _H, _L, _R, _T, _B = 760, 340, 70, 170, 40, 50  # size, then left/right/top/bottom margins
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_NO_DATA = f'<text x="{(_W - _R + _L) / 2}" y="{_H / 2}" text-anchor="middle" fill="#888">no data</text>'
# ---- formatting ----


def esc(value: object, limit: int | None = None) -> str:
    """Escaped text, with characters XML cannot hold replaced and optionally cut to `limit`."""
    text = _NOT_XML.sub("\ufffd", str(value))
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    return html.escape(text, quote=True)


def show(value: Any, where: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 60:
        return f"{'-' if value < 0 else ''}integer of {value.bit_length()} bits"
    if isinstance(value, float):
        return f"{value:.6g}"
    if not isinstance(value, str | int):
        raise ValueError(f"{where} must be str, int or float, got {type(value).__name__}")
    return str(value)


def _fmt(v: float, digits: int = 3) -> str:
    a = abs(v)
    if a >= 1e15 or 0 < a < 1e-3:
        return f"{v:.{digits}g}"
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.{digits}g}{suffix}"
    return f"{v:.{digits}g}"


def count(v: float) -> str:
    return f"{v:,.0f}" if math.isfinite(v) and abs(v) < 1e15 and v == round(v) else _fmt(v, 4)


def color(i: int) -> str:
    return _PALETTE[i] if i < len(_PALETTE) else f"hsl({i * 137.508 % 360:.0f},60%,45%)"


# ---- axes and charts ----


def _frac(v: float, lo: float, hi: float) -> float:
    return (v / 2 - lo / 2) / (hi / 2 - lo / 2)  # halves: a span near the float maximum cannot overflow


def _axis(values: list[float], log: bool = False, whole: bool = False) -> Axis:
    """Axis bounds and ticks for finite `values` (in log10 space when `log`; ticks >= 1 apart when `whole`)."""
    if log:  # ticks at powers of ten
        e0, e1 = math.floor(min(values)), math.ceil(max(values))
        e0, e1 = (e0 - 1, e1 + 1) if e0 == e1 else (e0, e1)
        stride = max(1, math.ceil((e1 - e0) / 8))
        return e0, e1, [(e, _fmt(10.0**e) if -3 <= e < 15 else f"1e{e}") for e in range(e0, e1 + 1, stride)]
    lo, hi = min(values), max(values)
    if hi / 2 - lo / 2 > max(abs(lo), abs(hi), 1e-290) * 1e-12:
        pad = (hi / 2 - lo / 2) * 0.1
    else:  # one value, or too close to tell apart: centre it
        pad = abs(hi) * 0.5 if abs(hi) > 1e-290 else 1.0
    lo, hi = max(lo - pad, -sys.float_info.max), min(hi + pad, sys.float_info.max)
    raw = (hi / 2 - lo / 2) / 2.5  # about five ticks
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    step = max(step, 1.0) if whole else step
    ks = range(math.ceil(lo / step), math.floor(hi / step) + 1)
    ticks = [k * step for k in ks] if len(ks) <= 20 else [lo, hi]
    digits = next((d for d in range(3, 17) if len({_fmt(t, d) for t in ticks}) == len(ticks)), 17)
    return lo, hi, [(t, _fmt(t, digits)) for t in ticks]


def _px(v: float, ax: Axis) -> float:
    return _L + (_W - _L - _R) * _frac(v, ax[0], ax[1])


def _py(v: float, ax: Axis) -> float:
    return _H - _B - (_H - _T - _B) * _frac(v, ax[0], ax[1])


def _frame(title: str, xlabel: str, ylabel: str, inner: str, notes: list[str]) -> str:
    """A figure: the SVG with its title and axis labels around `inner`, then any notes."""
    mid_y = (_H - _B + _T) / 2
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img">'
        f'<title>{esc(title)}</title><text class="t" x="{_W / 2}" y="22" text-anchor="middle">{esc(title)}</text>'
        f'<text x="{(_W - _R + _L) / 2}" y="{_H - 8}" text-anchor="middle">{esc(xlabel)}</text>'
        f'<text x="16" y="{mid_y}" text-anchor="middle" transform="rotate(-90 16 {mid_y})">{esc(ylabel)}</text>'
        f"{inner}</svg>"
    )
    caption = "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
    return f"<figure>{svg}{caption}</figure>"


def _axes(xa: Axis, ya: Axis) -> str:
    out = [f'<rect x="{_L}" y="{_T}" width="{_W - _L - _R}" height="{_H - _T - _B}" fill="none" stroke="#444"/>']
    for v, label in ya[2]:
        y = _py(v, ya)
        out.append(f'<line x1="{_L}" x2="{_W - _R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{_L - 5}" y="{y + 4:.1f}" text-anchor="end">{esc(label)}</text>')
    for v, label in xa[2]:
        x = _px(v, xa)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_H - _B}" y2="{_H - _B + 4}" stroke="#444"/>')
        out.append(f'<text x="{x:.1f}" y="{_H - _B + 16}" text-anchor="middle">{esc(label)}</text>')
    return "".join(out)


def _legend(names: list[str]) -> str:
    rows = (_H - _T - _B) // 16
    shown = names if len(names) <= rows else names[: rows - 1]
    out = []
    for i, name in enumerate(shown):
        x, y = _W - _R + 12, _T + 10 + 16 * i
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{color(i)}"/>')
        out.append(f'<text x="{x + 14}" y="{y}">{esc(name, 22)}<title>{esc(name)}</title></text>')
    if len(shown) < len(names):
        out.append(f'<text x="{_W - _R + 12}" y="{_T + 10 + 16 * len(shown)}">+{len(names) - len(shown)} more</text>')
    return "".join(out)


def rolling_median(points: list[Point], window: int) -> list[Point]:
    """Each point's y replaced by the median of the `window` points centred on it (fewer at the ends)."""
    half = window // 2
    ys = [y for _, y in points]
    out = []
    for i, (x, _) in enumerate(points):
        near = sorted(ys[max(0, i - half) : i + half + 1])
        mid = len(near) // 2
        out.append((x, near[mid] if len(near) % 2 else _midpoint(near[mid - 1], near[mid])))
    return out


def _midpoint(lo: float, hi: float) -> float:
    """The mean of ``lo <= hi``, kept between them: halving each first (what avoids overflowing near
    the largest floats) rounds two of the smallest subnormals to 0, below both."""
    m = (lo + hi) / 2
    if math.isinf(m) and math.isfinite(lo) and math.isfinite(hi):
        m = lo / 2 + hi / 2
    return min(max(m, lo), hi) if math.isfinite(m) else m


def line_chart(
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, list[Point]],
    log_y: bool = False,
    *,
    notes: list[str] | None = None,
    legend: bool = False,
    smooth: int = 0,
) -> str:
    """Lines with markers, one per series; points with a non-finite value (or <= 0 when `log_y`) are skipped.

    `legend`: name the series even when there is one. `smooth` > 1: each series is drawn as faint dots
    (every point) under the line of its rolling median over `smooth` points. `notes` go under the chart."""
    bad = nonpos = 0
    clean: dict[str, list[Point]] = {}
    for name, points in series.items():
        keep = []
        for x, y in points:
            if not (math.isfinite(x) and math.isfinite(y)):
                bad += 1
            elif log_y and y <= 0:
                nonpos += 1
            else:
                keep.append((x, math.log10(y) if log_y else y))
        clean[name] = sorted(keep)
    said = [f"skipped {bad} point(s) with a missing or non-finite value"] if bad else []
    said += [f"skipped {nonpos} value(s) <= 0 on the log axis"] if nonpos else []
    said += notes or []
    named = legend or len(series) > 1
    xs = [x for pts in clean.values() for x, _ in pts]
    if not xs:
        return _frame(title, xlabel, ylabel, _NO_DATA + (_legend(list(series)) if named else ""), said)
    xa, ya = _axis(xs, whole=True), _axis([y for pts in clean.values() for _, y in pts], log_y)
    out = [_axes(xa, ya)]
    for i, pts in enumerate(clean.values()):
        dots = [(_px(x, xa), _py(y, ya)) for x, y in pts]
        coords = [(_px(x, xa), _py(y, ya)) for x, y in rolling_median(pts, smooth)] if smooth > 1 else dots
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        out.append(
            f'<polyline points="{line}" fill="none" stroke="{color(i)}" stroke-width="{2 if smooth > 1 else 1.5}"/>'
        )
        dot = 'r="2" fill-opacity="0.4"' if smooth > 1 else 'r="2.5"'
        out.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" {dot} fill="{color(i)}"/>' for x, y in dots)
    if named:
        out.append(_legend(list(series)))
    return _frame(title, xlabel, ylabel, "".join(out), said)


def bar_chart(
    title: str, xlabel: str, ylabel: str, cats: list[float], series: dict[str, list[float]], notes: list[str]
) -> str:
    """Stacked bars: one bar per category, one colored segment per series; heights must be finite and >= 0."""
    if not cats:
        return _frame(title, xlabel, ylabel, _NO_DATA, notes)
    totals = [sum(hs[j] for hs in series.values()) for j in range(len(cats))]
    stride = max(1, math.ceil(len(cats) / 10))
    labels = [(float(j), f"{c:.0f}" if abs(c) < 1e15 else _fmt(c)) for j, c in enumerate(cats) if j % stride == 0]
    xa: Axis = (-0.5, len(cats) - 0.5, labels)
    ya = _axis([0.0, *[t for t in totals if math.isfinite(t)]])
    ya = (0.0, ya[1], [t for t in ya[2] if t[0] >= 0])
    out, width = [_axes(xa, ya)], (_W - _L - _R) / len(cats) * 0.8
    base = [0.0] * len(cats)
    for i, hs in enumerate(series.values()):
        for j, h in enumerate(hs):
            if h > 0 and math.isfinite(top := base[j] + h):
                y0, y1 = _py(base[j], ya), _py(top, ya)
                x = _px(j, xa) - width / 2
                out.append(
                    f'<rect x="{x:.1f}" y="{y1:.1f}" width="{width:.2f}" height="{y0 - y1:.2f}" fill="{color(i)}"/>'
                )
                base[j] = top
    out.append(_legend(list(series)))
    return _frame(title, xlabel, ylabel, "".join(out), notes)
