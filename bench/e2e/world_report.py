"""What ``aurora bench e2e --world four-regions`` reports, from the modes' raw records: step time against
ideal per mode and per region, time from publish to each region's last actor applied (p50/p95) and where it
goes, bytes down each link per step and their dollars, a projection to 8B parameters, targets and limits."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from bench.e2e.loop import Synced, Timing
from bench.emulation import egress, links
from bench.emulation.world import cpus

RELAYED = ("ours", "star", "full")


def _pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p95": None, "max": None, "n": 0}
    a = np.asarray(xs)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)), "max": float(a.max()), "n": len(xs)}


def _first_at(marks: list[tuple[int, float]], version: int) -> float | None:
    return min((t for v, t in marks if v >= version), default=None)


def _region_times(rec: dict[str, Any], timing: Timing) -> dict[str, dict[str, Any]]:
    """Per region, over the timed versions: publish -> region committed, -> last actor staged, -> last applied."""
    followers: dict[str, tuple[str, Synced]] = rec["followers"]
    published: dict[int, float] = rec["published_at"]
    commits: dict[str, dict[int, float]] = rec["commits"]
    timed = range(timing.warmup_steps + 1, timing.total_steps + 1)
    applicable = timing.total_steps - 2
    """The last batch boundary of the loop comes before the batch of the last step: after version
    total_steps - 2 was published, before version total_steps - 1 was."""
    out: dict[str, dict[str, Any]] = {}
    for region in (r.name for r in links.regions()):
        members = [f for r, f in followers.values() if r == region]
        applied, staged, committed, missing = [], [], [], 0
        for v in timed:
            t0 = published[v]
            present = [f for f in members if f.joined_at < t0]
            a = [_first_at(f.applied_at, v) for f in present]
            s = [_first_at(f.staged_at, v) for f in present]
            if v > applicable:
                pass
            elif not present or None in a:
                missing += 1
            else:
                applied.append(max(t for t in a if t is not None) - t0)
            if present and None not in s:
                staged.append(max(t for t in s if t is not None) - t0)
            c = commits.get(region, {}).get(v)
            if c is not None:
                committed.append(c - t0)
        out[region] = {
            "applied_s": _pct(applied),
            "staged_s": _pct(staged),
            "region_committed_s": _pct(committed),
            "versions_not_applied_by_the_end": missing,
            "applied_versions": "timed versions up to total_steps - 2 (later ones have no batch boundary left)",
        }
    return out


def _per_region_steps(rec: dict[str, Any], timing: Timing) -> dict[str, dict[str, Any]]:
    """Per region: its slowest actor's stall per timed step (mean), and the steps whose last batch was its."""
    out = {r.name: {"stall_s": 0.0, "gated_steps": 0} for r in links.regions()}
    timed = rec["steps"][timing.warmup_steps :]
    for st in timed:
        for region in out:
            stalls = [b for a, b in st["stalls"].items() if a.split("/", 1)[0] == region]
            out[region]["stall_s"] += max(stalls, default=0.0) / len(timed)
        out[st["last_batch_region"]]["gated_steps"] += 1
    return out


def _links(rec: dict[str, Any], steps: int) -> dict[str, dict[str, Any]]:
    """Bytes down each link per step during the loop, and their dollars per 1,000 steps."""
    out = {}
    for name, after in rec["settled"]["links"].items():
        down = after["bytes_down"] - rec["before"]["links"][name]["bytes_down"]
        up = after["bytes_up"] - rec["before"]["links"][name]["bytes_up"]
        if down == 0 and up == 0:
            continue
        source, dest = name.split("->")
        per_step = (down + up) / steps
        out[name] = {"bytes_down": down, "bytes_up": up, "bytes_per_step": per_step}
        out[name] |= egress.dollars_per_1000_steps(source, dest, per_step)
    return out


