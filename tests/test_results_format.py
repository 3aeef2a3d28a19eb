"""Rollout-result payloads: the exact bytes of a tiny example, bit-exact round trips, every hostile
input refused with its reason (and nothing but PayloadError, whatever the bytes), no aliasing of a
buffer that can change, and offloaded payload objects on memory://, file:// and s3:// (moto)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.results import get_payload, put_payload
from aurora_store.errors import ConflictError, CorruptError, LimitError, MissingError, PayloadError, StoreError
from aurora_store.format import results as R
from aurora_store.format.digest import Digest
from aurora_store.format.keys import RESULTS_DIR, check_result_key, result_key
from tests.conftest import Root

VOCAB, MAX_TOKENS = 1000, 64
DIGEST = "0123456789abcdef" * 2
"""A weights digest: 16 bytes as 32 hex digits, as manifests record it (docs/FORMAT.md §9)."""


def _payload(n: int = 3, length: int = 5, **kw: Any) -> bytes:
    comps = [
        (np.arange(length, dtype=np.int32) + i, np.linspace(-3.0, 0.0, length), R.FINISH[i % 2], float(i) - 0.5)
        for i in range(n)
    ]
    return R.encode(comps, failures=kw.get("failures", {"timeout": 1}), weights_digest=kw.get("digest", DIGEST))


def _decode(data: Any, group: int = 3, **kw: Any) -> R.Rollouts:
    return R.decode(data, group=group, vocab=kw.get("vocab", VOCAB), max_tokens=kw.get("max_tokens", MAX_TOKENS))


def _reason(data: Any, group: int = 3, **kw: Any) -> str:
    with pytest.raises(PayloadError) as info:
        _decode(data, group, **kw)
    return info.value.reason


def _patched(data: bytes, fmt: str, offset: int, *values: Any) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, *values)
    return bytes(buf)


# ---------------------------------------------------------------- exact bytes


def test_the_bytes_of_a_tiny_payload() -> None:
    data = R.encode([([1, 2], [-0.5, -0.25], "length", 1.0)], failures={"timeout": 1}, weights_digest=None)
    fields = [
        "41555252 01 00 0100 02000000",  # magic "AURR", format 1, flags 0, n = 1, total = 2
        "0000 0000 0100 0000",  # failures: error, invalid, timeout = 1, crashed
        "00" * 16,  # no weights digest
        "00" * 28,  # reserved
        "02000000 01 000000 000000000000f03f",  # record: 2 tokens, finish = length, padding, reward 1.0
        "01000000 02000000",  # token ids 1, 2
        "000000bf 000080be",  # logprobs -0.5, -0.25
    ]
    expected = bytes.fromhex(" ".join(fields))
    assert data == expected and len(data) == R.payload_size(1, 2) == 96
    r = R.decode(data, group=1, vocab=3, max_tokens=2)
    assert r.failures == {"timeout": 1} and r.weights_digest is None and r.finish_reason(0) == "length"
    with_digest = R.encode([([1, 2], [-0.5, -0.25], "stop", 1.0)], failures={}, weights_digest=DIGEST)
    assert with_digest[5] == 1 and with_digest[20:36] == bytes.fromhex(DIGEST) and with_digest[12:20] == bytes(8)
    assert with_digest[64 + 4] == 0  # stop


def test_a_manifest_weights_digest_round_trips() -> None:
    digest = Digest([3, 2**64 - 1]).hex()
    data = R.encode([([0], [0.0], "stop", 0.0)], failures={}, weights_digest=digest)
    assert R.decode(data, group=1, vocab=1, max_tokens=1).weights_digest == digest == "03" + "00" * 7 + "ff" * 8


def test_payloads_are_about_8_bytes_a_token() -> None:
    data = _payload(8, 16)
    assert len(data) == 64 + 8 * 16 + 8 * 8 * 16


# ---------------------------------------------------------------- round trips

_logprob = st.floats(max_value=0.0, width=32, allow_nan=False, allow_infinity=False)  # -0.0 and subnormals too
_reward = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def _job(draw: st.DrawFn) -> tuple[list[Any], dict[str, int], str | None]:
    n = draw(st.integers(1, 5))
    comps: list[Any] = []
    for _ in range(n):
        k = draw(st.integers(1, 24))
        toks = draw(st.lists(st.integers(0, VOCAB - 1), min_size=k, max_size=k))
        lps = draw(st.lists(_logprob, min_size=k, max_size=k))
        arrays = draw(st.booleans())  # else plain lists; the floats are exact float32 values
        t, lp = (np.array(toks, dtype=np.int64), np.array(lps, dtype=np.float32)) if arrays else (toks, lps)
        comps.append((t, lp, draw(st.sampled_from(R.FINISH)), draw(_reward)))
    failures = draw(st.dictionaries(st.sampled_from(R.FAILURES), st.integers(0, n)))
    digest = draw(st.none() | st.binary(min_size=16, max_size=16).map(bytes.hex))
    return comps, failures, digest


@given(_job())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # 200 took 10-15 s
def test_round_trip_is_bit_exact(job: tuple[list[Any], dict[str, int], str | None]) -> None:
    comps, failures, digest = job
    data = R.encode(comps, failures=failures, weights_digest=digest)
    r = R.decode(data, group=len(comps), vocab=VOCAB, max_tokens=24)
    assert len(r) == len(comps) and r.n_tokens == sum(len(c[0]) for c in comps)
    assert r.tokens.dtype == np.int32 and r.logprobs.dtype == np.float32 and r.offsets.dtype == np.int64
    for i, (toks, lps, finish, reward) in enumerate(comps):
        t, lp = r.completion(i)
        assert t.tolist() == list(np.asarray(toks).tolist())
        assert lp.view(np.uint32).tolist() == np.asarray(lps, dtype=np.float32).view(np.uint32).tolist()
        assert r.finish_reason(i) == finish
        assert np.float64(r.rewards[i]).view(np.uint64) == np.float64(reward).view(np.uint64)
    assert r.failures == {k: v for k, v in failures.items() if v}
    assert r.weights_digest == digest
    assert R.encode(comps, failures=failures, weights_digest=digest) == data  # deterministic


def test_signed_zeros_and_subnormals_keep_their_bits() -> None:
    lps = np.array([-0.0, 0.0, -1e-45, -1.17e-38, -np.finfo(np.float32).max], dtype=np.float32)
    r = R.decode(
        R.encode([(range(5), lps, "stop", -0.0)], failures={}, weights_digest=None), group=1, vocab=5, max_tokens=5
    )
    assert r.logprobs.view(np.uint32).tolist() == [0x80000000, 0, 0x80000001, lps[3].view(np.uint32), 0xFF7FFFFF]
    assert np.signbit(r.rewards[0]) and r.rewards[0] == 0.0


def test_float64_logprobs_round_to_the_nearest_float32() -> None:
    x = np.array([-0.1, -1 / 3, -(1 + 2**-24), -(1 + 3 * 2**-24), -1e-50])
    data = R.encode([([0] * 5, x, "stop", 0.0)], failures={}, weights_digest=None)
    r = R.decode(data, group=1, vocab=1, max_tokens=5)
    assert r.logprobs.view(np.uint32).tolist() == x.astype(np.float32).view(np.uint32).tolist()
    # ties go to even: 1 + 2**-24 is halfway between 1 and 1 + 2**-23; 1 + 3 * 2**-24 halfway up to 1 + 2**-22
    assert r.logprobs[2] == -1.0 and r.logprobs[3] == -(1 + 2**-22) and np.signbit(r.logprobs[4])
    beyond = R.encode([([0], [-1e300], "stop", 0.0)], failures={}, weights_digest=None)  # rounds to -inf
    assert np.frombuffer(beyond, "<f4", offset=len(beyond) - 4)[0] == -np.inf
    assert _reason(beyond, 1) == "bad_logprob"


def test_rollouts_accessors() -> None:
    r = _decode(_payload())
    assert r.offsets.tolist() == [0, 5, 10, 15] and r.finish.tolist() == [0, 1, 0]
    assert r.completion(-1)[0].tolist() == [2, 3, 4, 5, 6] and r.finish_reason(-2) == "length"
    assert r.rewards.tolist() == [-0.5, 0.5, 1.5] and r.completion(1)[1][-1] == 0.0
    with pytest.raises(IndexError):
        r.completion(3)
    with pytest.raises(IndexError):
        r.finish_reason(-4)


# ---------------------------------------------------------------- encode refuses what the format cannot hold


@pytest.mark.parametrize(
    ("comps", "failures", "digest", "reason"),
    [
        ([([2**31], [0.0], "stop", 0.0)], {}, None, "unencodable"),
        ([([-(2**31) - 1], [0.0], "stop", 0.0)], {}, None, "unencodable"),
        ([(np.array([2**40], dtype=np.uint64), [0.0], "stop", 0.0)], {}, None, "unencodable"),
        ([([2**70], [0.0], "stop", 0.0)], {}, None, "unencodable"),
        ([([1.0], [0.0], "stop", 0.0)], {}, None, "unencodable"),
        ([([[1]], [0.0], "stop", 0.0)], {}, None, "unencodable"),
        ([([1, 2], [0.0], "stop", 0.0)], {}, None, "unencodable"),
        ([([1], ["x"], "stop", 0.0)], {}, None, "unencodable"),
        ([([1], [0.0], "eos", 0.0)], {}, None, "unencodable"),
        ([([1], [0.0], "stop", float("nan"))], {}, None, "unencodable"),
        ([([1], [0.0], "stop", float("inf"))], {}, None, "unencodable"),
        ([([1], [0.0], "stop", 10**400)], {}, None, "unencodable"),
        ([([1], [0.0], "stop", "1.0")], {}, None, "unencodable"),
        ([([1], [0.0], "stop")], {}, None, "unencodable"),
        ([([1], [0.0], "stop", 0.0)], {"oops": 1}, None, "unencodable"),
        ([([1], [0.0], "stop", 0.0)], {"error": 65536}, None, "unencodable"),
        ([([1], [0.0], "stop", 0.0)], {"error": -1}, None, "unencodable"),
        ([([1], [0.0], "stop", 0.0)], {"error": True}, None, "unencodable"),
        ([([1], [0.0], "stop", 0.0)], {}, DIGEST.upper(), "unencodable"),
        ([([1], [0.0], "stop", 0.0)], {}, DIGEST[:-1], "unencodable"),
        ([([1], [0.0], "stop", 0.0)], {}, DIGEST * 2, "unencodable"),
        ([([1], [0.0], "stop", 0.0)], {}, bytes.fromhex(DIGEST), "unencodable"),
        ([([1], [0.0], "stop", 0.0)] * 65536, {}, None, "unencodable"),
        (
            [(np.zeros(R.MAX_PAYLOAD_BYTES // 8, np.int32), np.zeros(R.MAX_PAYLOAD_BYTES // 8), "stop", 0.0)],
            {},
            None,
            "payload_too_large",
        ),
    ],
)
def test_encode_refuses_what_the_format_cannot_hold(comps: Any, failures: Any, digest: Any, reason: str) -> None:
    with pytest.raises(PayloadError) as info:
        R.encode(comps, failures=failures, weights_digest=digest)
    assert info.value.reason == reason and info.value.detail and isinstance(info.value, ValueError)


def test_encode_takes_empty_and_integer_inputs_and_decode_refuses_an_empty_completion() -> None:
    comps: list[Any] = [([], [], "stop", 1), ([3], [-1], "length", np.float32(0.25))]  # any real number is a reward
    data = R.encode(comps, failures={}, weights_digest=None)
    assert len(data) == R.payload_size(2, 1)
    assert _reason(data, 2) == "bad_counts"


# ---------------------------------------------------------------- hostile input, reason by reason

_N, _LEN = 3, 5
_AT_TOKENS = 64 + 16 * _N
_AT_LOGPROBS = _AT_TOKENS + 4 * _N * _LEN
VALID = _payload(_N, _LEN)


def _rec(i: int) -> int:
    return 64 + 16 * i


HOSTILE = {
    "short": (VALID[:63], "wrong_size"),
    "empty": (b"", "wrong_size"),
    "one byte short": (VALID[:-1], "wrong_size"),
    "one byte more": (VALID + b"\0", "wrong_size"),
    "total too big": (_patched(VALID, "<I", 8, _N * _LEN + 1), "wrong_size"),
    "magic": (b"AURX" + VALID[4:], "bad_magic"),
    "json": (b'{"completions": []}' + bytes(64), "bad_magic"),
    "format 2": (_patched(VALID, "B", 4, 2), "unknown_format"),
    "format 0": (_patched(VALID, "B", 4, 0), "unknown_format"),
    "flag bit 1": (_patched(VALID, "B", 5, 3), "bad_header"),
    "flag bit 7": (_patched(VALID, "B", 5, 0x81), "bad_header"),
    "reserved": (_patched(VALID, "B", 63, 1), "bad_header"),
    "first reserved byte": (_patched(VALID, "B", 36, 0x80), "bad_header"),
    "digest without flag": (_patched(VALID, "B", 5, 0), "bad_header"),
    "n": (_patched(VALID, "<H", 6, _N + 1), "wrong_group"),
    "zero-length completion": (_patched(_patched(VALID, "<I", _rec(0), 0), "<I", _rec(1), 2 * _LEN), "bad_counts"),
    "counts miss the total": (_patched(VALID, "<I", _rec(1), _LEN + 1), "bad_counts"),
    "counts wrap around": (_patched(VALID, "<I", _rec(1), 2**32 - 1), "bad_counts"),
    "a count beyond max_tokens misses the total": (_patched(VALID, "<I", _rec(1), MAX_TOKENS + 1), "bad_counts"),
    "finish code": (_patched(VALID, "B", _rec(2) + 4, 2), "bad_record"),
    "finish code 255": (_patched(VALID, "B", _rec(0) + 4, 255), "bad_record"),
    "pad byte": (_patched(VALID, "B", _rec(1) + 7, 1), "bad_record"),
    "reward nan": (_patched(VALID, "<d", _rec(0) + 8, float("nan")), "bad_record"),
    "reward -inf": (_patched(VALID, "<d", _rec(2) + 8, float("-inf")), "bad_record"),
    "token = vocab": (_patched(VALID, "<i", _AT_TOKENS + 4 * 7, VOCAB), "bad_token"),
    "token -1": (_patched(VALID, "<i", _AT_TOKENS, -1), "bad_token"),
    "token int32 min": (_patched(VALID, "<i", _AT_LOGPROBS - 4, -(2**31)), "bad_token"),
    "logprob > 0": (_patched(VALID, "<f", _AT_LOGPROBS + 8, 1e-3), "bad_logprob"),
    "logprob positive subnormal": (_patched(VALID, "<I", _AT_LOGPROBS, 1), "bad_logprob"),
    "logprob nan": (_patched(VALID, "<I", _AT_LOGPROBS + 4 * 14, 0x7FC00000), "bad_logprob"),
    "logprob negative nan": (_patched(VALID, "<I", _AT_LOGPROBS + 4, 0xFFC00001), "bad_logprob"),
    "logprob -inf": (_patched(VALID, "<f", _AT_LOGPROBS + 4, float("-inf")), "bad_logprob"),
    "logprob +inf": (_patched(VALID, "<f", _AT_LOGPROBS + 4, float("inf")), "bad_logprob"),
    "failures > n": (_patched(VALID, "<H", 12 + 2 * 3, _N + 1), "bad_failures"),
    "failures 65535": (_patched(VALID, "<H", 12, 0xFFFF), "bad_failures"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_payloads_are_refused_with_their_reason(case: str) -> None:
    data, reason = HOSTILE[case]
    assert reason in R.REASONS
    assert _reason(data) == reason
    assert _reason(bytearray(data)) == reason and _reason(memoryview(data)) == reason


def test_the_valid_base_of_the_hostile_cases_decodes() -> None:
    r = _decode(VALID)
    assert r.n_tokens == _N * _LEN and r.weights_digest == DIGEST and r.failures == {"timeout": 1}
    assert _decode(_patched(VALID, "<f", _AT_LOGPROBS + 8, -0.0)).logprobs[2] == 0.0  # -0.0 is <= 0
    assert _decode(_patched(VALID, "<i", _AT_TOKENS, VOCAB - 1)).tokens[0] == VOCAB - 1


def test_group_max_tokens_and_vocab_are_the_callers() -> None:
    assert _reason(VALID, group=2) == "wrong_group"
    assert _reason(VALID, max_tokens=_LEN - 1) == "too_long"
    assert _decode(VALID, max_tokens=_LEN).n_tokens == _N * _LEN
    assert _reason(VALID, vocab=_LEN + _N - 2) == "bad_token"  # the largest id is _LEN + _N - 2
    assert _decode(VALID, vocab=_LEN + _N - 1).tokens.max() == _LEN + _N - 2
    for bad in ({"group": 0}, {"vocab": 0}, {"vocab": 2**31 + 1}, {"max_tokens": 0}):
        with pytest.raises(ValueError, match="out of range") as info:
            R.decode(VALID, **{"group": 3, "vocab": VOCAB, "max_tokens": MAX_TOKENS, **bad})
        assert not isinstance(info.value, PayloadError)


def test_size_caps_come_before_reading() -> None:
    big = bytearray(R.MAX_PAYLOAD_BYTES + 1)
    big[: len(VALID)] = VALID
    assert _reason(bytes(big)) == "payload_too_large"
    assert _reason(big) == "payload_too_large" and _reason(memoryview(big)) == "payload_too_large"


@pytest.mark.parametrize("thing", ["AURR", None, 12, [1, 2], 3.5, {"completions": []}])
def test_things_that_are_not_buffers_are_bad_payloads(thing: Any) -> None:
    assert _reason(thing) == "bad_payload"


# ---------------------------------------------------------------- aliasing


def test_bytes_are_viewed_in_place_and_every_array_is_read_only() -> None:
    data = _payload()
    r = _decode(data)
    assert r.tokens.base is data and r.logprobs.base is data  # zero-copy
    for a in (r.tokens, r.logprobs, r.offsets, r.finish, r.rewards):
        assert not a.flags.writeable
    assert _decode(memoryview(data)[:]).tokens.tolist() == r.tokens.tolist()


@pytest.mark.parametrize("wrap", ["bytearray", "memoryview of bytearray", "numpy", "readonly view of bytearray"])
def test_a_buffer_that_can_change_is_copied(wrap: str) -> None:
    raw = bytearray(_payload())
    data: Any = {
        "bytearray": raw,
        "memoryview of bytearray": memoryview(raw),
        "numpy": np.frombuffer(raw, dtype=np.uint8),
        "readonly view of bytearray": memoryview(raw).toreadonly(),
    }[wrap]
    r = _decode(data)
    before = (r.tokens.tolist(), r.logprobs.tolist(), r.rewards.tolist(), r.finish.tolist())
    raw[_AT_TOKENS : _AT_LOGPROBS + 4 * _N * _LEN] = b"\xff" * (_AT_LOGPROBS + 4 * _N * _LEN - _AT_TOKENS)
    raw[_rec(0) : _rec(_N)] = b"\xee" * 16 * _N
    assert (r.tokens.tolist(), r.logprobs.tolist(), r.rewards.tolist(), r.finish.tolist()) == before


def test_a_strided_view_of_bytes_is_copied_not_misread() -> None:
    doubled = bytes(b for byte in VALID for b in (byte, 0))
    view = memoryview(doubled)[::2]
    assert not view.c_contiguous and view.tobytes() == VALID
    assert _decode(view).tokens.tolist() == _decode(VALID).tokens.tolist()


# ---------------------------------------------------------------- fuzz: PayloadError and nothing else


def _decodes_or_refuses(data: Any, group: int = 3) -> None:
    try:
        r = _decode(data, group)
    except PayloadError as exc:
        assert exc.reason in R.REASONS
        return
    assert len(r) == group and r.offsets[-1] == len(r.tokens) == len(r.logprobs)
    assert np.all(np.diff(r.offsets) >= 1) and np.all(np.diff(r.offsets) <= MAX_TOKENS)
    assert r.tokens.min() >= 0 and r.tokens.max() < VOCAB and r.logprobs.max() <= 0
    assert np.isfinite(r.logprobs).all() and np.isfinite(r.rewards).all()


@given(st.binary(max_size=600))
@settings(max_examples=300, deadline=None)
def test_fuzz_random_bytes(data: bytes) -> None:
    _decodes_or_refuses(data)
    _decodes_or_refuses(R.MAGIC + bytes([1]) + data)


@given(
    st.integers(0, 3),
    st.integers(0, 3),
    st.integers(0, 4) | st.integers(0, 0xFFFF),
    st.integers(0, 2**32 - 1) | st.integers(0, 64),
    st.binary(max_size=40),
    st.binary(max_size=800),
)
@settings(max_examples=300, deadline=None)
def test_fuzz_plausible_headers(fmt: int, flags: int, n: int, total: int, head: bytes, body: bytes) -> None:
    header = struct.pack("<4sBBHI", R.MAGIC, fmt, flags, n, total) + head.ljust(52, b"\0")[:52]
    _decodes_or_refuses(header + body, group=max(1, n))


@given(st.data())
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_mutations_of_a_valid_payload(data: st.DataObject) -> None:
    buf = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["byte", "word", "cut", "grow"]))
        at = data.draw(st.integers(0, len(buf)))
        if op == "byte" and at < len(buf):
            buf[at] = data.draw(st.integers(0, 255))
        elif op == "word" and at + 4 <= len(buf):
            buf[at : at + 4] = data.draw(st.binary(min_size=4, max_size=4))
        elif op == "cut":
            del buf[at : at + data.draw(st.integers(1, 16))]
        else:
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    _decodes_or_refuses(bytes(buf))
    _decodes_or_refuses(buf)


def test_fuzz_many_seeded_mutations() -> None:
    rng = np.random.default_rng(20261)
    base = np.frombuffer(VALID, dtype=np.uint8)
    outcomes: dict[str, int] = {}
    for _ in range(4000):
        buf = base.copy()
        at = rng.integers(0, buf.size, size=rng.integers(1, 4))
        buf[at] = rng.integers(0, 256, size=at.size)
        try:
            _decode(buf.tobytes())
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except PayloadError as exc:
            outcomes[exc.reason] = outcomes.get(exc.reason, 0) + 1
    # most single-byte damage lands in token ids and logprobs; some of it is still a valid payload
    assert {"ok", "bad_magic", "bad_header", "bad_token", "bad_logprob", "bad_record"} <= set(outcomes)
    assert set(outcomes) <= {"ok", *R.REASONS}


# ---------------------------------------------------------------- keys


def test_result_keys() -> None:
    sha = hashlib.sha256(b"x").hexdigest()
    assert result_key(sha) == f"{RESULTS_DIR}/{sha}.bin" == check_result_key(f"results/{sha}.bin")
    for bad in (
        f"results/{sha.upper()}.bin",
        f"results/{sha[:-1]}.bin",
        f"results/{sha}0.bin",
        f"results/{sha}.bin\n",
        f"results/{sha}.json",
        f"/results/{sha}.bin",
        f"results/../{sha}.bin",
        f"versions/{sha}.bin",
        f"x/results/{sha}.bin",
        "",
        None,
    ):
        with pytest.raises(CorruptError):
            check_result_key(bad)  # type: ignore[arg-type]
    with pytest.raises(CorruptError):
        result_key("../" + sha[3:])


# ---------------------------------------------------------------- bucket objects


def test_put_and_get_on_every_backend(root: Root) -> None:
    store = ObjectStore(root.uri, root.storage_options)
    data = _payload(8, 40)
    key, sha = put_payload(store, data)
    assert (key, sha) == (result_key(hashlib.sha256(data).hexdigest()), hashlib.sha256(data).hexdigest())
    assert store.list_keys(RESULTS_DIR) == [key] and store.size(key) == len(data)
    assert put_payload(store, data) == (key, sha)  # a retry is the same object
    got = get_payload(store, key, sha, len(data))
    assert got == data and _decode(got, 8).n_tokens == 320
    empty_key, empty_sha = put_payload(store, b"")
    assert get_payload(store, empty_key, empty_sha, 0) == b""


def test_tampered_objects_are_corrupt(root: Root) -> None:
    store = ObjectStore(root.uri, root.storage_options)
    data = _payload()
    key, sha = put_payload(store, data)
    url = store.url(key)
    for bad in (data[:-1] + b"\x01", data[:-1], data + b"\0", data + b"\0" * 100):
        store.fs.pipe_file(store.path(key), bad)  # someone rewrote an immutable object
        with pytest.raises(CorruptError) as info:
            get_payload(store, key, sha, len(data))
        assert type(info.value) is CorruptError and info.value.url == url and url in str(info.value)
        # a retried put finds other bytes there (put_immutable reads at most one byte more than its own)
        with pytest.raises(LimitError if len(bad) > len(data) + 1 else ConflictError):
            put_payload(store, data)


def test_what_a_result_names_is_checked_before_reading(mem_uri: str) -> None:
    store = ObjectStore(mem_uri)
    data = _payload()
    key, sha = put_payload(store, data)
    other_key, other_sha = put_payload(store, b"other")
    cases: list[tuple[Any, Any, Any, type[StoreError]]] = [
        (other_key, sha, len(data), CorruptError),  # the key of another hash
        (key, other_sha, len(data), CorruptError),
        (key, sha.upper(), len(data), CorruptError),
        (f"results/{sha}", sha, len(data), CorruptError),
        ("versions/0000000000/manifest.json", sha, len(data), CorruptError),
        (f"../results/{sha}.bin", sha, len(data), CorruptError),
        (None, sha, len(data), CorruptError),
        (key, None, len(data), CorruptError),
        (key, sha, -1, CorruptError),
        (key, sha, "96", CorruptError),
        (key, sha, True, CorruptError),
        (key, sha, len(data) - 1, CorruptError),  # longer than the result says
        (key, sha, len(data) + 1, CorruptError),  # shorter
        (key, sha, R.MAX_PAYLOAD_BYTES + 1, LimitError),
    ]
    for k, s, n, exc in cases:
        with pytest.raises(exc) as info:
            get_payload(store, k, s, n)
        assert type(info.value) is exc and info.value.url is not None and mem_uri in info.value.url
    with pytest.raises(LimitError):
        get_payload(store, key, sha, len(data), max_bytes=len(data) - 1)
    assert get_payload(store, key, sha, len(data), max_bytes=len(data)) == data
    missing = hashlib.sha256(b"never written").hexdigest()
    with pytest.raises(MissingError) as missed:
        get_payload(store, result_key(missing), missing, 10)
    assert missed.value.url == store.url(result_key(missing))
    with pytest.raises(LimitError):
        put_payload(store, bytes(R.MAX_PAYLOAD_BYTES + 1))
    assert store.list_keys(RESULTS_DIR) == sorted([key, other_key])


def test_results_are_not_versions_to_readers_audit_gc_or_relays(tmp_path: Path) -> None:
    """Objects under results/ in a run prefix change nothing a reader, an audit, gc or a relay does."""
    import torch

    import aurora_store
    from aurora_store.bucket import gc
    from aurora_store.bucket.audit import audit
    from relay.worker import Relay

    home, eu = (tmp_path / "home").as_uri(), (tmp_path / "eu").as_uri()
    run = aurora_store.open_run(home, full_every=2)
    w = torch.zeros(64, dtype=torch.bfloat16)
    for i in range(4):
        w[i] = 1.0
        run.publish({"w": w})
    key, _sha = put_payload(run.store, _payload())
    assert run.versions() == [0, 1, 2, 3] and audit(run).ok
    p = gc.plan(run, gc.RetentionPolicy(keep_last=1, keep_fulls=1, holds={}))
    assert p.retire == [1] and all(key not in keys for keys in (*p.objects.values(), *p.leftovers.values()))
    gc.apply(run, p)
    assert run.store.exists(key) and audit(aurora_store.open_run(home)).ok
    relay = Relay(ObjectStore(home), ObjectStore(eu), None, source_region="home", dest_region="eu")
    assert relay.backfill() == [0, 2, 3]  # 1 was retired
    assert ObjectStore(eu).list_keys(RESULTS_DIR) == []
