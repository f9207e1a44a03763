"""Benchmarks: scripts that measure edge against its peers and write JSON (benchmarks/results/) and markdown (docs/results/)."""
