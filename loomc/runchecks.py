"""Run the `check` blocks of `.loom` files and model documents on the control VM (`loomc test`,
whose command is `loomc/cli/test.py`).

A check passes when it runs to its end; it fails at its first false `expect`, at a
run-time error, or at a `fail(...)`, and the reason starts with `path:line:col`. The
checks run are those of the files named (directly or through a folder) and, for a model
document, of its control, prepare and source files, with the document's config overrides
applied; files reached only through `use` are not tested. Documents run first, so a
check reached both ways runs once, as deployed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a command runs, so `loomc --help` stays fast
    from loomc.check import CheckedProgram
    from loomc.syntax.diagnostics import Diagnostic


@dataclass(frozen=True)
class CheckResult:
    name: str  # path::check
    ok: bool
    reason: str = ""


def run_checks(checked: CheckedProgram, paths: set[str], budget: int | None = None,
               done: set[str] | None = None) -> list[CheckResult]:
    """Run the checks of the modules whose display path is in `paths`, skipping names in `done`
    (and adding the ones run to it). `checked` must be ok."""
    from loomc.lower.vm import compile_program
    from loomc.run.errors import PolicyFailure, VmError
    from loomc.run.vm import Vm

    done = set() if done is None else done
    program = compile_program(checked)
    vm = Vm(program)
    results = []
    for check in program.checks:
        if check.path not in paths or check.qualname in done:
            continue
        done.add(check.qualname)
        try:
            vm.run_check(check, budget)
        except PolicyFailure as exc:
            reason = f"{exc.path}:{exc.line}:{exc.column}: fail({exc.status}, {exc.message!r})"
            results.append(CheckResult(check.qualname, False, reason))
        except VmError as exc:
            via = f" (called from {', '.join(exc.trace[1:])})" if len(exc.trace) > 1 else ""
            results.append(CheckResult(check.qualname, False, exc.message + via))
        else:
            results.append(CheckResult(check.qualname, True))
    return results


def run_targets(files: list[Path], documents: list[Path], budget: int | None = None
                ) -> tuple[list[CheckResult], list[Diagnostic], dict[str, str]]:
    """Check and run every target; returns the results and the diagnostics of targets that did not check."""
    from loomc.check import load_files
    from loomc.check.document import load_document
    from loomc.check.program import display_path

    results: list[CheckResult] = []
    diagnostics: list[Diagnostic] = []
    sources: dict[str, str] = {}
    done: set[str] = set()
    runs: list[tuple[CheckedProgram, set[str]]] = []
    for doc in documents:
        checked = load_document(doc)
        runs.append((checked, {info.path for infos in checked.roles.values() for info in infos}))
    if files:
        runs.append((load_files(files), {display_path(p) for p in files}))
    for checked, paths in runs:
        sources.update(checked.sources)
        if not checked.ok:
            diagnostics += checked.diagnostics
            continue
        results += run_checks(checked, paths, budget, done)
    return results, diagnostics, sources


__all__ = ["CheckResult", "run_checks", "run_targets"]
