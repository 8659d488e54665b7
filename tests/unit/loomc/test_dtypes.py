"""loomc/dtypes.py: the one dtype table, and the tables derived from it agreeing with it."""

import subprocess
import sys

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from loomc import dtypes
from loomc.bytecode import schema
from loomc.check import types as T
from loomc.dtypes import DTYPES, numpy_type
from loomc.ir import module as ir
from loomc.lower import cuda, cuda_helpers, numba
from loomc.run import launch


def test_table_order_and_kinds():
    assert list(DTYPES) == ["bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
                            "f16", "bf16", "f32", "f64", "q4_0", "q4_1", "q8_0", "q4_1x16", "q8_0x16"]
    assert all(d.kind in dtypes.KINDS and d.name == name for name, d in DTYPES.items())
    assert dtypes.names("quantized") == ("q4_0", "q4_1", "q8_0", "q4_1x16", "q8_0x16")
    assert dtypes.PANEL_TYPES == ("q4_1x16", "q8_0x16")
    with pytest.raises(ValueError, match="unknown dtype kind"):
        dtypes.names("complex")


def test_numpy_facts_agree_with_numpy():
    for d in DTYPES.values():
        if d.numpy is not None:
            assert np.dtype(numpy_type(d.numpy)).itemsize * 8 == d.bits, d
            assert np.dtype(numpy_type(d.host)) == np.dtype(numpy_type(d.numpy)), d
        if d.bits is not None:  # the buffer a kernel indexes holds one element per item
            assert np.dtype(numpy_type(d.kernel)).itemsize * 8 == d.bits, d
        if dtypes.is_int(d.name):
            info = np.iinfo(numpy_type(d.numpy))
            assert d.range == (info.min, info.max)
    assert DTYPES["f16"].host_accepted == ("float16", "uint16")
    assert DTYPES["bf16"].host_accepted == ("uint16",)
    # host and kernel storage differ for f16 alone.
    assert [t for t, d in DTYPES.items() if d.host != d.kernel] == ["f16"]
    with pytest.raises(ValueError, match="not an integer"):
        DTYPES["f32"].range


def test_quantized_blocks_agree_with_gguf():
    for name in dtypes.names("quantized"):
        d = DTYPES[name]
        gguf_name = d.panel_of or name   # panels hold their plain type's blocks
        assert GGML_QUANT_SIZES[GGMLQuantizationType[gguf_name.upper()]] == (d.block_elems, d.block_bytes)
        assert d.codes_offset == DTYPES[gguf_name].codes_offset
        assert d.bits is None and d.compute is None and d.host == d.kernel == "uint8"


def test_helpers():
    assert [t for t in DTYPES if dtypes.is_int(t)] == list(T.INT_TYPES)
    assert [t for t in DTYPES if dtypes.is_unsigned(t)] == ["u8", "u16", "u32", "u64"]
    assert [t for t in DTYPES if dtypes.is_float(t)] == ["f16", "bf16", "f32", "f64"]
    assert not any(f(x) for f in (dtypes.is_int, dtypes.is_float, dtypes.is_unsigned) for x in ("any", "q5_0"))
    assert ir.is_int is dtypes.is_int and ir.is_float is dtypes.is_float


def test_derived_tables_agree():
    assert T.NUMERIC_TYPES == ir.DTYPES and T.QUANT_TYPES == ir.QUANT_DTYPES
    assert T.STORAGE_TYPES == tuple(DTYPES)
    assert T.BITS == ir.BITS == {t: DTYPES[t].bits for t in ir.DTYPES}
    assert T.QUANT_BLOCK == {t: ir.QUANT_BLOCK_ELEMS for t in ir.QUANT_DTYPES}
    assert ir.QUANT_BLOCK_BYTES == {"q4_0": 18, "q4_1": 20, "q8_0": 34, "q4_1x16": 20, "q8_0x16": 34}
    assert T.PANEL_ROWS == {"q4_1x16": 16, "q8_0x16": 16}
    assert T.INT_RANGES["i8"] == (-128, 127) and T.INT_RANGES["u64"] == (0, 2 ** 64 - 1)
    # The bytecode's type enum is append-only wire format, so it is spelled out, but it names
    # exactly the dtypes there are.
    assert set(schema.live(schema.SCALAR_TYPES)) == set(DTYPES)


def test_renderer_spellings():
    assert numba.NP_TYPE["f16"] == numba.NP_TYPE["bf16"] == "np.float32" and numba.NP_TYPE["bool"] == "np.bool_"
    assert numba.KERNEL_STORAGE_TEXT["f16"] == "np.uint16" and numba.KERNEL_STORAGE["f16"] is np.uint16
    assert cuda_helpers.C_TYPE["f16"] == "float" and cuda_helpers.C_TYPE["i8"] == "signed char"
    assert cuda.KERNEL_STORAGE["bf16"] == "unsigned short" and cuda.KERNEL_STORAGE["q8_0"] == "unsigned char"
    assert cuda_helpers.SAME_WIDTH_UNSIGNED["f64"] == "unsigned long long"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_launcher_hands_kernels_their_storage(dtype):
    """What the launcher allocates is host storage; what it hands a kernel is the buffer the
    renderers index: the two notions meet in `flat_view`."""
    dims = (2, 64)
    host = launch.allocate(dtype, dims)
    assert host.dtype == launch.HOST_DTYPES[dtype][0] == np.dtype(launch.STORAGE[dtype])
    assert launch.flat_view(dtype, host).dtype == np.dtype(numba.KERNEL_STORAGE[dtype])
    if dtype == "f16":  # bits are accepted as they are
        bits = np.zeros(dims, np.uint16)
        assert np.dtype(np.uint16) in launch.HOST_DTYPES[dtype]
        assert launch.flat_view(dtype, bits).dtype == np.uint16


def test_front_end_does_not_import_numpy():
    code = "import sys, loomc.check.types, loomc.ir.module; assert 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
