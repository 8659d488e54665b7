"""Prometheus metrics (`GET /metrics`), all prefixed `loom_`; the table with each metric's
type, labels, buckets and vLLM / llama.cpp counterpart is in docs/operations.md ("Metrics").

Counters and histograms are fed where things happen: HTTP requests by route and status by
the error middleware; tokens, latencies and cache hits from the registry's `request` events
(so they count every request however it was submitted, exactly once, when it finished; the
runtime puts the timings in the event and knows nothing of Prometheus); phase durations from
its lifecycle events. Gauges and counters that mirror runtime state (queue depths, active
rows, KV pages, steps and rows per step, memory per device/owner/category) are read from the
registry at scrape time by a custom collector, so they can never drift from `/v1/status`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from loomrt.registry import Registry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Buckets (seconds). TTFT and TPOT are vLLM's; request and queue latency start lower than
# vLLM's e2e buckets (0.3 s) because embeddings and decisions answer in milliseconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
                   320.0, 640.0, 1920.0, 7680.0)
PHASE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TIMED_PHASES = ("compiling", "preparing")   # the registration phases whose durations are observed


class _RuntimeCollector:
    def __init__(self, registry: Registry):
        self.registry = registry

    def collect(self):
        queue = GaugeMetricFamily("loom_queue_depth", "Requests waiting for admission", labels=["model"])
        active = GaugeMetricFamily("loom_rows_active", "Requests running in a deployment's steps", labels=["model"])
        phase = GaugeMetricFamily("loom_registration_ready", "1 when a registration is ready", labels=["model"])
        used = GaugeMetricFamily("loom_kv_pages_used", "KV pool pages in use (rows, retained, prefixes, pins)",
                                 labels=["model"])
        free = GaugeMetricFamily("loom_kv_pages_free", "KV pool pages free", labels=["model"])
        ratio = GaugeMetricFamily("loom_kv_cache_usage_ratio", "KV pool pages used / all pages (0..1)",
                                  labels=["model"])
        steps = CounterMetricFamily("loom_steps", "Stage calls run by a deployment", labels=["model"])
        rows = HistogramMetricFamily("loom_step_rows", "Rows (requests or prefill chunks) per stage call",
                                     labels=["model"])
        memory = GaugeMetricFamily("loom_device_memory_bytes", "Bytes owned on a device",
                                   labels=["device", "owner", "category"])
        budget = GaugeMetricFamily("loom_device_budget_bytes", "Memory budget of a device", labels=["device"])
        for reg in self.registry.registrations():
            service = reg.service
            counts = service.counts() if service is not None else {"pending": 0, "active": 0}
            queue.add_metric([reg.name], counts["pending"])
            active.add_metric([reg.name], counts["active"])
            phase.add_metric([reg.name], 1 if reg.phase == "ready" else 0)
            if "pages_used" in counts:
                total = counts["pages_used"] + counts["pages_free"]
                used.add_metric([reg.name], counts["pages_used"])
                free.add_metric([reg.name], counts["pages_free"])
                ratio.add_metric([reg.name], counts["pages_used"] / total if total else 0.0)
            if service is not None:
                steps.add_metric([reg.name], counts.get("steps", 0))
                sizes = dict(service.step_rows)  # a copy: the worker adds to it while we read
                buckets, seen = [], 0
                for bound in ROWS_BUCKETS:
                    seen = sum(n for size, n in sizes.items() if size <= bound)
                    buckets.append((str(bound), seen))
                buckets.append(("+Inf", sum(sizes.values())))
                rows.add_metric([reg.name], buckets, sum(size * n for size, n in sizes.items()))
        for device in self.registry.devices.accounting():
            budget.add_metric([device["name"]], device["budget_bytes"])
            for owner, categories in device["owners"].items():
                for category, n in categories.items():
                    memory.add_metric([device["name"], owner, category], n)
        yield from (queue, active, phase, used, free, ratio, steps, rows, memory, budget)


class Metrics:
    def __init__(self, registry: Registry):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("loom_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.tokens = Counter("loom_tokens", "Tokens processed by deployment and direction (input, output)",
                              ["model", "direction"], registry=r)
        self.prompt_tokens = Counter("loom_prompt_tokens", "Prompt (input) tokens of finished requests",
                                     ["model"], registry=r)
        self.generation_tokens = Counter("loom_generation_tokens", "Generated (output) tokens of finished requests",
                                         ["model"], registry=r)
        self.ttft = Histogram("loom_time_to_first_token_seconds", "Submission to the first generated token",
                              ["model", "kind"], buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("loom_time_per_output_token_seconds",
                              "Mean time between a request's output tokens after the first",
                              ["model", "kind"], buckets=TPOT_BUCKETS, registry=r)
        self.latency = Histogram("loom_request_duration_seconds", "Submission to completion of a successful request",
                                 ["model", "kind"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("loom_request_queue_time_seconds", "Submission to admission (first step)",
                               ["model", "kind"], buckets=LATENCY_BUCKETS, registry=r)
        self.cache_queries = Counter("loom_prefix_cache_queries", "Prompt tokens looked up in the prefix cache "
                                     "and retained sessions (generations not started from a checkpoint)",
                                     ["model"], registry=r)
        self.cache_hits = Counter("loom_prefix_cache_hits", "Prompt tokens reused instead of prefilled, by source "
                                  "(prefix, retained, checkpoint)", ["model", "source"], registry=r)
        self.images = Counter("loom_image_inputs", "Images in finished chat requests, by outcome: projected (decoded "
                              "and run through the image component) or reused (their positions came from a cache)",
                              ["model", "outcome"], registry=r)
        self.first_audio = Histogram("loom_speech_time_to_first_audio_seconds",
                                     "Submission to the first PCM bytes written to a speech client",
                                     ["model"], buckets=TTFT_BUCKETS, registry=r)
        self.phases = Histogram("loom_registration_phase_seconds", "Time a registration spent compiling or preparing",
                                ["model", "phase"], buckets=PHASE_BUCKETS, registry=r)
        self._phase_lock = threading.Lock()
        self._phase_start: dict[str, tuple[str, float]] = {}
        self.registry.register(_RuntimeCollector(registry))
        registry.listeners.append(self.observe)

    def observe(self, event: dict[str, Any]) -> None:
        """A registry event (on a service or build thread): a finished request feeds the token
        counters, latency histograms and cache counters; a phase change ends a timed phase."""
        if event.get("event") == "request":
            self._request(event)
        elif event.get("event") == "speech_first_audio" and "first_audio_ms" in event:
            self.first_audio.labels(event["model"]).observe(event["first_audio_ms"] / 1000)
        elif "phase" in event:
            self._phase(event)

    def _request(self, event: dict[str, Any]) -> None:
        model, kind = event["model"], event.get("kind", "")
        prompt, generated = event.get("prompt_tokens") or 0, event.get("completion_tokens") or 0
        if prompt:
            self.tokens.labels(model, "input").inc(prompt)
            self.prompt_tokens.labels(model).inc(prompt)
        if generated:
            self.tokens.labels(model, "output").inc(generated)
            self.generation_tokens.labels(model).inc(generated)
        if event.get("images"):
            self.images.labels(model, "projected").inc(event.get("images_projected", 0))
            self.images.labels(model, "reused").inc(event.get("images_reused", 0))
        if "error" in event or "queue_ms" not in event:
            return   # latencies are of successful inference requests (a utility is never queued)
        e2e = event["duration_ms"] / 1000
        self.latency.labels(model, kind).observe(e2e)
        self.queue.labels(model, kind).observe(min(event["queue_ms"] / 1000, e2e))
        if "first_token_ms" in event:
            ttft = min(event["first_token_ms"] / 1000, e2e)
            self.ttft.labels(model, kind).observe(ttft)
            if generated > 1:
                self.tpot.labels(model, kind).observe((e2e - ttft) / (generated - 1))
        if "cached_tokens" in event:
            source = event.get("cache_source")
            if source != "checkpoint":
                self.cache_queries.labels(model).inc(prompt)
            if source is not None and event["cached_tokens"]:
                self.cache_hits.labels(model, source).inc(event["cached_tokens"])

    def _phase(self, event: dict[str, Any]) -> None:
        model, phase, now = event["model"], event["phase"], event.get("time", time.time())
        with self._phase_lock:
            previous = self._phase_start.get(model)
            if previous is not None and previous[0] == phase:
                return
            self._phase_start[model] = (phase, now)
        if previous is not None and previous[0] in TIMED_PHASES:
            self.phases.labels(model, previous[0]).observe(max(0.0, now - previous[1]))

    def request(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "Metrics"]
