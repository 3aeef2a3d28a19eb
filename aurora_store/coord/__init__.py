"""Coordination in Redis: region versions and announcements, workers, leased jobs, the EMA
split, and an embedded Redis-compatible server. Imports redis only: no fsspec, zstandard,
cryptography or torch, so a role that only coordinates starts fast."""
