"""SpeechService scheduling over stand-in `durations` and `synthesize` programs (no weights, no kernels).

The fakes compute each row from its own ids, seed and counter (as the source contract
requires), check the packing of every call, and `synthesize` blocks inside `run` until the
test lets it go, so what is pending at a boundary is decided by the test, not by timing:
blocks go out in order, a request's first block alone and then its following blocks together,
within its reader's room and a cap on the call's frames; a request arriving while another is
being spoken joins the next call; a reader that takes nothing pauses only its own request; a
cancelled request leaves at the next boundary; a broken length fails only its request.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from service_fakes import FakeResidency

from loomrt.errors import LoomError, Unavailable
from loomrt.services.outbox import Outbox
from loomrt.services import speech
from loomrt.services.speech import PreparedSpeech, SpeechService, Utterance

HOP = 3
TIMEOUT = 30


def durations_of(ids) -> list[int]:
    return [i % 3 + 1 for i in ids]


def samples_of(ids, seed: int, counter: int) -> np.ndarray:
    """What the fake synthesizes for one block: depends on nothing but the block."""
    frames = 2 * sum(durations_of(ids))
    base = (sum(ids) * 31 + seed * 7 + counter * 1009) % 20000
    return (base + np.arange(frames * HOP)).astype("<i2")


class FakeDurations:
    def __init__(self, broken: int | None = None, misshapen: bool = False):
        self.calls: list[dict[str, np.ndarray]] = []
        self.broken = broken          # a first id whose block gets 0 frames
        self.misshapen = misshapen    # a per-id output with one value per call instead

    def run(self, params, state, inputs):
        self.calls.append({k: v.copy() for k, v in inputs.items()})
        ids, rows, speed = inputs["ids"], inputs["rows"], inputs["speed"]
        assert len(speed) == rows.max() + 1 and (np.diff(rows) >= 0).all()
        frames = np.zeros(len(speed), np.int32)
        for r in range(len(speed)):
            own = ids[rows == r]
            frames[r] = 0 if own[0] == self.broken else 2 * sum(durations_of(own))
        out = {"dur": np.array(durations_of(ids), np.int32), "frames": frames,
               "features": np.stack([ids * 0.5, ids * 2.0], 1).astype(np.float32)}
        if self.misshapen:
            out["features"] = out["features"][:1]
        return out

    def scratch_bytes(self) -> int:
        return 0


class FakeSynthesize:
    def __init__(self):
        self.calls: list[dict[str, np.ndarray]] = []
        self.entered = threading.Semaphore(0)
        self.proceed = threading.Semaphore(0)

    def run(self, params, state, inputs):
        self.calls.append({k: v.copy() for k, v in inputs.items()})
        self.entered.release()
        assert self.proceed.acquire(timeout=TIMEOUT), "the test never let the call finish"
        ids, rows, dur, frame_rows = inputs["ids"], inputs["rows"], inputs["dur"], inputs["frame_rows"]
        assert (dur == durations_of(ids)).all(), "durations must come back untouched"
        np.testing.assert_array_equal(inputs["features"], np.stack([ids * 0.5, ids * 2.0], 1).astype(np.float32),
                                      err_msg="every per-id output of durations comes back with its block")
        pcm = np.zeros((len(frame_rows), HOP), np.int16)
        for r in range(len(inputs["seed"])):
            own = ids[rows == r]
            block = samples_of(own, int(inputs["seed"][r]), int(inputs["counter"][r]))
            assert (frame_rows == r).sum() * HOP == len(block)
            pcm[frame_rows == r] = block.reshape(-1, HOP)
        return {"pcm": pcm}

    def scratch_bytes(self) -> int:
        return 0


@pytest.fixture
def service():
    made = []

    def make(broken: int | None = None, misshapen: bool = False):
        durations, synthesize = FakeDurations(broken, misshapen), FakeSynthesize()
        executables = SimpleNamespace(programs={"durations": durations, "synthesize": synthesize})
        component = SimpleNamespace(device=SimpleNamespace(key="cpu"), owner="t/primary")
        journal: list[tuple[int, str, dict]] = []
        svc = SpeechService("t", executables, component, FakeResidency(), {}, 64, max_active=8,
                            progress=lambda job, event, fields: journal.append((job.id, event, fields))).start()
        made.append((svc, synthesize))
        return svc, durations, synthesize, journal

    yield make
    for svc, synthesize in made:
        for _ in range(256):
            synthesize.proceed.release()
        svc.stop("abort").result(timeout=TIMEOUT)


def utterance(blocks, seed=0, speed=1.0, credit=4) -> Utterance:
    return Utterance(PreparedSpeech(tuple(tuple(b) for b in blocks), speed, seed), outbox=Outbox(credit))


def read_all(job: Utterance) -> tuple[list[bytes], tuple[str, object]]:
    audio = []
    while True:
        kind, payload = job.outbox.get(timeout=TIMEOUT)
        if kind != "audio":
            return audio, (kind, payload)
        audio.append(payload)


def expected_blocks(blocks, seed=0) -> list[bytes]:
    return [samples_of(b, seed, i).tobytes() for i, b in enumerate(blocks)]


def test_blocks_stream_in_order_and_each_is_its_own(service):
    svc, durations, synthesize, journal = service()
    blocks = [[0, 5, 7, 0], [0, 4, 0], [0, 1, 2, 3, 0]]
    job = utterance(blocks, seed=11)
    future = svc.submit(job)
    for _ in blocks:
        synthesize.proceed.release()
    audio, (kind, outcome) = read_all(job)
    assert kind == "done" and audio == expected_blocks(blocks, 11)
    assert future.result(timeout=TIMEOUT) == outcome
    assert outcome["blocks"] == 3 and outcome["samples"] == sum(len(a) for a in audio) // 2
    # the first block alone (first audio), then the rest in one call, still one event per block in order
    assert [c["counter"].tolist() for c in synthesize.calls] == [[0], [1, 2]]
    assert [(e, f["block"]) for _, e, f in journal] == [("speech_block", 0), ("speech_block", 1), ("speech_block", 2)]
    # the first block measured alone (its first audio waits for no other sentence), the rest together after it
    assert [c["ids"].tolist() for c in durations.calls] == [[0, 5, 7, 0], [0, 4, 0, 0, 1, 2, 3, 0]]
    assert [c["speed"].tolist() for c in durations.calls] == [[1.0], [1.0, 1.0]]


def test_a_request_arriving_mid_speech_joins_the_next_call(service):
    svc, _, synthesize, _ = service()
    first = utterance([[0, 5, 0], [0, 6, 0], [0, 7, 0]], seed=1)
    svc.submit(first)
    assert synthesize.entered.acquire(timeout=TIMEOUT)        # first's block 0 is being synthesized
    second = utterance([[0, 9, 9, 0], [0, 8, 0]], seed=2, speed=2.0)
    svc.submit(second)
    for _ in range(8):
        synthesize.proceed.release()
    a_audio, (a_kind, _) = read_all(first)
    b_audio, (b_kind, _) = read_all(second)
    assert a_kind == b_kind == "done"
    assert a_audio == expected_blocks([[0, 5, 0], [0, 6, 0], [0, 7, 0]], 1)
    assert b_audio == expected_blocks([[0, 9, 9, 0], [0, 8, 0]], 2)
    # the call after the first packs first's block 1 with second's block 0, each with its own seed,
    # and nothing else: no following block delays a first block
    assert synthesize.calls[1]["seed"].tolist() == [1, 2] and synthesize.calls[1]["counter"].tolist() == [1, 0]
    # then both are heard: first's block 2 and second's block 1 (each the last of its request)
    assert synthesize.calls[2]["seed"].tolist() == [1, 2] and synthesize.calls[2]["counter"].tolist() == [2, 1]


def test_following_blocks_fill_a_call_up_to_the_frames_cap(service, monkeypatch):
    monkeypatch.setattr(speech, "FOLLOWING_FRAMES", 24)   # three blocks of 8 frames
    svc, _, synthesize, _ = service()
    blocks = [[0, 1, 0]] * 6
    job = utterance(blocks, seed=4, credit=64)
    svc.submit(job)
    for _ in range(3):
        synthesize.proceed.release()
    audio, (kind, _) = read_all(job)
    assert kind == "done" and audio == expected_blocks(blocks, 4)
    assert [c["counter"].tolist() for c in synthesize.calls] == [[0], [1, 2, 3], [4, 5]]


def test_following_blocks_never_take_more_than_the_readers_room(service):
    svc, _, synthesize, _ = service()
    blocks = [[0, 2, 0]] * 5
    job = utterance(blocks, seed=9, credit=3)
    svc.submit(job)
    for _ in range(2):
        synthesize.proceed.release()
    # nobody reads yet: block 0 takes one of 3 events of room, so the next call takes block 1
    # and one following block, and then the request waits for its reader
    deadline = time.monotonic() + TIMEOUT
    while job.next_block < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert [c["counter"].tolist() for c in synthesize.calls] == [[0], [1, 2]]
    for _ in range(8):
        synthesize.proceed.release()
    audio, (kind, _) = read_all(job)
    assert kind == "done" and audio == expected_blocks(blocks, 9)


def test_a_stalled_reader_pauses_only_its_own_request(service):
    svc, _, synthesize, _ = service()
    stalled = utterance([[0, 3, 0]] * 6, seed=5, credit=2)
    svc.submit(stalled)
    for _ in range(2):
        synthesize.proceed.release()
    # nobody reads `stalled`: after 2 untaken blocks it sits out, while a peer is spoken to its end
    peer = utterance([[0, 4, 0]] * 3, seed=6)
    svc.submit(peer)
    for _ in range(3):
        synthesize.proceed.release()
    audio, (kind, _) = read_all(peer)
    assert kind == "done" and len(audio) == 3
    assert stalled.next_block == 2
    assert all(5 not in c["seed"].tolist() for c in synthesize.calls[2:])
    for _ in range(4):
        synthesize.proceed.release()
    audio, (kind, _) = read_all(stalled)          # the reader catches up: the rest follows
    assert kind == "done" and audio == expected_blocks([[0, 3, 0]] * 6, 5)


def test_a_cancelled_request_leaves_at_the_next_boundary(service):
    svc, _, synthesize, _ = service()
    left = utterance([[0, 2, 0]] * 5, seed=7)
    stays = utterance([[0, 1, 0]] * 3, seed=8)
    f_left, f_stays = svc.submit(left), svc.submit(stays)
    assert synthesize.entered.acquire(timeout=TIMEOUT)
    left.cancel()
    for _ in range(8):
        synthesize.proceed.release()
    audio, (kind, _) = read_all(stays)
    assert kind == "done" and audio == expected_blocks([[0, 1, 0]] * 3, 8)
    with pytest.raises(Unavailable):
        f_left.result(timeout=TIMEOUT)
    assert sum(7 in c["seed"].tolist() for c in synthesize.calls) == 1   # only the call already running
    assert svc.requests() == []


def test_a_broken_length_fails_only_its_request(service):
    svc, _, synthesize, _ = service(broken=4)
    bad, good = utterance([[4, 1, 0], [0, 1, 0]]), utterance([[0, 2, 0]], seed=3)
    f_bad, f_good = svc.submit(bad), svc.submit(good)
    for _ in range(4):
        synthesize.proceed.release()
    audio, (kind, _) = read_all(good)
    assert kind == "done" and audio == expected_blocks([[0, 2, 0]], 3)
    with pytest.raises(LoomError, match="0 frames"):
        f_bad.result(timeout=TIMEOUT)
    kind, error = bad.outbox.get(timeout=TIMEOUT)
    assert kind == "error" and "0 frames" in error.message


def test_a_durations_output_not_per_id_fails_the_calls_requests_with_the_reason(service):
    svc, _, synthesize, _ = service(misshapen=True)
    job = utterance([[0, 2, 0], [0, 3, 4, 0]])
    future = svc.submit(job)
    with pytest.raises(LoomError, match="output 'features' does not have the call's 3 ids on its first axis"):
        future.result(timeout=TIMEOUT)
    assert synthesize.calls == []
