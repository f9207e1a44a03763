"""Benchmarks: scripts that measure edge against its peers.

Each writes JSON (benchmarks/results/) and markdown (docs/results/).
"""