def _link_alone(mode: str, per_link: dict[str, dict[str, Any]], steps_per_version: float) -> dict[str, float]:
    """Seconds the links alone need to carry one version to each region (bytes per step at the link's rate
    plus one RTT per hop on its path; a tree's child hop starts after its parent's commit)."""
    topo = e2e_topology(mode)
    out = {}
    for r in links.regions():
        path, here = [], r.name
        while here != links.HOME:
            src = links.source_of(here, topo) if topo else links.HOME
            path.append(links.hop(src, here))
            here = src
        out[r.name] = sum(
            per_link.get(h.name, {"bytes_per_step": 0.0})["bytes_per_step"] * steps_per_version * 8 / h.bandwidth_bps
            + h.rtt_s
            for h in path
        )
    return out


def e2e_topology(mode: str) -> str | None:
    from bench.e2e.regions import topology

    return topology(mode)


def _projection(result: dict[str, Any], modes: dict[str, Any]) -> dict[str, Any] | None:
    ours = modes.get("ours")
    if ours is None:
        return None
    deltas = [s for s in ours["steps"] if s.get("kind") == "delta" and s.get("changed")]
    if not deltas:
        return None
    bpe = sum(s["bytes"] for s in deltas) / sum(s["changed"] for s in deltas)
    changed = PROJ_PARAMS * PROJ_DENSITY
    delta_bytes = changed * bpe
    full_bytes = PROJ_PARAMS * 2
    out: dict[str, Any] = {
        "label": "projection, not a measurement: measured bytes per changed element and measured link fractions "
        "(link bytes per step over payload bytes per version) scaled to the model below",
        "params": PROJ_PARAMS,
        "density": PROJ_DENSITY,
        "bytes_per_changed_element": bpe,
        "delta_bytes_per_version": delta_bytes,
        "full_bytes_per_version": full_bytes,
        "modes": {},
    }
    for mode, m in modes.items():
        if mode == "ideal" or "links" not in m:
            continue
        payload = m["payload_bytes_per_version"]
        version_bytes = full_bytes if mode == "full" else delta_bytes
        per_link = {}
        usd = 0.0
        for name, lk in m["links"].items():
            frac = lk["bytes_per_step"] / payload
            b = frac * version_bytes
            hop = links.hop(*name.split("->"))
            d = egress.dollars_per_1000_steps(hop.source, hop.dest, b)
            usd += d["usd_per_1000_steps"]
            per_link[name] = {
                "link_fraction": frac,
                "bytes_per_step": b,
                "link_seconds_per_version": b * 8 / hop.bandwidth_bps,
                "usd_per_1000_steps": d["usd_per_1000_steps"],
            }
        out["modes"][mode] = {"links": per_link, "usd_per_1000_steps": usd}
    return out


PROJ_PARAMS = 8e9
PROJ_DENSITY = 0.01


