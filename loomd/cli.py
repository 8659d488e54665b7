"""`loomd` command line. Serving is not built yet; this entry point says so plainly."""

from __future__ import annotations

import sys

import click


@click.group()
def main() -> None:
    """The Loom daemon."""


@main.command()
@click.argument("documents", nargs=-1)
@click.option("--listen", multiple=True, help="HOST:PORT or unix:PATH")
def serve(documents: tuple[str, ...], listen: tuple[str, ...]) -> None:
    """Serve model documents over HTTP (not built yet)."""
    click.echo(
        "loomd: serving is not built yet. The compiler works today (`loomc check|fmt|build|dis|test|emit`);\n"
        "registrations and the HTTP daemon arrive with the runtime-core and daemon-core issues.",
        err=True,
    )
    sys.exit(1)
