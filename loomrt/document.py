"""The model document: the strict validator and path resolver `POST /v1/models/register` calls.

`parse_document` turns the JSON that registers one deployment into a frozen
`ModelDocument`, or raises `InvalidRequest` (400) naming the field path exactly, the way
`loomd` shows it to the client: `limits.max_output_tokens: expected integer, got "4096"`.
Unknown, duplicate and wrongly typed fields all reject, and so do fields the document's
kind does not use: a silently ignored `rows` on an embedding model is a deployment that
does not do what its author thinks. `docs/model-document.md` is the reference; a test
keeps its tables and `FIELDS` equal.

Paths are resolved here, not read: a `FileRef` says whether a path names a member of the
uploaded package (already checked present: the spec forbids falling back to server
files), a server-local file, or a `package:` locator. Server-local files are read when
the registration compiles and prepares, where a missing one fails the registration.
`loomc check` reads only the code fields, in `loomc/check/document.py`, with its own
diagnostics; the two agree on how local relative paths resolve (the document's directory).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from loomrt.errors import InvalidRequest
from loomrt.fields import decode_object, expect_integer as _integer, expect_name as _name
from loomrt.fields import expect_object as _object, expect_string as _string, fail as _fail
from loomrt.fields import reject_unknown as _unknown, shown as _shown
from loomrt.locator import is_locator, parse_locator
from loomrt.package import PackageFiles, join_inside, reference_problem, validate_member_name

KINDS = ("text", "sequence", "embedding", "decision", "image", "speech", "recognition")
_ALL = KINDS
_ROWS = ("text", "sequence")
_VARIANTS = ("text", "sequence", "embedding", "decision", "image")

# Top-level field -> the kinds that use it. Order is the documentation's order.
_TOP: dict[str, tuple[str, ...]] = {
    "model": _ALL, "kind": _ALL, "control": _ALL, "prepare": _ALL, "sources": _ALL, "tokenizer": _ALL,
    "checkpoint": _ALL, "assets": _ALL, "base_directory": _ALL, "admission": _ALL, "device": _ALL,
    "config": _ALL, "rows": (*_ROWS, "recognition", "image"), "context_length": _ROWS, "limits": ("text",), "pool_capacity": (*_ROWS, "decision"),
    "pending_capacity": _ALL, "variant_capacity": _VARIANTS, "checkpoint_capacity": _ROWS,
    "checkpoint_backing": _ROWS,
    "session_cache_capacity": ("text",), "prefix_cache_capacity": ("text",), "components": ("text", "speech"),
    "loras": ("image",), "voices": ("speech",), "width": ("image",), "height": ("image",),
    "specialization_capacity": ("image",),
}
_LIMITS = ("max_output_tokens",)
#: The extra components each kind may declare (beside its primary one): an image-input text
#: model's vision encoder, a speech model's phonemizer fallback network.
COMPONENTS_BY_KIND = {"text": "image", "speech": "phonemizer"}
_COMPONENTS = tuple(COMPONENTS_BY_KIND.values())
_COMPONENT = ("sources", "prepare", "checkpoint")

#: Every field path the validator knows; `docs/model-document.md` documents exactly these.
FIELDS: tuple[str, ...] = (*_TOP, *(f"limits.{k}" for k in _LIMITS),
                           *(f for c in _COMPONENTS for f in (f"components.{c}",
                                                             *(f"components.{c}.{k}" for k in _COMPONENT))))

MAX_ROWS = 256
MAX_CONTEXT_LENGTH = 1_048_576
MAX_POOL_CAPACITY = 16_777_216
MAX_DEVICE = 255
MAX_PENDING_CAPACITY = 65_536
MAX_VARIANT_CAPACITY = 64
MAX_CHECKPOINT_CAPACITY = 4096
MAX_SESSION_CACHE_CAPACITY = 65_536
MIN_IMAGE_SIDE, MAX_IMAGE_SIDE, IMAGE_SIDE_STEP = 64, 4096, 8
DEFAULT_ROWS = 8
DEFAULT_RECOGNITION_ROWS = 4   # a row holds a window's encoder output (24 MB for Whisper tiny)
DEFAULT_CONTEXT_LENGTH = 4096
DEFAULT_PENDING_CAPACITY = 64
DEFAULT_CHECKPOINT_CAPACITY = 0
DEFAULT_IMAGE_SIDE = 512
DEFAULT_IMAGE_ROWS = 4           # images generated in one call
DEFAULT_SPECIALIZATION_CAPACITY = 4


@dataclass(frozen=True)
class FileRef:
    """Where one authored path points.

    `where` is "package" (`path` is a member name, or a directory prefix for `assets`;
    "" is the package root), "server" (`path` is absolute and normalized) or "locator"
    (`path` is the `package:` locator, resolved by `loomrt.locator` when read)."""

    authored: str
    where: Literal["package", "server", "locator"]
    path: str


@dataclass(frozen=True)
class ExtraComponent:
    """A component beside the primary one (`COMPONENTS_BY_KIND`): its own providers and weights,
    loaded and evicted on its own."""

    sources: tuple[FileRef, ...] = ()
    prepare: FileRef | None = None
    checkpoint: tuple[FileRef, ...] | None = None   # one file, or several read as one (`_checkpoint`)


@dataclass(frozen=True)
class ModelDocument:
    """A validated model document with defaults filled in and paths resolved.

    Fields a kind does not use are None (or empty), never a default that means nothing."""

    model: str
    kind: str
    control: FileRef
    sources: tuple[FileRef, ...]
    prepare: FileRef | None = None
    tokenizer: FileRef | None = None
    checkpoint: tuple[FileRef, ...] | None = None   # one file, or several read as one (`_checkpoint`)
    assets: FileRef | None = None             # where asset metadata is read (package or server)
    assets_weights: FileRef | None = None     # where asset weight files are read (always server)
    base_directory: str | None = None
    admission: Literal["open", "drained"] = "open"
    device: str | int = "cpu"
    config: Mapping[str, str | int | float | bool] = field(default_factory=lambda: MappingProxyType({}))
    rows: int | None = None
    context_length: int | None = None
    max_output_tokens: int | None = None      # `limits.max_output_tokens`
    pool_capacity: int | None = None
    pending_capacity: int = DEFAULT_PENDING_CAPACITY
    variant_capacity: int = 0
    checkpoint_capacity: int = DEFAULT_CHECKPOINT_CAPACITY
    checkpoint_backing: Literal["elastic", "fixed"] = "elastic"   # where pins may live (loomrt/pins.py)
    session_cache_capacity: int = 0
    prefix_cache_capacity: int = 0
    components: Mapping[str, ExtraComponent] = field(default_factory=lambda: MappingProxyType({}))
    loras: Mapping[str, FileRef] = field(default_factory=lambda: MappingProxyType({}))
    specialization_capacity: int | None = None   # image: sizes kept compiled at once, the default's included
    voices: Mapping[str, FileRef] = field(default_factory=lambda: MappingProxyType({}))
    width: int | None = None
    height: int | None = None
    origin: str = ""
    packaged: bool = False                    # whether code and metadata came from an upload

    @property
    def image(self) -> ExtraComponent | None:
        """`components.image`: an image-input text model's vision component."""
        return self.components.get("image")