def summarize(result: dict[str, Any], raw: dict[str, dict[str, Any]], timing: Timing) -> dict[str, Any]:
    ideal = raw["ideal"]["step_time_s"]
    modes: dict[str, Any] = {}
    for mode, rec in raw.items():
        m: dict[str, Any] = {
            "how": rec["how"],
            "step_time_s": rec["step_time_s"],
            "vs_ideal": rec["step_time_s"] / ideal,
            "stall_max_s": rec["stall_max_s"],
            "stall_fraction": rec["stall_fraction"],
            "trainer_waited_s": rec["trainer_waited_s"],
            "publish_s": rec["publish_s"],
            "staleness_max": rec["staleness_max"],
            "churn": rec.get("churn", []),
            "seconds": rec["seconds"],
            "steps": [{k: v for k, v in s.items() if k not in ("stalls",)} for s in rec["steps"]],
        }
        m["per_region_steps"] = _per_region_steps(rec, timing)
        m["excess_over_ideal_s"] = {
            "total": rec["step_time_s"] - ideal,
            "mean_stall_max_s": rec["stall_max_s"],
            "what": "the slowest actor's wait at batch boundaries: with one-step asynchrony the batch an actor "
            "starts as the trainer takes the previous one needs the version published one step earlier, so a "
            "version whose path from the trainer's publish to the last actor staged (sync_path_s) is longer than "
            "the generation window minus training (budget_s) stalls its region; the trainer's own publish is not "
            "on the trainer's critical path (it ends long before the next batch does) but is the first part of "
            "that sync path",
        }
        if mode != "ideal":
            steps = timing.total_steps
            per_link = _links(rec, steps)
            payload = sum(s["bytes"] for s in rec["steps"]) / len(rec["steps"])
            cpu = rec["after"]["cpu_s"] - rec["before"]["cpu_s"] if rec["after"]["cpu_s"] is not None else None
            m |= {
                "kinds": sorted({s["kind"] for s in rec["steps"]}),
                "payload_bytes_per_version": payload,
                "links": per_link,
                "link_bytes_per_step_total": sum(lk["bytes_per_step"] for lk in per_link.values()),
                "usd_per_1000_steps": sum(lk["usd_per_1000_steps"] for lk in per_link.values()),
                "regions": (regions := _region_times(rec, timing)),
                "link_alone_version_s": _link_alone(mode, per_link, 1.0),
                "cpu_s": cpu,
                "cpu_busy_cores": cpu / rec["wall_s"] if cpu is not None else None,
                "final": rec["final"],
                "bit_exact": rec["bit_exact"],
            }
            m["excess_over_ideal_s"] |= {
                "budget_s": timing.generation_s - timing.training_s,
                "sync_path_s": {
                    q: max((r["staged_s"][q] for r in regions.values() if r["staged_s"][q] is not None), default=None)
                    for q in ("p50", "p95")
                },
            }
            if mode in RELAYED:
                m["relayed_versions"] = {r: n for r, (n, _) in rec["relayed"].items()}
                m["bytes_into_region_per_version"] = _into_region(mode, per_link, rec)
        modes[mode] = m
    result["modes"] = modes
    result["step_time_s"] = {m: modes[m]["step_time_s"] for m in modes}
    result["step_time_ratio"] = {f"{m}_vs_ideal": modes[m]["vs_ideal"] for m in modes if m != "ideal"}
    result["bit_exact"] = all(m.get("bit_exact", True) for m in modes.values())
    result["projection_8b"] = _projection(result, modes)
    result["targets"] = _targets(result, modes)
    result["bounds"] = _bounds(result, modes, timing)
    result["slowest_region"] = _slowest(modes)
    result["limits"] = LIMITS
    return result


def _into_region(mode: str, per_link: dict[str, Any], rec: dict[str, Any]) -> dict[str, float | None]:
    """Per region: bytes down the link feeding it while the loop's versions crossed it (to the last one
    committed there), over the payload bytes the trainer published in the loop."""
    topo = e2e_topology(mode)
    assert topo is not None
    out: dict[str, float | None] = {}
    for r in links.regions():
        lk = per_link.get(links.hop(links.source_of(r.name, topo), r.name).name)
        out[r.name] = lk["bytes_down"] / rec["payload_bytes"] if lk and rec["payload_bytes"] else None
    return out


def _slowest(modes: dict[str, Any]) -> dict[str, Any] | None:
    """Where the time goes in ours' slowest region (by staged p95), p50s: publish -> region committed
    (trainer upload + relay copy over the path), -> last actor staged (fetch, verify, decode from the
    region's bucket), -> last actor applied (the wait for the next batch boundary, and the apply)."""
    ours = modes.get("ours")
    if ours is None:
        return None
    regions = ours["regions"]
    name = max(regions, key=lambda r: regions[r]["staged_s"]["p95"] or 0.0)
    r = regions[name]
    committed, staged, applied = (r[k]["p50"] for k in ("region_committed_s", "staged_s", "applied_s"))
    return {
        "mode": "ours",
        "region": name,
        "staged_p95_s": r["staged_s"]["p95"],
        "p50_s": {
            "publish_to_region_committed": committed,
            "region_committed_to_staged": None if staged is None or committed is None else staged - committed,
            "staged_to_applied": None if applied is None or staged is None else applied - staged,
        },
        "link_alone_s": ours["link_alone_version_s"][name],
    }


