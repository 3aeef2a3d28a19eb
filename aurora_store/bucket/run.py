"""A run: the public face of the store (read, materialize, publish, attachments, state).

``materialize`` rebuilds any version bit-exact from the nearest full version plus deltas,
verifying every byte on the way. ``publish`` hands a state dict to the run's
:class:`~aurora_store.bucket.publisher.Publisher`, which diffs it against the last published bits
(the one copy of the model it keeps), uploads immutable segments, and commits by writing the
manifest last with put-if-absent. A sharded trainer publishes through the same publisher, in its
ranks' group (:meth:`Publisher.on`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aurora_store.bucket.announce import Announcements, Announcer
from aurora_store.bucket.attachments import Attachments
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.parts import Share
from aurora_store.bucket.plan import Kind, VersionInfo
from aurora_store.bucket.publisher import Publisher
from aurora_store.bucket.reader import Reader
from aurora_store.bucket.run_config import RunConfig
from aurora_store.bucket.signer import Signer
from aurora_store.bucket.state import StateStore
from aurora_store.errors import MissingError, StoreError
from aurora_store.format import signing
from aurora_store.format.manifest import Manifest, TensorSpec
from aurora_store.format.weights import WeightState

if TYPE_CHECKING:
    import torch

    from aurora_store.bucket.plan import Latest

log = logging.getLogger("aurora.store")


class Run:
    """One run's versions under a store URI."""

    def __init__(
        self,
        uri: str,
        *,
        storage_options: dict[str, Any] | None = None,
        signing_key: Any = None,
        verify_key: Any = None,
        config: RunConfig | None = None,
    ) -> None:
        self.config = config or RunConfig()
        if self.config.full_every < 1:
            raise StoreError(f"full_every must be >= 1, got {self.config.full_every}")
        self.store = ObjectStore(uri, storage_options, concurrency=self.config.concurrency)
        key = signing.load_signing_key(signing_key) if signing_key is not None else None
        vk = signing.load_verify_key(verify_key) if verify_key is not None else None
        if vk is None and key is not None:  # a publisher reads its own signed run with its own key
            self.reader = Reader(self.store, self.config.limits, key.public_key(), insist=False)
        else:
            self.reader = Reader(self.store, self.config.limits, vk)
        self.signing = Signer(key, self.reader, self.store.uri)
        """The key this run's versions (and the trainer's states) are signed with, and a pending rotation:
        one for the run, shared by its publishers, so a rotation moves every signer of the run."""
        self.files = Attachments(self.store)
        """The run's attached files (config.json, tokenizer files)."""
        self.state = StateStore(self.store)
        """The trainer's saved states."""
        self._announcements = Announcements(self.store.uri)
        self.publisher = Publisher(
            self.store,
            self.reader,
            self.config,
            files=self.files,
            announcements=self._announcements,
            signer=self.signing,
        )
        """Commits this process's versions (:meth:`publish`); ``publisher.on(collective)`` publishes with
        other ranks."""

    @property
    def announcer(self) -> Announcer | None:
        """Told of each uploaded segment and each commit (cut-through relays listen to it)."""
        return self._announcements.to

    @announcer.setter
    def announcer(self, announcer: Announcer | None) -> None:
        self._announcements.to = announcer

    @property
    def uri(self) -> str:
        return self.store.uri

    # ------------------------------------------------------------ reading

    def versions(self) -> list[int]:
        """Committed versions, ascending."""
        return self.reader.versions()

    def latest(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def manifest(self, version: int) -> Manifest:
        return self.reader.manifest(version)

    def materialize_words(self, version: int | None = None) -> WeightState:
        """The verified bit patterns of ``version`` (latest when None), as word arrays."""
        if version is None:
            version = self.latest()
            if version is None:
                raise MissingError(f"{self.uri} has no committed versions")
        return self.reader.materialize(version)

    def materialize(self, version: int | None = None) -> dict[str, torch.Tensor]:
        """``version`` (latest when None) as a state dict, bit-exact and verified."""
        from aurora_store.tensors import from_words  # torch loads only for callers that want tensors

        state = self.materialize_words(version)
        return {s.name: from_words(s, state.words[s.name]) for s in state.specs}

    @property
    def signer(self) -> str | None:
        """The key id this run's versions are signed with now (None: they are not signed)."""
        return self.signing.key_id

    @property
    def signing_key(self) -> Any:
        """The Ed25519 private key this run's versions are signed with now (after a rotation commits, the
        new one); None: they are not signed."""
        return self.signing.key

    def resume(self) -> Latest | None:
        """Hold the last committed version's bits as this process's baseline now (what a restarted
        trainer does before its first step), so the next publish diffs against it at once."""
        return self.publisher.resume()

    # ------------------------------------------------------------ publishing

    def publish(
        self,
        state_dict: Mapping[str, torch.Tensor],
        *,
        kind: Kind = "auto",
        step: int | None = None,
        meta: Mapping[str, str] | None = None,
        version: int | None = None,
        rotate_to: Any = None,
    ) -> VersionInfo:
        """Commit ``state_dict`` as the next version; full or delta as the policy decides.

        Raises ConflictError if another publisher committed a version since this one last
        published (the next call reloads and continues on top of it), or if ``version`` is
        given and is not the next version. ``rotate_to`` (a new Ed25519 private key) publishes it
        as a key rotation, signed by the run's key and the new one; the run then signs with the new
        key (docs/SECURITY.md, "Key rotation")."""
        from aurora_store.tensors import host_words, word_views  # torch loads only for callers with tensors

        specs, views = word_views(state_dict)
        if self.config.extract_on_device(v.device.type for v in views.values()):
            words: dict[str, Any] = dict(views)
        else:
            words = {k: host_words(v) for k, v in views.items()}
        return self.publish_words(specs, words, kind=kind, step=step, meta=meta, version=version, rotate_to=rotate_to)

    def publish_words(
        self,
        specs: tuple[TensorSpec, ...],
        words: Mapping[str, Any],
        *,
        kind: Kind = "auto",
        step: int | None = None,
        meta: Mapping[str, str] | None = None,
        version: int | None = None,
        rotate_to: Any = None,
    ) -> VersionInfo:
        """:meth:`publish` for callers that already hold bit patterns (flat little-endian word
        arrays, as :func:`aurora_store.tensors.to_words` makes them, or flat word tensors on a
        device, whose deltas are then extracted there): benchmarks and tools that build words themselves."""
        return self.publisher.publish(
            Share.whole(specs, words), kind=kind, step=step, meta=meta, version=version, rotate_to=rotate_to
        )

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_run(
    uri: str,
    *,
    storage_options: dict[str, Any] | None = None,
    signing_key: Any = None,
    verify_key: Any = None,
    **config: Any,
) -> Run:
    """Open (or start) the run stored under ``uri``, any fsspec URI; ``config`` fields are
    :class:`RunConfig`'s (``full_every``, ``segment_bytes``, ``shard_bytes``, ``concurrency``, ``limits``)."""
    return Run(
        uri, storage_options=storage_options, signing_key=signing_key, verify_key=verify_key, config=RunConfig(**config)
    )
