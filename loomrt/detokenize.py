"""Incremental detokenization: text deltas as tokens arrive, never splitting a UTF-8 character.

Byte-level BPE tokens can end in the middle of a character, and a token's text can depend
on its neighbours; decoding the whole output every step would cost O(n²). This decodes a
short window (vLLM's prefix/read offsets) and emits the new text only once it no longer
ends in a replacement character.
"""

from __future__ import annotations

from typing import Any


class IncrementalDecoder:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (often "", sometimes several characters)."""
        self.ids.append(int(token_id))
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            delta = after[len(before):]
            self._prefix, self._read = self._read, len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """What is still held back at the end (an incomplete character decodes as U+FFFD)."""
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        delta = after[len(before):]
        self._prefix = self._read = len(self.ids)
        self.text += delta
        return delta


__all__ = ["IncrementalDecoder"]
