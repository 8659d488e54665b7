"""The speech service: text cut into blocks (sentences) by the source, synthesized block by block,
each block's PCM handed to its reader as soon as it is computed.

A `kind: "speech"` deployment (spec "Speech synthesis"; the source contract in
`docs/source-contracts.md`) declares a config `sample_rate` and two stages:

    durations(ids: i32[L], rows: i32[L], speed: f32[R]) -> (dur: i32[L], ..., frames: i32[R])
        the length of every block packed in the call: `frames[r]` output frames for row r, and
        per-id values (every other output, the ids on its first axis: `dur`, and whatever else
        the source computes once per id) the host hands back to `synthesize` untouched
    synthesize(ids: i32[L], rows: i32[L], dur: i32[L], ..., frame_rows: i32[F], seed: u64[R],
               counter: u64[R]) -> (pcm: i16[F, H])
        the blocks' waveforms: H PCM16 samples per output frame, frame f belonging to row
        frame_rows[f]; `seed` is the request's, `counter` the block's index in its request

The control program's `speech_request(options, tok)` turns a request's input, voice, speed,
seed and instructions into blocks of ids (`tok` is the deployment's tokenizer: for hibari,
its phonemizer) or rejects them. A request (`Utterance`) then moves its blocks through the
two stages in order; each pass packs, across requests, the blocks whose length is not known
yet (of a request not yet heard, its first block alone: `_to_measure`) into one `durations`
call and the next block of every request that has room in its output into one `synthesize`
call, so requests that arrive while others are being spoken join the next call. A request already heard also sends its following blocks along, as many
as its reader has room for, while the call is short (`_following`). A block's rows never mix
with another's: the stages compute each row from its own ids, seed and counter, so a block's
samples do not depend on what shared the call. A request whose reader has left `credit` blocks untaken sits out `synthesize` until
the reader catches up; a cancelled one leaves at the next boundary.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from loomrt.errors import CompileError, InvalidRequest, LoomError
from loomrt.services import KindSpec
from loomrt.services.base import Job, StageService, StepPlan
from loomrt.services.outbox import Outbox

DURATIONS_STAGE = "durations"
SYNTHESIZE_STAGE = "synthesize"
REQUEST_FN = "speech_request"
VOICES_FN = "speech_voices"
FALLBACK_STAGE = "g2p_fallback"      # optional: the phonemizer's out-of-vocabulary reader
FALLBACK_COMPONENT = "phonemizer"
STEP_IDS = 2048          # ids per `durations` call at most (a longer block runs alone)
STEP_FRAMES = 4096       # output frames per `synthesize` call at most (a longer block runs alone)
FOLLOWING_FRAMES = 2048  # frames of a call past which no request's later blocks join it (`_following`)
BLOCK_CREDIT = 4         # blocks a reader may leave untaken before its request pauses
MAX_BLOCKS = 4096        # blocks one request may have
MAX_BLOCK_FRAMES = 1 << 18   # output frames one block may have (a broken duration stage fails only its request)


@dataclass(frozen=True)
class PreparedSpeech:
    blocks: tuple[tuple[int, ...], ...]
    speed: float
    seed: int


@dataclass
class Block:
    """One block of a request: its ids, then its length (and per-id values), then its samples."""

    job: "Utterance"
    index: int
    ids: np.ndarray
    carried: dict[str, np.ndarray] | None = None   # `durations`' per-id outputs, for `synthesize`
    frames: int = 0


class Utterance(Job):
    """One speech request: its blocks, synthesized in order, each handed to `outbox` as PCM16LE bytes."""

    def __init__(self, prepared: PreparedSpeech, *, outbox: Outbox | None = None, kind: str = "speech"):
        super().__init__([], kind=kind)
        self.prepared = prepared
        self.blocks = [Block(self, i, np.asarray(ids, np.int32)) for i, ids in enumerate(prepared.blocks)]
        self.next_block = 0                 # the first block not yet synthesized
        self.outbox = outbox or Outbox(BLOCK_CREDIT)
        self.samples = 0
        self.first_sent = False             # its reader wrote its first audio (the route tells `report`)
        self.report: Any = lambda event, fields: None   # the service's journal of milestones, once submitted

    @property
    def current(self) -> Block | None:
        return self.blocks[self.next_block] if self.next_block < len(self.blocks) else None

    def outcome(self) -> dict[str, Any]:
        return {"blocks": len(self.blocks), "blocks_done": self.next_block, "samples": self.samples,
                "input_ids": int(sum(len(b.ids) for b in self.blocks))}

    def describe(self, state: str) -> dict[str, Any]:
        out = super().describe(state)
        out.update(blocks=len(self.blocks), blocks_done=self.next_block, samples=self.samples)
        return out


class SpeechService(StageService):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.blocks_done = 0

    def submit(self, job: Job) -> Any:
        if not isinstance(job, Utterance):
            raise InvalidRequest("a speech deployment serves utterances")
        job.outbox.wake_worker = self.wake
        job.report = lambda event, fields: self.progress is not None and self.progress(job, event, fields)
        return super().submit(job)

    def counts(self) -> dict[str, int]:
        out = super().counts()
        out.update(blocks_done=self.blocks_done)
        return out

    def _runnable(self, active: list[Job]) -> list[Job]:
        return [u for u in active if u.cancelled is None]

    def _resolve(self, job: Utterance, error: LoomError | None) -> None:
        if error is None:
            outcome = job.outcome()
            job.outbox.put("done", outcome)
            job.future.set_result(outcome)
        else:
            job.outbox.put("error", error)
            job.future.set_exception(error)

    # ---- one pass: plan -> execute -> apply ------------------------------------------------------

    def plan(self, jobs: list[Utterance]) -> Iterator[StepPlan]:
        """Lengths first, then samples: a generator, so the `synthesize` call is planned after the
        `durations` call of the same pass was applied, and a new request's first block is spoken
        in the pass that measured it."""
        unknown = [b for job in jobs if job.outbox.has_credit() for b in _to_measure(job)]
        if unknown:
            yield self._durations_plan(_within(unknown, lambda b: len(b.ids), STEP_IDS))
        speaking = [job for job in jobs if not job.future.done() and job.cancelled is None
                    and job.current is not None and job.current.carried is not None and job.outbox.has_credit()]
        if speaking:
            blocks = _within([job.current for job in speaking], lambda b: b.frames, STEP_FRAMES)
            yield self._synthesize_plan(blocks + _following(speaking, blocks))

    def _durations_plan(self, blocks: list[Block]) -> StepPlan:
        inputs = {"ids": np.concatenate([b.ids for b in blocks]),
                  "rows": np.concatenate([np.full(len(b.ids), r, np.int32) for r, b in enumerate(blocks)]),
                  "speed": np.array([b.job.prepared.speed for b in blocks], np.float32)}
        return StepPlan(DURATIONS_STAGE, tuple(dict.fromkeys(b.job for b in blocks)), inputs, tuple(blocks))

    def _synthesize_plan(self, blocks: list[Block]) -> StepPlan:
        inputs = {"ids": np.concatenate([b.ids for b in blocks]),
                  "rows": np.concatenate([np.full(len(b.ids), r, np.int32) for r, b in enumerate(blocks)]),
                  **{name: np.concatenate([b.carried[name] for b in blocks]) for name in blocks[0].carried},
                  "frame_rows": np.concatenate([np.full(b.frames, r, np.int32) for r, b in enumerate(blocks)]),
                  "seed": np.array([b.job.prepared.seed for b in blocks], np.uint64),
                  "counter": np.array([b.index for b in blocks], np.uint64)}
        return StepPlan(SYNTHESIZE_STAGE, tuple(dict.fromkeys(b.job for b in blocks)), inputs, tuple(blocks))

    def apply(self, plan: StepPlan, outputs: dict[str, np.ndarray]) -> None:
        if plan.stage == DURATIONS_STAGE:
            per_id = {name: value for name, value in outputs.items() if name != "frames"}
            total = sum(len(b.ids) for b in plan.rows)
            wrong = [name for name, value in per_id.items() if value.ndim == 0 or value.shape[0] != total]
            if wrong:
                raise LoomError(f"model '{self.model}': stage '{DURATIONS_STAGE}' output '{wrong[0]}' does not "
                                f"have the call's {total} ids on its first axis (every output but frames is per id)")
            start, broken = 0, {}
            for r, b in enumerate(plan.rows):
                b.carried = {name: np.ascontiguousarray(value[start:start + len(b.ids)]) for name, value in per_id.items()}
                b.frames = int(outputs["frames"][r])
                start += len(b.ids)
                if not 1 <= b.frames <= MAX_BLOCK_FRAMES:
                    broken[b.job] = LoomError(f"model '{self.model}': stage '{DURATIONS_STAGE}' gave block "
                                              f"{b.index} {b.frames} frames (1..{MAX_BLOCK_FRAMES})")
            for job, error in broken.items():
                self._finish(job, error)
            return
        pcm = outputs["pcm"]
        start = 0
        for b in plan.rows:
            job = b.job
            if job.future.done():           # failed earlier in this pass (its durations)
                start += b.frames
                continue
            data = np.ascontiguousarray(pcm[start:start + b.frames], "<i2").tobytes()
            start += b.frames
            job.samples += len(data) // 2
            job.next_block += 1
            with self._cond:
                self.blocks_done += 1
            job.report("speech_block", {"block": b.index, "blocks": len(job.blocks), "frames": b.frames})
            job.outbox.put("audio", data)
            if job.current is None:
                self._finish(job, None)


def _following(speaking: list[Utterance], taken: list[Block]) -> list[Block]:
    """The blocks after the current one of requests that have already been heard (their first
    block is out, so their reader is playing audio), in order, as many as each reader has room
    for, while the call stays under FOLLOWING_FRAMES: a paragraph's later sentences share one
    call (one plan, one set of launches, larger products) instead of a call each. None join a
    call that carries a request's first block, so first audio never waits behind them; the cap
    bounds how long a request arriving during such a call waits for the next one."""
    if any(b.index == 0 for b in taken):
        return []
    used = sum(b.frames for b in taken)
    current = {id(b) for b in taken}
    out: list[Block] = []
    for job in speaking:
        if id(job.current) not in current:
            continue
        room = job.outbox.room() - 1   # (the current block's event)
        for b in job.blocks[job.next_block + 1:job.next_block + 1 + max(room, 0)]:
            if b.carried is None:   # not measured yet: this request's later blocks wait
                break
            if used + b.frames > FOLLOWING_FRAMES:
                return out
            out.append(b)
            used += b.frames
    return out


def _to_measure(job: Utterance) -> list[Block]:
    """The blocks of `job` this pass's `durations` call measures: all it has not measured yet,
    except that a request none of whose blocks is spoken yet gets its first block alone, so its
    first audio waits for one sentence's lengths, not the whole text's (the rest are measured
    in the next pass)."""
    pending = [b for b in job.blocks[job.next_block:] if b.carried is None]
    return pending[:1] if job.next_block == 0 and pending and pending[0].index == 0 else pending


def _within(blocks: list[Block], size: Any, budget: int) -> list[Block]:
    """The leading blocks whose sizes fit `budget` (the first always: a long block runs alone)."""
    out, used = [], 0
    for b in blocks:
        if out and used + size(b) > budget:
            break
        out.append(b)
        used += size(b)
    return out


# ---- the kind's policy and entry points ------------------------------------------------------------------

def _contract_error(message: str) -> LoomError:
    return LoomError(f"the control program's {REQUEST_FN}() broke the speech contract: {message}")


class SpeechPolicy:
    """The control program's request preparation, and the source's output rate and voices."""

    def __init__(self, control: Any, tokenizer: Any, sample_rate: int, vocab_size: int):
        if not control.has(REQUEST_FN):
            raise CompileError(f"a speech deployment's control program needs fn {REQUEST_FN} "
                               "(docs/source-contracts.md, speech)")
        self.control, self.tokenizer = control, tokenizer
        self.sample_rate, self.vocab_size = sample_rate, vocab_size
        self.voices = self._voices()

    def _voices(self) -> list[str]:
        if not self.control.has(VOICES_FN):
            return []
        voices = self.control.call(VOICES_FN, [])
        if not isinstance(voices, list) or not all(isinstance(v, str) for v in voices):
            raise CompileError(f"the control program's {VOICES_FN}() must return a list of strings")
        return voices

    def prepare(self, options: dict[str, Any]) -> PreparedSpeech:
        """`options`: input, voice (an id string), speed, seed and instructions, checked for
        type and range by the caller (the HTTP route); the source decides the rest."""
        result = self.control.call(REQUEST_FN, [options, self.tokenizer])
        if not isinstance(result, dict):
            raise _contract_error("it must return a map")
        try:
            blocks = tuple(tuple(int(i) for i in block) for block in result["blocks"])
            speed, seed = float(result.get("speed", options["speed"])), int(result.get("seed", options["seed"]))
        except (KeyError, TypeError, ValueError, OverflowError):
            raise _contract_error("it returns blocks (lists of ids), and may return speed (a number) and seed "
                                  "(an integer)") from None
        if not blocks:
            raise InvalidRequest("input: nothing to say (the text holds no speakable words)", param="input")
        if len(blocks) > MAX_BLOCKS or any(not b for b in blocks):
            raise _contract_error(f"blocks must be 1..{MAX_BLOCKS} nonempty lists")
        bad = [i for b in blocks for i in b if not 0 <= i < self.vocab_size]
        if bad:
            raise _contract_error(f"id {bad[0]} is outside the tokenizer's {self.vocab_size} ids")
        if not 0 <= seed < 1 << 64 or not speed > 0:
            raise _contract_error("seed must be an unsigned 64-bit integer and speed positive")
        return PreparedSpeech(blocks, speed, seed)


def create_policy(reg: Any, executables: Any, tokenizer: Any) -> SpeechPolicy:
    from loomrt.control import Control

    if tokenizer is None:
        raise CompileError(f"model '{reg.name}': a speech deployment needs a tokenizer (its text front end)")
    rate = executables.module.config("sample_rate")
    if not isinstance(rate, int) or isinstance(rate, bool) or rate < 1:
        raise CompileError(f"model '{reg.name}': a speech program declares a positive integer config sample_rate")
    return SpeechPolicy(Control(executables.control), tokenizer, rate, tokenizer.get_vocab_size())


class ComponentSession:
    """An onnxruntime-shaped session (`run(None, {"chars": ids})`) backed by the deployment's
    `g2p_fallback` stage on its `phonemizer` component: what hibari's out-of-vocabulary reader
    (`hibari.g2p.oov.OOV`) calls for each unknown word. It runs on the caller's thread (request
    preparation), one word at a time (the phonemizer serializes its G2P calls)."""

    def __init__(self, program: Any, residency: Any, component: Any):
        self.program, self.residency, self.component = program, residency, component

    def run(self, outputs: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        chars = np.asarray(feeds["chars"], np.int32).reshape(-1)
        params = self.residency.acquire(self.component)
        try:
            classes = self.program.run(params, {}, {"chars": chars, "rows": np.zeros(len(chars), np.int32)})["classes"]
        finally:
            self.residency.release(self.component)
        return [np.asarray(classes, np.int64).reshape(1, -1)]


def _attach_fallback(reg: Any, residency: Any) -> None:
    """A phonemizer reads unknown words with the package's fallback network when the program
    declares it (stage `g2p_fallback`, component `phonemizer`); without one they are skipped."""
    tokenizer, program = reg.tokenizer, reg.executables.programs.get(FALLBACK_STAGE)
    component = reg.components.get(FALLBACK_COMPONENT)
    if program is None or component is None or not hasattr(tokenizer, "fallback"):
        return
    from hibari.g2p.oov import OOV      # the reader of the phonemizer's own library (char ids, CTC decoding)

    from loomrt.compiler import code_path

    weights = code_path(reg.document.components[FALLBACK_COMPONENT].checkpoint[0])   # the OOV network's ONNX
    tokenizer.fallback = OOV(str(weights), session=ComponentSession(program, residency, component))


def create_service(reg: Any, component: Any, residency: Any, state: dict, **common: Any) -> SpeechService:
    common["max_active"] = common.get("max_active") or (reg.document.rows or 8)
    _attach_fallback(reg, residency)
    return SpeechService(reg.name, reg.executables, component, residency, state, reg.document.pending_capacity,
                         **common)


KIND = KindSpec("speech", (DURATIONS_STAGE, SYNTHESIZE_STAGE), create_policy, create_service, route="speech",
                state_scopes=())

__all__ = ["KIND", "Block", "PreparedSpeech", "SpeechPolicy", "SpeechService", "Utterance", "create_policy",
           "create_service"]
