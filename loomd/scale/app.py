"""The Ray Serve application: `build_app` binds the ingress to the documents, `run` serves it.

Ray Serve owns the HTTP listener (its proxy, uvicorn) and the ingress deployment's
lifecycle; the ingress owns its replicas (docs/scale-out.md says why they are actors it
starts rather than a Serve deployment of their own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loomd.scale.ingress import LoomIngress

#: Requests the one ingress replica accepts at once (Ray Serve's default is 5: far too few
#: for a proxy whose requests mostly wait on the Loom replicas).
INGRESS_CONCURRENCY = 1024


def read_documents(paths: list[Path]) -> list[tuple[str, bytes]]:
    """(origin, bytes) of each document: the origin resolves its relative paths on every node."""
    return [(str(p.resolve()), p.read_bytes()) for p in paths]


def build_app(documents: list[tuple[str, bytes]], replicas: int, **options: Any):
    from ray import serve

    deployment = serve.deployment(LoomIngress, name="loom-ingress", num_replicas=1,
                                  max_ongoing_requests=INGRESS_CONCURRENCY, ray_actor_options={"num_cpus": 0})
    return deployment.bind(documents, replicas, **options)


def run(documents: list[tuple[str, bytes]], replicas: int, host: str, port: int, *, address: str | None = None,
        **options: Any) -> None:
    """Start (or join, with `address`) a Ray cluster, serve the application on host:port and
    return once the ingress has started its replicas."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, logging_level="WARNING")
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(documents, replicas, **options), name="loom", route_prefix="/")


def shutdown() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


__all__ = ["build_app", "read_documents", "run", "shutdown"]
