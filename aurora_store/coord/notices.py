"""What the trainer tells an actor about one of its results (dropped, and why): a short stream per
actor, ``notices:{actor}``, that the actor reads with its inbox and its region's commits.

The actor counts only notices of results it submitted: anyone who can write Redis can submit in its
name, but not under its results' stream ids. Entries are hostile input: a damaged one is counted and
skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aurora_store.coord.errors import JobError
from aurora_store.coord.keyspace import Keyspace
from aurora_store.coord.lease import check_name

NOTICES_MAXLEN = 64
"""Notices kept per actor."""


@dataclass(frozen=True, slots=True)
class Notice:
    """What the trainer told an actor about one of its results."""

    id: str
    job: str
    reason: str
    result: str = ""
    """The stream id of the result it is about."""


class Notices:
    """The notice streams of a run's actors (``JobBoard.notices``)."""

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys

    def key(self, actor: str) -> str:
        """The stream of notices to ``actor``."""
        return self.keys.key("notices", check_name(actor, "actor"))

    def tell(self, actor: str, job: str, reason: str, result: str = "") -> None:
        """Tell ``actor`` that the result ``result`` (its stream id) for ``job`` was dropped, and why."""
        try:
            key = self.key(actor)
        except JobError:
            return  # no actor of this run has that name: nobody to tell
        fields = {"job": job, "reason": reason, "result": result}
        self.keys.call(self.keys.r.xadd, key, fields, maxlen=NOTICES_MAXLEN, approximate=True)

    def read(self, actor: str, after: str) -> list[Notice]:
        """What the trainer told ``actor`` after stream id ``after`` (damaged entries skipped)."""
        reply = self.keys.call(self.keys.r.xread, {self.key(actor): after}, count=NOTICES_MAXLEN)
        return self.parse(actor, [e for _s, entries in reply or [] for e in entries])

    def parse(self, actor: str, entries: Sequence[tuple[str, dict[str, str]]]) -> list[Notice]:
        """Notice entries as read from ``actor``'s stream, checked (damaged ones counted and skipped)."""
        out = []
        for eid, f in entries:
            reason = f.get("reason")
            if isinstance(reason, str) and reason.isidentifier() and len(reason) <= 64:
                out.append(Notice(eid, str(f.get("job", ""))[:200], reason, str(f.get("result", ""))[:64]))
            else:
                self.keys.skipped.skip("bad_notice", f"notice {eid} of {actor}")
        return out

    def forget(self, pipe: Any, actors: Sequence[str]) -> None:
        """Queue on ``pipe`` the deletion of the notice streams of ``actors`` (checked names)."""
        pipe.delete(*(self.key(a) for a in actors))
