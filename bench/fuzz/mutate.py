"""The mutators of ``aurora bench fuzz``: bytes (flips, interesting values, truncation, splicing),
JSON by structure (types changed, numbers huge or fractional, strings long or with lone
surrogates, keys added and removed, deep nesting), and Redis entries by field. Seeded and
deterministic: the same ``random.Random`` state gives the same mutant."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

MAX_INPUT = 1 << 20
"""No mutant grows past this (every cap a parser has below it is reached; those above, by their own tests)."""

INTERESTING_BYTES = (0x00, 0xFF, 0x7F, 0x80, 0x01, 0x20, 0x22, 0x5C, 0x5B, 0x5D, 0x7B, 0x7D, 0x30, 0x39, 0x2D)
NUMBERS: tuple[bytes, ...] = (b"0", b"-1", b"-0", b"1e400", b"0.5", b"NaN", b"-Infinity", b"18446744073709551616")
NUMBERS += (b"4611686018427387905", b"9" * 40, b"9" * 5000, b"00", b"1E2", b"2147483648", b"1" * 19)
STACK = (1, 1, 1, 2, 2, 3, 4, 8)
_DIGITS = re.compile(rb"-?[0-9]+")


def mutate_bytes(rng: random.Random, data: bytes, *, keep_length: bool = False, others: Sequence[bytes] = ()) -> bytes:
    """1 to 8 stacked byte mutations; ``keep_length``: only those that keep the length."""
    b = bytearray(data)
    for _ in range(rng.choice(STACK)):
        n = len(b)
        if n:
            op = rng.randrange(6 if keep_length else 14)
        elif keep_length:
            break
        else:
            op = 6 + rng.randrange(8)
        i = rng.randrange(n) if n else 0
        k = rng.randrange(1, min(n - i, 64) + 1) if n else 0
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.choice(INTERESTING_BYTES)
        elif op == 2:
            b[i] = rng.randrange(256)
        elif op == 3:  # overwrite a chunk with another part of the input
            j = rng.randrange(n - k + 1)
            b[i : i + k] = b[j : j + k]
        elif op == 4:
            b[i : i + k] = rng.randbytes(k)
        elif op == 5:
            b[i] = (b[i] + rng.choice((1, -1, 16, -16))) & 0xFF
        elif op == 6:
            b[i:i] = bytes([rng.choice(INTERESTING_BYTES)]) * rng.choice((1, 1, 2, 7))
        elif op == 7:
            del b[i : i + k]
        elif op == 8:
            b[i:i] = b[i : i + k]
        elif op == 9:
            del b[rng.randrange(n + 1) :]
        elif op == 10:
            run = bytes(b[i : i + rng.choice((1, 1, 4))]) or b"\x00"
            b[i:i] = run * (rng.choice((16, 256, 4096, 65536)) // len(run))
        elif op == 11 and others:
            other = rng.choice(others)
            b[i:] = other[rng.randrange(len(other) + 1) :]
        elif op == 12:
            found = list(_DIGITS.finditer(b))
            if found:
                m = rng.choice(found)
                b[m.start() : m.end()] = rng.choice(NUMBERS)
        else:
            b[i:i] = rng.randbytes(rng.randrange(1, 32))
        if len(b) > MAX_INPUT:
            del b[MAX_INPUT:]
    return bytes(b)


_DEEP = "\x00\x01deep"
"""A value replaced after serialisation by nesting no encoder would write."""
INTERESTING: tuple[Any, ...] = (0, 1, -1, 2, 255, 256, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**62, 2**62 + 1, 2**63 - 1)
INTERESTING += (2**63, 2**64, 10**18, 10**19, 10**100, -(2**63), 0.0, -0.0, 0.5, 1e308, 5e-324, float("nan"))
INTERESTING += (float("inf"), float("-inf"), True, False, None, "", "0", "-1", "a", "\ud800", "\udfff", "\u00e9")
INTERESTING += ("\x00", "\u2028", "..", "/", "files/../x", "ed25519", "\U0001f600", "__metadata__", "sparse", "dense")
INTERESTING += (
    "BF16",
    "F32",
    "I64",
    "BOOL",
    "delta",
    "full",
    "aurora/1",
    "aurora/2",
    "aurora/3",
    "classed",
    (),
    ("x",),
    _DEEP,
)


def _interesting(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.08:
        return "A" * rng.choice((257, 4097, 70_000))
    if r < 0.14:
        return rng.randbytes(rng.randrange(1, 40)).decode("utf-8", "surrogateescape")
    if r < 0.18:
        return 10 ** rng.randrange(400)
    v = rng.choice(INTERESTING)
    if isinstance(v, tuple):  # fresh containers: a list or an object
        return list(v) if rng.random() < 0.5 else {x: 0 for x in v}
    return v


def _mutate_str(rng: random.Random, s: str) -> str:
    r = rng.random()
    if r < 0.5:
        return mutate_bytes(rng, s.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogateescape")
    if r < 0.7:
        return s + rng.choice(("\ud800", "\u00e9", "\x00", "/", "..", "\n", " ", "|"))
    if r < 0.85:
        return s[: rng.randrange(len(s) + 1)]
    return (s * rng.choice((2, 50)))[:MAX_INPUT]


def _new_value(rng: random.Random, old: Any, values: list[Any]) -> Any:
    r = rng.random()
    if type(old) is int and r < 0.5:
        return rng.choice(
            (old + 1, old - 1, -old, old * 2, old + rng.randrange(-1000, 1000), old ^ (1 << rng.randrange(64)))
        )
    if isinstance(old, str) and r < 0.5:
        return _mutate_str(rng, old)
    if r < 0.8 or not values:
        return _interesting(rng)
    if r < 0.9:
        return rng.choice(values)
    return rng.choice(([old], {"x": old}, str(old), [old, old]))


def _nodes(root: Any) -> tuple[list[tuple[Any, Any]], list[Any]]:
    """Every (container, key) below ``root``, and every container (``root`` first), walked without recursion."""
    slots: list[tuple[Any, Any]] = []
    containers: list[Any] = []
    stack = [root] if isinstance(root, (dict, list)) else []
    while stack and len(slots) < 5000:
        c = stack.pop()
        containers.append(c)
        for k, v in list(c.items()) if isinstance(c, dict) else enumerate(c):
            slots.append((c, k))
            if isinstance(v, (dict, list)):
                stack.append(v)
    return slots, containers


def _mutate_tree(rng: random.Random, root: Any) -> None:
    slots, containers = _nodes(root)
    values = [c[k] for c, k in slots[:200]]
    if slots and rng.random() < 0.7:
        c, k = rng.choice(slots)
        c[k] = _new_value(rng, c[k], values)
        return
    if not containers:
        return
    c = rng.choice(containers)
    r = rng.random()
    if isinstance(c, dict):
        keys = list(c)
        if keys and r < 0.4:
            del c[rng.choice(keys)]
        elif keys and r < 0.55:
            old = rng.choice(keys)
            c[_mutate_str(rng, old)] = c.pop(old)
        else:
            name = rng.choice([*keys, "x", "", "__metadata__", "\ud800", "run", "files", "sig"])
            c[name if name not in c else name + "_"] = rng.choice(values) if values and r < 0.8 else _interesting(rng)
    elif c and r < 0.3:
        del c[rng.randrange(len(c))]
    elif c and r < 0.5:
        i = rng.randrange(len(c))
        c.insert(i, c[i])
    elif r < 0.7:
        c.append(rng.choice(values) if values else _interesting(rng))
    elif r < 0.85:
        c.reverse()
    else:
        c.clear()


def mutate_json(
    rng: random.Random,
    data: bytes,
    *,
    fix: Callable[[random.Random, Any], None] | None = None,
    within: Callable[[Any], Any] | None = None,
) -> bytes:
    """Parse ``data``, mutate 1-3 nodes (below ``within(doc)`` if given), ``fix`` the document (a
    manifest's hash), re-serialise: canonical mostly, sometimes with non-ASCII, duplicate keys or deep nesting."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return mutate_bytes(rng, data)
    holder = [doc]
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        try:
            root = within(holder[0]) if within is not None else holder[0]
        except (LookupError, TypeError):
            root = holder[0]
        if not isinstance(root, (dict, list)) or rng.random() < 0.02:
            root = holder
        _mutate_tree(rng, root)
        if not holder:  # the document itself was deleted
            holder.append(None)
    doc = holder[0]
    if fix is not None:
        fix(rng, doc)
    r = rng.random()
    try:
        text = json.dumps(
            doc, sort_keys=r < 0.9, separators=(",", ":"), ensure_ascii=r < 0.75, indent=1 if r > 0.95 else None
        )
    except (ValueError, RecursionError, TypeError):
        return mutate_bytes(rng, data)
    deep = json.dumps(_DEEP)
    if deep in text:
        d = rng.choice((64, 1000, 5000, 100_000))
        nest = rng.choice(("[" * d + "]" * d, '{"a":' * d + "0" + "}" * d, "[" * d, '[{"a":' * d))
        text = text.replace(deep, nest, 1).replace(deep, "0")
    if rng.random() < 0.05 and (i := text.find('{"')) >= 0 and (j := text.find(",", i)) > 0:
        text = text[: i + 1] + text[i + 1 : j] + "," + text[i + 1 :]  # a repeated first member
    return text.encode("utf-8", "surrogatepass")


TEXTS: tuple[str, ...] = ("", "0", "-1", "00", "01", "+1", " 1", "1 ", "1" * 19, "9" * 40, "1e3", "0x10", "\u0661")
TEXTS += (
    "NaN",
    "inf",
    "\ud800",
    "\x00",
    "a|b",
    "a b",
    "{x}",
    "x" * 201,
    "x" * 100_000,
    "[" * 100_000,
    '{"a":' * 100_000,
)
TEXTS += ("[]", "{}", "null", '{"a":NaN}', '{"a":1e999}', '{"a":"\\ud800"}', '""', "A" * 64, "a" * 63, "f" * 64, "../x")
TEXTS += ("versions/0000000001/manifest.json", f"versions/0000000001/00000-{'0' * 32}.seg", "commit", "segment")
FIELDS = ("type", "version", "key", "size", "sha256", "version_hash", "kind", "job", "token", "actor", "payload", "doc")


def _mutate_text(rng: random.Random, v: Any) -> Any:
    r = rng.random()
    if isinstance(v, str) and v[:1] in ("{", "[") and r < 0.4:
        return mutate_json(rng, v.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogateescape")
    if isinstance(v, str) and r < 0.7:
        return _mutate_str(rng, v)
    if r < 0.75:
        return rng.choice((b"1", b"\xff", None, 1, ["1"]))  # what another client library might hand back
    return rng.choice(TEXTS)


def mutate_fields(rng: random.Random, fields: dict[str, Any]) -> dict[str, Any]:
    """Mutate a Redis entry (str -> str or bytes): its values (as text, as JSON when they hold JSON, as
    bytes when they are bytes), or its fields."""
    out = dict(fields)
    for _ in range(rng.choice((1, 1, 2, 3))):
        keys, r = list(out), rng.random()
        if not keys or r < 0.1:
            out[rng.choice((*FIELDS, *keys))] = rng.choice(TEXTS)
        elif r < 0.2:
            del out[rng.choice(keys)]
        elif r < 0.25:
            old = rng.choice(keys)
            out[_mutate_str(rng, old) if rng.random() < 0.5 else rng.choice(FIELDS)] = out.pop(old)
        elif r < 0.3:
            a, b = rng.choice(keys), rng.choice(keys)
            out[a], out[b] = out[b], out[a]
        else:
            k = rng.choice(keys)
            v = out[k]
            out[k] = mutate_bytes(rng, v) if isinstance(v, bytes) else _mutate_text(rng, v)
    return out
