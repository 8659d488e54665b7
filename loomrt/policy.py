"""The text policy: what the host asks of a text deployment's control program before generating.

`chat_request(request, tokenizer)` (text source contract, `docs/source-contracts.md`) runs on
the control VM: it validates every model-specific field (sampling ranges, thinking, model
options, messages, tools), renders the model's framing and tokenizes it. The host checks
the shape of what comes back and never interprets the model's template itself. It needs no
weights, so input-token counting and generation share it while parameters are evicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loomrt.errors import LoomError
from loomrt.services.text import Sampling

CHAT_FN = "chat_request"


@dataclass(frozen=True)
class PreparedChat:
    prompt: list[int]
    sampling: Sampling
    stop_ids: tuple[int, ...]
    state: Any


def _contract_error(message: str) -> LoomError:
    return LoomError(f"the control program's {CHAT_FN}() broke the text contract: {message}")


class TextPolicy:
    def __init__(self, control: Any, tokenizer: Any, vocab_size: int):
        self.control = control
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        if not control.has(CHAT_FN):
            raise LoomError(f"a text deployment's control program needs fn {CHAT_FN}(request: map, tok: any) -> map")

    def prepare(self, request: dict[str, Any]) -> PreparedChat:
        """Validate and render one chat request (PolicyFailure carries the policy's own 4xx)."""
        result = self.control.call(CHAT_FN, [request, self.tokenizer])
        if not isinstance(result, dict):
            raise _contract_error("it must return a map")
        prompt = result.get("prompt")
        if not isinstance(prompt, list) or not all(type(t) is int and 0 <= t < self.vocab_size for t in prompt):
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
        return PreparedChat(prompt, sampling, tuple(stop), result.get("state"))


__all__ = ["CHAT_FN", "PreparedChat", "TextPolicy"]
