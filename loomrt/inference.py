"""The runtime's request API: one call per kind of inference request, whoever makes it.

loomd's routes frame HTTP and make exactly one of these calls each; an application that
embeds loomrt makes the same calls and gets the same checks, the same jobs and the same
`request` events (naming `what`: the route an HTTP request came by). Each call resolves the deployment for its kind (`Registry.serving`: 404 for
another kind or a native-only program, 503 when it does not admit work), runs the kind's
control policy (validation, rendering, tokenization: CPU work, so call it from a worker
thread, as `asyncio.to_thread` does), submits the job and returns it; `job.future` resolves
with the result, and a streaming job's `outbox` carries its events (on `loop`, when given).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from loomrt.errors import InvalidRequest, NotFound
from loomrt.media.audio import decode_recording
from loomrt.registry import Registry, Utility
from loomrt.services.decision import Decision, parse_questions
from loomrt.services.embedding import EmbeddingJob
from loomrt.services.image import ImageJob
from loomrt.services.recognition import Transcription
from loomrt.services.outbox import Outbox
from loomrt.services.sequence import SequenceAppend
from loomrt.services.speech import BLOCK_CREDIT, Utterance
from loomrt.services.text import Generation

CHAT = "chat completions"
T = TypeVar("T")


def transcribe(registry: Registry, model: Any, data: bytes, media_type: str | None, params: dict[str, str],
               options: dict[str, Any], what: str = "transcriptions") -> Transcription:
    """Transcribe a finished recording: the policy checks the options, the recording is decoded
    to the source's geometry (its frame limit enforced as frames arrive), then it is queued."""
    reg = registry.serving(model, "recognition", what)
    prepared = reg.policy.prepare(options)
    samples = decode_recording(data, media_type, params, reg.policy.geometry)
    job = Transcription(samples, prepared, reg.policy.window_samples)
    job.route = what
    registry.submit(reg.name, job)
    return job


def speak(registry: Registry, model: Any, options: dict[str, Any], what: str = "speech",
          loop: asyncio.AbstractEventLoop | None = None) -> Utterance:
    """Start speaking `options["input"]`: the source's policy cuts it into blocks (or rejects the
    voice, speed, seed or instructions), then the utterance is queued; its `outbox` carries each
    block's PCM16LE bytes ("audio"), then "done" or "error"."""
    reg = registry.serving(model, "speech", what)
    prepared = reg.policy.prepare(options)
    job = Utterance(prepared, outbox=Outbox(BLOCK_CREDIT, loop=loop))
    job.route = what
    registry.submit(reg.name, job)
    return job


def illustrate(registry: Registry, model: Any, options: dict[str, Any], what: str = "images") -> ImageJob:
    """Generate one image: the host selects the adapters, the source checks the size and prompt
    (`ImagePolicy.prepare`); the job's future resolves with the RGB8 picture."""
    reg = registry.serving(model, "image", what)
    job = ImageJob(reg.policy.prepare(options))
    job.route = what
    registry.submit(reg.name, job)
    return job


def tokenizer(registry: Registry, model: Any) -> Any:
    """The tokenizer of a compiled deployment (tokenize/detokenize utilities); NotFound without one."""
    reg = registry.get(model)
    registry.check_admission(reg, need_service=False)
    if reg.tokenizer is None:
        raise NotFound(f"model '{reg.name}' has no tokenizer", param="model")
    return reg.tokenizer


def with_tokenizer(registry: Registry, model: Any, kind: str, work: Callable[[Any, Utility], T],
                   what: str | None = None) -> T:
    """Run `work(tokenizer, request)` as one utility request of `kind` ("tokenize",
    "detokenize"): admitted and resolved as `tokenizer`, listed by `/v1/requests` while it
    runs and reported by a `request` event (with what `work` put in `request.counts`).
    Blocking: call it on a worker thread, so the request lasts as long as the work does."""
    tok = tokenizer(registry, model)
    with registry.utility(registry.get(model), kind, what) as request:
        return work(tok, request)


