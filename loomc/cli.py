"""`loomc` command line: check, fmt, build, dis, test and emit; each back end registers its own command.

Every failure is a positioned diagnostic and exit status 1; an internal error
prints "internal compiler error" and exits 2. No Python traceback reaches the user.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from loomc.syntax.diagnostics import Diagnostic

MODEL_DOCUMENT_NAMES = ("model.json",)


def _internal_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (SystemExit, click.exceptions.Exit, click.ClickException, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - the one place that turns a crash into a report
            click.echo(f"internal compiler error: {type(exc).__name__}: {exc}\n"
                       "this is a bug in loomc; please report it with the input that caused it", err=True)
            sys.exit(2)

    return wrapper


@click.group()
def main() -> None:
    """The Loom compiler."""


def collect_targets(paths: tuple[str, ...]) -> tuple[list[Path], list[Path], list[Diagnostic]]:
    """Split PATHs into `.loom` files and model documents; folders contribute both, recursively."""
    files: list[Path] = []
    documents: list[Path] = []
    problems: list[Diagnostic] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files += sorted(f for f in p.rglob("*.loom*") if f.suffix in (".loom", ".loombc"))
            documents += sorted(d for name in MODEL_DOCUMENT_NAMES for d in p.rglob(name))
        elif p.suffix == ".json":
            documents.append(p)
        elif p.is_file():
            files.append(p)
        else:
            problems.append(Diagnostic(raw, 1, 1, "L0203", "no such file or directory"))
    return files, documents, problems


def report(diagnostics: list[Diagnostic], sources: dict[str, str], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"diagnostics": [d.to_json() for d in diagnostics]}, indent=2))
        return
    for d in diagnostics:
        click.echo(d.render(sources.get(d.path)), err=True)
    if diagnostics:
        n = len(diagnostics)
        click.echo(f"{n} error{'s' * (n != 1)}", err=True)


@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print diagnostics as JSON on stdout.")
@_internal_errors
def check(paths: tuple[str, ...], as_json: bool) -> None:
    """Check .loom files, folders and model documents."""
    from loomc.check import check_files
    from loomc.check.document import check_document

    files, documents, diagnostics = collect_targets(paths)
    sources: dict[str, str] = {}
    if files:
        found, read = check_files(files)
        diagnostics += found
        sources.update(read)
    for doc in documents:
        found, read = check_document(doc)
        diagnostics += found
        sources.update(read)
    unique = sorted({(d.path, d.line, d.column, d.code, d.message): d for d in diagnostics}.values(),
                    key=lambda d: d.sort_key)
    report(unique, sources, as_json)
    sys.exit(1 if unique else 0)


@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--check", "check_only", is_flag=True, help="Do not write; exit 1 if any file is not canonical.")
@_internal_errors
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


# ---- back-end commands, each defined in the module that owns it -----------------------------
from loomc.bytecode.cli import build, dis  # noqa: E402 - commands register after the group exists

main.add_command(build)
main.add_command(dis)
from loomc.runchecks import test  # noqa: E402 - the control VM's command lives with it

main.add_command(test)
from loomc.lower.emit import emit  # noqa: E402 - the lowering's command lives with it

main.add_command(emit)
