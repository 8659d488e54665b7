"""A slow reader pauses only its own row (loomrt/services/text.py, output credit), on scout.

The text service gives each generation an `Outbox` with bounded credit; a row whose reader
has not taken its events sits out the scheduler's steps until it does. Here one generation's
reader takes nothing (credit 2) while another, with a larger budget, is read by its future:
the unread one must still be unfinished when the other is done (without the pause it would
finish first, having the smaller budget), and once read it completes with the same tokens
as the same prompt generated alone."""

from __future__ import annotations

import json

import pytest

from loomrt.devices import Devices
from loomrt.registry import Registry
from loomrt.services.text import Generation, Outbox, Sampling

GREEDY = Sampling(temperature=0.0, top_p=1.0, top_k=0, seed=0)
TIMEOUT = 600   # a hang guard: the first step loads every kernel


@pytest.fixture(scope="module")
def scout():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    registry = Registry(Devices(cuda={}))
    doc = json.loads((repo / "samples" / "scout" / "model.json").read_text())
    doc.update(rows=2, context_length=256, pool_capacity=1024, limits={"max_output_tokens": 64})
    reg = registry.register(json.dumps(doc), origin=str(repo / "samples" / "scout" / "model.json"))
    assert registry.wait_for(lambda: reg.phase in ("ready", "failed"), TIMEOUT) and reg.phase == "ready", reg.error
    try:
        yield registry, reg
    finally:
        registry.close(timeout=60)


def prompt(reg, text: str) -> list[int]:
    return reg.policy.prepare({"messages": [{"role": "user", "content": text}]}).prompt


def test_a_slow_reader_pauses_only_its_own_row(scout):
    registry, reg = scout
    state = reg.policy.prepare({"messages": [{"role": "user", "content": "Hi"}]}).state
    slow_prompt, fast_prompt = prompt(reg, "Tell me about rivers."), prompt(reg, "Tell me about mountains.")
    alone = Generation(slow_prompt, 16, GREEDY, (), state)
    registry.submit(reg.name, alone).result(TIMEOUT)

    slow = Generation(slow_prompt, 16, GREEDY, (), state, outbox=Outbox(credit=2))
    fast = Generation(fast_prompt, 40, GREEDY, (), state)
    slow_future = registry.submit(reg.name, slow)
    registry.submit(reg.name, fast).result(TIMEOUT)
    assert len(fast.generated) == 40
    assert not slow_future.done() and len(slow.generated) < 16, len(slow.generated)

    events = []
    while not events or events[-1][0] not in ("done", "error"):
        events.append(slow.outbox.get(timeout=TIMEOUT))
    assert events[-1][0] == "done", events[-1]
    slow_future.result(TIMEOUT)
    assert slow.generated == alone.generated and len(slow.generated) == 16
