"""IR pass: split float sum reductions into 32 fixed lanes so that targets can vectorize them.

A sequential loop whose body only binds `let`s and adds to float accumulators

    for k in 0..E { let a = f(k); acc += g(k, a) }      (or acc = fma(a, b, acc): see `terms`)

is a chain of dependent adds: strict IEEE order (no fastmath) forbids a compiler from
reassociating it, so it runs at one add per add-latency. This pass rewrites it as

    var part: f32[32]                          // zeroed
    for k0 in 0..E step 32 {
        for h in 0, 1 {                        // unrolled here, in the IR
            let n = min(16, E - (k0 + 16 h))   // a runtime trip count: not unrolled away
            for l in 0..n { let k = k0 + 16 h + l; part[16 h + l] += g(k, f(k)) }
        }
    }
    for w in 16, 8, 4, 2, 1 { for z in 0..w { part[z] += part[z + w] } }
    acc += part[0]

so each lane sums elements z, z + 32, z + 64, ... in order, and the 32 lanes are then
added as a fixed pairwise tree (5 dependent adds instead of 32; the numba target runs
each level as one vector add, `_lm_fold`). The result is
deterministic (it depends only on E and the data, never on threads or on which other
rows share a batch) but rounds differently from the plain sequential sum: this is the
one reassociation Loom's back ends make, and only here.

Each 16-lane loop reads 16 consecutive elements, and because k0 is a multiple of 32, a
quantized element `k` of such a loop sits in block `k0 >> 5`, half `h`, lane `l`: the
pass rewrites the lowering's `k >> 5`, `(k >> 4) & 1` and `k & 15` to exactly those, so
block scales become loop-invariant (they are read once per block, before the lane loops)
and code bytes are read contiguously.

A loop whose body reads quantized codes (a matmul over GGUF blocks) runs its whole
chunks, 0..E & ~31, in a form with a constant trip count, and only the last, partial
chunk (none when E is a multiple of 32) in the runtime-trip form above:

    for l in 0..16 { lane l += g(k0 + l); lane 16 + l += g(k0 + 16 + l) }   // q4_0, q4_1
    for l in 0..32 { lane l += g(k0 + l) }   // only q8_0 codes: half l >> 4, lane l & 15

A q4 block keeps element l in the low nibble and element 16 + l in the high nibble of code
byte l, so the fused loop reads each byte once for both halves; q8_0 codes are 32
contiguous bytes. LLVM turns either loop into whole vectors and keeps the 32 lanes in
registers across blocks (the runtime trip counts kept them in memory, with a scalar
remainder per half): 2.5-3x on scout's decode matvecs (`bench/matvec.py`). Both forms add
element k0 + 16 h + l to lane 16 h + l in the same order as the general form, so results
are bit-identical. Loops that read no codes keep the general form: with a light body (an
f32 dot product) LLVM unrolls a 16-trip loop whole instead of vectorizing it.
"""

from __future__ import annotations

import dataclasses

from loomc.ir import module as ir
from loomc.lower.names import FreshNames

CHUNK = 32  # elements per outer step: one quantized block
HALF = 16  # lanes per inner loop


def split_group(group: ir.KernelGroup) -> ir.KernelGroup:
    return dataclasses.replace(group, parts=tuple(split_kernel(k) for k in group.parts))


def split_kernel(kernel: ir.Kernel) -> ir.Kernel:
    names = _declared_names(kernel)
    quant = {p.name: p.dtype for p in kernel.params if isinstance(p, ir.BufferParam) and p.dtype in ir.QUANT_DTYPES}
    return dataclasses.replace(kernel, body=_Splitter(names, quant).block(kernel.body))


def _i64(v: int) -> ir.Const:
    return ir.Const("i64", v)


