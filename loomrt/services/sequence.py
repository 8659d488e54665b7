"""The sequence service: known token ids appended to server-issued handles, one chunk per step.

A `kind: "sequence"` deployment (spec "Known-token sequences"; the source contract in
`docs/source-contracts.md`) consumes exact token ids the caller supplies and returns the
stage's opaque per-token bytes. It selects nothing and never advances past those ids.

* **Handles.** An initial request gets a fresh handle (`secrets.token_hex(16)`, 32 hex
  characters); the handle owns its row's KV pages between requests, so an append (same
  handle, the exact completed position, only the new ids) continues from the retained
  state. A handle is a `Session` in a bounded cache: active appends use the document's
  `rows` as execution rows; idle handles keep their pages while the pool allows, and the
  least recently used idle handles are evicted (pages freed, handle forgotten: 404) when a
  starting append needs pages. A handle in use by an accepted append is busy: another
  append on it is `Conflict` (409), as is a stale position.
* **Steps.** Each pass packs one `consume` call: every runnable active append contributes
  its next ids from a shared per-step budget (`config step_tokens`, else `STEP_TOKENS`), in
  admission order. Every append that took part gets one chunk: its position, next
  position, the ids and the bytes of its rows of the stage's result (copied out of the
  program's reusable buffers before the next step). Chunk boundaries are therefore the
  execution cohorts, not the request's size.
* **Credit.** Each append's `Outbox` is bounded; an append whose reader has not taken
  `credit` chunks is left out of new steps until it does, while the others continue.
* **Failures.** A client that leaves cancels its append at the next step boundary (the
  step in flight retires first); any append that ends without completing (cancelled,
  failed, aborted) invalidates its handle, since what its pages hold is no longer a
  position the client knows for certain.
* **Admission.** Context and pool limits are checked when the request is submitted:
  `position + len(ids)` above `context_length`, or more pages than the whole pool, is
  `InvalidRequest` (400) with the numbers; an append that fits later waits in the queue.
* **Named checkpoints.** `pin` copies an idle handle's pages into pool pages the pin owns
  (`loomrt.pins`: idle handles are evicted for them when the pool is short); with elastic
  backing `suspend` parks them in a host image. An initial request naming a checkpoint forks
  it: a new handle whose fresh pages get a copy of the pin's state when it starts (a
  suspended pin is warmed back into new pages first when the pool has room), then the ids
  are appended. A pin is never written, so the source handle advancing, being evicted, or
  the pin being deleted never changes a fork.
"""

from __future__ import annotations

import collections
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loomrt.errors import CompileError, Conflict, InvalidRequest, LoomError, NotFound
from loomrt.kv import PagePool
from loomrt.pins import Checkpoint, PinControls, Pins
from loomrt.services import KindSpec
from loomrt.services.base import Job, StageService, StepPlan
from loomrt.services.packing import TokenRow, pack_rows
from loomrt.services.outbox import Outbox
from loomrt.sessions import ORDERS

STEP_STAGE = "consume"  # a sequence program without it is native-only (loomrt.services)
REQUEST_FN = "sequence_request"
STEP_TOKENS_CONFIG = "step_tokens"
STEP_TOKENS = 256
CREDIT = 8          # chunks a reader may leave untaken before its row sits out new steps
INT32_MAX = 2**31 - 1


@dataclass
class Session:
    """A handle's retained state: the positions consumed so far and the pages holding them."""

    handle: str
    position: int = 0
    pages: list[int] = field(default_factory=list)
    busy: "SequenceAppend | None" = None    # the accepted append that owns the handle now
    last_used: float = field(default_factory=time.monotonic)
    dropped: bool = False
    order: int = field(default_factory=lambda: next(ORDERS))


