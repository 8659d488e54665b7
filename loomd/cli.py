"""`loomd serve`: listeners, the bundled samples, signals.

With no documents it registers the bundled samples (`SAMPLES/*/model.json`) whose weights
are installed (a `package:` checkpoint locator that resolves); the others are listed as
skipped. SAMPLES is `--samples DIR` or `$LOOM_SAMPLES` if given, else the `samples/` of the
source checkout loomd was imported from; an installed package has none, and then serving
without documents exits naming where it looked (`find_samples`). SIGINT/SIGTERM stop
admission (`/readyz` turns 503), let accepted work finish (for at most `--grace` seconds,
then it is aborted at a step boundary), release every registration and exit 0.
`--log-retention` bounds the `/logz` journal (entries kept). The deadlines for slow and
stalled peers (`--header-timeout`, `--body-timeout`, `--keepalive-timeout`,
`--write-stall-timeout`) and `--reading-connections` are docs/operations.md's "Slow and
stalled clients".
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from loomd.logz import RETAINED

# Settings' defaults (loomd/app.py), repeated because loomd.app is imported only after the aiohttp
# check (tests/unit/loomd/test_aiohttp_adapter.py keeps the two equal)
DEFAULT_HEADER_TIMEOUT_S = 15.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEPALIVE_TIMEOUT_S = 30.0
DEFAULT_WRITE_STALL_TIMEOUT_S = 60.0
DEFAULT_READING_CONNECTIONS = 64
from loomrt.errors import LoomError
from loomrt.media.image import OPTIONAL_FORMATS as OPTIONAL_IMAGE_FORMATS

SAMPLES_ENV = "LOOM_SAMPLES"
# Where a source checkout has its root when loomd is imported from one (`loomd/` beside
# `samples/` and `pyproject.toml`). For an installed package this is site-packages.
CHECKOUT = Path(__file__).resolve().parents[1]
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


def checkout_samples() -> Path | None:
    """The `samples/` of the source checkout loomd was imported from, or None when it was not
    imported from a checkout (no `pyproject.toml` and `samples/` beside the `loomd/` package)."""
    if (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "samples").is_dir():
        return CHECKOUT / "samples"
    return None


def find_samples(given: Path | None, given_as: str = "--samples") -> Path:
    """The folder whose `*/model.json` are served when no documents are named: `given` (from
    `given_as`, the option or the environment variable) if any, else the checkout's
    `samples/`. Raises `click.ClickException` saying where it looked and what to pass."""
    if given is not None:
        if not given.is_dir():
            raise click.ClickException(f"the samples folder {str(given)!r} (from {given_as}) is not a directory")
        if not any(given.glob("*/model.json")):
            raise click.ClickException(f"the samples folder {str(given)!r} (from {given_as}) has no sample "
                                       "packages (*/model.json)")
        return given
    found = checkout_samples()
    if found is not None:
        return found
    raise click.ClickException(
        f"no documents named and no bundled samples found. Looked for --samples DIR (not given), ${SAMPLES_ENV} "
        f"(not set) and the samples/ of a source checkout at {CHECKOUT} (none: loomd was imported from "
        f"{CHECKOUT / 'loomd'}, which has no samples/ and pyproject.toml beside it, as an installed package "
        "has not). Name documents to serve (`loomd serve DOC.json ...`) or a folder of sample packages "
        f"(`loomd serve --samples DIR`, or {SAMPLES_ENV}=DIR).")


def bundled_documents(samples: Path) -> list[tuple[Path, str | None]]:
    """(document, reason it is skipped or None) for each sample package in `samples`."""
    from loomrt.document import parse_document
    from loomrt.locator import resolve_locator

    out = []
    for path in sorted(samples.glob("*/model.json")):
        try:
            doc = parse_document(path.read_bytes(), origin=str(path))
            for ref in doc.checkpoint or ():
                if ref.where == "locator":
                    resolve_locator(ref.path)
            out.append((path, None))
        except LoomError as exc:
            out.append((path, exc.message))
    return out


def parse_image_formats(value: str) -> Any:
    """`png,jpeg` -> ImageFormats; a usage error naming the unknown ones."""
    from loomrt.media.image import ImageFormats

    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    try:
        return ImageFormats(frozenset(names))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--image-formats") from None


async def _serve(documents: tuple[str, ...], samples: Path | None, listen: tuple[str, ...], device_memory: dict,
                 grace: float, settings_fields: dict, image_formats: Any = None) -> None:
    from loomd.app import Settings, make_app, start_listeners
    from loomd.startup import StartupReport
    from loomrt.devices import Devices
    from loomrt.registry import Registry

    registry = Registry(Devices(device_memory), image_formats=image_formats)
    settings = Settings(**settings_fields)
    app = make_app(registry, settings)
    runner = await start_listeners(app, settings, [parse_listen(v) for v in listen or (DEFAULT_LISTEN,)])
    base_urls = []
    for address in runner.addresses:
        shown = f"unix:{address}" if isinstance(address, str) else f"http://{_url_host(address[0])}:{address[1]}"
        if not isinstance(address, str):
            base_urls.append(shown)
        click.echo(f"loomd: listening on {shown}" + (f" (status page {shown}/ui)" if shown in base_urls else ""))
    report = StartupReport(registry, base_urls)
    registry.listeners.append(report.on_event)
    paths = [(Path(d), None) for d in documents] if documents else bundled_documents(samples)
    names = []
    for path, skipped in paths:
        if skipped:
            click.echo(f"loomd: skipping {path}: {skipped}")
            continue
        try:
            reg = registry.register(path.read_bytes(), origin=str(path.resolve()))
            names.append(reg.name)
            click.echo(f"loomd: registering {reg.name} ({reg.document.kind}) from {path}")
        except (OSError, LoomError) as exc:
            click.echo(f"loomd: cannot register {path}: {exc}", err=True)
    sys.stdout.flush()
    following = asyncio.create_task(report.follow(names))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    following.cancel()
    click.echo("loomd: stopping: admission closed, finishing accepted work")
    settings.stopping = True
    await asyncio.to_thread(registry.close, "drain", grace)
    await runner.cleanup()
    click.echo("loomd: stopped")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@click.group()
def main() -> None:
    """The Loom daemon."""


@main.command()
@click.argument("documents", nargs=-1)
@click.option("--samples", "samples", envvar=SAMPLES_ENV, metavar="DIR", type=click.Path(path_type=Path),
              help=f"with no documents, serve the sample packages (*/model.json) in this folder "
                   f"(env {SAMPLES_ENV}; default: the samples/ of the source checkout loomd runs from)")
@click.option("--listen", multiple=True, help="HOST:PORT or unix:PATH (repeatable; default 127.0.0.1:8080)")
@click.option("--request_body_bytes", "--request-body-bytes", "request_body_bytes", type=click.IntRange(1),
              default=64 * 1024 * 1024, show_default=True, help="bound on a decoded request body")
@click.option("--connections", type=click.IntRange(1), default=256, show_default=True,
              help="open connections at once; a new one over it closes the stalled (else longest-idle) "
                   "connection, or is answered 503 and closed when every connection has work in progress")
@click.option("--reading-connections", "--reading_connections", "reading_connections", type=click.IntRange(1),
              default=DEFAULT_READING_CONNECTIONS, show_default=True,
              help="connections still reading a request (headers or body); over it the one with the oldest "
                   "progress is closed")
@click.option("--header-timeout", "--header_timeout", "header_timeout", type=click.FloatRange(0),
              default=DEFAULT_HEADER_TIMEOUT_S, show_default=True,
              help="seconds for a request line and headers, from the connection's open or a later request's "
                   "first byte (0: none)")
@click.option("--body-timeout", "--body_timeout", "body_timeout", type=click.FloatRange(0),
              default=DEFAULT_BODY_TIMEOUT_S, show_default=True,
              help="seconds a request body may go without new bytes before the connection is closed (0: none)")
@click.option("--keepalive-timeout", "--keepalive_timeout", "keepalive_timeout", type=click.FloatRange(0),
              default=DEFAULT_KEEPALIVE_TIMEOUT_S, show_default=True,
              help="seconds a kept-alive connection may stay idle between requests (0: none)")
@click.option("--write-stall-timeout", "--write_stall_timeout", "write_stall_timeout", type=click.FloatRange(0),
              default=DEFAULT_WRITE_STALL_TIMEOUT_S, show_default=True,
              help="seconds a response may wait for a peer that reads none of it before the connection is "
                   "aborted (0: none)")
@click.option("--device-memory", "device_memory", multiple=True, help="DEVICE=BYTES memory budget (repeatable)")
@click.option("--grace", type=click.FloatRange(0), default=30.0, show_default=True,
              help="seconds accepted work may take to finish at shutdown before it is aborted")
@click.option("--log-retention", "--log_retention", "log_retention", type=click.IntRange(1), default=RETAINED,
              show_default=True, help="log journal entries kept for /logz and /logz/stream; a cursor older "
                                      "than that gets a gap record")
@click.option("--image-formats", "image_formats", default=",".join(OPTIONAL_IMAGE_FORMATS), show_default=True,
              metavar="LIST", help="the image formats decoded besides PAM (always on), comma-separated; "
                                   "an empty list leaves PAM alone")
def serve(documents: tuple[str, ...], samples: Path | None, listen: tuple[str, ...], request_body_bytes: int,
          connections: int, reading_connections: int, header_timeout: float, body_timeout: float,
          keepalive_timeout: float, write_stall_timeout: float, device_memory: tuple[str, ...], grace: float,
          log_retention: int, image_formats: str) -> None:
    """Serve model documents (default: the bundled samples whose weights are installed) over HTTP."""
    from loomd.aiohttp_adapter import check_aiohttp_version

    try:
        check_aiohttp_version()  # before anything starts: the HTTP layer relies on tested aiohttp internals
    except RuntimeError as exc:
        click.echo(f"loomd: {exc}", err=True)
        sys.exit(1)
    for value in listen:
        parse_listen(value)
    budgets = parse_device_memory(device_memory)
    formats = parse_image_formats(image_formats)
    # loomrt and loomd log failures that are nobody's request's fault with their tracebacks:
    # they go to stderr, where the operator reads the daemon (clients get a short 500).
    logging.basicConfig(level=logging.WARNING, format="loomd: %(levelname)s %(name)s: %(message)s")
    if not documents:
        source = click.get_current_context().get_parameter_source("samples")
        samples = find_samples(samples, SAMPLES_ENV if source == click.core.ParameterSource.ENVIRONMENT
                               else "--samples")
    try:
        settings_fields = {"request_body_bytes": request_body_bytes, "connections": connections,
                           "log_retention": log_retention, "header_timeout": header_timeout,
                           "body_timeout": body_timeout, "keepalive_timeout": keepalive_timeout,
                           "write_stall_timeout": write_stall_timeout, "reading_connections": reading_connections}
        asyncio.run(_serve(documents, samples, listen, budgets, grace, settings_fields, formats))
    except OSError as exc:
        click.echo(f"loomd: {exc}", err=True)
        sys.exit(1)


@main.command()
@click.argument("documents", nargs=-1)
@click.option("--replicas", type=click.IntRange(1), default=2, show_default=True, help="Loom replicas to start")
@click.option("--listen", default="127.0.0.1:8000", show_default=True, help="HOST:PORT of Ray Serve's HTTP proxy")
@click.option("--samples", "samples", envvar=SAMPLES_ENV, metavar="DIR", type=click.Path(path_type=Path),
              help="with no documents, the sample packages to serve (as `loomd serve`)")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
              help="compute threads per replica (NUMBA_NUM_THREADS)")
@click.option("--replica-cpus", "replica_cpus", type=click.FloatRange(0), default=1.0, show_default=True,
              help="CPUs Ray reserves for each replica")
@click.option("--affinity/--no-affinity", default=True, show_default=True,
              help="route untagged chats to the replica holding their longest prefix (else by load alone)")
@click.option("--address", default=None, help="an existing Ray cluster to join (default: start a local one)")
def scale(documents: tuple[str, ...], replicas: int, listen: str, samples: Path | None, threads: int,
          replica_cpus: float, affinity: bool, address: str | None) -> None:
    """Serve model documents from several Loom replicas behind one Ray Serve ingress (docs/scale-out.md)."""
    try:
        from loomd.scale import app as scale_app
    except ImportError as exc:  # pragma: no cover - the optional extra is missing
        raise click.ClickException(f"loomd scale needs Ray Serve: pip install 'loom[scale]' ({exc})") from None
    host, port = parse_listen(listen)
    if host == "unix":
        raise click.BadParameter("Ray Serve listens on TCP only", param_hint="--listen")
    if documents:
        paths = [Path(d) for d in documents]
    else:
        source = click.get_current_context().get_parameter_source("samples")
        folder = find_samples(samples, SAMPLES_ENV if source == click.core.ParameterSource.ENVIRONMENT else "--samples")
        paths = [p for p, skipped in bundled_documents(folder) if skipped is None]
    url = f"http://{_url_host(host)}:{port}"
    click.echo(f"loomd scale: starting Ray Serve with {replicas} replica(s) of {', '.join(p.parent.name or p.name for p in paths)}")
    try:
        scale_app.run(scale_app.read_documents(paths), replicas, host, port, address=address, affinity=affinity,
                      threads=threads, replica_cpus=replica_cpus)
    except KeyboardInterrupt:
        click.echo("loomd scale: interrupted while starting; shutting down")
        scale_app.shutdown()
        sys.exit(130)
    click.echo(f"loomd scale: listening on {url} ({replicas} replicas; {url}/v1/status shows each)")
    sys.stdout.flush()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    click.echo("loomd scale: stopping")
    scale_app.shutdown()
    click.echo("loomd scale: stopped")
