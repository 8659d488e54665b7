"""The service skeleton every modality shares: a bounded queue, a worker thread, step boundaries.

A service owns a deployment's executables, its retained state and a reference to its
params component. Work arrives as `Job`s; the worker runs passes, and between passes (the
safe boundary) it applies a pending variant selection, admits pending jobs, cancels jobs
whose client left, and, under an abort, fails everything with `Gone`. Under a drain it
finishes every accepted job, then stops.

A pass is plan -> execute -> apply, joined by plain data (vLLM v1's shape):

    plan(jobs)            -> [StepPlan]        which rows run, packed into one stage call each
    execute(plan, params) -> outputs | None    the stage call (a failure fails the plan's jobs)
    apply(plan, outputs)                        advance the jobs, publish, finish
    retire(plan)                                release what `plan` reserved for the call

Modality services (text, embedding, ...) override the three; the base runs each job's own
steps one at a time (the native-only service of a program without its kind's stages).
Construction builds; `start()` starts the worker.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from loomrt.errors import Gone, LoomError, NotFound, QueueFull, Unavailable, internal_error, run_errors
from loomrt.residency import Component, Residency

log = logging.getLogger("loomrt.services")


@dataclass(frozen=True)
class Step:
    stage: str
    inputs: Mapping[str, Any]


@dataclass(frozen=True)
class StepPlan:
    """One stage call of a pass: the jobs taking part (each once; a failed call fails them all),
    the stage's inputs, and the per-row records `apply` reads the outputs back with."""

    stage: str
    jobs: tuple["Job", ...]
    inputs: Mapping[str, np.ndarray]
    rows: tuple[Any, ...] = ()


_job_ids = itertools.count(1)
IDLE_RECHECK_S = 1.0  # a paused worker re-checks this often even if a wake was missed


class Job:
    """One request's work: its steps, run one per pass; `future` gets the list of outputs.

    `id` is process-unique and increasing (what `/v1/requests` pages by); `kind` names what
    the request is (a route, for inspection).
    `on_step(index, outputs)` runs on the worker after each step (streaming, progress);
    `cancel()` (the client left) stops the job at the next boundary with `reason`."""

    def __init__(self, steps: list[Step], on_step: Callable[[int, dict[str, np.ndarray]], None] | None = None,
                 kind: str = "stage"):
        self.id = next(_job_ids)
        self.kind = kind
        self.created = time.time()
        self.model: str | None = None
        self.route: str | None = None      # where it came from, for its event (an HTTP route, say)
        self.steps = list(steps)
        self.on_step = on_step
        self.future: Future = Future()
        self.outputs: list[dict[str, np.ndarray]] = []
        self.cancelled: LoomError | None = None
        self.admitted: float | None = None      # when it left the queue for the active set
        self.first_output: float | None = None  # when its first output token was produced (text)

    @property
    def done_steps(self) -> int:
        return len(self.outputs)

    def describe(self, state: str) -> dict[str, Any]:
        return {"id": self.id, "object": "request", "model": self.model, "kind": self.kind, "state": state,
                "created": round(self.created, 3), "steps": len(self.steps), "steps_done": self.done_steps}

    def cancel(self, reason: LoomError | None = None) -> None:
        self.cancelled = reason or Unavailable("the request was cancelled")

    def outcome(self) -> dict[str, Any]:
        """What the finished request's event reports besides its id, model, kind and duration."""
        return {"steps": len(self.steps), "steps_done": self.done_steps}

    def timings(self) -> dict[str, float]:
        """Milestones for the request's event (latency metrics are built from them): the wait
        from submission to admission and, for a generation, to its first output token."""
        out: dict[str, float] = {}
        if self.admitted is not None:
            out["queue_ms"] = round(1000 * (self.admitted - self.created), 3)
        if self.first_output is not None:
            out["first_token_ms"] = round(1000 * (self.first_output - self.created), 3)
        return out


Outcomes = Callable[[Job, "LoomError | None"], None]
Progress = Callable[[Job, str, dict[str, Any]], None]


