"""`loomc fmt`: rewrite `.loom` files in canonical form (`--check`: only say which would change)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from loomc.cli.common import collect_targets, internal_errors, report
from loomc.syntax.diagnostics import Diagnostic


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--check", "check_only", is_flag=True, help="Do not write; exit 1 if any file is not canonical.")
@internal_errors
def fmt(paths: tuple[str, ...], check_only: bool) -> None:
    """Rewrite .loom files in canonical form."""
    from loomc.syntax.diagnostics import LoomSyntaxError
    from loomc.syntax.printer import format_source

    files, _, diagnostics = collect_targets(paths)
    files = [f for f in files if f.suffix != ".loombc"]  # binary twins have no layout to format
    sources: dict[str, str] = {}
    changed: list[Path] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            diagnostics.append(Diagnostic(str(path), 1, 1, "L0203", f"cannot read file: {exc}"))
            continue
        try:
            formatted = format_source(text, str(path))
        except LoomSyntaxError as exc:
            diagnostics.append(exc.diagnostic)
            sources[str(path)] = text
            continue
        if formatted != text:
            changed.append(path)
            if not check_only:
                path.write_text(formatted, encoding="utf-8")
    report(diagnostics, sources, as_json=False)
    for path in changed:
        click.echo(f"{'would reformat' if check_only else 'reformatted'} {path}", err=True)
    sys.exit(1 if diagnostics or (check_only and changed) else 0)
