"""Opening a local file another process may have planted: regular files only, reads bounded.

A FIFO (or a device) put where a store object, a config file or a key file is expected would
block ``open()`` until a writer comes, or feed bytes forever: every local read of such a path
opens it without blocking, checks it is a regular file before reading a byte, and reads at most
what the caller allows. Standard library only, so every layer may use it.
"""

from __future__ import annotations

import errno
import os
import stat

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFile(OSError):
    """A path that should hold a regular file holds something else (``strerror`` says what)."""


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of ``path`` (blocking, close-on-exec), once it is known to be a
    regular file: NotRegularFile otherwise, without waiting for a FIFO's writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
            raise NotRegularFile(errno.EINVAL, f"not a regular file ({kind})", os.fspath(path))
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def pread_bounded(fd: int, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of regular file ``fd`` (fewer at its end)."""
    parts, at = [], start
    while at < stop:
        got = os.pread(fd, min(stop - at, 16 << 20), at)
        if not got:
            break
        parts.append(got)
        at += len(got)
    return b"".join(parts)


def read_regular(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """At most ``max_bytes`` bytes from the start of regular file ``path`` (NotRegularFile, or the
    OSError of opening it, otherwise)."""
    fd = open_regular(path)
    try:
        return pread_bounded(fd, 0, max_bytes)
    finally:
        os.close(fd)
