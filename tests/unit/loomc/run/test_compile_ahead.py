"""loomc/run/ahead.py: kernels compiled before their first launch, for exactly the types a launch
passes. If an ahead-compiled signature differed from what `bind` or a motif dispatch hands the
function (a scalar's width, f16 bits, quantized bytes, an i64 symbol, a motif's 3-D operands),
numba would compile a second overload at the first request: the thing compiling ahead exists
to prevent. Each test compiles ahead, launches for real, and checks no overload was added."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from loomc.check import load_files
from loomc.run.ahead import ahead_of_time_units, compile_ahead
from loomc.run.compile import compile_command, compile_kernel

PREPARE = """\
config dim: i64 = 32

param w: f32[dim, dim] = checkpoint("w")
"""

SOURCE = """\
use "prepare.loom" { dim, w }

kernel mixed(inout y: f32[T, N], h: f16[N], q: q8_0[N, K], s: f32, k: i32, wide: i64, on: bool, d: f64) {
    parallel for t in 0..T, n in 0..N {
        let base = y[t, n] * s + f32(h[n]) + f32(k) + f32(wide) + f32(d)
        if on {
            y[t, n] = base + f32(K)
        } else {
            y[t, n] = base
        }
    }
}

kernel add_one(inout y: f32[T, D]) {
    parallel for t in 0..T, d in 0..D {
        y[t, d] = y[t, d] + 1.0
    }
}

command project(x: f32[T, dim]) -> (y: f32[T, dim]) {
    matmul(x, w, y)
    add_one(y)
}
"""


def checked(tmp_path: Path):
    (tmp_path / "prepare.loom").write_text(PREPARE)
    path = tmp_path / "ahead.loom"
    path.write_text(SOURCE)
    program = load_files([path])
    assert program.ok, program.diagnostics
    return program


def overloads(units) -> list[int]:
    return [len(function.overloads) for function, _ in units]


def test_a_kernel_with_every_argument_kind_is_launched_without_compiling_again(tmp_path):
    launcher = compile_kernel(checked(tmp_path), "mixed")
    units = ahead_of_time_units({}, [launcher])
    told = []
    compile_ahead(units, lambda done, total: told.append((done, total)))
    assert told == [(0, len(units)), *((i, len(units)) for i in range(1, len(units) + 1))]
    compiled = overloads(units)
    assert all(n >= 1 for n in compiled)

    rng = np.random.default_rng(0)
    y = rng.standard_normal((3, 4)).astype(np.float32)
    h = rng.standard_normal(4).astype(np.float16)
    q = np.ascontiguousarray(quantize(rng.standard_normal((4, 64)).astype(np.float32), GGMLQuantizationType.Q8_0))
    want = y * np.float32(0.5) + h.astype(np.float32) + 3 + 5 + np.float32(0.25) + 64
    launcher(y, h, q, 0.5, 3, 5, True, 0.25)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    assert overloads(units) == compiled


def test_a_command_program_with_a_matmul_motif_is_run_without_compiling_again(tmp_path):
    program = compile_command(checked(tmp_path), "project")
    units = ahead_of_time_units({"project": program})
    assert len(units) == 2                       # add_one and the matmul motif
    compile_ahead(units)
    compiled = overloads(units)

    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 32)).astype(np.float32)
    x = rng.standard_normal((5, 32)).astype(np.float32)
    y = program.run({"w": w}, {}, {"x": x})["y"]
    np.testing.assert_allclose(y, x @ w.T + 1, rtol=1e-4, atol=1e-4)
    assert overloads(units) == compiled
