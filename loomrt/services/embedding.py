"""The embedding service: cohorts of inputs from many requests packed into one `encode` call.

The embedding source contract (`docs/source-contracts.md`, "embedding"):

    stage encode(tokens: i32[T], positions: i32[T], seq: i32[T], starts: i32[B], lengths: i32[B])
        -> (vectors: f32[B, dim])
    fn embedding_request(request: map, tok: any) -> map      # {"inputs": [[id, ...], ...], "dimensions": int}

`EmbeddingPolicy` runs the control program's `embedding_request` before admission (CPU only,
no weights): it validates the model-specific fields (`dimensions`), tokenizes and frames each
input, and enforces the source's length limits. An `EmbeddingJob` holds the framed inputs of
one request. Every pass of `EmbeddingService` packs the pending inputs of *all* active jobs
into one cohort (round-robin, one input per job at a time, up to the source's
`cohort_tokens`), runs `encode` once, and hands each vector back to the job it came from.
A job whose client left is dropped at the next boundary; if it was cancelled while its
inputs were in a cohort, their vectors are discarded and its peers are not touched.
A source that returns a vector that is not finite fails only the request it belongs to:
the host never normalises or repairs a vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from loomrt.errors import CompileError, InvalidRequest, LoomError
from loomrt.services import KindSpec
from loomrt.services.base import Job, StageService, StepPlan
from loomrt.services.packing import pack_sequences

ENCODE_STAGE = "encode"
REQUEST_FN = "embedding_request"
COHORT_TOKENS_CONFIG = "cohort_tokens"
DEFAULT_COHORT_TOKENS = 8192
# The control call's instruction budget grows with the request: a policy walks every token id
# it is given, so a large batch must not look like a runaway loop.
BASE_BUDGET = 1_000_000
BUDGET_PER_ITEM = 32


def _contract_error(message: str) -> LoomError:
    return LoomError(f"the control program's {REQUEST_FN}() broke the embedding contract: {message}")


@dataclass(frozen=True)
class PreparedEmbedding:
    inputs: list[list[int]]   # token ids of each input, as the encoder reads them
    dimensions: int

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.inputs)


class EmbeddingPolicy:
    """What the host asks of an embedding deployment's control program before encoding."""

    def __init__(self, control: Any, tokenizer: Any, vocab_size: int | None, width: int):
        self.control = control
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.width = width
        if not control.has(REQUEST_FN):
            raise CompileError(f"an embedding deployment's control program needs fn {REQUEST_FN}(request: map, "
                               "tok: any) -> map (docs/source-contracts.md)")

    def prepare(self, request: dict[str, Any]) -> PreparedEmbedding:
        """Validate, tokenize and frame one request's inputs (a PolicyFailure carries the policy's 4xx).
        `request["input"]` is the list of inputs, each a string or a list of token ids."""
        given = request["input"]
        budget = BASE_BUDGET + BUDGET_PER_ITEM * sum(len(x) + 1 for x in given)
        result = self.control.call(REQUEST_FN, [request, self.tokenizer], budget)
        if not isinstance(result, dict):
            raise _contract_error("it must return a map")
        inputs = result.get("inputs")
        if not isinstance(inputs, list) or len(inputs) != len(given):
            raise _contract_error(f"'inputs' must be a list with one entry per input ({len(given)})")
        limit = self.vocab_size
        for ids in inputs:
            if not isinstance(ids, list) or not ids or not all(
                    type(t) is int and 0 <= t and (limit is None or t < limit) for t in ids):
                bound = f"0..{limit - 1}" if limit is not None else "non-negative"
                raise _contract_error(f"each of 'inputs' must be a non-empty list of token ids in {bound}")
        width = result.get("dimensions")
        if type(width) is not int or width != self.width:
            raise _contract_error(f"'dimensions' must be the width the encode stage returns ({self.width}), "
                                  f"got {width!r}")
        return PreparedEmbedding(inputs, width)


class EmbeddingJob(Job):
    """One embeddings request: its framed inputs; the future gets an f32 array [inputs, dim]."""

    def __init__(self, inputs: list[list[int]], *, kind: str = "embeddings"):
        super().__init__([], kind=kind)
        self.inputs = [list(map(int, ids)) for ids in inputs]
        self.vectors: list[np.ndarray | None] = [None] * len(self.inputs)
        self.dispatched = 0                  # inputs handed to a cohort so far (in order)
        self.done = 0                        # inputs whose vector came back
        self.tokens = sum(len(ids) for ids in self.inputs)
        self._wake = lambda: None

    def cancel(self, reason: LoomError | None = None) -> None:
        super().cancel(reason)
        self._wake()

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.tokens, "total_tokens": self.tokens}

    def outcome(self) -> dict[str, Any]:
        return {"inputs": len(self.inputs), "prompt_tokens": self.tokens}

    def describe(self, state: str) -> dict[str, Any]:
        out = super().describe(state)
        out.update(inputs=len(self.inputs), inputs_done=self.done, prompt_tokens=self.tokens)
        return out


