"""A LoRA run on vLLM (``enable_lora``): the base loaded once, frozen; each version an adapter with an id of its own.

vLLM serves LoRA adapters from PEFT directories, each under an integer id that a request names
(``LoRARequest``). A version of a LoRA run is an adapter, so the actor loads each version it stages as
a new adapter, while the engine keeps generating with the one it serves:

- **Staging loads.** When the updater prepares a version (the adapter's words after it: the held
  adapter with the staged changes, or a staged full version's), :class:`Adapters` writes them as a PEFT
  directory and has vLLM load it under a new id. Everything that can fail (the write, vLLM's checks of
  rank and target modules, its load) fails here, off the safe point: the version is not staged, the
  adapter being served keeps serving, and the follower tries again.
- **The safe point switches.** :meth:`AdapterWeights.commit` writes the host copy (what the updater
  decodes the next delta against and what ``--verify-live`` digests) and points new requests at the new
  id; it cannot fail. A batch names its adapter once, when it starts (:meth:`Adapters.request`), so it
  runs on one whole version.
- **Unloading waits for requests.** An adapter that is no longer served is removed from vLLM, and its
  directory deleted, only once no request naming it is running: vLLM may read an adapter's directory
  again whenever a request names it (its adapter cache is LRU), so the directory lives as long as the id.

The base's own weights never change, so no weight transfer is set up. Prefix caching needs no reset
between versions: vLLM keys cached blocks by the adapter id as well as the tokens.

Verified on vLLM 0.32's CPU build (its ``PunicaWrapperCPU``; ``tests/test_vllm_lora.py``): every
version's greedy tokens and log-probabilities equal a fresh engine's that loads that version's
``aurora replay`` adapter directory; batches racing swaps each run on one whole version; an adapter of a
rank above the engine's is refused. Unverified without a GPU: vLLM's CUDA LoRA kernels (punica), and
tensor parallelism with adapters.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from actor.engines.base import Completion
from actor.engines.vllm.engine import cpu_settings, generate, quiet_tokenizer_warmup, shutdown
from actor.live import TensorWeights
from aurora_store.bucket.replay import Adapter, adapter_files
from aurora_store.errors import StoreError
from aurora_store.format.manifest import TensorSpec
from aurora_store.rl.errors import ModelError

if TYPE_CHECKING:
    from vllm import LLM

log = logging.getLogger(__name__)

RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM can be started for (``max_lora_rank``; vLLM 0.32's ``LoRAConfig``)."""


def engine_rank(adapter_rank: int, asked: int | None = None) -> int:
    """The ``max_lora_rank`` to start vLLM with for a run's adapter of ``adapter_rank``: ``asked`` (which
    must hold it), else the smallest rank vLLM takes that does. A ModelError says why neither works."""
    if asked is not None:
        if asked not in RANKS:
            raise ModelError(f"vLLM takes a max LoRA rank of {', '.join(map(str, RANKS))}; {asked} is none of them")
        if adapter_rank > asked:
            raise ModelError(
                f"the run's LoRA adapter has rank {adapter_rank}, above the rank this engine is started with "
                f"({asked}): start it with a max LoRA rank of {engine_rank(adapter_rank)} or more"
            )
        return asked
    for r in RANKS:
        if r >= adapter_rank:
            return r
    raise ModelError(f"the run's LoRA adapter has rank {adapter_rank}; vLLM serves ranks up to {RANKS[-1]}")


@dataclass(frozen=True, slots=True)
class Slot:
    """One adapter vLLM holds: its id, its directory, and the request that names it."""

    id: int
    path: str
    request: Any
    """vLLM's ``LoRARequest`` for it."""


