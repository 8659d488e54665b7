"""IR -> Python source for numba (`cpu` target), written to a content-addressed file and imported.

One generated module per `.loom` kernel (`render_module`), headed by comments naming the
source file and line. `load_group` writes it to
`<cache_dir>/kernels/k_<sha256(text + LOOMC_VERSION + numba version)[:16]>.py`
(`loomc.files.write_atomically`), imports it with importlib and returns one numba dispatcher per part.
Each function is `@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")`:
numba's disk cache sits in `__pycache__` beside the file, so a restart (or the next test
in a session) does not recompile. `error_model="numpy"` makes integer and float division
by zero produce a value instead of raising, so no lane body contains a raise and the
parallel loop stays a prange.

The renderer is a table keyed by IR node kind (`_Renderer.expr_*`/`stmt_*`), like
tinygrad's renderers. What is numba-specific lives only here:

- numba widens integer ops on narrow types (i32 + i32 is i64) and reads untyped literals
  as i64/f64, so every literal is wrapped in its numpy type and every narrow integer
  result is converted back (`np.int32(a + b)`), which is also how wrapping is made exact;
- buffer indices are cast to uint64, which skips numba's negative-index wraparound
  (measured 3x on dot products: the select blocks vectorization);
- f16/bf16 have no numba CPU type: values live in f32 (exactly representable), every op
  rounds back through the bits, and buffers of them are uint16 arrays;
- local arrays are stack buffers (`_lm_alloca`) zeroed on declaration, not heap arrays;
- quantized blocks are read from the uint8 GGUF bytes: the f16 scale by a branch-free
  bit conversion (`_lm_half_at`), codes by a byte load, shift and mask. Nothing is
  precomputed at weight preparation (a per-block f32 scale table measured at most ~10%
  faster and would cost 8 bytes per 32 weights: +40% on q4_1).

The helpers (`_lm_*`) live in `numba_helpers.py` and are copied into each module.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import sys
from pathlib import Path

import numpy as np

from loomc import LOOMC_VERSION
from loomc.dtypes import DTYPES, numpy_type
from loomc.files import default_cache_dir, sealed, unsealed, write_atomically
from loomc.ir import module as ir
from loomc.lower.lanes import refs
from loomc.lower.render import TargetRenderer
from loomc.ir.interpret import to_dtype
from loomc.lower.numba_helpers import IMPORTS, helpers_for
from loomc.lower.numba_threads import use_openmp
from loomc.lower.scalars import add, mul

use_openmp()   # before numba's first parallel launch: its threading layer is chosen once

LIGHT_CHUNK = 64  # elements of the last parallel dimension per lane when the body has no loop
# A light parallel loop (a body without loops) of at most this many chunks (16384 elements) runs
# serially. At 4096 (64 chunks) an 8-row step of scout opened a region for SwiGLU (12288
# elements: 6.9 us serially, 6.5 us on 2 threads when the worker wakes at once and 13.6 us when
# it does not), the residual add and the gather of the last rows (4608: 8.6 and 15.4 us in
# parallel, 3.2 and 4.7 serially); the step took 2-3 % less at 16384 (docs/performance.md).
# That was on TBB, whose launches cost more; on OpenMP SwiGLU takes 6.9 us in parallel, 7.1
# serially, the residual add 4.6 and 2.6.
SERIAL_LIGHT_CHUNKS = 256
# A heavy parallel loop (a body with loops) whose lanes' loops, counted before it starts, make
# at most this many iterations in all runs serially. Opening a parallel region from a launch
# cost about 4 us on the Zen 5 machine under TBB (1-2 us under OpenMP now): residual_rmsnorm
# over 576 features took 7.7-14.7 us serially from 2 to 64 rows against 11.7-22.0 us in
# parallel; 16384 leaves room for bodies that run a few cycles per iteration rather than a
# fraction of one.
SERIAL_HEAVY_WORK = 16384
STACK_ARRAY_BYTES = 65536  # larger local arrays go to the heap

# The numpy type each dtype computes in, as source text (f16/bf16 live in float32).
NP_TYPE = {t: f"np.{d.compute}" for t, d in DTYPES.items() if d.compute}
# The element type of a buffer a kernel indexes (f16/bf16 as their bits, quantized tensors as
# GGUF bytes): the `kernel` storage, not the host array's dtype (`loomc.run.launch.HOST_STORAGE`).
KERNEL_STORAGE = {t: numpy_type(d.kernel) for t, d in DTYPES.items()}
KERNEL_STORAGE_TEXT = {t: f"np.{d.kernel}" for t, d in DTYPES.items()}
_HALF = ("f16", "bf16")
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "and": "&", "or": "|", "xor": "^", "shl": "<<",
          "shr": ">>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_MATH = {"exp": "_lm_exp({0})", "exp2": "np.exp2({0})", "log": "math.log({0})", "log2": "math.log2({0})",
         "sqrt": "math.sqrt({0})", "tanh": "math.tanh({0})", "erf": "math.erf({0})", "sin": "math.sin({0})",
         "cos": "math.cos({0})", "floor": "np.floor({0})", "ceil": "np.ceil({0})", "pow": "math.pow({0}, {1})",
         "fma": "_lm_fma({0}, {1}, {2})", "rsqrt": "({one} / math.sqrt({0}))",
         "sigmoid": "({one} / ({one} + _lm_exp(-{0})))", "isnan": "math.isnan({0})", "isinf": "math.isinf({0})",
         "min": "_lm_min({0}, {1})", "max": "_lm_max({0}, {1})"}


def var(name: str) -> str:
    """User names get a prefix so that no `.loom` name can meet a Python keyword or a helper."""
    return "v_" + name


def function_name(kernel: ir.Kernel) -> str:
    return "k_" + kernel.name


# ---- the renderer: one method per IR node kind -------------------------------------------------------

def _wrap(text: str, dtype: str) -> str:
    """Convert numba's widened integer result back to `dtype` (the conversion wraps)."""
    return text if dtype in ("i64", "u64", "bool") or ir.is_float(dtype) else f"{NP_TYPE[dtype]}({text})"