class _Resolver:
    """Resolves authored paths for one document: code/metadata in the package or beside
    the document, weights under `base_directory` (or beside a local document)."""

    def __init__(self, package: PackageFiles | None, origin: str, base_directory: str | None):
        self.package = package
        self.base_directory = base_directory
        if package is not None:
            try:
                validate_member_name(origin)
            except InvalidRequest as exc:
                raise InvalidRequest(f"request filename: {exc.message}") from None
            self.doc_dir = posixpath.dirname(origin)
        else:
            self.doc_dir = os.path.dirname(os.path.abspath(origin))

    def _server_local(self, path: str, ref: str) -> FileRef | None:
        problem = reference_problem(ref)
        if problem:
            raise _fail(path, problem)
        if is_locator(ref):
            try:
                parse_locator(ref)
            except InvalidRequest as exc:
                raise _fail(path, exc.message) from None
            return FileRef(ref, "locator", ref)
        if ref.startswith("/"):
            return FileRef(ref, "server", posixpath.normpath(ref))
        return None

    def code(self, path: str, value: Any, *, directory: bool = False) -> FileRef:
        ref = _string(path, value)
        local = self._server_local(path, ref)
        if local is not None:
            return local
        if self.package is None:
            return FileRef(ref, "server", os.path.normpath(os.path.join(self.doc_dir, ref)))
        member = join_inside(self.doc_dir, ref)
        if member is None:
            raise _fail(path, f"{ref!r} escapes the package root")
        present = self.package.has_directory(member) if directory else member in self.package
        if not present:
            raise _fail(path, f"{ref!r} is not in the uploaded package (looked for {member or '.'!r}); "
                              "relative paths never fall back to server files")
        return FileRef(ref, "package", member)

    def weights(self, path: str, value: Any, *, required: bool = True) -> FileRef | None:
        ref = _string(path, value)
        local = self._server_local(path, ref)
        if local is not None:
            return local
        if self.base_directory is not None:
            return FileRef(ref, "server", posixpath.normpath(posixpath.join(self.base_directory, ref)))
        if self.package is None:
            return FileRef(ref, "server", os.path.normpath(os.path.join(self.doc_dir, ref)))
        if not required:
            return None
        raise _fail(path, f"relative path {ref!r} with an uploaded package needs an absolute base_directory "
                          "(checkpoint bytes are always read from the server filesystem)")