class SequenceAppend(Job):
    """One request: known ids appended to a handle (a new one when `session` is None)."""

    def __init__(self, token_ids: list[int], position: int, session: str | None = None, options: Any = None, *,
                 outbox: Outbox | None = None, kind: str = "sequence", checkpoint: str | None = None):
        super().__init__([], kind=kind)
        self.token_ids = [int(t) for t in token_ids]
        self.position = position              # the completed position the request names
        self.requested_session = session
        self.checkpoint = checkpoint          # X-Loom-Checkpoint: fork this endpoint into a new handle
        self._from: Checkpoint | None = None  # resolved at admission; None once copied
        self.options = options
        self.outbox = outbox or Outbox()
        self.session: Session | None = None   # set at admission
        self.consumed = 0                     # ids of this request written to the cache
        self.chunks = 0
        self.error: LoomError | None = None
        self._wake = lambda: None

    @property
    def handle(self) -> str | None:
        return self.session.handle if self.session is not None else None

    @property
    def remaining(self) -> int:
        return len(self.token_ids) - self.consumed

    @property
    def end(self) -> int:
        return self.position + len(self.token_ids)

    def cancel(self, reason: LoomError | None = None) -> None:
        super().cancel(reason)
        self._wake()

    def outcome(self) -> dict[str, Any]:
        out = {"session": self.handle, "position": self.position, "prompt_tokens": len(self.token_ids),
               "consumed": self.consumed, "chunks": self.chunks}
        if self.checkpoint is not None:
            out["checkpoint"] = self.checkpoint
        return out

    def describe(self, state: str) -> dict[str, Any]:
        out = super().describe(state)
        out.update(position=self.position, tokens=len(self.token_ids), consumed=self.consumed, chunks=self.chunks)
        return out


