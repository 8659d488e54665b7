"""The decision service: finite decisions (`POST /v1/systemone`) as cohorts of question rows.

The decision source contract (`docs/source-contracts.md`, "decision"): the control program's
`decision_question(state, id, question, tok)` renders one question into the model's framing
and returns its prompt ids and the token ids of its answer labels; the stage `decide` runs
a packed cohort of question prompts (one row per question, laid out as a text prefill) and
returns a normalised F32 probability vector per row, padded to the widest row; the control
program's `decision_answer(id, question, probabilities)` turns each checked vector into the
answer's derived field (the winning option, the expected level, the probability of true).

The host owns the spec's schema (`parse_questions`: types, instructions, criteria counts,
the 1024-question bound), which fails with `InvalidDecision` (422); it validates every
vector the stage returns (right length, finite, non-negative, summing to 1 within 1e-4,
zero padding) and never normalises or truncates one: a bad vector fails its request with a
500 naming the question. It computes nothing from a vector: it checks the field that
`decision_answer` derives (an option id of the question, a finite level in range, a
probability) and encodes it with the vector. Each pass packs question rows from the active requests into one
`decide` call, bounded by a token budget and by the KV pages free; a row's pages come from
the deployment's `PagePool` and return to it after the pass.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from loomrt.errors import CompileError, InvalidDecision, InvalidRequest, LoomError
from loomrt.fields import reject_unknown, shown
from loomrt.kv import PagePool
from loomrt.services import KindSpec
from loomrt.services.base import Job, StageService, StepPlan
from loomrt.services.packing import TokenRow, pack_rows

DECIDE_STAGE = "decide"
QUESTION_FN = "decision_question"
CAPACITY_FN = "max_questions"
ANSWER_FN = "decision_answer"
ANSWER_FIELD = {"choice": "choice", "score": "score", "noul": "probability"}   # what decision_answer returns
MAX_QUESTIONS = 1024            # the spec's native bound
MAX_OPTIONS = 255
MIN_LEVELS, MAX_LEVELS = 2, 10
TYPES = ("choice", "score", "noul")
QUESTION_FIELDS = {"choice": ("type", "instructions", "criteria"), "score": ("type", "instructions", "criteria"),
                   "noul": ("type", "instructions")}
SUM_TOLERANCE = 1e-4
PASS_TOKENS = 1024              # tokens packed into one `decide` call (a longer single prompt runs alone)
DEFAULT_ACTIVE = 16             # requests whose questions may share a pass



# ---- the request schema (host-owned: the spec fixes it for every decision source) -----------------

@dataclass(frozen=True)
class Question:
    id: str
    type: str
    body: dict[str, Any]            # the question object as sent (type, instructions, criteria)

    @property
    def options(self) -> list[str]:
        """What the probability vector is over: option ids, zero-based levels, or [true, false]."""
        if self.type == "choice":
            return list(self.body["criteria"])
        if self.type == "score":
            return [str(i) for i in range(len(self.body["criteria"]))]
        return ["true", "false"]


def _text_like(value: Any) -> bool:
    return isinstance(value, (str, dict, list))


def _image_part(value: Any, depth: int = 0) -> str | None:
    """The first OpenAI-style image part inside `value` (a content part with an image type,
    or an image_url/input_image key), as a short description; None when there is none."""
    if depth > 64:
        return None
    if isinstance(value, dict):
        if value.get("type") in ("image", "image_url", "input_image") or "image_url" in value or "input_image" in value:
            return "an image content part"
        for v in value.values():
            found = _image_part(v, depth + 1)
            if found:
                return found
    elif isinstance(value, list):
        for v in value:
            found = _image_part(v, depth + 1)
            if found:
                return found
    return None


IMAGE_FIELDS = ("image", "images", "image_url", "input_image", "input_images")


def check_body_fields(body: dict[str, Any]) -> None:
    """Top-level fields: unknown ones and image-input extensions are 400 (strict JSON rules)."""
    for key in body:
        if key in IMAGE_FIELDS:
            raise InvalidRequest(f"unknown field '{key}': decisions take no image input", param=key)
    reject_unknown(body, ("model", "state", "questions"))


def parse_questions(body: dict[str, Any], capacity: int = MAX_QUESTIONS) -> list[Question]:
    """The state and questions of a decision request, checked against the spec's schema."""
    if "state" not in body:
        raise InvalidDecision("state: required field is missing", param="state")
    state = body["state"]
    if not _text_like(state):
        raise InvalidDecision(f"state: expected a string, object or array, got {shown(state)}", param="state")
    found = _image_part(state)
    if found:
        raise InvalidRequest(f"state: {found} is an image-input extension; decisions take no image input",
                             param="state")
    if "questions" not in body:
        raise InvalidDecision("questions: required field is missing", param="questions")
    questions = body["questions"]
    if not isinstance(questions, dict):
        raise InvalidDecision(f"questions: expected an object of questions by id, got {shown(questions)}",
                              param="questions")
    bound = min(MAX_QUESTIONS, capacity)
    if not 1 <= len(questions) <= bound:
        raise InvalidDecision(f"questions: expected 1 to {bound} questions, got {len(questions)}", param="questions")
    out = []
    for qid, q in questions.items():
        where = f"questions.{qid}"
        if not isinstance(q, dict):
            raise InvalidDecision(f"{where}: expected a question object, got {shown(q)}", param=where)
        kind = q.get("type")
        if kind is not None and kind not in TYPES:
            raise InvalidDecision(f"{where}.type: expected \"choice\", \"score\" or \"noul\", got {shown(kind)}",
                                  param=f"{where}.type")
        reject_unknown(q, QUESTION_FIELDS[kind] if kind else ("type", "instructions", "criteria"), f"{where}.")
        if "type" not in q:
            raise InvalidDecision(f"{where}.type: required field is missing", param=f"{where}.type")
        if "instructions" not in q:
            raise InvalidDecision(f"{where}.instructions: required field is missing", param=f"{where}.instructions")
        if not _text_like(q["instructions"]):
            raise InvalidDecision(f"{where}.instructions: expected a string, object or array, got "
                                  f"{shown(q['instructions'])}", param=f"{where}.instructions")
        if _image_part(q["instructions"]):
            raise InvalidRequest(f"{where}.instructions: an image content part is an image-input extension; "
                                 "decisions take no image input", param=f"{where}.instructions")
        if kind == "choice":
            criteria = q.get("criteria")
            if not isinstance(criteria, dict):
                raise InvalidDecision(f"{where}.criteria: a choice needs an object of options (id -> description), "
                                      f"got {'nothing' if criteria is None else shown(criteria)}",
                                      param=f"{where}.criteria")
            if not 1 <= len(criteria) <= MAX_OPTIONS:
                raise InvalidDecision(f"{where}.criteria: a choice has 1 to {MAX_OPTIONS} options, got {len(criteria)}",
                                      param=f"{where}.criteria")
            items = list(criteria.items())
        elif kind == "score":
            criteria = q.get("criteria")
            if not isinstance(criteria, list):
                raise InvalidDecision(f"{where}.criteria: a score needs an array of levels, lowest first, got "
                                      f"{'nothing' if criteria is None else shown(criteria)}",
                                      param=f"{where}.criteria")
            if not MIN_LEVELS <= len(criteria) <= MAX_LEVELS:
                raise InvalidDecision(f"{where}.criteria: a score has {MIN_LEVELS} to {MAX_LEVELS} levels, got "
                                      f"{len(criteria)}", param=f"{where}.criteria")
            items = [(str(i), v) for i, v in enumerate(criteria)]
        else:
            items = []
        for key, value in items:
            path = f"{where}.criteria.{key}" if kind == "choice" else f"{where}.criteria[{key}]"
            if not _text_like(value):
                raise InvalidDecision(f"{path}: expected a string, object or array, got {shown(value)}", param=path)
            if _image_part(value):
                raise InvalidRequest(f"{path}: an image content part is an image-input extension; decisions take "
                                     "no image input", param=path)
        out.append(Question(qid, kind, q))
    return out


