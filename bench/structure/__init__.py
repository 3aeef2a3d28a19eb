"""Benchmarks of the code's own shape: how far a call walks, how long modules and classes grow."""
