"""Numerics fixtures: the motif library checked once, and each kernel compiled once per session."""

import pytest
from numerics_testlib import MOTIFS

from loomc.check import load_files
from loomc.run.compile import compile_kernel


@pytest.fixture(scope="session")
def motifs():
    checked = load_files(sorted(MOTIFS.glob("*.loom")))
    assert checked.ok, checked.diagnostics
    return checked


@pytest.fixture(scope="session")
def kernel(motifs):
    """kernel(name) -> a KernelLauncher for that motif kernel, compiled on first use."""
    compiled = {}

    def get(name: str):
        if name not in compiled:
            compiled[name] = compile_kernel(motifs, name)
        return compiled[name]

    return get


@pytest.fixture
def rng(request):
    import zlib

    import numpy as np

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
