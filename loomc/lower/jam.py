"""IR pass: block 4 lanes of a quantized dot product and jam their reductions.

A matmul over quantized weights runs one lane per (token t, output n), and each lane
dequantizes row n of the weights. With T tokens every weight element is decoded T times.
When the lane body is a plain dot product

    parallel for t in 0..T, n in 0..N { var acc = 0; for k in 0..K { acc += x[t, k] * w[n, k] }; y[t, n] = acc }

and `t` never reaches a quantized read, this pass makes each lane handle 4 consecutive t:

    parallel for tb in 0..ceil(T / 4), n in 0..N {
        if tb * 4 + 3 < T {            // a full block: one k loop, four accumulators
            var acc_0 = 0 ... var acc_3 = 0
            for k in 0..K { acc_j += x[t_j, k] * w[n, k]  (j = 0..3) }
            y[t_j, n] = acc_j
        } else {                       // the ragged end (and T < 4): the original body
            for j in 0..min(4, T - tb * 4) { <original body with t = tb * 4 + j> }
        }
    }

so the four uses of `w[n, k]` are one expression that a target computes once. Then the
output rows are paired the same way (`block_rows`): a whole tile is 4 tokens x 2 rows,
whose k loop loads each token's activation once for both rows; anything else runs the
4-token body once per row. Each (token, row) sum is the same sequence of operations as
before (the pass changes what runs together, not any result), and `lanes.split_group`
then splits the jammed loop's accumulators.
"""

from __future__ import annotations

import dataclasses

from loomc.ir import module as ir
from loomc.lower.lanes import _declared_names, reduction, refs, rewrite
from loomc.lower.names import FreshNames
from loomc.lower.scalars import add, mul

BLOCK = 4  # tokens per tile
ROWS = 2  # output rows per tile (see block_rows)
_QUANT = (ir.QuantScale, ir.QuantMin, ir.QuantCode)


def jam_group(group: ir.KernelGroup) -> ir.KernelGroup:
    return dataclasses.replace(group, parts=tuple(jam_kernel(k) for k in group.parts))


def jam_kernel(kernel: ir.Kernel) -> ir.Kernel:
    body = list(kernel.body)
    loop = body[-1]
    if not isinstance(loop, ir.ParallelFor) or len(loop.lanes) < 2:
        return kernel
    choice = _blockable_lane(loop)
    if choice is None:
        return kernel
    jammer = _Jammer(_declared_names(kernel))
    try:
        body[-1] = jammer.block_lane(loop, choice)
    except _NotJammable:
        return kernel
    try:
        body[-1] = jammer.block_rows(body[-1], loop, choice)
    except _NotJammable:
        pass
    return dataclasses.replace(kernel, body=tuple(body))


def _quant_refs(body) -> tuple[bool, set[str]]:
    """Whether the statements read quantized blocks, and every name those reads depend on."""
    found: list[ir.Expr] = []

    def visit(e):
        if isinstance(e, _QUANT):
            found.append(e)
        return None

    for s in _all_stmts(body):
        for e in _exprs(s):
            rewrite(e, visit)
    names: set[str] = set()
    for e in found:
        names |= refs(e)
    return bool(found), names


def _all_stmts(body):
    for s in body:
        yield s
        for inner in ("body", "then", "orelse"):
            yield from _all_stmts(getattr(s, inner, ()))


def _exprs(s) -> list[ir.Expr]:
    if isinstance(s, (ir.Declare, ir.Assign)):
        return [s.value]
    if isinstance(s, ir.Store):
        return [s.index, s.value]
    if isinstance(s, ir.For):
        return [s.start, s.end]
    return []


def _shape_ok(body) -> bool:
    """Top level: declarations, reduction loops (see lanes.reduction) and stores only."""
    for s in body:
        if isinstance(s, ir.For):
            if reduction(s) is None:
                return False
        elif not isinstance(s, (ir.Declare, ir.Store, ir.Assign)):
            return False
    return any(isinstance(s, ir.For) for s in body)


