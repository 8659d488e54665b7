"""The image-generation service: prompts of one size generated together, each size its own
specialization, compiled on demand while the others keep serving.

The image source contract (`docs/source-contracts.md`, "image"):

    config width, height, adapters     set by the host: the size a specialization generates
                                       and the number of LoRA adapters the document registers
    stage generate(tokens: i32[T], positions: i32[T], seq: i32[T], starts: i32[B], lengths: i32[B],
                   seed: u64[B], scales: f32[B, A]) -> (image: u8[B, height, width, channels])
    fn image_request(request: map, tok: any) -> map    # {"prompt", "width", "height"} -> {"tokens": [...]}
    fn image_geometry() -> map                         # optional: the sizes it generates, for discovery

`ImagePolicy` runs `image_request` before admission (no weights): the source validates the
size (exactly as asked: never rounded) and the prompt, and frames the prompt's tokens. The
host owns the adapter selection: each requested id must be registered (document `loras`),
once; its scale goes to the adapter's column of `scales`, every other column is 0.

`ImageService` keeps one `Executables` per size (`Specializations`): the registration's own
for the document's width x height, and for any other size one compiled on demand on a
background thread (`Executables.rebuild` with that width and height), sharing the resident
weights. A job waits, without holding up the others, until its size is compiled; at most
`specialization_capacity` sizes stay compiled, the least recently used other one being
dropped. Each pass packs the oldest runnable job's size with the other jobs of that size (up
to `rows` images) into one `generate` call; every image is computed from its own prompt,
seed and scales, so its pixels do not depend on what shared the call.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from loomrt.errors import CompileError, InvalidRequest, LoomError, internal_error
from loomrt.services import KindSpec
from loomrt.services.base import Job, StageService, StepPlan, log
from loomrt.services.packing import pack_sequences

GENERATE_STAGE = "generate"
REQUEST_FN = "image_request"
GEOMETRY_FN = "image_geometry"
F32_MAX = float(np.finfo(np.float32).max)
# The smallest magnitude that rounds to infinity in f32 (F32_MAX plus half its ulp of 2**104): a
# double below it, such as 3.4028235e38 (how F32_MAX is printed), rounds to a finite F32.
F32_OVERFLOW = F32_MAX + 2.0 ** 103


def _contract_error(message: str) -> LoomError:
    return LoomError(f"the control program's {REQUEST_FN}() broke the image contract: {message}")


@dataclass(frozen=True)
class PreparedImage:
    tokens: tuple[int, ...]        # the prompt as the text encoder reads it
    width: int
    height: int
    seed: int
    scales: tuple[float, ...]      # one per registered adapter, in document order (0: not selected)
    adapters: tuple[str, ...]      # the ids the request selected, in its order

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height


class ImagePolicy:
    """What the host asks of an image deployment's control program before generating."""

    def __init__(self, control: Any, tokenizer: Any, vocab_size: int | None, adapters: tuple[str, ...],
                 width: int, height: int):
        if not control.has(REQUEST_FN):
            raise CompileError(f"an image deployment's control program needs fn {REQUEST_FN}(request: map, "
                               "tok: any) -> map (docs/source-contracts.md, image)")
        self.control, self.tokenizer, self.vocab_size = control, tokenizer, vocab_size
        self.adapters, self.width, self.height = adapters, width, height
        self.geometry = control.call(GEOMETRY_FN, []) if control.has(GEOMETRY_FN) else None
        try:
            self.prepare({"prompt": "a", "width": width, "height": height, "seed": 0, "loras": []})
        except LoomError as exc:
            raise CompileError(f"the document's default size {width}x{height} is not one this source generates: "
                               f"{exc.message}") from None

    def selection(self, loras: list[tuple[str, float]]) -> tuple[float, ...]:
        """The per-adapter scales of a request's `loras` ((id, scale) pairs, checked for type by
        the caller): an unknown or repeated id is a 400."""
        scales = [0.0] * len(self.adapters)
        seen: set[str] = set()
        for i, (name, scale) in enumerate(loras):
            if name in seen:
                raise InvalidRequest(f"loras[{i}].id: adapter '{name}' is selected twice", param="loras")
            seen.add(name)
            if name not in self.adapters:
                known = ", ".join(repr(a) for a in self.adapters) or "none"
                raise InvalidRequest(f"loras[{i}].id: no adapter '{name}' is registered (registered: {known})",
                                     param="loras")
            scales[self.adapters.index(name)] = scale
        return tuple(scales)

    def prepare(self, options: Mapping[str, Any]) -> PreparedImage:
        """`options`: prompt (a nonempty string), width and height (the request's size or the
        default), seed (u64) and loras ((id, finite f32 scale) pairs), checked for type by the
        caller (the HTTP route); the source decides whether it can generate that."""
        scales = self.selection(list(options["loras"]))
        request = {"prompt": options["prompt"], "width": options["width"], "height": options["height"]}
        result = self.control.call(REQUEST_FN, [request, self.tokenizer])
        if not isinstance(result, dict) or not isinstance(result.get("tokens"), list) or not result["tokens"]:
            raise _contract_error("it must return a map with 'tokens', a nonempty list of token ids")
        limit = self.vocab_size
        tokens = result["tokens"]
        if not all(type(t) is int and 0 <= t and (limit is None or t < limit) for t in tokens):
            raise _contract_error(f"'tokens' must be token ids in 0..{limit - 1 if limit else '?'}")
        return PreparedImage(tuple(tokens), int(options["width"]), int(options["height"]), int(options["seed"]),
                             scales, tuple(name for name, _ in options["loras"]))