def chat(registry: Registry, model: Any, body: dict[str, Any], *, max_tokens: int | None, stream: bool,
         session: str | None = None, checkpoint: str | None = None, what: str = CHAT,
         loop: asyncio.AbstractEventLoop | None = None) -> Generation:
    """Start a chat generation. `max_tokens` None: the deployment's `limits.max_output_tokens`.
    A non-streaming reader takes only the outcome: its text deltas are not kept, or they would
    exhaust the row's output credit and pause the generation with nobody to read them."""
    reg = registry.serving(model, "text", what)
    max_tokens = output_limit(reg, body, max_tokens)
    prepared = reg.policy.prepare(body)
    gen = Generation(prepared.prompt, max_tokens, prepared.sampling,
                     prepared.stop_ids, prepared.state, outbox=Outbox(loop=loop, deltas=stream), session=session,
                     checkpoint=checkpoint, images=prepared.images)
    gen.route = what
    registry.submit(reg.name, gen)
    return gen


def output_limit(reg: Any, body: dict[str, Any], max_tokens: int | None) -> int:
    """The output cap of a chat: `max_tokens` as the request asked it (None: the deployment's
    `limits.max_output_tokens`), never above that advertised limit (400 naming the field)."""
    limit = reg.document.max_output_tokens
    if max_tokens is None:
        return limit
    if max_tokens > limit:
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        raise InvalidRequest(f"{key}: {max_tokens} is above the limits.max_output_tokens of model '{reg.name}' "
                             f"({limit})", param=key)
    return max_tokens


def count_chat(registry: Registry, model: Any, body: dict[str, Any], what: str = CHAT, *,
               max_tokens: int | None = None) -> int:
    """The prompt tokens a chat would have, without generating (a bounded CPU utility). Its
    generation fields are validated as a chat's (`max_tokens` within the advertised limit)."""
    reg = registry.serving(model, "text", what)
    output_limit(reg, body, max_tokens)
    with registry.utility(reg, "input_tokens", what, bounded=True) as job:
        n = len(reg.policy.prepare(body, decode=False).prompt)   # image headers only
        if n > reg.document.context_length:
            raise InvalidRequest(f"the input needs {n} tokens, but model '{reg.name}' has a context "
                                 f"of {reg.document.context_length} tokens", param="messages")
        job.counts["input_tokens"] = n
    return n


def embed(registry: Registry, model: Any, request: dict[str, Any], what: str = "embeddings") -> EmbeddingJob:
    """Embed a request's inputs (`{"input": [...], "dimensions"?: n}`, already shaped by the caller)."""
    reg = registry.serving(model, "embedding", what)
    job = EmbeddingJob(reg.policy.prepare(request).inputs)
    job.route = what
    registry.submit(reg.name, job)
    return job


def decide(registry: Registry, model: Any, body: dict[str, Any], what: str = "decisions") -> tuple[Decision, Any]:
    """Render a decision request's questions and queue them; returns the job and the policy
    (whose `answers` turns the job's probabilities into the response)."""
    reg = registry.serving(model, "decision", what)
    questions = parse_questions(body, reg.policy.capacity)
    job = Decision(reg.policy.prepare(body["state"], questions))
    job.route = what
    registry.submit(reg.name, job)
    return job, reg.policy


def append(registry: Registry, model: Any, token_ids: list[int], position: int, *, session: str | None,
           options: dict[str, Any], checkpoint: str | None = None, what: str = "sequences",
           loop: asyncio.AbstractEventLoop | None = None) -> SequenceAppend:
    """Append known token ids to a sequence handle (a new one when `session` is None)."""
    reg = registry.serving(model, "sequence", what)
    prepared = reg.policy.prepare(options)
    if prepared.token_limit is not None:
        for i, t in enumerate(token_ids):
            if t >= prepared.token_limit:
                raise InvalidRequest(f"token_ids[{i}]: {t} is not a token id of model '{reg.name}' "
                                     f"(ids are below {prepared.token_limit})", param=f"token_ids[{i}]")
    job = SequenceAppend(token_ids, position, session, prepared.options, outbox=Outbox(loop=loop),
                         checkpoint=checkpoint)
    job.route = what
    registry.submit(reg.name, job)
    return job


__all__ = ["append", "chat", "count_chat", "decide", "embed", "output_limit", "tokenizer", "transcribe",
           "with_tokenizer"]
