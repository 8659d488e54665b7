"""`loomd.logz.Journal`: numbered entries, a bounded window, gap records, and waiting.

The retained window is made tiny here so the gap logic (a cursor older than the window gets
an explicit record of what was lost) is tested without appending thousands of entries.
Async parts run under `asyncio.run` with `wait_for` deadlines, so nothing can hang.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from loomd.logz import RETAINED, Journal

DEADLINE_S = 5.0


def ids(entries):
    return [e["id"] for e in entries]


def filled(n: int, retained: int = RETAINED) -> Journal:
    journal = Journal(retained)
    for i in range(n):
        journal.publish({"event": "e", "n": i})
    return journal


def test_ids_start_at_one_and_increase():
    journal = Journal()
    assert journal.last_id == 0
    assert journal.since(0, 10) == ([], None)
    assert [journal.publish({"event": "e"}) for _ in range(3)] == [1, 2, 3]
    assert journal.last_id == 3
    entries, gap = journal.since(0, 10)
    assert gap is None and ids(entries) == [1, 2, 3]


def test_entry_keeps_the_record_but_the_id_is_the_journals():
    journal = Journal()
    journal.publish({"event": "a", "time": 12.5, "model": "m"})
    journal.publish({"event": "b", "id": 999})          # a record's own id never wins
    before = time.time()
    journal.publish({"event": "c"})
    first, second, third = journal.since(0, 10)[0]
    assert first == {"id": 1, "time": 12.5, "event": "a", "model": "m"}
    assert second["id"] == 2 and second["event"] == "b"
    assert third["id"] == 3 and before <= third["time"] <= time.time()
    assert list(first)[0] == "id"                        # the id leads each JSONL line


def test_since_returns_newer_entries_bounded_by_limit():
    journal = filled(6)
    assert ids(journal.since(2, 10)[0]) == [3, 4, 5, 6]
    assert ids(journal.since(2, 2)[0]) == [3, 4]
    assert ids(journal.since(5, 1)[0]) == [6]
    assert journal.since(6, 10) == ([], None)
    assert journal.since(60, 10) == ([], None)            # nothing newer, and nothing was lost


def test_retained_window_drops_the_oldest():
    journal = filled(5, retained=3)
    assert journal.last_id == 5
    assert ids(journal.since(2, 10)[0]) == [3, 4, 5]


@pytest.mark.parametrize("after, gap", [
    (0, {"event": "gap", "from": 1, "to": 2, "missed": 2}),
    (1, {"event": "gap", "from": 2, "to": 2, "missed": 1}),
    (2, None),                                            # exactly at the window's edge: nothing lost
    (4, None),
])
def test_cursor_older_than_the_window_gets_an_explicit_gap(after, gap):
    journal = filled(5, retained=3)
    entries, found = journal.since(after, 10)
    assert found == gap
    assert ids(entries) == [i for i in (3, 4, 5) if i > after]
    if gap is not None:
        assert gap["missed"] == gap["to"] - gap["from"] + 1
        assert gap["to"] + 1 == entries[0]["id"]          # the gap and the entries leave no hole


def test_gap_is_reported_even_when_the_page_is_limited():
    journal = filled(10, retained=4)
    entries, gap = journal.since(0, 1)
    assert gap == {"event": "gap", "from": 1, "to": 6, "missed": 6}
    assert ids(entries) == [7]


def test_reading_through_a_gap_resumes_without_holes():
    """What the SSE stream does: after a gap, continue from the gap's `to`."""
    journal = filled(9, retained=4)
    cursor, seen, gaps = 0, [], []
    while True:
        entries, gap = journal.since(cursor, 2)
        if gap:
            gaps.append((gap["from"], gap["to"]))
            cursor = gap["to"]
        if not entries and not gap:
            break
        seen += ids(entries)
        cursor = entries[-1]["id"] if entries else cursor
    assert gaps == [(1, 5)]
    assert seen == [6, 7, 8, 9]


