"""What every `loomc` command shares: the targets its PATHs name, how it reports diagnostics, and the
one guard that turns a crash into "internal compiler error" and exit status 2.

Command modules import from here and from the compiler proper, never from `loomc.cli` itself.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from loomc.syntax.diagnostics import Diagnostic

MODEL_DOCUMENT_NAMES = ("model.json",)


def internal_errors(fn):
    """Wrap a command so that an unexpected exception prints "internal compiler error" and exits 2."""

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


def unique_sorted(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """The diagnostics in report order, each (path, position, code, message) once."""
    return sorted({(d.path, d.line, d.column, d.code, d.message): d for d in diagnostics}.values(),
                  key=lambda d: d.sort_key)


def report(diagnostics: list[Diagnostic], sources: dict[str, str], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"diagnostics": [d.to_json() for d in diagnostics]}, indent=2))
        return
    for d in diagnostics:
        click.echo(d.render(sources.get(d.path)), err=True)
    if diagnostics:
        n = len(diagnostics)
        click.echo(f"{n} error{'s' * (n != 1)}", err=True)
