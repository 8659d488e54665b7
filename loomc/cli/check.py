"""`loomc check`: check `.loom` files, folders and model documents and report every diagnostic."""

from __future__ import annotations

import sys

import click

from loomc.cli.common import collect_targets, internal_errors, report, unique_sorted
from loomc.cli.progress import StatusLine


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print diagnostics as JSON on stdout.")
@internal_errors
def check(paths: tuple[str, ...], as_json: bool) -> None:
    """Check .loom files, folders and model documents."""
    from loomc.check import check_files
    from loomc.check.document import check_document

    files, documents, diagnostics = collect_targets(paths)
    sources: dict[str, str] = {}
    with StatusLine() as status:
        if files:
            status.step(f"checking {len(files)} .loom file{'s' * (len(files) != 1)}")
            found, read = check_files(files)
            diagnostics += found
            sources.update(read)
        for n, doc in enumerate(documents, 1):
            status.step(f"checking document {n}/{len(documents)}: {doc}")
            found, read = check_document(doc)
            diagnostics += found
            sources.update(read)
    unique = unique_sorted(diagnostics)
    report(unique, sources, as_json)
    sys.exit(1 if unique else 0)
