"""`loomc build` and `loomc dis`: `.loom` → `.loombc` after a clean check, and `.loombc` → canonical text."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from loomc.bytecode.errors import LoomBytecodeEncodeError, LoomBytecodeError
from loomc.bytecode.files import read_bytecode_file, write_atomically
from loomc.bytecode.format import SUFFIX
from loomc.bytecode.reader import read_module
from loomc.bytecode.writer import write_module
from loomc.cli.common import collect_targets, internal_errors, report
from loomc.cli.progress import StatusLine


def _fail(message: str) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(1)


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="The .loombc file (one input) or an existing directory (several inputs).")
@internal_errors
def build(paths: tuple[str, ...], out: Path) -> None:
    """Check .loom files and write each as .loombc. Nothing is written unless all check clean."""
    from loomc.check import load_files

    named_documents = [p for p in paths if Path(p).suffix == ".json"]
    if named_documents:
        _fail(f"{named_documents[0]}: error: loomc build takes .loom and .loombc files, not model documents; "
              "build the files the document names (control, prepare, sources)")
    files, _, problems = collect_targets(paths)  # model documents found inside folders are skipped
    if problems:
        report(problems, {}, as_json=False)
        sys.exit(1)
    if not files:
        _fail(f"error: no .loom or {SUFFIX} files in {', '.join(paths)}")
    targets = _targets(files, out)

    with StatusLine() as status:
        status.step(f"checking {len(files)} file{'s' * (len(files) != 1)}")
        checked = load_files(files)
        status.clear()
        if checked.diagnostics:
            report(checked.diagnostics, checked.sources, as_json=False)
            sys.exit(1)
        blobs = []
        for n, (source, target) in enumerate(targets, 1):
            status.step(f"encoding {n}/{len(targets)}: {source}")
            module = checked.program.modules[str(source.resolve())].module
            try:
                blobs.append((target, write_module(module)))
            except LoomBytecodeEncodeError as exc:
                status.clear()
                _fail(f"{source}: error[L0801]: {exc}")
        for n, (target, blob) in enumerate(blobs, 1):  # only once every file has encoded
            status.step(f"writing {n}/{len(blobs)}: {target}")
            write_atomically(target, blob)


def _targets(files: list[Path], out: Path) -> list[tuple[Path, Path]]:
    """Where each input goes: `out` itself for one input, `out/<stem>.loombc` for several."""
    if len(files) == 1 and not out.is_dir():
        if not out.parent.is_dir():
            _fail(f"{out}: error: cannot write here: {out.parent} is not a directory")
        return [(files[0], out)]
    if not out.is_dir():
        _fail(f"{out}: error: with {len(files)} inputs, -o must name an existing directory")
    targets: dict[Path, Path] = {}
    for source in files:
        target = out / (source.stem + SUFFIX)
        if target in targets:
            _fail(f"{target}: error: both {targets[target]} and {source} would be written here")
        targets[target] = source
    return [(source, target) for target, source in targets.items()]


@click.command()
@click.argument("file", type=click.Path(path_type=Path))
@internal_errors
def dis(file: Path) -> None:
    """Print the canonical .loom text of a .loombc file (comments are not stored)."""
    from loomc.syntax.printer import format_module

    try:
        module = read_module(read_bytecode_file(file), str(file))
    except LoomBytecodeError as exc:
        _fail(f"{file}: error[L0800]: {exc}")
    except OSError as exc:
        _fail(f"{file}: error[L0203]: cannot read file: {exc.strerror or exc}")
    click.echo(format_module(module), nl=False)
