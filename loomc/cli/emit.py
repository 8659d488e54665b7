"""`loomc emit`: print the generated kernel code for a `.loom` file, folder or model document.

For `--target cpu` it prints exactly the module text that `loomc/lower/numba.py` writes to the
kernel cache (one module per kernel, each headed by its source file and line); `--ir`
prints the lowered IR instead. Nothing is compiled. `--target cuda` prints the one CUDA
module (`loomc/lower/cuda.py`) that `loomc.run.cuda` would compile for the selected kernels.
"""

from __future__ import annotations

import sys

import click

from loomc.cli.common import collect_targets, internal_errors, report
from loomc.syntax import ast


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--target", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="The back end whose code to print.")
@click.option("--kernel", "names", multiple=True, help="Only these kernels (repeatable).")
@click.option("--ir", "show_ir", is_flag=True, help="Print the lowered IR instead of target code.")
@internal_errors
def emit(paths: tuple[str, ...], target: str, names: tuple[str, ...], show_ir: bool) -> None:
    """Print the generated kernel code of .loom files, folders or model documents."""
    from loomc.check import load_files
    from loomc.check.document import load_document
    from loomc.ir.printer import group as print_group
    from loomc.lower.kernels import lower_kernel
    from loomc.lower.numba import render_module
    from loomc.lower.scalars import LoweringError

    cuda_groups: dict = {}  # --target cuda: one module for the whole kernel set
    files, documents, problems = collect_targets(paths)
    programs = [load_files(files)] if files else []
    programs += [load_document(d) for d in documents]
    diagnostics = list(problems)
    sources: dict[str, str] = {}
    for checked in programs:
        diagnostics += checked.diagnostics
        sources.update(checked.sources)
    if diagnostics:
        report(diagnostics, sources, as_json=False)
        sys.exit(1)
    seen: set[tuple[str, str]] = set()
    texts: list[str] = []
    for checked in programs:
        for info in sorted(checked.modules, key=lambda m: m.path):
            for item in info.module.items:
                if not isinstance(item, ast.Kernel) or (names and item.name not in names):
                    continue
                if (info.key, item.name) in seen:
                    continue
                seen.add((info.key, item.name))
                try:
                    group = lower_kernel(checked.core, info, item)
                except LoweringError as exc:
                    click.echo(f"{exc.path}:{exc.span.line}:{exc.span.column}: error: {exc.message}", err=True)
                    sys.exit(1)
                if target == "cuda" and not show_ir:
                    cuda_groups[f"{info.key}:{item.name}"] = group
                    continue
                texts.append(print_group(group) if show_ir else render_module(group))
    missing = sorted(set(names) - {name for _, name in seen})
    if missing:
        click.echo(f"no kernel named {', '.join(missing)}", err=True)
        sys.exit(1)
    if cuda_groups:
        from loomc.lower.cuda import render_module as render_cuda

        texts.append(render_cuda(cuda_groups).text)
    click.echo("\n\n".join(t.rstrip("\n") for t in texts))
