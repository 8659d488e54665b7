"""Command operands known only per call: scalar arguments, symbols, and state pages they select."""

from pathlib import Path

import numpy as np
import pytest
from numerics_testlib import fma_chain

from loomc.check import load_files
from loomc.run.compile import compile_command
from loomc.run.errors import DispatchError, StageInputError

FIXTURE = Path(__file__).parent / "fixtures" / "scalars.loom"


@pytest.fixture(scope="module")
def program():
    checked = load_files([FIXTURE])
    assert checked.ok, checked.diagnostics
    return compile_command(checked, "forward")


def test_runtime_scalars_and_selected_pages(program, rng):
    plan = program.plan
    assert [d.callee.rsplit(":", 1)[-1] for d in plan.dispatches] == ["scale", "scale", "copy_rows", "matmul"]
    assert plan.dispatches[1].operands[1].value == 2.0  # the static `if` chose this branch
    cache = np.zeros((3, 4, 8), np.float32)
    for t_count, gain, page in ((4, 3.0, 1), (3, 0.5, 2), (4, -1.0, 0)):  # T <= S: one writer per slot
        x = rng.standard_normal((t_count, 8)).astype(np.float32)
        out = program.run({}, {"cache": cache}, {"x": x, "gain": gain, "page": page})
        y = x * np.float32(np.float32(gain) / np.float32(t_count)) * np.float32(2.0)
        np.testing.assert_allclose(out["y"], y, rtol=1e-6)
        np.testing.assert_allclose(cache[page, :t_count], y, rtol=1e-6)
        np.testing.assert_array_equal(out["z"], fma_chain(out["y"], cache[page]))  # the matmul motif's contract


def test_bad_scalars_and_pages(program, rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    cache = np.zeros((3, 4, 8), np.float32)
    with pytest.raises(DispatchError, match=r"index 3 is outside dimension 0 \(3\) of 'cache'"):
        program.run({}, {"cache": cache}, {"x": x, "gain": 1.0, "page": 3})
    with pytest.raises(StageInputError, match="'page' must be a i64 scalar"):
        program.run({}, {"cache": cache}, {"x": x, "gain": 1.0, "page": 1.5})
    with pytest.raises(StageInputError, match="'gain' must be a f32 scalar"):
        program.run({}, {"cache": cache}, {"x": x, "gain": "fast", "page": 1})
