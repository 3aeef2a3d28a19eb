"""``json.loads`` for bytes another process wrote.

Python's parser follows nesting until the interpreter's recursion limit and raises
RecursionError, and it accepts ``NaN`` and ``Infinity``; neither is JSON another role of
AuroraRL writes. :func:`loads` makes both a ValueError like any other malformed document, so a
caller that catches ValueError (and wraps it in its own error family) is complete.
"""

from __future__ import annotations

import json
from typing import Any


def _refuse(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


def loads(data: bytes | bytearray | str) -> Any:
    """The JSON document ``data``; ValueError for anything that is not one (UnicodeDecodeError
    for bytes that are not UTF-8 is a ValueError too)."""
    try:
        return json.loads(data, parse_constant=_refuse)
    except RecursionError:
        raise ValueError("JSON nested deeper than a parser may follow") from None
