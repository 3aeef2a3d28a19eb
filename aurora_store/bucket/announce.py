"""Telling coordination what a publisher uploaded, best effort: segments before the manifest, then
the commit. Cut-through relays listen; the bucket stays the truth."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from aurora_store.errors import AuroraError
from aurora_store.format.manifest import Manifest, Segment

log = logging.getLogger("aurora.store")


class Announcer(Protocol):
    """Where a publisher says what it has uploaded: segments before the manifest, then the commit."""

    def segment(self, version: int, entry: Segment) -> None: ...

    def commit(self, manifest: Manifest) -> None: ...


class Announcements:
    """The run's announcer, told best effort: coordination never blocks or fails a publish. Relays
    and actors that miss an announcement find the version by scanning the buckets."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.to: Announcer | None = None

    def segment(self, version: int, entry: Segment) -> None:
        self._tell("segment", version, entry)

    def commit(self, manifest: Manifest) -> None:
        self._tell("commit", manifest)

    def _tell(self, what: str, *args: Any) -> None:
        if self.to is None:
            return
        try:
            getattr(self.to, what)(*args)
        except AuroraError as exc:  # a coordination failure: the bucket is the truth, announcing is a hint
            log.warning("%s: could not announce %s: %s", self.uri, what, exc)