# ---- the policy: rendering on the control VM -------------------------------------------------------

@dataclass(frozen=True)
class PreparedQuestion:
    question: Question
    prompt: list[int]
    choices: list[int]


def _show(value: Any) -> str:
    """A returned value in an error message (a handle or bytes too, which JSON cannot show)."""
    try:
        return shown(value)
    except (TypeError, ValueError):
        return type(value).__name__


def _contract_error(message: str, fn: str = QUESTION_FN) -> LoomError:
    return LoomError(f"the control program's {fn}() broke the decision contract: {message}")


class DecisionPolicy:
    def __init__(self, control: Any, tokenizer: Any, vocab_size: int):
        self.control = control
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        if not control.has(QUESTION_FN):
            raise CompileError(f"a decision deployment's control program needs fn {QUESTION_FN}(state: any, id: str, "
                               "question: map, tok: any) -> map")
        if not control.has(ANSWER_FN):
            raise CompileError(f"a decision deployment's control program needs fn {ANSWER_FN}(id: str, question: map, "
                               "probabilities: list) -> map")
        self.capacity = MAX_QUESTIONS
        if control.has(CAPACITY_FN):
            value = control.call(CAPACITY_FN, [])
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CompileError(f"the control program's {CAPACITY_FN}() must return a positive integer")
            self.capacity = min(value, MAX_QUESTIONS)

    def prepare(self, state: Any, questions: list[Question]) -> list[PreparedQuestion]:
        """Render every question (PolicyFailure carries the policy's own 422 / 4xx)."""
        out = []
        for q in questions:
            result = self.control.call(QUESTION_FN, [state, q.id, q.body, self.tokenizer])
            if not isinstance(result, dict):
                raise _contract_error(f"question '{q.id}': it must return a map")
            prompt, choices = result.get("prompt"), result.get("choices")
            if not isinstance(prompt, list) or not prompt or not all(
                    type(t) is int and 0 <= t < self.vocab_size for t in prompt):
                raise _contract_error(f"question '{q.id}': 'prompt' must be a non-empty list of token ids in "
                                      f"0..{self.vocab_size - 1}")
            want = len(q.options)
            if not isinstance(choices, list) or len(choices) != want or not all(
                    type(t) is int and 0 <= t < self.vocab_size for t in choices):
                raise _contract_error(f"question '{q.id}': 'choices' must be {want} token ids in "
                                      f"0..{self.vocab_size - 1}, one per answer")
            if len(set(choices)) != len(choices):
                raise _contract_error(f"question '{q.id}': 'choices' repeats a token id, so two answers would "
                                      "share one probability")
            out.append(PreparedQuestion(q, prompt, choices))
        return out

    def answers(self, questions: list[PreparedQuestion], probabilities: list[np.ndarray]) -> dict[str, Any]:
        """`answers` of a `systemone.result`: per question id, in request order. The derived field
        of each answer comes from the control program's decision_answer(); the host checks it
        and encodes it next to the stage's (already checked) vector."""
        out: dict[str, Any] = {}
        for pq, vector in zip(questions, probabilities):
            q = pq.question
            ids = q.options
            legend = list(q.body["criteria"]) if q.type == "score" else None
            p = [float(x) for x in vector]
            value = self._derived(q, ids, list(p))
            if q.type == "choice":
                out[q.id] = {"type": "choice", "choice": value, "probabilities": dict(zip(ids, p))}
            elif q.type == "score":
                out[q.id] = {"type": "score", "score": value, "probabilities": p, "legend": legend}
            else:
                out[q.id] = {"type": "noul", "probability": value}
        return out

    def _derived(self, q: Question, ids: list[str], p: list[float]) -> Any:
        """decision_answer()'s field for question `q`, checked: an option id of the question, a
        finite expected level in 0..levels-1, or a finite probability in [0, 1]."""
        result = self.control.call(ANSWER_FN, [q.id, q.body, p])
        key = ANSWER_FIELD[q.type]
        if not isinstance(result, dict) or list(result) != [key]:
            got = f"a map with keys {json.dumps(list(result))}" if isinstance(result, dict) else _show(result)
            raise _contract_error(f"question '{q.id}': a {q.type} answer must be a map with exactly the key "
                                  f"'{key}', got {got}", ANSWER_FN)
        value = result[key]
        if q.type == "choice":
            if not isinstance(value, str) or value not in ids:
                raise _contract_error(f"question '{q.id}': 'choice' must be one of the question's option ids, "
                                      f"got {_show(value)}", ANSWER_FN)
            return value
        high = len(ids) - 1 if q.type == "score" else 1
        if type(value) is not float or not math.isfinite(value) or not 0 <= value <= high * (1 + SUM_TOLERANCE):
            raise _contract_error(f"question '{q.id}': '{key}' must be a finite float in 0..{high}, got "
                                  f"{_show(value)}", ANSWER_FN)
        return value


