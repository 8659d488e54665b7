"""The Ray Serve ingress: one HTTP front for N Loom replicas, routing by where state lives.

`LoomIngress` is the application's one deployment. It starts the replicas (Ray actors
running `loomd` each: `loomd/scale/replica.py`), then answers every request by proxying it to
the replica `loomd/scale/routing.py` chooses, byte for byte, streams included, so the
HTTP profiles are loomd's own routes. What it adds:

- state-affine routing (sessions, sequence handles, checkpoints, chat prefixes) and load
  balancing by requests in flight, learning owners from the replicas' answers (a sequence's
  `attached` event, a checkpoint's 201, a chat's 200);
- fan-out for administration (`/v1/models/register|drain|undrain|unregister|activate|
  deactivate|pin|unpin`, `/v1/models/variants*`, `/v1/devices/trim`) to every live replica or
  the ones `X-Loom-Replicas: 0,2` names, with per-replica outcomes (`aggregate.fanned_out`);
- merged discovery and observation (`/v1/models`, `/v1/status`, `/v1/requests`,
  `/v1/sessions`, `/metrics` with a `replica` label; `aggregate`);
- `X-Loom-Replica: N` sends any request to replica N alone (its `/ui`, `/logz`, pages);
- failure handling: a replica that does not answer is checked (its actor pinged); a dead one
  is dropped from routing, a request that had not started is retried on another replica
  (stateless work and chat sessions; a handle or checkpoint that lived there is `Lost`: 404),
  and a stream cut off mid-way ends with the profile's error event.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from loomd.errors import error_body
from loomd.scale import aggregate
from loomd.scale.aggregate import Outcome
from loomd.scale.replica import LoomReplica
from loomd.scale.routing import Lost, Router

log = logging.getLogger("loomd.scale")

ADMIN = {"/v1/models/register", "/v1/models/drain", "/v1/models/undrain", "/v1/models/unregister",
         "/v1/models/activate", "/v1/models/deactivate", "/v1/models/pin", "/v1/models/unpin",
         "/v1/devices/trim", "/v1/models/variants", "/v1/models/variants/select", "/v1/models/variants/remove"}
PINNED_TO_FIRST = ("/ui", "/logz")          # one replica's page or journal (X-Loom-Replica picks another)
HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "expect", "upgrade",
              "te", "trailer", "proxy-connection"}
PING_TIMEOUT_S = 5.0
START_TIMEOUT_S = 600.0
RESPONSE_HEADERS_DROPPED = HOP_BY_HOP | {"date", "server"}


class LoomIngress:
    """The ingress deployment's class (`loomd.scale.app.build_app` wraps it in `serve.deployment`)."""

    def __init__(self, documents: list[tuple[str, bytes]], replicas: int = 2, *, affinity: bool = True,
                 replica_cpus: float = 1.0, threads: int = 1, settings: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None):
        import ray

        env_vars = {"NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
                    "OPENBLAS_NUM_THREADS": str(threads), **(env or {})}
        remote = ray.remote(LoomReplica)
        self.actors = [remote.options(num_cpus=replica_cpus, max_restarts=0, max_task_retries=0,
                                      runtime_env={"env_vars": env_vars}).remote(i, documents, settings)
                       for i in range(replicas)]
        self.info: list[dict[str, Any]] = ray.get([a.start.remote() for a in self.actors], timeout=START_TIMEOUT_S)
        self.router = Router.of(replicas, affinity=affinity)
        self._http = None

    # ---- plumbing ------------------------------------------------------------------------------

    def http(self):
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                               auto_decompress=False)
        return self._http

    def url(self, replica: int) -> str:
        return self.info[replica]["url"]

    async def alive(self, replica: int) -> bool:
        """Whether replica's process still lives (its actor answers a ping); a dead one leaves routing."""
        import ray

        if not self.router.replicas[replica].alive:
            return False
        try:
            await asyncio.wait_for(self.actors[replica].ping.remote(), PING_TIMEOUT_S)
            return True
        except (ray.exceptions.RayActorError, asyncio.TimeoutError, ray.exceptions.RayError):
            log.warning("replica %d is gone: removed from routing", replica)
            self.router.lose(replica)
            return False

    @staticmethod
    def response(status: int, body: bytes | str, content_type: str = "application/json",
                 headers: dict[str, str] | None = None):
        from starlette.responses import Response

        return Response(body, status_code=status, media_type=content_type, headers=headers)

    def error(self, status: int, message: str, code: str | None = None, param: str | None = None):
        return self.response(status, json.dumps(error_body(status, message, code, param)))

    async def fetch(self, replica: int, method: str, target: str, headers: dict[str, str], body: bytes) -> Outcome:
        """One whole answer from one replica (status 0 when it did not answer)."""
        import aiohttp

        try:
            async with self.http().request(method, self.url(replica) + target, headers=headers, data=body) as r:
                return Outcome(replica, r.status, await r.read())
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            await self.alive(replica)
            return Outcome(replica, 0, b"")

    async def fan_out(self, replicas: list[int], method: str, target: str, headers: dict[str, str],
                      body: bytes) -> list[Outcome]:
        return list(await asyncio.gather(*(self.fetch(r, method, target, headers, body) for r in replicas)))

    # ---- the request -----------------------------------------------------------------------------

    async def __call__(self, request):
        body = await request.body()
        path = request.url.path
        target = path + (f"?{request.url.query}" if request.url.query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            return await self.handle(request.method, path, target, headers, body)
        except Lost as exc:
            return self.error(404, str(exc), "state_lost")

    def _named_replicas(self, headers: dict[str, str], name: str) -> list[int] | None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
        if value is None:
            return None
        try:
            chosen = sorted({int(part) for part in value.split(",") if part.strip()})
        except ValueError:
            raise ValueError(f"{name}: expected replica numbers separated by commas, got {value!r}") from None
        if not chosen or any(not 0 <= i < len(self.router.replicas) for i in chosen):
            raise ValueError(f"{name}: replicas are 0..{len(self.router.replicas) - 1}, got {value!r}")
        return chosen

    async def handle(self, method: str, path: str, target: str, headers: dict[str, str], body: bytes):
        try:
            one = self._named_replicas(headers, "x-loom-replica")
            subset = self._named_replicas(headers, "x-loom-replicas")
        except ValueError as exc:
            return self.error(400, str(exc), "invalid_replica")
        live = [r.index for r in self.router.alive()]
        if not live:
            return self.error(503, "no replica is alive", "unavailable")
        if one is not None:
            if len(one) != 1 or one[0] not in live:
                return self.error(404, f"replica {one} is not a live replica (live: {live})", "replica_not_found")
            return await self.proxy(one[0], method, target, headers, body)
        if path == "/healthz":
            return self.response(200, json.dumps({"status": "ready"}))   # as loomd: the process answers
        if path == "/readyz":
            outcomes = await self.fan_out(live, method, target, headers, body)
            ready = [o.replica for o in outcomes if o.status == 200]
            if not ready:
                return self.error(503, "no replica is ready", "unavailable")
            return self.response(200, json.dumps({"status": "ready", "replicas": ready}))
        if method == "GET" and path in ("/v1/models", "/v1/status", "/v1/requests", "/v1/sessions", "/metrics"):
            return await self.merged(path, target, headers, body, live)
        if path in ADMIN:
            chosen = [r for r in (subset or live) if r in live]
            outcomes = await self.fan_out(chosen, method, target, headers, body)
            status, merged = aggregate.fanned_out(outcomes)
            return self.response(status, json.dumps(merged))
        if path == "/v1/chat/completions" and method == "POST":
            return await self.chat(target, headers, body)
        if path == "/v1/sequences" and method == "POST":
            return await self.sequences(target, headers, body)
        if path.startswith("/v1/checkpoints/"):
            return await self.checkpoint(method, path, target, headers, body)
        if path.startswith(PINNED_TO_FIRST):
            return await self.proxy(live[0], method, target, headers, body)
        return await self.proxy(None, method, target, headers, body, choose=self.router.for_load)

    async def merged(self, path: str, target: str, headers: dict[str, str], body: bytes, live: list[int]):
        outcomes = await self.fan_out(live, "GET", target, headers, body)
        answered = [o for o in outcomes if o.status != 0]
        if path == "/metrics":
            return self.response(200, aggregate.metrics(answered), "text/plain; version=0.0.4")
        failed = next((o for o in answered if o.status != 200), None)
        if failed is not None and path != "/v1/status":   # a bad query: every replica says so alike
            return self.response(failed.status, failed.body)
        if path == "/v1/models":
            merged = aggregate.models(answered)
        elif path == "/v1/status":
            merged = aggregate.status(answered, [self.info[o.replica] for o in answered],
                                      [r.index for r in self.router.replicas if not r.alive], self.router.describe())
        else:
            merged = aggregate.listing(answered)
        return self.response(200, json.dumps(merged))

    # ---- state-affine routes -----------------------------------------------------------------------

    @staticmethod
    def _header(headers: dict[str, str], name: str) -> str | None:
        return next((v for k, v in headers.items() if k.lower() == name), None)

    @staticmethod
    def _json(body: bytes) -> dict[str, Any]:
        try:
            parsed = json.loads(body)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}

    async def chat(self, target: str, headers: dict[str, str], body: bytes):
        request = self._json(body)
        model = request.get("model") if isinstance(request.get("model"), str) else ""
        session = self._header(headers, "x-loom-session")
        checkpoint = self._header(headers, "x-loom-checkpoint")
        if checkpoint is not None:
            def choose() -> int | None:
                owner = self.router.for_checkpoint(checkpoint)
                if session is not None and owner is not None:
                    self.router.moved_session(session, owner)   # its continuation now lives there
                return owner
        elif session is not None:
            def choose() -> int | None:
                return self.router.for_session(session)
        else:
            def choose() -> int | None:
                return self.router.for_chat(model, request)

        def learn(replica: int, status: int, first: bytes) -> None:
            if status == 200:
                self.router.served_chat(model, request, replica)

        return await self.proxy(None, "POST", target, headers, body, choose=choose, learn=learn)

    async def sequences(self, target: str, headers: dict[str, str], body: bytes):
        request = self._json(body)
        handle = request.get("session") if isinstance(request.get("session"), str) else None
        checkpoint = self._header(headers, "x-loom-checkpoint")
        if handle is not None:
            def choose() -> int | None:
                return self.router.for_handle(handle)
        elif checkpoint is not None:
            def choose() -> int | None:
                return self.router.for_checkpoint(checkpoint)
        else:
            choose = self.router.for_load

        def learn(replica: int, status: int, first: bytes) -> None:
            attached = _sse_data(first, "attached")
            if status == 200 and isinstance(attached, dict) and isinstance(attached.get("session"), str):
                self.router.issued_handle(attached["session"], replica)

        return await self.proxy(None, "POST", target, headers, body, choose=choose, learn=learn)

    async def checkpoint(self, method: str, path: str, target: str, headers: dict[str, str], body: bytes):
        name = path[len("/v1/checkpoints/"):].split("/", 1)[0]
        session = self._header(headers, "x-loom-session")
        pinning = method == "POST" and not path.endswith("/suspend")
        if pinning and session is not None:
            def choose() -> int | None:
                return self.router.for_session(session)
        else:
            def choose() -> int | None:
                return self.router.for_checkpoint(name)

        def learn(replica: int, status: int, first: bytes) -> None:
            if pinning and status == 201:
                self.router.pinned(name, replica)
            elif method == "DELETE" and status == 200:
                self.router.unpinned(name)

        return await self.proxy(None, method, target, headers, body, choose=choose, learn=learn)

    # ---- proxying ----------------------------------------------------------------------------------

    async def proxy(self, replica: int | None, method: str, target: str, headers: dict[str, str], body: bytes, *,
                    choose=None, learn=None):
        """Send the request to `replica` (or the one `choose()` names, chosen again after a replica
        turns out dead) and relay its answer as it comes."""
        import aiohttp

        tried: set[int] = set()
        while True:
            index = replica if replica is not None else choose()
            if index is None or index in tried:
                return self.error(503, "no live replica could take the request", "unavailable")
            tried.add(index)
            state = self.router.replicas[index]
            state.in_flight += 1
            try:
                upstream = await self.http().request(method, self.url(index) + target, headers=headers, data=body)
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                state.in_flight -= 1
                if await self.alive(index) or replica is not None:
                    return self.error(502, f"replica {index} did not answer", "replica_unavailable")
                continue   # not started anywhere: choose again among the live ones
            state.served += 1
            return await self.relay(index, upstream, target, learn)

    async def relay(self, index: int, upstream, target: str, learn):
        """The replica's answer: whole when it has a length, else streamed; a stream cut off
        before its end gets the profile's error event."""
        import aiohttp
        from starlette.responses import StreamingResponse

        state = self.router.replicas[index]
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in RESPONSE_HEADERS_DROPPED}
        content_type = upstream.headers.get("Content-Type", "application/octet-stream")
        if upstream.headers.get("Content-Length") is not None:
            try:
                data = await upstream.read()
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                await self.alive(index)
                return self.error(502, f"replica {index} failed while answering", "replica_unavailable")
            finally:
                upstream.release()
                state.in_flight -= 1
            if learn is not None:
                learn(index, upstream.status, data)
            headers.pop("Content-Type", None)
            return self.response(upstream.status, data, content_type, headers)

        first = b""
        if content_type.startswith("text/event-stream"):   # learn from its first event (a handle)
            try:
                first = await _first_event(upstream)
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                pass
        if learn is not None:
            learn(index, upstream.status, first)
        headers.pop("Content-Type", None)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                if first:
                    yield first
                async for chunk in upstream.content.iter_any():
                    yield chunk
                if not upstream.content.is_eof():   # pragma: no cover - iter_any ends at EOF
                    raise aiohttp.ClientPayloadError("stream ended early")
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                await self.alive(index)
                yield _cut_off_event(target, content_type, index)
            finally:
                upstream.release()
                state.in_flight -= 1

        return StreamingResponse(chunks(), status_code=upstream.status, media_type=content_type, headers=headers)


