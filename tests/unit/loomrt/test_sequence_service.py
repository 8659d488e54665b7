"""The sequence service's scheduling over a fake `consume` program (no weights, no HTTP).

The fake writes each token's (row-independent) value into `per page` state and returns
f32 rows [id, position, sum of the ids at positions 0..p of its row as read back from the
pages], so a test sees exactly which pages a step read: an append that did not continue
from its handle's retained pages gets a different sum. Everything runs on the real
`SequenceService` worker thread; tests wait on futures and outbox events with deadlines.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from loomrt.devices import Devices
from loomrt.errors import Conflict, InvalidRequest, NotFound, Unavailable
from loomrt.residency import Component, Residency
from loomrt.services.sequence import SequenceAppend, SequenceService
from loomrt.services.outbox import Outbox

PAGE_SIZE = 4
TIMEOUT = 10.0


class FakeConsume:
    """consume(tokens, positions, rows, page_table) -> (hidden: f32[T, 3])."""

    def __init__(self):
        self.calls: list[dict[str, np.ndarray]] = []
        self.gate: threading.Event | None = None     # when set, each call waits for it

    def run(self, params, state, inputs):
        if self.gate is not None:
            assert self.gate.wait(TIMEOUT)
        self.calls.append({k: np.array(v) for k, v in inputs.items()})
        cache = state["cache"]
        tokens, positions, rows, table = (inputs[k] for k in ("tokens", "positions", "rows", "page_table"))
        for t, p, r in zip(tokens, positions, rows):
            cache[table[r, p // PAGE_SIZE], p % PAGE_SIZE] = t
        out = np.zeros((len(tokens), 3), np.float32)
        for i, (t, p, r) in enumerate(zip(tokens, positions, rows)):
            out[i] = (t, p, sum(cache[table[r, j // PAGE_SIZE], j % PAGE_SIZE] for j in range(p + 1)))
        return {"hidden": out}

    def scratch_bytes(self):
        return 0


class FakeExecutables:
    def __init__(self):
        self.programs = {"consume": FakeConsume()}


def make_service(*, rows=2, context_length=16, pool_pages=8, step_tokens=4, credit=8, pending=8,
                 backing="elastic"):
    devices = Devices()
    residency = Residency(devices)
    component = Component("seq", "primary", devices.get("cpu"), lambda: {})
    residency.add(component)
    residency.load(component)
    state = {"cache": np.zeros((pool_pages, PAGE_SIZE), np.float32)}
    return SequenceService("seq", FakeExecutables(), component, residency, state, pending, max_active=rows,
                           page_size=PAGE_SIZE, context_length=context_length, page_states=["cache"],
                           step_tokens=step_tokens, credit=credit, checkpoint_backing=backing).start()


def events(job: SequenceAppend) -> list[tuple[str, dict]]:
    out = []
    while True:
        kind, payload = job.outbox.get(timeout=TIMEOUT)
        out.append((kind, payload))
        if kind != "chunk":
            return out


def run(service, ids, position=0, session=None) -> tuple[SequenceAppend, list[tuple[str, dict]]]:
    job = SequenceAppend(ids, position, session, {}, outbox=Outbox())
    service.submit(job)
    return job, events(job)


def rows_of(chunks) -> np.ndarray:
    return np.concatenate([np.frombuffer(p["data"], "<f4").reshape(-1, 3) for k, p in chunks if k == "chunk"])


@pytest.fixture
def service():
    s = make_service()
    yield s
    s.stop("abort").result(TIMEOUT)


def test_chunks_follow_steps_and_appends_continue_from_retained_pages(service):
    ids = [5, 6, 7, 8, 9, 10, 11]
    job, evs = run(service, ids)
    assert [k for k, _ in evs] == ["chunk", "chunk", "done"]          # step budget 4: 4 + 3
    assert [(p["position"], p["next_position"], p["token_ids"]) for _, p in evs[:-1]] == [
        (0, 4, [5, 6, 7, 8]), (4, 7, [9, 10, 11])]
    assert evs[-1][1] == {"session": job.handle, "position": 7}
    whole = rows_of(evs)
    first, evs1 = run(service, ids[:3])
    second, evs2 = run(service, ids[3:], position=3, session=first.handle)
    assert second.handle == first.handle and evs2[-1][1]["position"] == 7
    split = np.concatenate([rows_of(evs1), rows_of(evs2)])
    np.testing.assert_array_equal(split, whole)                        # the sums read the retained pages
    assert len(first.handle) == 32 and int(first.handle, 16) >= 0


def test_stale_unknown_busy_and_limits(service):
    job, evs = run(service, [1, 2, 3])
    with pytest.raises(Conflict, match="stale position 2"):
        service.submit(SequenceAppend([4], 2, job.handle))
    with pytest.raises(NotFound):
        service.submit(SequenceAppend([4], 3, "0" * 32))
    with pytest.raises(InvalidRequest, match="position 17 .*context of 16"):
        service.submit(SequenceAppend([1] * 14, 3, job.handle))
    gate = threading.Event()
    service.executables.programs["consume"].gate = gate
    busy = SequenceAppend([4, 5], 3, job.handle, outbox=Outbox())
    service.submit(busy)
    with pytest.raises(Conflict, match="in use"):
        service.submit(SequenceAppend([4], 3, job.handle))
    gate.set()
    assert events(busy)[-1] == ("done", {"session": job.handle, "position": 5})


def test_idle_handles_are_evicted_least_recently_used_first():
    service = make_service(rows=1, context_length=16, pool_pages=4)   # 16 positions in all
    try:
        a, _ = run(service, [1] * 6)        # 2 pages
        b, _ = run(service, [2] * 6)        # 2 pages: the pool is full
        run(service, [3], position=6, session=a.handle)   # a is now the most recently used
        c, _ = run(service, [4] * 5)        # needs 2 pages: evicts b, the least recently used
        with pytest.raises(NotFound):
            service.submit(SequenceAppend([5], 6, b.handle))
        assert service.session_position(a.handle) == 7 and service.session_position(c.handle) == 5
        assert service.counts()["evictions"] == 1
    finally:
        service.stop("abort").result(TIMEOUT)


def test_a_slow_reader_sits_out_while_others_continue():
    service = make_service(rows=2, step_tokens=2, credit=1)
    try:
        slow = SequenceAppend([1] * 8, 0, None, outbox=Outbox())
        service.submit(slow)
        fast, evs = run(service, [2] * 8)   # read as it goes: finishes though `slow` takes nothing
        assert evs[-1][0] == "done" and slow.consumed < len(slow.token_ids)
        assert [k for k, _ in events(slow)][-1] == "done"                  # resumes once read
    finally:
        service.stop("abort").result(TIMEOUT)


def test_a_cancelled_append_invalidates_its_handle_after_the_step_retires(service):
    job, _ = run(service, [1, 2])
    gate = threading.Event()
    program = service.executables.programs["consume"]
    program.gate = gate
    append = SequenceAppend([3] * 8, 2, job.handle, outbox=Outbox())
    service.submit(append)
    append.cancel()
    gate.set()
    kinds = [k for k, _ in events(append)]
    assert kinds[-1] == "error"
    with pytest.raises(NotFound):
        service.submit(SequenceAppend([4], 2 + append.consumed, job.handle))
    assert service.counts()["pages_used"] == 0


# ---- named checkpoints: pin, fork, delete, listing --------------------------------------------

def test_a_fork_continues_from_the_pinned_image_not_the_advanced_handle():
    service = make_service(pool_pages=8)
    service.pins.capacity = 2
    try:
        ids = [5, 6, 7, 8, 9, 10, 11]
        _, whole = run(service, ids)
        first, _ = run(service, ids[:3])
        point = service.pin("cp", first.handle)
        assert (point.name, point.session, point.position) == ("cp", first.handle, 3)
        assert len(point.pages) == 1 and point.host_bytes == 0    # in a pool page of its own
        assert service.counts()["pages_checkpoints"] == 1
        run(service, [1, 1, 1], position=3, session=first.handle)   # the source advances elsewhere
        fork = SequenceAppend(ids[3:], 3, None, outbox=Outbox(), checkpoint="cp")
        service.submit(fork)
        evs = events(fork)
        assert fork.handle not in (None, first.handle) and evs[-1][1] == {"session": fork.handle, "position": 7}
        np.testing.assert_array_equal(rows_of(evs), rows_of(whole)[3:])   # read the image, not [1, 1, 1]
        service.unpin("cp")
        run(service, [12], position=7, session=fork.handle)     # the fork outlives the pin
        assert service.session_position(fork.handle) == 8
    finally:
        service.stop("abort").result(TIMEOUT)


def test_elastic_suspend_parks_the_pin_on_the_host_and_a_fork_warms_it_back():
    service = make_service(pool_pages=8)
    service.pins.capacity = 1
    try:
        ids = [5, 6, 7, 8, 9, 10, 11]
        _, whole = run(service, ids)
        first, _ = run(service, ids[:3])
        service.pin("cp", first.handle)
        used = service.counts()["pages_used"]
        point = service.suspend("cp")
        assert point.pages == [] and point.host_bytes == 4 * PAGE_SIZE      # one page of the f32 cache
        assert service.counts()["pages_used"] == used - 1 and service.counts()["checkpoint_host_bytes"] == 16
        ledger = service.residency.devices.accounting("cpu")[0]["owners"]["seq/primary"]
        assert ledger["snapshots"] == 16
        assert service.suspend("cp").host_bytes == 16                      # again: nothing moves
        fork = SequenceAppend(ids[3:], 3, None, outbox=Outbox(), checkpoint="cp")
        service.submit(fork)
        np.testing.assert_array_equal(rows_of(events(fork)), rows_of(whole)[3:])
        assert not point.suspended and len(point.pages) == 1               # resumed into a new page
        assert "snapshots" not in service.residency.devices.accounting("cpu")[0]["owners"].get("seq/primary", {})
        service.unpin("cp")
        assert service.counts()["pages_checkpoints"] == 0
    finally:
        service.stop("abort").result(TIMEOUT)


def test_fixed_backing_refuses_suspension_and_pins_evict_idle_handles_only():
    service = make_service(pool_pages=3, rows=2, context_length=12, backing="fixed")
    service.pins.capacity = 3
    try:
        a, _ = run(service, [1, 2, 3, 4, 5])               # two pages
        b, _ = run(service, [6])                           # one page: the pool is full
        service.pin("cp", b.handle)                        # evicts a (idle, least recently used)
        assert service.session_position(a.handle) is None and len(service.pins.points["cp"].pages) == 1
        with pytest.raises(InvalidRequest, match="fixed backing"):
            service.suspend("cp")
        with pytest.raises(InvalidRequest, match="fixed backing"):
            service.checkpoint("cp", suspending=True)
        with pytest.raises(Unavailable, match="checkpoints hold 1"):   # 3 pages cannot fit beside the pin
            service.submit(SequenceAppend([1] * 9, 0, None, outbox=Outbox()))
    finally:
        service.stop("abort").result(TIMEOUT)


def test_a_pin_the_pool_cannot_hold_is_503():
    service = make_service(pool_pages=3, rows=2, context_length=8)
    service.pins.capacity = 1
    try:
        idle, _ = run(service, [6])                                     # one page
        gate = threading.Event()
        service.executables.programs["consume"].gate = gate
        busy = SequenceAppend([2] * 8, 0, None, outbox=Outbox())        # two pages, running
        service.submit(busy)
        deadline = time.monotonic() + TIMEOUT
        while service.counts()["pages_used"] < 3 and time.monotonic() < deadline:   # its pages reserved
            time.sleep(0.01)
        with pytest.raises(Unavailable, match="no 1 free pages"):
            service.pin("cp", idle.handle)
        assert len(service.pins) == 0 and service.session_position(idle.handle) == 1
        gate.set()
        events(busy)
        service.pin("cp", idle.handle)                                  # the finished append yields
    finally:
        service.stop("abort").result(TIMEOUT)


def test_checkpoint_errors():
    service = make_service()
    try:
        job, _ = run(service, [1, 2, 3])
        with pytest.raises(NotFound, match="checkpoint_capacity is 0"):
            service.pin("cp", job.handle)
        service.pins.capacity = 1
        with pytest.raises(NotFound):
            service.pin("cp", "0" * 32)
        service.pin("cp", job.handle)
        with pytest.raises(Conflict, match="exists already"):
            service.pin("cp", job.handle)
        with pytest.raises(Unavailable):
            service.pin("cp2", job.handle)
        with pytest.raises(Conflict, match="stale position 2"):
            service.submit(SequenceAppend([4], 2, None, checkpoint="cp"))
        with pytest.raises(NotFound, match="no checkpoint 'nope'"):
            service.submit(SequenceAppend([4], 3, None, checkpoint="nope"))
        with pytest.raises(InvalidRequest):
            service.submit(SequenceAppend([4], 3, job.handle, checkpoint="cp"))
        gate = threading.Event()
        service.executables.programs["consume"].gate = gate
        busy = SequenceAppend([4], 3, job.handle, outbox=Outbox())
        service.submit(busy)
        with pytest.raises(Conflict, match="busy"):
            service.pin("cp2", job.handle)
        gate.set()
        events(busy)
        service.unpin("cp")
        with pytest.raises(NotFound):
            service.unpin("cp")
        with pytest.raises(NotFound):
            service.checkpoint("cp")
    finally:
        service.stop("abort").result(TIMEOUT)


def test_a_queued_fork_blocks_deleting_its_checkpoint():
    service = make_service(rows=1)
    service.pins.capacity = 1
    try:
        job, _ = run(service, [1, 2])
        service.pin("cp", job.handle)
        gate = threading.Event()
        service.executables.programs["consume"].gate = gate
        running = SequenceAppend([3] * 8, 0, None, outbox=Outbox())
        service.submit(running)                    # holds the only row
        fork = SequenceAppend([4], 2, None, outbox=Outbox(), checkpoint="cp")
        service.submit(fork)
        with pytest.raises(Conflict, match="queued"):
            service.unpin("cp")
        gate.set()
        assert events(fork)[-1] == ("done", {"session": fork.handle, "position": 3})
        service.unpin("cp")
        events(running)
    finally:
        service.stop("abort").result(TIMEOUT)


def test_sessions_lists_handles_by_order(service):
    a, _ = run(service, [1, 2])
    b, _ = run(service, [3])
    listing = service.sessions()
    assert [(s["session"], s["position"], s["residency"], s["busy"], s["model"], s["object"]) for s in listing] == [
        (a.handle, 2, "pool", False, "seq", "session"), (b.handle, 1, "pool", False, "seq", "session")]
    assert listing[0]["order"] < listing[1]["order"]
