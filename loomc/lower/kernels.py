"""Checked kernel AST -> IR `KernelGroup`: flat buffers, typed scalars, folded configs.

Called by the command compiler, `loomc emit` and the numerics tests. Configs become
literals; shape symbols become i64 parameters that the host derives from argument shapes
(`SymbolParam`) and checks before launch. Indexing turns into explicit row-major flat
index arithmetic; indexing a q4_0/q4_1/q8_0 tensor turns into block reads
(`QuantScale`/`QuantMin`/`QuantCode`) and the GGUF dequantization formula, so weights are
read from their block bytes with no dequantized copy.

Each `parallel for` becomes one IR kernel (a "part"); the kernel's top-level `let`s are
repeated in front of every part that follows them, and other top-level statements run as
a part with a single lane. Local names are made unique per kernel, because the IR (and
numba's type inference) wants one type per name.
"""

from __future__ import annotations

from pathlib import Path

from loomc.check import types as T
from loomc.check.core import Core
from loomc.check.kernels import shape_symbols, signature
from loomc.check.program import MOTIFS_DIR, ModuleInfo
from loomc.ir import module as ir
from loomc.lower.names import FreshNames
from loomc.ir.verifier import verify_group
from loomc.lower import jam, lanes
from loomc.lower.scalars import (
    UNTYPED, Binding, LoweringError, ScalarLowerer, add, const, default, dim_expr, flat_index, fold, i64, mul,
)
from loomc.syntax import ast

_COMPOUND = {"+=": "add", "-=": "sub", "*=": "mul", "/=": "div", "%=": "mod", "&=": "and", "|=": "or",
             "^=": "xor", "<<=": "shl", ">>=": "shr"}


def kernel_signature(core: Core, info: ModuleInfo, kernel: ast.Kernel):
    """Resolved argument types and, for each shape symbol, the (argument, axis) it comes from."""
    sig = signature(core, info, kernel.args, "kernel")
    sources: dict[str, tuple[str, int]] = {}
    for arg, t in sig:
        if isinstance(t, T.Tensor):
            for axis, d in enumerate(t.dims):
                s = d.bare_symbol
                if s is not None and s not in sources:
                    sources[s] = (arg.name, axis)
    for name in sorted(shape_symbols(sig)):
        if name not in sources:
            raise LoweringError(info.path, kernel.name_span,
                                f"symbol '{name}' of kernel '{kernel.name}' is never a whole dimension of an "
                                f"argument, so it cannot be derived from argument shapes")
    return sig, sources


