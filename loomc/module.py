"""`CompiledModule`: the one artifact loomc produces for a model package and the runtime consumes.

    checked program (parse + check of control, prepare, sources)
        └─ compile_module ─► CompiledModule
                               stages      name -> StageSpec (declaration, args, results)
                               commands    stage name -> CommandPlan (target-neutral dispatches + kernels)
                               components  "primary" / "image" -> PreparePlan (weight preparation)
                               states      name -> StateSpec (dtype, scope, dims past the host dimension)
                               configs     every `config`, folded (as the control program sees it)
                               control     the VM program of the `fn` policy and `check` blocks

Everything in it is plain data (frozen dataclasses, IR, VM code): the runtime reads it and
never a compiler AST; `loomc.run.compile.build_programs` turns its commands into programs for
a target. A `.loombc` package member carries a checked module, so a module built from
`.loombc` sources is the same as one built from the `.loom` text it is the twin of.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pathlib import Path

from loomc.check import CheckedProgram
from loomc.check.document import load_roles
from loomc.check.intrinsics import STATE_SCOPES
from loomc.check.program import UPLOAD, package_path
from loomc.lower.commands import CommandPlan, TensorSpec, specialize
from loomc.lower.prepare import PreparePlan, lower_prepare, prepare_plan
from loomc.lower.scalars import LoweringError
from loomc.lower.vm import VmProgram, compile_program
from loomc.syntax import ast
from loomc.syntax.diagnostics import Diagnostic

SCOPE_OF_HOST_DIM = {host: scope for scope, host in STATE_SCOPES.items()}


@dataclass(frozen=True)
class StageSpec:
    """A stage declaration: what the host passes and gets back (dims as written, e.g. `T`)."""

    name: str
    declaration: str  # canonical text, one line
    args: tuple[TensorSpec, ...]
    results: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class StateSpec:
    """Retained state: `scope` ("row", "page" or "request") sizes its first dimension on the
    host; `dims` are the rest, folded."""

    name: str
    dtype: str
    scope: str
    dims: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join([STATE_SCOPES[self.scope]] + [str(d) for d in self.dims])}]"


@dataclass(frozen=True)
class CompiledModule:
    name: str
    stages: Mapping[str, StageSpec]
    commands: Mapping[str, CommandPlan]
    components: Mapping[str, PreparePlan]
    states: Mapping[str, StateSpec]
    configs: Mapping[str, Any]
    control: VmProgram
    sources: Mapping[str, str] = field(default_factory=dict)

    def config(self, name: str, default: Any = None) -> Any:
        return self.configs.get(name, default)

    def stage_states(self, stage: str) -> list[StateSpec]:
        """The states a stage's command binds."""
        return [self.states[name] for name in self.commands[stage].states]


class ModuleError(Exception):
    """A package that does not compile: every diagnostic (path:line:col), with the sources read."""

    def __init__(self, diagnostics: list[Diagnostic], sources: Mapping[str, str]):
        super().__init__("\n".join(d.header() for d in diagnostics))
        self.diagnostics = list(diagnostics)
        self.sources = dict(sources)


def build_module(origin: str, control: Path, prepare: Mapping[str, list[Path]], sources: list[Path],
                 overrides: Mapping[str, Any], packages: Mapping[str, Mapping[str, bytes]] | None = None
                 ) -> CompiledModule:
    """Check and compile a model package's code, as a runtime model document names it:
    `prepare` maps each resident component to its prepare files; package members are read
    from `packages` under `package_path(member, namespace)`. `ModuleError` when it does not
    compile."""
    checked = load_roles(origin, control, prepare, sources, dict(overrides), packages)
    if not checked.ok:
        raise ModuleError(checked.diagnostics, checked.sources)
    try:
        return compile_module(checked, origin, tuple(prepare))
    except LoweringError as exc:
        raise ModuleError([Diagnostic(exc.path, exc.span.line, exc.span.column, "L0900", exc.message)],
                          checked.sources) from None


def compile_module(checked: CheckedProgram, name: str, components: tuple[str, ...] = ("primary",)) -> CompiledModule:
    """The module of a checked model package. `components` are the resident components whose
    prepare files `load_roles` kept apart (`prepare.<component>` roles); a program with no
    such roles (loose files) prepares every param as `primary`. Raises `LoweringError` where a
    command cannot be specialized."""
    if not checked.ok:
        raise ValueError("the program has diagnostics; compile only a clean program")
    stages: dict[str, StageSpec] = {}
    commands: dict[str, CommandPlan] = {}
    for info in checked.roles.get("control", []):
        for item in info.module.items:
            if isinstance(item, ast.Stage):
                plan = specialize(checked, item.name)
                stages[item.name] = StageSpec(item.name, _print_stage(item), plan.args, plan.results)
                commands[item.name] = plan
    states: dict[str, StateSpec] = {}
    for plan in commands.values():
        for spec in plan.states.values():
            scope = SCOPE_OF_HOST_DIM[spec.dims[0].bare_symbol]
            states[spec.name] = StateSpec(spec.name, spec.dtype, scope, tuple(int(d.constant) for d in spec.dims[1:]))
    if any(role.startswith("prepare.") for role in checked.roles):
        plans = {c: lower_prepare(checked, checked.roles.get(f"prepare.{c}", [])) for c in components}
    else:
        plans = {"primary": prepare_plan(checked)}
    _check_params_agree(commands, plans)
    return CompiledModule(name, stages, commands, plans, states, _configs(checked), compile_program(checked),
                          dict(checked.sources))


def _check_params_agree(commands: dict[str, CommandPlan], plans: dict) -> None:
    """A command's param must be prepared with its type. The runtime binds prepared params by
    name, and two storages can share a numpy shape (q4_1 and its q4_1x16 panels), so a document
    whose prepare files declare another `wqkv` than the one the sources `use` would run on
    bytes in the wrong order; refuse it here, where both declarations are known."""
    prepared: dict[str, list] = {}
    for plan in plans.values():   # each component's own params (two may share a name)
        for p in plan.params:
            prepared.setdefault(p.name, []).append(p)
    for command in commands.values():
        for spec in command.params.values():
            dims = tuple(int(d.constant) for d in spec.dims) if spec.dims is not None else ()
            declared = prepared.get(spec.name, [])
            if declared and all((p.dtype, p.dims) != (spec.dtype, dims) for p in declared):
                given = declared[0]
                where = given.source or command.source
                raise LoweringError(where.path, ast.Span(where.line, 1, where.line, 1),
                                    f"command '{command.name}' reads param '{spec.name}' as "
                                    f"{spec.dtype}[{', '.join(map(str, dims))}], but the prepare files declare "
                                    f"{given.declared}: the sources `use` another declaration of it")


def _configs(checked: CheckedProgram) -> dict[str, Any]:
    """Every `config` folded: as the control program sees it where it does, else as declared."""
    core = checked.core
    out: dict[str, Any] = {}
    for info in checked.modules:
        for item in info.module.items:
            if isinstance(item, ast.Config):
                out.setdefault(item.name, core.config_value(info.scope[item.name]))
    for info in checked.roles.get("control", []):
        for name, sym in info.scope.items():
            if isinstance(sym.item, ast.Config):
                out[name] = core.config_value(sym)
    return out


def _print_stage(stage: ast.Stage) -> str:
    from loomc.syntax.printer import format_module

    return " ".join(format_module(ast.Module("", [stage])).split())


__all__ = ["UPLOAD", "CompiledModule", "ModuleError", "StageSpec", "StateSpec", "build_module", "compile_module",
           "package_path"]
