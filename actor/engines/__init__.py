"""Rollout engines, one module per engine: the protocol (:mod:`actor.engines.base`), the torch
engine (:mod:`actor.engines.torch`) and vLLM (:mod:`actor.engines.vllm`). What an engine computes
from (fused, repacked or tensor-parallel layouts) is its own module's to know."""
