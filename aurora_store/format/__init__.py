"""The artifact format: pure bytes, JSON and numpy, no I/O and no torch.

Manifests and their hostile-input parser, key layout, dtypes, the weights digest, signing,
safetensors files, building deltas and full shards, and decoding and applying blocks. Every
function here works on bytes and word arrays; :mod:`aurora_store.bucket` moves them.
"""
