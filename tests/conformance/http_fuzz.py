"""Structure-aware fuzzing of a running `loomd` over raw sockets: seeded mutations of valid requests.

Imported by `tests/conformance/test_fuzz_http.py` (a bounded count in CI) and by `bench/fuzz.py`
(`--count 100000` by hand). Everything is derived from one `random.Random(seed)`, so a seed and a
case number name a request exactly; `Case.data` is the bytes on the wire and is what a reproducer
file holds.

Three families, each a mutation of a valid request taken from `examples()` (one per route of
`loomd.app.route_modules()`, which `missing_examples()` keeps complete):

* `json_case`: a JSON route's example body mutated structurally (keys dropped, duplicated,
  renamed; values of the wrong type, huge or negative numbers, NaN-like literals, deep nesting,
  unicode oddities, very long strings and arrays) or textually (truncated, BOM, garbage), sent
  with correct framing and `Connection: close`.
* `multipart_case`: the multipart routes (model registration, transcriptions) with mutated
  boundaries, part headers, filenames, missing, repeated or truncated parts.
* `http_case`: request-line, header and framing mutations: duplicate or conflicting
  Content-Length and Transfer-Encoding, chunk sizes and extensions, truncated bodies, Expect,
  huge headers, pipelining. A case whose framing was touched half-closes after sending
  (`Case.half_close`), so the server knows no more bytes will come and must answer or close;
  one sent complete does not, so the server must answer it.

`send(...)` plays one case and returns an `Outcome`: the statuses answered, whether the
server closed, whether the deadline passed with nothing (a hang), and every way an error
body missed the OpenAI shape `{"error": {"message", "type", "code"}}`.
"""

from __future__ import annotations

import json
import random
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

STREAMING_TYPES = ("text/event-stream",)
SLOW_S = 10.0     # an answer later than this is counted (`Summary.slow`), not failed
MAX_JSON_BYTES = 4 << 20   # below the daemon's 64 MiB body bound: mutated bodies reach the JSON decoder
#: GET routes whose response never ends (they are reached only to check the head).
ENDLESS = {"/logz/stream"}


# ---- examples: one valid request per route -------------------------------------------------------------

@dataclass
class Example:
    method: str
    path: str
    body: Any = None                      # a JSON value, or None for no body
    headers: dict[str, str] = field(default_factory=dict)
    multipart: str | None = None          # "register" or "transcribe": built by `multipart_parts`


def examples(text: str, sequence: str, spare: str) -> list[Example]:
    """A valid request for every route. `text` is a chat deployment, `sequence` a sequence
    deployment, `spare` a registration the admin examples may drain or remove. Models the daemon
    does not serve (embeddings, speech, decisions, transcriptions) are still named, so their
    bodies pass through every host-side check before the lookup answers."""
    chat = {"model": text, "messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Say hi."}],
            "max_tokens": 2, "temperature": 0.0, "seed": 7, "stream": False}
    session = {"X-Loom-Model": text, "X-Loom-Session": "fuzz"}
    return [
        Example("GET", "/healthz"), Example("GET", "/readyz"), Example("GET", "/v1/models"),
        Example("GET", "/v1/status"), Example("GET", "/logz"), Example("GET", "/logz/stream"),
        Example("GET", "/metrics"), Example("GET", "/v1/requests"), Example("GET", "/v1/sessions"),
        Example("GET", "/v1/models/variants"),
        Example("GET", "/ui"), Example("GET", "/ui/status.js"), Example("GET", "/ui/status.css"),
        Example("POST", "/v1/chat/completions", chat),
        Example("POST", "/v1/chat/completions/input_tokens", {"model": text, "messages": chat["messages"]}),
        Example("POST", "/tokenize", {"model": text, "content": "Hello there", "add_special": False,
                                      "parse_special": True, "with_pieces": False}),
        Example("POST", "/detokenize", {"model": text, "tokens": [19556, 314]}),
        Example("POST", "/v1/embeddings", {"model": "vectors", "input": ["one", "two"],
                                           "encoding_format": "float", "user": "u"}),
        Example("POST", "/v1/sequences", {"model": sequence, "position": 0, "token_ids": [1, 2, 3], "options": {}}),
        Example("POST", "/v1/audio/speech", {"model": "speaker", "input": "Hello.", "voice": "af",
                                             "response_format": "wav", "speed": 1.0, "seed": 1}),
        Example("POST", "/v1/images/generations", {"model": "illustrator", "prompt": "red apple", "size": "64x64",
                                                   "seed": "1", "response_format": "b64_json", "n": 1,
                                                   "loras": [{"id": "sketch", "scale": 0.5}]}),
        Example("POST", "/v1/systemone", {"model": "judge", "questions": [{"text": "Is it?", "choices": ["yes", "no"]}]}),
        Example("POST", "/v1/audio/transcriptions", multipart="transcribe"),
        Example("POST", "/v1/models/register", multipart="register"),
        Example("POST", "/v1/models/register", {"model": spare + "-copy", "kind": "sequence", "sources": ["model.loom"]}),
        Example("POST", "/v1/models/drain", {"model": spare, "mode": "drain"}),
        Example("POST", "/v1/models/undrain", {"model": spare}),
        Example("POST", "/v1/models/unregister", {"model": spare + "-copy", "mode": "drain"}),
        Example("POST", "/v1/models/activate", {"model": spare}),
        Example("POST", "/v1/models/deactivate", {"model": spare}),
        Example("POST", "/v1/models/pin", {"model": spare, "component": "primary"}),
        Example("POST", "/v1/models/unpin", {"model": spare, "component": "primary"}),
        Example("POST", "/v1/devices/trim", {"device": "cpu", "target_bytes": 0}),
        Example("POST", "/v1/models/variants", {"model": spare, "base": "primary", "sources": ["model.loom"],
                                                "wait": False}),
        Example("POST", "/v1/models/variants/select", {"model": spare, "variant": "v1", "expected": "primary"}),
        Example("POST", "/v1/models/variants/remove", {"model": spare, "variant": "v1"}),
        Example("POST", "/v1/checkpoints/fuzz1", headers=session),
        Example("POST", "/v1/checkpoints/fuzz1/suspend", headers={"X-Loom-Model": text}),
        Example("DELETE", "/v1/checkpoints/fuzz1", headers={"X-Loom-Model": text}),
    ]


