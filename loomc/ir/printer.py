"""A readable dump of lowered kernels, for `loomc emit --ir` and for test failure messages.

Expressions print infix with C-like operators; constants, conversions and loads show
their dtype (`2.0:f32`, `f32(i)`, `x[t * D + d]:f32`) so a type error is visible in the text.
"""

from __future__ import annotations

from loomc.ir import module as ir

_INFIX = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%", "and": "&", "or": "|", "xor": "^",
    "shl": "<<", "shr": ">>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
    "land": "&&", "lor": "||",
}
_PREFIX = {"neg": "-", "not": "!", "invert": "~"}


def expr(e: ir.Expr) -> str:
    if isinstance(e, ir.Const):
        if e.dtype == "bool":
            return "true" if e.value else "false"
        return f"{e.value!r}:{e.dtype}"
    if isinstance(e, ir.Ref):
        return e.name
    if isinstance(e, ir.Unary):
        return f"{_PREFIX[e.op]}{_operand(e.x)}"
    if isinstance(e, ir.Binary):
        return f"{_operand(e.a)} {_INFIX[e.op]} {_operand(e.b)}"
    if isinstance(e, ir.Select):
        return f"select({expr(e.cond)}, {expr(e.a)}, {expr(e.b)})"
    if isinstance(e, ir.Math):
        return f"{e.fn}({', '.join(expr(a) for a in e.args)})"
    if isinstance(e, ir.Cast):
        return f"{e.dtype}({expr(e.x)})"
    if isinstance(e, ir.Bitcast):
        return f"bitcast[{e.dtype}]({expr(e.x)})"
    if isinstance(e, ir.Load):
        return f"{e.buf}[{expr(e.index)}]:{e.dtype}"
    if isinstance(e, ir.QuantScale):
        return f"qscale({e.buf}, {expr(e.block)})"
    if isinstance(e, ir.QuantMin):
        return f"qmin({e.buf}, {expr(e.block)})"
    if isinstance(e, ir.QuantCode):
        return f"qcode({e.buf}, {expr(e.block)}, {expr(e.sub)}, {expr(e.lane)})"
    raise TypeError(f"not an IR expression: {e!r}")


def _operand(e: ir.Expr) -> str:
    text = expr(e)
    return f"({text})" if isinstance(e, (ir.Binary,)) else text


def stmts(body: tuple, indent: int) -> list[str]:
    pad = "    " * indent
    out: list[str] = []
    for s in body:
        if isinstance(s, ir.Declare):
            out.append(f"{pad}{'var' if s.mutable else 'let'} {s.name}: {s.dtype} = {expr(s.value)}")
        elif isinstance(s, ir.Assign):
            out.append(f"{pad}{s.name} = {expr(s.value)}")
        elif isinstance(s, ir.LocalArray):
            out.append(f"{pad}var {s.name}: {s.dtype}[{s.size}]  // zeroed")
        elif isinstance(s, ir.Store):
            out.append(f"{pad}{s.buf}[{expr(s.index)}] = {expr(s.value)}")
        elif isinstance(s, ir.For):
            step = f" step {s.step}" if s.step != 1 else ""
            out.append(f"{pad}for {s.var}: {s.dtype} in {expr(s.start)}..{expr(s.end)}{step} {{")
            out += stmts(s.body, indent + 1)
            out.append(f"{pad}}}")
        elif isinstance(s, ir.While):
            out.append(f"{pad}while {expr(s.cond)} {{")
            out += stmts(s.body, indent + 1)
            out.append(f"{pad}}}")
        elif isinstance(s, ir.If):
            out.append(f"{pad}if {expr(s.cond)} {{")
            out += stmts(s.then, indent + 1)
            if s.orelse:
                out.append(f"{pad}}} else {{")
                out += stmts(s.orelse, indent + 1)
            out.append(f"{pad}}}")
        elif isinstance(s, ir.Break):
            out.append(f"{pad}break")
        elif isinstance(s, ir.Continue):
            out.append(f"{pad}continue")
        elif isinstance(s, ir.ParallelFor):
            lanes = ", ".join(f"{l.var}: {l.dtype} in {expr(l.start)}..{expr(l.end)}" for l in s.lanes)
            out.append(f"{pad}parallel for {lanes or '(one lane)'} {{")
            out += stmts(s.body, indent + 1)
            out.append(f"{pad}}}")
        else:
            raise TypeError(f"not an IR statement: {s!r}")
    return out


def kernel(k: ir.Kernel) -> str:
    params = []
    for p in k.params:
        if isinstance(p, ir.BufferParam):
            mode = "out " if p.writable else ""
            params.append(f"{mode}{p.name}: {p.dtype}[{', '.join(expr(d) for d in p.dims)}]")
        else:
            params.append(f"{p.name}: {p.dtype}")
    lines = [f"// {k.source.path}:{k.source.line}",
             f"kernel {k.name}({', '.join(params)}) {{"]
    for s in k.symbols:
        lines.append(f"    // symbol {s.name} = {s.buffer}.shape[{s.axis}]")
    lines += stmts(k.body, 1)
    lines.append("}")
    return "\n".join(lines)


def group(g: ir.KernelGroup) -> str:
    return "\n\n".join(kernel(k) for k in g.parts) + "\n"
