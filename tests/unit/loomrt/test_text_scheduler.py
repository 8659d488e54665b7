"""The text scheduler (`loomrt/services/text.py`) over a fake `prefill_decode` stage: no model, no numba.

The fake stage records every packed step it is given and "samples" a deterministic next
token from what the row's pages hold: it writes each fed token into the `per page` state
at its position and answers `(sum of the row's tokens at positions 0..p) % VOCAB` for each
row's last position p. So a row that did not continue from its own pages (a retained
history reused wrongly, a page handed to two rows) samples a different token, and the tests
can assert on the exact packing: which rows ran, with which tokens, at which positions.
Everything runs on the real `TextService` worker; tests wait on futures with deadlines.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from loomrt.devices import Devices
from loomrt.errors import InvalidRequest, Unavailable
from loomrt.residency import Component, Residency
from loomrt.services.text import Generation, Outbox, Sampling, TextService

PAGE_SIZE = 4
VOCAB = 50
TIMEOUT = 10.0
GREEDY = Sampling(temperature=0.0, top_p=1.0, top_k=0, seed=1)


class FakeStep:
    """prefill_decode(tokens, positions, rows, page_table, last, sampling...) -> (next: i32[R])."""

    def __init__(self):
        self.calls: list[dict[str, np.ndarray]] = []
        self.gate: threading.Event | None = None

    def run(self, params, state, inputs):
        if self.gate is not None:
            assert self.gate.wait(TIMEOUT)
        self.calls.append({k: np.array(v) for k, v in inputs.items()})
        cache = state["kv"]
        tokens, positions, rows, table, last = (inputs[k] for k in ("tokens", "positions", "rows", "page_table",
                                                                      "last"))
        for t, p, r in zip(tokens, positions, rows):
            cache[table[r, p // PAGE_SIZE], p % PAGE_SIZE] = t
        out = np.zeros(len(last), np.int32)
        for r, i in enumerate(last):
            p = positions[i]
            out[r] = sum(int(cache[table[r, j // PAGE_SIZE], j % PAGE_SIZE]) for j in range(p + 1)) % VOCAB
        return {"next": out}

    def scratch_bytes(self):
        return 0


class FakeExecutables:
    def __init__(self):
        self.programs = {"prefill_decode": FakeStep()}


def tokenizer() -> Tokenizer:
    return Tokenizer(WordLevel({f"w{i}": i for i in range(VOCAB)} | {"[UNK]": VOCAB}, unk_token="[UNK]"))


def make_service(*, rows=2, context_length=32, pool_pages=16, prefill_chunk=5, session_cache_capacity=0):
    devices = Devices()
    residency = Residency(devices)
    component = Component("t", "primary", devices.get("cpu"), lambda: {})
    residency.add(component)
    residency.load(component)
    state = {"kv": np.zeros((pool_pages, PAGE_SIZE), np.int64)}
    return TextService("t", FakeExecutables(), component, residency, state, 8, max_active=rows,
                       tokenizer=tokenizer(), control=None, page_size=PAGE_SIZE, context_length=context_length,
                       page_states=["kv"], prefill_chunk=prefill_chunk,
                       session_cache_capacity=session_cache_capacity).start()


@pytest.fixture
def service():
    made = []

    def make(**kwargs):
        made.append(make_service(**kwargs))
        return made[-1]

    yield make
    for s in made:
        s.executables.programs["prefill_decode"].gate = None
        s.stop("abort").result(TIMEOUT)


def expected_tokens(prompt: list[int], count: int) -> list[int]:
    """What the fake stage samples: each next token is the running sum of all tokens so far."""
    seq, out = list(prompt), []
    for _ in range(count):
        nxt = sum(seq) % VOCAB
        out.append(nxt)
        seq.append(nxt)
    return out


def generation(prompt, max_tokens, **kwargs) -> Generation:
    return Generation(prompt, max_tokens, GREEDY, (), None, **kwargs)


def test_prefill_runs_in_chunks_then_decodes(service):
    svc = service(prefill_chunk=5)
    prompt = list(range(1, 13))                               # 12 tokens: chunks of 5, 5, 2
    g = generation(prompt, 3)
    result = svc.submit(g).result(TIMEOUT)
    calls = svc.executables.programs["prefill_decode"].calls
    assert [c["tokens"].tolist() for c in calls] == [prompt[:5], prompt[5:10], prompt[10:],
                                                     [g.generated[0]], [g.generated[1]]]
    assert [c["positions"].tolist() for c in calls[:3]] == [list(range(0, 5)), list(range(5, 10)), [10, 11]]
    assert calls[3]["positions"].tolist() == [12] and calls[4]["positions"].tolist() == [13]
    assert g.generated == expected_tokens(prompt, 3)
    assert result["finish_reason"] == "length" and result["usage"]["completion_tokens"] == 3
    assert calls[0]["page_table"].shape == (1, 8)               # context 32 / page size 4: one row's table
    assert (calls[0]["page_table"][0] >= 0).sum() == svc.pool.pages_for(len(prompt) + 3)  # prompt + budget


def test_decode_rows_and_a_prefill_chunk_share_a_step(service):
    svc = service(rows=2, prefill_chunk=4)
    program = svc.executables.programs["prefill_decode"]
    first = generation([3, 4], 12, outbox=Outbox(credit=1))     # decodes one token, then waits for its reader
    f1 = svc.submit(first)
    assert first.outbox.get(timeout=TIMEOUT)[0] == "delta"    # prefilled and decoding
    second = generation(list(range(10, 19)), 2)                  # 9 prompt tokens: chunks of 4, 4, 1
    program.gate = threading.Event()
    f2 = svc.submit(second)
    program.gate.set()
    while not f1.done():
        first.outbox.get(timeout=TIMEOUT)
    f2.result(TIMEOUT)
    shared = [c for c in program.calls if len(c["last"]) == 2]
    assert shared, "no step packed both rows"
    for step in shared:
        counts = np.bincount(step["rows"], minlength=2).tolist()
        assert counts[0] == 1 and 1 <= counts[1] <= 4              # a decode row first, then a prefill chunk
        fed = step["tokens"][step["rows"] == 1].tolist()
        start = int(step["positions"][step["rows"] == 1][0])
        assert fed == second.prompt[start:start + len(fed)]
    assert first.generated == expected_tokens([3, 4], 12) and second.generated == expected_tokens(
        list(range(10, 19)), 2)


def test_admission_refuses_what_can_never_fit(service):
    svc = service(context_length=8)
    with pytest.raises(InvalidRequest, match="context of 8 tokens"):
        svc.submit(generation(list(range(9)), 1))
    with pytest.raises(InvalidRequest, match="empty"):
        svc.submit(generation([], 1))


def test_rows_bound_the_active_generations(service):
    svc = service(rows=1)
    program = svc.executables.programs["prefill_decode"]
    program.gate = threading.Event()
    a, b = generation([1, 2], 2), generation([5, 6], 2)
    fa, fb = svc.submit(a), svc.submit(b)
    assert svc.counts()["pending"] >= 1                     # one row: b waits
    program.gate.set()
    fa.result(TIMEOUT), fb.result(TIMEOUT)
    assert all(len(c["last"]) == 1 for c in program.calls)  # never two rows in a step


def test_a_reader_out_of_credit_pauses_only_its_row(service):
    svc = service(rows=2)
    slow = generation([1, 1], 8, outbox=Outbox(credit=2))
    fast = generation([2, 2], 12)
    f_slow = svc.submit(slow)
    svc.submit(fast).result(TIMEOUT)
    assert len(fast.generated) == 12
    assert not f_slow.done() and len(slow.generated) < 8
    events = []
    while not events or events[-1][0] not in ("done", "error"):
        events.append(slow.outbox.get(timeout=TIMEOUT))
    assert events[-1][0] == "done"
    assert slow.generated == expected_tokens([1, 1], 8)


def test_cancellation_frees_the_row_and_pages_at_the_next_boundary(service):
    svc = service(rows=1, pool_pages=16)
    program = svc.executables.programs["prefill_decode"]
    program.gate = threading.Event()
    g = generation(list(range(1, 9)), 20)
    future = svc.submit(g)
    follower = generation([7, 7], 2)
    f2 = svc.submit(follower)
    g.cancel()
    program.gate.set()
    with pytest.raises(Exception):
        future.result(TIMEOUT)
    f2.result(TIMEOUT)
    assert follower.generated == expected_tokens([7, 7], 2)
    assert svc.counts()["pages_used"] == svc.pool.pages_for(2 + 2)  # only the follower's retained history


def test_a_follow_up_reuses_the_retained_row(service):
    svc = service(rows=2, prefill_chunk=16)
    first = generation([4, 5, 6], 3, session="s")
    svc.submit(first).result(TIMEOUT)
    history = [4, 5, 6] + first.generated
    follow = generation(history + [9], 2, session="s")
    svc.submit(follow).result(TIMEOUT)
    calls = svc.executables.programs["prefill_decode"].calls
    # the follow-up fed only what the retained row did not hold: the last sampled token and the new one
    assert follow.cached_tokens == len(history) - 1
    assert calls[-2]["tokens"].tolist() == history[-1:] + [9]
    assert follow.generated == expected_tokens(history + [9], 2)


class BrokenStep(FakeStep):
    def run(self, params, state, inputs):
        raise RuntimeError("the kernel fell over")


def test_an_internal_failure_fails_its_rows_is_logged_and_the_service_goes_on(service, caplog):
    svc = service(rows=2)
    good = svc.executables.programs["prefill_decode"]
    svc.executables.programs["prefill_decode"] = BrokenStep()
    with caplog.at_level("ERROR", logger="loomrt.services"):
        with pytest.raises(Exception) as caught:
            svc.submit(generation([1, 2, 3], 2)).result(TIMEOUT)
    error = caught.value
    assert error.status == 500 and "stage 'prefill_decode' failed: RuntimeError: the kernel fell over" in error.message
    assert "Traceback" not in error.message                       # the client gets one line...
    [record] = [r for r in caplog.records if r.name == "loomrt.services"]
    assert record.exc_info is not None and "the kernel fell over" in record.getMessage()  # ...the log the traceback
    svc.executables.programs["prefill_decode"] = good
    g = generation([1, 2, 3], 2)
    svc.submit(g).result(TIMEOUT)                                 # the next request is served
    assert g.generated == expected_tokens([1, 2, 3], 2)
    counts = svc.counts()
    assert counts["pages_used"] == counts["pages_retained"] == 1  # only the served one's history holds pages


# ---- named checkpoints (loomrt/pins.py) -----------------------------------------------------

def test_a_pin_holds_pool_pages_and_a_fork_after_suspension_resumes_it(service):
    """A pin copies the session's pages into pool pages of its own; suspension (elastic
    backing) parks them on the host and frees the pages; a fork afterwards warms the pin into
    new pages and samples what a fork before suspension sampled (the fake's tokens are sums of
    the pages it reads, so a wrong copy shows)."""
    svc = service(rows=1, pool_pages=9)
    svc.pins.capacity = 1
    svc.submit(generation([1, 2, 3, 4, 5, 6], 2, session="a")).result(TIMEOUT)
    point = svc.pin("cp", "a")
    assert point.position == 7 and len(point.pages) == 2 and point.host_bytes == 0   # the last sample is pending
    assert svc.counts()["pages_checkpoints"] == 2
    prompt = point.tokens + [9, 10]

    def fork(session):
        g = generation(prompt, 3, session=session, checkpoint="cp")
        svc.submit(g).result(TIMEOUT)
        assert g.cached_tokens == 7
        return g.generated

    before = fork("b")
    assert before == expected_tokens(prompt, 3)
    used = svc.counts()["pages_used"]
    assert svc.suspend("cp").host_bytes == 2 * PAGE_SIZE * 8          # two pages of the int64 fake cache
    assert svc.counts()["pages_used"] == used - 2 and svc.counts()["checkpoint_host_bytes"] == 64
    assert fork("c") == before
    assert len(point.pages) == 2 and not point.suspended
    with pytest.raises(Unavailable, match="checkpoints hold 2"):      # 8 pages cannot fit beside the pin's 2
        svc.submit(generation(list(range(1, 31)), 2))
    svc.pins.backing = "fixed"
    with pytest.raises(InvalidRequest, match="fixed backing"):
        svc.suspend("cp")
    svc.unpin("cp")
    assert svc.counts()["pages_checkpoints"] == 0
