"""What a chaos run that failed an invariant leaves beside its logs: the first violated invariant, its
problems, and the log lines of every role that name the versions and objects those problems name, so
that a failure found in a sweep can be read (and, with the schedule file, run again) later."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

EVIDENCE_FILE = "evidence.json"
MAX_LINES = 80
_KEY = re.compile(r"versions/\d{10}/[A-Za-z0-9._-]+")
_VERSION = re.compile(r"\b(?:version |v)(\d{1,10})\b")


def leave_evidence(result: dict[str, Any], work: Path) -> str | None:
    """Write ``work/evidence.json`` for the first invariant ``result`` says failed; its path, or None
    when every invariant held."""
    failed = [name for name, ok in result["invariants"].items() if not ok]
    if not failed:
        return None
    first = failed[0]
    problems = [str(p) for p in result["problems"].get(first, [])]
    said = " ".join(problems)
    keys = sorted(set(_KEY.findall(said)))
    versions = sorted({int(v) for v in _VERSION.findall(said)})
    doc = {
        "invariant": first,
        "also_failed": failed[1:],
        "problems": problems,
        "objects": keys,
        "versions": versions,
        "log_lines": _lines(work, keys, versions),
        "seed": result["seed"],
    }
    path = work / EVIDENCE_FILE
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return str(path)


def _lines(work: Path, keys: list[str], versions: list[int]) -> list[str]:
    """Lines of the roles' logs that name one of ``keys`` or versions (as the roles write them), at most
    :data:`MAX_LINES`, each prefixed by its log's name."""
    marks = [*keys, *(f"{v:010d}" for v in versions), *(f"version {v}" for v in versions)]
    if not marks:
        return []
    found: list[str] = []
    for log in sorted(work.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if any(m in line for m in marks):
                found.append(f"{log.name}: {line[:400]}")
                if len(found) >= MAX_LINES:
                    return found
    return found
