"""Benchmarks for AuroraRL, run as ``aurora bench ...`` on a seeded, synthetic RL trace."""