class KernelLowerer(ScalarLowerer):
    def __init__(self, core: Core, info: ModuleInfo, kernel: ast.Kernel):
        super().__init__(core, info)
        self.kernel = kernel
        self.scopes: list[dict[str, Binding]] = [{}]
        self.used: set[str] = set()
        self.part = 0
        self.configs: dict[str, object] = {}

    # ---- names --------------------------------------------------------------------------

    def binding(self, name: str) -> Binding | None:
        for frame in reversed(self.scopes):
            if name in frame:
                return frame[name]
        return None

    def name(self, e: ast.Name) -> Binding:
        b = super().name(e)
        if b.part >= 0 and b.part != self.part:
            raise self.error(e.span, f"'{e.name}' is declared at the top level of the kernel and used in a later "
                                     "parallel loop; only top-level `let`s without tensor reads may be shared")
        if self.binding(e.name) is None and b.kind == "scalar":
            self.configs[e.name] = b.expr.value
        return b

    def fresh(self, name: str) -> str:
        return FreshNames(self.used).fresh(name)

    def bind(self, source_name: str, b: Binding) -> None:
        self.scopes[-1][source_name] = b

    # ---- kernel ---------------------------------------------------------------------------

    def run(self) -> ir.KernelGroup:
        k = self.kernel
        sig, sources = kernel_signature(self.core, self.info, k)
        params: list[ir.BufferParam | ir.ScalarParam] = []
        for arg, t in sig:
            self.used.add(arg.name)
            if isinstance(t, T.Tensor):
                dims = tuple(dim_expr(d) for d in t.dims)
                writable = arg.mode in ("out", "inout")
                params.append(ir.BufferParam(arg.name, t.dtype, dims, writable))
                self.bind(arg.name, Binding("tensor", arg.name, t.dtype, dims=dims, writable=writable))
            else:
                params.append(ir.ScalarParam(arg.name, t.name))
                self.bind(arg.name, Binding("scalar", arg.name, t.name, ir.Ref(arg.name, t.name)))
        symbols = tuple(ir.SymbolParam(name, *sources[name]) for name in sorted(sources))
        for s in symbols:
            self.used.add(s.name)
            self.bind(s.name, Binding("scalar", s.name, "i64", ir.Ref(s.name, "i64")))
        source = ir.Source(source_path(self.info), k.span.line)
        parts = self.top_level(k.body.stmts, tuple(params), symbols, source)
        return ir.KernelGroup(k.name, tuple(parts), source, tuple(sorted(self.configs.items())))

    def top_level(self, stmts, params, symbols, source) -> list[ir.Kernel]:
        """Split the body into parts: one per `parallel for`, plus single-lane parts for
        runs of other statements. Top-level `let`s are repeated in each later part."""
        prelude: list[tuple[str, ir.Declare, bool]] = []  # (source name, declaration, reads a tensor)
        parts: list[ir.Kernel] = []
        serial: list = []

        def emit(body: tuple, lanes_: tuple) -> None:
            name = self.kernel.name if not parts else f"{self.kernel.name}__{len(parts)}"
            lets = tuple(d for _, d, _ in prelude)
            parts.append(ir.Kernel(name, params, symbols, lets + (ir.ParallelFor(lanes_, body),), source))
            # a let that reads tensors is not re-evaluated after a part that could write them
            for source_name, _, reads in prelude:
                if reads:
                    self.mark_top_level(source_name)
            prelude[:] = [entry for entry in prelude if not entry[2]]
            self.part += 1

        self.scopes.append({})
        for s in stmts:
            if isinstance(s, ast.ParallelFor):
                if serial:
                    emit(tuple(serial), ())
                    serial = []
                lanes_, body = self.parallel(s)
                emit(body, lanes_)
            elif isinstance(s, ast.Let) and not serial:
                decl = self.stmt_let(s)[0]
                prelude.append((s.name, decl, _reads_tensor(decl.value)))
            else:
                serial += self.stmt(s)
                if isinstance(s, (ast.Let, ast.Var)):
                    self.mark_top_level(s.name)
        if serial or not parts:
            emit(tuple(serial), ())
        self.scopes.pop()
        return parts

    def mark_top_level(self, source_name: str) -> None:
        """A top-level local that belongs to the current part only."""
        b = self.scopes[-1][source_name]
        self.scopes[-1][source_name] = Binding(b.kind, b.name, b.dtype, b.expr, b.dims, b.mutable, b.writable,
                                               self.part)

    def parallel(self, s: ast.ParallelFor):
        self.scopes.append({})
        lanes_: list[ir.Lane] = []
        for b in s.binds:
            t = self.bound_type(b.start, b.end)
            var = self.fresh(b.var)
            lanes_.append(ir.Lane(var, t, self.lower(b.start, t), self.lower(b.end, t)))
        for b, lane in zip(s.binds, lanes_):
            self.bind(b.var, Binding("scalar", lane.var, lane.dtype, ir.Ref(lane.var, lane.dtype)))
        body = self.block(s.body)
        self.scopes.pop()
        return tuple(lanes_), body

    def bound_type(self, start: ast.Expr, end: ast.Expr) -> str:
        a, b = self.typeof(start), self.typeof(end)
        return default(b if a in UNTYPED else a)

    # ---- statements ---------------------------------------------------------------------

    def block(self, b: ast.Block) -> tuple:
        self.scopes.append({})
        out: list = []
        for s in b.stmts:
            out += self.stmt(s)
        self.scopes.pop()
        return tuple(out)

    def stmt(self, s) -> list:
        method = getattr(self, "stmt_" + type(s).__name__.lower(), None)
        if method is None:
            raise self.error(s.span, f"{type(s).__name__} cannot be lowered in a kernel")
        return method(s)

    def scalar_type(self, t: ast.TypeRef | None, value: ast.Expr | None) -> str:
        if t is not None:
            return t.name
        return default(self.typeof(value))

    def stmt_let(self, s: ast.Let) -> list:
        t = self.scalar_type(s.type, s.value)
        value = self.lower(s.value, t)
        name = self.fresh(s.name)
        self.bind(s.name, Binding("scalar", name, t, ir.Ref(name, t)))
        return [ir.Declare(name, t, value, False)]

    def stmt_var(self, s: ast.Var) -> list:
        if isinstance(s.type, ast.TensorTypeRef):
            tensor = self.core.tensor_type(self.info, s.type, None)
            dims = tuple(d.constant for d in tensor.dims)
            size = 1
            for d in dims:
                size *= d
            name = self.fresh(s.name)
            self.bind(s.name, Binding("array", name, tensor.dtype, dims=dims, writable=True))
            return [ir.LocalArray(name, tensor.dtype, size)]
        t = self.scalar_type(s.type, s.value)
        value = self.lower(s.value, t) if s.value is not None else const(t, 0)
        name = self.fresh(s.name)
        self.bind(s.name, Binding("scalar", name, t, ir.Ref(name, t), mutable=True))
        return [ir.Declare(name, t, value, True)]

    def stmt_assign(self, s: ast.Assign) -> list:
        target = s.target
        if isinstance(target, ast.Name):
            b = self.name(target)
            current: ir.Expr = b.expr
            t = b.dtype
        else:
            buf, index, t = self.element(target)
            current = ir.Load(buf, index, t)
        if s.op == "=":
            value = self.lower(s.value, t)
        else:
            op = _COMPOUND[s.op]
            rhs = self.lower(s.value, t if op not in ("shl", "shr") or self.typeof(s.value) in UNTYPED else None)
            if rhs.dtype != t:
                rhs = fold(ir.Cast(rhs, t))
            value = ir.Binary(op, current, rhs, t)
        if isinstance(target, ast.Name):
            return [ir.Assign(b.name, value)]
        return [ir.Store(buf, index, value)]

    def stmt_if(self, s: ast.If) -> list:
        cond = self.lower(s.cond, "bool")
        then = self.block(s.then)
        if isinstance(s.orelse, ast.If):
            orelse = tuple(self.stmt_if(s.orelse))
        elif isinstance(s.orelse, ast.Block):
            orelse = self.block(s.orelse)
        else:
            orelse = ()
        return [ir.If(cond, then, orelse)]

    def stmt_for(self, s: ast.For) -> list:
        t = self.bound_type(s.start, s.end)
        start, end = self.lower(s.start, t), self.lower(s.end, t)
        self.scopes.append({})
        var = self.fresh(s.var)
        self.bind(s.var, Binding("scalar", var, t, ir.Ref(var, t)))
        body = self.block(s.body)
        self.scopes.pop()
        return [ir.For(var, t, start, end, body)]

    def stmt_while(self, s: ast.While) -> list:
        return [ir.While(self.lower(s.cond, "bool"), self.block(s.body))]

    def stmt_break(self, s) -> list:
        return [ir.Break()]

    def stmt_continue(self, s) -> list:
        return [ir.Continue()]

    def stmt_parallelfor(self, s) -> list:
        raise self.error(s.span, "`parallel for` must be a top-level statement of its kernel")

    # ---- indexing ---------------------------------------------------------------------------

    def element(self, e: ast.Index) -> tuple[str, ir.Expr, str]:
        """(buffer, flat index, dtype) of a typed tensor or local array element."""
        b = self.name(e.base)
        indices = [self.index_value(i) for i in e.indices]
        if b.kind == "array":
            return b.name, flat_index(indices, tuple(i64(d) for d in b.dims)), b.dtype
        return b.name, flat_index(indices, b.dims), b.dtype

    def lower_index(self, e: ast.Index, t: str) -> ir.Expr:
        b = self.name(e.base)
        if b.dtype not in ir.QUANT_DTYPES:
            buf, index, dtype = self.element(e)
            return ir.Load(buf, index, dtype)
        indices = [self.index_value(i) for i in e.indices]
        k = indices[-1]
        blocks_per_row = fold(ir.Binary("shr", b.dims[-1], i64(5), "i64"))  # dims are positive: / 32
        in_row = ir.Binary("shr", k, i64(5), "i64")
        block = add(mul(flat_index(indices[:-1], b.dims[:-1]), blocks_per_row), in_row) if len(indices) > 1 else in_row
        return dequantize(b.name, b.dtype, block, ir.Binary("and", ir.Binary("shr", k, i64(4), "i64"), i64(1), "i64"),
                          ir.Binary("and", k, i64(15), "i64"))