def rewrite(e: ir.Expr, fn) -> ir.Expr:
    """Top-down rewrite: `fn(node)` returns a replacement or None to recurse into operands."""
    replaced = fn(e)
    if replaced is not None:
        return replaced
    if isinstance(e, (ir.Const, ir.Ref)):
        return e
    if isinstance(e, (ir.Unary, ir.Cast, ir.Bitcast)):
        return dataclasses.replace(e, x=rewrite(e.x, fn))
    if isinstance(e, ir.Binary):
        return dataclasses.replace(e, a=rewrite(e.a, fn), b=rewrite(e.b, fn))
    if isinstance(e, ir.Select):
        return dataclasses.replace(e, cond=rewrite(e.cond, fn), a=rewrite(e.a, fn), b=rewrite(e.b, fn))
    if isinstance(e, ir.Math):
        return dataclasses.replace(e, args=tuple(rewrite(a, fn) for a in e.args))
    if isinstance(e, ir.Load):
        return dataclasses.replace(e, index=rewrite(e.index, fn))
    if isinstance(e, (ir.QuantScale, ir.QuantMin)):
        return dataclasses.replace(e, block=rewrite(e.block, fn))
    if isinstance(e, ir.QuantCode):
        return dataclasses.replace(e, block=rewrite(e.block, fn), sub=rewrite(e.sub, fn), lane=rewrite(e.lane, fn))
    raise TypeError(f"not an IR expression: {e!r}")


def refs(e: ir.Expr) -> set[str]:
    found: set[str] = set()

    def visit(x: ir.Expr):
        if isinstance(x, ir.Ref):
            found.add(x.name)
        return None

    rewrite(e, visit)
    return found


def _declared_names(kernel: ir.Kernel) -> set[str]:
    names = {p.name for p in kernel.params} | {s.name for s in kernel.symbols}

    def walk(body):
        for s in body:
            if isinstance(s, (ir.Declare, ir.LocalArray)):
                names.add(s.name)
            elif isinstance(s, ir.For):
                names.add(s.var)
                walk(s.body)
            elif isinstance(s, ir.While):
                walk(s.body)
            elif isinstance(s, ir.If):
                walk(s.then)
                walk(s.orelse)
            elif isinstance(s, ir.ParallelFor):
                names.update(l.var for l in s.lanes)
                walk(s.body)

    walk(kernel.body)
    return names


