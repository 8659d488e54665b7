"""The checker: resolution through `use`, types without implicit casts, shapes, context rules.

Entry points: `check_files` for plain `.loom` files and `check_document` (in
`document.py`) for a model document's control, prepare and sources together.
All errors of a run are returned, sorted by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomc.check.commands import CommandChecker
from loomc.check.control import ControlChecker
from loomc.check.core import Core
from loomc.check.decls import check_config, check_param, check_stage, check_state, compare_signatures
from loomc.check.kernels import KernelChecker
from loomc.check.program import ModuleInfo, Program, Reporter
from loomc.syntax import ast
from loomc.syntax.diagnostics import Diagnostic


def check_program(program: Program, overrides: dict[str, Any] | None = None) -> Core:
    """Check every loaded module once. Returns the Core so callers can add cross-module checks."""
    core = Core(program, overrides)
    for info in list(program.modules.values()):
        for item in info.module.items:
            if isinstance(item, ast.Config):
                check_config(core, info, item)
            elif isinstance(item, ast.Param):
                check_param(core, info, item)
            elif isinstance(item, ast.State):
                check_state(core, info, item)
            elif isinstance(item, ast.Stage):
                check_stage(core, info, item)
            elif isinstance(item, ast.Kernel):
                KernelChecker(core, info, item).run()
            elif isinstance(item, ast.Command):
                CommandChecker(core, info, item).run()
            elif isinstance(item, (ast.Fn, ast.Check)):
                ControlChecker(core, info, item).run()
    return core


@dataclass
class CheckedProgram:
    """What the back ends start from: the loaded modules, folded configs, and the verdict.

    `roles` names the modules a model document assigned (`control`, `prepare`, `sources`);
    it is empty for loose files. Lower only when `ok`."""

    program: Program
    core: Core | None
    diagnostics: list[Diagnostic]
    sources: dict[str, str]
    roles: dict[str, list[ModuleInfo]] = field(default_factory=dict)
    document: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.core is not None and not self.diagnostics

    @property
    def modules(self) -> list[ModuleInfo]:
        return list(self.program.modules.values())


def load_files(paths: list[Path]) -> CheckedProgram:
    """Load and check `.loom` files (and everything they use).

    Stages are paired with commands only in a model document, which says which control
    program and which sources form one deployment; loose files carry no such pairing."""
    reporter = Reporter()
    program = Program(reporter)
    for path in paths:
        program.load(path)
    core = check_program(program)
    return CheckedProgram(program, core, reporter.sorted(), reporter.sources)


def check_files(paths: list[Path]) -> tuple[list[Diagnostic], dict[str, str]]:
    """Diagnostics and sources read, for `loomc check` on loose files."""
    checked = load_files(paths)
    return checked.diagnostics, checked.sources


def match_stages(core: Core, stage_modules, command_modules, require_all: bool) -> None:
    """Pair each stage with the command of the same name and compare their signatures."""
    commands: dict[str, tuple] = {}
    for info in command_modules:
        for item in info.module.items:
            if isinstance(item, ast.Command):
                commands.setdefault(item.name, (info, item))
    for info in stage_modules:
        for item in info.module.items:
            if not isinstance(item, ast.Stage):
                continue
            found = commands.get(item.name)
            if found is not None:
                compare_signatures(core, found[0], found[1], info, item)
            elif require_all:
                core.error(info, item.name_span, "L0601", f"stage '{item.name}' has no command in the sources",
                           notes=("each stage needs a `command` of the same name in one of the document's sources",))


__all__ = ["CheckedProgram", "check_files", "check_program", "load_files", "match_stages"]
