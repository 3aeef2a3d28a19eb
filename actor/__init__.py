"""The actor role: rollout engines, version staging and safe-point apply, the worker loop."""
