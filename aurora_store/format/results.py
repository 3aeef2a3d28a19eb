"""A rollout result's payload: the bytes an actor sends the trainer for one job (pure bytes + numpy).

One payload holds a job's ``group`` completions, each a run of token ids with the sampling
logprob of every token, a finish reason and a reward; the job's reward-failure counts; and the
digest of the weights that generated it. All integers and floats are little-endian::

    offset  size  field
    0       4     magic b"AURR"
    4       1     format: u8, 1
    5       1     flags: u8; bit 0: a weights digest is present; other bits MUST be 0
    6       2     n: u16, completions
    8       4     total: u32, tokens of all completions
    12      8     failures: 4 x u16, counts of FAILURES in that order
    20      16    weights digest: the 16 bytes whose hex is a manifest's ``weights_digest``
                  (docs/FORMAT.md §9); all zero when bit 0 is clear
    36      28    reserved: MUST be zero (and records start 8-byte aligned)
    64      16n   records, one per completion: u32 tokens | u8 finish (index in FINISH) |
                  3 zero bytes | f64 reward
    64+16n  4T    token ids: i32 x total, completion after completion
    ...     4T    logprobs: f32 x total, same order

The payload is exactly ``64 + 16 n + 8 total`` bytes. Logprobs are float32 (what both engines
produce and the trainer computes in): :func:`encode` rounds a float64 that is not exactly a
float32 to the nearest one. :func:`decode` treats the bytes as hostile (another process wrote
them) and checks everything with whole-array numpy reductions, never a per-token loop; any
failure is a :class:`PayloadError` whose ``reason`` is one of :data:`REASONS`. See
docs/FORMAT.md, "Rollout results".
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aurora_store.errors import PayloadError

MAGIC = b"AURR"
FORMAT = 1
FINISH = ("stop", "length")
"""Finish reasons, by their code in a record."""
FAILURES = ("error", "invalid", "timeout", "crashed")
"""Reward-failure kinds, in their header order."""
MAX_PAYLOAD_BYTES = 64 << 20
"""The largest payload any reader accepts (about 8M tokens)."""
MAX_COMPLETIONS = 0xFFFF
MAX_FAILURE_COUNT = 0xFFFF

REASONS = (
    "bad_payload",  # not a byte buffer at all
    "payload_too_large",
    "wrong_size",
    "bad_magic",
    "unknown_format",
    "bad_header",
    "wrong_group",
    "bad_counts",
    "too_long",
    "bad_record",
    "bad_token",
    "bad_logprob",
    "bad_failures",
    "unencodable",
)
"""Every ``PayloadError.reason`` this module raises: a trainer counts drops by these."""

_HEADER = struct.Struct("<4sBBHI4H16s28s")
HEADER_BYTES = _HEADER.size
RECORD_BYTES = 16
_RECORD = np.dtype([("count", "<u4"), ("finish", "u1"), ("pad", "u1", (3,)), ("reward", "<f8")])
_FLAG_DIGEST = 1
_ZERO_DIGEST = bytes(16)
_ZERO_RESERVED = bytes(28)
_HEX32 = re.compile(r"[0-9a-f]{32}")
_I32 = np.iinfo(np.int32)
_F32_LOWEST = float(np.finfo(np.float32).min)
assert _HEADER.size == 64 and _RECORD.itemsize == RECORD_BYTES


def payload_size(n: int, total: int) -> int:
    """The exact byte length of a payload of ``n`` completions holding ``total`` tokens."""
    return HEADER_BYTES + RECORD_BYTES * n + 8 * total


@dataclass(frozen=True, slots=True)
class Rollouts:
    """A decoded, validated payload: the completions' tokens and logprobs laid end to end, cut by
    ``offsets``. Arrays are read-only and never alias a buffer that can change."""

    tokens: np.ndarray
    """int32 token ids of all completions, in order."""
    logprobs: np.ndarray
    """float32 logprob of each token."""
    offsets: np.ndarray
    """int64, n + 1: completion i is ``tokens[offsets[i]:offsets[i + 1]]``."""
    finish: np.ndarray
    """uint8 finish codes (indices in FINISH)."""
    rewards: np.ndarray
    """float64, one per completion."""
    failures: dict[str, int]
    """Reward-failure counts, nonzero kinds only."""
    weights_digest: str | None
    """Hex digest of the weights that generated these, when the actor sent one."""

    def __len__(self) -> int:
        return len(self.finish)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    def completion(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Completion ``i``'s token ids and logprobs (views)."""
        i = range(len(self))[i]
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[lo:hi], self.logprobs[lo:hi]

    def finish_reason(self, i: int) -> str:
        return FINISH[int(self.finish[range(len(self))[i]])]