def _blockable_lane(loop: ir.ParallelFor) -> int | None:
    if not _shape_ok(loop.body):
        return None
    reads_quant, quant_names = _quant_refs(loop.body)
    if not reads_quant:
        return None
    # names derived from each lane variable (through declarations) must stay out of quantized reads
    for index, lane in enumerate(loop.lanes[:-1]):
        tainted = {lane.var}
        for s in _all_stmts(loop.body):
            if isinstance(s, ir.Declare) and refs(s.value) & tainted:
                tainted.add(s.name)
        if lane.dtype == "i64" and not (tainted & quant_names):
            return index
    return None


@dataclasses.dataclass(frozen=True)
class _Tiling:
    """A lane variable split into tiles of `size`: the tile lane, the declaration of the
    tile's first value, whether the tile is whole, and the loop over what a tile holds."""

    lane: ir.Lane
    first: ir.Declare
    whole: ir.Expr
    var: str
    counter: str
    remaining: ir.Expr

    def each(self, body: tuple) -> ir.For:
        """`body` once per value of the tile (the ragged end: fewer than `size` at the end),
        in a loop whose trip count is only known at run time (so a target keeps one copy)."""
        one = ir.Declare(self.var, "i64", ir.Binary("add", ir.Ref(self.first.name, "i64"),
                                                      ir.Ref(self.counter, "i64"), "i64"))
        return ir.For(self.counter, "i64", ir.Const("i64", 0), self.remaining, (one,) + body)


