"""Where every object of a run lives: the one place key names are made and checked.

A run is a prefix in a bucket. Under it (see docs/FORMAT.md, "Layout"):

- ``versions/NNNNNNNNNN/manifest.json``: a version's manifest; its existence is the commit;
- ``versions/NNNNNNNNNN/key-rotation``: an empty marker, written before the manifest of a version
  that rotates the run's signing key, so readers find the rotations in the listing they make anyway;
- ``versions/NNNNNNNNNN/OOOOO-<sha256[:32]>.seg``: a delta segment, content-addressed;
- ``versions/NNNNNNNNNN/OOOOO-<sha256[:32]>.safetensors``: a full version's shard;
- ``versions/NNNNNNNNNN/model.safetensors.index-<sha256[:32]>.json``: its HF-style index;
- ``files/<name>``: a run-level attachment (config.json, tokenizer files);
- ``trainer/state-NNNNNNNNNN-<version_hash[:16]>/...``: the trainer's resumable state of version N,
  named by that version's hash (written before the version's commit, so a state of a version that
  never committed can never stand for another one), ``state.json`` last; earlier code wrote
  ``trainer/state-NNNNNNNNNN/``;
- ``results/<sha256>.bin``: a rollout result's payload too large for Redis, content-addressed
  (never part of a version).

Names starting with ``.tmp-`` are in-flight temporary files of a local store: never objects.
Pure string rules, no I/O.
"""

from __future__ import annotations

import re

from aurora_store.errors import CorruptError

MAX_VERSION = 10**10 - 1
"""Versions are ten-digit directory names."""
VERSIONS_DIR = "versions"
MANIFEST = "manifest.json"
ROTATION_MARKER = "key-rotation"
"""An empty object beside a key rotation's manifest: a hint readers verify, never trust."""
FILES_DIR = "files"
STATE_DIR = "trainer"
STATE_COMMIT = "state.json"
"""The trainer state's commit marker, written last."""
RESULTS_DIR = "results"
"""Offloaded rollout-result payloads (see :mod:`aurora_store.format.results`)."""
INDEX_NAME = "model.safetensors.index.json"
RETENTION_DIR = "retention"
"""Retention records (:mod:`aurora_store.format.retention`)."""
RUN_DIRS = frozenset({VERSIONS_DIR, FILES_DIR, STATE_DIR, RESULTS_DIR, RETENTION_DIR})
"""What a run keeps directly under its root: a prefix holding none of these holds no run."""
TMP_PREFIX = ".tmp-"
"""Prefix of a local store's temporary files; no object is ever named with it."""

_KEY_RE = re.compile(r"[A-Za-z0-9._\-]+(/[A-Za-z0-9._\-]+)*")
_FILE_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,254}")
_VERSION_DIR = re.compile(r"[0-9]{10}")
_RESULT_KEY = re.compile(r"results/[0-9a-f]{64}\.bin")
_TAG = re.compile(r"[0-9a-f]{16}")
_STATE_NAME = re.compile(r"state-([0-9]{10})(?:-([0-9a-f]{16}))?")
_OBJECT_NAME = re.compile(r"[0-9]{5,}-[0-9a-f]{32}\.(seg|safetensors)|model\.safetensors\.index-[0-9a-f]{32}\.json")


def version_dir(version: int) -> str:
    return f"{VERSIONS_DIR}/{version:010d}"


def manifest_key(version: int) -> str:
    return f"{version_dir(version)}/{MANIFEST}"


def rotation_marker_key(version: int) -> str:
    return f"{version_dir(version)}/{ROTATION_MARKER}"


def object_key(version: int, ordinal: int, sha256: str, suffix: str) -> str:
    """A segment's or shard's content-addressed key: a retried publish with other bytes never
    collides with a crashed one."""
    return f"{version_dir(version)}/{ordinal:05d}-{sha256[:32]}.{suffix}"


def index_key(version: int, sha256: str) -> str:
    return f"{version_dir(version)}/{INDEX_NAME.removesuffix('.json')}-{sha256[:32]}.json"


def file_key(name: str) -> str:
    return f"{FILES_DIR}/{name}"


def state_dir(version: int, tag: str | None = None) -> str:
    """The directory of the trainer state of ``version`` whose hash starts with ``tag`` (16 hex);
    without ``tag``, the name earlier code used."""
    if tag is None:
        return f"{STATE_DIR}/state-{version:010d}"
    if not _TAG.fullmatch(tag):
        raise CorruptError(f"trainer state tag {tag!r:.40} is not 16 lowercase hex digits")
    return f"{STATE_DIR}/state-{version:010d}-{tag}"


