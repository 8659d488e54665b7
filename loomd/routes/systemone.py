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

from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import json_body
from loomd.errors import json_response
from loomd.jobs import finished
from loomrt import inference
from loomrt.errors import InvalidRequest
from loomrt.fields import expect_string
from loomrt.services.decision import check_body_fields


async def systemone(request: web.Request) -> web.StreamResponse:
    body = await json_body(request)
    check_body_fields(body)
    if "model" not in body:
        raise InvalidRequest("model: required field is missing", param="model")
    model = expect_string("model", body["model"])
    job, policy = await asyncio.to_thread(inference.decide, request.app[REGISTRY], model, body, request.path)
    # a client that leaves has its remaining rows dropped at the next boundary
    probabilities = await finished(job.future, on_leave=job.cancel)
    answers = await asyncio.to_thread(policy.answers, job.questions, probabilities)
    n = job.input_tokens
    return json_response({"id": f"decision-{job.id}", "object": "systemone.result", "created": int(job.created),
                          "model": job.model, "answers": answers,
                          "usage": {"input_tokens": n, "output_tokens": 0, "total_tokens": n}})


def add_routes(add) -> None:
    add("POST", "/v1/systemone", systemone)
