"""Raw tokenization: `POST /tokenize` and `POST /detokenize` (spec: "Raw tokenization").

CPU utilities over the deployment's loaded tokenizer: no chat template, no weights, no row.
Bounds: 1 MiB of text and 262,144 tokens either way (413 beyond). `with_pieces: false` is
accepted and `true` rejects (this contract exposes no raw token bytes); the aliases other
servers accept (`prompt`, `add_special_tokens`, ...) are unknown fields here, so they are
400 like any other. Each call is a utility request: listed by `/v1/requests` while the
tokenizer works, then one `request` event (`tokens`: how many ids it produced or read).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import json_body
from loomd.errors import json_response
from loomrt import inference
from loomrt.errors import InvalidRequest, LoomError, PayloadTooLarge
from loomrt.fields import expect_string, fields_of

MAX_TEXT_BYTES = 1 << 20
MAX_TOKENS = 262_144


def _tokenizer_of(request: web.Request, body: dict[str, Any]) -> Any:
    """The deployment's tokenizer (404 / 503 first, before the other fields are judged)."""
    return inference.tokenizer(request.app[REGISTRY], expect_string("model", body["model"]))


async def _utility(request: web.Request, body: dict[str, Any], kind: str, work: Any) -> Any:
    """`work(tokenizer, utility)` on a worker thread as one utility request: listed by
    `/v1/requests` for as long as the work runs (even past a client that left) and reported
    by its `request` event."""
    return await asyncio.to_thread(inference.with_tokenizer, request.app[REGISTRY], body["model"], kind, work,
                                   request.path)


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key}: expected boolean, got {value!r}", param=key)
    return value


@functools.lru_cache(maxsize=16)
def _literal(tokenizer: Any) -> Any:
    """A copy of `tokenizer` that reads special-token text as ordinary text (built once per
    tokenizer, not per request)."""
    plain = tokenizer.__class__.from_str(tokenizer.to_str())
    plain.encode_special_tokens = True
    return plain


def _encode(tokenizer: Any, text: str, add_special: bool, parse_special: bool) -> list[int]:
    try:
        if parse_special or not hasattr(tokenizer, "to_str"):   # a phonemizer has no special tokens
            return tokenizer.encode(text, add_special_tokens=add_special).ids
        return _literal(tokenizer).encode(text, add_special_tokens=add_special).ids
    except Exception as exc:
        raise LoomError(f"the tokenizer failed: {exc}") from None


async def tokenize(request: web.Request) -> web.StreamResponse:
    body = fields_of(await json_body(request), ("model", "content"), ("add_special", "parse_special",
                                                                      "with_pieces"))
    _tokenizer_of(request, body)
    if _flag(body, "with_pieces", False):
        raise InvalidRequest("with_pieces: only false is supported (token pieces are not exposed)",
                             param="with_pieces")
    content = expect_string("content", body["content"])
    if len(content.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise PayloadTooLarge(f"content is larger than {MAX_TEXT_BYTES} bytes")
    add_special, parse_special = _flag(body, "add_special", False), _flag(body, "parse_special", True)

    def work(tok: Any, utility: Any) -> list[int]:
        ids = _encode(tok, content, add_special, parse_special)
        utility.counts["tokens"] = len(ids)
        if len(ids) > MAX_TOKENS:
            raise PayloadTooLarge(f"content is more than {MAX_TOKENS} tokens")
        return ids

    return json_response({"tokens": await _utility(request, body, "tokenize", work)})


async def detokenize(request: web.Request) -> web.StreamResponse:
    body = fields_of(await json_body(request), ("model", "tokens"))
    tokenizer = _tokenizer_of(request, body)
    tokens = body["tokens"]
    if not isinstance(tokens, list):
        raise InvalidRequest("tokens: expected an array of token ids", param="tokens")
    if len(tokens) > MAX_TOKENS:
        raise PayloadTooLarge(f"tokens: more than {MAX_TOKENS} ids")
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise InvalidRequest(f"tokens[{i}]: expected a token id in 0..{vocab - 1}, got {t!r}", param="tokens")

    def work(tok: Any, utility: Any) -> str:
        utility.counts["tokens"] = len(tokens)
        try:
            text = tok.decode(tokens, skip_special_tokens=False)
        except Exception as exc:
            raise LoomError(f"the tokenizer failed: {exc}") from None
        if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            raise PayloadTooLarge(f"the decoded text is larger than {MAX_TEXT_BYTES} bytes")
        return text

    return json_response({"content": await _utility(request, body, "detokenize", work)})


def add_routes(add) -> None:
    add("POST", "/tokenize", tokenize)
    add("POST", "/detokenize", detokenize)
