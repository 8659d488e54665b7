"""Image positions in a chat prompt: what the host does between a request's image parts and the
text service's packed prefill (spec "Image input"; the source side: docs/source-contracts.md).

The source's `chat_request` renders an image part as an *image slot* in its prompt list,
`{"image": k, "stage": "project_high", "positions": 64}`: the k-th image part of the request
(in message and content order), the image stage that projects it, and how many prompt
positions its projection fills. The host expands each slot into `positions` placeholder ids
that carry the image's identity, so prefix caching, retained histories and checkpoints, which
compare prompts id by id, reuse a prefix only across the same bytes, placement, stage and
position:

    id = -(1 + hash(sha256(bytes), stage, j) mod 2^62)     j = 0 .. positions - 1

Placeholder ids are negative, so they never collide with a token; the packed step passes
token 0 there and the projected embedding replaces its row (`place_rows`).

Counting (`/v1/chat/completions/input_tokens`) reads only headers (`probe`). A generation
decodes each image before admission, so a corrupt file is the client's 400, not a failed
stream, except an image whose bytes this deployment already decoded (`VerifiedImages`): its
decode waits until a projection needs the pixels, which an exact retained prefix never does.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loomrt.errors import LoomError
from loomrt.media.image import (DEFAULT_FORMATS, ImageFormats, ImageLimits, ImageRef, decode_image, image_bytes,
                                parse_image_part, probe)

LIMITS_FN = "image_limits"
FIT_STAGE = "fit"
VERIFIED_CAPACITY = 1024
_ID_SPACE = 1 << 62


def placeholder_ids(digest: str, stage: str, positions: int) -> list[int]:
    """The ids of an image's `positions` prompt positions (negative; see the module docstring)."""
    out = []
    for j in range(positions):
        h = hashlib.blake2b(f"{digest}\0{stage}\0{j}".encode(), digest_size=8).digest()
        out.append(-(1 + int.from_bytes(h, "little") % _ID_SPACE))
    return out


@dataclass(eq=False)
class ImageSlot:
    """One image of a prompt: where its positions start, how many, the stage that projects it,
    its bytes (decoded lazily when `rgb` is None) and, once projected, its rows."""

    start: int
    positions: int
    stage: str
    digest: str
    data: bytes
    media_type: str
    param: str
    rgb: np.ndarray | None = None
    embeds: Any = None          # [positions, dim] once projected, until its positions are prefilled
    projected: bool = False

    @property
    def end(self) -> int:
        return self.start + self.positions


@dataclass(frozen=True)
class ExpandedPrompt:
    ids: list[int]
    images: tuple[ImageSlot, ...] = field(default_factory=tuple)


class VerifiedImages:
    """The digests of images this deployment decoded successfully (bounded, least recently
    used out): decoding is deterministic, so the same bytes need no decode to be admitted."""

    def __init__(self, capacity: int = VERIFIED_CAPACITY):
        self.capacity = capacity
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, digest: str) -> bool:
        with self._lock:
            if digest in self._seen:
                self._seen.move_to_end(digest)
                return True
            return False

    def add(self, digest: str) -> None:
        with self._lock:
            self._seen[digest] = None
            self._seen.move_to_end(digest)
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)


def image_parts(request: dict[str, Any]) -> list[ImageRef]:
    """Every `image_url` part of the request's messages, in message and content order, checked
    field by field (the url must be a base64 data URL)."""
    out = []
    messages = request.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict) and part.get("type") == "image_url":
                out.append(parse_image_part(part, f"messages[{i}].content[{j}]"))
    return out


class ImageInput:
    """A deployment's image input: the source's limits, the enabled formats, the image stages
    its policy may name, and the digests it has verified."""

    def __init__(self, control: Any, stages: tuple[str, ...], formats: ImageFormats = DEFAULT_FORMATS):
        self.stages = stages
        self.formats = formats
        self.limits = self._limits(control)
        self.verified = VerifiedImages()

    @staticmethod
    def _limits(control: Any) -> ImageLimits:
        if not control.has(LIMITS_FN):
            return ImageLimits()
        table = control.call(LIMITS_FN, [])
        try:
            return ImageLimits(**table)
        except (TypeError, ValueError) as exc:
            raise LoomError(f"the control program's {LIMITS_FN}() must return a map of max_bytes, max_side and "
                            f"max_pixels (positive integers): {exc}") from None

    def expand(self, prompt: list[Any], refs: list[ImageRef], *, decode: bool) -> ExpandedPrompt:
        """The policy's prompt (token ids and image slots) as ids, with each image admitted: its
        header checked (counting), or decoded unless verified before (generation)."""
        ids: list[int] = []
        slots: list[ImageSlot] = []
        for item in prompt:
            if type(item) is int:
                ids.append(item)
                continue
            ref, stage, positions = self._slot(item, refs, len(slots))
            data = image_bytes(ref, self.limits)
            digest = hashlib.sha256(data).hexdigest()
            slot = ImageSlot(len(ids), positions, stage, digest, data, ref.media_type, ref.param)
            if not decode:
                probe(data, ref.media_type, formats=self.formats, limits=self.limits, param=ref.param)
            elif digest not in self.verified:
                slot.rgb = self.decode(slot)
            ids.extend(placeholder_ids(digest, stage, positions))
            slots.append(slot)
        if len(slots) != len(refs):
            raise _contract_error(f"the request has {len(refs)} image part(s) but the prompt places {len(slots)}")
        return ExpandedPrompt(ids, tuple(slots))

    def decode(self, slot: ImageSlot) -> np.ndarray:
        image = decode_image(slot.data, slot.media_type, formats=self.formats, limits=self.limits, param=slot.param)
        self.verified.add(slot.digest)
        return image.rgb

    def _slot(self, item: Any, refs: list[ImageRef], placed: int) -> tuple[ImageRef, str, int]:
        if not isinstance(item, dict):
            raise _contract_error("'prompt' holds token ids and image slots ({\"image\", \"stage\", \"positions\"})")
        index, stage, positions = item.get("image"), item.get("stage"), item.get("positions")
        if type(index) is not int or index != placed or index >= len(refs):
            raise _contract_error(f"image slot {placed} must name image part {placed} of the request's "
                                  f"{len(refs)}, in order, once each; got {index!r}")
        if stage not in self.stages:
            raise _contract_error(f"image slot {placed} names stage {stage!r}; the image stages are "
                                  f"{', '.join(self.stages)}")
        if type(positions) is not int or positions < 1:
            raise _contract_error(f"image slot {placed} needs a positive integer 'positions'")
        return refs[index], stage, positions


def _contract_error(message: str) -> LoomError:
    return LoomError(f"the control program's chat_request() broke the image contract: {message}")


__all__ = ["FIT_STAGE", "ExpandedPrompt", "ImageInput", "ImageSlot", "VerifiedImages", "image_parts",
           "placeholder_ids"]