class StageService:
    """Runs jobs' stage calls over one deployment's executables, params and state."""

    def __init__(self, model: str, executables: Any, component: Component, residency: Residency,
                 state: dict[str, np.ndarray], pending_capacity: int, *, variant: int | None = None,
                 max_active: int | None = None, outcomes: Outcomes | None = None, progress: Progress | None = None):
        self.model = model
        self.executables = executables
        self.variant = variant
        self.component = component
        self.residency = residency
        self.state = state
        self.pending_capacity = pending_capacity
        self.max_active = max_active            # requests stepped together (the rows); None: no bound
        self._cond = threading.Condition()
        self._pending: collections.deque[Job] = collections.deque()
        self._active: list[Job] = []
        self._selection: tuple[Any, int, Future] | None = None
        self._stopping: str | None = None      # "drain" | "abort"
        self._stopped: Future = Future()
        self.steps_run = 0
        self.step_rows: collections.Counter[int] = collections.Counter()  # stage calls by rows in the call
        self.outcomes = outcomes                # told every finished request (the registry's events)
        self.progress = progress                # told (job, event, fields) of a request's milestones
        self._thread = threading.Thread(target=self._run, name=f"loom-service-{model}", daemon=True)

    def start(self) -> "StageService":
        """Start the worker: construction only builds, so a subclass finishes its own set-up first."""
        self._thread.start()
        return self

    # ---- admission ---------------------------------------------------------------------------

    def submit(self, job: Job) -> Future:
        """Accept a job that can start at the next boundary, or wait in the bounded queue;
        `QueueFull` when neither (with `pending_capacity` 0: whenever it cannot start now)."""
        with self._cond:
            if self._stopping is not None:
                raise Unavailable(f"model '{self.model}' is being removed")
            # Jobs cancelled while pending (their clients left) are dropped at the next boundary;
            # until then they must not hold queue places, or a burst of abandoned requests
            # turns away live ones with 503 (the disconnect storm test).
            waiting = sum(1 for j in self._pending if j.cancelled is None)
            free = waiting + 1 if self.max_active is None else self.max_active - len(self._active)
            if waiting >= max(0, free) + self.pending_capacity:
                raise QueueFull(f"model '{self.model}': the pending queue is full ({self.pending_capacity} "
                                "requests wait already); retry later")
            for step in job.steps:
                if step.stage not in self.executables.programs:
                    raise NotFound(f"model '{self.model}' has no stage '{step.stage}'")
            job.model = self.model
            self._pending.append(job)
            self._cond.notify_all()
        return job.future

    def requests(self) -> list[dict[str, Any]]:
        """The live requests this service owns, oldest first (for `/v1/requests`)."""
        with self._cond:
            return ([j.describe("active") for j in self._active] + [j.describe("pending") for j in self._pending])

    def sessions(self) -> list[dict[str, Any]] | None:
        """Retained sessions, or None when this service retains no text (the base retains none)."""
        return None

    def counts(self) -> dict[str, int]:
        with self._cond:
            return {"pending": len(self._pending), "active": len(self._active), "steps": self.steps_run}

    @property
    def in_flight(self) -> int:
        with self._cond:
            return len(self._pending) + len(self._active)

    # ---- control -----------------------------------------------------------------------------

    def select(self, executables: Any, variant: int) -> Future:
        """Switch executables at the next safe boundary; the future resolves when it happened."""
        done: Future = Future()
        with self._cond:
            self._selection = (executables, variant, done)
            self._cond.notify_all()
        return done

    @property
    def selection_pending(self) -> bool:
        with self._cond:
            return self._selection is not None

    def stop(self, mode: str) -> Future:
        """`drain`: finish accepted jobs, then stop; `abort`: fail them at the next boundary.
        An abort may follow a drain (it upgrades it); the future resolves once the worker ended."""
        with self._cond:
            if self._stopping != "abort":
                self._stopping = mode
            self._cond.notify_all()
        return self._stopped

    # ---- the worker --------------------------------------------------------------------------

    def _boundary(self, settle: list[Callable[[], None]]) -> list[Job]:
        """Under the lock: apply selection, admit pending jobs, drop cancelled ones; the jobs to
        step. Futures are resolved by `settle` after the lock is released: their callbacks may
        take other locks (the registry's), which must never wait on this one."""
        if self._selection is not None:
            executables, variant, done = self._selection
            self._selection = None
            self.executables, self.variant = executables, variant
            settle.append(lambda: done.set_result(variant))
        if self._stopping == "abort":
            for job in list(self._pending) + self._active:
                job.cancel(Gone(f"model '{self.model}' was unregistered (abort) before the request finished"))
        for job in [j for j in self._pending if j.cancelled is not None]:
            self._pending.remove(job)
            settle.append(lambda job=job: self._settle(job, job.cancelled))
        for job in [j for j in self._active if j.cancelled is not None]:
            self._active.remove(job)
            self._released(job)
            settle.append(lambda job=job: self._settle(job, job.cancelled))
        while self._pending and (self.max_active is None or len(self._active) < self.max_active) \
                and self._start(self._pending[0]):
            self._active.append(self._pending.popleft())
            self._active[-1].admitted = time.time()
        return self._runnable(self._active)

    # ---- hooks for modality services (called under the lock, except `_resolve`) -----------------

    def _start(self, job: Job) -> bool:
        """Whether the oldest pending job can start now (a text service reserves its pages here)."""
        return True

    def _released(self, job: Job) -> None:
        """A job left the active set (finished, failed or cancelled): free what it held."""

    def _runnable(self, active: list[Job]) -> list[Job]:
        """The active jobs to step in this pass (a text service skips rows out of output credit)."""
        return list(active)

    def _resolve(self, job: Job, error: LoomError | None) -> None:
        """Deliver a job's outcome (outside the lock)."""
        if error is None:
            job.future.set_result(job.outputs)
        else:
            job.future.set_exception(error)

    def _settle(self, job: Job, error: LoomError | None) -> None:
        """Tell `outcomes` (the request's event), then deliver the outcome: a client that reads
        the journal once it has its response finds the request there. (The other way round, a
        client on a busy machine could read the journal before the event was written.)"""
        try:
            if self.outcomes is not None:
                self.outcomes(job, error)
        finally:
            self._resolve(job, error)

    def wake(self) -> None:
        """Something a paused job waited for happened (a reader took output): look again."""
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            while True:
                settle: list[Callable[[], None]] = []
                with self._cond:
                    while not (self._pending or self._active or self._selection or self._stopping):
                        self._cond.wait()
                    jobs = self._boundary(settle)
                    finished = not self._active and not self._pending and self._stopping is not None
                    if not jobs and not finished and not settle:
                        self._cond.wait(IDLE_RECHECK_S)  # everything active is paused: wait for a wake
                for resolve in settle:
                    resolve()
                if finished:
                    break
                if jobs:
                    self._pass(jobs)
        finally:
            with self._cond:
                selection, self._selection = self._selection, None
            if selection is not None:
                selection[2].set_exception(Gone(f"model '{self.model}' was unregistered"))
            self._stopped.set_result(None)

    def _pass(self, jobs: list[Job]) -> None:
        """One pass with the params held: load them (first use), plan, execute and apply each
        stage call, release, account scratch."""
        try:
            params = self.residency.acquire(self.component)
        except LoomError as exc:
            self._fail_all(jobs, exc)
            return
        try:
            for plan in self.plan(jobs):
                try:
                    outputs = self.execute(plan, params)
                    if outputs is not None:
                        self.steps_run += 1
                        self.step_rows[len(plan.rows) or len(plan.jobs)] += 1
                        self.apply(plan, outputs)
                except LoomError as exc:
                    self._fail_all(plan.jobs, exc)
                finally:
                    self.retire(plan)
        finally:
            self.residency.release(self.component)
            scratch = sum(p.scratch_bytes() for p in self.executables.programs.values())
            self.residency.devices.set(self.component.device.key, self.component.owner, "scratch", scratch)

    # ---- the three phases of a pass (modality services override them) ------------------------------

    def plan(self, jobs: list[Job]) -> Iterable[StepPlan]:
        """The stage calls of this pass, run in order; a generator plans each call after the one
        before it was applied. Here: each job's next step, one call per job."""
        return [StepPlan(job.steps[job.done_steps].stage, (job,), job.steps[job.done_steps].inputs) for job in jobs]

    def execute(self, plan: StepPlan, params: dict[str, Any]) -> dict[str, np.ndarray] | None:
        """The stage call. A failure fails the plan's jobs (the others keep being served) and
        returns None; anything but a LoomError is a bug below us, logged with its traceback."""
        try:
            with run_errors():
                return self._program(plan).run(params, self.state, plan.inputs)
        except LoomError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - a bug below us: report it, keep serving
            error = internal_error(log, f"model '{self.model}': stage '{plan.stage}' failed", exc)
        self._fail_all(plan.jobs, error)
        return None

    def _program(self, plan: StepPlan) -> Any:
        """The program that runs `plan` (an image service picks its size's specialization)."""
        return self.executables.programs[plan.stage]

    def apply(self, plan: StepPlan, outputs: dict[str, np.ndarray]) -> None:
        """Advance the jobs with the call's outputs. Here: the job's step is done."""
        (job,) = plan.jobs
        job.outputs.append(outputs)
        if job.on_step is not None:
            job.on_step(job.done_steps - 1, outputs)
        if job.done_steps == len(job.steps):
            self._finish(job, None)

    def retire(self, plan: StepPlan) -> None:
        """After the call, whatever happened: release what `plan` reserved for it."""

    def _finish(self, job: Job, error: LoomError | None) -> None:
        with self._cond:
            if job in self._active:
                self._active.remove(job)
                self._released(job)
        self._settle(job, error)

    def _fail_all(self, jobs: list[Job], error: LoomError) -> None:
        for job in jobs:
            self._finish(job, error)


__all__ = ["Job", "StageService", "Step", "StepPlan"]