class _Splitter(FreshNames):
    def __init__(self, names: set[str], quant: dict[str, str]):
        super().__init__(names)
        self.quant = quant  # quantized buffer -> its dtype

    def block(self, body: tuple) -> tuple:
        out: list = []
        for s in body:
            if isinstance(s, ir.For):
                accumulators = reduction(s)
                if accumulators:
                    out += self.split(s, accumulators)
                else:
                    out.append(dataclasses.replace(s, body=self.block(s.body)))
            elif isinstance(s, ir.While):
                out.append(dataclasses.replace(s, body=self.block(s.body)))
            elif isinstance(s, ir.If):
                out.append(dataclasses.replace(s, then=self.block(s.then), orelse=self.block(s.orelse)))
            elif isinstance(s, ir.ParallelFor):
                out.append(dataclasses.replace(s, body=self.block(s.body)))
            else:
                out.append(s)
        return tuple(out)

    def split(self, loop: ir.For, accumulators: dict[str, str]) -> list:
        k = loop.var
        end = self.fresh(f"{k}_end")
        parts = {acc: self.fresh(f"{acc}_lanes") for acc in accumulators}
        out: list = [ir.Declare(end, "i64", loop.end)]
        out += [ir.LocalArray(parts[acc], dtype, CHUNK) for acc, dtype in accumulators.items()]
        codes = _code_types(loop.body, self.quant)
        if codes:
            # whole blocks first, in one loop of constant trip count; then the ragged last chunk
            whole = "flat" if codes == {"q8_0"} else "fused"
            full = self.fresh(f"{k}_full")
            out.append(ir.Declare(full, "i64", ir.Binary(
                "and", ir.Math("max", (ir.Ref(end, "i64"), _i64(0)), "i64"), _i64(-CHUNK), "i64")))
            out.append(self.chunk_loop(loop, accumulators, parts, _i64(0), ir.Ref(full, "i64"), end, whole))
            out.append(self.chunk_loop(loop, accumulators, parts, ir.Ref(full, "i64"), ir.Ref(end, "i64"), end,
                                       "ragged"))
        else:
            out.append(self.chunk_loop(loop, accumulators, parts, _i64(0), ir.Ref(end, "i64"), end, "ragged"))
        for acc, dtype in accumulators.items():  # a pairwise tree: 5 dependent adds, not 32
            width = CHUNK // 2
            while width:
                z = self.fresh(f"{acc}_z")
                here = ir.Load(parts[acc], ir.Ref(z, "i64"), dtype)
                there = ir.Load(parts[acc], ir.Binary("add", ir.Ref(z, "i64"), _i64(width), "i64"), dtype)
                out.append(ir.For(z, "i64", _i64(0), _i64(width), (
                    ir.Store(parts[acc], ir.Ref(z, "i64"), ir.Binary("add", here, there, dtype)),)))
                width //= 2
            out.append(ir.Assign(acc, ir.Binary("add", ir.Ref(acc, dtype), ir.Load(parts[acc], _i64(0), dtype), dtype)))
        return out

    def chunk_loop(self, loop: ir.For, accumulators: dict[str, str], parts: dict[str, str], start: ir.Expr,
                   stop: ir.Expr, end: str, form: str) -> ir.For:
        """`for k0 in start..stop step 32` over the lanes, in one of three forms:

        - "ragged": each half h runs a loop of min(16, end - k0 - 16 h) trips (any chunk);
        - "fused" (whole chunks only): one loop of 16 constant trips handles lane l of both
          halves, elements k0 + l and k0 + 16 + l, which share one code byte in q4 blocks;
        - "flat" (whole chunks only): one loop of 32 constant trips, element k0 + l with
          half l >> 4 and lane l & 15: contiguous code bytes in q8_0 blocks.

        Every form adds element k0 + 16 h + l to lane 16 h + l, in the same order, so they
        give the same result. The constant trip counts let LLVM turn each lane loop into
        whole vectors and keep the lanes in registers; with a light body (an f32 dot
        product) LLVM unrolls such a loop instead and leaves it scalar, which is why only
        bodies that read quantized codes get them."""
        k = loop.var
        k0 = self.fresh(f"{k}0")
        shared_lane = self.fresh(f"{k}_lane") if form != "ragged" else None
        if form == "flat":
            return self.flat_chunk_loop(loop, accumulators, parts, start, stop, k0, shared_lane)
        hoisted: dict[ir.Expr, str] = {}  # block scale/min -> its local, read once per block
        per_lane: set[str] = {k}
        chunk_body: list = []
        fused_body: list = []
        for h in range(CHUNK // HALF):
            base = self.fresh(f"{k}_base")
            first = ir.Ref(k0, "i64") if h == 0 else ir.Binary("add", ir.Ref(k0, "i64"), _i64(HALF * h), "i64")
            chunk_body.append(ir.Declare(base, "i64", first))
            lane = shared_lane or self.fresh(f"{k}_lane")
            if form == "ragged":
                count = self.fresh(f"{k}_count")
                chunk_body.append(ir.Declare(count, "i64", ir.Math("min", (_i64(HALF), ir.Binary(
                    "sub", ir.Ref(end, "i64"), ir.Ref(base, "i64"), "i64")), "i64")))
            renames = {k: self.fresh(k)}
            inner: list = [ir.Declare(renames[k], "i64", ir.Binary("add", ir.Ref(base, "i64"), ir.Ref(lane, "i64"), "i64"))]
            for s in loop.body:
                if isinstance(s, ir.Declare):
                    renames[s.name] = self.fresh(s.name)
            per_lane |= {lane, *renames, *renames.values()}
            slot = ir.Ref(lane, "i64") if h == 0 else ir.Binary("add", _i64(HALF * h), ir.Ref(lane, "i64"), "i64")

            def hoist(x: ir.Expr) -> ir.Expr | None:
                """A block scale or minimum that no lane variable reaches: read it once, before
                the lane loops (the f16 decode is otherwise redone for every element)."""
                if isinstance(x, (ir.QuantScale, ir.QuantMin)) and not refs(x.block) & per_lane:
                    if x not in hoisted:
                        hoisted[x] = self.fresh(f"{x.buf}_{'scale' if isinstance(x, ir.QuantScale) else 'min'}")
                    return ir.Ref(hoisted[x], x.dtype)
                return None

            def local(e: ir.Expr, h=h, lane=lane, renames=renames) -> ir.Expr:
                e = rewrite(e, lambda x: _quant_index(x, k, k0, h, lane))
                e = rewrite(e, hoist)
                return rewrite(e, lambda x: ir.Ref(renames[x.name], x.dtype)
                               if isinstance(x, ir.Ref) and x.name in renames else None)

            for s in loop.body:
                if isinstance(s, ir.Declare):
                    inner.append(ir.Declare(renames[s.name], s.dtype, local(s.value)))
                else:
                    current = ir.Load(parts[s.name], slot, accumulators[s.name])
                    inner.append(ir.Store(parts[s.name], slot, accumulate(s, current, local)))
            if form == "fused":
                fused_body += inner
            else:
                chunk_body.append(ir.For(lane, "i64", _i64(0), ir.Ref(count, "i64"), tuple(inner)))
        if form == "fused":
            chunk_body.append(ir.For(shared_lane, "i64", _i64(0), _i64(HALF), tuple(fused_body)))
        loads = [ir.Declare(name, x.dtype, x) for x, name in hoisted.items()]
        return ir.For(k0, "i64", start, stop, tuple(loads + chunk_body), step=CHUNK)

    def flat_chunk_loop(self, loop: ir.For, accumulators: dict[str, str], parts: dict[str, str], start: ir.Expr,
                        stop: ir.Expr, k0: str, lane: str) -> ir.For:
        """The "flat" form of `chunk_loop`: `for l in 0..32`, element k = k0 + l in lane l."""
        k = loop.var
        hoisted: dict[ir.Expr, str] = {}
        renames = {k: self.fresh(k)}
        for s in loop.body:
            if isinstance(s, ir.Declare):
                renames[s.name] = self.fresh(s.name)
        per_lane = {k, lane, *renames, *renames.values()}
        l = ir.Ref(lane, "i64")
        half = ir.Binary("shr", l, _i64(4), "i64")
        within = ir.Binary("and", l, _i64(HALF - 1), "i64")

        def split_index(x: ir.Expr) -> ir.Expr | None:
            kref = ir.Ref(k, "i64")
            if x == ir.Binary("shr", kref, _i64(5), "i64"):
                return ir.Binary("shr", ir.Ref(k0, "i64"), _i64(5), "i64")
            if x == ir.Binary("and", ir.Binary("shr", kref, _i64(4), "i64"), _i64(1), "i64"):
                return half
            if x == ir.Binary("and", kref, _i64(15), "i64"):
                return within
            return None

        def hoist(x: ir.Expr) -> ir.Expr | None:
            if isinstance(x, (ir.QuantScale, ir.QuantMin)) and not refs(x.block) & per_lane:
                if x not in hoisted:
                    hoisted[x] = self.fresh(f"{x.buf}_{'scale' if isinstance(x, ir.QuantScale) else 'min'}")
                return ir.Ref(hoisted[x], x.dtype)
            return None

        def local(e: ir.Expr) -> ir.Expr:
            e = rewrite(rewrite(e, split_index), hoist)
            return rewrite(e, lambda x: ir.Ref(renames[x.name], x.dtype)
                           if isinstance(x, ir.Ref) and x.name in renames else None)

        inner: list = [ir.Declare(renames[k], "i64", ir.Binary("add", ir.Ref(k0, "i64"), l, "i64"))]
        for s in loop.body:
            if isinstance(s, ir.Declare):
                inner.append(ir.Declare(renames[s.name], s.dtype, local(s.value)))
            else:
                inner.append(ir.Store(parts[s.name], l, accumulate(s, ir.Load(parts[s.name], l, accumulators[s.name]), local)))
        loads = [ir.Declare(name, x.dtype, x) for x, name in hoisted.items()]
        body = tuple(loads) + (ir.For(lane, "i64", _i64(0), _i64(CHUNK), tuple(inner)),)
        return ir.For(k0, "i64", start, stop, body, step=CHUNK)


def _code_types(body: tuple, quant: dict[str, str]) -> set[str]:
    """The quantized dtypes whose codes a loop body reads (see `chunk_loop` for why it matters)."""
    found: set[str] = set()
    for s in body:
        value = s.value if isinstance(s, (ir.Declare, ir.Assign)) else None
        if value is not None:
            rewrite(value, lambda x: found.add(quant.get(x.buf, "")) if isinstance(x, ir.QuantCode) else None)
    return found


def _quant_index(e: ir.Expr, k: str, k0: str, h: int, lane: str) -> ir.Expr | None:
    """The lowering's block/sub/lane split of `k` when k = k0 + 16 h + lane, k0 % 32 == 0, lane < 16."""
    kref = ir.Ref(k, "i64")
    if e == ir.Binary("shr", kref, _i64(5), "i64"):
        return ir.Binary("shr", ir.Ref(k0, "i64"), _i64(5), "i64")
    if e == ir.Binary("and", ir.Binary("shr", kref, _i64(4), "i64"), _i64(1), "i64"):
        return _i64(h)
    if e == ir.Binary("and", kref, _i64(15), "i64"):
        return ir.Ref(lane, "i64")
    return None


def terms(s: ir.Stmt) -> tuple[ir.Expr, ...] | None:
    """What an accumulator update adds, without the accumulator: `x` of `acc = acc + x`,
    `a, b` of `acc = fma(a, b, acc)` (a product added with one rounding); None otherwise."""
    if not (isinstance(s, ir.Assign) and ir.is_float(s.value.dtype)):
        return None
    acc, v = ir.Ref(s.name, s.value.dtype), s.value
    if isinstance(v, ir.Binary) and v.op == "add" and v.a == acc:
        return (v.b,)
    if isinstance(v, ir.Math) and v.fn == "fma" and v.args[2] == acc:
        return v.args[:2]
    return None


def accumulate(s: ir.Assign, current: ir.Expr, local) -> ir.Expr:
    """The update `s` applied to `current` (a lane) instead of its accumulator, its terms through `local`."""
    parts = tuple(local(t) for t in terms(s))
    if isinstance(s.value, ir.Math):
        return ir.Math("fma", parts + (current,), s.value.dtype)
    return ir.Binary("add", current, parts[0], s.value.dtype)


def reduction(loop: ir.For) -> dict[str, str] | None:
    """The float accumulators of a splittable loop (name -> dtype), or None.

    Splittable: `for k: i64 in 0..E` with step 1 whose body is only immutable `Declare`s
    and one update (`acc = acc + x` or `acc = fma(a, b, acc)`, see `terms`) per float
    accumulator `acc` declared outside the loop, where nothing in the body (and nothing
    in E) reads an accumulator except those updates."""
    if loop.dtype != "i64" or loop.step != 1 or loop.start != _i64(0) or not loop.body:
        return None
    accumulators: dict[str, str] = {}
    declared: set[str] = set()
    reads = refs(loop.end)
    for s in loop.body:
        if isinstance(s, ir.Declare) and not s.mutable:
            declared.add(s.name)
            reads |= refs(s.value)
        elif (added := terms(s)) is not None and s.name not in declared and s.name not in accumulators:
            accumulators[s.name] = s.value.dtype
            for t in added:
                reads |= refs(t)
        else:
            return None
    if not accumulators or reads & set(accumulators):
        return None
    return accumulators
