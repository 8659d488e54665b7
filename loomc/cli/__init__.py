"""`loomc` command line: check, fmt, build, dis, test and emit.

`main` is the click group (the `loomc` console script, `python -m loomc`); each command is
defined in its own module here (`check.py`, `fmt.py`, `build.py` for build and dis, `test.py`,
`emit.py`), and what they share is in `common.py`. Nothing imports back from this module.

Every failure is a positioned diagnostic and exit status 1; an internal error
prints "internal compiler error" and exits 2 (`common.internal_errors`, on every command).
No Python traceback reaches the user.
"""

from __future__ import annotations

import click

from loomc.cli.build import build, dis
from loomc.cli.check import check
from loomc.cli.emit import emit
from loomc.cli.fmt import fmt
from loomc.cli.test import test


@click.group()
def main() -> None:
    """The Loom compiler."""


for _command in (check, fmt, build, dis, test, emit):
    main.add_command(_command)