def _checkpoint(path: str, value: Any, r: Any) -> tuple[FileRef, ...]:
    """A checkpoint: one weight path, or a nonempty list of them whose tensors `prepare` reads
    as one namespace (a component whose weights come from two packages: a backbone's ONNX and
    a projector trained here). `loomrt.checkpoints.open_checkpoints` refuses a name in two."""
    if isinstance(value, list):
        if not value:
            raise _fail(path, "must name at least one weight file")
        return tuple(r.weights(f"{path}[{i}]", v) for i, v in enumerate(value))
    return (r.weights(path, value),)


def _path_list(path: str, value: Any, resolve) -> tuple[FileRef, ...]:
    if not isinstance(value, list):
        raise _fail(path, f"expected array of paths, got {_shown(value)}")
    if not value:
        raise _fail(path, "must name at least one source")
    return tuple(resolve(f"{path}[{i}]", v) for i, v in enumerate(value))


def _config(value: Any) -> Mapping[str, str | int | float | bool]:
    obj = _object("config", value)
    for key, v in obj.items():
        if key == "":
            raise _fail("config", "override names must not be empty")
        if v is None or isinstance(v, (dict, list)):
            raise _fail(f"config.{key}", f"expected string, number or boolean, got {_shown(v)}")
    return MappingProxyType(dict(obj))


def _by_id(path: str, value: Any, resolver: _Resolver) -> Mapping[str, FileRef]:
    obj = _object(path, value)
    out: dict[str, FileRef] = {}
    for key, v in obj.items():
        _name(f"{path}.{key}", key, "an id")
        out[key] = resolver.weights(f"{path}.{key}", v)  # type: ignore[assignment]
    return MappingProxyType(out)


def _image_side(doc: dict[str, Any], key: str) -> int:
    if key not in doc:
        return DEFAULT_IMAGE_SIDE
    v = _integer(key, doc[key], MIN_IMAGE_SIDE, MAX_IMAGE_SIDE)
    if v % IMAGE_SIDE_STEP:
        raise _fail(key, f"{v} is not a multiple of {IMAGE_SIDE_STEP}")
    return v