class Adapters:
    """The adapters one engine's vLLM holds: each loaded under a new id, one served to new requests,
    the rest unloaded once no running request names them."""

    def __init__(self, llm: LLM, llm_lock: threading.RLock, shape: Adapter, root: str) -> None:
        self.llm = llm
        self.llm_lock = llm_lock
        """Held for every call into ``llm`` (it is not thread-safe)."""
        self.shape = shape
        self.root = root
        self.serving: Slot | None = None
        self._lock = threading.Lock()
        self._next = 1
        self._prepared: dict[int, Slot] = {}
        """Loaded for a staged version, not yet served."""
        self._retired: dict[int, Slot] = {}
        """No longer served; unloaded when no request names it."""
        self._running: Counter[int] = Counter()
        """Requests running per adapter id."""

    def add(self, specs: Sequence[TensorSpec], words: Mapping[str, np.ndarray]) -> Slot:
        """Write ``words`` as a PEFT directory and have vLLM load it under a new id. On any error nothing
        is left behind and the served adapter is untouched (StoreError)."""
        from vllm.lora.request import LoRARequest

        with self._lock:
            slot_id, self._next = self._next, self._next + 1
        path = os.path.join(self.root, f"{slot_id:08d}")
        request = LoRARequest(f"aurora-{slot_id}", slot_id, path)
        try:
            os.makedirs(path)
            for name, data in adapter_files(specs, words, self.shape).items():
                with open(os.path.join(path, name), "xb") as f:
                    f.write(data)
            with self.llm_lock:
                loaded = self.llm.llm_engine.add_lora(request)
            if not loaded:
                raise StoreError("vLLM did not load it")
        except Exception as exc:
            shutil.rmtree(path, ignore_errors=True)
            with self.llm_lock, contextlib.suppress(Exception):
                self.llm.llm_engine.remove_lora(slot_id)
            said = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise StoreError(
                f"vLLM could not load the staged LoRA adapter: {said} (the adapter it serves keeps serving)"
            ) from None
        slot = Slot(slot_id, path, request)
        with self._lock:
            self._prepared[slot_id] = slot
        return slot

    def serve(self, slot: Slot) -> None:
        """New requests name ``slot`` from now on; every other loaded adapter is let go (staged over the
        adapter this replaces, none of them will be served)."""
        with self._lock:
            self._prepared.pop(slot.id, None)
            stale = list(self._prepared.values())
            self._prepared.clear()
            if self.serving is not None and self.serving.id != slot.id:
                self._retired[self.serving.id] = self.serving
            self.serving = slot
            for s in stale:
                self._retired[s.id] = s
        self._release()

    def drop(self, slot: Slot) -> None:
        """Let go of ``slot``, loaded for a staging that will not be applied."""
        with self._lock:
            if self._prepared.pop(slot.id, None) is None:
                return
            self._retired[slot.id] = slot
        self._release()

    @contextlib.contextmanager
    def request(self) -> Iterator[Any]:
        """The ``LoRARequest`` a batch names, counted as running until the batch ends."""
        with self._lock:
            slot = self.serving
            if slot is None:
                raise StoreError("no LoRA adapter is loaded yet: the engine has no version to generate with")
            self._running[slot.id] += 1
        try:
            yield slot.request
        finally:
            with self._lock:
                self._running[slot.id] -= 1
            self._release()

    def loaded(self) -> set[int]:
        """The adapter ids vLLM holds now (its ``list_loras``)."""
        with self.llm_lock:
            return set(self.llm.llm_engine.list_loras())

    def _release(self) -> None:
        """Unload every retired adapter that no running request names."""
        with self._lock:
            done = [s for i, s in self._retired.items() if self._running[i] <= 0]
            for s in done:
                del self._retired[s.id]
                self._running.pop(s.id, None)
        for s in done:
            with self.llm_lock:
                try:
                    self.llm.llm_engine.remove_lora(s.id)
                except Exception as exc:  # vLLM evicted it already, or is shutting down
                    log.debug("vLLM did not remove adapter %d: %s", s.id, exc)
            shutil.rmtree(s.path, ignore_errors=True)