def parse_state_dir(name: str) -> tuple[int, str | None] | None:
    """``(version, tag)`` of a trainer state directory's name (``state-NNNNNNNNNN[-TAG]``), None for
    any other name."""
    m = _STATE_NAME.fullmatch(name)
    return None if m is None else (int(m.group(1)), m.group(2))


def result_key(sha256: str) -> str:
    """The key of an offloaded payload whose SHA-256 (hex) is ``sha256``."""
    return check_result_key(f"{RESULTS_DIR}/{sha256}.bin")


def check_result_key(key: str) -> str:
    """A key a result names as its offloaded payload: exactly ``results/<64 lowercase hex>.bin``."""
    if not isinstance(key, str) or not _RESULT_KEY.fullmatch(key):
        raise CorruptError(f"result key {key!r:.120} is not results/<sha256 as 64 lowercase hex>.bin")
    return key


def committed_version(key: str) -> int | None:
    """The version whose manifest ``key`` is, or None for any other key."""
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == VERSIONS_DIR and parts[2] == MANIFEST and _VERSION_DIR.fullmatch(parts[1]):
        return int(parts[1])
    return None


def object_version(key: str) -> int | None:
    """The version whose directory holds ``key`` (``versions/NNNNNNNNNN/...``), None for any key outside one."""
    parts = key.split("/", 2)
    if len(parts) == 3 and parts[0] == VERSIONS_DIR and _VERSION_DIR.fullmatch(parts[1]):
        return int(parts[1])
    return None


def rotation_marker_version(key: str) -> int | None:
    """The version whose key-rotation marker ``key`` is, or None for any other key."""
    parts = key.split("/")
    if (
        len(parts) == 3
        and parts[0] == VERSIONS_DIR
        and parts[2] == ROTATION_MARKER
        and _VERSION_DIR.fullmatch(parts[1])
    ):
        return int(parts[1])
    return None


def committed_state(key: str) -> tuple[int, str | None] | None:
    """``(version, tag)`` of the trainer state whose commit marker ``key`` is, or None for any other key."""
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == STATE_DIR and parts[2] == STATE_COMMIT:
        return parse_state_dir(parts[1])
    return None


def is_file_name(name: object) -> bool:
    """Whether ``name`` is a plain file name of ``[A-Za-z0-9._-]``, not starting with '.'."""
    return isinstance(name, str) and _FILE_NAME.fullmatch(name) is not None


def check_file_name(name: str, what: str) -> str:
    """An attachment name: a plain file name such as ``tokenizer_config.json``."""
    if not is_file_name(name):
        raise CorruptError(
            f"{what}: attachment name {name!r} must be a plain file name of [A-Za-z0-9._-] (not starting with '.')"[
                :300
            ]
        )
    return name


def check_key(key: str, version: int, what: str) -> str:
    """A key named by a manifest must be a plain relative path inside its version's directory."""
    prefix = version_dir(version) + "/"
    if (
        not isinstance(key, str)
        or len(key) > 512
        or not _KEY_RE.fullmatch(key)
        or any(part in (".", "..") for part in key.split("/"))
        or not key.startswith(prefix)
    ):
        raise CorruptError(f"{what}: key {key!r} escapes the run prefix (must be a plain path under {prefix!r})")
    return key


def check_object_key(key: str, version: int, what: str) -> str:
    """A key a manifest (or an announcement) names as one of a version's objects: a segment, a
    shard or an index of that version, never its manifest (written only as the commit) or any
    other name."""
    check_key(key, version, what)
    name = key[len(version_dir(version)) + 1 :]
    if not _OBJECT_NAME.fullmatch(name):
        raise CorruptError(
            f"{what}: key {key!r} is not a segment, shard or index name "
            "(NNNNN-<sha256[:32]>.seg|.safetensors, model.safetensors.index-<sha256[:32]>.json)"[:300]
        )
    return key


LORA_BASE_FILE = re.compile(r"^lora-base-[0-9]{5}-of-[0-9]{5}\.safetensors$")
"""The name of one of a LoRA run's attachments that hold its frozen base (``lora-base-00001-of-00002.safetensors``)."""


def lora_base_file(i: int, n: int) -> str:
    """The name of the ``i``-th (from 0) of ``n`` attachments that hold a LoRA run's base."""
    return f"lora-base-{i + 1:05d}-of-{n:05d}.safetensors"