Completion = tuple[Sequence[int] | np.ndarray, Sequence[float] | np.ndarray, str, float]
"""``(token_ids, logprobs, finish, reward)``, as :func:`encode` takes them."""


def encode(completions: Sequence[Completion], *, failures: Mapping[str, int], weights_digest: str | None) -> bytes:
    """The payload of ``completions``; PayloadError (reason ``unencodable`` or ``payload_too_large``)
    for anything the format cannot hold. Only representability is checked here: the trainer's rules
    (token ids within its vocabulary, finite logprobs <= 0, the group size) are :func:`decode`'s."""
    n = len(completions)
    if n > MAX_COMPLETIONS:
        raise PayloadError("unencodable", f"{n} completions, at most {MAX_COMPLETIONS}")
    counts = _failure_counts(failures)
    flags, digest = 0, _ZERO_DIGEST
    if weights_digest is not None:
        if not isinstance(weights_digest, str) or not _HEX32.fullmatch(weights_digest):
            raise PayloadError("unencodable", f"weights digest {weights_digest!r:.80} is not 32 lowercase hex digits")
        flags, digest = _FLAG_DIGEST, bytes.fromhex(weights_digest)
    toks, lps, lengths, codes, rewards, total = [], [], [], [], [], 0
    for i, c in enumerate(completions):
        if not isinstance(c, (tuple, list)) or len(c) != 4:
            raise PayloadError("unencodable", f"completion {i} is not (token_ids, logprobs, finish, reward)")
        t, lp = _tokens(c[0], i), _logprobs(c[1], i)
        if t.size != lp.size:
            raise PayloadError("unencodable", f"completion {i}: {t.size} token ids but {lp.size} logprobs")
        finish, reward = c[2], c[3]
        if not isinstance(finish, str) or finish not in FINISH:
            raise PayloadError("unencodable", f"completion {i}: finish reason {finish!r:.40} is not one of {FINISH}")
        value = _finite(reward)
        if value is None:
            raise PayloadError("unencodable", f"completion {i}: reward {reward!r:.40} is not a finite number")
        total += t.size
        if payload_size(n, total) > MAX_PAYLOAD_BYTES:
            break
        toks.append(t)
        lps.append(lp)
        lengths.append(t.size)
        codes.append(FINISH.index(finish))
        rewards.append(value)
    size = payload_size(n, total)
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadError("payload_too_large", f"{total} tokens make {size} bytes, at most {MAX_PAYLOAD_BYTES}")
    header = _HEADER.pack(MAGIC, FORMAT, flags, n, total, *counts, digest, _ZERO_RESERVED)
    records = np.zeros(n, dtype=_RECORD)
    records["count"], records["finish"], records["reward"] = lengths, codes, rewards
    out = np.empty(size, dtype=np.uint8)
    at = HEADER_BYTES + RECORD_BYTES * n
    out[:HEADER_BYTES] = np.frombuffer(header, dtype=np.uint8)
    out[HEADER_BYTES:at] = records.view(np.uint8)
    if total:  # each part straight into its place: one copy of the tokens before the bytes are made
        np.concatenate(toks, out=out[at : at + 4 * total].view("<i4"))
        np.concatenate(lps, out=out[at + 4 * total :].view("<f4"))
    return out.tobytes()


