"""`compute(KERNEL, args...)` in a param: what the checker accepts and what it names."""

from test_diagnostics import run

KERNELS = """
    kernel ramp(out y: f32[N]) {
        parallel for i in 0..N {
            y[i] = f32(i)
        }
    }
    kernel scaled(x: f32[N], s: f32, out y: f32[N]) {
        parallel for i in 0..N {
            y[i] = x[i] * s
        }
    }
    kernel reads(x: f32[N]) {
        parallel for i in 0..N {
            let v = x[i]
        }
    }
"""


def test_a_kernel_with_its_arguments_is_accepted(tmp_path):
    src = KERNELS + """
    param a: f32[8] = compute(ramp)
    param b: f32[8] = compute(scaled, checkpoint("w"), 2.0)
    param c: f32[8] = compute(scaled, cast(checkpoint("w"), f32), 3)
    """
    assert run(tmp_path, src) == []


def test_what_compute_refuses(tmp_path):
    src = KERNELS + """
    config k: i64 = 2
    param a: f32[8] = compute(missing)
    param b: f32[8] = compute(k)
    param c: f32[8] = compute(scaled, checkpoint("w"))
    param d: f32[8] = transpose(compute(ramp))
    param e: f32[8] = compute(reads, checkpoint("w"))
    param f: f32[8] = compute(scaled, checkpoint("w"), k)
    """
    codes = [code for code, _, _ in run(tmp_path, src)]
    assert codes == ["L0200", "L0604", "L0302", "L0604", "L0604", "L0300"]