class EmbeddingService(StageService):
    def __init__(self, *args: Any, width: int, cohort_tokens: int = DEFAULT_COHORT_TOKENS, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.width = width
        self.cohort_tokens = cohort_tokens
        self.cohorts = 0

    # ---- admission ---------------------------------------------------------------------------

    def submit(self, job: Job) -> Any:
        if not isinstance(job, EmbeddingJob):
            raise InvalidRequest("an embedding deployment serves embedding requests")
        if not job.inputs:
            raise InvalidRequest("input: nothing to embed", param="input")
        for i, ids in enumerate(job.inputs):
            if not ids:
                raise InvalidRequest(f"input[{i}]: an input needs at least one token", param="input")
            if len(ids) > self.cohort_tokens:  # could never fit in a cohort
                raise InvalidRequest(f"input[{i}] is {len(ids)} tokens; model '{self.model}' encodes at most "
                                     f"{self.cohort_tokens} tokens per call", param="input")
        job._wake = self.wake
        return super().submit(job)

    def counts(self) -> dict[str, int]:
        out = super().counts()
        out["cohorts"] = self.cohorts
        return out

    def _runnable(self, active: list[Job]) -> list[Job]:
        return [j for j in active if j.cancelled is None]

    def _resolve(self, job: EmbeddingJob, error: LoomError | None) -> None:
        if error is None:
            job.future.set_result(np.stack(job.vectors) if job.vectors else np.zeros((0, self.width), np.float32))
        else:
            job.future.set_exception(error)

    # ---- one cohort: plan -> execute -> apply -------------------------------------------------

    def plan(self, jobs: list[EmbeddingJob]) -> list[StepPlan]:
        """One cohort: round-robin over the jobs, one input at a time, so a large batch does not
        hold back the requests behind it; at most `cohort_tokens` tokens, but always at least
        one input. Inputs are packed back to back: input b is tokens starts[b] ..< + lengths[b]."""
        picked: list[tuple[EmbeddingJob, int]] = []
        used = 0
        open_jobs = [j for j in jobs if j.dispatched < len(j.inputs)]
        while open_jobs:
            still = []
            for job in open_jobs:
                n = len(job.inputs[job.dispatched])
                if picked and used + n > self.cohort_tokens:
                    continue  # this job is done for this cohort
                picked.append((job, job.dispatched))
                used += n
                job.dispatched += 1
                if job.dispatched < len(job.inputs):
                    still.append(job)
            open_jobs = still
        if not picked:
            return []
        inputs = pack_sequences([job.inputs[i] for job, i in picked])
        return [StepPlan(ENCODE_STAGE, tuple(dict.fromkeys(job for job, _ in picked)), inputs, tuple(picked))]

    def apply(self, plan: StepPlan, outputs: dict[str, np.ndarray]) -> None:
        vectors = outputs["vectors"]
        if vectors.shape != (len(plan.rows), self.width) or vectors.dtype != np.float32:
            raise LoomError(f"stage '{ENCODE_STAGE}' returned vectors {vectors.dtype}{list(vectors.shape)}, "
                            f"expected f32[{len(plan.rows)}, {self.width}]")
        self.cohorts += 1
        finite = np.isfinite(vectors).all(axis=1)
        failed: set[int] = set()
        for (job, i), row, ok in zip(plan.rows, vectors, finite):
            if job.cancelled is not None or id(job) in failed:
                continue  # the client left: drop its vectors; its peers keep theirs
            if not ok:
                failed.add(id(job))
                self._finish(job, LoomError(f"stage '{ENCODE_STAGE}' returned a vector that is not finite "
                                            f"for input {i}"))
                continue
            job.vectors[i] = row
            job.done += 1
        for job in plan.jobs:
            if job.cancelled is None and id(job) not in failed and job.done == len(job.inputs):
                self._finish(job, None)


def _width(executables: Any, reg_name: str) -> int:
    results = {spec.name: spec for spec in executables.module.stages[ENCODE_STAGE].results}
    spec = results.get("vectors")
    width = spec.dims[1].constant if spec is not None and spec.dims is not None and len(spec.dims) == 2 else None
    if spec is None or spec.dtype != "f32" or spec.dims[0].bare_symbol is None or not width:
        raise CompileError(f"model '{reg_name}': stage `{ENCODE_STAGE}` must return `vectors: f32[B, dim]` with a "
                           "constant dim (docs/source-contracts.md, embedding)")
    return width


def create_policy(reg: Any, executables: Any, tokenizer: Any) -> EmbeddingPolicy:
    """The embedding policy (the control program's `embedding_request`) and the encode stage."""
    from loomrt.control import Control

    vocab = None
    if tokenizer is not None:
        # A tokenizer.json may carry batch-encoding settings (all-MiniLM-L6-v2's pads and
        # truncates to 128): tokenize() must return exactly the ids of the text, so they go.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    return EmbeddingPolicy(Control(executables.control), tokenizer, vocab, _width(executables, reg.name))


def create_service(reg: Any, component: Any, residency: Any, state: dict, **common: Any) -> EmbeddingService:
    cohort = reg.executables.module.config(COHORT_TOKENS_CONFIG)
    if cohort is None:
        cohort = DEFAULT_COHORT_TOKENS
    if type(cohort) is not int or cohort < 1:
        raise CompileError(f"model '{reg.name}': `config {COHORT_TOKENS_CONFIG}` must be a positive integer")
    return EmbeddingService(reg.name, reg.executables, component, residency, state, reg.document.pending_capacity,
                            width=reg.policy.width, cohort_tokens=cohort, **common)


KIND = KindSpec("embedding", (ENCODE_STAGE,), create_policy, create_service, route="embeddings",
                state_scopes=())

__all__ = ["KIND", "EmbeddingJob", "EmbeddingPolicy", "EmbeddingService", "PreparedEmbedding", "create_policy",
           "create_service"]
