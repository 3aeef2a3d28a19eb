"""Retrying Redis without a crash loop or a thundering herd.

When Redis refuses a fleet (its ``maxclients`` reached, a failover, a restart), a thousand actors
retrying on a fixed period come back at once and are refused together again. :class:`Backoff` waits
"full jitter" exponential delays (uniform in [0, min(cap, base x 2^n)]), so their retries spread over
the window; and it says what happened in one line when the trouble starts and one when it ends, not
once per try.
"""

from __future__ import annotations

import logging
import random

REASONS = {
    "max number of clients reached": "maxclients",
    "Connection refused": "connection_refused",
    "CLUSTERDOWN": "clusterdown",
    "MOVED": "moved",
    "TRYAGAIN": "tryagain",
    "LOADING": "loading",
}
"""Reasons a Redis turns a client away or cannot serve it now, as redis-py reports them, and each one's name
in metrics (``other`` for any other failure)."""


def refusal(error: object) -> str | None:
    """The refusal (a key of :data:`REASONS`) that ``error`` reports, None if it is another failure."""
    return next((text for text in REASONS if text in str(error)), None)


def reason(error: object) -> str:
    """The name of why Redis failed a try (:data:`REASONS`, else ``other``)."""
    why = refusal(error)
    return "other" if why is None else REASONS[why]


class Backoff:
    """Jittered exponential waits between tries, and the one line each episode of failures is told in."""

    def __init__(
        self,
        who: str,
        log: logging.Logger | None,
        *,
        base_s: float = 0.5,
        cap_s: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        self.who, self.log = who, log
        """Where an episode is told (None: silent, where another part of the process tells it)."""
        self.base_s, self.cap_s = base_s, cap_s
        self.rng = rng or random.Random()
        self.failures = 0
        """Failed tries in a row (0: the last try succeeded)."""

    def failed(self, error: object) -> float:
        """A try failed with ``error``: the seconds to wait before the next (said once an episode)."""
        if self.failures == 0 and self.log is not None:
            why = refusal(error)
            said = f"Redis turned it away ({why})" if why else "Redis failed"
            self.log.warning(
                "%s: %s: %s; retrying with jittered backoff (up to %.0f s), said again when it recovers",
                self.who,
                said,
                error,
                self.cap_s,
            )
        self.failures += 1
        return self.rng.uniform(0, min(self.cap_s, self.base_s * 2 ** min(self.failures, 30)))

    def succeeded(self) -> None:
        """A try succeeded: the episode, if any, ends (said in one line)."""
        if self.failures and self.log is not None:
            self.log.warning("%s: Redis serves it again after %d failed tries", self.who, self.failures)
        self.failures = 0
