"""The text policy: what the host asks of a text deployment's control program before generating.

`chat_request(request, tokenizer)` (text source contract, `docs/source-contracts.md`) runs on
the control VM: it validates every model-specific field (sampling ranges, thinking, model
options, messages, tools), renders the model's framing and tokenizes it. The host checks
the shape of what comes back and never interprets the model's template itself. It needs no
weights, so input-token counting and generation share it while parameters are evicted.

Which fields a message of each role may carry is the source's choice too (what its template
renders): the optional `message_fields()` returns them per role, and the host rejects any
other field, naming it (`messages[1].name`), before the policy runs; a field dropped
silently would change the conversation without the client knowing. Without the function,
`DEFAULT_MESSAGE_FIELDS` (OpenAI's message shape less `name`, which ChatML cannot render).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loomrt.errors import InvalidRequest, LoomError
from loomrt.fields import fail, reject_unknown, shown
from loomrt.image_input import ImageInput, ImageSlot, image_parts
from loomrt.media.image import IMAGE_URL_FIELDS
from loomrt.media.image import PART_FIELDS as IMAGE_PART_FIELDS
from loomrt.services.text import Sampling

CHAT_FN = "chat_request"
MESSAGE_FIELDS_FN = "message_fields"
DEFAULT_MESSAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "system": ("role", "content"), "user": ("role", "content"),
    "assistant": ("role", "content", "tool_calls"), "tool": ("role", "content", "tool_call_id"),
}
#: the fields of a content part, by its type (spec: "Image input"); other types are the source's to judge
PART_FIELDS: dict[str, tuple[str, ...]] = {"text": ("type", "text"), "image_url": IMAGE_PART_FIELDS}


@dataclass(frozen=True)
class PreparedChat:
    prompt: list[int]               # token ids, and each image's placeholder ids (negative)
    sampling: Sampling
    stop_ids: tuple[int, ...]
    state: Any
    images: tuple[ImageSlot, ...] = ()


def _contract_error(message: str) -> LoomError:
    return LoomError(f"the control program's {CHAT_FN}() broke the text contract: {message}")


class TextPolicy:
    """`images` is the deployment's image input (None: image parts are refused, `refusal` says why)."""

    def __init__(self, control: Any, tokenizer: Any, vocab_size: int, images: ImageInput | None = None,
                 refusal: str = "it reads text only"):
        self.control = control
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.images = images
        self.refusal = refusal
        if not control.has(CHAT_FN):
            raise LoomError(f"a text deployment's control program needs fn {CHAT_FN}(request: map, tok: any) -> map")
        self.message_fields = self._message_fields(control)

    @staticmethod
    def _message_fields(control: Any) -> dict[str, tuple[str, ...]]:
        if not control.has(MESSAGE_FIELDS_FN):
            return DEFAULT_MESSAGE_FIELDS
        table = control.call(MESSAGE_FIELDS_FN, [])
        if not isinstance(table, dict) or not table or not all(
                isinstance(fields, list) and "role" in fields and all(isinstance(f, str) for f in fields)
                for fields in table.values()):
            raise _contract_error(f"{MESSAGE_FIELDS_FN}() must return a map from each role to the list of its "
                                  "message fields (including 'role')")
        return {role: tuple(fields) for role, fields in table.items()}

    def check_messages(self, request: dict[str, Any]) -> None:
        """Every message is an object of a known role with only that role's fields, and its
        content parts carry only their type's fields (400 naming the first one that does not).
        A `messages` that is no list is left to the policy, whose message says what it needs."""
        messages = request.get("messages")
        if not isinstance(messages, list):
            return
        for i, message in enumerate(messages):
            where = f"messages[{i}]"
            if not isinstance(message, dict):
                raise fail(where, f"expected a message object, got {shown(message)}")
            role = message.get("role")
            if not isinstance(role, str):
                raise fail(f"{where}.role", f"expected a string role, got {shown(role)}")
            allowed = self.message_fields.get(role)
            if allowed is None:
                raise InvalidRequest(f"{where}.role: unknown role {shown(role)} (this model knows "
                                     f"{', '.join(self.message_fields)})", param=f"{where}.role")
            reject_unknown(message, allowed, f"{where}.")
            content = message.get("content")
            if isinstance(content, list):
                for j, part in enumerate(content):
                    self._check_part(f"{where}.content[{j}]", part)

    @staticmethod
    def _check_part(where: str, part: Any) -> None:
        if not isinstance(part, dict):
            raise fail(where, f"expected a content part object, got {shown(part)}")
        kind = part.get("type")
        known = PART_FIELDS.get(kind) if isinstance(kind, str) else None
        if known is None:   # another type (or none): the source's policy says what it reads
            return
        reject_unknown(part, known, f"{where}.")
        image = part.get("image_url")
        if isinstance(image, dict):
            reject_unknown(image, IMAGE_URL_FIELDS, f"{where}.image_url.")

    def prepare(self, request: dict[str, Any], *, decode: bool = True) -> PreparedChat:
        """Validate and render one chat request (PolicyFailure carries the policy's own 4xx).
        Its images are decoded (`decode`, a generation) or only their headers read (a count)."""
        self.check_messages(request)
        refs = image_parts(request)
        if refs and self.images is None:
            raise InvalidRequest(f"{refs[0].param}: this model does not accept images ({self.refusal})",
                                 param=refs[0].param)
        result = self.control.call(CHAT_FN, [request, self.tokenizer])
        if not isinstance(result, dict):
            raise _contract_error("it must return a map")
        prompt = result.get("prompt")
        if not isinstance(prompt, list) or not all(type(t) is not int or 0 <= t < self.vocab_size for t in prompt):
            raise _contract_error(f"'prompt' must be a list of token ids in 0..{self.vocab_size - 1} (and image "
                                  "slots, for a deployment with image input)")
        if self.images is None and not all(type(t) is int for t in prompt):
            raise _contract_error(f"'prompt' must be a list of token ids in 0..{self.vocab_size - 1}")
        s = result.get("sampling")
        if not isinstance(s, dict):
            raise _contract_error("'sampling' must be a map")
        try:
            sampling = Sampling(float(s["temperature"]), float(s["top_p"]), int(s["top_k"]),
                                None if s.get("seed") is None else int(s["seed"]) % (1 << 64))
        except (KeyError, TypeError, ValueError):
            raise _contract_error("'sampling' needs temperature, top_p, top_k and seed") from None
        stop = result.get("stop", [])
        if not isinstance(stop, list) or not all(type(t) is int for t in stop):
            raise _contract_error("'stop' must be a list of token ids")
        images: tuple[ImageSlot, ...] = ()
        if self.images is not None:    # last: decoding is the costly check
            expanded = self.images.expand(prompt, refs, decode=decode)
            prompt, images = expanded.ids, expanded.images
        return PreparedChat(prompt, sampling, tuple(stop), result.get("state"), images)


__all__ = ["CHAT_FN", "DEFAULT_MESSAGE_FIELDS", "MESSAGE_FIELDS_FN", "PreparedChat", "TextPolicy"]
