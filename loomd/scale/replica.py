"""One Loom replica: a whole `loomd` (registry, routes, HTTP adapter) inside a Ray actor.

The ingress creates N of these (`ray.remote(LoomReplica)`, one CPU each, never restarted:
a replica that dies takes its state with it, and pretending otherwise would hand clients a
fresh replica under an old handle). Each runs `loomd.app.make_app` on its own registry and
listens on its node's address, so the ingress proxies to exactly the routes `loomd serve`
has; nothing here is a second implementation of an endpoint. The model documents travel as
bytes with their origin path (relative paths in them resolve against it, as for `loomd serve`,
so every node needs the same checkout or packages at that path: docs/scale-out.md).
"""

from __future__ import annotations

import os
import socket
from typing import Any


class LoomReplica:
    """Started by `start()`; `ping()` answers while the process lives."""

    def __init__(self, index: int, documents: list[tuple[str, bytes]], settings: dict[str, Any] | None = None):
        self.index = index
        self.documents = documents
        self.settings_fields = dict(settings or {})
        self.registry = None
        self.runner = None

    async def start(self, host: str | None = None) -> dict[str, Any]:
        """Listen on `host` (default: this node's IP as Ray knows it) at a free port and
        register every document; returns where and who this replica is."""
        import ray

        from loomd.app import Settings, make_app, start_listeners
        from loomrt.devices import Devices
        from loomrt.registry import Registry

        host = host or ray.util.get_node_ip_address()
        self.registry = Registry(Devices())
        settings = Settings(**self.settings_fields)
        self.runner = await start_listeners(make_app(self.registry, settings), settings, [(host, 0)])
        address = next(a for a in self.runner.addresses if not isinstance(a, str))
        for origin, document in self.documents:
            self.registry.register(document, origin=origin)
        return {"replica": self.index, "url": f"http://{address[0]}:{address[1]}", "pid": os.getpid(),
                "node": socket.gethostname()}

    def ping(self) -> int:
        return os.getpid()

    async def stop(self, grace: float = 10.0) -> None:
        import asyncio

        if self.registry is not None:
            await asyncio.to_thread(self.registry.close, "drain", grace)
        if self.runner is not None:
            await self.runner.cleanup()


__all__ = ["LoomReplica"]
