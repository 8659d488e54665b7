"""The recognition service: finite recordings cut into fixed windows, encoded in batches, decoded in rows.

A `kind: "recognition"` deployment (spec "Audio transcription"; the source contract in
`docs/source-contracts.md`) declares its input geometry as configs (`sample_rate`,
`channels`, `max_input_frames`, `window_samples`) and two stages:

    encode(audio: f32[B, window_samples], slots: i32[B])
        a batch of windows, each written into the per-row state of the slot it will decode in
    decode(tokens, positions, rows, slots, last, begin, suppress, suppress_begin) -> (next: i32[R])
        one packed greedy decoder step over the windows being decoded

A request (`Transcription`) holds its recording at the model's rate, cut into windows of
`window_samples` (the last zero-padded). Each pass plans up to two stage calls:

    encode   the oldest unencoded windows (of any request, in admission order) that free
             slots and the batch bound allow
    decode   every window holding a slot: its prompt on its first step, then its last token

A window whose decoder emits the end token, or reaches its token budget, becomes a segment
(its text from the control program's `recognition_text`) and gives its slot back. When all
of a request's windows are done its segments, in input-time order, joined by newlines, are
its transcript (a window with no text adds no line). Requests share encoder batches and decoder steps while keeping their own
windows, positions and tokens; a cancelled request's windows leave at the next boundary and
free their slots. The per-row state (the window's encoding and decoded keys) is indexed by
slot, so which step row a window has in a step never matters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loomrt.errors import CompileError, InvalidRequest, LoomError
from loomrt.media.audio import Geometry
from loomrt.services import KindSpec
from loomrt.services.base import Job, StageService, StepPlan

ENCODE_STAGE = "encode"
DECODE_STAGE = "decode"
REQUEST_FN = "recognition_request"
TEXT_FN = "recognition_text"
ENCODE_BATCH = 2          # windows per encode call at most: each adds its own buffers, and 4 measured no faster
GEOMETRY_CONFIGS = ("sample_rate", "channels", "max_input_frames", "window_samples")


@dataclass
class Window:
    """One window of a recording: samples [start, start + window) of it, and its decoding."""

    job: "Transcription"
    index: int
    start: int
    slot: int | None = None
    encoded: bool = False
    generated: list[int] = field(default_factory=list)
    done: bool = False
    text: str = ""


@dataclass(frozen=True)
class PreparedRecognition:
    prompt: list[int]
    suppress: np.ndarray
    suppress_begin: np.ndarray
    eot: int
    max_new_tokens: int


class Transcription(Job):
    """One recording to transcribe: float32 samples at the model's rate (mono: 1-D)."""

    def __init__(self, samples: np.ndarray, prepared: PreparedRecognition, window_samples: int, *,
                 kind: str = "transcription"):
        super().__init__([], kind=kind)
        self.samples = samples
        self.prompt = prepared.prompt
        self.prepared = prepared
        count = max(1, math.ceil(len(samples) / window_samples))
        self.windows = [Window(self, i, i * window_samples) for i in range(count)]
        self.segments: list[str] = []

    @property
    def frames(self) -> int:
        return len(self.samples)

    def outcome(self) -> dict[str, Any]:
        return {"frames": self.frames, "windows": len(self.windows),
                "completion_tokens": sum(len(w.generated) for w in self.windows)}

    def describe(self, state: str) -> dict[str, Any]:
        out = super().describe(state)
        out.update(frames=self.frames, windows=len(self.windows), windows_done=sum(w.done for w in self.windows))
        return out


