"""IR -> CUDA C for `cupy.RawModule` (`cuda` target), with the launch geometry of each kernel.

`render_module(groups)` renders one module text for a compiled kernel set (a command
program's kernels, or the kernels `loomc emit --target cuda` was asked for): a header
naming every kernel's `.loom` file and line, the `lm_` helpers the kernels use
(`cuda_helpers.py`), then one `extern "C" __global__` function per IR kernel part, named
`k_<part name>` like the numba functions. `loomc.run.cuda` compiles the text with
`COMPILE_OPTIONS` and launches each part with its `LaunchPlan`.

The renderer is a table keyed by IR node kind (`_Renderer.expr_*`/`stmt_*`), the twin of
`lower/numba.py`: both read the same verified IR, so the targets cannot drift apart.
`tests/unit/loomc/lower/test_cuda_render.py` runs this renderer's scalar code on the host
against `loomc.ir.interpret`, and `tests/numerics/test_cuda.py` runs whole modules (built
for the host behind a serial-grid shim, and on a GPU where there is one) against numba.

Launch mapping. A part's one `ParallelFor` over lanes v0 in s0..e0, ..., vk in sk..ek
becomes a 1-D grid of `LaunchPlan.block_threads`-thread blocks and a grid-stride loop
over the flat lane index p in 0..n0*...*nk (ni = max(ei - si, 0)), so any size runs on
any grid:

    for (long long p = blockIdx.x * blockDim.x + threadIdx.x; p < total; p += gridDim.x * blockDim.x)
        vk = sk + p % nk; p' = p / nk; ...; v0 = s0 + p'      (the last lane varies fastest)

Consecutive threads take consecutive values of the last lane, which is the contiguous
axis of row-major buffers, so stores (and most loads) coalesce. The host computes the
grid as ceil(total / block_threads) blocks, capped at MAX_BLOCKS (the grid-stride loop
covers the rest), from the per-call symbols and scalar arguments; `LaunchPlan.extents`
holds the lane bounds as IR expressions over those. A bound that reads device memory
(a top-level `let` of a tensor element) cannot be evaluated on the host: the plan then
launches FALLBACK_BLOCKS blocks. A part with no lanes (top-level statements between
parallel loops) runs as one thread of one block. Parts of one kernel launch in order on
one stream, so each sees the previous part's writes.

Semantics (the IR module docstring): wrapping integer ops go through unsigned types
(`lm_add_i32`...), division by zero gives 0, `>>` is arithmetic on signed types, float
`mod` is `fmodf`, f16/bf16 live in `float` and round after every op through bit helpers,
min/max are the IR's selects. IEEE results need `--fmad=false` (no contraction into fma),
`--ftz=false`, `--prec-div=true` and `--prec-sqrt=true`, which is `COMPILE_OPTIONS`.
Buffers are never `__restrict__`: a command may pass one tensor as two arguments. There
are no bounds checks or traps in kernels: the host validates every shape before a launch
(`loomc.run.launch.KernelLauncher.bind`), exactly as on the CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from loomc import LOOMC_VERSION
from loomc.ir import interpret
from loomc.ir import module as ir
from loomc.lower.render import TargetRenderer
from loomc.dtypes import DTYPES
from loomc.lower.cuda_helpers import C_SPELLING, C_TYPE, PRELUDE, SAME_WIDTH_UNSIGNED, helpers_for

COMPILE_OPTIONS = ("--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")
BLOCK_THREADS = 256
MAX_BLOCKS = 65536  # 16M threads in flight is far past any device's occupancy
FALLBACK_BLOCKS = 1024  # when the host cannot compute the lane count

# The element type of a buffer a kernel indexes (f16/bf16 as their bits, quantized tensors as
# GGUF bytes): the `kernel` storage of `loomc.dtypes`.
KERNEL_STORAGE = {t: C_SPELLING[d.kernel] for t, d in DTYPES.items()}
_HALF = ("f16", "bf16")
_NARROW = ("i8", "i16", "u8", "u16")  # C promotes these to int: results are cast back
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "and": "&", "or": "|", "xor": "^", "shl": "<<", "shr": ">>",
          "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "land": "&&", "lor": "||"}
# Float math by name; `{f}` is the C suffix of the compute type ("f" for float, "" for double).
_MATH = {"exp": "exp{f}({0})", "exp2": "exp2{f}({0})", "log": "log{f}({0})", "log2": "log2{f}({0})",
         "sqrt": "sqrt{f}({0})", "tanh": "tanh{f}({0})", "erf": "erf{f}({0})", "sin": "sin{f}({0})",
         "cos": "cos{f}({0})", "floor": "floor{f}({0})", "ceil": "ceil{f}({0})", "pow": "pow{f}({0}, {1})",
         "fma": "fma{f}({0}, {1}, {2})", "abs": "fabs{f}({0})", "rsqrt": "({one} / sqrt{f}({0}))",
         "sigmoid": "({one} / ({one} + exp{f}(-{0})))"}


def var(name: str) -> str:
    """User names get a prefix so that no `.loom` name can meet a C keyword or a helper."""
    return "v_" + name


def function_name(kernel: ir.Kernel) -> str:
    return "k_" + kernel.name


# ---- launch geometry ------------------------------------------------------------------------------

@dataclass(frozen=True)
class LaunchPlan:
    """How the host launches one kernel part: `function` in the module, `block_threads`
    threads per block, and a grid sized from `extents`, the (start, end) of each parallel
    lane as i64-valued IR expressions over scalar parameters and shape symbols (`()` for a
    single-lane part, None when a bound reads device memory)."""

    function: str
    block_threads: int
    extents: tuple[tuple[ir.Expr, ir.Expr], ...] | None
    max_blocks: int = MAX_BLOCKS

    def lanes(self, env: Mapping[str, Any]) -> int | None:
        """The number of lanes for one call; `env` maps scalar parameter and symbol names to values."""
        if self.extents is None:
            return None
        total = 1
        for start, end in self.extents:
            total *= max(int(interpret.evaluate(end, env)) - int(interpret.evaluate(start, env)), 0)
        return total

    def grid_blocks(self, env: Mapping[str, Any]) -> int:
        """Blocks to launch (0: nothing to do, skip the launch)."""
        lanes = self.lanes(env)
        if lanes is None:
            return FALLBACK_BLOCKS
        return min(-(-lanes // self.block_threads), self.max_blocks)


@dataclass(frozen=True)
class CudaModule:
    """One module text and, per kernel key, the launch plans of its parts in launch order."""

    text: str
    launches: dict[str, tuple[LaunchPlan, ...]]


def _substitute(e: ir.Expr, values: Mapping[str, ir.Expr | None]) -> ir.Expr | None:
    """`e` with prelude locals replaced by their values; None if it needs device memory."""
    if isinstance(e, ir.Ref):
        return values.get(e.name, e)
    if isinstance(e, (ir.Load, ir.QuantScale, ir.QuantMin, ir.QuantCode)):
        return None
    if isinstance(e, ir.Const):
        return e
    kids = [_substitute(c, values) for c in ir.children(e)]
    if any(k is None for k in kids):
        return None
    if isinstance(e, (ir.Unary, ir.Cast, ir.Bitcast)):
        return dataclasses.replace(e, x=kids[0])
    if isinstance(e, ir.Binary):
        return dataclasses.replace(e, a=kids[0], b=kids[1])
    if isinstance(e, ir.Select):
        return dataclasses.replace(e, cond=kids[0], a=kids[1], b=kids[2])
    return dataclasses.replace(e, args=tuple(kids))


def launch_plan(kernel: ir.Kernel, function: str) -> LaunchPlan:
    prelude: dict[str, ir.Expr | None] = {}
    lanes: tuple[ir.Lane, ...] = ()
    for s in kernel.body:
        if isinstance(s, ir.Declare):
            prelude[s.name] = _substitute(s.value, prelude)
        elif isinstance(s, ir.ParallelFor):
            lanes = s.lanes
    if not lanes:
        return LaunchPlan(function, 1, ())
    extents = []
    for lane in lanes:
        start, end = _substitute(lane.start, prelude), _substitute(lane.end, prelude)
        if start is None or end is None:
            return LaunchPlan(function, BLOCK_THREADS, None)
        extents.append((start, end))
    return LaunchPlan(function, BLOCK_THREADS, tuple(extents))


# ---- expressions ---------------------------------------------------------------------------------

def const(dtype: str, value) -> str:
    if dtype == "bool":
        return "true" if value else "false"
    if ir.is_int(dtype):
        v = int(value)
        if dtype == "i64":
            return "(-9223372036854775807LL - 1)" if v == -(2 ** 63) else f"{v}LL" if v >= 0 else f"({v}LL)"
        if dtype == "u64":
            return f"{v}ull"
        if dtype == "u32":
            return f"{v}u"
        if dtype == "i32":
            return "(-2147483647 - 1)" if v == -(2 ** 31) else str(v) if v >= 0 else f"({v})"
        return f"(({C_TYPE[dtype]}){v})"
    wide = dtype == "f64"
    v = float(interpret.to_dtype(value, dtype)) if not wide else float(value)
    if v != v or v in (float("inf"), float("-inf")):
        if wide:
            bits = {"nan": 0x7FF8000000000000, "inf": 0x7FF0000000000000, "-inf": 0xFFF0000000000000}[repr(v)]
            return f"lm_f64_from_bits(0x{bits:X}ull)"
        bits = {"nan": 0x7FC00000, "inf": 0x7F800000, "-inf": 0xFF800000}[repr(v)]
        return f"lm_f32_from_bits(0x{bits:X}u)"
    text = repr(v if wide else float(np.float32(v))) + ("" if wide else "f")
    return f"({text})" if text.startswith("-") else text


def _narrow(text: str, dtype: str) -> str:
    """Cast C's promoted int back to a narrow integer dtype."""
    return f"({C_TYPE[dtype]})({text})" if dtype in _NARROW else text