def _round(text: str, dtype: str) -> str:
    return f"_lm_round_{dtype}({text})" if dtype in _HALF else text


def _unrounded(text: str, dtype: str) -> str:
    """`text` without an outermost `_lm_round_{dtype}(...)`: a store takes a half value's bits,
    and the bits of a value rounded to the half type are the bits of the value (rounding twice
    is rounding once, NaN included), so a stored conversion is not converted back and forth
    (the scalar helpers' branches kept a cache write out of vector code)."""
    head = f"_lm_round_{dtype}("
    if not (text.startswith(head) and text.endswith(")")):
        return text
    depth = 0
    for i in range(len(head) - 1, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[len(head):-1] if i == len(text) - 1 else text
    return text


def const(dtype: str, value) -> str:
    if dtype == "bool":
        return "True" if value else "False"
    if ir.is_int(dtype):
        if dtype == "i64" and value == -(2 ** 63):
            return "np.int64(-9223372036854775807 - 1)"
        return f"{NP_TYPE[dtype]}({int(value)})"
    if dtype in _HALF:
        value = float(to_dtype(value, dtype))
    v = float(np.float32(value)) if dtype != "f64" else float(value)
    if v != v:
        text = "np.nan"
    elif v in (float("inf"), float("-inf")):
        text = "np.inf" if v > 0 else "-np.inf"
    else:
        text = repr(v)
    return f"{NP_TYPE[dtype]}({text})"


def _fold_width(s: ir.For) -> int | None:
    """W when `s` is `for z in 0..W { a[z] = a[z] + a[z + W] }` with a constant W: the
    level of a pairwise tree (`lanes.py`). Its W adds are independent (they read a[0..2W)
    and write a[0..W)), so `_lm_fold` runs them as one vector add."""
    if not (isinstance(s.start, ir.Const) and s.start.value == 0 and isinstance(s.end, ir.Const)
            and s.step == 1 and len(s.body) == 1 and isinstance(s.body[0], ir.Store)):
        return None
    width, store, z = int(s.end.value), s.body[0], ir.Ref(s.var, s.dtype)
    value = store.value
    if width < 1 or store.index != z or not isinstance(value, ir.Binary) or value.op != "add":
        return None
    here = ir.Load(store.buf, z, value.dtype)
    there = ir.Load(store.buf, ir.Binary("add", z, ir.Const(s.dtype, width), s.dtype), value.dtype)
    return width if (value.a, value.b) == (here, there) else None


def _loop_work(body: tuple, outside: set[str], extent) -> list[str]:
    """The iterations of a lane's loops as terms of a sum, each loop's trip count times those
    of the loops inside it, for the loops whose bounds are known before the parallel loop
    starts (they read only names in `outside`; `extent` renders a loop's trip count): the work
    of a lane as far as it can be told beforehand."""
    terms = []
    for s in body:
        if isinstance(s, ir.For) and refs(s.start) | refs(s.end) <= outside:
            inner = _loop_work(s.body, outside, extent)
            terms.append(extent(s) + (f" * ({' + '.join(inner)})" if inner else ""))
        elif isinstance(s, ir.If):
            terms += _loop_work(s.then, outside, extent) + _loop_work(s.orelse, outside, extent)
    return terms


def _has_loop(body: tuple) -> bool:
    for s in body:
        if isinstance(s, (ir.For, ir.While)):
            return True
        if isinstance(s, ir.If) and (_has_loop(s.then) or _has_loop(s.orelse)):
            return True
    return False


class _Renderer(TargetRenderer):
    """Renders one IR kernel. `expr_*`/`stmt_*` methods are the table keyed by node kind."""

    temp_prefix = "_"
    const = staticmethod(const)
    var = staticmethod(var)

    def __init__(self, kernel: ir.Kernel | None = None):
        super().__init__(kernel)
        self.float_locals: dict[str, int] = {}  # f32/f64 local arrays -> their size

    # ---- expressions ------------------------------------------------------------------------

    def expr_unary(self, e: ir.Unary) -> str:
        x = self.expr(e.x)
        if e.op == "not":
            return f"(not {x})"
        if e.op == "invert":
            return f"{NP_TYPE[e.dtype]}(~{x})"
        if ir.is_unsigned(e.dtype):
            return _wrap(f"(np.uint64(0) - {x})", e.dtype)
        return _wrap(f"(-{x})", e.dtype)

    def expr_binary(self, e: ir.Binary) -> str:
        a, b, t, op = self.expr(e.a), self.expr(e.b), e.a.dtype, e.op
        if op == "land":
            return f"({a} and {b})"
        if op == "lor":
            return f"({a} or {b})"
        if op in ir.COMPARE_OPS:
            return f"({a} {_INFIX[op]} {b})"
        if ir.is_float(t):
            return _round(f"np.fmod({a}, {b})" if op == "mod" else f"({a} {_INFIX[op]} {b})", t)
        if op == "div":
            text = f"({a} // {b})" if ir.is_unsigned(t) else f"_lm_sdiv({a}, {b})"
        elif op == "mod":
            text = f"({a} % {b})" if ir.is_unsigned(t) else f"_lm_smod({a}, {b})"
        else:
            text = f"({a} {_INFIX[op]} {b})"
        return _wrap(text, t)

    def expr_select(self, e: ir.Select) -> str:
        return f"({self.expr(e.a)} if {self.expr(e.cond)} else {self.expr(e.b)})"

    def expr_math(self, e: ir.Math) -> str:
        args = [self.expr(a) for a in e.args]
        t = e.args[0].dtype
        if e.fn == "abs":
            if ir.is_unsigned(t):
                return args[0]
            return _wrap(f"abs({args[0]})", t)
        text = _MATH[e.fn].format(*args, one=const("f64" if t == "f64" else "f32", 1.0))
        return text if e.fn in ("min", "max", "isnan", "isinf") else _round(text, t)

    def expr_cast(self, e: ir.Cast) -> str:
        x, src, dst = self.expr(e.x), e.x.dtype, e.dtype
        if dst == "bool":
            return f"({x} != {const(src, 0)})"
        if dst in _HALF:
            # f64 -> f16 rounds once (as interpret and CUDA do); f64 -> bf16 goes through f32 on every target
            narrow = f"_lm_f32_odd({x})" if (src, dst) == ("f64", "f16") else f"np.float32({x})"
            return f"_lm_round_{dst}({narrow})"
        return f"{NP_TYPE[dst]}({x})"

    def expr_bitcast(self, e: ir.Bitcast) -> str:
        x, src, dst = self.expr(e.x), e.x.dtype, e.dtype
        if src == "bool":
            return "np.uint8({x})".format(x=x) if dst == "u8" else f"np.uint8({x}).view({NP_TYPE[dst]})"
        if dst == "bool":
            return f"({x} != {const(src, 0)})"
        if src in _HALF:
            bits = f"_lm_{src}_bits({x})"
            if dst == "u16":
                return bits
            return f"np.uint16({bits}).view(np.int16)" if dst == "i16" else f"_lm_{dst}_from_bits({bits})"
        if dst in _HALF:
            return f"_lm_{dst}_from_bits({x})"
        return f"{NP_TYPE[src]}({x}).view({NP_TYPE[dst]})"  # numba views only np.<type>(...) calls

    def i64(self, e: ir.Expr) -> str:
        return self.expr(e) if e.dtype == "i64" else f"np.int64({self.expr(e)})"

    def index(self, e: ir.Expr) -> str:
        return f"np.uint64({self.expr(e)})"

    def expr_load(self, e: ir.Load) -> str:
        text = f"{var(e.buf)}[{self.index(e.index)}]"
        return f"_lm_{e.dtype}_from_bits({text})" if e.dtype in _HALF else text

    def block_byte(self, buf: str, block: ir.Expr, offset: ir.Expr) -> str:
        return self.expr(add(mul(block, ir.Const("i64", ir.QUANT_BLOCK_BYTES[self.quant[buf]])), offset))

    def expr_quantscale(self, e: ir.QuantScale) -> str:
        return f"_lm_half_at({var(e.buf)}, {self.block_byte(e.buf, e.block, ir.Const('i64', 0))})"

    def expr_quantmin(self, e: ir.QuantMin) -> str:
        return f"_lm_half_at({var(e.buf)}, {self.block_byte(e.buf, e.block, ir.Const('i64', 2))})"

    def expr_quantcode(self, e: ir.QuantCode) -> str:
        qtype = self.quant[e.buf]
        codes = ir.Const("i64", ir.QUANT_CODES_OFFSET[qtype])
        if qtype == "q8_0":
            within = add(codes, add(mul(e.sub, ir.Const("i64", 16)), e.lane))
            return f"_lm_q8({var(e.buf)}, {self.block_byte(e.buf, e.block, within)})"
        offset = self.block_byte(e.buf, e.block, add(codes, e.lane))
        return f"_lm_q4({var(e.buf)}, {offset}, {self.expr(e.sub)})"

    # ---- statements -------------------------------------------------------------------------

    def stmts(self, body: tuple, depth: int) -> None:
        if not body:
            self.add(depth, "pass")
        for s in body:
            getattr(self, "stmt_" + type(s).__name__.lower())(s, depth)

    def stmt_declare(self, s: ir.Declare, depth: int) -> None:
        value = self.expr(s.value)
        if s.mutable and isinstance(s.value, ir.Ref) and s.dtype in NP_TYPE:
            # `var f = n` with n a lane index: numba would take f for an alias of its prange
            # index and refuse the loop when f changes ("overwrite of parallel loop index").
            # A conversion (same type, same value) starts a new variable instead.
            value = f"{NP_TYPE[s.dtype]}({value})"
        self.add(depth, f"{var(s.name)} = {value}")

    def stmt_assign(self, s: ir.Assign, depth: int) -> None:
        self.add(depth, f"{var(s.name)} = {self.expr(s.value)}")

    def stmt_localarray(self, s: ir.LocalArray, depth: int) -> None:
        if s.dtype in ("f32", "f64"):
            self.float_locals[s.name] = s.size
        storage = KERNEL_STORAGE_TEXT[s.dtype]
        zero = "False" if s.dtype == "bool" else f"{storage}(0)"
        if s.size * np.dtype(KERNEL_STORAGE[s.dtype]).itemsize > STACK_ARRAY_BYTES:
            self.add(depth, f"{var(s.name)} = np.zeros({s.size}, {storage})")
            return
        self.add(depth, f"{var(s.name)} = carray(_lm_alloca({s.size}, {storage}), ({s.size},))")
        z = self.temp("z")
        self.add(depth, f"for {z} in range({s.size}):")
        self.add(depth + 1, f"{var(s.name)}[{z}] = {zero}")

    def stmt_store(self, s: ir.Store, depth: int) -> None:
        value = self.expr(s.value)
        if s.value.dtype in _HALF:
            value = f"_lm_{s.value.dtype}_bits({_unrounded(value, s.value.dtype)})"
        self.add(depth, f"{var(s.buf)}[{self.index(s.index)}] = {value}")

    def stmt_for(self, s: ir.For, depth: int) -> None:
        width = _fold_width(s)
        if width is not None and 2 * width <= self.float_locals.get(s.body[0].buf, 0):
            self.add(depth, f"_lm_fold({var(s.body[0].buf)}, {width})")
            return
        step = f", {s.step}" if s.step != 1 else ""
        if s.dtype == "i64":
            self.add(depth, f"for {var(s.var)} in range({self.expr(s.start)}, {self.expr(s.end)}{step}):")
        else:
            raw = self.temp("i")
            self.add(depth, f"for {raw} in range(np.int64({self.expr(s.start)}), np.int64({self.expr(s.end)}){step}):")
            self.add(depth + 1, f"{var(s.var)} = {NP_TYPE[s.dtype]}({raw})")
        self.stmts(s.body, depth + 1)

    def stmt_while(self, s: ir.While, depth: int) -> None:
        self.add(depth, f"while {self.expr(s.cond)}:")
        self.stmts(s.body, depth + 1)

    def stmt_if(self, s: ir.If, depth: int, keyword: str = "if") -> None:
        self.add(depth, f"{keyword} {self.expr(s.cond)}:")
        self.stmts(s.then, depth + 1)
        if len(s.orelse) == 1 and isinstance(s.orelse[0], ir.If):
            self.stmt_if(s.orelse[0], depth, "elif")
        elif s.orelse:
            self.add(depth, "else:")
            self.stmts(s.orelse, depth + 1)

    def stmt_break(self, s: ir.Break, depth: int) -> None:
        self.add(depth, "break")

    def stmt_continue(self, s: ir.Continue, depth: int) -> None:
        self.add(depth, "continue")

    def stmt_parallelfor(self, s: ir.ParallelFor, depth: int) -> None:
        """One prange over all lanes. A light body (no inner loop) takes LIGHT_CHUNK elements
        of the last dimension per lane, so its innermost loop is contiguous and the index
        arithmetic runs once per chunk; a heavy body gets one lane per index combination."""
        if not s.lanes:
            self.stmts(s.body, depth)
            return
        counts = []
        for lane in s.lanes:
            n = self.temp("n")
            extent = self.i64(lane.end) if lane.start == ir.Const(lane.dtype, 0) else \
                f"{self.i64(lane.end)} - {self.i64(lane.start)}"
            self.add(depth, f"{n} = _lm_max({extent}, np.int64(0))")
            counts.append(n)
        light = len(s.lanes) > 1 and not _has_loop(s.body)
        outer = list(range(len(s.lanes) - 1 if light else len(s.lanes)))
        total = " * ".join(counts[i] for i in outer)
        if light:
            chunks = self.temp("c")
            self.add(depth, f"{chunks} = ({counts[-1]} + {LIGHT_CHUNK - 1}) // {LIGHT_CHUNK}")
            total = f"{total} * {chunks}"
        # A parallel region costs microseconds to open (and much more when a worker thread is
        # descheduled), more than a single heavy lane, a few thousand light elements or heavy
        # lanes whose known loops make SERIAL_HEAVY_WORK iterations take: those run as a plain
        # loop. Each lane computes the same thing either way.
        if light:
            serial = f"{total} <= {SERIAL_LIGHT_CHUNKS}"
        elif not _has_loop(s.body):
            serial = f"{total} <= {SERIAL_LIGHT_CHUNKS * LIGHT_CHUNK}"
        else:
            serial = f"{total} <= 1"
            terms = _loop_work(s.body, self._outside_names(), self._trips)
            if terms:
                serial = f"({serial} or {total} * ({' + '.join(terms)}) <= {SERIAL_HEAVY_WORK})"
        self.add(depth, f"if {serial}:")
        self._lanes_loop(s, counts, outer, light, chunks if light else "", total, "range", depth + 1)
        self.add(depth, "else:")
        self._lanes_loop(s, counts, outer, light, chunks if light else "", total, "prange", depth + 1)

    def _trips(self, f: ir.For) -> str:
        span = f"_lm_max({self.i64(f.end)} - {self.i64(f.start)}, np.int64(0))"
        return span if f.step == 1 else f"({span} // {f.step})"

    def _outside_names(self) -> set[str]:
        """The names a launch binds before its parallel loop: parameters, symbols, the prelude."""
        k = self.kernel
        if k is None:
            return set()
        return ({p.name for p in k.params} | {p.name for p in k.symbols}
                | {d.name for d in k.body if isinstance(d, ir.Declare)})

    def _lanes_loop(self, s: ir.ParallelFor, counts: list[str], outer: list[int], light: bool, chunks: str,
                    total: str, loop: str, depth: int) -> None:
        rest = self.temp("p")
        self.add(depth, f"for {rest} in {loop}({total}):")
        d = depth + 1
        if light:
            chunk = self.temp("k")
            self.add(d, f"{chunk} = {rest} % {chunks}")
            nxt = self.temp("r")
            self.add(d, f"{nxt} = {rest} // {chunks}")
            rest = nxt
        for i in reversed(outer):
            if i == 0:
                self.bind_lane(s.lanes[i], rest, d)
            else:
                self.bind_lane(s.lanes[i], f"{rest} % {counts[i]}", d)
                nxt = self.temp("r")
                self.add(d, f"{nxt} = {rest} // {counts[i]}")
                rest = nxt
        if light:
            q = self.temp("q")
            self.add(d, f"for {q} in range({chunk} * {LIGHT_CHUNK}, "
                        f"_lm_min({chunk} * {LIGHT_CHUNK} + {LIGHT_CHUNK}, {counts[-1]})):")
            d += 1
            self.bind_lane(s.lanes[-1], q, d)
        self.stmts(s.body, d)

    def bind_lane(self, lane: ir.Lane, offset: str, depth: int) -> None:
        value = f"{self.i64(lane.start)} + {offset}" if lane.start != ir.Const(lane.dtype, 0) else offset
        if lane.dtype != "i64":
            value = f"{NP_TYPE[lane.dtype]}({value})"
        self.add(depth, f"{var(lane.var)} = {value}")

    # ---- the function -------------------------------------------------------------------------

    def render(self) -> str:
        k = self.kernel
        names = [var(p.name) for p in k.params] + [var(s.name) for s in k.symbols]
        parallel = any(isinstance(s, ir.ParallelFor) and s.lanes for s in k.body)  # a single-lane part is serial
        self.add(0, f'@njit(parallel={parallel}, cache=True, fastmath=False, error_model="numpy")')
        self.add(0, f"def {function_name(k)}({', '.join(names)}):")
        for p in k.params:
            if isinstance(p, ir.ScalarParam):
                coerce = f"_lm_round_{p.dtype}(np.float32({var(p.name)}))" if p.dtype in _HALF else \
                    f"{NP_TYPE[p.dtype]}({var(p.name)})"
                self.add(1, f"{var(p.name)} = {coerce}")
        for s in k.symbols:
            self.add(1, f"{var(s.name)} = np.int64({var(s.name)})")
        self.stmts(k.body, 1)
        return "\n".join(self.lines) + "\n"


def render_kernel(kernel: ir.Kernel) -> str:
    return _Renderer(kernel).render()


def render_module(group: ir.KernelGroup) -> str:
    """The module text for one `.loom` kernel: header, the helpers it uses, its part(s)."""
    import numba

    functions = "\n\n".join(render_kernel(k) for k in group.parts)
    parts = len(group.parts)
    header = [
        f"# Generated by loomc {LOOMC_VERSION} for numba {numba.__version__}; do not edit.",
        f"# kernel {group.name}: {group.source.path}:{group.source.line}"
        + (f" ({parts} parallel loops, launched in order)" if parts > 1 else ""),
    ]
    if group.configs:
        header.append("# configs: " + ", ".join(f"{k} = {v!r}" for k, v in group.configs))
    helpers = helpers_for(functions)
    return "\n".join(header) + "\n" + IMPORTS + "\n\n" + "".join(h + "\n\n" for h in helpers) + "\n" + functions


# ---- files -----------------------------------------------------------------------------------------------

def module_path(text: str, cache_dir: Path | None = None) -> Path:
    import numba

    digest = hashlib.sha256((text + LOOMC_VERSION + numba.__version__).encode()).hexdigest()[:16]
    return (cache_dir or default_cache_dir()) / "kernels" / f"k_{digest}.py"


_LOADED: dict[Path, object] = {}


def ensure_module(path: Path, text: str) -> None:
    """Make the kernel cache entry at `path` hold exactly `text`. An entry that is missing, or
    whose bytes differ from the text its name was derived from (truncated or overwritten by a
    crash, a full disk, a hand edit), is written again: a generated module is never imported
    from bytes we did not render in this process. Reading it back is cheap next to importing it.
    Rewriting changes its mtime, which is numba's index stamp, so numba's own cache files for
    the old bytes are ignored and recompiled."""
    data = text.encode("utf-8")
    try:
        intact = path.read_bytes() == data
    except OSError:
        intact = False
    if not intact:
        write_atomically(path, data, parents=True)  # a reader importing the same kernel never sees part of it


def load_module(path: Path):
    """Import a generated module once per process (registered in sys.modules, which
    numba's cache needs to find the functions again), with numba's disk cache of each of its
    functions replaced by the checksummed one (`ChecksummedFunctionCache`)."""
    module = _LOADED.get(path)
    if module is None:
        name = "_loom_" + path.stem
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _checksum_caches(module)
        _LOADED[path] = module
    return module


def load_group(group: ir.KernelGroup, cache_dir: Path | None = None) -> list:
    """The numba dispatchers of a kernel's parts, compiled lazily on first call (and then
    cached on disk next to the generated file)."""
    text = render_module(group)
    path = module_path(text, cache_dir)
    ensure_module(path, text)
    module = load_module(path)
    return [getattr(module, function_name(k)) for k in group.parts]


# ---- numba's cache files, checksummed ----------------------------------------------------------------
#
# numba writes its index (`.nbi`: source stamp -> data file per signature) and data files (`.nbc`:
# the pickled compiled library) itself, by temp file + rename but without fsync, and unpickles
# them as they are: a truncated file raises from inside the first call of a kernel, and a
# damaged one that still unpickles would load damaged machine code. Ours prefix every pickle
# with a magic and its sha256, and treat a file whose digest does not match (or an older
# file without one) as absent: numba then compiles the signature again and its save replaces
# the entry. Nothing is unpickled before its digest is checked.

_CACHE_MAGIC = b"loom-nb1"


class _CorruptCacheFile(Exception):
    """A numba cache file whose checksum does not match: treated as a cache miss."""


@functools.cache
def _checked_cache_file_class():
    import pickle

    from numba.core.caching import IndexDataCacheFile

    class ChecksummedCacheFile(IndexDataCacheFile):
        def _dump(self, obj) -> bytes:
            return sealed(super()._dump(obj), _CACHE_MAGIC)

        def _load_index(self) -> dict:
            try:
                with open(self._index_path, "rb") as f:
                    version = pickle.load(f)
                    data = f.read()
            except FileNotFoundError:
                return {}
            except Exception:  # noqa: BLE001 - a truncated version pickle: the index is rewritten on save
                return {}
            payload = unsealed(data, _CACHE_MAGIC) if version == self._version else None
            if payload is None:
                return {}
            stamp, overloads = pickle.loads(payload)
            return overloads if stamp == self._source_stamp else {}

        def _load_data(self, name: str):
            with open(self._data_path(name), "rb") as f:
                payload = unsealed(f.read(), _CACHE_MAGIC)
            if payload is None:
                raise _CorruptCacheFile(name)
            return pickle.loads(payload)

        def load(self, key):
            try:
                return super().load(key)
            except _CorruptCacheFile:
                return None  # compiled again; numba's save then overwrites this data file

    return ChecksummedCacheFile


def _checksum_caches(module) -> None:
    """Give every cached numba dispatcher in `module` a cache whose files carry a checksum."""
    from numba.core.caching import FunctionCache
    from numba.core.dispatcher import Dispatcher

    cache_file = None
    for value in vars(module).values():
        cache = getattr(value, "_cache", None) if isinstance(value, Dispatcher) else None
        if type(cache) is FunctionCache:
            cache_file = cache_file or _checked_cache_file_class()
            old = cache._cache_file
            cache._cache_file = cache_file(cache_path=old._cache_path, filename_base=old._index_name[:-len(".nbi")],
                                           source_stamp=old._source_stamp)
