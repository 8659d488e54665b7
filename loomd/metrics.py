"""Prometheus metrics (`GET /metrics`), all prefixed `loom_`.

Counters are incremented where things happen: HTTP requests by route and status by the
error middleware, tokens from the registry's `request` events (so they count every request
however it was submitted, and exactly once, when it finished); gauges that mirror runtime state (queue
depths, active rows, memory owned per device/owner/category) are read from the registry at
scrape time by a custom collector, so they can never drift from what `/v1/status` says.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily

from loomrt.registry import Registry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _RuntimeCollector:
    def __init__(self, registry: Registry):
        self.registry = registry

    def collect(self):
        queue = GaugeMetricFamily("loom_queue_depth", "Requests waiting for admission", labels=["model"])
        active = GaugeMetricFamily("loom_rows_active", "Requests running in a deployment's steps", labels=["model"])
        phase = GaugeMetricFamily("loom_registration_ready", "1 when a registration is ready", labels=["model"])
        memory = GaugeMetricFamily("loom_device_memory_bytes", "Bytes owned on a device",
                                   labels=["device", "owner", "category"])
        budget = GaugeMetricFamily("loom_device_budget_bytes", "Memory budget of a device", labels=["device"])
        for reg in self.registry.registrations():
            counts = reg.service.counts() if reg.service is not None else {"pending": 0, "active": 0}
            queue.add_metric([reg.name], counts["pending"])
            active.add_metric([reg.name], counts["active"])
            phase.add_metric([reg.name], 1 if reg.phase == "ready" else 0)
        for device in self.registry.devices.accounting():
            budget.add_metric([device["name"]], device["budget_bytes"])
            for owner, categories in device["owners"].items():
                for category, n in categories.items():
                    memory.add_metric([device["name"], owner, category], n)
        yield from (queue, active, phase, memory, budget)


class Metrics:
    def __init__(self, registry: Registry):
        self.registry = CollectorRegistry()
        self.requests = Counter("loom_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.tokens = Counter("loom_tokens", "Tokens processed by deployment and direction",
                              ["model", "direction"], registry=self.registry)
        self.registry.register(_RuntimeCollector(registry))
        registry.listeners.append(self.observe)

    def observe(self, event: dict) -> None:
        """A registry event (on a service worker thread): a finished request adds its tokens."""
        if event.get("event") != "request":
            return
        for direction, field in (("input", "prompt_tokens"), ("output", "completion_tokens")):
            if event.get(field):
                self.tokens.labels(event["model"], direction).inc(event[field])

    def request(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "Metrics"]
