"""`loomd serve`: listeners, the bundled samples, signals.

With no documents it registers the bundled samples (`samples/*/model.json`) whose weights
are installed (a `package:` checkpoint locator that resolves); the others are listed as
skipped. SIGINT/SIGTERM stop admission (`/readyz` turns 503), let accepted work finish
(for at most `--grace` seconds, then it is aborted at a step boundary), release every
registration and exit 0. `--log-retention` bounds the `/logz` journal (entries kept).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import click

from loomd.logz import RETAINED
from loomrt.errors import LoomError

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
DEFAULT_LISTEN = "127.0.0.1:8080"


def parse_listen(value: str) -> tuple[str, str | int]:
    """("unix", path) or (host, port) from `unix:PATH`, `HOST:PORT` or `[V6]:PORT`."""
    if value.startswith("unix:"):
        path = value[len("unix:"):]
        if not path:
            raise click.BadParameter(f"{value!r}: unix: needs a socket path")
        return "unix", path
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535 or not host:
        raise click.BadParameter(f"{value!r}: expected HOST:PORT or unix:PATH")
    return host.strip("[]"), int(port)


def parse_device_memory(values: tuple[str, ...]) -> dict:
    out: dict = {}
    for value in values:
        device, sep, amount = value.partition("=")
        if not sep or not amount.isdigit():
            raise click.BadParameter(f"{value!r}: expected DEVICE=BYTES (e.g. cpu=8000000000)")
        out[device if device == "cpu" else (int(device) if device.isdigit() else device)] = int(amount)
    return out


def bundled_documents() -> list[tuple[Path, str | None]]:
    """(document, reason it is skipped or None) for each bundled sample."""
    from loomrt.document import parse_document
    from loomrt.locator import resolve_locator

    out = []
    for path in sorted(SAMPLES.glob("*/model.json")):
        try:
            doc = parse_document(path.read_bytes(), origin=str(path))
            if doc.checkpoint is not None and doc.checkpoint.where == "locator":
                resolve_locator(doc.checkpoint.path)
            out.append((path, None))
        except LoomError as exc:
            out.append((path, exc.message))
    return out


async def _serve(documents: tuple[str, ...], listen: tuple[str, ...], request_body_bytes: int, connections: int,
                 device_memory: dict, grace: float, log_retention: int) -> None:
    from aiohttp import web

    from loomd.app import Settings, make_app
    from loomd.framing import JsonErrorRunner
    from loomrt.devices import Devices
    from loomrt.registry import Registry

    registry = Registry(Devices(device_memory))
    settings = Settings(request_body_bytes=request_body_bytes, connections=connections, log_retention=log_retention)
    app = make_app(registry, settings)
    runner = JsonErrorRunner(app, handle_signals=False, access_log=None, max_connections=connections,
                             handler_cancellation=True)
    await runner.setup()
    for value in listen or (DEFAULT_LISTEN,):
        host, port = parse_listen(value)
        site = web.UnixSite(runner, port) if host == "unix" else web.TCPSite(runner, host, port)
        await site.start()
    for address in runner.addresses:
        shown = f"unix:{address}" if isinstance(address, str) else f"http://{address[0]}:{address[1]}"
        click.echo(f"loomd: listening on {shown}")
    paths = [(Path(d), None) for d in documents] if documents else bundled_documents()
    for path, skipped in paths:
        if skipped:
            click.echo(f"loomd: skipping {path}: {skipped}")
            continue
        try:
            reg = registry.register(path.read_bytes(), origin=str(path.resolve()))
            click.echo(f"loomd: registering {reg.name} from {path}")
        except (OSError, LoomError) as exc:
            click.echo(f"loomd: cannot register {path}: {exc}", err=True)
    sys.stdout.flush()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    click.echo("loomd: stopping: admission closed, finishing accepted work")
    settings.stopping = True
    await asyncio.to_thread(registry.close, "drain", grace)
    await runner.cleanup()
    click.echo("loomd: stopped")


@click.group()
def main() -> None:
    """The Loom daemon."""


@main.command()
@click.argument("documents", nargs=-1)
@click.option("--listen", multiple=True, help="HOST:PORT or unix:PATH (repeatable; default 127.0.0.1:8080)")
@click.option("--request_body_bytes", "--request-body-bytes", "request_body_bytes", type=click.IntRange(1),
              default=64 * 1024 * 1024, show_default=True, help="bound on a decoded request body")
@click.option("--connections", type=click.IntRange(1), default=256, show_default=True,
              help="open connections served at once; more are answered 503 and closed")
@click.option("--device-memory", "device_memory", multiple=True, help="DEVICE=BYTES memory budget (repeatable)")
@click.option("--grace", type=click.FloatRange(0), default=30.0, show_default=True,
              help="seconds accepted work may take to finish at shutdown before it is aborted")
@click.option("--log-retention", "--log_retention", "log_retention", type=click.IntRange(1), default=RETAINED,
              show_default=True, help="log journal entries kept for /logz and /logz/stream; a cursor older "
                                      "than that gets a gap record")
def serve(documents: tuple[str, ...], listen: tuple[str, ...], request_body_bytes: int, connections: int,
          device_memory: tuple[str, ...], grace: float, log_retention: int) -> None:
    """Serve model documents (default: the installed bundled samples) over HTTP."""
    for value in listen:
        parse_listen(value)
    budgets = parse_device_memory(device_memory)
    try:
        asyncio.run(_serve(documents, listen, request_body_bytes, connections, budgets, grace, log_retention))
    except OSError as exc:
        click.echo(f"loomd: {exc}", err=True)
        sys.exit(1)
