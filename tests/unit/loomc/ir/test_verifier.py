"""The IR verifier accepts every lowered motif and rejects each broken rule with a message."""

import dataclasses
from pathlib import Path

import pytest

from loomc.check import load_files
from loomc.ir import module as ir
from loomc.ir.printer import group as print_group
from loomc.ir.verifier import IRError, verify
from loomc.lower.kernels import lower_kernel
from loomc.syntax import ast

MOTIFS = Path(__file__).resolve().parents[4] / "loomc" / "motifs"
I64 = "i64"


def c(v, t=I64):
    return ir.Const(t, v)


def ref(name, t=I64):
    return ir.Ref(name, t)


def kernel(body, params=None, symbols=None):
    params = params if params is not None else (
        ir.BufferParam("x", "f32", (ref("N"),), False),
        ir.BufferParam("y", "f32", (ref("N"),), True),
        ir.BufferParam("w", "q4_1", (c(4), c(64)), False),
        ir.ScalarParam("s", "f32"),
    )
    symbols = symbols if symbols is not None else (ir.SymbolParam("N", "x", 0),)
    return ir.Kernel("k", params, symbols, tuple(body), ir.Source("t.loom", 1))


def lanes(*body):
    return ir.ParallelFor((ir.Lane("i", I64, c(0), ref("N")),), tuple(body))


def load_x():
    return ir.Load("x", ref("i"), "f32")


def test_a_well_formed_kernel_passes():
    body = [ir.Declare("two", "f32", c(2.0, "f32")),
            lanes(ir.Declare("acc", "f32", c(0.0, "f32"), True),
                  ir.For("j", I64, c(0), c(3), (ir.Assign("acc", ir.Binary("add", ir.Ref("acc", "f32"), load_x(), "f32")),)),
                  ir.Store("y", ref("i"), ir.Binary("mul", ir.Ref("acc", "f32"), ir.Ref("two", "f32"), "f32")))]
    verify(kernel(body))


@pytest.mark.parametrize("body,message", [
    ([lanes(ir.Store("x", ref("i"), load_x()))], "read-only buffer 'x'"),
    ([lanes(ir.Store("y", ref("i"), ir.Load("x", ref("i"), "f64")))], r"load from 'x' \(f32\) typed f64"),
    ([lanes(ir.Store("y", ref("i"), ir.Binary("add", load_x(), c(1.0, "f64"), "f32")))], "operands of add differ"),
    ([lanes(ir.Store("y", ref("i"), ir.Load("w", ref("i"), "f32")))], "read with Quant\\* nodes"),
    ([lanes(ir.Store("y", ref("i"), ir.QuantMin("x", c(0))))], "not a q4_1 buffer"),
    ([lanes(ir.Store("y", ref("i"), ir.Cast(ir.Binary("lt", load_x(), load_x(), "bool"), "f32")))], "casts from bool"),
    ([lanes(ir.Store("y", ref("i"), ir.Bitcast(ref("i"), "f32")))], "bitcast from i64"),
    ([lanes(ir.Store("y", ref("j"), load_x()))], "'j' is not a scalar in scope"),
    ([lanes(ir.Store("y", ref("i"), load_x())), lanes()], "exactly one parallel loop"),
    ([ir.Store("y", c(0), c(1.0, "f32"))], "top level holds scalar declarations"),
    ([], "exactly one parallel loop"),
    ([lanes(ir.If(ir.Binary("lt", ref("i"), c(3), "bool"), (lanes(),)))], "only at the top level"),
    ([lanes(ir.Break())], "break outside a sequential loop"),
    ([ir.Declare("t", "f32", c(0.0, "f32"), True), lanes(ir.Assign("t", load_x()))], "declared outside the parallel loop"),
    ([lanes(ir.Declare("t", "f32", load_x()), ir.Assign("t", load_x()))], "immutable 't'"),
    ([lanes(ir.Declare("i", I64, c(0)))], "'i' is declared twice"),
    ([lanes(ir.Store("y", ref("i"), c(300, "i8")))], "constant 300 is not a valid i8"),
    ([lanes(ir.Store("y", ref("i"), ir.Math("exp", (ref("i"),), I64)))], "exp on i64"),
    ([lanes(ir.For("j", I64, c(0), c(4), (), step=0))], "positive constant step"),
])
def test_broken_rules_are_reported(body, message):
    with pytest.raises(IRError, match=message):
        verify(kernel(body))


def test_symbols_must_be_bare_dimensions():
    params = (ir.BufferParam("x", "f32", (ir.Binary("mul", c(2), ref("N"), I64),), False),)
    with pytest.raises(IRError, match="symbol 'N' is not dimension 0 of buffer 'x'"):
        verify(kernel([lanes()], params, (ir.SymbolParam("N", "x", 0),)))


def test_quantized_buffers_are_never_writable():
    params = (ir.BufferParam("w", "q8_0", (c(32),), True),)
    with pytest.raises(IRError, match="quantized buffer 'w' cannot be writable"):
        verify(kernel([ir.ParallelFor((), ())], params, ()))


def motif_groups():
    checked = load_files(sorted(MOTIFS.glob("*.loom")))
    assert checked.ok
    for info in checked.modules:
        for item in info.module.items:
            if isinstance(item, ast.Kernel):
                yield item.name, checked, info, item


@pytest.mark.parametrize("optimize", [False, True], ids=["lowered", "lanes-split"])
def test_every_motif_lowers_to_verified_ir(optimize):
    names = []
    for name, checked, info, item in motif_groups():
        group = lower_kernel(checked.core, info, item, optimize=optimize)  # verifies
        assert print_group(group).startswith(f"// {group.source.path}:")
        names.append(name)
    assert {"matmul_q4_1", "paged_attention", "sample"} <= set(names)


def test_printer_shows_types_and_quantized_reads():
    for name, checked, info, item in motif_groups():
        if name == "matmul_q8_0":
            text = print_group(lower_kernel(checked.core, info, item))
    assert "kernel matmul_q8_0(x: f32[T, K], w: q8_0[N, K], out y: f32[T, N])" in text
    assert "qscale(w, " in text and "qcode(w, " in text and "var acc_lanes: f32[32]" in text
    assert "for k0: i64 in 0:i64..k_full step 32" in text  # whole blocks, constant trip
    assert "for k0_1: i64 in k_full..k_end step 32" in text  # the partial tail


def test_frozen_nodes_compare_by_value():
    a = ir.Binary("add", ref("i"), c(1), I64)
    assert a == ir.Binary("add", ref("i"), c(1), I64) and hash(a) == hash(ir.Binary("add", ref("i"), c(1), I64))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.op = "sub"