def _round(text: str, dtype: str) -> str:
    return f"lm_round_{dtype}({text})" if dtype in _HALF else text


class _Renderer(TargetRenderer):
    """Renders IR to C. `expr_*`/`stmt_*` methods are the table keyed by node kind."""

    temp_prefix = "lm_"
    const = staticmethod(const)
    var = staticmethod(var)

    def __init__(self, kernel: ir.Kernel | None = None):
        super().__init__(kernel)
        self.mutable: set[str] = set()
        self.local_arrays: set[str] = set()

    def expr_unary(self, e: ir.Unary) -> str:
        x, t = self.expr(e.x), e.dtype
        if e.op == "not":
            return f"(!{x})"
        if e.op == "invert":
            return _narrow(f"~{x}", t) if t in _NARROW else f"(~{x})"
        if ir.is_float(t):
            return f"(-{x})"  # exact, also for f16/bf16 values
        return f"(0{'ull' if t == 'u64' else 'u'} - {x})" if t in ("u32", "u64") else f"lm_neg_{t}({x})"

    def expr_binary(self, e: ir.Binary) -> str:
        a, b, t, op = self.expr(e.a), self.expr(e.b), e.a.dtype, e.op
        if op in ir.COMPARE_OPS or op in ir.LOGIC_OPS:
            return f"({a} {_INFIX[op]} {b})"
        if ir.is_float(t):
            c = "f" if t != "f64" else ""
            return _round(f"fmod{c}({a}, {b})" if op == "mod" else f"({a} {_INFIX[op]} {b})", t)
        if op in ("div", "mod") or op in ("add", "sub", "mul", "shl") and t not in ("u32", "u64"):
            return f"lm_{op}_{t}({a}, {b})"
        return _narrow(f"{a} {_INFIX[op]} {b}", t) if t in _NARROW else f"({a} {_INFIX[op]} {b})"

    def expr_select(self, e: ir.Select) -> str:
        return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"

    def expr_math(self, e: ir.Math) -> str:
        args = [self.expr(a) for a in e.args]
        t = e.args[0].dtype
        if e.fn in ("min", "max"):
            return f"lm_{e.fn}<{C_TYPE[t]}>({args[0]}, {args[1]})"
        if e.fn in ("isnan", "isinf"):
            return f"lm_{e.fn}_{'f64' if t == 'f64' else 'f32'}({args[0]})"
        if e.fn == "abs" and ir.is_int(t):
            return args[0] if ir.is_unsigned(t) else f"lm_abs_{t}({args[0]})"
        c = "" if t == "f64" else "f"
        text = _MATH[e.fn].format(*args, f=c, one=f"1.0{c}")
        return text if e.fn == "abs" else _round(text, t)

    def expr_cast(self, e: ir.Cast) -> str:
        x, src, dst = self.expr(e.x), e.x.dtype, e.dtype
        if src == dst:
            return x
        if dst == "bool":
            return f"({x} != {const(src, 0)})"
        if dst in _HALF:
            if dst == "f16" and src == "f64":
                return f"lm_round_f16_f64({x})"  # one rounding, as interpret does
            return f"lm_round_{dst}({x if src in ('f32', 'f16', 'bf16') else f'(float)({x})'})"
        if ir.is_int(dst) and ir.is_float(src) and dst not in ("i64", "u64"):
            # truncation toward zero; through i64 so an out-of-range value wraps like interpret
            return f"(({C_TYPE[dst]})(long long)({x}))"
        return f"(({C_TYPE[dst]})({x}))"

    def bits_of(self, x: str, src: str) -> str:
        """The bit pattern of a value of `src`, as the unsigned type of its width."""
        if ir.is_float(src):
            return f"lm_{src}_bits({x})"
        return f"(({SAME_WIDTH_UNSIGNED[src]})({x}))"

    def expr_bitcast(self, e: ir.Bitcast) -> str:
        src, dst = e.x.dtype, e.dtype
        bits = self.bits_of(self.expr(e.x), src)
        if dst == "bool":
            return f"({bits} != 0)"
        if ir.is_float(dst):
            return f"lm_{dst}_from_bits({bits})"
        return f"(({C_TYPE[dst]}){bits})"

    def expr_load(self, e: ir.Load) -> str:
        text = f"{var(e.buf)}[{self.expr(e.index)}]"
        # buffers hold f16/bf16 bits; local arrays hold the (already rounded) float values
        return f"lm_{e.dtype}_from_bits({text})" if e.dtype in _HALF and e.buf not in self.local_arrays else text

    def block_byte(self, buf: str, block: ir.Expr, offset: ir.Expr) -> str:
        start = ir.Binary("mul", block, ir.Const("i64", ir.QUANT_BLOCK_BYTES[self.quant[buf]]), "i64")
        return self.expr(ir.Binary("add", start, offset, "i64"))

    def expr_quantscale(self, e: ir.QuantScale) -> str:
        return f"lm_half_at({var(e.buf)}, {self.block_byte(e.buf, e.block, ir.Const('i64', 0))})"

    def expr_quantmin(self, e: ir.QuantMin) -> str:
        return f"lm_half_at({var(e.buf)}, {self.block_byte(e.buf, e.block, ir.Const('i64', 2))})"

    def expr_quantcode(self, e: ir.QuantCode) -> str:
        qtype = self.quant[e.buf]
        codes = ir.Const("i64", ir.QUANT_CODES_OFFSET[qtype])
        if qtype == "q8_0":
            within = ir.Binary("add", ir.Binary("mul", e.sub, ir.Const("i64", 16), "i64"), e.lane, "i64")
            return f"lm_q8({var(e.buf)}, {self.block_byte(e.buf, e.block, ir.Binary('add', codes, within, 'i64'))})"
        offset = self.block_byte(e.buf, e.block, ir.Binary("add", codes, e.lane, "i64"))
        return f"lm_q4({var(e.buf)}, {offset}, {self.expr(e.sub)})"

    # ---- statements -------------------------------------------------------------------------

    def stmts(self, body: tuple, depth: int) -> None:
        for s in body:
            getattr(self, "stmt_" + type(s).__name__.lower())(s, depth)

    def stmt_declare(self, s: ir.Declare, depth: int) -> None:
        if s.mutable:
            self.mutable.add(s.name)
        qualifier = "" if s.mutable else "const "
        self.add(depth, f"{qualifier}{C_TYPE[s.dtype]} {var(s.name)} = {self.expr(s.value)};")

    def stmt_assign(self, s: ir.Assign, depth: int) -> None:
        self.add(depth, f"{var(s.name)} = {self.expr(s.value)};")

    def stmt_localarray(self, s: ir.LocalArray, depth: int) -> None:
        self.local_arrays.add(s.name)
        self.add(depth, f"{C_TYPE[s.dtype]} {var(s.name)}[{s.size}] = {{}};  // zeroed each time")

    def stmt_store(self, s: ir.Store, depth: int) -> None:
        value = self.expr(s.value)
        if s.value.dtype in _HALF and s.buf not in self.local_arrays:
            value = f"lm_{s.value.dtype}_bits({value})"
        self.add(depth, f"{var(s.buf)}[{self.expr(s.index)}] = {value};")

    def invariant(self, e: ir.Expr) -> bool:
        """Whether `e` cannot change while a loop runs (so a bound needs no temporary)."""
        if isinstance(e, ir.Ref):
            return e.name not in self.mutable
        if isinstance(e, ir.Const):
            return True
        return False

    def stmt_for(self, s: ir.For, depth: int) -> None:
        """Bounds are evaluated once (a temporary unless the end cannot change). A loop over
        a narrower type counts in i64 and converts, so it cannot wrap at the type's end."""
        step = "++" if s.step == 1 else f" += {s.step}"
        wide = s.dtype == "i64"
        counter = var(s.var) if wide else self.temp("i")
        end = self.expr(s.end) if wide else f"(long long)({self.expr(s.end)})"
        start = self.expr(s.start) if wide else f"(long long)({self.expr(s.start)})"
        scoped = not wide or not self.invariant(s.end)
        if scoped:
            self.add(depth, "{")
            depth += 1
            bound = self.temp("end")
            self.add(depth, f"const long long {bound} = {end};")
            end = bound
        self.add(depth, f"for (long long {counter} = {start}; {counter} < {end}; {counter}{step}) {{")
        if not wide:
            self.add(depth + 1, f"const {C_TYPE[s.dtype]} {var(s.var)} = ({C_TYPE[s.dtype]}){counter};")
        self.stmts(s.body, depth + 1)
        self.add(depth, "}")
        if scoped:
            self.add(depth - 1, "}")

    def stmt_while(self, s: ir.While, depth: int) -> None:
        self.add(depth, f"while ({self.expr(s.cond)}) {{")
        self.stmts(s.body, depth + 1)
        self.add(depth, "}")

    def stmt_if(self, s: ir.If, depth: int, keyword: str = "if") -> None:
        self.add(depth, f"{keyword} ({self.expr(s.cond)}) {{")
        self.stmts(s.then, depth + 1)
        if len(s.orelse) == 1 and isinstance(s.orelse[0], ir.If):
            self.stmt_if(s.orelse[0], depth, "} else if")
            return
        if s.orelse:
            self.add(depth, "} else {")
            self.stmts(s.orelse, depth + 1)
        self.add(depth, "}")

    def stmt_break(self, s: ir.Break, depth: int) -> None:
        self.add(depth, "break;")

    def stmt_continue(self, s: ir.Continue, depth: int) -> None:
        self.add(depth, "continue;")

    def stmt_parallelfor(self, s: ir.ParallelFor, depth: int) -> None:
        """The grid-stride loop over the flat lane index (see the module docstring)."""
        if not s.lanes:
            self.add(depth, "if (blockIdx.x == 0 && threadIdx.x == 0) {  // a single lane")
            self.stmts(s.body, depth + 1)
            self.add(depth, "}")
            return
        counts = []
        for lane in s.lanes:
            n = self.temp("n")
            end = self.i64(lane.end)
            if lane.start != ir.Const(lane.dtype, 0):
                end = f"lm_sub_i64({end}, {self.i64(lane.start)})"
            self.add(depth, f"const long long {n} = lm_max<long long>({end}, 0LL);")
            counts.append(n)
        total = self.temp("total")
        self.add(depth, f"const long long {total} = {' * '.join(counts)};")
        p = self.temp("p")
        self.add(depth, f"for (long long {p} = (long long)blockIdx.x * blockDim.x + threadIdx.x; {p} < {total}; "
                        f"{p} += (long long)gridDim.x * blockDim.x) {{")
        d = depth + 1
        rest = p
        for i in reversed(range(len(s.lanes))):
            if i == 0:
                self.bind_lane(s.lanes[i], rest, d)
            else:
                self.bind_lane(s.lanes[i], f"{rest} % {counts[i]}", d)
                nxt = self.temp("r")
                self.add(d, f"const long long {nxt} = {rest} / {counts[i]};")
                rest = nxt
        self.stmts(s.body, d)
        self.add(depth, "}")

    def i64(self, e: ir.Expr) -> str:
        return self.expr(e) if e.dtype == "i64" else f"(long long)({self.expr(e)})"

    def bind_lane(self, lane: ir.Lane, offset: str, depth: int) -> None:
        value = f"{self.i64(lane.start)} + {offset}" if lane.start != ir.Const(lane.dtype, 0) else offset
        if lane.dtype != "i64":
            value = f"({C_TYPE[lane.dtype]})({value})"
        self.add(depth, f"const {C_TYPE[lane.dtype]} {var(lane.var)} = {value};")

    # ---- the function -------------------------------------------------------------------------

    def render(self, function: str) -> str:
        k = self.kernel
        args: list[str] = []
        coerce: list[str] = []
        for p in k.params:
            if isinstance(p, ir.BufferParam):
                args.append(f"{'' if p.writable else 'const '}{KERNEL_STORAGE[p.dtype]}* {var(p.name)}")
            elif p.dtype in _HALF or p.dtype == "bool":  # passed as float / as one byte
                raw = f"lm_arg_{p.name}"
                args.append(f"{'float' if p.dtype in _HALF else 'unsigned char'} {raw}")
                value = f"lm_round_{p.dtype}({raw})" if p.dtype in _HALF else f"{raw} != 0"
                coerce.append(f"const {C_TYPE[p.dtype]} {var(p.name)} = {value};")
            else:
                args.append(f"{C_TYPE[p.dtype]} {var(p.name)}")
        args += [f"long long {var(s.name)}" for s in k.symbols]
        self.add(0, f'extern "C" __global__ void {function}({", ".join(args)}) {{')
        for line in coerce:
            self.add(1, line)
        self.stmts(k.body, 1)
        self.add(0, "}")
        return "\n".join(self.lines) + "\n"


