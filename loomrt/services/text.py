"""The text service: continuous batching of generations over rows and a shared KV page pool.

Every pass packs one step for the stage `prefill_decode` (the text source contract,
`docs/source-contracts.md`): each decoding row contributes its last sampled token, and
prompts contribute chunks from a per-step budget, so prefill and decode share steps and
requests join and leave between them. Only the selected token ids come back to the host.
Each generation reserves its KV pages when it starts (prompt + output budget, capped by the
context) and frees them when it ends, fails or is cancelled.

Output goes through a bounded `Outbox` per generation: a row whose reader has not taken
`credit` events is skipped by the scheduler until it does, so a slow reader pauses only its
own row. Text deltas come from incremental detokenization, passed through the control
program's `publish` policy (safe boundaries, tool calls, reasoning split) when it has one.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from loomrt.detokenize import IncrementalDecoder
from loomrt.errors import CompileError, Conflict, InvalidRequest, LoomError, NotFound
from loomrt.image_input import ImageSlot
from loomrt.kv import PagePool
from loomrt.pins import Checkpoint, PinControls, Pins
from loomrt.prefixes import PrefixCache
from loomrt.services import KindSpec
from loomrt.services.base import Job, StageService, StepPlan
from loomrt.services.outbox import Outbox
from loomrt.services.packing import TokenRow, pack_rows
from loomrt.sessions import ORDERS, HistoryStore

STEP_STAGE = "prefill_decode"
PUBLISH_FN = "publish"
PREFILL_CHUNK = 256


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


class Generation(Job):
    """One chat generation: prompt ids, output budget, sampling, stop ids, policy state."""

    def __init__(self, prompt: list[int], max_tokens: int, sampling: Sampling, stop_ids: list[int] | tuple = (),
                 policy_state: Any = None, *, outbox: Outbox | None = None, kind: str = "chat",
                 session: str | None = None, checkpoint: str | None = None, images: tuple[ImageSlot, ...] = ()):
        super().__init__([], kind=kind)
        self.session = session
        self.checkpoint = checkpoint            # X-Loom-Checkpoint: continue from this endpoint
        self._from: Any = None                  # the Checkpoint object, resolved at admission
        self.prompt = [int(t) for t in prompt]
        self.images = tuple(images)             # the prompt's image positions (loomrt/image_input.py)
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.seed = sampling.seed if sampling.seed is not None else secrets.randbits(64)
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.policy_state = policy_state
        self.outbox = outbox or Outbox()
        self.generated: list[int] = []
        self.kv = 0                         # positions written to the KV cache
        self.pages: list[int] = []
        self.decoder: IncrementalDecoder | None = None
        self.published = ""
        self.reasoning = ""
        self.finish_reason: str | None = None
        self.tool_calls: list[dict[str, Any]] | None = None
        self.cached_tokens = 0
        self.cache_source: str | None = None    # where cached_tokens came from: prefix, retained, checkpoint
        self.order = next(ORDERS) if session is not None else 0   # its place in /v1/sessions while busy
        self._ancestor: Any = None              # the prefix-cache entry this generation started from
        self._own_prefix: Any = None            # the entry holding this generation's latest boundary
        self._wake = lambda: None

    @property
    def prefilled(self) -> bool:
        return self.kv >= len(self.prompt)

    def cancel(self, reason: LoomError | None = None) -> None:
        super().cancel(reason)
        self._wake()

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": len(self.prompt), "completion_tokens": len(self.generated),
                "total_tokens": len(self.prompt) + len(self.generated),
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def describe(self, state: str) -> dict[str, Any]:
        out = super().describe(state)
        out.update(prompt_tokens=len(self.prompt), completion_tokens=len(self.generated), pages=len(self.pages))
        if self.images:
            out.update(images=len(self.images), images_projected=self._images_projected())
        return out

    def _images_projected(self) -> int:
        return sum(s.projected for s in self.images)

    def outcome(self) -> dict[str, Any]:
        out = {"stream": self.outbox.deltas, "prompt_tokens": len(self.prompt),
               "completion_tokens": len(self.generated), "cached_tokens": self.cached_tokens,
               "cache_source": self.cache_source}
        if self.images:
            out.update(images=len(self.images), images_projected=self._images_projected(),
                       images_reused=sum(s.end <= self.cached_tokens for s in self.images))
        if self.finish_reason is not None:
            out["finish_reason"] = self.finish_reason
        return out


@dataclass(frozen=True)
class TextRow(TokenRow):
    """A row of a text step: a prefill chunk or a decode token; `sample` when the step's
    sampled token is the row's next output (a decode row, or a prompt's last chunk)."""

    sample: bool = False


class TextService(PinControls, StageService):
    """`page_states` are the `per page` states a generation's pages index (the KV cache): the
    pool sizes from them, and retained histories, prefixes and checkpoints copy only them."""

    def __init__(self, *args: Any, tokenizer: Any, control: Any, page_size: int, context_length: int,
                 page_states: list[str], prefill_chunk: int = PREFILL_CHUNK, session_cache_capacity: int = 0,
                 checkpoint_capacity: int = 0, checkpoint_backing: str = "elastic", prefix_cache_capacity: int = 0,
                 projector: Any = None, embed_dim: int = 0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.projector = projector          # an ImageProjector when the deployment takes images
        self.embed_dim = embed_dim          # the width of the step stage's `embeds` (0: it has none)
        self.tokenizer = tokenizer
        self.control = control
        self.context_length = context_length
        self.prefill_chunk = prefill_chunk
        self.has_publish = control is not None and control.has(PUBLISH_FN)
        paged = {name: self.state[name] for name in page_states}
        self.pool = PagePool(next(iter(paged.values())).shape[0] if paged else 0, page_size)
        self.pages_per_row = self.pool.pages_for(context_length)
        self.histories = HistoryStore(self.pool, paged, self.max_active or 1, session_cache_capacity)
        self.prefixes = PrefixCache(self.pool, paged, prefix_cache_capacity, stride=max(prefill_chunk, 1))
        self.paged = paged
        self.pins = Pins(self.model, checkpoint_capacity, self.pool, paged, checkpoint_backing)

    # ---- admission ---------------------------------------------------------------------------

    def submit(self, job: Job) -> Any:
        if not isinstance(job, Generation):
            raise InvalidRequest("a text deployment serves generations")
        if not job.prompt:
            raise InvalidRequest("the rendered prompt is empty: nothing to continue from")
        if job.images and self.projector is None:
            raise InvalidRequest("this deployment does not project images", param="messages")
        if len(job.prompt) > self.context_length:
            raise InvalidRequest(f"the prompt needs {len(job.prompt)} tokens, but model '{self.model}' has a "
                                 f"context of {self.context_length} tokens per request", param="messages")
        job._wake = self.wake
        job.outbox.wake_worker = self.wake
        with self._cond:
            self.pins.check_fits(self.pool.pages_for(min(len(job.prompt) + job.max_tokens, self.context_length)))
            if job.session is not None and any(j.session == job.session
                                               for j in list(self._active) + list(self._pending)):
                raise Conflict(f"session {job.session!r} of model '{self.model}' is in use by another request",
                               param="X-Loom-Session")
            if job.checkpoint is not None:
                point = self.pins.points.get(job.checkpoint)
                if point is None:
                    raise NotFound(f"model '{self.model}' has no checkpoint {job.checkpoint!r}",
                                   param="X-Loom-Checkpoint")
                if job.prompt[:len(point.tokens)] != point.tokens or len(job.prompt) <= len(point.tokens):
                    raise InvalidRequest(f"the request's history does not extend checkpoint {job.checkpoint!r} "
                                         f"({len(point.tokens)} tokens): send the checkpoint's full history plus "
                                         "new messages", param="X-Loom-Checkpoint")
                job._from = point
            return super().submit(job)

    # ---- named checkpoints (loomrt.pins) --------------------------------------------------------

    def pin(self, name: str, session: str) -> Checkpoint:
        """Pin the idle history of `session` as checkpoint `name`: a copy of its KV in pool pages
        the pin owns (idle caches yield pages for it; running requests and pins do not)."""
        with self._cond:
            self.pins.require_enabled()
            if any(j.session == session for j in list(self._active) + list(self._pending)):
                raise Conflict(f"session {session!r} is busy: pin it once its request finished", param="X-Loom-Session")
            history = next((h for h in self.histories.histories if h.session == session), None)
            if history is None:
                raise NotFound(f"model '{self.model}' has no retained session {session!r}", param="X-Loom-Session")
            point = Checkpoint(name, session, len(history.tokens), tokens=list(history.tokens),
                               pending=history.pending)
            self.pins.pin(point, history.pages if history.in_row else history.snapshot,
                          lambda n: self.histories.free_pages(n, self.prefixes.reclaim_one, keep=history))
            self._account_host()
            return point

    def _account_host(self) -> None:
        """Charge the host images (suspended pins, session-cache snapshots) to the host ledger."""
        host = self.pins.host_bytes + self.histories.snapshot_bytes()
        self.residency.devices.set("cpu", self.component.owner, "snapshots", host)

    def sessions(self) -> list[dict[str, Any]]:
        with self._cond:
            listing = self.histories.listing()
            busy_jobs = [j for j in list(self._active) + list(self._pending) if j.session is not None]
        busy = {j.session for j in busy_jobs}
        for item in listing:
            item.update(object="session", model=self.model, busy=item["session"] in busy)
        listed = {i["session"] for i in listing}
        for job in busy_jobs:
            if job.session not in listed:
                listing.append({"object": "session", "session": job.session, "model": self.model, "position": None,
                                "residency": "active", "busy": True, "order": job.order})
        return listing

    def counts(self) -> dict[str, int]:
        out = super().counts()
        with self._cond:
            out.update(pages_used=self.pool.used, pages_free=self.pool.free, rows=self.max_active or 0,
                       retained=len(self.histories.histories),
                       pages_retained=sum(len(h.pages) for h in self.histories.histories),
                       snapshot_bytes=self.histories.snapshot_bytes(),
                       prefixes=len(self.prefixes.entries), pages_prefixes=self.prefixes.pages_held,
                       checkpoints=len(self.pins), pages_checkpoints=self.pins.pages_held,
                       checkpoint_host_bytes=self.pins.host_bytes)
        return out

    def _start(self, job: Generation) -> bool:
        """Reserve the job's row and pages, continuing the retained history or cached prefix
        that shares the most tokens with the prompt."""
        if job._from is not None:
            started = self._start_from_checkpoint(job, job._from)
            self._account_host()
            return started
        prefix, from_prefix = self.prefixes.match(job.prompt)
        history, reused = self.histories.take(job.prompt, job.session)
        if from_prefix > reused:      # the history stays retained as it is
            if history is not None:
                self.histories.histories.append(history)
            history, reused = None, from_prefix
        else:
            prefix = None
        need = self.pool.pages_for(min(len(job.prompt) + job.max_tokens, self.context_length))
        kept = self.pool.pages_for(reused) if reused and history is not None else 0
        own: list[int] = []
        if history is not None and history.in_row:
            own = history.pages[:kept]
            self.pool.release(history.pages[kept:])
            history.pages = []
        if not self.histories.make_room(len(self._active), need - len(own),
                                        reclaim=lambda: self.prefixes.reclaim_one(keep=prefix)):
            if history is not None:   # wait for rows or pages; what was matched stays retained
                if history.in_row:
                    self.histories.keep(history.tokens[:reused], own, history.session)
                else:
                    self.histories.histories.append(history)
            return False
        fresh = self.pool.reserve_pages(need - len(own))
        if prefix is not None:
            self.prefixes.copy_into(prefix, fresh, reused)
            job._ancestor = prefix
        elif history is not None and not history.in_row and reused:
            self.histories.restore(history, fresh, reused)
        job.pages = own + fresh
        job.kv = job.cached_tokens = reused
        for slot in job.images:
            if slot.end <= reused:      # its positions came from the cache: no pixels needed
                slot.rgb = None
        job.cache_source = "prefix" if prefix is not None else "retained" if history is not None and reused else None
        job.decoder = IncrementalDecoder(self.tokenizer)
        if self.histories.session_cache_capacity:
            self._account_host()
        return True

    def _offer_prefix(self, g: Generation) -> None:
        """After a prefill chunk: keep the state at a natural boundary, or at the prompt's end."""
        at_end = g.kv == len(g.prompt)
        natural = g.kv % self.prefixes.stride == 0
        if natural or at_end:
            g._own_prefix = self.prefixes.offer(g.prompt[:g.kv], g.pages, natural=natural,
                                                ancestor=g._ancestor, own=g._own_prefix)

    def _start_from_checkpoint(self, job: Generation, point: Checkpoint) -> bool:
        """Fork (another session) or rewind (the same session): fresh pages get a copy of the
        checkpoint's KV; the destination's old history is replaced only when this finishes. A
        suspended pin is resumed into new pages first when idle caches can make room."""
        need = self.pool.pages_for(min(len(job.prompt) + job.max_tokens, self.context_length))
        if not self.histories.make_room(len(self._active), need, reclaim=self.prefixes.reclaim_one):
            return False
        job.pages = self.pool.reserve_pages(need)
        reused = len(point.tokens)
        self.pins.warm(point, lambda n: self.histories.free_pages(n, self.prefixes.reclaim_one))
        self.pins.copy_into(point, job.pages)
        job.kv = job.cached_tokens = reused
        for slot in job.images:
            if slot.end <= reused:
                slot.rgb = None
        job.cache_source = "checkpoint"
        job.decoder = IncrementalDecoder(self.tokenizer)
        return True

    def _released(self, job: Generation) -> None:
        """A finished generation's row stays resident as a history; a failed one is freed."""
        if job.finish_reason is not None and job.cancelled is None:
            held = self.pool.pages_for(job.kv)
            self.pool.release(job.pages[held:])
            written = job.prompt + job.generated
            self.histories.keep(written[:job.kv], job.pages[:held], job.session,
                                pending=written[job.kv] if len(written) > job.kv else None)
        else:
            self.pool.release(job.pages)
        job.pages = []
        if self.histories.session_cache_capacity:
            self._account_host()

    def _runnable(self, active: list[Job]) -> list[Job]:
        return [g for g in active if g.cancelled is None and (not g.prefilled or g.outbox.has_credit())]

    def _resolve(self, job: Generation, error: LoomError | None) -> None:
        if error is None:
            payload = {"finish_reason": job.finish_reason, "usage": job.usage(), "content": job.published,
                       "reasoning_content": job.reasoning or None, "tool_calls": job.tool_calls}
            job.outbox.put("done", payload)
            job.future.set_result(payload)
        else:
            job.outbox.put("error", error)
            job.future.set_exception(error)

    # ---- one step: plan -> execute -> apply ---------------------------------------------------

    def plan(self, jobs: list[Generation]) -> list[StepPlan]:
        """One packed step: every decoding row's last token, then prompt chunks from the
        step's prefill budget (ended at the prefix cache's natural boundaries when it keeps
        any), oldest generation first."""
        rows: list[TextRow] = []
        for g in jobs:
            if g.prefilled:
                rows.append(TextRow(g, (g.generated[-1],), g.kv, tuple(g.pages), sample=True))
        budget = max(self.prefill_chunk, 1)
        for g in jobs:
            if not g.prefilled and budget > 0:
                n = min(len(g.prompt) - g.kv, budget)
                if self.prefixes.enabled:
                    n = min(n, self.prefixes.stride - g.kv % self.prefixes.stride)
                budget -= n
                rows.append(TextRow(g, tuple(max(t, 0) for t in g.prompt[g.kv:g.kv + n]), g.kv, tuple(g.pages),
                                    sample=g.kv + n == len(g.prompt)))
        rows = self._project(rows)
        if not rows:
            return []
        inputs = pack_rows(rows, self.pages_per_row)
        if self.embed_dim:
            inputs.update(self._placed(rows))
        sampling = [r.job.sampling for r in rows]
        inputs.update(temperature=np.array([s.temperature for s in sampling], np.float32),
                      top_p=np.array([s.top_p for s in sampling], np.float32),
                      top_k=np.array([s.top_k for s in sampling], np.int32),
                      seed=np.array([r.job.seed for r in rows], np.uint64),
                      counter=np.array([len(r.job.generated) for r in rows], np.uint64))
        return [StepPlan(STEP_STAGE, tuple(r.job for r in rows), inputs, tuple(rows))]

    def _project(self, rows: list[TextRow]) -> list[TextRow]:
        """Project, as one cohort, the images whose positions this step's prefill chunks reach
        and that have no rows yet; a generation whose image fails (a decode error) fails alone."""
        needed = [s for r in rows if not r.job.prefilled for s in r.job.images
                  if s.embeds is None and s.start < r.start + len(r.tokens) and r.start < s.end]
        if not needed or self.projector is None:
            return rows
        failed = self.projector.project(needed, self.executables)
        if not failed:
            return rows
        broken = {}
        for r in rows:
            error = next((failed[s] for s in r.job.images if s in failed), None)
            if error is not None:
                broken[r.job] = error
        for g, error in broken.items():
            self._finish(g, error)
        return [r for r in rows if r.job not in broken]

    def _placed(self, rows: list[TextRow]) -> dict[str, np.ndarray]:
        """`embeds` and `embed_at`: the projected rows of the image positions packed in this step."""
        parts, at, t0 = [], [], 0
        for r in rows:
            end = r.start + len(r.tokens)
            for s in r.job.images if not r.job.prefilled else ():
                lo, hi = max(s.start, r.start), min(s.end, end)
                if lo < hi:
                    parts.append(np.asarray(s.embeds[lo - s.start:hi - s.start], np.float32))
                    at.extend(range(t0 + lo - r.start, t0 + hi - r.start))
            t0 += len(r.tokens)
        embeds = np.concatenate(parts) if parts else np.zeros((0, self.embed_dim), np.float32)
        return {"embeds": np.ascontiguousarray(embeds), "embed_at": np.array(at, np.int32)}

    def apply(self, plan: StepPlan, outputs: dict[str, np.ndarray]) -> None:
        for r, row in enumerate(plan.rows):
            g = row.job
            prefilling = not g.prefilled
            g.kv += len(row.tokens)
            for s in g.images if prefilling else ():
                if s.end <= g.kv:
                    s.embeds = None       # its positions are in the cache now
            if prefilling and self.prefixes.enabled:
                self._offer_prefix(g)
            if row.sample:
                self._advance(g, int(outputs["next"][r]))

    def _advance(self, g: Generation, token: int) -> None:
        if not g.generated:
            g.first_output = time.time()
        g.generated.append(token)
        try:
            if token in g.stop_ids:
                self._complete(g, "stop")
                return
            delta = g.decoder.push(token)
            if delta:
                self._publish(g, final=False)
            if len(g.generated) >= g.max_tokens or len(g.prompt) + len(g.generated) > self.context_length:
                self._complete(g, "length")
        except LoomError as exc:
            self._finish(g, exc)

    def _publish(self, g: Generation, final: bool) -> None:
        text = g.decoder.text
        if not self.has_publish:
            content, reasoning, calls = text, "", None
        else:
            result = self.control.call(PUBLISH_FN, [g.policy_state, text, final])
            if not isinstance(result, dict) or not isinstance(result.get("content", ""), str):
                raise LoomError("the control program's publish() must return a map with a string 'content'")
            content = result.get("content", "")
            reasoning = result.get("reasoning_content") or ""
            calls = result.get("tool_calls") if final else None
        if not content.startswith(g.published) or not reasoning.startswith(g.reasoning):
            raise LoomError("the control program's publish() withdrew text it had already published")
        delta, reasoning_delta = content[len(g.published):], reasoning[len(g.reasoning):]
        g.published, g.reasoning = content, reasoning
        if delta or reasoning_delta:
            event: dict[str, Any] = {}
            if reasoning_delta:
                event["reasoning_content"] = reasoning_delta
            if delta:
                event["content"] = delta
            g.outbox.put("delta", event)
        if final and calls:
            g.tool_calls = _tool_calls(g, calls)

    def _complete(self, g: Generation, reason: str) -> None:
        g.decoder.flush()
        self._publish(g, final=True)
        g.finish_reason = "tool_calls" if g.tool_calls else reason
        self._finish(g, None)