def parse_document(text_or_bytes: str | bytes, *, package: PackageFiles | None = None,
                   origin: str) -> ModelDocument:
    """Validate a model document and resolve its paths.

    `origin` is where the document came from: with an uploaded `package`, the request
    part's filename inside it (relative references start from its directory; the spec's
    default is "request.json"); otherwise the document's path on the server."""
    doc = decode_object(text_or_bytes, "model document")
    _unknown(doc, tuple(_TOP))
    for key in ("model", "kind", "control", "sources"):
        if key not in doc:
            raise InvalidRequest(f"{key}: required field is missing", param=key)
    model = _name("model", doc["model"], "a model name")
    kind = _string("kind", doc["kind"])
    if kind not in KINDS:
        raise _fail("kind", f"expected one of {', '.join(KINDS)}, got {_shown(kind)}")
    for key in doc:
        if kind not in _TOP[key]:
            raise _fail(key, f"not used by kind '{kind}' (used by {', '.join(_TOP[key])})")
    if kind == "text" and "tokenizer" not in doc:
        raise InvalidRequest("tokenizer: required field for kind 'text' is missing", param="tokenizer")

    base_directory = None
    if "base_directory" in doc:
        base_directory = _string("base_directory", doc["base_directory"])
        problem = reference_problem(base_directory) or (
            None if base_directory.startswith("/") else f"must be an absolute path, got {_shown(base_directory)}")
        if problem:
            raise _fail("base_directory", problem)
        base_directory = posixpath.normpath(base_directory)
    r = _Resolver(package, origin, base_directory)

    out: dict[str, Any] = {"model": model, "kind": kind, "origin": origin, "packaged": package is not None,
                           "base_directory": base_directory}
    out["control"] = r.code("control", doc["control"])
    out["sources"] = _path_list("sources", doc["sources"], r.code)
    for key in ("prepare", "tokenizer"):
        if key in doc:
            out[key] = r.code(key, doc[key])
    if "checkpoint" in doc:
        out["checkpoint"] = _checkpoint("checkpoint", doc["checkpoint"], r)
    if "assets" in doc:
        out["assets"] = r.code("assets", doc["assets"], directory=True)
        out["assets_weights"] = r.weights("assets", doc["assets"], required=False)
    if "admission" in doc:
        admission = _string("admission", doc["admission"])
        if admission not in ("open", "drained"):
            raise _fail("admission", f"expected \"open\" or \"drained\", got {_shown(admission)}")
        out["admission"] = admission
    if "device" in doc:
        device = doc["device"]
        if isinstance(device, str):
            if device != "cpu":
                raise _fail("device", f"expected \"cpu\" or a device ordinal, got {_shown(device)}")
            out["device"] = device
        elif isinstance(device, int) and not isinstance(device, bool):
            out["device"] = _integer("device", device, 0, MAX_DEVICE)
        else:
            raise _fail("device", f"expected \"cpu\" or integer, got {_shown(device)}")
    if "config" in doc:
        out["config"] = _config(doc["config"])

    def capacity(key: str, hi: int, default: int) -> int:
        return _integer(key, doc[key], 0, hi) if key in doc else default

    out["pending_capacity"] = capacity("pending_capacity", MAX_PENDING_CAPACITY, DEFAULT_PENDING_CAPACITY)
    out["variant_capacity"] = capacity("variant_capacity", MAX_VARIANT_CAPACITY, 0)
    out["checkpoint_capacity"] = capacity("checkpoint_capacity", MAX_CHECKPOINT_CAPACITY,
                                          DEFAULT_CHECKPOINT_CAPACITY)
    if "checkpoint_backing" in doc:
        backing = _string("checkpoint_backing", doc["checkpoint_backing"])
        if backing not in ("elastic", "fixed"):
            raise _fail("checkpoint_backing", f"expected \"elastic\" or \"fixed\", got {_shown(backing)}")
        out["checkpoint_backing"] = backing
    if kind in _ROWS:
        _rows_fields(doc, kind, out)
    elif kind == "recognition":    # windows decoded at once, each with its encoding in per-row state
        out["rows"] = _integer("rows", doc["rows"], 1, MAX_ROWS) if "rows" in doc else DEFAULT_RECOGNITION_ROWS
    elif kind == "image":          # images of one size generated in one call
        out["rows"] = _integer("rows", doc["rows"], 1, MAX_ROWS) if "rows" in doc else DEFAULT_IMAGE_ROWS
    elif "pool_capacity" in doc:   # a decision deployment's KV pool (its passes have no rows)
        out["pool_capacity"] = _integer("pool_capacity", doc["pool_capacity"], 1, MAX_POOL_CAPACITY)
    if kind == "text":
        out["session_cache_capacity"] = capacity("session_cache_capacity", MAX_SESSION_CACHE_CAPACITY, 0)
        out["prefix_cache_capacity"] = capacity("prefix_cache_capacity", out["pool_capacity"], 0)
    if "components" in doc:
        out["components"] = MappingProxyType(_components(doc["components"], kind, r))
    if kind == "image":
        out["width"], out["height"] = _image_side(doc, "width"), _image_side(doc, "height")
        out["specialization_capacity"] = (
            _integer("specialization_capacity", doc["specialization_capacity"], 1, MAX_VARIANT_CAPACITY)
            if "specialization_capacity" in doc else DEFAULT_SPECIALIZATION_CAPACITY)
        if "loras" in doc:
            out["loras"] = _by_id("loras", doc["loras"], r)
    if kind == "speech" and "voices" in doc:
        out["voices"] = _by_id("voices", doc["voices"], r)
    return ModelDocument(**out)


