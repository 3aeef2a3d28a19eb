"""Whether Redis lost its state: the run's ``epoch`` key, a random id written by the first role to
find it missing. A role that finds another id (or none) than the one it last saw knows that Redis
lost its state without a disconnect (``FLUSHALL``, a failover to an empty replica) and rebuilds what
it keeps there. Read by a check of its own, or by a worker's heartbeat (same script round trip).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from aurora_store.coord.keyspace import Keyspace
from aurora_store.redact import redact

log = logging.getLogger("aurora.coord")

# KEYS: epoch.  ARGV: a new random id.  Returns the epoch, written now if it was missing.
_EPOCH = """
local e = redis.call('GET', KEYS[1])
if e then return e end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""


class Epoch:
    """The epoch this process last saw, and whether Redis lost its state since it was last asked."""

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys
        self._script = keys.script(_EPOCH)
        self.seen: str | None = None
        """The epoch last seen (None before the first check)."""
        self._lost = False

    @property
    def key(self) -> str:
        return self.keys.key("epoch")

    def check(self) -> bool:
        """Read (or start) Redis's epoch; True if Redis lost its state since the last check. Also sets
        the flag :meth:`lost` reports."""
        return self.saw(self.keys.call(self._script, keys=[self.key], args=[secrets.token_hex(8)]))

    def lost(self) -> bool:
        """Whether Redis lost its state since the last call (seen by any check or heartbeat); clears it."""
        lost, self._lost = self._lost, False
        return lost

    def saw(self, epoch: Any) -> bool:
        """Note an epoch read from Redis (by :meth:`check` or a heartbeat); True if it changed."""
        if not isinstance(epoch, str):
            self.keys.skipped.skip("bad_epoch", repr(epoch)[:40])
            return False
        lost = self.seen is not None and epoch != self.seen
        if lost:
            log.warning(
                "Redis at %s lost its state (epoch %s, was %s): rebuilding", redact(self.keys.url), epoch, self.seen
            )
            self._lost = True
        self.seen = epoch
        return lost

    def mark_lost(self) -> None:
        """This process's state in Redis is gone although the epoch is the same (a registration pruned)."""
        self._lost = True