# ---- modules ---------------------------------------------------------------------------------------

def render_module(groups: Mapping[str, ir.KernelGroup]) -> CudaModule:
    """One CUDA module for a kernel set (`groups` by the caller's key) and its launch plans.
    Two kernels of one name (from different files) get distinct C names (`_2`, `_3`...)."""
    used: set[str] = set()
    launches: dict[str, tuple[LaunchPlan, ...]] = {}
    header = [f"// Generated by loomc {LOOMC_VERSION} for CUDA (cupy.RawModule, NVRTC); do not edit.",
              f"// Compile with: {' '.join(COMPILE_OPTIONS)}  (IEEE: no fma contraction, no flush to zero)"]
    functions: list[str] = []
    for key, group in groups.items():
        plans = []
        for index, part in enumerate(group.parts):
            name, n = function_name(part), 1
            while name in used:
                n += 1
                name = f"{function_name(part)}_{n}"
            used.add(name)
            plans.append(launch_plan(part, name))
            where = f"kernel {group.name}: {group.source.path}:{group.source.line}"
            if len(group.parts) > 1:
                where += f" (parallel loop {index + 1} of {len(group.parts)}, launched in order)"
            comment = [f"// {where}"]
            if group.configs:
                comment.append("// configs: " + ", ".join(f"{k} = {v!r}" for k, v in group.configs))
            functions.append("\n".join(comment) + "\n" + _Renderer(part).render(name))
        launches[key] = tuple(plans)
        header.append(f"// kernel {group.name}: {group.source.path}:{group.source.line} -> "
                      + ", ".join(p.function for p in plans))
    body = "\n".join(functions)
    text = "\n".join(header) + "\n\n" + with_helpers(body)
    return CudaModule(text, launches)


def render_group(group: ir.KernelGroup) -> CudaModule:
    return render_module({group.name: group})


def with_helpers(body: str) -> str:
    """`body` preceded by the LM_FN prelude and the helpers it calls."""
    helpers = helpers_for(body)
    return PRELUDE + "\n" + (helpers + "\n\n" if helpers else "") + body


def render_scalar_function(name: str, params: Sequence[tuple[str, str]], e: ir.Expr) -> str:
    """A C function returning `e` over scalar parameters (name, dtype), rendered by the same
    expression table as kernels; host and device compile it (the drift test's unit)."""
    args = ", ".join(f"{C_TYPE[t]} {var(p)}" for p, t in params)
    return f"LM_FN {C_TYPE[e.dtype]} {name}({args}) {{ return {_Renderer().expr(e)}; }}\n"