# ---- the service --------------------------------------------------------------------------------------

class Decision(Job):
    """One decision request: its question rows, run over one or more passes."""

    def __init__(self, questions: list[PreparedQuestion]):
        super().__init__([], kind="systemone")
        self.questions = list(questions)
        self.probabilities: list[np.ndarray | None] = [None] * len(self.questions)
        self.scheduled = 0              # rows handed to a pass so far
        self.answered = 0

    @property
    def input_tokens(self) -> int:
        return sum(len(q.prompt) for q in self.questions)

    def outcome(self) -> dict[str, Any]:
        return {"questions": len(self.questions), "prompt_tokens": self.input_tokens, "completion_tokens": 0}

    def describe(self, state: str) -> dict[str, Any]:
        out = super().describe(state)
        out.update(questions=len(self.questions), questions_done=self.answered, prompt_tokens=self.input_tokens)
        return out


def check_vector(vector: np.ndarray, padding: np.ndarray, qid: str) -> None:
    """A stage's probability vector as the contract requires it, or a 500 naming the question."""
    problem = None
    if not np.isfinite(vector).all():
        problem = "holds a non-finite value"
    elif (vector < 0).any():
        problem = f"holds a negative value ({float(vector.min())!r})"
    elif abs(float(vector.astype(np.float64).sum()) - 1.0) > SUM_TOLERANCE:
        problem = f"sums to {float(vector.astype(np.float64).sum())!r}, not 1 within {SUM_TOLERANCE}"
    elif padding.size and (padding != 0).any():
        problem = "has non-zero padding after its last answer"
    if problem is not None:
        raise LoomError(f"stage '{DECIDE_STAGE}' returned a malformed probability vector for question '{qid}': "
                        f"it {problem}; it is not normalised or truncated by the host")


