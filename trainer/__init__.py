"""The trainer role: GRPO with one-step asynchrony, resumable state, FSDP2-aware publishing,
``aurora train`` and ``aurora demo``."""
