"""`POST /v1/sequences` over a real `loomd` serving samples/encoder (SmolLM2-135M, Q4_1 GGUF).

One daemon for the module: `encoder` (rows 2, context 256, pool 512 positions, `step_tokens`
16 so that a request of a few dozen ids takes several steps) and the runtime tests' `mini`
(a sequence program without `stage consume`, so it has no HTTP endpoint).

The bytes of a chunk are encoder's final hidden states (after the final RMSNorm), f32
little-endian [tokens, 576]. They are checked three ways:

* **Framing.** attached/chunk/done with consistent positions; one chunk per step, so a
  40-id request with a 16-token step budget arrives as 16 + 16 + 8.
* **Retained state.** A first request and three appends to its handle (each at the exact
  completed position, across step and page boundaries) give chunk bytes that, concatenated,
  are byte for byte those of one request with all ids: every kernel's result for a token
  depends only on that token's inputs and its row's cache, never on what else shares the
  step. Two requests that share steps also equal their results alone (bound 1e-5).
* **Reference.** transformers' `AutoModelForCausalLM` loaded from the same GGUF in float32
  (`model.model(ids).last_hidden_state`, the state after the final norm; the same array as
  `output_hidden_states=True`'s last entry). Both dequantize the same q4_1/q8_0 blocks
  exactly, so they differ only in f32 summation order compounded over 30 layers; scout's
  logits (the same forward pass times the tied embedding) agree to ~1e-6 of their scale.
  Measured (x86-64, 2 cores, torch 2.13, transformers 5.24, numba): max |ours - ref| =
  5.3e-5 over the 40 x 576 states of IDS, whose max |ref| is 34.0 (rms 1.8): 1.6e-6 of the
  scale, as for scout's logits. The bound, max |ours - ref| <= 1e-4 * max |ref| (3.4e-3),
  leaves ~60x headroom for other SIMD widths, thread splits and BLAS orders; a change of the
  math (no final norm, a wrong eps or RoPE base, a mis-permuted q/k, a dropped layer, a cache
  slot read from the wrong page) moves the states by 1e-2 of the scale or far more.
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conformance_support import ENCODER_DIM as DIM, serving
from conformance_support import SequenceStream as Stream
from conformance_support import checked_sequence as checked
from conformance_support import encoder_document as sequence_document
from conformance_support import sequence, write_document
from loomd_process import Daemon
from scout_daemon import GGUF, IO_TIMEOUT_S, READY_DEADLINE_S, wait_until

STEP = 16
CONTEXT = 256
# "The quick brown fox jumps over the lazy dog. Known tokens go in, hidden states come out,
# and the cache remembers where we were." in SmolLM2's tokenizer (28 ids), then 12 more ids.
IDS = [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, 21017, 17837, 685, 281, 28, 5631, 2496, 1690,
       578, 28, 284, 260, 13842, 30058, 837, 392, 592, 30, 378, 260, 5249, 314, 2767, 30, 1073, 28, 17837, 685,
       281, 30]
RELATIVE_BOUND = 1e-4  # of max |reference|; see test_hidden_states_match_transformers


def encoder_document(directory: Path) -> Path:
    return sequence_document(directory, rows=2, context_length=CONTEXT, step_tokens=STEP)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sequences")
    docs = [encoder_document(tmp), write_document(tmp, "mini")]
    daemon = Daemon.start(tmp, docs)
    with serving(daemon, ["encoder", "mini"], READY_DEADLINE_S):
        yield daemon


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    """transformers' final hidden states (after the final norm) of IDS, float32, from the GGUF
    (~15-30 s: it parses and dequantizes the whole GGUF, vocabulary included)."""
    import torch
    import transformers

    from loomrt.locator import resolve_locator

    gguf = Path(resolve_locator(GGUF))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                              dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model(torch.tensor([IDS]), output_hidden_states=True)
    return out.hidden_states[-1][0].numpy().copy()


def error_of(status_body: tuple[int, Any], status: int, *words: str) -> None:
    got_status, body = status_body
    assert got_status == status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    for word in words:
        assert word in body["error"]["message"], body


@pytest.fixture(scope="module")
def whole(server) -> tuple[str, np.ndarray, list[int]]:
    status, events = sequence(server, {"model": "encoder", "position": 0, "token_ids": IDS, "options": {}})
    assert status == 200, events
    return checked(events, IDS)


# ---- tests ---------------------------------------------------------------------------------------

def test_initial_request_streams_attached_chunks_and_done(whole):
    handle, hidden, sizes = whole
    assert hidden.shape == (len(IDS), DIM)
    assert sizes == [16, 16, 8]  # one chunk per step of `step_tokens` ids


def test_hidden_states_match_transformers(whole, reference):
    ours = whole[1]
    assert ours.shape == reference.shape == (len(IDS), DIM)
    scale = float(np.abs(reference).max())
    diff = float(np.abs(ours - reference).max())
    assert diff <= RELATIVE_BOUND * scale, f"max |ours - ref| = {diff:.3g}, max |ref| = {scale:.3g}"


def chunk_bytes(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    """The opaque bytes of a stream's chunks, in order, exactly as sent (base64-decoded)."""
    return b"".join(base64.b64decode(e["data"], validate=True) for kind, e in events if kind == "chunk")


