"""`GET /metrics` after real traffic (docs/operations.md "Metrics"), parsed with
`prometheus_client`'s text parser.

One daemon for the module serves `scout` (chat) and `vectors` (embeddings). The test scrapes
before and after its own requests and asserts on the differences: each latency histogram
counted exactly the requests made for its model and kind, its sums are positive and its
buckets cumulative, time to first token never exceeds the request's duration, and the token
and cache counters grew by exactly what the responses' `usage` reported. A request's metrics
are recorded by its `request` event, which is published just after the response is
resolved, so the second scrape polls (with a deadline) until the counts have arrived.
"""

from __future__ import annotations

from typing import Any

import pytest
from conformance_support import wait_ready
from loomd_process import REPO, Daemon
from prometheus_client.parser import text_string_to_metric_families
from scout_daemon import chat, scout_document, stream_chat, stream_result, wait_until

VECTORS = REPO / "samples" / "vectors" / "model.json"
FIRST_STEP_TIMEOUT_S = 300.0   # a deployment's first step loads its kernels
HISTOGRAMS = ("loom_time_to_first_token_seconds", "loom_time_per_output_token_seconds",
              "loom_request_duration_seconds", "loom_request_queue_time_seconds")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENBLAS_NUM_THREADS", "1")  # see test_embeddings_endpoint.BLAS_THREADS_NOTE
        daemon = Daemon.start(tmp, [scout_document(tmp, rows=2, max_output_tokens=16), VECTORS])
    try:
        assert wait_ready(daemon, ["scout", "vectors"], timeout=180), \
            daemon.request("GET", "/v1/status").body.decode()
        yield daemon
    finally:
        assert daemon.stop() == 0, "".join(daemon.output)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(server: Daemon) -> Samples:
    """Every sample of `/metrics`: {(sample name, sorted labels): value}; also checks the types."""
    r = server.request("GET", "/metrics")
    assert r.status == 200, r.body
    out: Samples = {}
    for family in text_string_to_metric_families(r.body.decode()):
        if family.name in HISTOGRAMS or family.name in ("loom_step_rows", "loom_registration_phase_seconds"):
            assert family.type == "histogram", family
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value, 0 when absent (a labelled child appears with its first observation)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def buckets(samples: Samples, name: str, **labels: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of one histogram series, by bound."""
    found = [(float(dict(k)["le"]), v) for (n, k), v in samples.items()
             if n == name + "_bucket" and {a: b for a, b in k if a != "le"} == labels]
    return sorted(found)


def assert_histogram(before: Samples, after: Samples, name: str, count: int, **labels: str) -> float:
    """The series counted `count` new observations with a positive sum; its buckets are
    cumulative and end at +Inf with the count. The sum's growth."""
    assert delta(before, after, name + "_count", **labels) == count, (name, labels)
    grown = delta(before, after, name + "_sum", **labels)
    if count:
        assert grown > 0, (name, labels, grown)
    series = buckets(after, name, **labels)
    assert series and series[-1][0] == float("inf"), (name, series)
    assert all(a[1] <= b[1] for a, b in zip(series, series[1:])), (name, series)
    assert series[-1][1] == value(after, name + "_count", **labels), (name, series)
    return grown


def chat_usage(server: Daemon, messages: list[dict[str, str]], *, stream: bool = False,
               **headers: str) -> tuple[str, dict[str, Any]]:
    body = {"model": "scout", "messages": messages, "temperature": 0, "max_tokens": 8}
    if stream:
        status, events = stream_chat(server, {**body, "stream_options": {"include_usage": True}},
                                     timeout=FIRST_STEP_TIMEOUT_S)
        assert status == 200, events
        result = stream_result(events)
        return result["content"], result["usage"]
    r = chat(server, body, timeout=FIRST_STEP_TIMEOUT_S, **headers)
    assert r.status == 200, r.body
    return r.json()["choices"][0]["message"]["content"], r.json()["usage"]


def test_metrics_after_chat_and_embedding_traffic(server):
    before = scrape(server)
    usages = []
    first = [{"role": "user", "content": "Name a large city in Japan."}]
    answer, usage = chat_usage(server, first, **{"X-Loom-Session": "metrics"})
    usages.append(usage)
    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And in Italy?"}]
    usages.append(chat_usage(server, second, **{"X-Loom-Session": "metrics"})[1])   # reuses the retained row
    usages.append(chat_usage(server, [{"role": "user", "content": "Say hello."}], stream=True)[1])
    r = server.request("POST", "/v1/embeddings", {"model": "vectors", "input": ["A man is eating food.", "Hi"]},
                       timeout=FIRST_STEP_TIMEOUT_S)
    assert r.status == 200, r.body
    embedded = r.json()["usage"]["prompt_tokens"]

    chat_series, vector_series = {"model": "scout", "kind": "chat"}, {"model": "vectors", "kind": "embeddings"}

    def arrived() -> Samples | None:
        now = scrape(server)
        counted = [delta(before, now, "loom_request_duration_seconds_count", **series)
                   for series in (chat_series, vector_series)]
        return now if counted[0] >= 3 and counted[1] >= 1 else None

    after = wait_until(arrived, "the requests' events in /metrics", timeout=30)

    # latency histograms: one observation per request made (TPOT: per request with >1 token)
    several = sum(1 for u in usages if u["completion_tokens"] > 1)
    ttft = assert_histogram(before, after, "loom_time_to_first_token_seconds", 3, **chat_series)
    assert_histogram(before, after, "loom_time_per_output_token_seconds", several, **chat_series)
    e2e = assert_histogram(before, after, "loom_request_duration_seconds", 3, **chat_series)
    queued = assert_histogram(before, after, "loom_request_queue_time_seconds", 3, **chat_series)
    assert ttft <= e2e and queued <= e2e, (ttft, queued, e2e)
    assert_histogram(before, after, "loom_request_duration_seconds", 1, **vector_series)
    assert_histogram(before, after, "loom_request_queue_time_seconds", 1, **vector_series)
    assert delta(before, after, "loom_time_to_first_token_seconds_count", **vector_series) == 0

    # token counters: exactly the usage the responses reported
    prompt = sum(u["prompt_tokens"] for u in usages)
    generated = sum(u["completion_tokens"] for u in usages)
    assert delta(before, after, "loom_prompt_tokens_total", model="scout") == prompt
    assert delta(before, after, "loom_generation_tokens_total", model="scout") == generated
    assert delta(before, after, "loom_prompt_tokens_total", model="vectors") == embedded
    assert delta(before, after, "loom_tokens_total", model="scout", direction="input") == prompt

    # cache counters: every prompt token looked up; hits are the cached tokens reported
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] > 0, usages[1]
    assert delta(before, after, "loom_prefix_cache_queries_total", model="scout") == prompt
    hits = sum(delta(before, after, "loom_prefix_cache_hits_total", model="scout", source=source)
               for source in ("prefix", "retained", "checkpoint"))
    assert hits == cached, (hits, cached)

    # steps: counted for both deployments, each with its rows-per-step histogram
    for model in ("scout", "vectors"):
        steps = delta(before, after, "loom_steps_total", model=model)
        assert steps > 0, model
        assert_histogram(before, after, "loom_step_rows", int(steps), model=model)

    # KV pool gauges: text deployments only
    used, free = value(after, "loom_kv_pages_used", model="scout"), value(after, "loom_kv_pages_free", model="scout")
    assert used >= 0 and free >= 0 and used + free > 0, (used, free)
    assert 0 <= value(after, "loom_kv_cache_usage_ratio", model="scout") <= 1
    assert ("loom_kv_pages_used", (("model", "vectors"),)) not in after

    # registration phases: scout was prepared after this daemon started
    assert value(after, "loom_registration_phase_seconds_count", model="scout", phase="preparing") >= 1
    assert value(after, "loom_registration_phase_seconds_sum", model="scout", phase="preparing") > 0
