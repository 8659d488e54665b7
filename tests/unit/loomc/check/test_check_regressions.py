"""Regressions found while writing the language reference: each stays fixed."""

from test_diagnostics import run


def test_divided_symbol_in_a_callee_shape_is_matched(tmp_path):
    src = """
        kernel halve(x: f32[N], out y: f32[N / 2]) {
            parallel for i in 0..N / 2 {
                y[i] = x[2 * i]
            }
        }
        command go(x: f32[8]) -> (h: f32[4]) {
            halve(x, h)
        }
        command bad(x: f32[8]) -> (h: f32[3]) {
            halve(x, h)
        }
        """
    assert run(tmp_path, src) == [("L0400", 10, 14)]


def test_command_if_on_the_unrolled_loop_variable(tmp_path):
    src = """
        config layers: i64 = 4
        kernel zero(out y: f32[N]) {
            parallel for i in 0..N {
                y[i] = 0.0
            }
        }
        command go(n: i64) -> (y: f32[T]) {
            for l in 0..layers {
                if l == 0 && layers > 1 {
                    zero(y)
                }
            }
            if n > 0 {
                zero(y)
            }
        }
        """
    assert run(tmp_path, src) == [("L0404", 13, 8)]


def test_command_let_respects_its_annotation(tmp_path):
    src = """
        command go(n: i64) {
            let a: f32 = 1
            let b: i32 = n
        }
        """
    assert run(tmp_path, src) == [("L0301", 3, 18)]


def test_called_command_results_must_be_writable(tmp_path):
    src = """
        kernel copy(x: f32[N], out y: f32[N]) {
            parallel for i in 0..N {
                y[i] = x[i]
            }
        }
        command inner(x: f32[T]) -> (y: f32[T]) {
            copy(x, y)
        }
        command outer(x: f32[T]) -> (z: f32[T]) {
            inner(x, x)
            inner(x, z)
        }
        """
    assert run(tmp_path, src) == [("L0305", 10, 14)]


def test_float_intrinsics_take_integer_literals(tmp_path):
    src = """
        config s: f32 = sqrt(2)
        kernel k(out y: f32[N]) {
            parallel for i in 0..N {
                y[i] = exp(1) * s
            }
        }
        """
    assert run(tmp_path, src) == []


def test_shift_count_may_be_any_integer_in_both_forms(tmp_path):
    src = """
        kernel k(c: i32[N], out y: u32[N]) {
            parallel for i in 0..N {
                var s: u32 = 1
                s <<= c[i]
                s = s << c[i]
                s >>= 1.0
                y[i] = s
            }
        }
        """
    assert run(tmp_path, src) == [("L0314", 6, 15)]


def test_unconstrained_literal_must_fit_i64(tmp_path):
    src = """
        kernel k(out y: i64[N]) {
            parallel for i in 0..N {
                let z = 9223372036854775808
                y[i] = z
            }
        }
        """
    assert run(tmp_path, src) == [("L0315", 3, 17)]


def test_state_host_dimension_never_unifies_with_a_named_symbol(tmp_path):
    src = """
        state kv: f32[4] per page
        kernel pair(a: f32[P, 4], b: i32[P]) {
            parallel for p in 0..P {
                let x = a[p, 0]
            }
        }
        command go(idx: i32[pages]) {
            pair(kv, idx)
        }
        """
    assert run(tmp_path, src) == [("L0400", 8, 14)]


def test_scratch_dimensions_are_shape_symbols_not_scalars(tmp_path):
    src = """
        command go(x: f32[T], n: i64) {
            var t: f32[T]
            var u: f32[n]
        }
        """
    assert run(tmp_path, src) == [("L0403", 3, 12)]