# A first request and three appends: 5 | 4 | 21 (a 16-id step, then 5) | 10 ids. The appends
# start at positions 5, 9 and 30, mid-page (16 positions a page), and their steps (9-25, 30-40)
# straddle the page boundaries at 16 and 32, where the whole request's steps (0-16, 16-32,
# 32-40) end exactly on them.
SPLITS = [0, 5, 9, 30, len(IDS)]


def test_three_appends_give_the_bytes_of_one_request(server, whole):
    status, events = sequence(server, {"model": "encoder", "position": 0, "token_ids": IDS[:SPLITS[1]]})
    assert status == 200, events
    handle = checked(events, IDS[:SPLITS[1]])[0]
    assert handle != whole[0]
    streams = [events]
    for at, end in zip(SPLITS[1:-1], SPLITS[2:]):    # three appends to the same handle
        status, events = sequence(server, {"model": "encoder", "session": handle, "position": at,
                                           "token_ids": IDS[at:end]})
        assert status == 200, events
        _, _, sizes = checked(events, IDS[at:end], position=at, session=handle)
        assert sizes == [min(STEP, end - at - i) for i in range(0, end - at, STEP)]
        streams.append(events)
    assert len(streams) == 4
    split = b"".join(chunk_bytes(e) for e in streams)
    status, events = sequence(server, {"model": "encoder", "position": 0, "token_ids": IDS})
    assert status == 200, events
    at_once = chunk_bytes(events)
    assert len(split) == len(at_once) == 4 * DIM * len(IDS)
    if split != at_once:
        a = np.frombuffer(split, "<f4").reshape(len(IDS), DIM)
        b = np.frombuffer(at_once, "<f4").reshape(len(IDS), DIM)
        rows = sorted({int(r) for r in np.nonzero((a != b).any(axis=1))[0]})
        raise AssertionError(f"chunk bytes differ at positions {rows}: max |split - whole| = "
                             f"{float(np.abs(a - b).max()):.3g}")
    # Without the retained state the same ids give other states: the appends did use it.
    at = SPLITS[2]
    status, alone = sequence(server, {"model": "encoder", "position": 0, "token_ids": IDS[at:at + 4]})
    assert status == 200, alone
    assert np.abs(checked(alone, IDS[at:at + 4])[1] - whole[1][at:at + 4]).max() > 1e-2


