"""loomc/run/launch.py: what `KernelLauncher.bind` refuses before a kernel indexes anything.

A generated kernel does not check its bounds, so every array a launch passes is checked
here: its dtype, rank, C order and (where written) writability, and its shape against the
dimensions the kernel's symbols give it. A command's ShapePlan passes `checked=True` for
arrays it made or bound itself, which skips the first group of checks but never the shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loomc.check import load_files
from loomc.run.compile import compile_kernel
from loomc.run.errors import KernelArgumentError

SOURCE = """\
kernel scale_rows(x: f32[T, N], w: f32[N], out y: f32[T, N]) {
    parallel for t in 0..T, n in 0..N {
        y[t, n] = x[t, n] * w[n]
    }
}
"""


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    path = Path(tmp_path_factory.mktemp("launch")) / "scale.loom"
    path.write_text(SOURCE)
    program = load_files([path])
    assert program.ok, program.diagnostics
    return compile_kernel(program, "scale_rows")


def arrays():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    return x, np.array([1, 2, 3, 4], np.float32), np.zeros((3, 4), np.float32)


def test_a_launch_computes_with_arrays_that_fit(launcher):
    x, w, y = arrays()
    launcher(x, w, y)
    np.testing.assert_array_equal(y, x * w)


@pytest.mark.parametrize("checked", [False, True])
def test_shapes_are_checked_against_the_symbols_with_or_without_the_callers_word(launcher, checked):
    x, w, y = arrays()
    with pytest.raises(KernelArgumentError, match=r"'w' must be f32\[4\] given N = 4, T = 3, got shape \[5\]"):
        launcher.bind(x, np.zeros(5, np.float32), y, checked=checked)
    with pytest.raises(KernelArgumentError, match=r"'y' must be f32\[3, 4\]"):
        launcher.bind(x, w, np.zeros((4, 3), np.float32), checked=checked)


def test_the_buffer_that_gives_the_symbols_binds_as_its_own_flat_view(launcher):
    x, w, y = arrays()
    args = launcher.bind(x, w, y, checked=True)
    assert args[0].shape == (12,) and np.shares_memory(args[0], x)
    assert dict(zip((s.name for s in launcher.symbols), args[3:])) == {"T": 3, "N": 4}


@pytest.mark.parametrize("case, message", [
    ("dtype", r"'x' is f32: expected a float32 array, got float64"),
    ("rank", r"'w' has 1 dimensions, got an array of 2"),
    ("order", r"'x' must be C-contiguous"),
    ("read-only", r"'y' is written by the kernel, but the array is read-only"),
    ("type", r"'w' must be a numpy array, got list"),
])
def test_an_unchecked_caller_gets_every_check(launcher, case, message):
    x, w, y = arrays()
    if case == "dtype":
        x = x.astype(np.float64)
    elif case == "rank":
        w = w.reshape(1, 4)
    elif case == "order":
        x = np.asfortranarray(x)
    elif case == "read-only":
        y.flags.writeable = False
    else:
        w = list(w)
    with pytest.raises(KernelArgumentError, match=message):
        launcher(x, w, y)
