"""loomd/startup.py: what `loomd serve` prints while registrations compile and prepare, on the
real `mini` package through a real Registry: one line per phase off a terminal, a live block
with bars on one, the ready line naming kind and endpoint URL, and a compile failure shown
with its diagnostics at file:line:col under the source line and caret."""

from __future__ import annotations

import asyncio
import io
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from loomd.startup import StartupReport, failure_lines
from loomrt.devices import Devices
from loomrt.registry import Registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loomrt"))
from mini_package import MINI, mini_document  # noqa: E402

TIMEOUT = 120
URL = "http://127.0.0.1:8080"
BROKEN = 'use "{control}" {{ dim }}\nuse "{prepare}" {{ w, b }}\n\nkernel add_bias(inout y: f32[T, D], bias: f32[D]) {{\n    y[0, 0] = undefined_name\n}}\n'


@pytest.fixture
def registry():
    reg = Registry(Devices(cuda={}))
    yield reg
    reg.close(timeout=TIMEOUT)


def settle(registry: Registry, *names: str) -> None:
    assert registry.wait_for(lambda: all(registry.get(n).phase in ("ready", "failed") for n in names), TIMEOUT)


def written(out: io.StringIO, *texts: str) -> str:
    """The report's output once it holds every text: listeners run just after the phase
    changes that `settle` waits for, on the worker thread."""
    deadline = time.monotonic() + TIMEOUT
    while not all(t in out.getvalue() for t in texts) and time.monotonic() < deadline:
        time.sleep(0.01)
    return out.getvalue()


def broken_document(tmp_path: Path) -> str:
    source = tmp_path / "broken.loom"
    source.write_text(BROKEN.format(control=(MINI / "control.loom").as_posix(), prepare=(MINI / "prepare.loom").as_posix()))
    return mini_document(tmp_path, model="broken", sources=[str(source)])


def test_lines_off_a_terminal_follow_each_phase_to_ready(registry, tmp_path):
    out = io.StringIO()
    report = StartupReport(registry, [URL], out, live=False)
    registry.listeners.append(report.on_event)
    registry.register(mini_document(tmp_path, model="m1"))
    settle(registry, "m1")
    lines = written(out, "m1 ready").splitlines()
    assert lines == ["loomd: m1: compiling", "loomd: m1: preparing", lines[2]], lines
    # mini's program has no sequence stages: native-only, and the line says so (the bundled
    # samples' lines with their URLs: tests/conformance/test_readme_example.py)
    assert re.fullmatch(r"loomd: m1 ready in \d+\.\ds: sequence, native-only \(no HTTP inference route\)", lines[2]), lines


def test_a_compile_failure_shows_each_diagnostic_with_its_caret(registry, tmp_path):
    out = io.StringIO()
    report = StartupReport(registry, [URL], out, live=False)
    registry.listeners.append(report.on_event)
    registry.register(broken_document(tmp_path))
    registry.register(mini_document(tmp_path, model="m1"))
    settle(registry, "broken", "m1")
    text = written(out, "m1 ready", "broken failed")
    assert "loomd: broken failed in " in text
    where = f"{tmp_path / 'broken.loom'}:5:"
    assert where in text, text                                   # file:line:col of the unknown name
    assert "    y[0, 0] = undefined_name" in text and "^" in text     # the source line and its caret
    assert re.search(r"loomd: m1 ready in \d+\.\ds: sequence", text), text   # the other one is served
    assert failure_lines(registry.get("broken"))[0] == "model 'broken' does not compile"


def test_a_terminal_gets_live_bars_then_the_outcome(registry, tmp_path):
    out = io.StringIO()
    report = StartupReport(registry, [URL], out, live=True)
    registry.listeners.append(report.on_event)
    # hold m1 in `compiling` (listeners run on the build worker) until the block has drawn it:
    # a warm compile cache would otherwise settle it before the first redraw
    drawn = threading.Event()
    registry.listeners.append(lambda record: record["event"] == "compiling" and drawn.wait(TIMEOUT))

    async def start() -> None:
        following = asyncio.create_task(report.follow(["m1"]))
        while "  m1  compiling " not in out.getvalue():
            await asyncio.sleep(0.01)
        drawn.set()
        await following

    registry.register(mini_document(tmp_path, model="m1"))
    asyncio.run(asyncio.wait_for(start(), TIMEOUT))
    text = out.getvalue()
    assert "\x1b[" in text                                       # redrawn in place
    final = text.rsplit("\x1b[J", 1)[-1]
    assert re.fullmatch(r"loomd: m1 ready in \d+\.\ds: sequence, native-only \(no HTTP inference route\)\n", final), final
    # a registration made after start-up is reported line by line
    registry.register(mini_document(tmp_path, model="m2"))
    settle(registry, "m2")
    assert "loomd: m2: compiling\n" in written(out, "m2 ready")