class _Jammer(FreshNames):
    def tiling(self, lane: ir.Lane, size: int, label: str) -> _Tiling:
        i64 = lambda v: ir.Const("i64", v)
        ref = lambda name: ir.Ref(name, "i64")
        tile, base, counter = (self.fresh(f"{lane.var}_{suffix}") for suffix in (label, "first", "j"))
        end = lane.end
        extent = end if lane.start == i64(0) else ir.Binary("sub", end, lane.start, "i64")
        tiles = ir.Binary("div", add(extent, i64(size - 1)), i64(size), "i64")
        return _Tiling(
            lane=ir.Lane(tile, "i64", i64(0), tiles),
            first=ir.Declare(base, "i64", add(lane.start, mul(ref(tile), i64(size)))),
            whole=ir.Binary("lt", ir.Binary("add", ref(base), i64(size - 1), "i64"), end, "bool"),
            var=lane.var, counter=counter,
            remaining=ir.Math("min", (i64(size), ir.Binary("sub", end, ref(base), "i64")), "i64"))

    def block_lane(self, loop: ir.ParallelFor, index: int) -> ir.ParallelFor:
        tokens = self.tiling(loop.lanes[index], BLOCK, "block")
        lanes = list(loop.lanes)
        lanes[index] = tokens.lane
        jammed = self.jam(loop.body, tokens.var, ir.Ref(tokens.first.name, "i64"))
        return ir.ParallelFor(tuple(lanes), (tokens.first, ir.If(tokens.whole, jammed, (tokens.each(loop.body),))))

    def block_rows(self, jammed: ir.ParallelFor, original: ir.ParallelFor, index: int) -> ir.ParallelFor:
        """Pair the output rows of a token-blocked matmul: each lane takes rows n, n + 1 too.

        The 4 x 2 tile's k loop reads each activation once for both rows (4 tokens' worth of
        x loads per block is what a 4-token tile waits on), and a lane's fixed costs are
        shared by twice the work. Tiles that are not whole (fewer than 4 tokens left, the
        last odd row, and every tile at T < 4) run the token-blocked body once per row."""
        row = len(original.lanes) - 1
        if row == index or original.lanes[row].dtype != "i64":
            raise _NotJammable
        first, branch = jammed.body
        if not (isinstance(first, ir.Declare) and isinstance(branch, ir.If)):
            raise _NotJammable
        rows = self.tiling(original.lanes[row], ROWS, "pair")
        lanes = list(jammed.lanes)
        lanes[row] = rows.lane
        # token tiles vary fastest: the tiles of one row pair run back to back (and on one
        # thread), so a weight matrix larger than the caches (an LM head) streams from memory
        # once per call, not once per token tile
        lanes.append(lanes.pop(index))
        tile = self.jam(branch.then, rows.var, ir.Ref(rows.first.name, "i64"), ROWS)
        return ir.ParallelFor(tuple(lanes), (rows.first, first, ir.If(
            ir.Binary("land", branch.cond, rows.whole, "bool"), tile, (rows.each((branch,)),))))

    def jam(self, body: tuple, var: str, base: ir.Expr, count: int = BLOCK) -> tuple:
        """`count` copies of `body` for var = base + c, sharing what does not depend on var.
        Every name the jammed statements declare is fresh: the ragged branch keeps the originals."""
        copies = [{var: add(base, ir.Const("i64", c))} for c in range(count)]
        return tuple(self.stmts(body, copies, {var}))

    @staticmethod
    def subst(e: ir.Expr, mapping: dict) -> ir.Expr:
        def visit(x):
            if isinstance(x, ir.Ref) and x.name in mapping:
                target = mapping[x.name]
                return target if isinstance(target, ir.EXPR_KINDS) else ir.Ref(target, x.dtype)
            return None

        return rewrite(e, visit)

    def stmts(self, body, copies: list[dict], varying: set[str]) -> list:
        out: list = []
        for s in body:
            if isinstance(s, ir.For):
                if (refs(s.start) | refs(s.end)) & varying:
                    raise _NotJammable
                var = self.fresh(s.var)
                for mapping in copies:
                    mapping[s.var] = var
                inner = self.stmts(s.body, copies, varying)
                out.append(dataclasses.replace(s, var=var, start=self.subst(s.start, copies[0]),
                                               end=self.subst(s.end, copies[0]), body=tuple(inner)))
                continue
            reads = set().union(*(refs(e) for e in _exprs(s)))
            per_copy = bool(reads & varying) or isinstance(s, (ir.Assign, ir.Store)) or \
                (isinstance(s, ir.Declare) and s.mutable)
            if not per_copy:  # a shared declaration: computed once for the block
                name = self.fresh(s.name)
                out.append(ir.Declare(name, s.dtype, self.subst(s.value, copies[0]), s.mutable))
                for mapping in copies:
                    mapping[s.name] = name
                continue
            if isinstance(s, ir.Assign):  # decode a shared weight element once, not once per copy
                value, shared = self.hoist(s.value, varying, copies[0])
                out += shared
                s = ir.Assign(s.name, value)
            if isinstance(s, ir.Declare):
                varying.add(s.name)
            for c, mapping in enumerate(copies):
                if isinstance(s, ir.Declare):
                    name = self.fresh(f"{s.name}_{c}")
                    out.append(ir.Declare(name, s.dtype, self.subst(s.value, mapping), s.mutable))
                    mapping[s.name] = name
                elif isinstance(s, ir.Assign):
                    out.append(ir.Assign(mapping[s.name], self.subst(s.value, mapping)))
                else:
                    out.append(ir.Store(s.buf, self.subst(s.index, mapping), self.subst(s.value, mapping)))
        return out


    def hoist(self, e: ir.Expr, varying: set[str], mapping: dict) -> tuple[ir.Expr, list]:
        """Replace the largest subexpressions that read quantized blocks but not `varying`
        names by shared `let`s."""
        shared: list = []

        def visit(x):
            if isinstance(x, (ir.Const, ir.Ref)) or refs(x) & varying or not _reads_quant(x):
                return None
            name = self.fresh("w_elem")
            shared.append(ir.Declare(name, x.dtype, self.subst(x, mapping)))
            return ir.Ref(name, x.dtype)

        return rewrite(e, visit), shared


def _reads_quant(e: ir.Expr) -> bool:
    if isinstance(e, _QUANT):
        return True
    return any(_reads_quant(c) for c in ir.children(e))


class _NotJammable(Exception):
    """A loop bound depends on the blocked lane: the copies cannot share one loop."""