@dataclass(frozen=True)
class QuestionRow(TokenRow):
    """A row of a decide call: one question's whole prompt, on pages reserved for this call."""

    question: int = 0


class DecisionService(StageService):
    """`page_states` are the `per page` states a question's prompt is written to (the pool
    sizes from them); a question's pages live for one call."""

    def __init__(self, *args: Any, page_size: int, page_states: list[str], pass_tokens: int = PASS_TOKENS,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        paged = [self.state[name] for name in page_states]
        self.pool = PagePool(paged[0].shape[0] if paged else 0, page_size)
        self.pass_tokens = pass_tokens

    @property
    def max_prompt(self) -> int:
        return self.pool.pages * self.pool.page_size

    def submit(self, job: Job) -> Any:
        if not isinstance(job, Decision):
            raise InvalidRequest("a decision deployment serves decisions")
        for q in job.questions:
            if len(q.prompt) > self.max_prompt:
                raise InvalidDecision(f"question '{q.question.id}' renders to {len(q.prompt)} tokens, but model "
                                      f"'{self.model}' keeps {self.max_prompt} KV positions",
                                      param=f"questions.{q.question.id}")
        return super().submit(job)

    def counts(self) -> dict[str, int]:
        out = super().counts()
        with self._cond:
            out.update(pages_used=self.pool.used, pages_free=self.pool.free)
        return out

    def _resolve(self, job: Decision, error: LoomError | None) -> None:
        if error is None:
            job.future.set_result(job.probabilities)
        else:
            job.future.set_exception(error)

    # ---- one pass: plan -> execute -> apply ---------------------------------------------------

    def plan(self, jobs: list[Decision]) -> list[StepPlan]:
        """Whole question prompts, oldest request first, while the token budget and the free
        pages last (the first row always fits)."""
        rows: list[QuestionRow] = []
        tokens = 0
        with self._cond:
            for job in (j for j in jobs if j.cancelled is None):
                while job.scheduled < len(job.questions):
                    prompt = job.questions[job.scheduled].prompt
                    if rows and tokens + len(prompt) > self.pass_tokens:
                        break
                    pages = self.pool.reserve(len(prompt))
                    if pages is None:
                        break
                    rows.append(QuestionRow(job, tuple(prompt), 0, tuple(pages), question=job.scheduled))
                    job.scheduled += 1
                    tokens += len(prompt)
                else:
                    continue
                break
        if not rows:
            return []
        width = max(len(r.job.questions[r.question].choices) for r in rows)
        inputs = pack_rows(rows)
        choices = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            q = r.job.questions[r.question]
            choices[i, :len(q.choices)] = q.choices
        inputs.update(choices=choices,
                      counts=np.array([len(r.job.questions[r.question].choices) for r in rows], np.int32))
        return [StepPlan(DECIDE_STAGE, tuple(dict.fromkeys(r.job for r in rows)), inputs, tuple(rows))]

    def retire(self, plan: StepPlan) -> None:
        with self._cond:
            for row in plan.rows:
                self.pool.release(list(row.pages))

    def apply(self, plan: StepPlan, outputs: dict[str, np.ndarray]) -> None:
        probs = np.asarray(outputs["probs"])
        want = (len(plan.rows), plan.inputs["choices"].shape[1])
        if probs.shape != want or probs.dtype != np.float32:
            raise LoomError(f"stage '{DECIDE_STAGE}' returned {probs.dtype}{list(probs.shape)}, expected "
                            f"float32{list(want)}")
        failed: set[int] = set()
        for r, row in enumerate(plan.rows):
            job = row.job
            if job.id in failed:
                continue
            q = job.questions[row.question]
            n = len(q.choices)
            try:
                check_vector(probs[r, :n], probs[r, n:], q.question.id)
            except LoomError as exc:
                failed.add(job.id)
                self._finish(job, exc)
                continue
            job.probabilities[row.question] = probs[r, :n].copy()
            job.answered += 1
        for job in plan.jobs:
            if job.id not in failed and job.answered == len(job.questions):
                self._finish(job, None)


# ---- the kind module's entry points (loomrt.services) --------------------------------------------

def create_policy(reg: Any, executables: Any, tokenizer: Any) -> DecisionPolicy:
    from loomrt.control import Control

    if tokenizer is None:
        raise CompileError(f"model '{reg.name}': a decision deployment needs a tokenizer")
    return DecisionPolicy(Control(executables.control), tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))


def create_service(reg: Any, component: Any, residency: Any, state: dict, **common: Any) -> DecisionService:
    from loomrt.state import page_size

    module = reg.executables.module
    common["max_active"] = common.get("max_active") or DEFAULT_ACTIVE
    return DecisionService(reg.name, reg.executables, component, residency, state, reg.document.pending_capacity,
                           page_size=page_size(module) or 1,
                           page_states=[s.name for s in module.stage_states(DECIDE_STAGE) if s.scope == "page"],
                           **common)


KIND = KindSpec("decision", (DECIDE_STAGE,), create_policy, create_service, route="systemone")

__all__ = ["KIND", "DecisionPolicy", "Decision", "DecisionService", "InvalidDecision", "PreparedQuestion", "Question",
           "check_body_fields", "check_vector", "create_policy", "create_service", "parse_questions"]
