"""Negative cases for the checker: each program yields exactly the listed diagnostics (code, line, column).

Sources are dedented; line 1 is the first line of the snippet. Files named in
`extra` are written beside the main file so `use` can find them.
"""

import textwrap
from pathlib import Path

import pytest

from loomc.check import check_files

CONFIG = """\
config layers: i64 = 2
config dim: i64 = 64
config eps: f32 = 1e-5
config name: str = "scout"
"""


def run(tmp_path: Path, src: str, extra: dict[str, str] | None = None) -> list[tuple[str, int, int]]:
    for name, text in (extra or {}).items():
        (tmp_path / name).write_text(text)
    main = tmp_path / "main.loom"
    main.write_text(textwrap.dedent(src).lstrip("\n"))
    diagnostics, _ = check_files([main])
    return [(d.code, d.line, d.column) for d in diagnostics if d.path.endswith("main.loom")]


CASES = {
    # ---- names and modules ----
    "unknown name in fn": ("""
        fn f() -> int {
            return missing
        }
        """, [("L0200", 2, 12)]),
    "unknown name in kernel": ("""
        kernel k(out y: f32[N]) {
            parallel for i in 0..N {
                y[i] = undefined_thing
            }
        }
        """, [("L0200", 3, 16)]),
    "unknown dimension name in param": ("""
        param w: f32[width] = checkpoint("w")
        """, [("L0200", 1, 14)]),
    "unknown kernel called from command": ("""
        command c(x: f32[N]) {
            nothere(x)
        }
        """, [("L0200", 2, 5)]),
    "unknown host function": ("""
        fn f() -> str {
            return frobnicate("x")
        }
        """, [("L0200", 2, 12)]),
    "duplicate definition": ("""
        config a: i64 = 1
        config a: i64 = 2
        """, [("L0201", 2, 8)]),
    "import of a missing item": ("""
        use "config.loom" { dim, width }
        """, [("L0202", 1, 26)]),
    "import of a missing file": ("""
        use "nowhere.loom" { dim }
        """, [("L0203", 1, 5)]),
    "import clashes with a local item": ("""
        use "config.loom" { dim }
        config dim: i64 = 3
        """, [("L0201", 1, 21)]),
    "names do not leak without use": ("""
        fn f() -> int {
            return layers
        }
        """, [("L0200", 2, 12)]),
    "local shadows argument": ("""
        fn f(a: int) -> int {
            let a = 2
            return a
        }
        """, [("L0205", 2, 9)]),
    # ---- types and casts ----
    "implicit cast in kernel arithmetic": ("""
        kernel k(x: f32[N], i: i32[N], out y: f32[N]) {
            parallel for n in 0..N {
                y[n] = x[n] * i[n]
            }
        }
        """, [("L0301", 3, 21)]),
    "implicit cast on assignment": ("""
        kernel k(i: i32[N], out y: f32[N]) {
            parallel for n in 0..N {
                y[n] = i[n]
            }
        }
        """, [("L0301", 3, 16)]),
    "float literal into an integer": ("""
        kernel k(out y: i32[N]) {
            parallel for n in 0..N {
                y[n] = 1.5
            }
        }
        """, [("L0300", 3, 16)]),
    "implicit cast in control code": ("""
        fn f(a: int, b: float) -> float {
            return a + b
        }
        """, [("L0301", 2, 14)]),
    "type mismatch str plus int": ("""
        fn f(n: int) -> str {
            return "n=" + n
        }
        """, [("L0300", 2, 17)]),
    "config value of the wrong type": ("""
        config n: i64 = 1.5
        """, [("L0300", 1, 17)]),
    "config value out of range": ("""
        config n: u8 = 300
        """, [("L0605", 1, 16)]),
    "condition is not bool": ("""
        kernel k(x: f32[N], out y: f32[N]) {
            parallel for n in 0..N {
                if x[n] {
                    y[n] = 1.0
                }
            }
        }
        """, [("L0308", 3, 12)]),
    "wrong number of arguments to an intrinsic": ("""
        kernel k(x: f32[N], out y: f32[N]) {
            parallel for n in 0..N {
                y[n] = max(x[n])
            }
        }
        """, [("L0302", 3, 16)]),
    "math intrinsic on an integer": ("""
        kernel k(x: i32[N], out y: i32[N]) {
            parallel for n in 0..N {
                y[n] = exp(x[n])
            }
        }
        """, [("L0300", 3, 20)]),
    "integer literal out of range": ("""
        kernel k(out y: u8[N]) {
            parallel for n in 0..N {
                y[n] = 256
            }
        }
        """, [("L0315", 3, 16)]),
    "negative literal into unsigned": ("""
        kernel k(out y: u32[N]) {
            parallel for n in 0..N {
                var c: u32 = -1
                y[n] = c
            }
        }
        """, [("L0315", 3, 22)]),
    "literal out of range inside an expression": ("""
        kernel k(out y: u8[N]) {
            parallel for n in 0..N {
                var b: u8 = 1
                y[n] = b + 1000
            }
        }
        """, [("L0315", 4, 20)]),
    "unknown function in a constant": ("""
        config scale: f32 = frob(2.0)
        """, [("L0404", 1, 21)]),
    "bitcast between different widths": ("""
        kernel k(x: f32[N], out y: u64[N]) {
            parallel for n in 0..N {
                y[n] = bitcast[u64](x[n])
            }
        }
        """, [("L0313", 3, 16)]),
    "bit operation on a float": ("""
        kernel k(x: f32[N], out y: f32[N]) {
            parallel for n in 0..N {
                y[n] = x[n] & x[n]
            }
        }
        """, [("L0314", 3, 21)]),
    "wrong index count": ("""
        kernel k(x: f32[T, D], out y: f32[T]) {
            parallel for t in 0..T {
                y[t] = x[t]
            }
        }
        """, [("L0306", 3, 16)]),
    "float index": ("""
        kernel k(x: f32[N], out y: f32[N]) {
            parallel for n in 0..N {
                y[n] = x[1.0]
            }
        }
        """, [("L0300", 3, 18)]),
    "return type mismatch": ("""
        fn f() -> int {
            return "x"
        }
        """, [("L0311", 2, 12)]),
    "missing return": ("""
        fn f(a: bool) -> str {
            if a {
                return "y"
            }
        }
        """, [("L0312", 5, 1)]),
    "assigning to a let": ("""
        fn f() -> int {
            let a = 1
            a = 2
            return a
        }
        """, [("L0304", 3, 5)]),
    "writing an input tensor": ("""
        kernel k(x: f32[N]) {
            parallel for n in 0..N {
                x[n] = 0.0
            }
        }
        """, [("L0305", 3, 9)]),
    "writing a quantized tensor": ("""
        kernel k(out w: q8_0[N, 32]) {
            parallel for n in 0..N {
                w[n, 0] = 0.0
            }
        }
        """, [("L0307", 3, 9)]),
    "quantized scalar argument": ("""
        kernel k(s: q4_0, out y: f32[N]) {
            parallel for n in 0..N {
                y[n] = 0.0
            }
        }
        """, [("L0307", 1, 13)]),
    "unused expression": ("""
        fn f(a: int) {
            a + 1
        }
        """, [("L0310", 2, 5)]),
    # ---- shapes ----
    "dimension mismatch at a call": ("""
        use "config.loom" { dim }
        kernel add(a: f32[N], b: f32[N], out c: f32[N]) {
            parallel for i in 0..N {
                c[i] = a[i] + b[i]
            }
        }
        command go(x: f32[dim], y: f32[32]) -> (z: f32[dim]) {
            add(x, y, z)
        }
        """, [("L0400", 8, 12)]),
    "rank mismatch at a call": ("""
        kernel neg(a: f32[N], out c: f32[N]) {
            parallel for i in 0..N {
                c[i] = -a[i]
            }
        }
        command go(x: f32[T, 4]) -> (z: f32[T, 4]) {
            neg(x, z)
        }
        """, [("L0401", 7, 9)]),
    "dtype mismatch at a call": ("""
        kernel neg(a: f32[N], out c: f32[N]) {
            parallel for i in 0..N {
                c[i] = -a[i]
            }
        }
        command go(x: f16[T]) -> (z: f32[T]) {
            neg(x, z)
        }
        """, [("L0300", 7, 9)]),
    "quantized blocks do not divide the row": ("""
        param w: q4_1[64, 48] = checkpoint("w")
        """, [("L0405", 1, 19)]),
    "panel rows do not divide": ("""
        param w: q4_1x16[24, 64] = repack(checkpoint("w"), q4_1x16)
        """, [("L0405", 1, 18)]),
    "a kernel indexes panels": ("""
        kernel k(w: q8_0x16[N, 32], out y: f32[N]) {
            parallel for n in 0..N {
                y[n] = w[n, 0]
            }
        }
        """, [("L0307", 3, 16)]),
    "quantize to panels": ("""
        param w: q4_1x16[16, 64] = quantize(checkpoint("w"), q4_1x16)
        """, [("L0604", 1, 54)]),
    "repack to a plain type": ("""
        param w: q4_1[4, 64] = repack(checkpoint("w"), q4_1)
        """, [("L0604", 1, 48)]),
    "non-integer dimension config": ("""
        use "config.loom" { eps }
        param w: f32[eps] = checkpoint("w")
        """, [("L0402", 2, 14)]),
    "symbol cannot be inferred": ("""
        kernel twice(a: f32[N], out c: f32[2 * M]) {
            parallel for i in 0..N {
                c[i] = a[i]
            }
        }
        command go(x: f32[T]) -> (z: f32[T]) {
            twice(x, z)
        }
        """, [("L0403", 7, 14)]),
    "non-constant command loop": ("""
        command go(x: f32[T], n: i64) {
            for l in 0..n {
                go(x, n)
            }
        }
        """, [("L0404", 2, 17)]),
    # ---- contexts ----
    "fail inside a kernel": ("""
        kernel k(x: f32[N]) {
            parallel for n in 0..N {
                fail(400, "bad")
            }
        }
        """, [("L0500", 3, 9)]),
    "string inside a kernel": ("""
        kernel k(out y: f32[N]) {
            parallel for n in 0..N {
                let s = "text"
            }
        }
        """, [("L0500", 3, 17)]),
    "kernel calling a fn": ("""
        fn helper() -> int {
            return 1
        }
        kernel k(out y: i64[N]) {
            parallel for n in 0..N {
                y[n] = helper()
            }
        }
        """, [("L0500", 6, 16)]),
    "kernel reading a param directly": ("""
        param w: f32[4] = checkpoint("w")
        kernel k(out y: f32[N]) {
            parallel for n in 0..N {
                y[n] = w[0]
            }
        }
        """, [("L0500", 4, 16)]),
    "parallel for in control code": ("""
        fn f() {
            parallel for i in 0..4 {
                let x = i
            }
        }
        """, [("L0501", 2, 5)]),
    "numeric type in fn": ("""
        fn f(x: f32) -> int {
            return 1
        }
        """, [("L0501", 1, 9)]),
    "fn calling a kernel": ("""
        kernel k(out y: f32[N]) {
            parallel for n in 0..N {
                y[n] = 0.0
            }
        }
        fn f() {
            k(1)
        }
        """, [("L0501", 7, 5)]),
    "assignment in a command": ("""
        command go(n: i64) {
            let a = n
            a = 3
        }
        """, [("L0502", 3, 5)]),
    "nested parallel for": ("""
        kernel k(out y: f32[N, M]) {
            for i in 0..N {
                parallel for j in 0..M {
                    y[i, j] = 0.0
                }
            }
        }
        """, [("L0503", 3, 9)]),
    "break outside a loop": ("""
        fn f() {
            break
        }
        """, [("L0504", 2, 5)]),
    "return in a kernel": ("""
        kernel k(out y: f32[N]) {
            return
        }
        """, [("L0505", 2, 5)]),
    "expect outside a check": ("""
        fn f() {
            expect true
        }
        """, [("L0501", 2, 5)]),
    # ---- declarations ----
    "unknown state scope": ("""
        state kv: f32[4, 16] per session
        """, [("L0602", 1, 26)]),
    "unknown placeholder in checkpoint name": ("""
        config layers: i64 = 2
        param w[l in 0..layers]: f32[4] = checkpoint("blk.{layer}.w")
        """, [("L0603", 2, 46)]),
    "family without its index in the name": ("""
        config layers: i64 = 2
        param w[l in 0..layers]: f32[4] = checkpoint("blk.w")
        """, [("L0603", 2, 46)]),
    "unknown preparation function": ("""
        param w: f32[4] = dequantize(checkpoint("w"))
        """, [("L0200", 1, 19)]),
    "write to a param from a command": ("""
        param w: f32[4] = checkpoint("w")
        kernel zero(out y: f32[N]) {
            parallel for n in 0..N {
                y[n] = 0.0
            }
        }
        command go() {
            zero(w)
        }
        """, [("L0305", 8, 10)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_negative(tmp_path, name):
    src, expected = CASES[name]
    assert run(tmp_path, src, {"config.loom": CONFIG}) == expected


def test_at_least_forty_negative_cases():
    assert len(CASES) >= 40


def test_all_errors_of_a_run_are_reported_in_position_order(tmp_path):
    src = """
        fn f() -> int {
            let a = nope1
            let b = "x" + 1
            return nope2
        }
        kernel k(x: f32[N]) {
            parallel for i in 0..N {
                fail(400, "x")
            }
        }
        """
    got = run(tmp_path, src)
    assert got == [("L0200", 2, 13), ("L0300", 3, 17), ("L0200", 4, 12), ("L0500", 8, 13 - 4)]


def test_constants_fold_conversions_and_float_math(tmp_path):
    src = """
        config head_dim: i64 = 64
        config scale: f32 = rsqrt(f32(head_dim))
        config half: i64 = i64(f32(head_dim) / 2.0)
        param w: f32[half] = checkpoint("w")
        """
    assert run(tmp_path, src) == []


def test_a_null_placeholder_can_be_assigned_later(tmp_path):
    src = """
        fn f(r: map) -> any {
            var seed = null
            if has(r, "seed") {
                seed = r["seed"]
                seed = 3
            }
            return seed
        }
        """
    assert run(tmp_path, src) == []
