"""`param` declarations -> the weight-preparation plan: plain data the runtime runs on a checkpoint.

    param wq[l in 0..layers]: q4_1[dim, dim] = checkpoint("blk.{l}.attn_q.weight")
        -> ParamPlan("wq", "q4_1", (576, 576), family=(0, 30), family_var="l",
                     value=FromCheckpoint("blk.{l}.attn_q.weight"))

Every constant is folded here (axes, dims, family bounds), so running a plan needs no
compiler: `loomrt.prepare` walks the `Prep` tree of each member with the checkpoint's
tensors. A checkpoint name keeps its `{var}` placeholder; the runner substitutes the member
index, as it knows which member it prepares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Union

from loomc.check import CheckedProgram
from loomc.check.program import ModuleInfo
from loomc.ir import interpret
from loomc.ir import module as ir
from loomc.lower.kernels import lower_kernel
from loomc.syntax import ast


@dataclass(frozen=True)
class FromCheckpoint:
    name: str  # may hold "{var}": the family member's index


@dataclass(frozen=True)
class Transpose:
    source: "Prep"


@dataclass(frozen=True)
class Cast:
    source: "Prep"
    dtype: str


@dataclass(frozen=True)
class Quantize:
    source: "Prep"
    dtype: str


@dataclass(frozen=True)
class Repack:
    """`repack(t, PANEL)`: `t`'s blocks reordered into `PANEL`'s row panels (loomc/dtypes.py)."""

    source: "Prep"
    dtype: str


@dataclass(frozen=True)
class Concat:
    sources: tuple["Prep", ...]
    axis: int


@dataclass(frozen=True)
class Reshape:
    source: "Prep"
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Constant:
    """A scalar argument of a `compute` kernel, folded to the kernel parameter's dtype."""

    dtype: str
    value: int | float | bool


@dataclass(frozen=True)
class Compute:
    """`compute(kernel, args...)`: the whole param is the kernel's last (`out`) tensor, run once
    on `args` (prepared tensors and constants). `kernel` keys `PreparePlan.kernels`."""

    kernel: str
    args: tuple[Union["Prep", Constant], ...]


Prep = Union[FromCheckpoint, Transpose, Cast, Quantize, Repack, Concat, Reshape, Compute]


@dataclass(frozen=True)
class ParamPlan:
    """One `param`: its declared type, its family (members lo..hi) and how to prepare a member."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    value: Prep
    family: tuple[int, int] | None = None
    family_var: str | None = None
    source: ir.Source | None = None

    @property
    def declared(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.dims))}]"


@dataclass(frozen=True)
class PreparePlan:
    """The params of one resident component, in declaration order, and the lowered kernels
    their `compute` preparations run."""

    params: tuple[ParamPlan, ...] = ()
    kernels: Mapping[str, ir.KernelGroup] = field(default_factory=dict)

    @property
    def reads_checkpoint(self) -> bool:
        """Whether any param reads a checkpoint tensor (a plan of computed params needs none)."""
        def reads(e) -> bool:
            if isinstance(e, FromCheckpoint):
                return True
            children = e.sources if isinstance(e, Concat) else e.args if isinstance(e, Compute) else \
                (e.source,) if hasattr(e, "source") else ()
            return any(reads(c) for c in children if not isinstance(c, Constant))

        return any(reads(p.value) for p in self.params)


def prepare_plan(checked: CheckedProgram, component: str = "primary") -> PreparePlan:
    """The plan of a checked program's `component`: a document's prepare modules for it (all of
    them when it declares no extra component), else every module's params."""
    if not checked.ok:
        raise ValueError("the program has diagnostics; lower only a clean program")
    if not checked.roles:
        return lower_prepare(checked, checked.modules)
    return lower_prepare(checked, checked.roles.get(f"prepare.{component}", checked.roles["prepare"]))


def lower_prepare(checked: CheckedProgram, modules: list[ModuleInfo]) -> PreparePlan:
    """The plan of every `param` declared in `modules` (each module once, in order)."""
    core = checked.core
    seen: set = set()
    params = []
    kernels: dict[str, ir.KernelGroup] = {}
    for info in modules:
        if info.key in seen:
            continue
        seen.add(info.key)
        for item in info.module.items:
            if not isinstance(item, ast.Param):
                continue
            declared = core.tensor_type(info, item.type, None)
            family = var = None
            if item.family is not None:
                family = (int(core.const_eval(info, item.family.start)[0]), int(core.const_eval(info, item.family.end)[0]))
                var = item.family.var
            params.append(ParamPlan(item.name, declared.dtype, tuple(int(d.constant) for d in declared.dims),
                                    _lower(core, info, item.value, kernels), family, var,
                                    ir.Source(info.path, item.span.line)))
    return PreparePlan(tuple(params), kernels)


def _lower(core, info: ModuleInfo, e: ast.Expr, kernels: dict[str, ir.KernelGroup]) -> Prep:
    # The checker accepted the program, so every call is a known preparation with valid arguments.
    fn, args = e.callee.name, e.args
    if fn == "compute":
        sym = core.lookup(info, args[0].name)
        key = f"{sym.module.key}:{sym.item.name}"
        if key not in kernels:
            kernels[key] = lower_kernel(core, sym.module, sym.item)
        lowered = []
        for arg, decl in zip(args[1:], sym.item.args):
            if isinstance(decl.type, ast.TensorTypeRef):
                lowered.append(_lower(core, info, arg, kernels))
            else:
                value = interpret.to_dtype(core.const_eval(info, arg)[0], decl.type.name)
                lowered.append(Constant(decl.type.name, value.item() if hasattr(value, "item") else value))
        return Compute(key, tuple(lowered))
    if fn == "checkpoint":
        return FromCheckpoint(args[0].value)
    if fn == "transpose":
        return Transpose(_lower(core, info, args[0], kernels))
    if fn == "cast":
        return Cast(_lower(core, info, args[0], kernels), args[1].name)
    if fn == "quantize":
        return Quantize(_lower(core, info, args[0], kernels), args[1].name)
    if fn == "repack":
        return Repack(_lower(core, info, args[0], kernels), args[1].name)
    if fn == "concat":
        return Concat(tuple(_lower(core, info, item, kernels) for item in args[0].items),
                      int(core.const_eval(info, args[1])[0]))
    if fn == "reshape":
        return Reshape(_lower(core, info, args[0], kernels),
                       tuple(int(core.dim(info, d, None).constant) for d in args[1].items))
    raise ValueError(f"unknown preparation '{fn}' (the program did not check)")


__all__ = ["Cast", "Compute", "Concat", "Constant", "FromCheckpoint", "ParamPlan", "Prep", "PreparePlan", "Quantize", "Repack",
           "Reshape", "Transpose", "lower_prepare", "prepare_plan"]
