"""EmbeddingService scheduling with a stand-in `encode` program (no weights, no kernels).

The fake program records every call's packing and blocks inside `run` until the test lets
it go, so what is pending at a boundary is decided by the test, not by timing: requests
that arrive while a cohort runs are packed into the next one together; a request
cancelled while its inputs are in a cohort loses its vectors and its peers keep theirs;
`cohort_tokens` bounds a call and large requests share cohorts round-robin.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
from service_fakes import FakeResidency

from loomrt.errors import InvalidRequest, Unavailable
from loomrt.services.embedding import EmbeddingJob, EmbeddingService

WIDTH = 4
TIMEOUT = 30


class FakeEncode:
    """vectors[b] = [sum of ids, length, first id, b-independent 1.0]; checks the packing."""

    def __init__(self):
        self.calls: list[dict[str, np.ndarray]] = []
        self.entered = threading.Semaphore(0)
        self.proceed = threading.Semaphore(0)

    def run(self, params, state, inputs):
        self.calls.append({k: v.copy() for k, v in inputs.items()})
        self.entered.release()
        assert self.proceed.acquire(timeout=TIMEOUT), "the test never let the cohort finish"
        tokens, starts, lengths = inputs["tokens"], inputs["starts"], inputs["lengths"]
        assert len(tokens) == lengths.sum() and (inputs["positions"] == np.concatenate(
            [np.arange(n) for n in lengths])).all()
        out = np.zeros((len(starts), WIDTH), np.float32)
        for b, (s, n) in enumerate(zip(starts, lengths)):
            assert (inputs["seq"][s:s + n] == b).all()
            ids = tokens[s:s + n]
            out[b] = [ids.sum(), n, ids[0], 1.0]
        return {"vectors": out}

    def scratch_bytes(self) -> int:
        return 0


def expected(inputs):
    return np.array([[sum(ids), len(ids), ids[0], 1.0] for ids in inputs], np.float32)


@pytest.fixture
def service_and_program():
    program = FakeEncode()
    executables = SimpleNamespace(programs={"encode": program})
    component = SimpleNamespace(device=SimpleNamespace(key="cpu"), owner="t/primary")
    services = []

    def make(cohort_tokens=8192):
        svc = EmbeddingService("t", executables, component, FakeResidency(), {}, 64, width=WIDTH,
                               cohort_tokens=cohort_tokens).start()
        services.append(svc)
        return svc

    yield make, program
    for svc in services:
        for _ in range(64):
            program.proceed.release()
        svc.stop("abort").result(timeout=TIMEOUT)


def wait_entered(program):
    assert program.entered.acquire(timeout=TIMEOUT), "no cohort started"


def test_requests_arriving_during_a_cohort_share_the_next_one(service_and_program):
    make, program = service_and_program
    svc = make()
    first = svc.submit(EmbeddingJob([[5, 6]]))
    wait_entered(program)
    jobs = [EmbeddingJob([[10 + i, 2, 3], [7] * (i + 1)]) for i in range(16)]
    futures = [svc.submit(j) for j in jobs]
    program.proceed.release()
    assert np.array_equal(first.result(timeout=TIMEOUT), expected([[5, 6]]))
    wait_entered(program)
    program.proceed.release()
    for job, future in zip(jobs, futures):
        assert np.array_equal(future.result(timeout=TIMEOUT), expected(job.inputs))
    assert len(program.calls) == 2 and len(program.calls[1]["starts"]) == 32   # one cohort for all 16
    assert svc.counts()["cohorts"] == 2


def test_cancelled_request_in_a_cohort_does_not_disturb_peers(service_and_program):
    make, program = service_and_program
    svc = make()
    blocker = svc.submit(EmbeddingJob([[1]]))
    wait_entered(program)
    left, stays = EmbeddingJob([[4, 4, 4]]), EmbeddingJob([[9, 8], [7]])
    f_left, f_stays = svc.submit(left), svc.submit(stays)
    program.proceed.release()
    blocker.result(timeout=TIMEOUT)
    wait_entered(program)                      # the cohort with both requests is running
    assert len(program.calls[1]["starts"]) == 3
    left.cancel()                              # the client left mid-cohort
    program.proceed.release()
    assert np.array_equal(f_stays.result(timeout=TIMEOUT), expected(stays.inputs))
    with pytest.raises(Unavailable):
        f_left.result(timeout=TIMEOUT)
    assert left.vectors == [None]
    assert svc.requests() == []


def test_cohort_tokens_bound_each_call_round_robin(service_and_program):
    make, program = service_and_program
    svc = make(cohort_tokens=10)
    blocker = svc.submit(EmbeddingJob([[1]]))
    wait_entered(program)
    big, small = EmbeddingJob([[1] * 4, [2] * 4, [3] * 4]), EmbeddingJob([[5] * 3])
    f_big, f_small = svc.submit(big), svc.submit(small)
    for _ in range(3):
        program.proceed.release()
    blocker.result(timeout=TIMEOUT)
    assert np.array_equal(f_small.result(timeout=TIMEOUT), expected(small.inputs))
    assert np.array_equal(f_big.result(timeout=TIMEOUT), expected(big.inputs))
    packed = [c["lengths"].tolist() for c in program.calls[1:]]
    assert packed == [[4, 3], [4, 4]]           # big's 1st and small's only input, then the rest
    assert all(sum(p) <= 10 for p in packed)


def test_inputs_that_can_never_fit_are_refused(service_and_program):
    make, _ = service_and_program
    svc = make(cohort_tokens=8)
    with pytest.raises(InvalidRequest):
        svc.submit(EmbeddingJob([[1] * 9]))
    with pytest.raises(InvalidRequest):
        svc.submit(EmbeddingJob([]))


def test_a_request_s_event_is_told_before_its_result_is_delivered():
    """`outcomes` (the journal's `request` event) runs before the future resolves, so a client
    that reads the journal once it has its response finds its request there."""
    program = FakeEncode()
    seen: list[bool] = []
    svc = EmbeddingService("t", SimpleNamespace(programs={"encode": program}),
                           SimpleNamespace(device=SimpleNamespace(key="cpu"), owner="t/primary"), FakeResidency(), {},
                           64, width=WIDTH, outcomes=lambda job, error: seen.append(job.future.done())).start()
    try:
        program.proceed.release()
        future = svc.submit(EmbeddingJob([[5, 6]]))
        assert np.array_equal(future.result(timeout=TIMEOUT), expected([[5, 6]]))
        assert seen == [False]
    finally:
        for _ in range(4):
            program.proceed.release()
        svc.stop("abort").result(timeout=TIMEOUT)
