"""Compile a deployment's code: a `ModelDocument`'s control, prepare and sources into runnable parts.

`compile_deployment` is what a registration's compile phase and every variant staging
run, on a worker thread. It checks the program exactly as `loomc check` does (package
members are read from the uploaded package, never from the disk), compiles the control
program to VM code and every stage's command to a `CommandProgram` for the device's
target, and records the `Contract` a variant must keep: stage declarations, the params
the commands bind (placement: name, dtype, dims, family) and the retained state layout.

Failures are `CompileError` (422) carrying every diagnostic as `path:line:col`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomc.check import CheckedProgram
from loomc.check.document import load_roles
from loomc.check.program import UPLOAD, package_path
from loomc.lower.commands import compile_command
from loomc.lower.scalars import LoweringError
from loomc.lower.vm import VmCompileError, VmProgram, compile_program
from loomc.syntax import ast
from loomc.syntax.diagnostics import Diagnostic
from loomrt.document import FileRef, ModelDocument
from loomrt.errors import CompileError
from loomrt.locator import resolve_locator


def code_path(ref: FileRef, namespace: str = UPLOAD) -> Path:
    """Where the loader reads a code reference: a package member, a server path or a locator's file."""
    if ref.where == "package":
        return package_path(ref.path, namespace)
    if ref.where == "locator":
        return resolve_locator(ref.path)
    return Path(ref.path)


@dataclass(frozen=True)
class Contract:
    """What executables must keep to replace each other on prepared params and retained state."""

    stages: Mapping[str, str]                 # stage name -> its declaration, printed
    params: Mapping[str, tuple]               # param name -> (dtype, dims, family) as commands bind it
    states: Mapping[str, tuple]               # state name -> (dtype, dims)

    def differences(self, other: "Contract") -> list[str]:
        """Why `other` cannot run in place of `self` (empty when it can)."""
        out = []
        for name in sorted(set(self.stages) | set(other.stages)):
            if self.stages.get(name) != other.stages.get(name):
                out.append(f"stage '{name}': the base declares {self.stages.get(name) or 'nothing'}, "
                           f"the candidate {other.stages.get(name) or 'nothing'}")
        for name in sorted(other.params):
            if name in self.params and self.params[name] != other.params[name]:
                out.append(f"param '{name}': the base places {_spec(self.params[name])}, "
                           f"the candidate binds {_spec(other.params[name])}")
            elif name not in self.params:
                out.append(f"param '{name}' is bound by the candidate but not prepared for the base")
        for name in sorted(set(self.states) | set(other.states)):
            if self.states.get(name) != other.states.get(name):
                base = _spec(self.states[name]) if name in self.states else "nothing"
                cand = _spec(other.states[name]) if name in other.states else "nothing"
                out.append(f"state '{name}': the base retains {base}, the candidate {cand}")
        return out


def _spec(spec: tuple) -> str:
    dtype, dims = spec[0], spec[1]
    family = spec[2] if len(spec) > 2 else None
    text = f"{dtype}[{', '.join(map(str, dims))}]"
    return text + (f" for members {family[0]}..{family[1]}" if family else "")


@dataclass
class Executables:
    """One provider set compiled for a target: what a variant is, once ready."""

    checked: CheckedProgram
    programs: dict[str, Any]                  # stage name -> CommandProgram
    control: VmProgram
    contract: Contract
    sources: tuple[str, ...]                  # the providers, as loaded (for records)
    target: str = "cpu"
    notes: list[str] = field(default_factory=list)


def _stage_items(checked: CheckedProgram) -> list[tuple[Any, ast.Stage]]:
    return [(info, item) for info in checked.roles.get("control", [])
            for item in info.module.items if isinstance(item, ast.Stage)]


def _diagnostics_error(what: str, checked: CheckedProgram) -> CompileError:
    return CompileError(what, checked.diagnostics, checked.sources)


def check_deployment(doc: ModelDocument, package: Mapping[str, bytes] | None,
                     sources: tuple[FileRef, ...] | None = None,
                     upload: Mapping[str, bytes] | None = None) -> CheckedProgram:
    """The checked program of `doc`, or of a variant candidate: `sources` replacing the
    document's own, with package references in `sources` naming members of `upload`."""
    packages: dict[str, Mapping[str, bytes]] = {}
    ns = UPLOAD
    if sources is not None:
        ns = MODEL
        if upload is not None:
            packages[UPLOAD] = upload
    if package is not None:
        packages[ns] = package
    control = code_path(doc.control, ns)
    prepare = [code_path(doc.prepare, ns)] if doc.prepare else []
    if sources is None:
        source_paths = [code_path(s, ns) for s in doc.sources]
    else:
        source_paths = [code_path(s, UPLOAD) for s in sources]
    if doc.image is not None:
        prepare += [code_path(doc.image.prepare, ns)] if doc.image.prepare else []
        source_paths += [code_path(s, ns) for s in doc.image.sources]
    checked = load_roles(doc.origin or doc.model, control, prepare, source_paths, dict(doc.config), packages)
    if not checked.ok:
        raise _diagnostics_error(f"model '{doc.model}' does not compile", checked)
    return checked


#: The namespace of the registration's own package while a variant candidate is checked.
MODEL = "model"


def compile_deployment(doc: ModelDocument, package: Mapping[str, bytes] | None, *, target: str = "cpu",
                       sources: tuple[FileRef, ...] | None = None, upload: Mapping[str, bytes] | None = None,
                       cache_dir: Path | None = None) -> Executables:
    """Check, lower and JIT-compile a deployment's code (or a candidate provider set)."""
    checked = check_deployment(doc, package, sources, upload)
    try:
        control = compile_program(checked)
    except VmCompileError as exc:  # pragma: no cover - a checked program always compiles
        raise CompileError(f"control program: {exc}", [], checked.sources) from None
    programs: dict[str, Any] = {}
    stages: dict[str, str] = {}
    for info, stage in _stage_items(checked):
        stages[stage.name] = _print_stage(stage)
        try:
            programs[stage.name] = compile_command(checked, stage.name, target, cache_dir)
        except LoweringError as exc:
            diag = Diagnostic(exc.path, exc.span.line, exc.span.column, "L0900", exc.message)
            raise CompileError(f"model '{doc.model}' does not compile", [diag], checked.sources) from None
        except ValueError as exc:
            raise CompileError(f"stage '{stage.name}': {exc}", [], checked.sources) from None
    params: dict[str, tuple] = {}
    states: dict[str, tuple] = {}
    for program in programs.values():
        for name, spec in program.plan.params.items():
            params[name] = (spec.dtype, tuple(str(d) for d in spec.dims), spec.family)
        for name, spec in program.plan.states.items():
            states[name] = (spec.dtype, tuple(str(d) for d in spec.dims))
    shown = tuple(code_path(s).as_posix() if s.where != "package" else s.path
                  for s in (sources if sources is not None else doc.sources))
    if sources is not None:
        # A candidate's executables are independent of its upload: staging releases the
        # package's bytes once compiled (the registration's own package stays, as it must).
        checked.program.packages.pop(UPLOAD, None)
    return Executables(checked, programs, control, Contract(stages, params, states), shown, target)


def _print_stage(stage: ast.Stage) -> str:
    from loomc.syntax.printer import format_module

    text = format_module(ast.Module("", [stage]))
    return " ".join(text.split())


__all__ = ["Contract", "Executables", "check_deployment", "code_path", "compile_deployment"]
