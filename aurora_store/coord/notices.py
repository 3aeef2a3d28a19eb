"""What the trainer tells an actor about one of its results (dropped, and why): a short stream per
actor, ``notices:{actor}``, that the actor reads with its inbox and its region's commits.

The actor counts only notices of results it submitted: anyone who can write Redis can submit in its
name, but not under its results' stream ids. Anyone who can write Redis can also add notices, so in a
signed run the trainer signs each with the run's key (domain ``aurora-notice/1``, over the run id, the
actor, the job, the reason and the result's stream id) and an actor acts only on those it verifies.
Entries are hostile input: a damaged one is counted and skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aurora_store.coord.errors import JobError
from aurora_store.coord.keyspace import Keyspace
from aurora_store.coord.lease import check_name
from aurora_store.errors import UnauthenticatedError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

DOMAIN = b"aurora-notice/1\0"
_KEY_ID = re.compile(r"[0-9a-f]{16}")
_SIG = re.compile(r"[A-Za-z0-9+/]{86}==")
"""A key id and an Ed25519 signature in base64, as :mod:`aurora_store.format.signing` writes them (the
coordination layer stays light: the signing code is imported only when a notice is signed or checked)."""

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
    signature: tuple[str, str] | None = None
    """The trainer's, by the run's key, as (key id, base64 signature); None: unsigned (an unsigned run's,
    or forged)."""


class Notices:
    """The notice streams of a run's actors (``JobBoard.notices``)."""

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys

    def key(self, actor: str) -> str:
        """The stream of notices to ``actor``."""
        return self.keys.actor_key(actor, "notices", check_name(actor, "actor"))

    def tell(
        self, actor: str, job: str, reason: str, result: str = "", *, key: Ed25519PrivateKey | None = None
    ) -> None:
        """Tell ``actor`` that the result ``result`` (its stream id) for ``job`` was dropped, and why;
        signed with ``key`` (the run's signing key, in a signed run)."""
        try:
            stream = self.key(actor)
        except JobError:
            return  # no actor of this run has that name: nobody to tell
        fields = {"job": job, "reason": reason, "result": result}
        if key is not None:
            from aurora_store.format import signing

            sig = signing.sign_message(DOMAIN, self.body(actor, Notice("", job, reason, result)), key)
            fields.update(key_id=sig.key_id, sig=sig.sig)
        self.keys.call(self.keys.r.xadd, stream, fields, maxlen=NOTICES_MAXLEN, approximate=True)

    def body(self, actor: str, n: Notice) -> bytes:
        """What a notice's signature covers: this run, the actor, and what it says of which result."""
        return json.dumps([self.keys.run_id, actor, n.job, n.reason, n.result], separators=(",", ":")).encode()

    def verify(self, actor: str, n: Notice, key: Ed25519PublicKey) -> bool:
        """Whether ``n`` (read from ``actor``'s stream) carries the signature of ``key`` over what it says."""
        from aurora_store.format import signing
        from aurora_store.format.manifest import Signature

        if n.signature is None:
            return False
        signed = Signature("ed25519", *n.signature)
        try:
            signing.verify_message(DOMAIN, self.body(actor, n), signed, key, f"notice {n.id}")
        except UnauthenticatedError:
            return False
        return True

    def read(self, actor: str, after: str) -> list[Notice]:
        """What the trainer told ``actor`` after stream id ``after`` (damaged entries skipped)."""
        reply = self.keys.xread({self.key(actor): after}, count=NOTICES_MAXLEN)
        return self.parse(actor, [e for _s, entries in reply or [] for e in entries])

    def parse(self, actor: str, entries: Sequence[tuple[str, dict[str, str]]]) -> list[Notice]:
        """Notice entries as read from ``actor``'s stream, checked (damaged ones counted and skipped)."""
        out = []
        for eid, f in entries:
            reason = f.get("reason")
            if isinstance(reason, str) and reason.isidentifier() and len(reason) <= 64:
                kid, sig = f.get("key_id"), f.get("sig")
                signed = (
                    (kid, sig)
                    if isinstance(kid, str) and isinstance(sig, str) and _KEY_ID.fullmatch(kid) and _SIG.fullmatch(sig)
                    else None
                )
                job, result = str(f.get("job", ""))[:200], str(f.get("result", ""))[:64]
                out.append(Notice(eid, job, reason, result, signed))
            else:
                self.keys.skipped.skip("bad_notice", f"notice {eid} of {actor}")
        return out

    def forget(self, pipe: Any, actors: Sequence[str]) -> None:
        """Queue on ``pipe`` the deletion of the notice streams of ``actors`` (checked names)."""
        for a in actors:  # one key a command: on a cluster the actors' streams are on different slots
            pipe.delete(self.key(a))
