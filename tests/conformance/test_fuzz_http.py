"""Fuzzing over real sockets: mutated raw HTTP, multipart and JSON requests against one `loomd`.

Spec: http-profiles.md ("Request framing", "Errors"). `http_fuzz` (beside this file) builds the
cases: seeded mutations of a valid request to every route (`examples`), so a failure names a
seed and a case number that regenerate it exactly. A bounded count runs here; `bench/fuzz.py
--count 100000` runs the same generator by hand. What must hold for every case:

* no response has a status >= 500;
* every case is answered or its connection closed within `DEADLINE_S` (a framing case
  half-closes after sending, so the server knows nothing more is coming);
* every error response is `{"error": {"message", "type", "code"}}` JSON;
* and afterwards the daemon still answers `/healthz` and a normal chat.
Failing cases are written to the test's tmp directory as reproducers (`http_fuzz.save_reproducer`)."""

from __future__ import annotations

import json

import pytest

import http_fuzz
from loomd_process import read_response

SEED = 23
COUNT = 1200
DEADLINE_S = 30.0     # per case: a bound for "does not hang", not a timing claim (chats queue behind 2 rows)
WORKERS = 6


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    server = http_fuzz.start_daemon(tmp)
    try:
        http_fuzz.warm_up(server)
        yield server, tmp
    finally:
        code = server.stop()
        assert code == 0, "".join(server.output)[-4000:]


def test_every_route_has_an_example():
    """The fuzzer reaches every route the app registers (a new route needs a valid example)."""
    cases = http_fuzz.examples("scout", "mini", "spare")
    assert http_fuzz.missing_examples(cases) == set()


def test_the_inputs_are_reproducible(tmp_path):
    first = http_fuzz.fuzz_inputs(tmp_path, SEED, 50)
    again = http_fuzz.fuzz_inputs(tmp_path, SEED, 50)
    assert [first(i).data for i in range(50)] == [again(i).data for i in range(50)]
    families = {first(i).family for i in range(50)}
    assert families == {"json", "multipart", "http"}


def test_fuzzed_requests_get_no_5xx_no_hang_and_json_errors(fuzz_daemon):
    server, tmp = fuzz_daemon
    case = http_fuzz.fuzz_inputs(tmp, SEED, COUNT)
    summary = http_fuzz.campaign("127.0.0.1", server.port, case, COUNT, workers=WORKERS, deadline_s=DEADLINE_S)
    saved = [http_fuzz.save_reproducer(tmp / "reproducers", SEED, i, c, out) for i, c, out in summary.failures]
    report = "\n".join(f"case {i} ({c.family} {c.route}: {c.mutation}; half_close={c.half_close}): "
                       f"statuses {out.statuses}, hung {out.hung}; {'; '.join(out.problems)[:400]}"
                       for i, c, out in summary.failures[:20])
    if summary.failures:   # what the daemon holds now, for the diagnosis
        status = server.request("GET", "/v1/status", timeout=30).json()
        held = {r["model"]: r.get("scheduler") for r in status["registrations"]}
        report += f"\nschedulers after the run: {json.dumps(held)[:2000]}"
    assert not summary.failures, (f"{len(summary.failures)} of {COUNT} cases failed ({summary.line()}); "
                                  f"reproducers in {tmp / 'reproducers'}:\n{report}")
    assert sum(summary.by_status.values()) >= COUNT
    # still serving: a health probe and a normal chat on fresh connections
    server.assert_healthy()
    with server.connect(timeout=60) as s:
        s.sendall(http_fuzz.normal_chat("scout"))
        response = read_response(s)
    assert response.status == 200, response.body
    assert json.loads(response.body)["object"] == "chat.completion"
