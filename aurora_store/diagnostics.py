"""What a role that seems stuck can be asked: ``kill -USR1 <pid>`` writes the stack of each of its threads
to its standard error (its log), and the role goes on. Stacks name files, lines and functions only, never
a value, so nothing there needs redacting."""

from __future__ import annotations

import faulthandler
import signal
import sys

STACKS_SIGNAL = signal.SIGUSR1
"""The signal that makes a role write its threads' stacks."""


def dump_stacks_on_signal() -> None:
    """Write every thread's stack to standard error on :data:`STACKS_SIGNAL` (once a role has started).
    Nothing is registered when standard error is no file (a role run inside another program that
    captures its output, as the tests' in-process commands do): the stacks would have nowhere to go."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return
    faulthandler.register(STACKS_SIGNAL, file=fd, all_threads=True, chain=False)
