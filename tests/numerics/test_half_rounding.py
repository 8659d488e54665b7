"""f64 → f16 rounds once, not via f32, and f64 → bf16 goes through f32: the same on the CPU
target as in `loomc.ir.interpret` and the CUDA renderer."""

import numpy as np

from loomc.check import load_files
from loomc.ir import interpret
from loomc.run.compile import compile_kernel

NARROW = """
kernel narrow(x: f64[N], out h: f16[N], out b: bf16[N]) {
    parallel for i in 0..N {
        h[i] = f16(x[i])
        b[i] = bf16(x[i])
    }
}
"""


def test_f64_narrows_to_half_with_one_rounding(tmp_path):
    source = tmp_path / "narrow.loom"
    source.write_text(NARROW)
    checked = load_files([source])
    assert checked.ok, checked.diagnostics
    launch = compile_kernel(checked, "narrow")
    # Just above a tie after rounding to f32 first: 1 + 2^-11 + 2^-40 rounds up in f16, but through
    # f32 it becomes the exact tie 1 + 2^-11 and rounds to even (1.0). bf16 takes the f32 route.
    cases = [1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 1 + 2**-8 + 2**-40, 3.0, 65519.99, 1e-8, 0.1, -2.5e-5]
    rng = np.random.default_rng(7)
    x = np.array(cases + list(rng.normal(size=200) * 10.0 ** rng.integers(-6, 5, size=200)), dtype=np.float64)
    h = np.zeros(x.size, np.uint16)
    b = np.zeros(x.size, np.uint16)
    launch(x, h, b)
    want_h = [interpret._bitcast(interpret._cast(float(v), "f64", "f16"), "f16", "u16") for v in x]
    want_b = [interpret._bitcast(interpret._cast(float(v), "f64", "bf16"), "bf16", "u16") for v in x]
    assert h.tolist() == want_h
    assert b.tolist() == want_b
    assert h[0] == 0x3C01  # 1 + 2^-10: rounded once, up
    assert b[2] == 0x3F80  # 1.0: through f32 the value is an exact bf16 tie, which rounds to even