def served_routes() -> set[tuple[str, str]]:
    """(method, path template) of every route `loomd.app.make_app` registers."""
    from loomd.app import route_modules

    found: set[tuple[str, str]] = set()
    for module in route_modules():
        module.add_routes(lambda method, path, handler: found.add((method, path)))
    return found


def _template_of(path: str) -> str:
    return path.replace("/fuzz1", "/{name}")


def missing_examples(cases: list[Example]) -> set[tuple[str, str]]:
    """Routes the app serves that have no example (a new route must get one)."""
    return served_routes() - {(e.method, _template_of(e.path)) for e in cases}


# ---- JSON: structural and textual mutations ------------------------------------------------------------

class Raw(str):
    """JSON text written verbatim (NaN, 1e400, a lone surrogate escape, ...)."""


class Pairs(list):
    """An object written from (key, value) pairs, so a key can appear twice."""


def dumps(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{dumps(v)}" for k, v in value) + "}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


ODD_NUMBERS = [Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e400"), Raw("-1e400"), Raw("1e-400"),
               Raw("-0"), Raw("0.0"), Raw("1E2"), Raw("01"), Raw("1."), Raw(".5"), Raw("+1"), Raw("0x10"),
               2**63, 2**63 - 1, -2**63, 2**64, 2**64 - 1, -2**64, 10**30, -1, 0, 1, 2**31, -2**31 - 1,
               1.5, -0.5, 1e308, 5e-324, Raw("1" * 5000), Raw("18446744073709551616")]
ODD_STRINGS = ["", " ", "\x00", "a\x00b", "\u202eevil", "\ufeff", "\U0001f600" * 3, "e\u0301", "\u0130",
               Raw('"\\ud800"'), Raw('"\\udfff\\ud800"'), Raw('"\\u0000"'), "../../etc/passwd", "%00",
               "null", "true", "0", "primary", "cpu", "\r\n", "a" * 300, "ß" * 70, "\ufffe", "\x7f",
               "{\"model\": 1}"]


def _odd_value(rng: random.Random) -> Any:
    pick = rng.randrange(10)
    if pick < 3:
        return rng.choice(ODD_NUMBERS)
    if pick < 6:
        return rng.choice(ODD_STRINGS)
    return rng.choice([None, True, False, [], {}, [None], {"": None}, [[]], {"a": {"b": {}}}, [1, "a", None]])


