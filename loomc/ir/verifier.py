"""Well-formedness of lowered kernels: the rules every pass must preserve.

`verify(kernel)` raises `IRError` naming the first broken rule; tests run it after
lowering and after every IR-to-IR pass (STYLE habit 2). The rules:

- every dtype is known and every node's operands have the types its op requires;
- every `Ref` names a scalar in scope (parameter, symbol, loop/lane variable, local)
  with the same dtype; declarations never reuse a name within one kernel;
- `Load` reads a typed buffer or local array of the node's dtype; quantized buffers are
  read only through `QuantScale`/`QuantMin`/`QuantCode` (and `QuantMin` only on q4_1);
  `Store` targets a writable buffer or a local array; indices are i64;
- `Assign` targets a mutable local of the same lane (a lane never writes a scalar that
  another lane can see);
- `break`/`continue` sit inside a sequential loop of the same lane;
- the kernel body is scalar declarations followed by exactly one `ParallelFor`, and no
  `ParallelFor` appears anywhere else;
- buffer dimensions are i64 expressions over constants and symbols, and each symbol is
  the bare dimension `axis` of the buffer it is derived from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loomc.dtypes import DTYPES
from loomc.ir import module as ir


class IRError(Exception):
    """A broken well-formedness rule; the message names the kernel and the node."""


@dataclass
class _Scope:
    scalars: list[dict[str, tuple[str, bool]]] = field(default_factory=lambda: [{}])  # name -> (dtype, mutable)
    arrays: list[dict[str, str]] = field(default_factory=lambda: [{}])  # local arrays: name -> dtype

    def push(self) -> None:
        self.scalars.append({})
        self.arrays.append({})

    def pop(self) -> None:
        self.scalars.pop()
        self.arrays.pop()

    def scalar(self, name: str) -> tuple[str, bool, int] | None:
        for depth in range(len(self.scalars) - 1, -1, -1):
            if name in self.scalars[depth]:
                dtype, mutable = self.scalars[depth][name]
                return dtype, mutable, depth
        return None

    def array(self, name: str) -> str | None:
        for frame in reversed(self.arrays):
            if name in frame:
                return frame[name]
        return None


class _Verifier:
    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.buffers: dict[str, ir.BufferParam] = {}
        self.scope = _Scope()
        self.declared: set[str] = set()
        self.loop_depth = 0
        self.in_lane = False
        self.lane_frame = 0

    def fail(self, message: str) -> None:
        raise IRError(f"kernel {self.kernel.name}: {message}")

    # ---- kernel -------------------------------------------------------------------------

    def run(self) -> None:
        k = self.kernel
        names: set[str] = set()
        for p in k.params:
            if p.name in names:
                self.fail(f"parameter '{p.name}' is declared twice")
            names.add(p.name)
            if isinstance(p, ir.BufferParam):
                if p.dtype not in ir.DTYPES and p.dtype not in ir.QUANT_DTYPES:
                    self.fail(f"buffer '{p.name}' has unknown dtype {p.dtype}")
                if not p.dims:
                    self.fail(f"buffer '{p.name}' has no dimensions")
                if p.dtype in ir.QUANT_DTYPES and p.writable:
                    self.fail(f"quantized buffer '{p.name}' cannot be writable")
                self.buffers[p.name] = p
            elif isinstance(p, ir.ScalarParam):
                self.check_dtype(p.dtype, p)
                self.declare(p.name, p.dtype, False)
            else:
                self.fail(f"unknown parameter kind {type(p).__name__}")
        for s in k.symbols:
            if s.name in names:
                self.fail(f"symbol '{s.name}' clashes with a parameter")
            names.add(s.name)
            self.declare(s.name, "i64", False)
        for s in k.symbols:
            buf = self.buffers.get(s.buffer)
            if buf is None or not 0 <= s.axis < len(buf.dims) or buf.dims[s.axis] != ir.Ref(s.name, "i64"):
                self.fail(f"symbol '{s.name}' is not dimension {s.axis} of buffer '{s.buffer}'")
        symbol_names = {s.name for s in k.symbols}
        for buf in self.buffers.values():
            for d in buf.dims:
                self.check_dim(d, symbol_names, buf.name)
        seen_parallel = False
        for stmt in k.body:
            if isinstance(stmt, ir.ParallelFor):
                if seen_parallel:
                    self.fail("a kernel has exactly one parallel loop")
                seen_parallel = True
                self.parallel(stmt)
            elif isinstance(stmt, ir.Declare) and not seen_parallel:
                self.stmt(stmt)
            else:
                self.fail(f"top level holds scalar declarations and then one parallel loop, found {type(stmt).__name__}")
        if not seen_parallel:
            self.fail("a kernel has exactly one parallel loop")

    def check_dim(self, d: ir.Expr, symbols: set[str], buf: str) -> None:
        if d.dtype != "i64":
            self.fail(f"dimension of '{buf}' must be i64, got {d.dtype}")
        if isinstance(d, ir.Ref) and d.name not in symbols:
            self.fail(f"dimension of '{buf}' uses '{d.name}', which is not a symbol")
        if not isinstance(d, (ir.Const, ir.Ref, ir.Binary)):
            self.fail(f"dimension of '{buf}' may use constants, symbols and arithmetic only")
        for c in ir.children(d):
            self.check_dim(c, symbols, buf)

    def check_dtype(self, dtype: str, node) -> None:
        if dtype not in ir.DTYPES:
            self.fail(f"unknown dtype {dtype!r} in {node!r}")

    def declare(self, name: str, dtype: str, mutable: bool) -> None:
        if name in self.declared:
            self.fail(f"'{name}' is declared twice")
        self.declared.add(name)
        self.scope.scalars[-1][name] = (dtype, mutable)

    # ---- statements ---------------------------------------------------------------------

    def block(self, stmts: tuple) -> None:
        self.scope.push()
        for s in stmts:
            self.stmt(s)
        self.scope.pop()

    def parallel(self, p: ir.ParallelFor) -> None:
        self.scope.push()
        for lane in p.lanes:
            if not ir.is_int(lane.dtype):
                self.fail(f"lane variable '{lane.var}' must be an integer, got {lane.dtype}")
            self.expect(lane.start, lane.dtype, f"start of lane '{lane.var}'")
            self.expect(lane.end, lane.dtype, f"end of lane '{lane.var}'")
        for lane in p.lanes:
            self.declare(lane.var, lane.dtype, False)
        self.in_lane = True
        self.lane_frame = len(self.scope.scalars) - 1
        self.block(p.body)
        self.in_lane = False
        self.scope.pop()

    def stmt(self, s) -> None:
        if isinstance(s, ir.Declare):
            self.check_dtype(s.dtype, s)
            self.expect(s.value, s.dtype, f"value of '{s.name}'")
            self.declare(s.name, s.dtype, s.mutable)
        elif isinstance(s, ir.Assign):
            found = self.scope.scalar(s.name)
            if found is None:
                self.fail(f"assignment to undeclared '{s.name}'")
            dtype, mutable, depth = found
            if not mutable:
                self.fail(f"assignment to immutable '{s.name}'")
            if self.in_lane and depth < self.lane_frame + 1:
                self.fail(f"a lane assigns '{s.name}', which is declared outside the parallel loop")
            self.expect(s.value, dtype, f"value assigned to '{s.name}'")
        elif isinstance(s, ir.LocalArray):
            self.check_dtype(s.dtype, s)
            if not isinstance(s.size, int) or s.size <= 0:
                self.fail(f"local array '{s.name}' needs a positive constant size")
            if s.name in self.declared or s.name in self.buffers:
                self.fail(f"'{s.name}' is declared twice")
            self.declared.add(s.name)
            self.scope.arrays[-1][s.name] = s.dtype
        elif isinstance(s, ir.Store):
            dtype = self.scope.array(s.buf)
            if dtype is None:
                buf = self.buffers.get(s.buf)
                if buf is None:
                    self.fail(f"store to unknown buffer '{s.buf}'")
                if buf.dtype in ir.QUANT_DTYPES:
                    self.fail(f"store to quantized buffer '{s.buf}'")
                if not buf.writable:
                    self.fail(f"store to read-only buffer '{s.buf}'")
                dtype = buf.dtype
            self.expect(s.index, "i64", f"index into '{s.buf}'")
            self.expect(s.value, dtype, f"value stored to '{s.buf}'")
        elif isinstance(s, ir.For):
            if not ir.is_int(s.dtype):
                self.fail(f"loop variable '{s.var}' must be an integer, got {s.dtype}")
            if not isinstance(s.step, int) or s.step <= 0:
                self.fail(f"loop '{s.var}' needs a positive constant step")
            self.expect(s.start, s.dtype, f"start of loop '{s.var}'")
            self.expect(s.end, s.dtype, f"end of loop '{s.var}'")
            self.scope.push()
            self.declare(s.var, s.dtype, False)
            self.loop_depth += 1
            self.block(s.body)
            self.loop_depth -= 1
            self.scope.pop()
        elif isinstance(s, ir.While):
            self.expect(s.cond, "bool", "while condition")
            self.loop_depth += 1
            self.block(s.body)
            self.loop_depth -= 1
        elif isinstance(s, ir.If):
            self.expect(s.cond, "bool", "if condition")
            self.block(s.then)
            self.block(s.orelse)
        elif isinstance(s, (ir.Break, ir.Continue)):
            if not self.loop_depth:
                self.fail(f"{type(s).__name__.lower()} outside a sequential loop")
        elif isinstance(s, ir.ParallelFor):
            self.fail("a parallel loop may appear only at the top level of a kernel")
        else:
            self.fail(f"unknown statement {type(s).__name__}")

    # ---- expressions --------------------------------------------------------------------

    def expect(self, e, dtype: str, what: str) -> None:
        got = self.expr(e)
        if got != dtype:
            self.fail(f"{what} has type {got}, expected {dtype}: {e!r}")

    def expr(self, e) -> str:
        if not isinstance(e, ir.EXPR_KINDS):
            self.fail(f"unknown expression {e!r}")
        method = getattr(self, "expr_" + type(e).__name__.lower())
        method(e)
        return e.dtype

    def expr_const(self, e: ir.Const) -> None:
        self.check_dtype(e.dtype, e)
        v = e.value
        if e.dtype == "bool":
            ok = isinstance(v, bool)
        elif ir.is_int(e.dtype):
            lo, hi = DTYPES[e.dtype].range
            ok = isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
        else:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not ok:
            self.fail(f"constant {v!r} is not a valid {e.dtype}")

    def expr_ref(self, e: ir.Ref) -> None:
        found = self.scope.scalar(e.name)
        if found is None:
            self.fail(f"'{e.name}' is not a scalar in scope")
        if found[0] != e.dtype:
            self.fail(f"'{e.name}' has type {found[0]}, referenced as {e.dtype}")

    def expr_unary(self, e: ir.Unary) -> None:
        t = self.expr(e.x)
        ok = {"neg": t != "bool" and t == e.dtype, "not": t == "bool" == e.dtype,
              "invert": ir.is_int(t) and t == e.dtype}.get(e.op, False)
        if not ok:
            self.fail(f"unary {e.op} on {t} giving {e.dtype}")

    def expr_binary(self, e: ir.Binary) -> None:
        a, b = self.expr(e.a), self.expr(e.b)
        if a != b:
            self.fail(f"operands of {e.op} differ: {a} and {b}")
        if e.op in ir.ARITH_OPS:
            ok = a != "bool" and e.dtype == a
        elif e.op in ir.BIT_OPS:
            ok = ir.is_int(a) and e.dtype == a
        elif e.op in ir.COMPARE_OPS:
            ok = e.dtype == "bool"
        elif e.op in ir.LOGIC_OPS:
            ok = a == "bool" and e.dtype == "bool"
        else:
            ok = False
        if not ok:
            self.fail(f"binary {e.op} on {a} giving {e.dtype}")

    def expr_select(self, e: ir.Select) -> None:
        self.expect(e.cond, "bool", "select condition")
        a, b = self.expr(e.a), self.expr(e.b)
        if not a == b == e.dtype:
            self.fail(f"select of {a} and {b} giving {e.dtype}")

    def expr_math(self, e: ir.Math) -> None:
        spec = ir.MATH_FNS.get(e.fn)
        if spec is None:
            self.fail(f"unknown math function {e.fn}")
        arity, kind = spec
        if len(e.args) != arity:
            self.fail(f"{e.fn} takes {arity} arguments, got {len(e.args)}")
        types = {self.expr(a) for a in e.args}
        if len(types) != 1:
            self.fail(f"operands of {e.fn} differ: {sorted(types)}")
        t = types.pop()
        if kind == "float":
            ok = ir.is_float(t) and e.dtype == t
        elif kind == "number":
            ok = t != "bool" and e.dtype == t
        else:
            ok = ir.is_float(t) and e.dtype == "bool"
        if not ok:
            self.fail(f"{e.fn} on {t} giving {e.dtype}")

    def expr_cast(self, e: ir.Cast) -> None:
        t = self.expr(e.x)
        self.check_dtype(e.dtype, e)
        if t == "bool":
            self.fail("casts from bool do not exist; use a select")

    def expr_bitcast(self, e: ir.Bitcast) -> None:
        t = self.expr(e.x)
        self.check_dtype(e.dtype, e)
        if ir.BITS[t] != ir.BITS[e.dtype]:
            self.fail(f"bitcast from {t} ({ir.BITS[t]} bits) to {e.dtype} ({ir.BITS[e.dtype]} bits)")

    def expr_load(self, e: ir.Load) -> None:
        dtype = self.scope.array(e.buf)
        if dtype is None:
            buf = self.buffers.get(e.buf)
            if buf is None:
                self.fail(f"load from unknown buffer '{e.buf}'")
            if buf.dtype in ir.QUANT_DTYPES:
                self.fail(f"quantized buffer '{e.buf}' is read with Quant* nodes, not Load")
            dtype = buf.dtype
        if dtype != e.dtype:
            self.fail(f"load from '{e.buf}' ({dtype}) typed {e.dtype}")
        self.expect(e.index, "i64", f"index into '{e.buf}'")

    def quant(self, e, what: str, only: tuple[str, ...] = ir.QUANT_DTYPES) -> None:
        buf = self.buffers.get(e.buf)
        if buf is None or buf.dtype not in only:
            self.fail(f"{what} reads '{e.buf}', which is not a {'/'.join(only)} buffer")

    def expr_quantscale(self, e: ir.QuantScale) -> None:
        self.quant(e, "QuantScale")
        self.expect(e.block, "i64", "block index")
        if e.dtype != "f32":
            self.fail("QuantScale yields f32")

    def expr_quantmin(self, e: ir.QuantMin) -> None:
        self.quant(e, "QuantMin", ("q4_1",))
        self.expect(e.block, "i64", "block index")
        if e.dtype != "f32":
            self.fail("QuantMin yields f32")

    def expr_quantcode(self, e: ir.QuantCode) -> None:
        self.quant(e, "QuantCode")
        for part, name in ((e.block, "block"), (e.sub, "sub"), (e.lane, "lane")):
            self.expect(part, "i64", f"{name} index")
        if e.dtype != "i32":
            self.fail("QuantCode yields i32")


def verify(kernel: ir.Kernel) -> None:
    """Raise IRError if `kernel` breaks a rule of this module's docstring."""
    _Verifier(kernel).run()


def verify_group(group: ir.KernelGroup) -> None:
    for part in group.parts:
        verify(part)
