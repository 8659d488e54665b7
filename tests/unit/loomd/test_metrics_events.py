"""`loomd.metrics.Metrics` fed registry events directly, for the arithmetic the conformance
test (tests/conformance/test_metrics.py) cannot pin down with real timings: how a request
event's milestones become TTFT, TPOT, duration and queue time; which events stay out of the
latencies (failures, utilities); which cache sources count as queries; and phase durations
from lifecycle events. Events are published through a real (empty) `Registry`."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loomd.metrics import Metrics
from loomrt.devices import Devices
from loomrt.registry import Registry


def scrape(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def fed():
    registry = Registry(Devices(cuda={}))
    metrics = Metrics(registry)
    return registry, metrics


def chat_event(**fields):
    return {"event": "request", "model": "scout", "kind": "chat", "request": 1, "time": 0.0, **fields}


def test_a_generation_becomes_ttft_tpot_duration_and_queue_time(fed):
    registry, metrics = fed
    registry._publish(chat_event(duration_ms=1000.0, queue_ms=100.0, first_token_ms=400.0, prompt_tokens=12,
                                 completion_tokens=5, cached_tokens=4, cache_source="retained"))
    s = scrape(metrics)
    series = {"model": "scout", "kind": "chat"}
    assert get(s, "loom_request_duration_seconds_sum", **series) == pytest.approx(1.0)
    assert get(s, "loom_request_queue_time_seconds_sum", **series) == pytest.approx(0.1)
    assert get(s, "loom_time_to_first_token_seconds_sum", **series) == pytest.approx(0.4)
    assert get(s, "loom_time_per_output_token_seconds_sum", **series) == pytest.approx(0.6 / 4)
    assert get(s, "loom_time_to_first_token_seconds_bucket", le="0.5", **series) == 1
    assert get(s, "loom_time_to_first_token_seconds_bucket", le="0.25", **series) == 0
    assert get(s, "loom_prompt_tokens_total", model="scout") == 12
    assert get(s, "loom_generation_tokens_total", model="scout") == 5
    assert get(s, "loom_tokens_total", model="scout", direction="output") == 5
    assert get(s, "loom_prefix_cache_queries_total", model="scout") == 12
    assert get(s, "loom_prefix_cache_hits_total", model="scout", source="retained") == 4


def test_a_single_token_has_no_tpot_and_a_checkpoint_start_is_no_query(fed):
    registry, metrics = fed
    registry._publish(chat_event(duration_ms=50.0, queue_ms=1.0, first_token_ms=50.0, prompt_tokens=3,
                                 completion_tokens=1, cached_tokens=2, cache_source="checkpoint"))
    s = scrape(metrics)
    assert get(s, "loom_time_to_first_token_seconds_count", model="scout", kind="chat") == 1
    assert get(s, "loom_time_per_output_token_seconds_count", model="scout", kind="chat") is None
    assert get(s, "loom_prefix_cache_queries_total", model="scout") is None
    assert get(s, "loom_prefix_cache_hits_total", model="scout", source="checkpoint") == 2


def test_failures_and_utilities_count_tokens_but_no_latency(fed):
    registry, metrics = fed
    registry._publish(chat_event(duration_ms=5.0, queue_ms=1.0, prompt_tokens=7, completion_tokens=0,
                                 error={"code": "unavailable", "message": "left", "status": 499}))
    registry._publish({"event": "request", "model": "scout", "kind": "tokenize", "request": 2, "duration_ms": 1.0,
                       "tokens": 9})
    s = scrape(metrics)
    assert get(s, "loom_prompt_tokens_total", model="scout") == 7
    assert not any(name.startswith(("loom_request_duration", "loom_request_queue")) for name, _ in s)


def test_phase_durations_come_from_consecutive_phase_events(fed):
    registry, metrics = fed
    for phase, t in (("registering", 0.0), ("compiling", 1.0), ("compiling", 2.0), ("preparing", 4.0),
                     ("ready", 4.5)):
        registry._publish({"event": phase, "model": "scout", "phase": phase, "time": t})
    s = scrape(metrics)
    assert get(s, "loom_registration_phase_seconds_sum", model="scout", phase="compiling") == pytest.approx(3.0)
    assert get(s, "loom_registration_phase_seconds_sum", model="scout", phase="preparing") == pytest.approx(0.5)
    assert get(s, "loom_registration_phase_seconds_count", model="scout", phase="registering") is None


def test_a_speech_request_s_first_audio_is_its_own_histogram(fed):
    registry, metrics = fed
    registry._publish({"event": "speech_first_audio", "model": "speaker", "kind": "speech", "request": 3,
                       "time": 0.0, "bytes": 4800, "first_audio_ms": 55.0})
    registry._publish({"event": "speech_block", "model": "speaker", "kind": "speech", "request": 3, "time": 0.0,
                       "block": 0, "blocks": 2, "frames": 10})
    samples = scrape(metrics)
    assert get(samples, "loom_speech_time_to_first_audio_seconds_count", model="speaker") == 1
    assert get(samples, "loom_speech_time_to_first_audio_seconds_sum", model="speaker") == pytest.approx(0.055)
    assert get(samples, "loom_speech_time_to_first_audio_seconds_bucket", model="speaker", le="0.04") == 0
    assert get(samples, "loom_speech_time_to_first_audio_seconds_bucket", model="speaker", le="0.06") == 1
