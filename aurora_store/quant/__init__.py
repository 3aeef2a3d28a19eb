"""Quantized rollout weights (issue 37): the trainer's deterministic quantizers and their bit patterns.

numpy only: no torch, no I/O; the trainer calls it on its FP32 weights, the tests pin it with golden
vectors, and readers never need it (they hold the published words).
"""
