"""Reading result payloads as the trainer admits them: fetched, decoded and checked off the training thread.

A result's payload is inline in its Redis entry or an immutable object in the submitting actor's
region bucket (:mod:`aurora_store.coord.results`). :class:`Payloads` fetches the referenced ones
in parallel (each checked against its size and SHA-256), then decodes and checks every payload
with :func:`aurora_store.format.results.decode`: vectorised, no per-token Python loop. It also
checks what only the trainer knows: the weights digest the actor says it generated on against
the published one, and what only the trainer may decide: whether the group was scored at all. A
reward whose process crashed is no reward, so a result with more than
:data:`MAX_CRASHED_FRACTION` of its completions' rewards ``crashed`` is dropped
(``rewards_crashed``) and its prompt leased again (docs/RL.md, "Reward"). A payload that fails is a
drop reason, never an exception. With an identity gate (:mod:`trainer.identity`), a result not
signed by a certified actor is refused before its payload is fetched; so is any result the caller
already refused (the dispatcher checks job, lease and token first), and a referenced payload larger
than a job can return (:attr:`Payloads.max_bytes`) is never read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.results import get_payload
from aurora_store.coord.results import Result
from aurora_store.errors import PayloadError, StoreError
from aurora_store.format import results as payloads
from aurora_store.rl.sampling import SamplingConfig

MAX_CRASHED_FRACTION = 0.5
"""The largest fraction of a group whose rewards may have crashed for the result to be admitted.
An actor retries a crashed call once in a fresh process, so a ``crashed`` it reports is a
completion that killed two processes (its 0 stands, like a timeout's); beyond half the group, the
reward environment, not the completions, is what is broken, and the group's advantages would be
measured against scores that were never made."""

Decoded = tuple[payloads.Rollouts | None, str | None]
"""A payload's rollouts, or why it is refused."""


class Payloads:
    """Fetch, decode and check the payloads of results read from Redis."""

    def __init__(
        self,
        *,
        sampling: SamplingConfig,
        vocab_size: int,
        stores: Mapping[str, ObjectStore],
        digests: Callable[[int], str | None],
        fetchers: int = 16,
        gate: Callable[[Result], str | None] | None = None,
    ) -> None:
        self.sampling, self.vocab_size = sampling, vocab_size
        self.stores = dict(stores)
        """Region -> the bucket its actors write large payloads to."""
        self.digests = digests
        """Version -> the weights digest published with it (None if unknown)."""
        self.gate = gate
        """Why a result is not from a certified actor, or None (``ResultGate.check``); None: no gate."""
        self.max_bytes = min(
            payloads.MAX_PAYLOAD_BYTES, payloads.payload_size(sampling.group, sampling.group * sampling.max_new_tokens)
        )
        """The largest payload one job can return (``group`` completions of ``max_new_tokens``): a
        reference to a larger object is refused unread (``payload_too_large``)."""
        self._pool = ThreadPoolExecutor(max_workers=fetchers, thread_name_prefix="aurora-payload")
        self._lock = threading.Lock()
        self.cpu_s = 0.0
        """Thread CPU seconds spent decoding and checking payloads (fetches excluded)."""
        self.tokens = 0
        """Completion tokens decoded and checked."""
        self.fetched_bytes = 0

    def decode_all(self, results: Sequence[Result], refused: Sequence[str | None] | None = None) -> list[Decoded]:
        """Each result's rollouts or drop reason, in order; referenced payloads fetched in parallel.
        ``refused``: the caller's drop reason for each result (None: go on), given before any fetch."""
        blobs: list[bytes | str | None] = [r.inline for r in results]
        for i, r in enumerate(results):  # before any fetch: a forged reference costs no GET
            why = refused[i] if refused is not None else None
            if why is None and r.malformed is None and r.ref is not None and r.ref.size > self.max_bytes:
                why = "payload_too_large"
            if why is None and self.gate is not None and r.malformed is None:
                why = self.gate(r)
            if why is not None:
                blobs[i] = why
        wanted = [i for i, r in enumerate(results) if r.malformed is None and r.ref is not None and blobs[i] is None]
        for i, got in zip(wanted, self._pool.map(lambda i: self._fetch(results[i]), wanted), strict=True):
            blobs[i] = got
        t0 = time.thread_time()
        out: list[Decoded] = []
        tokens = 0
        for res, blob in zip(results, blobs, strict=True):
            if res.malformed is not None:
                out.append((None, res.malformed))
            elif isinstance(blob, str):
                out.append((None, blob))
            elif blob is None:
                out.append((None, "bad_payload"))
            else:
                decoded = self._decode(res, blob)
                tokens += decoded[0].n_tokens if decoded[0] is not None else 0
                out.append(decoded)
        with self._lock:
            self.cpu_s += time.thread_time() - t0
            self.tokens += tokens
        return out

    def _fetch(self, res: Result) -> bytes | str:
        ref = res.ref
        assert ref is not None
        store = self.stores.get(ref.region)
        if store is None:
            return "unknown_region"
        try:
            data = get_payload(store, ref.key, ref.sha256, ref.size, max_bytes=self.max_bytes)
        except StoreError:
            return "payload_unavailable"
        with self._lock:
            self.fetched_bytes += len(data)
        return data

    def _decode(self, res: Result, blob: bytes) -> Decoded:
        s = self.sampling
        try:
            got = payloads.decode(blob, group=s.group, vocab=self.vocab_size, max_tokens=s.max_new_tokens)
        except PayloadError as exc:
            return None, "bad_payload" if exc.reason != "unknown_format" else "unknown_format"
        if got.weights_digest is not None and got.weights_digest != self.digests(res.version):
            return None, "wrong_digest"
        if got.failures.get("crashed", 0) > MAX_CRASHED_FRACTION * len(got):
            return None, "rewards_crashed"
        return got, None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
