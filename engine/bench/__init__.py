"""Benchmark programs (not tests): `python -m engine.bench decode|scheduling|ipc|serving`."""