def _tool_calls(g: Generation, calls: Any) -> list[dict[str, Any]]:
    import json

    if not isinstance(calls, list):
        raise LoomError("the control program's publish() returned tool_calls that are not a list")
    out = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise LoomError("each tool call from publish() needs a string 'name'")
        arguments = call.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append({"id": f"call_{g.id}_{i}", "type": "function",
                    "function": {"name": call["name"], "arguments": arguments}})
    return out




def image_stages(module: Any) -> tuple[str, ...]:
    """The stages that project images (text source contract, "Image input"): each takes one
    `pixels: u8[B, S, S, C]` and returns `embeds` (B x positions rows)."""
    return tuple(sorted(name for name, stage in module.stages.items()
                        if [a.name for a in stage.args] == ["pixels"] and stage.args[0].dtype == "u8"
                        and len(stage.args[0].dims) == 4 and [r.name for r in stage.results] == ["embeds"]))


def image_support(reg: Any, module: Any) -> str | None:
    """Why a text deployment cannot take images, or None when it can: it declares the `image`
    component, a `fit` stage and image stages, and its step stage places `embeds` at `embed_at`."""
    from loomrt.image_input import FIT_STAGE

    if reg.document.image is None:
        return "it declares no image component"
    step = {a.name for a in module.stages[STEP_STAGE].args} if STEP_STAGE in module.stages else set()
    missing = [what for what, ok in ((f"a '{FIT_STAGE}' stage", FIT_STAGE in module.stages),
                                     ("an image stage (pixels -> embeds)", bool(image_stages(module))),
                                     (f"'embeds' and 'embed_at' inputs of {STEP_STAGE}", {"embeds", "embed_at"} <= step))
               if not ok]
    return f"its program lacks {', '.join(missing)}" if missing else None


