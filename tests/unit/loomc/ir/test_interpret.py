"""Reference semantics of IR scalars (what command folding and host-side scalars use)."""

import numpy as np
import pytest

from loomc.ir import module as ir
from loomc.ir.interpret import evaluate, wrap


def b(op, x, y, t):
    return ir.Binary(op, ir.Const(t, x), ir.Const(t, y), t if op not in ir.COMPARE_OPS else "bool")


@pytest.mark.parametrize("expr,want", [
    (b("div", -7, 2, "i32"), -3),
    (b("mod", -7, 2, "i32"), -1),
    (b("div", 7, 0, "i64"), 0),
    (b("add", 2 ** 31 - 1, 1, "i32"), -2 ** 31),
    (b("mul", 2 ** 32 - 1, 2, "u32"), 2 ** 32 - 2),
    (b("shr", -16, 2, "i32"), -4),
    (b("shr", 2 ** 63, 63, "u64"), 1),
    (ir.Unary("neg", ir.Const("u8", 1), "u8"), 255),
    (ir.Cast(ir.Const("f32", -2.7), "i32"), -2),
    (ir.Cast(ir.Const("i64", 300), "u8"), 44),
    (ir.Bitcast(ir.Const("f32", 1.0), "u32"), 0x3F800000),
    (ir.Math("min", (ir.Const("f32", float("nan")), ir.Const("f32", 1.0)), "f32"), "nan"),
    (ir.Math("max", (ir.Const("f32", 1.0), ir.Const("f32", float("nan"))), "f32"), 1.0),
])
def test_scalar_semantics(expr, want):
    got = evaluate(expr, {})
    if want == "nan":
        assert np.isnan(got)
    else:
        assert got == want


def test_float_ops_round_in_their_dtype():
    third = evaluate(b("div", 1.0, 3.0, "f32"), {})
    assert isinstance(third, np.float32) and third == np.float32(1) / np.float32(3)
    assert evaluate(b("add", 2048.0, 1.0, "f16"), {}) == 2048.0  # 2049 is not an f16


def test_land_short_circuits():
    boom = ir.Binary("lt", ir.Load("x", ir.Const("i64", 0), "f32"), ir.Const("f32", 0.0), "bool")
    assert evaluate(ir.Binary("land", ir.Const("bool", False), boom, "bool"), {}) is False


def test_wrap():
    assert wrap(-1, "u16") == 65535 and wrap(128, "i8") == -128 and wrap(2 ** 64, "u64") == 0
