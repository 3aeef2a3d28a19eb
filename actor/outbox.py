"""What an actor sends the trainer, and what the trainer says back about it.

Each result's payload is submitted inline when it is small (up to ``--inline-bytes``), else put
in this region's bucket (``results/<sha256>.bin``, immutable) with only its reference in Redis.
The trainer tells an actor why it dropped a result it can act on; a notice counts only if it names
a result this actor submitted (anyone who can write Redis can submit in its name, but not under
its results' stream ids), each result once, and only if the actor can trust it: in a signed run,
signed by the run's key (anyone who can write Redis can add notices); in an unsigned run, where
nothing in Redis can be verified, only for an actor without a certificate (a certified fleet asked for
authentication, and an unsigned notice has none). Results it cannot use, MAX_REFUSED times in a row,
stop the actor.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from actor.identity import Identity
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.results import put_payload
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.lease import Lease
from aurora_store.coord.notices import Notice
from aurora_store.coord.results import INLINE_MAX, Ref
from aurora_store.errors import StoreError
from aurora_store.format import identity as certs

if TYPE_CHECKING:
    from aurora_store.bucket.reader import Reader

log = logging.getLogger("aurora.actor")
REFUSED = frozenset({"bad_payload", "wrong_digest", "wrong_actor", *certs.REASONS})
"""Drops that say this actor's results are unusable (not merely late): a payload the trainer refuses,
or an identity it does not accept (none, an expired or revoked certificate, ...)."""
MAX_REFUSED = 3
KEEP = 4096
"""Stream ids of submitted results remembered (what notices may name)."""


class Outbox:
    """One actor's submitted results and the trainer's notices about them."""

    def __init__(
        self,
        board: JobBoard,
        store: ObjectStore,
        worker_id: str,
        region: str,
        *,
        inline_bytes: int,
        on_refused: Callable[[], None],
        identity: Identity | None = None,
        reader: Reader | None = None,
        applied: Callable[[], int] = lambda: 0,
    ) -> None:
        self.board, self.store = board, store
        self.wid, self.region = worker_id, region
        self.inline_bytes = inline_bytes
        self.on_refused = on_refused
        self.identity = identity
        """Signs each result (None: results go unsigned, which a trainer with a fleet key drops)."""
        self.submitted: OrderedDict[str, None] = OrderedDict()
        """Stream ids of the results this actor submitted (the last KEEP)."""
        self._lock = threading.Lock()
        self.reader, self.applied = reader, applied
        """The run's reader and the version this actor has applied: what a notice's signature is checked against."""
        self._told: set[str] = set()
        self._refused = 0
        self.refused = False
        """Whether the trainer kept refusing this actor's results (it was stopped)."""

    def submit(self, lease: Lease, version: int, version_hash: str, data: bytes) -> None:
        """Submit one result: inline up to ``inline_bytes``, else put in this region's bucket first."""
        ref = None
        if len(data) > min(self.inline_bytes, INLINE_MAX):
            try:
                key, sha = put_payload(self.store, data)
            except StoreError as exc:  # the bucket refuses: give the job back, never die of it
                log.warning("actor %s: cannot store the result of job %s: %s", self.wid, lease.job, exc)
                self.board.release(lease)
                return
            ref = Ref(self.region, key, sha, len(data))
        payload = None if ref is not None else data
        cert = sig = None
        if self.identity is not None:
            sha = ref.sha256 if ref is not None else hashlib.sha256(data).hexdigest()
            cert = self.identity.cert
            sig = self.identity.sign(lease, version=version, version_hash=version_hash, payload_sha256=sha)
        rid = self.board.results.submit(
            lease,
            actor=self.wid,
            version=version,
            version_hash=version_hash,
            payload=payload,
            ref=ref,
            cert=cert,
            sig=sig,
        )
        with self._lock:
            self.submitted[rid] = None
            while len(self.submitted) > KEEP:
                self.submitted.popitem(last=False)

    def told(self, notices: list[Notice]) -> None:
        """What the trainer said of this actor's results (the listener's callback). Each reason is
        logged once; results it cannot use (a payload it refuses, weights it did not publish, a lease
        not this actor's), MAX_REFUSED times in a row, stop the actor: it would only burn its GPU."""
        for n in notices:
            with self._lock:
                mine = n.result in self.submitted
            if not mine:
                continue  # about a result submitted in this actor's name by someone else: not its own
            trusted = self._verified(n)
            if not (trusted or (trusted is None and self.identity is None)):
                if "unverified" not in self._told:
                    self._told.add("unverified")
                    log.warning(
                        "actor %s: a notice that its result for job %s was dropped (%s) is not signed by the "
                        "run's key: not acted on (anyone who can write Redis can add one)",
                        self.wid,
                        n.job,
                        n.reason,
                    )
                continue
            with self._lock:
                if self.submitted.pop(n.result, False) is not None:
                    continue  # told of already (a replayed notice): each result counts once
            if n.reason not in self._told:
                self._told.add(n.reason)
                log.warning("actor %s: the trainer dropped its result for job %s: %s", self.wid, n.job, n.reason)
            self._refused = self._refused + 1 if n.reason in REFUSED else 0
            if self._refused >= MAX_REFUSED:
                log.error(
                    "actor %s: the trainer refused %d results in a row (%s); stopping: check this actor's "
                    "version and configuration against the run's",
                    self.wid,
                    self._refused,
                    n.reason,
                )
                self.refused = True
                self.on_refused()

    def _verified(self, n: Notice) -> bool | None:
        """Whether the trainer signed ``n`` with the run's key as of the version this actor holds (None: an
        unsigned run, where there is nothing to verify it with; False too when the run cannot be read)."""
        if self.reader is None:
            return None
        try:
            lineage = self.reader.lineage()
            if lineage.signed_by is None:
                return None
            era = self.reader.keys_at(self.applied(), f"notice {n.id}").last
        except StoreError:
            return False
        if era.public is None or n.signature is None or n.signature[0] != era.key_id:
            return False
        return self.board.notices.verify(self.wid, n, era.public)