def test_requests_that_share_steps_equal_their_results_alone(server, whole):
    other = IDS[:24]  # alone, its states are the first 24 of `whole` (causal attention)
    results: dict[str, Any] = {}

    def run(name: str, ids: list[int]) -> None:
        results[name] = sequence(server, {"model": "encoder", "position": 0, "token_ids": ids})

    threads = [threading.Thread(target=run, args=("a", IDS)), threading.Thread(target=run, args=("b", other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(IO_TIMEOUT_S)
    assert results["a"][0] == results["b"][0] == 200
    _, a, _ = checked(results["a"][1], IDS)
    _, b, _ = checked(results["b"][1], other)
    assert np.abs(a - whole[1]).max() <= 1e-5
    assert np.abs(b - whole[1][:24]).max() <= 1e-5


def test_stale_position_unknown_handle_and_limits(server, whole):
    handle = whole[0]
    error_of(sequence(server, {"model": "encoder", "session": handle, "position": 3, "token_ids": [1]}), 409,
             "stale position 3", str(len(IDS)))
    error_of(sequence(server, {"model": "encoder", "session": "ab" * 16, "position": 0, "token_ids": [1]}), 404)
    error_of(sequence(server, {"model": "encoder", "session": handle, "position": len(IDS),
                               "token_ids": [1] * (CONTEXT - len(IDS) + 1)}), 400, str(CONTEXT + 1), str(CONTEXT))
    error_of(sequence(server, {"model": "encoder", "position": 0, "token_ids": [49152]}), 400, "49152")
    error_of(sequence(server, {"model": "encoder", "position": 0, "token_ids": [1], "options": {"pooling": "mean"}}),
             400, "options.pooling")


@pytest.mark.parametrize("body, param", [
    ({"position": 0, "token_ids": [1]}, "model"),
    ({"model": "encoder", "token_ids": [1]}, "position"),
    ({"model": "encoder", "position": 0}, "token_ids"),
    ({"model": "encoder", "position": 0, "token_ids": []}, "token_ids"),
    ({"model": "encoder", "position": 0, "token_ids": [-1]}, "token_ids[0]"),
    ({"model": "encoder", "position": 0, "token_ids": [1, 2**31]}, "token_ids[1]"),
    ({"model": "encoder", "position": 0, "token_ids": [1.0]}, "token_ids[0]"),
    ({"model": "encoder", "position": 0, "token_ids": [True]}, "token_ids[0]"),
    ({"model": "encoder", "position": 0, "token_ids": "1 2"}, "token_ids"),
    ({"model": "encoder", "position": "0", "token_ids": [1]}, "position"),
    ({"model": "encoder", "position": -1, "token_ids": [1]}, "position"),
    ({"model": "encoder", "position": 3, "token_ids": [1]}, "position"),
    ({"model": "encoder", "session": 7, "position": 0, "token_ids": [1]}, "session"),
    ({"model": "encoder", "session": None, "position": 0, "token_ids": [1]}, "session"),
    ({"model": "encoder", "session": "not-a-handle", "position": 0, "token_ids": [1]}, "session"),
    ({"model": "encoder", "session": "ab" * 16 + "\n", "position": 0, "token_ids": [1]}, "session"),
    ({"model": "encoder", "position": 0, "token_ids": [1], "options": []}, "options"),
    ({"model": "encoder", "position": 0, "token_ids": [1], "stream": True}, "stream"),
    ({"model": 3, "position": 0, "token_ids": [1]}, "model"),
])
def test_wrong_fields_are_400(server, body, param):
    status, error = sequence(server, body)
    assert status == 400, error
    assert error["error"]["param"] == param, error


def test_duplicate_fields_and_the_session_header_are_400(server, whole):
    raw = b'{"model": "encoder", "position": 0, "position": 0, "token_ids": [1]}'
    status, error = sequence(server, raw)
    assert status == 400 and "duplicate field 'position'" in error["error"]["message"], error
    status, error = sequence(server, {"model": "encoder", "position": 0, "token_ids": [1]},
                             {"X-Loom-Session": whole[0]})
    assert status == 400 and error["error"]["param"] == "X-Loom-Session", error


def test_unknown_models_and_other_deployments_are_404(server):
    error_of(sequence(server, {"model": "nope", "position": 0, "token_ids": [1]}), 404, "nope")
    error_of(sequence(server, {"model": "mini", "position": 0, "token_ids": [1]}), 404, "consume")


def test_concurrent_use_of_a_handle_is_409(server):
    first = Stream(server, {"model": "encoder", "position": 0, "token_ids": IDS[:8]})
    handle = first.event()[1]["session"]
    assert [k for k, _ in first.events()][-1] == "done"
    first.close()
    long = Stream(server, {"model": "encoder", "session": handle, "position": 8, "token_ids": IDS * 2})
    assert long.event() == ("attached", {"session": handle, "position": 8})
    # The append above owns the handle until it completes (5 steps): the same handle at its
    # current position is refused, not queued behind it.
    error_of(sequence(server, {"model": "encoder", "session": handle, "position": 8, "token_ids": [1]}), 409,
             "in use")
    events = long.events()
    long.close()
    assert checked([("attached", {"session": handle, "position": 8})] + events, IDS * 2, 8, handle)


def test_a_disconnected_append_invalidates_its_handle(server):
    status, events = sequence(server, {"model": "encoder", "position": 0, "token_ids": IDS[:4]})
    handle = checked(events, IDS[:4])[0]
    s = Stream(server, {"model": "encoder", "session": handle, "position": 4, "token_ids": IDS * 4})
    assert s.event()[0] == "attached" and s.event()[0] == "chunk"
    s.close(reset=True)
    # Busy (409) while the accepted step retires, then forgotten (404): never usable again.
    final = wait_until(lambda: (lambda r: r if r[0] != 409 else None)(
        sequence(server, {"model": "encoder", "session": handle, "position": 4, "token_ids": [1]})),
        "the disconnected append to retire", timeout=IO_TIMEOUT_S)
    error_of(final, 404, handle)


def test_unregistered_model_handles_are_404(server, whole):
    removed = server.request("POST", "/v1/models/unregister", {"model": "encoder", "mode": "drain"})
    assert removed.status == 202, removed.body
    wait_until(lambda: all(r["model"] != "encoder" for r in
                           server.request("GET", "/v1/status").json()["registrations"]), "encoder removed")
    error_of(sequence(server, {"model": "encoder", "session": whole[0], "position": len(IDS), "token_ids": [1]}),
             404, "encoder")