def test_window_keeps_moving_while_a_reader_is_behind():
    journal = filled(4, retained=4)
    entries, gap = journal.since(0, 2)
    assert gap is None and ids(entries) == [1, 2]
    for i in range(3):                                    # 5, 6, 7: entries 1..3 fall out
        journal.publish({"event": "e"})
    entries, gap = journal.since(2, 10)
    assert gap == {"event": "gap", "from": 3, "to": 3, "missed": 1}
    assert ids(entries) == [4, 5, 6, 7]


def test_concurrent_publishers_get_unique_contiguous_ids():
    journal = Journal(retained=10_000)
    got: list[int] = []
    lock = threading.Lock()

    def publish_many():
        mine = [journal.publish({"event": "e"}) for _ in range(500)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=publish_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    assert sorted(got) == list(range(1, 2001))
    assert ids(journal.since(0, 10_000)[0]) == list(range(1, 2001))   # stored in id order


def test_publishing_without_a_loop_never_blocks_or_fails():
    journal = Journal()
    journal.publish_threadsafe({"event": "e"})
    assert journal.last_id == 1


def test_wait_unbound_returns_at_once():
    journal = Journal()

    async def main():
        await asyncio.wait_for(journal.wait(0, 60), DEADLINE_S)

    asyncio.run(main())


def test_wait_returns_at_once_when_newer_entries_exist():
    journal = filled(2)

    async def main():
        journal.bind(asyncio.get_running_loop())
        started = time.monotonic()
        await asyncio.wait_for(journal.wait(1, 60), DEADLINE_S)
        return time.monotonic() - started

    assert asyncio.run(main()) < 1.0


def test_wait_times_out_when_nothing_arrives():
    journal = filled(1)

    async def main():
        journal.bind(asyncio.get_running_loop())
        started = time.monotonic()
        await asyncio.wait_for(journal.wait(1, 0.05), DEADLINE_S)
        return time.monotonic() - started

    assert 0.04 <= asyncio.run(main()) < DEADLINE_S


def test_wait_is_woken_by_a_publish_on_the_loop():
    journal = Journal()

    async def main():
        journal.bind(asyncio.get_running_loop())
        waiter = asyncio.create_task(journal.wait(0, 60))
        await asyncio.sleep(0)                        # let it start waiting
        assert not waiter.done()
        journal.publish({"event": "e"})
        await asyncio.wait_for(waiter, DEADLINE_S)

    asyncio.run(main())


def test_wait_is_woken_by_a_publish_from_another_thread():
    """Registry events arrive on worker threads (`publish_threadsafe` is the listener)."""
    journal = Journal()

    async def main():
        journal.bind(asyncio.get_running_loop())
        waiters = [asyncio.create_task(journal.wait(0, 60)) for _ in range(3)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiters)
        thread = threading.Thread(target=journal.publish_threadsafe, args=({"event": "e"},))
        thread.start()
        await asyncio.wait_for(asyncio.gather(*waiters), DEADLINE_S)   # every reader wakes
        thread.join(DEADLINE_S)

    asyncio.run(main())


def test_wait_for_a_later_entry_ignores_earlier_ones():
    journal = Journal()

    async def main():
        journal.bind(asyncio.get_running_loop())
        waiter = asyncio.create_task(journal.wait(2, 60))
        await asyncio.sleep(0)
        for _ in range(2):                            # entries 1 and 2: not what it waits for
            journal.publish({"event": "e"})
            for _ in range(5):
                await asyncio.sleep(0)
            assert not waiter.done(), journal.last_id
        journal.publish({"event": "e"})               # entry 3 wakes it
        await asyncio.wait_for(waiter, DEADLINE_S)

    asyncio.run(main())


def test_publish_after_the_loop_closed_still_records():
    journal = Journal()

    async def main():
        journal.bind(asyncio.get_running_loop())

    asyncio.run(main())                               # the loop is closed now
    journal.publish_threadsafe({"event": "late"})
    assert ids(journal.since(0, 10)[0]) == [1]