class ImageJob(Job):
    """One image request; the future gets the RGB8 picture, u8[height, width, channels]."""

    def __init__(self, prepared: PreparedImage, *, kind: str = "images"):
        super().__init__([], kind=kind)
        self.prepared = prepared
        self.image: np.ndarray | None = None
        self.waited_for_compile = False

    def outcome(self) -> dict[str, Any]:
        p = self.prepared
        return {"width": p.width, "height": p.height, "prompt_tokens": len(p.tokens), "adapters": list(p.adapters),
                "compiled_size": self.waited_for_compile}

    def describe(self, state: str) -> dict[str, Any]:
        out = super().describe(state)
        p = self.prepared
        out.update(size=f"{p.width}x{p.height}", prompt_tokens=len(p.tokens), adapters=list(p.adapters))
        return out


class Specializations:
    """The compiled sizes of one deployment: `default` (the registration's executables, always
    kept) and up to `capacity - 1` others, compiled on demand, least recently used dropped."""

    def __init__(self, model: str, executables: Any, default: tuple[int, int], capacity: int,
                 wake: Any):
        self.model, self.default, self.capacity, self.wake = model, default, capacity, wake
        self._base = executables
        self._sizes: collections.OrderedDict[tuple[int, int], Future] = collections.OrderedDict()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=f"loom-sizes-{model}")
        self._lock = threading.Lock()
        self.compiled = 0

    def reset(self, executables: Any) -> None:
        """A new variant was selected: other sizes compile again from its providers."""
        with self._lock:
            self._base = executables
            self._sizes.clear()

    def get(self, size: tuple[int, int], in_use: set[tuple[int, int]]) -> Future:
        """The executables of `size`, compiling them (in the background) on first use."""
        done: Future
        with self._lock:
            if size == self.default:
                done = Future()
                done.set_result(self._base)
                return done
            found = self._sizes.get(size)
            if found is not None:
                self._sizes.move_to_end(size)
                return found
            found = self._sizes[size] = self._worker.submit(self._compile, self._base, size)
            found.add_done_callback(lambda _: self.wake())
            for old in list(self._sizes):
                if len(self._sizes) < self.capacity:
                    break
                if old not in in_use and old != size and self._sizes[old].done():
                    del self._sizes[old]
            return found

    def _compile(self, base: Any, size: tuple[int, int]) -> Any:
        if base.rebuild is None:
            raise LoomError(f"model '{self.model}': these executables cannot be compiled for another size")
        try:
            built = base.rebuild({"width": size[0], "height": size[1]})
        except LoomError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug below us: report it, keep serving
            raise internal_error(log, f"model '{self.model}': compiling size {size[0]}x{size[1]} failed", exc) from None
        if built.contract.params != base.contract.params:
            raise LoomError(f"model '{self.model}': size {size[0]}x{size[1]} binds other params than the default size")
        self.compiled += 1
        return built

    def sizes(self) -> list[str]:
        with self._lock:
            ready = [s for s, f in self._sizes.items() if f.done() and f.exception() is None]
        return [f"{w}x{h}" for w, h in [self.default, *ready]]

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)