def dequantize(buf: str, qtype: str, block: ir.Expr, sub: ir.Expr, lane: ir.Expr) -> ir.Expr:
    """GGUF dequantization of one element (ggml's dequantize_row_*): q4_0 d*(q-8),
    q4_1 d*q+m, q8_0 d*q, with d (and m) the block's f16 scale (and min) as f32."""
    d = ir.QuantScale(buf, block)
    code = ir.QuantCode(buf, block, sub, lane)
    if qtype == "q4_0":
        return ir.Binary("mul", d, ir.Cast(ir.Binary("sub", code, ir.Const("i32", 8), "i32"), "f32"), "f32")
    value = ir.Binary("mul", d, ir.Cast(code, "f32"), "f32")
    if qtype == "q4_1":
        return ir.Binary("add", value, ir.QuantMin(buf, block), "f32")
    return value


def source_path(info: ModuleInfo) -> str:
    """The path a generated file names: motifs as `loomc/motifs/NAME.loom` wherever the
    compiler runs from (so their generated text, and its hash, do not depend on the cwd)."""
    key = Path(info.key)
    if key.parent == MOTIFS_DIR:
        return f"loomc/motifs/{key.name}"
    return info.path


def _reads_tensor(e: ir.Expr) -> bool:
    if isinstance(e, (ir.Load, ir.QuantScale, ir.QuantMin, ir.QuantCode)):
        return True
    return any(_reads_tensor(c) for c in ir.children(e))


def lower_kernel(core: Core, info: ModuleInfo, kernel: ast.Kernel, optimize: bool = True) -> ir.KernelGroup:
    """Lower one checked kernel. `optimize` applies the target-neutral IR passes
    (`jam.jam_group`, then `lanes.split_group`); the IR is verified after each."""
    group = KernelLowerer(core, info, kernel).run()
    verify_group(group)
    if optimize:
        group = jam.jam_group(group)
        verify_group(group)
        group = lanes.split_group(group)
        verify_group(group)
    return group
