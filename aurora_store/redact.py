"""Secrets out of everything printed: URLs and messages with their passwords replaced by ``***``.

Redis URLs carry passwords (``redis://:pw@host``, ``rediss://user:pw@host``, ``?password=pw``)
and store URIs may carry credentials (``https://user:pw@host/...``). Every URL or message that
may hold one passes through :func:`redact` before it reaches a log, an error or JSON output.
"""

from __future__ import annotations

import logging
import re

_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^/@\s:]*)"
    # a password as people write it: '/', '@', spaces and all (not percent-encoded), up to the '@'
    # that a host follows; it never runs into another URL or over a line
    r"(:(?P<pw>(?:(?!://)[^\r\n]){0,512}?))?"
    r"@(?=[A-Za-z0-9.\-_~%\[\]]*(?:[:/?#\s\"'<>,;)]|$))"
)
_QUERY = re.compile(
    r"(?P<key>[?&;](password|passwd|pwd|secret|token|access_token|sig|signature|key|auth|credential)[A-Za-z_\-]*=)[^&#\s'\"]*",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with the password of every URL in it (user info and password-like query parameters)
    replaced by ``***``; a user name without a password is a secret of its own in ``redis://pw@host``
    form, so it is hidden too unless a password follows it."""

    def userinfo(m: re.Match[str]) -> str:
        if m.group("pw") is not None:
            return f"{m.group('scheme')}{m.group('user')}:***@"
        return f"{m.group('scheme')}***@"

    return _QUERY.sub(lambda m: m.group("key") + "***", _USERINFO.sub(userinfo, text))


SECRET_KEYS = re.compile(
    r"(secret|password|passwd|token|credential|private|connection_?string|conn_?str|^key$|_key$)", re.IGNORECASE
)
"""Names of options (fsspec storage options, config keys) whose values are credentials (an Azure
``connection_string`` holds the account key)."""

GCSFS_TOKEN_METHODS = frozenset({"anon", "google_default", "cache", "cloud", "browser"})
"""Values of gcsfs's ``token`` option that name where to find credentials (the environment's, the VM's
service account, none), not a credential: a ``gs://`` region's usual options, never a secret."""


def is_secret(key: object, value: object) -> bool:
    """Whether option ``key`` holds a credential in ``value`` (an empty value holds none)."""
    if value is None or value == "" or value is False or not SECRET_KEYS.search(str(key)):
        return False
    return not (str(key) == "token" and isinstance(value, str) and value in GCSFS_TOKEN_METHODS)


def redact_value(value: object) -> object:
    """``value`` (a string, or options nested in dicts) fit to print: URL passwords redacted, the
    values of credential-like keys (``secret``, ``token``, ``key``, ...) replaced by ``***``."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: "***" if is_secret(k, v) else redact_value(v) for k, v in value.items()}
    return value


class RedactingFilter(logging.Filter):
    """A log filter that redacts every record's message (its arguments merged in first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def setup_logging(level: int = logging.INFO) -> None:
    """The roles' logging: timestamps and logger names on stderr, every record redacted."""
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