def _finite(x: object) -> float | None:
    if not isinstance(x, numbers.Real):
        return None
    try:
        value = float(x)
    except (OverflowError, ValueError, TypeError):
        return None
    return value if math.isfinite(value) else None


def _failure_counts(failures: Mapping[str, int]) -> list[int]:
    if not isinstance(failures, Mapping):
        raise PayloadError("unencodable", f"failures must be a mapping of kind to count, got {type(failures).__name__}")
    for kind, count in failures.items():
        if kind not in FAILURES:
            raise PayloadError("unencodable", f"failure kind {kind!r:.40} is not one of {FAILURES}")
        if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or not 0 <= count <= MAX_FAILURE_COUNT:
            raise PayloadError("unencodable", f"failure count {kind}={count!r:.40} is not in [0, {MAX_FAILURE_COUNT}]")
    return [int(failures.get(kind, 0)) for kind in FAILURES]


def _array(values: Any, i: int, what: str) -> np.ndarray:
    try:
        a = np.asarray(values)
    except (ValueError, TypeError, OverflowError) as exc:
        raise PayloadError(
            "unencodable", f"completion {i}: {what} are not a flat array of numbers: {exc}"[:200]
        ) from None
    if a.ndim != 1:
        raise PayloadError("unencodable", f"completion {i}: {what} have shape {a.shape}, expected a flat sequence")
    return a


def _tokens(values: Any, i: int) -> np.ndarray:
    a = _array(values, i, "token ids")
    if a.size == 0:
        return np.empty(0, dtype="<i4")
    if a.dtype.kind not in "iu":
        raise PayloadError("unencodable", f"completion {i}: token ids have dtype {a.dtype}, expected integers")
    if not np.can_cast(a.dtype, np.int32) and (a.min() < _I32.min or a.max() > _I32.max):
        raise PayloadError("unencodable", f"completion {i}: a token id is outside int32")
    return a.astype("<i4", copy=False)


def _logprobs(values: Any, i: int) -> np.ndarray:
    a = _array(values, i, "logprobs")
    if a.size == 0:
        return np.empty(0, dtype="<f4")
    if a.dtype.kind not in "fiu":
        raise PayloadError("unencodable", f"completion {i}: logprobs have dtype {a.dtype}, expected floats")
    if a.dtype == np.float32:
        return a
    with np.errstate(over="ignore"):  # a float64 beyond float32's range rounds to an infinity
        return a.astype("<f4", copy=False)