def _rows_fields(doc: dict[str, Any], kind: str, out: dict[str, Any]) -> None:
    """rows, context_length, pool_capacity (text and sequence) and limits (text)."""
    rows = _integer("rows", doc["rows"], 1, MAX_ROWS) if "rows" in doc else DEFAULT_ROWS
    ctx = (_integer("context_length", doc["context_length"], 1, MAX_CONTEXT_LENGTH)
           if "context_length" in doc else DEFAULT_CONTEXT_LENGTH)
    if "pool_capacity" in doc:
        pool = _integer("pool_capacity", doc["pool_capacity"], 1, MAX_POOL_CAPACITY)
        if pool < ctx:
            raise _fail("pool_capacity", f"{pool} is smaller than context_length {ctx}: "
                                         "one full-length row could never fit")
    else:
        pool = max(ctx, min(rows * ctx, MAX_POOL_CAPACITY))
    out.update(rows=rows, context_length=ctx, pool_capacity=pool)
    if kind == "text":
        max_out = ctx
        if "limits" in doc:
            limits = _object("limits", doc["limits"])
            _unknown(limits, _LIMITS, "limits.")
            if "max_output_tokens" in limits:
                max_out = _integer("limits.max_output_tokens", limits["max_output_tokens"], 1, MAX_CONTEXT_LENGTH)
                if max_out > ctx:
                    raise _fail("limits.max_output_tokens", f"{max_out} is larger than context_length {ctx}")
        out["max_output_tokens"] = max_out


def _components(value: Any, kind: str, r: _Resolver) -> dict[str, ExtraComponent]:
    name = COMPONENTS_BY_KIND[kind]
    comps = _object("components", value)
    _unknown(comps, (name,), "components.")
    if name not in comps:
        raise _fail("components", f"expected an '{name}' component")
    spec = _object(f"components.{name}", comps[name])
    where = f"components.{name}."
    _unknown(spec, _COMPONENT, where)
    if "sources" not in spec:
        raise InvalidRequest(f"{where}sources: required field is missing", param=f"{where}sources")
    return {name: ExtraComponent(
        sources=_path_list(f"{where}sources", spec["sources"], r.code),
        prepare=r.code(f"{where}prepare", spec["prepare"]) if "prepare" in spec else None,
        checkpoint=_checkpoint(f"{where}checkpoint", spec["checkpoint"], r) if "checkpoint" in spec else None,
    )}


def resolve_sources(value: Any, *, base_directory: Any = None, package: PackageFiles | None = None,
                    origin: str = "request.json") -> tuple[FileRef, ...]:
    """A variant staging request's `sources`: inside its uploaded `package` (relative to
    `origin`'s directory) when there is one; otherwise absolute paths and locators, or
    relative paths under an absolute `base_directory`."""
    if base_directory is not None:
        base_directory = _string("base_directory", base_directory)
        problem = reference_problem(base_directory) or (
            None if base_directory.startswith("/") else f"must be an absolute path, got {_shown(base_directory)}")
        if problem:
            raise _fail("base_directory", problem)
    if package is not None:
        return _path_list("sources", value, _Resolver(package, origin, None).code)
    resolver = _Resolver(None, "/", None)

    def server(path: str, ref: Any) -> FileRef:
        ref = _string(path, ref)
        local = resolver._server_local(path, ref)
        if local is not None:
            return local
        if base_directory is None:
            raise _fail(path, f"relative path {ref!r} needs an absolute base_directory (or upload the sources "
                              "as a package)")
        return FileRef(ref, "server", posixpath.normpath(posixpath.join(base_directory, ref)))

    return _path_list("sources", value, server)


__all__ = ["COMPONENTS_BY_KIND", "FIELDS", "ExtraComponent", "FileRef", "KINDS", "ModelDocument", "parse_document", "resolve_sources"]
