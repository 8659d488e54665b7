"""`loomc test`: run the `check` blocks of `.loom` files, folders and model documents on the control VM.

Which checks run, and what passing means, is `loomc/runchecks.py`; this module prints one line a
check and a summary, and exits 1 if any check failed or any target did not check.
"""

from __future__ import annotations

import sys

import click

from loomc.cli.common import collect_targets, internal_errors, report, unique_sorted
from loomc.runchecks import run_targets


@click.command("test")
@click.argument("paths", nargs=-1, required=True)
@click.option("--budget", type=click.IntRange(min=1), default=None,
              help="Instructions each check may run (default 1000000).")
@internal_errors
def test(paths: tuple[str, ...], budget: int | None) -> None:
    """Run the check blocks of .loom files, folders and model documents."""
    files, documents, diagnostics = collect_targets(paths)
    results, found, sources = run_targets(files, documents, budget)
    diagnostics += found
    unique = unique_sorted(diagnostics)
    report(unique, sources, as_json=False)
    for r in results:
        click.echo(f"ok {r.name}" if r.ok else f"FAIL {r.name}: {r.reason}")
    failed = sum(not r.ok for r in results)
    click.echo(f"{len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed or unique else 0)
