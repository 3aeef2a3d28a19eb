"""Catch-up: which versions a reader holding one version fetches to reach another.

Two ways lead from a held version h to a target t: the chain of every version after h (a full
version in it stands in place of its delta: the format stores none for it), or the latest full
version after h and the deltas after that. :func:`route` takes the one with fewer bytes (or the
full one when the chain changes the tensor layout before it). When a version between is gone
(``aurora gc`` retired it while the reader was away, e.g. an actor paused past its registration's
lifetime, which gc no longer counts as holding anything), only the second way is left: the latest
full version at or before t and the deltas after it, read as :meth:`Reader.chain` reads them
(parent links checked). A reader therefore never needs a retired version to catch up.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aurora_store.errors import MissingError

if TYPE_CHECKING:
    from aurora_store.bucket.reader import Reader
    from aurora_store.format.manifest import Manifest, TensorSpec

log = logging.getLogger("aurora.store")


def route(
    reader: Reader, held: int, target: int, specs: tuple[TensorSpec, ...], *, cheapest: bool = True
) -> list[Manifest]:
    """The manifests to apply, in order, to move weights at version ``held`` (tensor table
    ``specs``) to version ``target``; empty when ``target <= held``. ``cheapest``: choose between
    the whole chain and the latest full plus the deltas after it by bytes; otherwise the whole
    chain, unless part of it is gone."""
    if target <= held:
        return []
    try:
        path = [reader.manifest(v) for v in range(held + 1, target + 1)]
    except MissingError as exc:
        return _from_latest_full(reader, held, target, exc)
    if not cheapest:
        return path
    fulls = [i for i, m in enumerate(path) if m.kind == "full"]
    if fulls:
        via_full = path[fulls[-1] :]
        if sum(m.stats.bytes for m in via_full) <= sum(m.stats.bytes for m in path) or any(
            m.tensors != specs for m in path[: fulls[-1] + 1]
        ):
            return via_full
    return path


def _from_latest_full(reader: Reader, held: int, target: int, missing: MissingError) -> list[Manifest]:
    """The chain of ``target`` from its nearest full version, which must come after ``held``."""
    chain = reader.chain(target)  # ChainError when a version of it is gone too: nothing can reach target
    if chain[0].version <= held:  # every version from there to target is committed: not what was missing
        raise missing
    log.info(
        "%s: a version after %d is gone (%s); catching up from full version %d",
        reader.store.uri,
        held,
        missing.url or missing,
        chain[0].version,
    )
    return chain
