"""Lowered plans and kernels -> programs that run on a target.

    build_programs(module, target)           every stage of a `CompiledModule`, runnable
    compile_command(checked, name, target)   the `CommandProgram` of command `name`
    compile_kernels(groups, target)          a launcher per lowered kernel
    compile_kernel(checked, name, target)    one kernel's launcher (tests and benchmarks call kernels directly)

The lowering (`loomc.lower`) produces target-neutral data (`CommandPlan`, IR kernel groups)
and generated module text; this is where they meet the executors of `loomc.run`. Only
"cpu" runs command programs so far: "cuda" kernels render (`loomc emit --target cuda`,
`loomc.run.cuda`), but no command program dispatches them, so asking for it is
`TargetNotBuilt`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loomc.check import CheckedProgram
from loomc.ir import module as ir
from loomc.lower.commands import CommandPlan, find_item, specialize
from loomc.lower.kernels import lower_kernel
from loomc.module import CompiledModule
from loomc.run.dispatch import CommandProgram
from loomc.run.errors import TargetNotBuilt
from loomc.run.launch import KernelLauncher
from loomc.syntax import ast

TARGETS = ("cpu", "cuda")


def compile_kernels(groups: dict[str, ir.KernelGroup], target: str = "cpu",
                    cache_dir: Path | None = None) -> dict[str, KernelLauncher]:
    """Launchers for `groups` on `target`."""
    if target == "cuda":
        raise TargetNotBuilt("target 'cuda' is not built yet: command programs (stage dispatch "
                             "and weight binding) run only on the 'cpu' target so far")
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; the targets are 'cpu' and 'cuda'")
    from loomc.lower.numba import load_group

    return {key: KernelLauncher(group, load_group(group, cache_dir)) for key, group in groups.items()}


def build_program(plan: CommandPlan, target: str = "cpu", cache_dir: Path | None = None) -> CommandProgram:
    """The runnable program of a specialized command on `target`."""
    launchers: dict[str, Any] = dict(compile_kernels(plan.kernels, target, cache_dir))
    motifs = {d.callee for d in plan.dispatches if d.kind == "motif"}
    if motifs:
        from loomc.lower.motifs import lowering_of

        launchers.update({name: lowering_of(name).load_function(name, cache_dir) for name in sorted(motifs)})
    return CommandProgram(plan, launchers, target)


def build_programs(module: CompiledModule, target: str = "cpu",
                   cache_dir: Path | None = None) -> dict[str, CommandProgram]:
    """Every stage of a compiled module, runnable on `target`."""
    return {name: build_program(plan, target, cache_dir) for name, plan in module.commands.items()}


def compile_command(checked: CheckedProgram, name: str, target: str = "cpu",
                    cache_dir: Path | None = None) -> CommandProgram:
    """The runnable `CommandProgram` of command `name` for `target`."""
    return build_program(specialize(checked, name), target, cache_dir)


def compile_kernel(checked: CheckedProgram, name: str, target: str = "cpu",
                   cache_dir: Path | None = None) -> KernelLauncher:
    info, kernel = find_item(checked, name, ast.Kernel)
    group = lower_kernel(checked.core, info, kernel)
    return compile_kernels({name: group}, target, cache_dir)[name]


__all__ = ["TARGETS", "build_program", "build_programs", "compile_command", "compile_kernel", "compile_kernels"]