def _deep(rng: random.Random) -> Raw:
    depth = rng.choice([64, 500, 1000, 5000, 100_000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    inner = rng.choice(["1", "null", '""'])
    return Raw(opener * depth + inner + closer * depth)


def _long(rng: random.Random) -> Any:
    n = rng.choice([1000, 5000, 70_000, 70_000, 1_100_000])
    kind = rng.randrange(4)
    if kind == 0:
        return "x" * n
    if kind == 1:
        return Raw("[" + ",".join(["1"] * min(n, 300_000)) + "]")
    if kind == 2:
        return Raw("[" + ",".join(['"a"'] * min(n, 200_000)) + "]")
    return {f"k{i}": i for i in range(min(n, 20_000))}


def _copy(value: Any) -> Any:
    """A deep copy that keeps `Raw` texts and `Pairs` objects as they are."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list) and not isinstance(value, Pairs):
        return [_copy(v) for v in value]
    return value


def _containers(value: Any, out: list) -> None:
    """Every dict and list inside `value` (pre-order), `value` included."""
    if isinstance(value, (dict, list)) and not isinstance(value, Pairs):
        out.append(value)
        for child in (value.values() if isinstance(value, dict) else value):
            _containers(child, out)


def _mutate_tree(doc: Any, rng: random.Random) -> Any:
    """One structural mutation somewhere in `doc` (a deep copy is changed and returned)."""
    doc = _copy(doc)
    holders: list = []
    _containers(doc, holders)
    if not holders:
        return _odd_value(rng)
    node = rng.choice(holders)
    op = rng.randrange(9)
    if isinstance(node, dict):
        keys = list(node)
        if not keys or op == 8:
            node[rng.choice(["extra", "model", "Model", "messages", "", "\u0000", "stream", "name", "__proto__",
                             "tool_call_id"])] = _odd_value(rng)
            return doc
        key = rng.choice(keys)
        if op == 0:
            del node[key]
        elif op == 1:
            return _with_duplicate(doc, node, key, rng)
        elif op == 2:
            new = rng.choice([key.upper(), key + " ", " " + key, key[:-1] or "x", key + "_", key.replace("_", "-"),
                              key + "\u200b", "\ufeff" + key])
            node[new] = node.pop(key)
        elif op in (3, 4):
            node[key] = _odd_value(rng)
        elif op == 5:
            node[key] = _deep(rng)
        elif op == 6:
            node[key] = _long(rng)
        else:
            node[key] = [node[key]] if rng.random() < 0.5 else {"value": node[key]}
        return doc
    # a list
    if not node or op == 8:
        node.append(_odd_value(rng))
    elif op == 0:
        node.pop(rng.randrange(len(node)))
    elif op == 1:
        small = len(dumps(node[0])) < 1000
        node.extend([node[0]] * (rng.choice([1, 50, 2000]) if small else 1))
    elif op in (2, 3, 4):
        node[rng.randrange(len(node))] = _odd_value(rng)
    elif op == 5:
        node[rng.randrange(len(node))] = _deep(rng)
    elif op == 6:
        node.append(_long(rng))
    else:
        node.clear()
    return doc


def _with_duplicate(doc: Any, node: dict, key: str, rng: random.Random) -> Any:
    """`doc` with `node` written as pairs whose `key` appears twice (same or another value)."""
    pairs = Pairs(node.items())
    pairs.insert(rng.randrange(len(pairs) + 1), (key, node[key] if rng.random() < 0.5 else _odd_value(rng)))

    def swap(value: Any) -> Any:
        if value is node:
            return pairs
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    return swap(doc)


def _mutate_text(text: bytes, rng: random.Random) -> bytes:
    op = rng.randrange(10)
    if op == 0 and text:
        return text[:rng.randrange(len(text))]
    if op == 1:
        return b"\xef\xbb\xbf" + text
    if op == 2:
        return text + rng.choice([b"}", b" x", b"\x00", b",", b"{}", b"\n\n"])
    if op == 3 and text:
        i = rng.randrange(len(text))
        return text[:i] + bytes([rng.randrange(256)]) + text[i + 1:]
    if op == 4:
        return rng.choice([b"", b"null", b"[]", b"\"x\"", b"1", b"true", b"{", b"}", b"{}", b"\xff\xfe{}",
                           b'{"a":1}{"a":1}', b"{\"model\":\"\\ud800\"}"])
    if op == 5 and text:
        i = rng.randrange(len(text))
        return text[:i] + rng.choice([b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xfe"]) + text[i:]
    if op == 6:
        return text.replace(b":", b" : ", 1).replace(b",", b",\t\r\n", 1)
    if op == 7:
        return text.decode("utf-8", "replace").encode("utf-16")
    if op == 8:
        return b"  \r\n" + text + b"\r\n  "
    return text.replace(b'"', b"'", 2)


def mutate_json(doc: Any, rng: random.Random) -> bytes:
    """A mutated JSON body: one to three structural mutations, sometimes a textual one on top."""
    for _ in range(rng.randint(1, 3)):
        doc = _mutate_tree(doc, rng) if not isinstance(doc, (Pairs, Raw)) else doc
    text = dumps(doc).encode("utf-8", "surrogatepass")
    if len(text) > MAX_JSON_BYTES:   # several long values grown together: the bound still gets its text cut
        text = text[:MAX_JSON_BYTES]
    if rng.random() < 0.2:
        text = _mutate_text(text, rng)
    return text


# ---- requests on the wire ------------------------------------------------------------------------------

@dataclass
class Case:
    """One fuzz input: `data` is every byte sent, in `pieces` sent one after another."""

    family: str                    # "json", "multipart" or "http"
    mutation: str                  # what was done, for the counts and the reproducer
    route: str                     # "METHOD /path" of the example it came from
    pieces: list[bytes]
    half_close: bool = False       # shut our write side after sending (framing cases)
    expected: int = 1              # responses a server that parsed it as sent would give (pipelining)
    head: bool = False             # the last request is a HEAD: its response has no body

    @property
    def data(self) -> bytes:
        return b"".join(self.pieces)


def request_bytes(method: str, path: str, headers: list[tuple[str, str]], body: bytes | None,
                  close: bool = True) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: loom", *(f"{k}: {v}" for k, v in headers)]
    if close:
        head.append("Connection: close")
    if body is not None:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("utf-8", "surrogateescape") + (body or b"")


def _example_headers(example: Example, body: bytes | None, content_type: str = "application/json"
                     ) -> list[tuple[str, str]]:
    headers = list(example.headers.items())
    if body is not None:
        headers.append(("Content-Type", content_type))
    return headers


def json_case(example: Example, rng: random.Random) -> Case:
    route = f"{example.method} {example.path}"
    if example.body is None:   # a route that takes no body: give it one, or mutate its headers
        body = mutate_json({"model": "x"}, rng) if rng.random() < 0.5 else None
        headers = [(k, v if rng.random() < 0.5 else str(_odd_value(rng))) for k, v in example.headers.items()]
        if body is not None:
            headers.append(("Content-Type", "application/json"))
        return Case("json", "no-body-route", route, [request_bytes(example.method, example.path, headers, body)])
    body = mutate_json(example.body, rng)
    content_type = "application/json"
    if rng.random() < 0.1:
        content_type = rng.choice(["application/x-www-form-urlencoded", "text/plain", "application/json; charset=utf-16",
                                   "application/octet-stream", "multipart/form-data; boundary=x", "", "application/*"])
    return Case("json", "json-body", route,
                [request_bytes(example.method, example.path, _example_headers(example, body, content_type), body)])


# ---- multipart -----------------------------------------------------------------------------------------

WAV = (b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x80>\x00\x00\x00}\x00\x00\x02\x00\x10\x00"
       b"data\x00\x00\x00\x00")


@dataclass
class Part:
    headers: list[tuple[str, str]]
    data: bytes


def _disposition(name: str, filename: str | None = None) -> str:
    value = f'form-data; name="{name}"'
    return value if filename is None else value + f'; filename="{filename}"'


def multipart_parts(kind: str, sources: dict[str, bytes], model: str) -> list[Part]:
    """The parts of a valid upload: a registration package of `sources`, or a transcription."""
    if kind == "transcribe":
        return [Part([("Content-Disposition", _disposition("model"))], b"recognizer"),
                Part([("Content-Disposition", _disposition("file", "a.wav")), ("Content-Type", "audio/wav")], WAV),
                Part([("Content-Disposition", _disposition("response_format"))], b"json"),
                Part([("Content-Disposition", _disposition("temperature"))], b"0")]
    doc = {"model": model, "kind": "sequence", "control": "control.loom", "prepare": "prepare.loom",
           "sources": ["model.loom"], "checkpoint": "w.safetensors", "rows": 2, "context_length": 16}
    parts = [Part([("Content-Disposition", _disposition("request", "request.json")),
                   ("Content-Type", "application/json")], json.dumps(doc).encode())]
    parts += [Part([("Content-Disposition", _disposition("file", name))], data) for name, data in sources.items()]
    return parts


def encode_multipart(parts: list[Part], boundary: str, *, crlf: bytes = b"\r\n", close: bool = True) -> bytes:
    b = boundary.encode("utf-8", "surrogateescape")
    out = []
    for part in parts:
        head = b"".join(f"{k}: {v}".encode("utf-8", "surrogateescape") + crlf for k, v in part.headers)
        out.append(b"--" + b + crlf + head + crlf + part.data + crlf)
    if close:
        out.append(b"--" + b + b"--" + crlf)
    return b"".join(out)


ODD_FILENAMES = ["../x.loom", "/etc/passwd", "", "a\x00b", "model//x", "C:/x", "..\\x", "x\n.loom", "ü.loom",
                 "a" * 5000, ".", "model.loom/..", '" name="file', "\u202ex.loom"]


def multipart_case(example: Example, rng: random.Random, sources: dict[str, bytes]) -> Case:
    parts = multipart_parts(example.multipart or "register", sources, "fuzzreg" + str(rng.randrange(4)))
    boundary = "loomfuzz" + "".join(rng.choice("0123456789abcdef") for _ in range(16))
    body_boundary, crlf, close, mutation = boundary, b"\r\n", True, ""
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(13)
        k = rng.randrange(len(parts)) if parts else 0
        if op == 0 and parts:
            parts.pop(k); mutation += "drop-part,"
        elif op == 1 and parts:
            parts.insert(k, parts[k]); mutation += "repeat-part,"
        elif op == 2 and parts:
            parts[k].headers = [h for h in parts[k].headers if h[0] != "Content-Disposition"]; mutation += "no-disposition,"
        elif op == 3 and parts:
            parts[k].headers.append(rng.choice([("Content-Disposition", "form-data"), ("X-A", "b"), ("Content-Type", ""),
                                                ("Bad Header", "x"), ("Content-Disposition", 'form-data; name*=UTF-8\'\'x'),
                                                ("X-Long", "v" * 20000), ("X-\udcff", "x")]))
            mutation += "part-header,"
        elif op == 4 and parts:
            name = rng.choice(["file", "request", "model", "", "FILE", "unknown", "file\x00", 'a"b'])
            parts[k].headers = [("Content-Disposition", _disposition(name, rng.choice([None] + ODD_FILENAMES)))]
            mutation += "disposition,"
        elif op == 5 and parts:
            parts[k].headers = [("Content-Disposition", _disposition("file", rng.choice(ODD_FILENAMES)))]
            mutation += "filename,"
        elif op == 6:
            boundary = rng.choice(["", "x" * 71, "a b ", '"quoted"', "é", "x", "--", boundary + ";x=1"])
            body_boundary = boundary if rng.random() < 0.5 else body_boundary
            mutation += "boundary,"
        elif op == 7:
            body_boundary = body_boundary[:-1] or "z"; mutation += "boundary-mismatch,"
        elif op == 8:
            crlf = b"\n"; mutation += "lf-only,"
        elif op == 9:
            close = False; mutation += "no-closing-boundary,"
        elif op == 10 and parts:
            try:
                parts[k].data = mutate_json(json.loads(parts[k].data), rng)
            except (ValueError, RecursionError):   # not JSON (or nested past the decoder): cut it short
                parts[k].data = parts[k].data[:rng.randrange(len(parts[k].data) + 1)]
            mutation += "part-data,"
        elif op == 11 and parts:
            parts[k].data += b"\r\n--" + body_boundary.encode("utf-8", "surrogateescape"); mutation += "boundary-in-data,"
        else:
            parts = (parts * rng.choice([2, 1100]))[:4100]; mutation += "many-parts,"
    body = encode_multipart(parts, body_boundary, crlf=crlf, close=close)
    if rng.random() < 0.15:
        body = rng.choice([b"preamble\r\n", b"", b"--\r\n"]) + body + rng.choice([b"", b"epilogue", b"\r\n--x--"])
    if rng.random() < 0.1 and body:
        body = body[:rng.randrange(len(body))]; mutation += "truncated,"
    content_type = rng.choice([f"multipart/form-data; boundary={boundary}", f'multipart/form-data; boundary="{boundary}"',
                               f"multipart/form-data; boundary={boundary}; boundary=x", "multipart/form-data",
                               f"multipart/mixed; boundary={boundary}"]) if "boundary" in mutation or rng.random() < 0.1 \
        else f"multipart/form-data; boundary={boundary}"
    headers = [("Content-Type", content_type)]
    return Case("multipart", mutation.rstrip(",") or "none", f"{example.method} {example.path}",
                [request_bytes(example.method, example.path, headers, body)])


# ---- raw HTTP framing ----------------------------------------------------------------------------------

def _chunked(body: bytes, rng: random.Random, ext: str = "") -> list[bytes]:
    size = rng.choice([1, 3, 7, 64, 4096])
    return [b"%x%s\r\n%s\r\n" % (len(body[i:i + size]), ext.encode(), body[i:i + size])
            for i in range(0, len(body), size)]


def http_case(example: Example, rng: random.Random) -> Case:
    """A request to `example`'s route with its request line, headers or framing mutated."""
    body = dumps(example.body).encode() if example.body is not None else b""
    method, target, version = example.method, example.path, "HTTP/1.1"
    headers: list[tuple[str, str]] = [("Host", "loom"), *example.headers.items(), ("Content-Type", "application/json")]
    framing: list[tuple[str, str]] = [("Content-Length", str(len(body)))]
    payload: list[bytes] = [body]
    eol, half_close, pipeline = "\r\n", False, 1
    ops = []
    for _ in range(rng.randint(1, 2)):
        op = rng.randrange(14)
        ops.append(("request-line", "header", "header-value", "huge-headers", "content-length", "transfer-encoding",
                    "chunks", "chunk-extension", "truncated", "te-and-cl", "expect", "pipeline", "lf-only",
                    "many-headers")[op])
        if op == 0:
            which = rng.randrange(3)
            if which == 0:
                method = rng.choice(["get", "P0ST", "POST ", "PATCH", "OPTIONS", "HEAD", "TRACE", "CONNECT", "X" * 300,
                                     "", "PO\x00ST", "M-SEARCH", "PRI"])
            elif which == 1:
                target = rng.choice([target + "?a=1&a=2", target + "%00", target + "/..", "/%2e%2e/v1/models", "*",
                                     "http://loom" + target, target + "#frag", "/" + "a" * 70000, target.upper(),
                                     target + "\x7f", target + " x", "", "//" + target, target.replace("/", "%2F")])
            else:
                version = rng.choice(["HTTP/1.0", "HTTP/1.2", "HTTP/2.0", "HTTP/1", "http/1.1", "HTTP/1.1 x",
                                      "HTTP/0.9", "HTTP/11", "", "HTTP/1.1\x00"])
        elif op == 1:
            headers.append(rng.choice([("", "x"), ("X A", "b"), ("X-A ", "b"), ("X\x00", "b"), ("X-ü", "b"),
                                       ("Host", "other"), ("X-A", "b\r\n c"), (" X-Folded", "x"), ("X:Y", "z"),
                                       ("Content-Type", "application/json"), ("Connection", "keep-alive, close"),
                                       ("Upgrade", "websocket"), ("Connection", "Upgrade")]))
        elif op == 2:
            i = rng.randrange(len(headers))
            headers[i] = (headers[i][0], rng.choice(["", " ", "\x00", "\udcff\udcfe", "a\rb", "x" * 9000,
                                                     headers[i][1] + "\t", "\"" + headers[i][1]]))
        elif op == 3:
            headers.append(("X-Huge", "h" * rng.choice([8190, 8191, 16384, 70000, 1 << 20])))
        elif op == 4:
            n = len(body)
            framing = rng.choice([
                [("Content-Length", str(n)), ("Content-Length", str(n))],
                [("Content-Length", str(n)), ("Content-Length", str(n + 1))],
                [("Content-Length", f"{n}, {n}")], [("Content-Length", "-1")], [("Content-Length", f"+{n}")],
                [("Content-Length", hex(n))], [("Content-Length", str(2**64))], [("Content-Length", f" {n} ")],
                [("Content-Length", str(n + rng.randint(1, 100)))], [("Content-Length", str(max(n - 3, 0)))],
                [("Content-Length", "")], [("Content-Length", "1e3")], [("Content-Length", "0" * 50 + str(n))],
                [("content-length", str(n))]])
            half_close = True
        elif op in (5, 6, 7):
            ext = "" if op != 7 else rng.choice([";a=b", ";a", ";" + "e" * 5000, ";a=\"b c\"", "; a = b", ";\x00"])
            framing = [("Transfer-Encoding", rng.choice(["chunked"] * 4 + ["Chunked", " chunked", "chunked, chunked",
                                                                          "gzip, chunked", "chunked, gzip", "identity",
                                                                          "chunked\t", "x-chunked", "chunked;q=1"]))]
            payload = _chunked(body, rng, ext) + [b"0\r\n\r\n"]
            if op == 6:
                i = rng.randrange(len(payload))
                payload[i] = rng.choice([b"fffffffffffffffffff\r\n", b"-1\r\n", b"0x10\r\n", b"10\r\nabc\r\n",
                                         b"\r\n", b"zz\r\n", b"0000000000000000000000001\r\na\r\n",
                                         payload[i].replace(b"\r\n", b"\n"), payload[i][:-2],
                                         b"0\r\nX-Trailer: 1\r\n\r\n", b"1 \r\na\r\n", payload[i] + payload[i]])
            half_close = True
        elif op == 8:
            wire = b"".join(payload)
            cut = rng.randrange(len(wire)) if wire else 0
            payload, half_close = [wire[:cut]], True
        elif op == 9:
            framing = [("Content-Length", str(len(body))), ("Transfer-Encoding", "chunked")]
            if rng.random() < 0.5:
                framing.reverse()
            payload = _chunked(body, rng) + [b"0\r\n\r\n"] if rng.random() < 0.5 else payload
            half_close = True
        elif op == 10:
            headers.append(("Expect", rng.choice(["100-continue", "100-Continue", "100-continue, x", "foo", "", "200-ok"])))
        elif op == 11:
            pipeline = rng.randint(2, 4)
        elif op == 12:
            eol = "\n"
        else:
            headers += [(f"X-H{i}", "v") for i in range(rng.choice([100, 101, 128, 1000]))]
    head = [f"{method} {target} {version}".rstrip(" ") if version else f"{method} {target}",
            *(f"{k}: {v}" for k, v in headers + framing)]
    last = (eol.join(head + ["Connection: close"]) + eol + eol).encode("utf-8", "surrogateescape")
    pieces: list[bytes] = []
    if pipeline > 1:   # earlier copies keep the connection open; valid ones answer before the mutated one
        valid = request_bytes(example.method, example.path, _example_headers(example, body or None), body or None,
                              close=False)
        pieces += [valid] * (pipeline - 1)
    pieces += [last, *payload]
    if rng.random() < 0.2:   # the same bytes, split at one arbitrary point
        wire = b"".join(pieces)
        cut = rng.randrange(len(wire) + 1)
        pieces = [wire[:cut], wire[cut:]]
    return Case("http", "+".join(ops), f"{example.method} {example.path}", pieces, half_close, pipeline,
                method.upper() == "HEAD")


# ---- generation ----------------------------------------------------------------------------------------

def generate(seed: int, count: int, cases: list[Example], sources: dict[str, bytes],
             mix: tuple[float, float] = (0.45, 0.15)) -> Callable[[int], Case]:
    """`case(i)` for i in range(count): the i-th input of this seed (each from its own
    `Random(f"{seed}:{i}")`, so any one can be regenerated alone). `mix`: the shares of JSON and
    multipart cases; the rest are raw-HTTP framing cases."""
    bodied = [e for e in cases if e.body is not None or (e.method != "GET" and e.multipart is None)]
    uploads = [e for e in cases if e.multipart is not None]
    framed = [e for e in cases if e.path not in ENDLESS and e.multipart is None]

    def case(i: int) -> Case:
        rng = random.Random(f"{seed}:{i}")
        roll = rng.random()
        if roll < mix[0]:
            return json_case(rng.choice(bodied), rng)
        if roll < mix[0] + mix[1]:
            return multipart_case(rng.choice(uploads), rng, sources)
        return http_case(rng.choice(framed), rng)

    return case


# ---- playing a case ------------------------------------------------------------------------------------

@dataclass
class Outcome:
    statuses: list[int] = field(default_factory=list)
    closed: bool = False         # the server closed (or reset) the connection
    hung: bool = False           # the deadline passed before any answer or close
    problems: list[str] = field(default_factory=list)   # error bodies that miss the OpenAI shape, ...
    seconds: float = 0.0         # until the last response (or the close, or the deadline)


def check_error_body(status: int, headers: dict[str, str], body: bytes) -> str | None:
    """Why an error response is not `{"error": {"message", "type", "code"}}` JSON, or None."""
    if headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return f"{status} with Content-Type {headers.get('content-type')!r}: {body[:200]!r}"
    try:
        error = json.loads(body)["error"]
        ok = all(isinstance(error.get(k), str) and error[k] for k in ("message", "type", "code"))
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    return None if ok else f"{status} body is not an OpenAI-style error: {body[:300]!r}"


class _Wire:
    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline, self.buf, self.eof = sock, deadline, b"", False

    def more(self) -> bool:
        left = self.deadline - time.monotonic()
        if left <= 0 or self.eof:
            return False
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            return False
        except OSError:      # reset: the server closed without reading everything
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def until(self, marker: bytes) -> int:
        while (i := self.buf.find(marker)) < 0:
            if not self.more():
                return -1
        return i

    def take(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if not self.more():
                return None
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def _read_response(wire: _Wire, method_head: bool) -> tuple[int, dict[str, str], bytes | None] | None:
    """(status, headers, body or None if it did not complete) of the next final response."""
    while True:
        i = wire.until(b"\r\n\r\n")
        if i < 0:
            return None
        head, wire.buf = wire.buf[:i].decode("latin-1"), wire.buf[i + 4:]
        status_line, *lines = head.split("\r\n")
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError):
            return 0, {}, head.encode("latin-1")
        headers = {}
        for line in lines:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if 100 <= status < 200:
            continue
        break
    if method_head or status in (204, 304):
        return status, headers, b""
    if any(t in headers.get("content-type", "") for t in STREAMING_TYPES) and status < 400:
        return status, headers, None     # a stream: its head is the answer
    if "content-length" in headers:
        return status, headers, wire.take(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            j = wire.until(b"\r\n")
            if j < 0:
                return status, headers, None
            size = int(wire.buf[:j].split(b";")[0], 16)
            wire.buf = wire.buf[j + 2:]
            piece = wire.take(size + 2)
            if piece is None:
                return status, headers, None
            body += piece[:size]
            if size == 0:
                return status, headers, body
    while wire.more():
        pass
    body, wire.buf = wire.buf, b""
    return status, headers, body


def send(host: str, port: int, case: Case, deadline_s: float = 10.0) -> Outcome:
    """Play `case` on a fresh connection; read until the expected responses, a close, or the deadline."""
    out = Outcome()
    deadline = time.monotonic() + deadline_s
    try:
        sock = socket.create_connection((host, port), timeout=deadline_s)
    except OSError as exc:
        out.problems.append(f"cannot connect: {exc}")
        return out
    with sock:
        try:
            for piece in case.pieces:
                sock.sendall(piece)
            if case.half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass      # the server may close before reading everything (an early 4xx); read what it said
        wire = _Wire(sock, deadline)
        while len(out.statuses) < case.expected:
            head = case.head and len(out.statuses) == case.expected - 1   # its answer has no body to check
            got = _read_response(wire, head)
            if got is None:
                break
            status, headers, body = got
            out.statuses.append(status)
            if status >= 400 and body is not None and not head:
                problem = check_error_body(status, headers, body)
                if problem:
                    out.problems.append(problem)
            if body is None and not wire.eof and status >= 400:
                out.problems.append(f"{status} body did not complete within the deadline")
            if body is None or headers.get("connection", "").lower() == "close":
                break
        out.closed = wire.eof
        out.hung = not out.statuses and not wire.eof
    out.seconds = deadline_s - (deadline - time.monotonic())
    return out


def normal_chat(model: str) -> bytes:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}).encode()
    return request_bytes("POST", "/v1/chat/completions", [("Content-Type", "application/json")], body)


def mini_sources(weights: Path) -> dict[str, bytes]:
    """The files of a registration package of the `mini` test model (its weights at `weights`)."""
    mini = Path(__file__).resolve().parents[1] / "unit" / "loomrt" / "fixtures" / "mini"
    files = {name: (mini / name).read_bytes() for name in ("control.loom", "prepare.loom", "model.loom")}
    files["w.safetensors"] = weights.read_bytes()
    return files




# ---- a campaign: many cases, counted -------------------------------------------------------------------

@dataclass
class Summary:
    by_status: dict[str, int] = field(default_factory=dict)   # "400", "closed" (no answer, closed), "hang"
    failures: list[tuple[int, Case, Outcome]] = field(default_factory=list)   # >= 500, hangs, bad error bodies
    closed_by: dict[str, int] = field(default_factory=dict)   # cases closed unanswered, by mutation
    slow: int = 0     # answered, but after `SLOW_S` (queued behind other work on a loaded machine)

    def line(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in sorted(self.by_status.items()))


def campaign(host: str, port: int, case: Callable[[int], Case], count: int, *, start: int = 0, workers: int = 6,
             deadline_s: float = 10.0, progress: Callable[[int, Summary], None] | None = None) -> Summary:
    """Play cases `start .. start+count` with `workers` connections at a time; count the outcomes."""
    from concurrent.futures import ThreadPoolExecutor

    summary = Summary()

    def play(i: int) -> tuple[int, Case, Outcome]:
        c = case(i)
        return i, c, send(host, port, c, deadline_s)

    with ThreadPoolExecutor(workers) as pool:
        for n, (i, c, out) in enumerate(pool.map(play, range(start, start + count)), 1):
            keys = [str(s) for s in out.statuses] or ["hang" if out.hung else "closed"]
            for key in keys:
                summary.by_status[key] = summary.by_status.get(key, 0) + 1
            summary.slow += out.seconds > SLOW_S and not out.hung
            if keys == ["closed"]:
                what = f"{c.family}:{c.mutation}" + (" (half-closed)" if c.half_close else "")
                summary.closed_by[what] = summary.closed_by.get(what, 0) + 1
            if out.hung or out.problems or any(s >= 500 or s == 0 for s in out.statuses):
                summary.failures.append((i, c, out))
            if progress is not None and n % 1000 == 0:
                progress(n, summary)
    return summary


def save_reproducer(directory: Path, seed: int, i: int, case: Case, out: Outcome) -> Path:
    """`case`'s bytes as `seed-i.bin` and what happened as `seed-i.txt`; replay with
    `bench/fuzz.py --replay FILE --url HOST:PORT` (or `nc`, half-closing when the .txt says so)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{seed}-{i}.bin"
    path.write_bytes(case.data)
    path.with_suffix(".txt").write_text(
        f"seed {seed} case {i}: {case.family} {case.route} ({case.mutation}); half_close={case.half_close} "
        f"expected={case.expected}\nstatuses={out.statuses} closed={out.closed} hung={out.hung}\n"
        + "".join(p + "\n" for p in out.problems))
    return path


# ---- the daemon both the test and the tool use ---------------------------------------------------------

TEXT, SEQUENCE, SPARE = "scout", "mini", "spare"


def start_daemon(tmp: Path, *extra_args: str):
    """A `loomd` serving scout (chat, tokenize, checkpoints), `mini` (a native-only sequence
    deployment: /v1/sequences bodies pass the host's checks, then get its 404) and `spare` (a `mini`
    the admin examples may drain, pin or remove): `tests/conformance/scout_daemon.start_scout`."""
    from conformance_support import write_document
    from scout_daemon import start_scout

    docs = [write_document(tmp, SEQUENCE), write_document(tmp, SPARE)]
    return start_scout(tmp, *docs, extra_args=extra_args, rows=2, context_length=256, max_output_tokens=8,
                       checkpoint_capacity=2, session_cache_capacity=2)


WARM_UP_TIMEOUT_S = 300.0


def warm_up(server) -> None:
    """Two chats (plain and streamed) before fuzzing. With a cold kernel cache, scout is ready before
    its kernels are compiled: the first chat compiles them (30-50 s on a loaded 2-core machine)
    and every chat admitted meanwhile waits, which the per-case deadline would count as hangs
    of whatever fuzzed chats came first."""
    chat = json.loads(normal_chat(TEXT).partition(b"\r\n\r\n")[2])
    for body in (chat, {**chat, "stream": True}):
        response = server.request("POST", "/v1/chat/completions", body, timeout=WARM_UP_TIMEOUT_S)
        assert response.status == 200, (response.status, response.body[:500])


def fuzz_inputs(tmp: Path, seed: int, count: int) -> Callable[[int], Case]:
    """The cases of `seed` for `start_daemon`'s deployments."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "loomrt"))
    from mini_package import mini_weights

    weights, _, _ = mini_weights(tmp, name="fuzz-weights.safetensors")
    return generate(seed, count, examples(TEXT, SEQUENCE, SPARE), mini_sources(weights))


__all__ = ["Case", "Example", "Outcome", "Summary", "campaign", "check_error_body", "examples", "fuzz_inputs",
           "generate", "http_case", "json_case", "mini_sources", "missing_examples", "multipart_case", "mutate_json",
           "normal_chat", "save_reproducer", "send", "served_routes", "start_daemon", "warm_up"]
