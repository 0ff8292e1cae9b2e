"""Helpers of ``benchmarks/peer_magics.py``: the paced fake, peer venvs, kernels, the relay server."""
