"""One live status line on a terminal's stderr while `loomc check`/`build` works through a package.

A large package (many documents, files to encode) takes seconds; on a terminal the line
says which step and item it is on (`checking 3/7: samples/scout/model.json`) and is erased
when the command reports, so diagnostics and pipes never see it. Off a terminal nothing is
written: the output stays exactly the diagnostics.
"""

from __future__ import annotations

import shutil
import sys
from typing import TextIO


class StatusLine:
    """`step(text)` replaces the line; `clear()` erases it (also on leaving a `with` block)."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._shown = False

    def step(self, text: str) -> None:
        if not self.live:
            return
        width = shutil.get_terminal_size().columns
        self.stream.write("\r\x1b[K" + text[:max(width - 1, 10)])
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    def __enter__(self) -> "StatusLine":
        return self

    def __exit__(self, *exc) -> None:
        self.clear()


__all__ = ["StatusLine"]
