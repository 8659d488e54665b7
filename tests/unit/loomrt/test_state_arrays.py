"""loomrt/state.py: state arrays are zeroed and backed by memory from preparation on (RSS does
not creep up as requests first reach KV pages), in the storage the kernels bind."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from loomrt.state import POPULATE_BYTES, resident_zeros


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_large_state_array_is_resident_before_anything_writes_it():
    before = rss_bytes()
    array = resident_zeros("f32", [64, 1024, 256])            # 64 MiB
    grown = rss_bytes() - before
    assert grown >= 0.9 * array.nbytes, (grown, array.nbytes)
    assert array.shape == (64, 1024, 256) and array.dtype == np.float32
    assert array.flags.writeable and array.flags.c_contiguous and not array.any()
    array[3, 5, 7] = 2.0
    assert array.sum() == 2.0


def test_small_and_quantized_arrays_have_the_kernels_storage():
    small = resident_zeros("i32", [3, 4])
    assert small.nbytes < POPULATE_BYTES and small.dtype == np.int32 and not small.any()
    blocks = resident_zeros("q4_1", [2048, 64])               # q4_1: 20 bytes per 32 values
    assert blocks.shape == (2048, 40) and blocks.dtype == np.uint8 and not blocks.any()
    half = resident_zeros("f16", [1024, 1024])
    assert half.dtype == np.float16 and half.flags.writeable
