"""Every motif kernel's parallel loop really became a numba prange (STYLE habit 15).

numba serializes a prange whose body can raise (several loop exits) and only warns, so
this asks numba's own parfor diagnostics for each compiled kernel part."""

import numba
import numpy as np
import pytest
from numerics_testlib import MOTIFS

from loomc.ir import module as ir
from loomc.lower.numba import KERNEL_STORAGE, load_group
from loomc.syntax import ast
from loomc.syntax.parse import parse_module

MOTIF_KERNELS = sorted((path.name, item.name) for path in MOTIFS.glob("*.loom")
                       for item in parse_module(path.read_text(), str(path)).items if isinstance(item, ast.Kernel))

_SCALAR = {"bool": numba.types.boolean, "f16": numba.types.float32, "bf16": numba.types.float32,
           "f32": numba.types.float32, "f64": numba.types.float64}


def launch_signature(kernel: ir.Kernel) -> tuple:
    """The numba argument types a launch passes: flat C arrays, typed scalars, i64 symbols."""
    types = []
    for p in kernel.params:
        if isinstance(p, ir.BufferParam):
            types.append(numba.types.Array(numba.from_dtype(np.dtype(KERNEL_STORAGE[p.dtype])), 1, "C"))
        else:
            types.append(_SCALAR.get(p.dtype) or getattr(numba.types, {"i": "int", "u": "uint"}[p.dtype[0]] + p.dtype[1:]))
    return tuple(types) + (numba.types.int64,) * len(kernel.symbols)


def parfor_count(dispatcher, sig) -> int | None:
    metadata = dispatcher.get_metadata(sig)
    if metadata is None:  # loaded from numba's disk cache: no diagnostics kept
        return None
    return len(metadata["parfor_diagnostics"].initial_parfors)


@pytest.mark.parametrize("module,name", MOTIF_KERNELS, ids=[n for _, n in MOTIF_KERNELS])
def test_motif_parallel_loop_is_a_prange(kernel, tmp_path, module, name):
    launcher = kernel(name)
    for part, dispatcher in zip(launcher.group.parts, launcher.functions):
        sig = launch_signature(part)
        dispatcher.compile(sig)
        count = parfor_count(dispatcher, sig)
        if count is None:  # compile a private copy, which cannot hit the shared disk cache
            fresh = load_group(launcher.group, tmp_path)[launcher.group.parts.index(part)]
            fresh.compile(sig)
            count = parfor_count(fresh, sig)
        assert count == 1, f"{name}: {count} parallel loops survived in {part.name}"