def create_policy(reg: Any, executables: Any, tokenizer: Any) -> Any:
    """The text policy (the control program's `chat_request`) over the deployment's tokenizer,
    with image input when the program supports it."""
    from loomrt.control import Control
    from loomrt.image_input import ImageInput
    from loomrt.policy import TextPolicy

    if tokenizer is None:
        raise CompileError(f"model '{reg.name}': a text deployment needs a tokenizer")
    control = Control(executables.control)
    refusal = image_support(reg, executables.module)
    images = ImageInput(control, image_stages(executables.module)) if refusal is None else None
    return TextPolicy(control, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True), images,
                      refusal or "")


def create_service(reg: Any, component: Any, residency: Any, state: dict, **common: Any) -> TextService:
    from loomrt.state import page_size

    module = reg.executables.module
    step = {a.name: a for a in module.stages[STEP_STAGE].args}
    embed_dim = step["embeds"].dims[1].constant if "embeds" in step else 0
    projector = None
    if reg.policy.images is not None:
        from loomrt.services.projection import ImageProjector

        projector = ImageProjector(reg.name, residency, reg.components["image"], reg.policy.images)
    return TextService(reg.name, reg.executables, component, residency, state, reg.document.pending_capacity,
                       tokenizer=reg.tokenizer, control=reg.policy.control, page_size=page_size(module),
                       page_states=[s.name for s in module.stage_states(STEP_STAGE) if s.scope == "page"],
                       context_length=reg.document.context_length,
                       session_cache_capacity=reg.document.session_cache_capacity,
                       checkpoint_capacity=reg.document.checkpoint_capacity,
                       checkpoint_backing=reg.document.checkpoint_backing,
                       prefix_cache_capacity=reg.document.prefix_cache_capacity, projector=projector,
                       embed_dim=embed_dim, **common)


KIND = KindSpec("text", (STEP_STAGE,), create_policy, create_service, route="chat")

__all__ = ["KIND", "Generation", "Outbox", "Sampling", "TextService", "create_policy", "create_service"]