async def _first_event(upstream) -> bytes:
    """The stream's bytes up to the end of its first SSE event (all of a short non-SSE body)."""
    data = b""
    while b"\n\n" not in data:
        chunk = await upstream.content.readany()
        if not chunk:
            break
        data += chunk
    return data


def _sse_data(first: bytes, event: str) -> Any:
    """The JSON `data` of the SSE event named `event` in `first`, if that is what it holds."""
    for block in first.decode("utf-8", "replace").split("\n\n"):
        lines = block.splitlines()
        if f"event: {event}" in lines:
            for line in lines:
                if line.startswith("data: "):
                    try:
                        return json.loads(line[len("data: "):])
                    except ValueError:
                        return None
    return None


def _cut_off_event(target: str, content_type: str, replica: int) -> bytes:
    """How a stream whose replica died mid-way ends: the same error framing loomd uses for a
    failure after the stream started (`event: error` on /v1/sequences, a `data:` error and
    `[DONE]` on chat); a raw audio stream just ends."""
    if not content_type.startswith("text/event-stream"):
        return b""
    body = json.dumps(error_body(502, f"replica {replica} failed during the stream; its state is lost",
                                 "replica_lost"))
    if target.startswith("/v1/sequences"):
        return f"event: error\ndata: {body}\n\n".encode()
    return f"data: {body}\n\ndata: [DONE]\n\n".encode()


__all__ = ["LoomIngress"]