class ImageService(StageService):
    def __init__(self, *args: Any, default: tuple[int, int], specialization_capacity: int, adapters: int,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.adapters = adapters
        self.images = 0
        self.shapes = Specializations(self.model, self.executables, default, specialization_capacity, self.wake)
        self._shapes_of = self.executables

    def submit(self, job: Job) -> Any:
        if not isinstance(job, ImageJob):
            raise InvalidRequest("an image deployment serves image requests")
        return super().submit(job)

    def counts(self) -> dict[str, int]:
        out = super().counts()
        out.update(images=self.images, sizes_compiled=self.shapes.compiled)
        return out

    def stop(self, mode: str) -> Future:
        done = super().stop(mode)
        done.add_done_callback(lambda _: self.shapes.close())
        return done

    def _runnable(self, active: list[Job]) -> list[Job]:
        """Jobs whose size is compiled (or failed to compile: they fail in `plan`); asking for
        a size starts its compilation."""
        if self.executables is not self._shapes_of:       # a variant was selected at this boundary
            self._shapes_of = self.executables
            self.shapes.reset(self.executables)
        in_use = {j.prepared.size for j in active}
        out = []
        for job in active:
            if job.cancelled is not None:
                continue
            found = self.shapes.get(job.prepared.size, in_use)
            if found.done():
                out.append(job)
            else:
                job.waited_for_compile = True
        return out

    def _resolve(self, job: ImageJob, error: LoomError | None) -> None:
        if error is None:
            job.future.set_result(job.image)
        else:
            job.future.set_exception(error)

    def plan(self, jobs: list[ImageJob]) -> list[StepPlan]:
        """One call: the oldest job's size, with the other jobs of that size (all runnable jobs
        fit: the active set is at most `rows`)."""
        size = jobs[0].prepared.size
        found = self.shapes.get(size, {size})
        if found.exception() is not None:
            for job in [j for j in jobs if j.prepared.size == size]:
                self._finish(job, found.exception())
            return []
        picked = [j for j in jobs if j.prepared.size == size]
        scales = np.zeros((len(picked), max(1, self.adapters)), np.float32)
        for i, j in enumerate(picked):
            scales[i, :self.adapters] = j.prepared.scales
        inputs = {**pack_sequences([j.prepared.tokens for j in picked]),
                  "seed": np.array([j.prepared.seed for j in picked], np.uint64), "scales": scales}
        return [StepPlan(GENERATE_STAGE, tuple(picked), inputs, (found.result(),))]

    def _program(self, plan: StepPlan) -> Any:
        return plan.rows[0].programs[plan.stage]      # the size's specialization, on the shared params

    def apply(self, plan: StepPlan, outputs: dict[str, np.ndarray]) -> None:
        image = outputs["image"]
        w, h = plan.jobs[0].prepared.size
        if image.dtype != np.uint8 or image.ndim != 4 or image.shape[:3] != (len(plan.jobs), h, w):
            raise LoomError(f"stage '{GENERATE_STAGE}' returned image {image.dtype}{list(image.shape)}, expected "
                            f"u8[{len(plan.jobs)}, {h}, {w}, channels]")
        for job, picture in zip(plan.jobs, image):
            if job.cancelled is not None:
                continue      # the client left: its picture is dropped, its peers keep theirs
            job.image = np.array(picture)
            self.images += 1
            self._finish(job, None)


def create_policy(reg: Any, executables: Any, tokenizer: Any) -> ImagePolicy:
    from loomrt.control import Control

    vocab = None
    if tokenizer is not None:
        tokenizer.no_padding()        # tokenize() returns exactly the prompt's ids (as embeddings do)
        tokenizer.no_truncation()
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    doc = reg.document
    return ImagePolicy(Control(executables.control), tokenizer, vocab, tuple(doc.loras), doc.width, doc.height)


def create_service(reg: Any, component: Any, residency: Any, state: dict, **common: Any) -> ImageService:
    doc = reg.document
    common["max_active"] = doc.rows
    return ImageService(reg.name, reg.executables, component, residency, state, doc.pending_capacity,
                        default=(doc.width, doc.height), specialization_capacity=doc.specialization_capacity,
                        adapters=len(doc.loras), **common)


def finite_f32(value: float) -> bool:
    """Whether a scale is a finite number that f32 can hold (the spec's "finite F32"): it
    rounds (to nearest) to a finite f32."""
    return math.isfinite(value) and abs(value) < F32_OVERFLOW


KIND = KindSpec("image", (GENERATE_STAGE,), create_policy, create_service, route="images", state_scopes=())

__all__ = ["KIND", "ImageJob", "ImagePolicy", "ImageService", "PreparedImage", "Specializations", "create_policy",
           "create_service", "finite_f32"]
