"""The shared skeleton of the kernel renderers (`numba.py`, `cuda.py`), tinygrad-style: one
base holds the line buffer, temporaries and the dispatch by IR node kind; each target file
supplies its spelling of names and constants and its `expr_*`/`stmt_*` table."""

from __future__ import annotations

from typing import Callable

from loomc.ir import module as ir


class TargetRenderer:
    """Renders IR to one target's source text. Subclasses set `temp_prefix`, `const` and `var`."""

    temp_prefix: str = "_"
    const: Callable[[str, object], str]
    var: Callable[[str], str]

    def __init__(self, kernel: ir.Kernel | None = None):
        self.kernel = kernel
        self.quant = {} if kernel is None else {
            p.name: p.dtype for p in kernel.params if isinstance(p, ir.BufferParam) and p.dtype in ir.QUANT_DTYPES}
        self.lines: list[str] = []
        self.temps = 0

    def add(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def temp(self, base: str) -> str:
        self.temps += 1
        return f"{self.temp_prefix}{base}{self.temps}"

    def expr(self, e: ir.Expr) -> str:
        return getattr(self, "expr_" + type(e).__name__.lower())(e)

    def expr_const(self, e: ir.Const) -> str:
        return self.const(e.dtype, e.value)

    def expr_ref(self, e: ir.Ref) -> str:
        return self.var(e.name)