class SequenceService(PinControls, StageService):
    """`page_states` are the `per page` states a handle's pages index: the pool sizes from
    them and a checkpoint images only them."""

    def __init__(self, *args: Any, page_size: int, context_length: int, page_states: list[str],
                 step_tokens: int = STEP_TOKENS, credit: int = CREDIT, checkpoint_capacity: int = 0,
                 checkpoint_backing: str = "elastic", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.context_length = context_length
        self.step_tokens = max(1, int(step_tokens))
        self.credit = credit
        self.paged = {name: self.state[name] for name in page_states}
        self.pool = PagePool(next(iter(self.paged.values())).shape[0] if self.paged else 0, page_size)
        self.pages_per_row = self.pool.pages_for(context_length)
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()  # LRU first
        self.evictions = 0
        self.pins = Pins(self.model, checkpoint_capacity, self.pool, self.paged, checkpoint_backing)

    # ---- admission ---------------------------------------------------------------------------

    def submit(self, job: Job) -> Any:
        if not isinstance(job, SequenceAppend):
            raise InvalidRequest("a sequence deployment serves known-token appends")
        if not job.token_ids:
            raise InvalidRequest("token_ids: must not be empty", param="token_ids")
        if job.end > self.context_length:
            raise InvalidRequest(f"the sequence would reach position {job.end} ({job.position} + "
                                 f"{len(job.token_ids)} ids), but model '{self.model}' has a context of "
                                 f"{self.context_length} positions per sequence", param="token_ids")
        if self.pool.pages_for(job.end) > self.pool.pages:
            raise InvalidRequest(f"the sequence would need {self.pool.pages_for(job.end)} KV pages "
                                 f"({job.end} positions), but model '{self.model}' has a pool of "
                                 f"{self.pool.pages} pages ({self.pool.pages * self.pool.page_size} positions)",
                                 param="token_ids")
        job._wake = self.wake
        job.outbox.wake_worker = self.wake
        job.outbox.credit = self.credit
        with self._cond:
            self.pins.check_fits(self.pool.pages_for(job.end))
            if job.requested_session is not None and job.checkpoint is not None:
                raise InvalidRequest("X-Loom-Checkpoint forks into a new handle: omit 'session'",
                                     param="X-Loom-Checkpoint")
            if job.checkpoint is not None:
                point = self.pins.get(job.checkpoint, param="X-Loom-Checkpoint")
                if job.position != point.position:
                    raise Conflict(f"stale position {job.position}: checkpoint {point.name!r} is at position "
                                   f"{point.position}", param="position")
                job._from = point
                session = Session(secrets.token_hex(16))
            elif job.requested_session is None:
                if job.position != 0:
                    raise InvalidRequest(f"position: an initial request (no session) starts at 0, got "
                                         f"{job.position}", param="position")
                session = Session(secrets.token_hex(16))
            else:
                session = self._sessions.get(job.requested_session)
                if session is None:
                    raise NotFound(f"sequence session {job.requested_session!r} is unknown to model "
                                   f"'{self.model}' (never issued, evicted or invalidated)", param="session")
                if session.busy is not None:
                    raise Conflict(f"sequence session {session.handle!r} is in use by another request",
                                   param="session")
                if session.position != job.position:
                    raise Conflict(f"stale position {job.position}: sequence session {session.handle!r} is at "
                                   f"position {session.position}", param="position")
            job.session = session
            session.busy = job
            try:
                future = super().submit(job)
            except LoomError:
                session.busy = None
                job.session = None
                job._from = None
                raise
            if job.requested_session is None:
                self._sessions[session.handle] = session
            self._sessions.move_to_end(session.handle)
            session.last_used = time.monotonic()
            return future

    def counts(self) -> dict[str, int]:
        out = super().counts()
        with self._cond:
            out.update(pages_used=self.pool.used, pages_free=self.pool.free, rows=self.max_active or 0,
                       sessions=len(self._sessions), evictions=self.evictions, checkpoints=len(self.pins),
                       pages_checkpoints=self.pins.pages_held, checkpoint_host_bytes=self.pins.host_bytes,
                       snapshot_bytes=self.pins.host_bytes)
        return out

    def sessions(self) -> list[dict[str, Any]]:
        """The retained handles for `/v1/sessions`, in the shape text sessions have. An idle
        handle's pages stay in the KV pool (`residency` "pool"); one with an append accepted
        (running or queued) is "active" and busy."""
        with self._cond:
            return [{"object": "session", "session": s.handle, "model": self.model, "position": s.position,
                     "residency": "pool" if s.busy is None else "active", "busy": s.busy is not None,
                     "order": s.order} for s in sorted(self._sessions.values(), key=lambda s: s.order)]

    # ---- named checkpoints (loomrt.pins) --------------------------------------------------------

    def pin(self, name: str, session: str) -> Checkpoint:
        """Pin the idle handle `session` at its completed position as checkpoint `name`: a copy
        of its pages in pool pages the pin owns, so the handle may advance or be evicted
        afterwards. Idle handles are evicted to make room; none left is 503."""
        with self._cond:
            self.pins.require_enabled()
            handle = self._sessions.get(session)
            if handle is None:
                raise NotFound(f"model '{self.model}' has no sequence handle {session!r} (never issued, evicted "
                               "or invalidated)", param="X-Loom-Session")
            if handle.busy is not None:
                raise Conflict(f"sequence handle {session!r} is busy: pin it once its append finished",
                               param="X-Loom-Session")
            point = self.pins.pin(Checkpoint(name, session, handle.position), handle.pages,
                                  lambda n: self._evict_for(n, handle))
            self._account_host()
            return point

    def _account_host(self) -> None:
        """Charge suspended pins' host images to the host ledger."""
        self.residency.devices.set("cpu", self.component.owner, "snapshots", self.pins.host_bytes)

    def session_position(self, handle: str) -> int | None:
        """The completed position of a retained handle, or None (for tests and inspection)."""
        with self._cond:
            session = self._sessions.get(handle)
            return None if session is None else session.position

    # ---- hooks (under the lock) ----------------------------------------------------------------

    def _drop(self, session: Session) -> None:
        """Forget a handle and free its pages (idempotent)."""
        if session.dropped:
            return
        session.dropped = True
        if self._sessions.get(session.handle) is session:
            del self._sessions[session.handle]
        self.pool.release(session.pages)
        session.pages = []

    def _evict_for(self, pages: int, keep: Session) -> bool:
        """Evict least recently used idle handles until `pages` pages are free."""
        for session in list(self._sessions.values()):
            if self.pool.free >= pages:
                break
            if session is keep or session.busy is not None:
                continue
            self._drop(session)
            self.evictions += 1
        return self.pool.free >= pages

    def _start(self, job: SequenceAppend) -> bool:
        session = job.session
        if job.cancelled is not None or session.dropped:
            return True                   # admitted only to leave at the next boundary
        need = self.pool.pages_for(job.end) - len(session.pages)
        if need > 0:
            if not self._evict_for(need, session):
                if self._active:
                    return False          # running appends will leave idle (evictable) pages
                # Nothing runs, so nothing will free pages by itself: the rest is held by
                # handles whose appends wait behind this one. Evict those, newest use last.
                for other in list(self._pending):
                    if self.pool.free >= need:
                        break
                    if other is not job and other.session is not None and other.session.pages:
                        self._drop(other.session)
                        self.evictions += 1
                        other.cancel(NotFound(f"sequence session {other.session.handle!r} was evicted to "
                                              "make room in the KV pool", param="session"))
                if self.pool.free < need:
                    return False
            got = self.pool.reserve(need * self.pool.page_size)
            session.pages += got
        if job._from is not None:  # a fork: its fresh pages start as a copy of the checkpoint's state
            point, job._from = job._from, None
            if point.suspended and self.pins.warm(point, lambda n: self._evict_for(n, session)):
                self._account_host()
            self.pins.copy_into(point, session.pages)
        return True

    def _released(self, job: SequenceAppend) -> None:
        session = job.session
        if session is None:
            return
        session.busy = None
        session.last_used = time.monotonic()
        if job.cancelled is not None or job.error is not None or job.remaining:
            self._drop(session)
        elif not session.dropped:
            self._sessions.move_to_end(session.handle)

    def _runnable(self, active: list[Job]) -> list[Job]:
        return [j for j in active if j.cancelled is None and j.outbox.has_credit()]

    def _finish(self, job: Job, error: LoomError | None) -> None:
        job.error = error
        super()._finish(job, error)

    def _resolve(self, job: SequenceAppend, error: LoomError | None) -> None:
        if error is not None:
            with self._cond:
                if job.session is not None:
                    if job.session.busy is job:
                        job.session.busy = None
                    self._drop(job.session)    # an append that did not complete invalidates its handle
            job.outbox.put("error", error)
            job.future.set_exception(error)
            return
        payload = {"session": job.handle, "position": job.end}
        job.outbox.put("done", payload)
        job.future.set_result(payload)

    # ---- one step: plan -> execute -> apply ---------------------------------------------------

    def plan(self, jobs: list[SequenceAppend]) -> list[StepPlan]:
        """One packed `consume` call. The step's token budget is shared fairly: each runnable
        append gets an equal share (at least one id while the budget lasts), and what a short
        append leaves goes to the others in admission order, so a long append never holds
        back the rows that share its steps."""
        if not jobs:
            return []
        budget = self.step_tokens
        share = max(1, budget // len(jobs))
        take: dict[int, int] = {}
        for i, job in enumerate(jobs):
            n = min(job.remaining, share, budget)
            if n > 0:
                take[i] = n
                budget -= n
        for i, job in enumerate(jobs):
            if budget <= 0:
                break
            extra = min(job.remaining - take.get(i, 0), budget)
            if extra > 0:
                take[i] = take.get(i, 0) + extra
                budget -= extra
        rows = [TokenRow(jobs[i], tuple(jobs[i].token_ids[jobs[i].consumed:jobs[i].consumed + take[i]]),
                         jobs[i].position + jobs[i].consumed, tuple(jobs[i].session.pages)) for i in sorted(take)]
        if not rows:
            return []
        inputs = pack_rows(rows, self.pages_per_row)
        del inputs["last"]  # the consume stage returns every token's row: it takes no `last`
        return [StepPlan(STEP_STAGE, tuple(r.job for r in rows), inputs, tuple(rows))]

    def apply(self, plan: StepPlan, outputs: dict[str, np.ndarray]) -> None:
        result = _per_token(outputs)
        offset = 0
        for row in plan.rows:
            job, n = row.job, len(row.tokens)
            data = result[offset:offset + n].tobytes()   # a copy: the next step may reuse the buffers
            chunk = {"session": job.handle, "position": row.start, "next_position": row.start + n,
                     "token_ids": list(row.tokens), "data": data}
            offset += n
            with self._cond:
                job.consumed += n
                job.chunks += 1
                job.session.position = row.start + n
            job.outbox.put("chunk", chunk)
            if not job.remaining:
                self._finish(job, None)


def _per_token(outputs: dict[str, np.ndarray]) -> np.ndarray:
    """The stage's single result as little-endian rows, one per packed token."""
    if len(outputs) != 1:
        raise LoomError(f"stage '{STEP_STAGE}' must have exactly one result (the per-token bytes), "
                        f"got {sorted(outputs)}")
    (value,) = outputs.values()
    value = np.asarray(value)
    if value.ndim < 1:
        raise LoomError(f"stage '{STEP_STAGE}' must return one row per consumed token")
    return np.ascontiguousarray(value, value.dtype.newbyteorder("<"))


# ---- the policy and the service factory ------------------------------------------------------

@dataclass(frozen=True)
class SequenceRequest:
    options: Any
    token_limit: int | None


class SequencePolicy:
    """Calls the control program's `sequence_request(options)` (when it has one)."""

    def __init__(self, control: Any):
        self.control = control
        self.has_fn = control.has(REQUEST_FN)

    def prepare(self, options: dict[str, Any]) -> SequenceRequest:
        if not self.has_fn:
            if options:
                raise InvalidRequest("options: this model takes no options (its control program has no "
                                     f"{REQUEST_FN})", param="options")
            return SequenceRequest({}, None)
        result = self.control.call(REQUEST_FN, [options])
        if not isinstance(result, dict):
            raise LoomError(f"the control program's {REQUEST_FN}() must return a map")
        limit = result.get("token_limit")
        if limit is not None and (type(limit) is not int or limit < 1):
            raise LoomError(f"the control program's {REQUEST_FN}() returned a 'token_limit' that is not a "
                            "positive integer")
        return SequenceRequest(result.get("options", {}), limit)


def _page_states(executables: Any) -> list[str]:
    return [spec.name for spec in executables.module.stage_states(STEP_STAGE) if spec.scope == "page"]


def create_policy(reg: Any, executables: Any, tokenizer: Any) -> SequencePolicy:
    """The request policy (the control program's optional `sequence_request`)."""
    from loomrt.control import Control

    if not _page_states(executables):
        raise CompileError(f"model '{reg.name}': stage '{STEP_STAGE}' keeps no `per page` state, so a sequence "
                           "handle would have nothing to retain (docs/source-contracts.md, sequence)")
    return SequencePolicy(Control(executables.control))


def create_service(reg: Any, component: Any, residency: Any, state: dict, **common: Any) -> SequenceService:
    from loomrt.state import page_size

    module = reg.executables.module
    step_tokens = module.config(STEP_TOKENS_CONFIG)
    if not isinstance(step_tokens, int) or isinstance(step_tokens, bool) or step_tokens < 1:
        step_tokens = STEP_TOKENS
    return SequenceService(reg.name, reg.executables, component, residency, state, reg.document.pending_capacity,
                           page_size=page_size(module), context_length=reg.document.context_length,
                           page_states=_page_states(reg.executables), step_tokens=step_tokens,
                           checkpoint_capacity=reg.document.checkpoint_capacity,
                           checkpoint_backing=reg.document.checkpoint_backing, **common)


KIND = KindSpec("sequence", (STEP_STAGE,), create_policy, create_service, route="sequences")

__all__ = ["KIND", "STEP_STAGE", "STEP_TOKENS", "SequenceAppend", "SequencePolicy", "SequenceRequest",
           "SequenceService", "Session", "create_policy", "create_service"]
