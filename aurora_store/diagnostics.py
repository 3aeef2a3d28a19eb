"""What a role that seems stuck can be asked: ``kill -USR1 <pid>`` writes the stack of each of its threads
to its standard error (its log), and the role goes on. Stacks name files, lines, functions and their source
lines, never a value, so nothing there needs redacting.

The stacks are written by a Python signal handler, in the main thread between two bytecodes: unlike
``faulthandler``'s handler, which reads the other threads' frames from inside the signal while they run
(a trainer crashed of it, SIGSEGV, in CI), it never reads a frame being changed. A main thread inside one
long native call writes them when that call returns."""

from __future__ import annotations

import signal
import sys
import threading
import traceback
from types import FrameType

STACKS_SIGNAL = signal.SIGUSR1
"""The signal that makes a role write its threads' stacks."""


def dump_stacks_on_signal() -> None:
    """Write every thread's stack to standard error on :data:`STACKS_SIGNAL`. Python handles signals in
    the main thread only: called from another (a role run inside another program), it registers nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(STACKS_SIGNAL, _write_stacks)


def _write_stacks(_signum: int, _frame: FrameType | None) -> None:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"Thread {names.get(ident, '?')} ({ident:#x}), most recent call first:\n")
        out.extend(reversed(traceback.format_stack(frame)))
    sys.stderr.write("".join(out))
    sys.stderr.flush()