class RecognitionService(StageService):
    def __init__(self, *args: Any, window_samples: int, slots: int, policy: Any, encode_batch: int = ENCODE_BATCH,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.window_samples = window_samples
        self.free_slots = list(range(slots))
        self.policy = policy
        self.encode_batch = encode_batch
        self.windows_done = 0

    def submit(self, job: Job) -> Any:
        if not isinstance(job, Transcription):
            raise InvalidRequest("a recognition deployment serves transcriptions")
        return super().submit(job)

    def counts(self) -> dict[str, int]:
        out = super().counts()
        with self._cond:
            out.update(slots_free=len(self.free_slots), windows_done=self.windows_done)
        return out

    def _released(self, job: Transcription) -> None:
        for w in job.windows:
            if w.slot is not None:
                self.free_slots.append(w.slot)
                w.slot = None

    def _resolve(self, job: Transcription, error: LoomError | None) -> None:
        if error is None:
            # a window that held no speech gives no segment (no empty line in the transcript)
            job.future.set_result({"text": "\n".join(w.text for w in job.windows if w.text.strip()), "segments": [
                {"index": w.index, "start": w.start, "end": min(w.start + self.window_samples, job.frames),
                 "text": w.text, "tokens": len(w.generated)} for w in job.windows]})
        else:
            job.future.set_exception(error)

    # ---- one pass: plan -> execute -> apply ------------------------------------------------------

    def plan(self, jobs: list[Transcription]) -> list[StepPlan]:
        plans = []
        with self._cond:
            fresh = [w for job in jobs if job.cancelled is None for w in job.windows
                     if w.slot is None and not w.done][:min(self.encode_batch, len(self.free_slots))]
            for w in fresh:
                w.slot = self.free_slots.pop(0)
        if fresh:
            audio = np.zeros((len(fresh), self.window_samples), np.float32)
            for i, w in enumerate(fresh):
                piece = w.job.samples[w.start:w.start + self.window_samples]
                audio[i, :len(piece)] = piece
            plans.append(StepPlan(ENCODE_STAGE, tuple(dict.fromkeys(w.job for w in fresh)),
                                  {"audio": audio, "slots": np.array([w.slot for w in fresh], np.int32)}, tuple(fresh)))
        decoding = [w for job in jobs if job.cancelled is None for w in job.windows
                    if w.encoded and not w.done and w.slot is not None]
        # Rows share a step when their requests' suppress lists agree (one pair per step).
        groups: dict[bytes, list[Window]] = {}
        for w in decoding:
            key = w.job.prepared.suppress.tobytes() + b"|" + w.job.prepared.suppress_begin.tobytes()
            groups.setdefault(key, []).append(w)
        plans += [self._decode_plan(group) for group in groups.values()]
        return plans

    def _decode_plan(self, windows: list[Window]) -> StepPlan:
        tokens: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        last = np.zeros(len(windows), np.int32)
        for r, w in enumerate(windows):
            feed = w.job.prompt if not w.generated else [w.generated[-1]]
            start = 0 if not w.generated else len(w.job.prompt) + len(w.generated) - 1
            tokens += feed
            positions += range(start, start + len(feed))
            rows += [r] * len(feed)
            last[r] = len(tokens) - 1
        prepared = windows[0].job.prepared
        inputs = {"tokens": np.array(tokens, np.int32), "positions": np.array(positions, np.int32),
                  "rows": np.array(rows, np.int32), "slots": np.array([w.slot for w in windows], np.int32),
                  "last": last, "begin": np.array([int(not w.generated) for w in windows], np.int32),
                  "suppress": prepared.suppress, "suppress_begin": prepared.suppress_begin}
        return StepPlan(DECODE_STAGE, tuple(dict.fromkeys(w.job for w in windows)), inputs, tuple(windows))

    def apply(self, plan: StepPlan, outputs: dict[str, np.ndarray]) -> None:
        if plan.stage == ENCODE_STAGE:
            for w in plan.rows:
                w.encoded = True
            return
        finished = []
        for r, w in enumerate(plan.rows):
            token = int(outputs["next"][r])
            if token == w.job.prepared.eot:
                finished.append(w)
                continue
            w.generated.append(token)
            if len(w.generated) >= w.job.prepared.max_new_tokens:
                finished.append(w)
        for w in finished:
            w.text = self.policy.text(w.generated)
            with self._cond:
                w.done = True
                self.free_slots.append(w.slot)
                w.slot = None
                self.windows_done += 1
        for job in dict.fromkeys(w.job for w in finished):
            if all(w.done for w in job.windows):
                self._finish(job, None)

    def retire(self, plan: StepPlan) -> None:
        """An encode call that failed gives its windows' slots back (their jobs failed with it)."""
        if plan.stage == ENCODE_STAGE:
            with self._cond:
                for w in plan.rows:
                    if not w.encoded and w.slot is not None:
                        self.free_slots.append(w.slot)
                        w.slot = None


# ---- the kind's policy and entry points ------------------------------------------------------------------

def _contract_error(message: str) -> LoomError:
    return LoomError(f"the control program's {REQUEST_FN}() broke the recognition contract: {message}")


class RecognitionPolicy:
    """The control program's request preparation and segment text, and the source's geometry."""

    def __init__(self, control: Any, tokenizer: Any, geometry: Geometry, window_samples: int, vocab_size: int):
        for fn in (REQUEST_FN, TEXT_FN):
            if not control.has(fn):
                raise CompileError(f"a recognition deployment's control program needs fn {fn} "
                                   "(docs/source-contracts.md, recognition)")
        self.control, self.tokenizer = control, tokenizer
        self.geometry, self.window_samples, self.vocab_size = geometry, window_samples, vocab_size

    def prepare(self, options: dict[str, Any]) -> PreparedRecognition:
        result = self.control.call(REQUEST_FN, [options, self.tokenizer])
        if not isinstance(result, dict):
            raise _contract_error("it must return a map")
        try:
            prompt = [int(t) for t in result["prompt"]]
            suppress = np.array(result["suppress"], np.int32)
            suppress_begin = np.array(result["suppress_begin"], np.int32)
            eot, budget = int(result["eot"]), int(result["max_new_tokens"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise _contract_error("it returns prompt, suppress and suppress_begin (lists of token ids), eot and "
                                  "max_new_tokens (integers)") from None
        if not prompt or budget < 1:
            raise _contract_error("the prompt must not be empty and max_new_tokens must be positive")
        return PreparedRecognition(prompt, suppress, suppress_begin, eot, budget)

    def text(self, ids: list[int]) -> str:
        text = self.control.call(TEXT_FN, [list(ids), self.tokenizer])
        if not isinstance(text, str):
            raise LoomError(f"the control program's {TEXT_FN}() must return a string")
        return text


def geometry_of(module: Any, model: str) -> tuple[Geometry, int]:
    values = {name: module.config(name) for name in GEOMETRY_CONFIGS}
    bad = [name for name, v in values.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if bad:
        raise CompileError(f"model '{model}': a recognition program declares positive integer configs "
                           f"{', '.join(GEOMETRY_CONFIGS)} (missing or invalid: {', '.join(bad)})")
    return Geometry(values["sample_rate"], values["channels"], values["max_input_frames"]), values["window_samples"]


def create_policy(reg: Any, executables: Any, tokenizer: Any) -> RecognitionPolicy:
    from loomrt.control import Control

    if tokenizer is None:
        raise CompileError(f"model '{reg.name}': a recognition deployment needs a tokenizer")
    geometry, window = geometry_of(executables.module, reg.name)
    return RecognitionPolicy(Control(executables.control), tokenizer, geometry, window,
                             tokenizer.get_vocab_size(with_added_tokens=True))


def create_service(reg: Any, component: Any, residency: Any, state: dict, **common: Any) -> RecognitionService:
    slots = reg.document.rows or 1
    common["max_active"] = common.get("max_active") or slots
    return RecognitionService(reg.name, reg.executables, component, residency, state, reg.document.pending_capacity,
                              window_samples=reg.policy.window_samples, slots=slots, policy=reg.policy, **common)


KIND = KindSpec("recognition", (ENCODE_STAGE, DECODE_STAGE), create_policy, create_service, route="audio",
                state_scopes=("row",))

__all__ = ["KIND", "PreparedRecognition", "RecognitionPolicy", "RecognitionService", "Transcription", "Window",
           "create_policy", "create_service", "geometry_of"]