def decode(data: bytes | bytearray | memoryview, *, group: int, vocab: int, max_tokens: int) -> Rollouts:
    """Validate and decode a payload for a job of ``group`` completions, a model of ``vocab`` token
    ids and at most ``max_tokens`` tokens a completion. Raises PayloadError, and nothing else, for
    any bytes that are not such a payload. ``bytes`` are viewed in place; any other buffer (which
    could change after it was checked) is copied first."""
    if not 1 <= group <= MAX_COMPLETIONS or not 1 <= vocab <= 1 << 31 or not 1 <= max_tokens < 1 << 32:
        raise ValueError(f"decode(group={group}, vocab={vocab}, max_tokens={max_tokens}): out of range")
    buf = _immutable(data)
    size = len(buf)
    if size < HEADER_BYTES:
        raise PayloadError("wrong_size", f"{size} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, fmt, flags, n, total, *counts, digest, reserved = _HEADER.unpack_from(buf)
    if magic != MAGIC:
        raise PayloadError("bad_magic", f"starts with {magic!r}, not {MAGIC!r}")
    if fmt != FORMAT:
        raise PayloadError("unknown_format", f"format {fmt}, this reader reads {FORMAT}")
    if flags & ~_FLAG_DIGEST or reserved != _ZERO_RESERVED or (not flags and digest != _ZERO_DIGEST):
        raise PayloadError("bad_header", f"flags {flags:#04x}, reserved bytes or digest bytes not as specified")
    if n != group:
        raise PayloadError("wrong_group", f"{n} completions, the job asked for {group}")
    if size != payload_size(n, total):
        raise PayloadError(
            "wrong_size", f"{size} bytes, {n} completions of {total} tokens make {payload_size(n, total)}"
        )
    if max(counts) > n:
        raise PayloadError("bad_failures", f"reward-failure counts {counts} exceed the {n} completions")
    rec = np.frombuffer(buf, dtype=_RECORD, count=n, offset=HEADER_BYTES)
    lengths = rec["count"]
    if lengths.min() < 1 or int(lengths.sum(dtype=np.int64)) != total:
        raise PayloadError("bad_counts", f"completion lengths {_show(lengths)} are not all >= 1 summing to {total}")
    if lengths.max() > max_tokens:
        raise PayloadError("too_long", f"a completion of {int(lengths.max())} tokens, at most {max_tokens}")
    if rec["finish"].max() >= len(FINISH) or rec["pad"].any():
        raise PayloadError("bad_record", f"finish codes {_show(rec['finish'])} (or padding) not as specified")
    rewards = rec["reward"]
    if not np.isfinite(rewards).all():
        raise PayloadError("bad_record", f"rewards {_show(rewards)} are not all finite")
    at = HEADER_BYTES + RECORD_BYTES * n
    tokens = np.frombuffer(buf, dtype="<i4", count=total, offset=at)
    top = int(tokens.view("<u4").max())  # a negative id is above 2**31 here: one pass checks both ends
    if top >= vocab:
        low = int(tokens.min())
        raise PayloadError("bad_token", f"token id {low if low < 0 else top} outside [0, {vocab})")
    logprobs = np.frombuffer(buf, dtype="<f4", count=total, offset=at + 4 * total)
    if not (logprobs.max() <= 0 and logprobs.min() >= _F32_LOWEST):  # a NaN fails both
        raise PayloadError("bad_logprob", "logprobs are not all finite and <= 0")
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, dtype=np.int64, out=offsets[1:])
    finish, rewards = rec["finish"].copy(), rewards.copy()
    for a in (offsets, finish, rewards):
        a.flags.writeable = False
    return Rollouts(
        tokens=tokens,
        logprobs=logprobs,
        offsets=offsets,
        finish=finish,
        rewards=rewards,
        failures={k: c for k, c in zip(FAILURES, counts, strict=True) if c},
        weights_digest=digest.hex() if flags & _FLAG_DIGEST else None,
    )


def _immutable(data: object) -> bytes | memoryview:
    """``data`` as bytes that cannot change, after the size cap: ``bytes`` (or a view of bytes) in
    place, any other buffer (a bytearray, an mmap, an array: writable by someone) copied."""
    if isinstance(data, bytes):
        if len(data) > MAX_PAYLOAD_BYTES:
            raise PayloadError("payload_too_large", f"{len(data)} bytes, at most {MAX_PAYLOAD_BYTES}")
        return data
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise PayloadError("bad_payload", f"a payload is a byte buffer, not {type(data).__name__}") from None
    if view.nbytes > MAX_PAYLOAD_BYTES:
        raise PayloadError("payload_too_large", f"{view.nbytes} bytes, at most {MAX_PAYLOAD_BYTES}")
    if isinstance(view.obj, bytes) and view.c_contiguous:
        return view.cast("B")
    return view.tobytes()


def _show(a: np.ndarray) -> str:
    return np.array2string(a[:8], separator=",") + ("..." if a.size > 8 else "")


def payload_digest(data: bytes | bytearray | memoryview) -> str:
    """SHA-256 hex of a payload: the name of its offloaded object (see ``keys.result_key``)."""
    return hashlib.sha256(data).hexdigest()
