"""Finite decisions: `POST /v1/systemone` (spec: "Finite decisions").

Status rules (docs/source-contracts.md, "decision"): the strict-JSON rules are 400 like every
other body (malformed JSON or UTF-8, comments, trailing commas, lone surrogates, duplicate
decoded keys, unknown fields at any level, image-input extensions); the schema of `state`
and `questions` and the source's own input checks are 422 (`InvalidDecision`, or the
policy's `fail(422, ...)`). The questions render on a CPU worker through the control
program, then run as rows of the deployment's `DecisionService` cohorts; the control
program's `decision_answer` derives each answer from its validated probability vector (on
a CPU worker), and this module only encodes the result.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from loomd.app import JOURNAL, METRICS, REGISTRY
from loomd.bodies import json_body
from loomd.errors import json_response
from loomrt.errors import InvalidRequest, NotFound
from loomrt.fields import expect_string
from loomrt.services.decision import Decision, check_body_fields, parse_questions


async def systemone(request: web.Request) -> web.StreamResponse:
    body = await json_body(request)
    check_body_fields(body)
    if "model" not in body:
        raise InvalidRequest("model: required field is missing", param="model")
    registry = request.app[REGISTRY]
    reg = registry.get(expect_string("model", body["model"]))
    if reg.document.kind != "decision":
        raise NotFound(f"model '{reg.name}' is a {reg.document.kind} deployment; it does not serve "
                       f"{request.path}", param="model")
    registry.check_admission(reg, need_service=False)
    questions = parse_questions(body, reg.policy.capacity)
    prepared = await asyncio.to_thread(reg.policy.prepare, body["state"], questions)
    job = Decision(prepared)
    future = registry.submit(reg.name, job)
    future.add_done_callback(lambda f: _log_outcome(request, job, f))
    request.app[METRICS].tokens.labels(reg.name, "input").inc(job.input_tokens)
    try:
        probabilities = await asyncio.shield(asyncio.wrap_future(future))
    except (asyncio.CancelledError, ConnectionError):
        job.cancel()  # the client left: its remaining rows are dropped at the next boundary
        raise
    answers = await asyncio.to_thread(reg.policy.answers, prepared, probabilities)
    n = job.input_tokens
    return json_response({"id": f"decision-{job.id}", "object": "systemone.result", "created": int(job.created),
                          "model": reg.name, "answers": answers,
                          "usage": {"input_tokens": n, "output_tokens": 0, "total_tokens": n}})


def _log_outcome(request: web.Request, job: Decision, future: Any) -> None:
    """One `/logz` record per finished decision (runs on the service worker thread)."""
    error = future.exception()
    record: dict[str, Any] = {"event": "request", "route": request.path, "model": job.model, "request": job.id,
                              "questions": len(job.questions), "prompt_tokens": job.input_tokens,
                              "completion_tokens": 0, "duration_ms": round(1000 * (time.time() - job.created), 1)}
    if error is not None:
        record["error"] = {"code": getattr(error, "code", "internal_error"), "message": str(error)}
    request.app[JOURNAL].publish(record)


def add_routes(add) -> None:
    add("POST", "/v1/systemone", systemone)