class AdapterWeights(TensorWeights):
    """A LoRA run's adapter as the updater sees it: a host copy of its matrices (PEFT's names), whose
    every prepared version is loaded into vLLM at once and served from the commit on."""

    def __init__(self, adapters: Adapters) -> None:
        super().__init__(device="cpu")
        self.adapters = adapters
        self._over: Mapping[str, np.ndarray] | None = None
        """The staged full version a pending preparation was made over: the updater loads it just before
        committing, and that load must not load (or fail to load) another adapter."""

    def load(self, specs: tuple[TensorSpec, ...], words: Mapping[str, np.ndarray]) -> None:
        if self._over is not None and words is self._over:
            super().load(specs, words)  # its adapter was loaded when prepared; the commit serves it
            return
        slot = self.adapters.add(specs, words)  # first: a failure leaves everything as it was
        try:
            super().load(specs, words)
        except BaseException:
            self.adapters.drop(slot)
            raise
        self.adapters.serve(slot)

    def prepare(
        self,
        changes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        replaced: Mapping[str, np.ndarray] | None = None,
        over: Mapping[str, np.ndarray] | None = None,
    ) -> object:
        inner = super().prepare(changes, replaced)
        specs, held = self.snapshot()  # the adapter is small: O(adapter) each version
        words = {s.name: (np.array(over[s.name], copy=True) if over is not None else held[s.name]) for s in specs}
        for name, (idx, new) in changes.items():
            if name not in words:
                raise StoreError(f"the staged version changes {name!r}, which the run's adapter does not hold")
            words[name][idx] = new
        slot = self.adapters.add(specs, words)
        self._over = over
        return inner, slot

    def commit(self, prepared: object) -> None:
        inner, slot = _parts(prepared)
        super().commit(inner)
        self.adapters.serve(slot)
        self._over = None

    def discard(self, prepared: object) -> None:
        inner, slot = _parts(prepared)
        super().discard(inner)
        self.adapters.drop(slot)


def _parts(prepared: object) -> tuple[object, Slot]:
    """What :meth:`AdapterWeights.prepare` made: the host write's preparation and the adapter loaded."""
    assert isinstance(prepared, tuple) and isinstance(prepared[1], Slot)
    return prepared[0], prepared[1]


class VllmLoraEngine:
    """An :class:`~actor.engines.base.Engine` on ``vllm.LLM`` with ``enable_lora``: the base in
    ``base_dir`` (an ``aurora replay`` of the run's base), the versions as adapters of ``shape``."""

    def __init__(
        self,
        base_dir: str,
        shape: Adapter,
        *,
        max_lora_rank: int | None = None,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = False,
        enforce_eager: bool = True,
        logprobs_mode: str | None = "processed_logprobs",
        seed: int = 0,
        stop_token_ids: list[int] | None = None,
        **llm_kwargs: Any,
    ) -> None:
        rank = engine_rank(shape.rank, max_lora_rank)
        self.stop_token_ids = list(stop_token_ids or [])
        self._lock = threading.RLock()
        from vllm import LLM

        cpu_settings(1, llm_kwargs)
        quiet_tokenizer_warmup()
        if logprobs_mode is not None:
            llm_kwargs["logprobs_mode"] = logprobs_mode
        self.llm: LLM = LLM(
            model=base_dir,
            skip_tokenizer_init=True,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            seed=seed,
            enable_lora=True,
            max_lora_rank=rank,
            max_loras=2,  # the served adapter, and the next while a batch still names the last
            max_cpu_loras=4,
            **llm_kwargs,
        )
        self.root = tempfile.mkdtemp(prefix="aurora-lora-")
        self.adapters = Adapters(self.llm, self._lock, shape, self.root)
        self.live = AdapterWeights(self.adapters)
        log.info("vLLM engine: LoRA adapters of rank %d (engine's max %d) over a frozen base", shape.rank, rank)

    def close(self) -> None:
        """Shut the engine's processes down and delete the adapters' directories."""
        shutdown(self.llm, self._lock)
        shutil.rmtree(self.root, ignore_errors=True)

    def applied(self, version: int, version_hash: str) -> None:
        served = self.adapters.serving
        log.info("vLLM serves version %d (%s) as LoRA adapter %s", version, version_hash[:16], served and served.id)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        top_p: float = 1.0,
    ) -> list[list[Completion]]:
        with self._lock, self.adapters.request() as adapter:
            return generate(
                self.llm,
                prompts,
                samples=samples,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed,
                top_p=top_p,
                stop_token_ids=self.stop_token_ids,
                lora_request=adapter,
            )