def test_param_family_index_in_range(tmp_path):
    src = """
        config layers: i64 = 2
        param w[l in 0..layers]: f32[4] = checkpoint("blk.{l}.w")
        kernel use1(x: f32[N]) {
            parallel for i in 0..N {
                let v = x[i]
            }
        }
        command go() {
            use1(w[1])
            use1(w[5])
            for l in 0..3 {
                use1(w[l])
            }
        }
        """
    assert run(tmp_path, src) == [("L0406", 10, 12), ("L0406", 12, 16)]


def test_param_family_index_of_a_loop_expression_is_checked_at_specialization(tmp_path):
    """`w[l + 1]` under `if l + 1 < layers` (a layer fusing the next layer's norm) checks
    clean; its members are known once the loop unrolls and the `if` is decided, so a member
    outside the family is L0406 at specialization, positioned at the index."""
    import textwrap

    import pytest

    from loomc.check import load_files
    from loomc.lower.scalars import LoweringError
    from loomc.run.compile import compile_command

    src = """
        config layers: i64 = 3
        param w[l in 0..layers]: f32[4] = checkpoint("blk.{l}.w")
        kernel use1(x: f32[N]) {
            parallel for i in 0..N {
                let v = x[i]
            }
        }
        command guarded() {
            for l in 0..layers {
                if l + 1 < layers {
                    use1(w[l + 1])
                }
            }
        }
        command unguarded() {
            for l in 0..layers {
                use1(w[l + 1])
            }
        }
        """
    assert run(tmp_path, src) == []
    path = tmp_path / "family.loom"
    path.write_text(textwrap.dedent(src))
    checked = load_files([path])
    assert checked.ok, checked.diagnostics
    compile_command(checked, "guarded")
    with pytest.raises(LoweringError, match=r"L0406: index 3 is outside family 'w', whose members are 0\.\.3") as e:
        compile_command(checked, "unguarded")
    assert (e.value.span.line, e.value.span.column) == (18, 16)


def test_conversion_messages_name_the_right_kind_of_type(tmp_path):
    from loomc.check import check_files

    main = tmp_path / "main.loom"
    main.write_text('fn f() -> any {\n    return bytes("x")\n}\n'
                    "kernel k(x: f32[N], out y: f32[N]) {\n    parallel for i in 0..N {\n        y[i] = q8_0(x[i])\n    }\n}\n")
    diagnostics, _ = check_files([main])
    assert [(d.code, d.line) for d in diagnostics] == [("L0501", 2), ("L0307", 6)]
    assert "without a conversion" in diagnostics[0].message
    assert "block storage type" in diagnostics[1].message


def test_constant_shifts_are_bounded(tmp_path):
    src = """
        config a: i64 = 1 << 100000000000
        config b: i64 = 1 >> -1
        config c: i64 = 1 << 62
        """
    assert run(tmp_path, src) == [("L0404", 1, 17), ("L0404", 2, 17)]


def test_float_remainder_and_config_precision_match_the_kernels():
    import math

    from loomc.check import types as T
    from loomc.check.core import Core, _fold

    assert _fold("%", -7.5, 2.0, T.F32) == math.fmod(-7.5, 2.0) == -1.5
    assert _fold("%", -7, 2, T.I64) == -1
    assert Core.coerce(0.1, T.F32) == 0.10000000149011612
    assert Core.coerce(0.1, T.Scalar("f64")) == 0.1
    assert Core.coerce(1e-5, T.Scalar("f16")) == 1.0013580322265625e-05


def test_shift_of_literals_stays_untyped(tmp_path):
    src = """
        kernel k(x: u8[N], out y: u8[N]) {
            parallel for i in 0..N {
                y[i] = x[i] + (1 << 2)
            }
        }
        """
    assert run(tmp_path, src) == []


def test_caller_configs_do_not_capture_motif_symbols(tmp_path):
    src = """
        config K: i64 = 3
        command go(a: f32[T, 8], b: f32[4, 8]) -> (c: f32[T, 4]) {
            matmul(a, b, c)
        }
        """
    assert run(tmp_path, src) == []
