"""What `loomd serve` tells the terminal it starts in: each registration's progress, then what serves where.

A model's life is printed as it happens, from the registry's events: compiling (kernels
compiled of total), preparing (weights prepared of total), then one line when it is ready
naming its kind and endpoint URL, or, when it fails, the error with every compile
diagnostic at `file:line:col` under its source line and caret; the daemon keeps serving the
others. On a terminal, the registrations named at start-up share a block of live lines
(a bar per phase, redrawn a few times a second) until each has settled; elsewhere (a log
file, a pipe, `make serve | tee`) every phase change is one line. Registrations made later
over HTTP are reported line by line either way.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from loomd.routes.discovery import model_object
from loomrt.errors import CompileError
from loomrt.registry import Registration, Registry

REDRAW_S = 0.25
BAR = 20
#: The phase events worth a line; the others (`request`, variants, residency) belong to /logz.
PHASES = ("compiling", "preparing", "deferred", "ready", "failed")
SETTLED = ("ready", "failed", "deferred")


def progress_text(reg: Registration) -> str:
    """`kernels 3/11` while compiling, `weights 120/290` while preparing (empty before a count)."""
    if reg.phase == "compiling":
        count = reg.progress.get("kernels")
        return f"kernels {count['compiled']}/{count['total']}" if count else "checking sources"
    if reg.phase == "registering":
        return "waiting for a build worker"
    if reg.phase == "preparing":
        count = reg.progress.get("weights")
        return f"weights {count['prepared']}/{count['total']}" if count else "loading"
    return ""


def _fraction(reg: Registration) -> float | None:
    key, done = {"compiling": ("kernels", "compiled"), "preparing": ("weights", "prepared")}.get(reg.phase, (None, None))
    count = reg.progress.get(key) if key else None
    return count[done] / count["total"] if count and count["total"] else None


def served_text(reg: Registration, base_urls: list[str]) -> str:
    """`text on http://127.0.0.1:8080/v1/chat/completions` (the first TCP listener's URL, else
    the route alone), or `native-only` for a program without its kind's stages."""
    loom = model_object(reg)["loom"]
    endpoint = loom.get("endpoint")
    if endpoint is None:
        return f"{reg.document.kind}, native-only (no HTTP inference route)"
    where = f"{base_urls[0]}{endpoint}" if base_urls else endpoint
    state = "" if loom["admission"] == "open" else f" (admission {loom['admission']})"
    return f"{reg.document.kind} on {where}{state}"


def failure_lines(reg: Registration) -> list[str]:
    """The error of a failed registration: a compile error as every diagnostic rendered with its
    source line and caret, anything else as its message."""
    error = reg.error
    if isinstance(error, CompileError) and error.diagnostics:
        return [error.summary] + [line for text in error.rendered() for line in text.splitlines()]
    return (error.message if error is not None else "unknown error").splitlines()


class StartupReport:
    """Prints registrations' progress and outcomes to `out` (a terminal gets live lines)."""

    def __init__(self, registry: Registry, base_urls: list[str], out: TextIO | None = None,
                 live: bool | None = None, clock: Callable[[], float] = time.monotonic):
        self.registry = registry
        self.base_urls = base_urls
        self.out = out or sys.stdout
        self.live = self.out.isatty() if live is None else live
        self.clock = clock
        self.started = clock()
        self._lock = threading.Lock()
        self._block: list[str] = []          # registrations drawn as live lines (start-up only)
        self._drawn = 0                      # lines of the block on screen
        self._since: dict[str, float] = {}   # when each registration entered its phase
        self._took: dict[str, float] = {}    # seconds from registration to ready/failed/deferred
        self._starting = self.live           # until `follow` ends, the live block shows every phase

    # ---- lines ----------------------------------------------------------------------------

    def write(self, text: str) -> None:
        with self._lock:
            self.out.write(text + "\n")
            self.out.flush()

    def outcome(self, reg: Registration) -> list[str]:
        took = f" in {self._took.get(reg.name, time.time() - reg.created):.1f}s"   # since it was registered
        if reg.phase == "ready":
            return [f"loomd: {reg.name} ready{took}: {served_text(reg, self.base_urls)}"]
        if reg.phase == "deferred":
            return [f"loomd: {reg.name} compiled; admission drained, weights wait for undrain or activate"]
        return [f"loomd: {reg.name} failed{took}:"] + ["  " + line for line in failure_lines(reg)]

    def on_event(self, record: dict[str, Any]) -> None:
        """A registry listener: one line per phase change of a registration not drawn live."""
        if record.get("event") not in PHASES:
            return
        try:
            reg = self.registry.get(record["model"])
        except Exception:  # noqa: BLE001 - removed meanwhile: nothing to report
            return
        self._since[reg.name] = self.clock()
        if record["event"] in SETTLED:
            self._took[reg.name] = record["time"] - reg.created
        if self._starting or reg.name in self._block:
            return  # the live block shows it
        if record["event"] in SETTLED:
            for line in self.outcome(reg):
                self.write(line)
        else:
            self.write(f"loomd: {reg.name}: {record['event']}")

    # ---- the live block (terminal) -------------------------------------------------------------

    def live_line(self, reg: Registration, width: int) -> str:
        fraction = _fraction(reg)
        bar = ""
        if fraction is not None:
            filled = int(round(BAR * fraction))
            bar = "[" + "#" * filled + "-" * (BAR - filled) + "] "
        waited = self.clock() - self._since.get(reg.name, self.started)
        return f"  {reg.name:<{width}}  {reg.phase:<11} {bar}{progress_text(reg)}  {waited:.0f}s"

    def redraw(self, final: bool = False) -> None:
        regs = []
        for name in self._block:
            try:
                regs.append(self.registry.get(name))
            except Exception:  # noqa: BLE001 - removed while starting
                continue
        width = max((len(r.name) for r in regs), default=0)
        lines = []
        for reg in regs:
            lines += self.outcome(reg) if reg.phase in SETTLED or reg.removing else [self.live_line(reg, width)]
        with self._lock:
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F\x1b[J")   # back to the block's first line, clear below
            self.out.write("".join(line + "\n" for line in lines))
            self.out.flush()
            self._drawn = 0 if final else len(lines)

    async def follow(self, names: list[str]) -> None:
        """Draw `names` live until each has settled (ready, failed, deferred or removed); then
        they are reported line by line like any later registration."""
        if not self.live or not names:
            self._starting = False
            return
        self._block = list(names)
        self._starting = False
        try:
            while True:
                regs = [r for r in self.registry.registrations() if r.name in self._block]
                if all(r.phase in SETTLED or r.removing for r in regs):
                    break
                self.redraw()
                await asyncio.sleep(REDRAW_S)
        finally:
            self.redraw(final=True)
            self._block = []


__all__ = ["StartupReport", "failure_lines", "progress_text", "served_text"]