def _targets(result: dict[str, Any], modes: dict[str, Any]) -> dict[str, Any]:
    ours = modes.get("ours")
    full = modes.get("full")
    r = ours["vs_ideal"] if ours else None
    into = ours.get("bytes_into_region_per_version", {}) if ours else {}
    worst = max((v for v in into.values() if v is not None), default=None)
    return {
        "ours_vs_ideal": {
            "max": TARGET,
            "value": r,
            "met": r is not None and r <= TARGET and result["bit_exact"],
            "definition": f"ours (relay tree) mean step time <= {TARGET}x ideal with the 0.25 Gbps region and the "
            "churn schedule, every surviving actor bit-exact at the end",
        },
        "full_vs_ideal": {
            "value": full["vs_ideal"] if full else None,
            "met": full is not None,
            "definition": "full broadcast's ratio to ideal, reported (no bound)",
        },
        "tree_bytes_per_version": {
            "max": BYTES_TARGET,
            "value": worst,
            "per_region": into,
            "met": worst is not None and worst <= BYTES_TARGET,
            "definition": f"bytes down the link feeding each region per version, over the delta's payload per "
            f"version, <= {BYTES_TARGET} with the relay tree (HTTP headers and manifests included)",
        },
    }


TARGET = 1.05
BYTES_TARGET = 1.02


def _bounds(result: dict[str, Any], modes: dict[str, Any], timing: Timing) -> dict[str, Any]:
    """Per mode: what the links alone allow against what was measured, and whether the cores bound it."""
    budget = timing.generation_s - timing.training_s
    ideal = modes["ideal"]["step_time_s"]
    out: dict[str, Any] = {
        "load_average_1_5_15": list(os.getloadavg()),
        "cpu_busy_cores_counts": "this process (trainer, relays, actors: threads under one GIL) and the bucket "
        "servers and link proxies it started; other work on the machine (the load average) is not counted",
    }
    for mode, m in modes.items():
        if mode == "ideal":
            continue
        link_s = max(m["link_alone_version_s"].values())
        staged = [r["staged_s"]["p95"] for r in m["regions"].values() if r["staged_s"]["p95"] is not None]
        measured = max(staged, default=None)
        busy = m["cpu_busy_cores"]
        cpu_bound = busy is not None and busy >= 0.75 * cpus()
        out[mode] = {
            "link_alone_sync_s": link_s,
            "measured_sync_p95_s": measured,
            "sync_budget_s": budget,
            "cpu_busy_cores": busy,
            "cores": cpus(),
            "bound": (
                "cpu: the emulator's processes on the shared cores"
                if cpu_bound
                else "the emulator: CPU time and request latency of local servers, relays and actors, not the links"
            )
            if (measured or 0) > 1.5 * link_s
            else "link",
            "link_alone_vs_ideal": (ideal + max(0.0, link_s - budget)) / ideal,
            "how": "link_alone_sync_s: the slowest region's path at the table's bandwidths (bytes measured per "
            "step) plus an RTT per hop; link_alone_vs_ideal: ideal's step plus the part of that sync the "
            "generation window cannot hide",
        }
    return out


LIMITS = [
    "generation and training are sleeps: actors and relays hold the CPU only while they move, verify, decode and "
    "apply weights; the emulator's own servers (moto, fake-gcs-server) and proxies share the same cores",
    "a preempted actor is a thread told to stop (no process is killed): its batch in flight is dropped and its "
    "prompts are not regenerated; a stage already under way finishes in the background",
    "a relay in the tree copies a version from its parent region after the parent's commit: relays re-announce "
    "no segments in their own region, so the second hop is store-and-forward per version",
    "per-region applied times include the wait for the next batch boundary (up to one generation window): "
    "staged_s is the transfer alone",
    "prices are list prices as known, not fetched; see prices.source",
]
