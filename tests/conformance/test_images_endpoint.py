"""`POST /v1/images/generations` over a real `loomd` serving the illustrator sample
(samples/illustrator: a text-conditioned diffusion UNet with LoRA adapters `sketch` and `ink`,
sizes 32..128 per side in steps of 16, default 64x64) and `mini` (a deployment of another kind).

Covered, each over a real socket: the response shape (one base64 PNG, RGB, of the requested or
default size); determinism (same seed, same pixels; "7" is 7; omitted is 0; another seed gives
other pixels); batching (concurrent requests of one size share `generate` calls and each gets the
pixels it gets alone, adapters included); `loras` (scale 0 and `[]` are the base model, the
default scale is 1, negative scales and F32's largest finite value are accepted); every rejection
of the spec's section with an OpenAI-style error while the daemon keeps serving; sizes compiled
on demand while the default keeps serving, and `specialization_capacity` bounding the compiled
sizes; residency (drain, deactivate/activate "primary", "image" is no component) and the variant
inventory; discovery (`/v1/models`); the spec's two JSON example bodies (`spec_examples`), which
this source must reject (1536x1024 is no size it generates, `watercolor` no registered adapter)
and which run once their size and adapter are substituted; and the official `openai` client.

The pixels are not judged: the sample's weights are still training. The sample is large for
this machine (a 64x64 image takes seconds, a new size compiles in tens of seconds), so few
images are generated and one daemon serves the whole module.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
from PIL import Image

from admin_http import listed, poll, registrations
from conformance_support import wait_ready, write_document
from loomd_process import REPO, Daemon
from spec_examples import IMAGES_LORAS_BODY, IMAGES_SIZE_BODY, SPEC

ILLUSTRATOR = REPO / "samples" / "illustrator" / "model.json"
ENDPOINT = "/v1/images/generations"
READY_DEADLINE_S = 600.0       # compiling and preparing the sample on a loaded machine; a hang guard
IMAGE_TIMEOUT_S = 300.0        # one request, possibly including compiling its size
BODY = {"model": "illustrator", "prompt": "a red apple"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not ILLUSTRATOR.is_file():
        pytest.fail(f"{ILLUSTRATOR} is missing: the illustrator sample (and its weights) must be present")
    tmp = tmp_path_factory.mktemp("illustrator")
    daemon = Daemon.start(tmp, [ILLUSTRATOR, write_document(tmp, "mini")])
    try:
        assert wait_ready(daemon, ["illustrator", "mini"], timeout=READY_DEADLINE_S), \
            daemon.request("GET", "/v1/status").body.decode()
        yield daemon
    finally:
        code = daemon.stop()
        assert code == 0, "".join(daemon.output)


def generate(server: Daemon, body, **kw):
    return server.request("POST", ENDPOINT, body, {"Content-Type": "application/json"}, timeout=IMAGE_TIMEOUT_S,
                          **kw)


def decode_png(b64: str, size: tuple[int, int] = (64, 64)) -> np.ndarray:
    """The pixels of one base64 PNG, checked to be RGB of `size` (width, height)."""
    raw = base64.b64decode(b64, validate=True)
    assert raw.startswith(b"\x89PNG\r\n\x1a\n"), raw[:16]
    with Image.open(io.BytesIO(raw)) as img:
        assert img.format == "PNG" and img.mode == "RGB" and img.size == size, (img.format, img.mode, img.size)
        return np.asarray(img).copy()


def pixels(response, size: tuple[int, int] = (64, 64)) -> np.ndarray:
    """The one image of a 200 response, with the response's shape checked."""
    assert response.status == 200, (response.status, response.body[:500])
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"created", "data"}, body.keys()
    assert isinstance(body["created"], int) and not isinstance(body["created"], bool)
    assert abs(body["created"] - time.time()) < 3600, body["created"]
    assert isinstance(body["data"], list) and len(body["data"]) == 1, len(body["data"])
    [item] = body["data"]
    assert set(item) == {"b64_json"} and isinstance(item["b64_json"], str), item.keys()
    return decode_png(item["b64_json"], size)


def image(server: Daemon, dims: tuple[int, int] = (64, 64), **fields) -> np.ndarray:
    """BODY with `fields` changed; `dims` (width, height) is the size the PNG must have."""
    return pixels(generate(server, {**BODY, **fields}), dims)


def assert_error(response, status: int, *words: str, param: str | None = None) -> dict:
    assert response.status == status, (response.status, response.body)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"message", "type", "code"} <= set(error), error
    assert all(isinstance(error[k], str) and error[k] for k in ("message", "type", "code")), error
    if status < 500:
        assert error["type"] == "invalid_request_error", error
    assert all(w.lower() in error["message"].lower() for w in words), (words, error)
    if param is not None:
        assert error["param"] == param, error
    return error


def scheduler(server: Daemon, model: str = "illustrator") -> dict:
    return registrations(server)[model]["scheduler"]


def image_info(server: Daemon, model: str = "illustrator") -> dict:
    return listed(server)[model]["loom"]["image"]


@pytest.fixture(scope="module")
def base(server) -> np.ndarray:
    """BODY's picture: default size, seed 0, no adapters."""
    return image(server)


# ---- shape and sizes --------------------------------------------------------------------------------

def test_one_png_of_the_default_size(base):
    assert base.shape == (64, 64, 3) and base.dtype == np.uint8


def test_size_is_width_by_height(server):
    tall = image(server, (32, 48), size="32x48")
    assert tall.shape == (48, 32, 3)                   # 32 wide, 48 high
    assert image(server, (128, 128), size="128x128").shape == (128, 128, 3)


# ---- seeds ------------------------------------------------------------------------------------------

def test_seeds(server, base):
    seven = image(server, seed=7)
    assert np.array_equal(image(server, seed=7), seven)              # same seed, same pixels
    assert np.array_equal(image(server, seed="7"), seven)            # the decimal string is the integer
    assert not np.array_equal(image(server, seed=8), seven)          # another seed, other pixels
    assert not np.array_equal(seven, base)
    assert np.array_equal(image(server, seed=0), base)               # omitted is 0
    assert np.array_equal(image(server, seed="18446744073709551615"),
                          image(server, seed=2 ** 64 - 1))           # the largest u64, both forms


# ---- batching ---------------------------------------------------------------------------------------

CONCURRENT = [
    {**BODY, "prompt": "a red apple", "seed": 1},
    {**BODY, "prompt": "a smiling yellow face", "seed": 2, "loras": [{"id": "sketch", "scale": 0.8}]},
    {**BODY, "prompt": "a blue car", "seed": "3", "loras": [{"id": "ink"}]},
    {**BODY, "prompt": "a green tree in a pot", "seed": 4,
     "loras": [{"id": "ink", "scale": -0.5}, {"id": "sketch", "scale": 1.5}]},
]


def test_concurrent_requests_share_calls_and_get_the_pixels_they_get_alone(server):
    alone = [pixels(generate(server, b)) for b in CONCURRENT]
    before = scheduler(server)
    with ThreadPoolExecutor(len(CONCURRENT)) as pool:
        together = list(pool.map(lambda b: pixels(generate(server, b)), CONCURRENT))
    after = scheduler(server)
    for body, a, t in zip(CONCURRENT, alone, together):
        assert np.array_equal(a, t), body
    assert len({a.tobytes() for a in alone}) == len(alone)           # four different pictures
    images, steps = after["images"] - before["images"], after["steps"] - before["steps"]
    # four images of one size, all in flight at once: fewer generate calls than images
    assert images == len(CONCURRENT) and 1 <= steps < images, (before, after)


# ---- loras ------------------------------------------------------------------------------------------

def test_loras_select_adapters_per_request(server, base):
    assert np.array_equal(image(server, loras=[{"id": "sketch", "scale": 0}]), base)   # scale 0: the base
    assert np.array_equal(image(server, loras=[]), base)                               # []: omitted
    sketch = image(server, loras=[{"id": "sketch"}])                                   # scale defaults to 1
    assert not np.array_equal(sketch, base)
    assert np.array_equal(image(server, loras=[{"id": "sketch", "scale": 1.0}]), sketch)
    negative = image(server, loras=[{"id": "sketch", "scale": -1}])
    assert not np.array_equal(negative, base) and not np.array_equal(negative, sketch)
    ink = {**BODY, "loras": [{"id": "ink", "scale": 0.5}]}
    ink_alone = pixels(generate(server, ink))
    assert not np.array_equal(ink_alone, base) and not np.array_equal(ink_alone, sketch)
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda b: pixels(generate(server, b)), [{**BODY, "loras": [{"id": "sketch"}]}, ink]))
    assert np.array_equal(both[0], sketch) and np.array_equal(both[1], ink_alone)


def test_the_largest_finite_f32_scale_is_accepted(server):
    """3.4028235e38 is how F32's largest finite value is written: it is a finite F32."""
    image(server, loras=[{"id": "ink", "scale": 3.4028235e38}])


# ---- rejections -------------------------------------------------------------------------------------

NOT_ROUNDED = ["not a size", "never rounded"]


@pytest.mark.parametrize("change, status, words, param", [
    ({"model": None}, 400, ["model"], "model"),
    ({"prompt": None}, 400, ["prompt"], "prompt"),
    ({"prompt": ""}, 400, ["prompt"], "prompt"),
    ({"prompt": "  \n "}, 400, ["prompt"], "prompt"),
    ({"prompt": 7}, 400, ["prompt"], "prompt"),
    ({"prompt": ["a red apple"]}, 400, ["prompt"], "prompt"),
    ({"model": 7}, 400, ["model"], "model"),
    ({"quality": "hd"}, 400, ["unknown field 'quality'"], "quality"),
    ({"style": "vivid"}, 400, ["unknown field 'style'"], "style"),
    ({"image": "data:image/png;base64,iVBORw0KGgo="}, 400, ["unknown field 'image'"], "image"),
    ({"mask": "data:image/png;base64,iVBORw0KGgo="}, 400, ["unknown field 'mask'"], "mask"),
    ({"user": "someone"}, 400, ["unknown field 'user'"], "user"),
    ({"stream": False}, 400, ["unknown field 'stream'"], "stream"),
    ({"n": 2}, 400, ["n: 1"], "n"),
    ({"n": 0}, 400, ["n: 1"], "n"),
    ({"n": True}, 400, ["n: 1"], "n"),
    ({"n": "1"}, 400, ["n: 1"], "n"),
    ({"response_format": "url"}, 400, ["b64_json"], "response_format"),
    ({"response_format": "B64_JSON"}, 400, ["b64_json"], "response_format"),
    ({"size": "64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "64x"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "x64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "64X64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "64x64 "}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": " 64x64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "64*64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "0x64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "-64x64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "+64x64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "064x64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "64.0x64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": "auto"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": ""}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"size": 64}, 400, ["size"], "size"),
    ({"size": [64, 64]}, 400, ["size"], "size"),
    ({"size": "100x100"}, 400, ["100x100", *NOT_ROUNDED, "multiple of 16"], None),
    ({"size": "64x100"}, 400, ["64x100", *NOT_ROUNDED, "height is 100"], None),
    ({"size": "256x256"}, 400, ["256x256", *NOT_ROUNDED, "from 32 to 128"], None),
    ({"size": "16x64"}, 400, ["16x64", *NOT_ROUNDED, "width is 16"], None),
    ({"size": "1024x1024"}, 400, ["1024x1024", *NOT_ROUNDED], None),
    ({"size": "1536x1024"}, 400, ["1536x1024", *NOT_ROUNDED], None),
    ({"size": "99999x99999"}, 400, ["99999x99999", *NOT_ROUNDED], None),
    ({"size": "123456x64"}, 400, ["WIDTHxHEIGHT"], "size"),
    ({"seed": -1}, 400, ["seed", "unsigned 64-bit"], "seed"),
    ({"seed": 2 ** 64}, 400, ["seed"], "seed"),
    ({"seed": str(2 ** 64)}, 400, ["seed", "unsigned 64-bit"], "seed"),
    ({"seed": "abc"}, 400, ["seed"], "seed"),
    ({"seed": "-3"}, 400, ["seed"], "seed"),
    ({"seed": " 7"}, 400, ["seed"], "seed"),
    ({"seed": ""}, 400, ["seed"], "seed"),
    ({"seed": 1.5}, 400, ["seed"], "seed"),
    ({"seed": 7.0}, 400, ["seed"], "seed"),
    ({"seed": True}, 400, ["seed"], "seed"),
    ({"seed": [7]}, 400, ["seed"], "seed"),
    ({"loras": {"id": "sketch"}}, 400, ["loras", "array"], "loras"),
    ({"loras": "sketch"}, 400, ["loras", "array"], "loras"),
    ({"loras": ["sketch"]}, 400, ["loras[0]", "object"], "loras[0]"),
    ({"loras": [{"id": "sketch"}, 3]}, 400, ["loras[1]", "object"], "loras[1]"),
    ({"loras": [{"id": "watercolor"}]}, 400, ["watercolor", "registered", "sketch", "ink"], "loras"),
    ({"loras": [{"id": "Sketch"}]}, 400, ["'Sketch'", "registered"], "loras"),
    ({"loras": [{"id": "weights/lora_sketch.safetensors"}]}, 400, ["registered"], "loras"),
    ({"loras": [{"id": "sketch"}, {"id": "sketch", "scale": 0.5}]}, 400, ["loras[1].id", "twice"], "loras"),
    ({"loras": [{"id": ""}]}, 400, ["loras[0].id", "nonempty"], "loras[0].id"),
    ({"loras": [{"id": 3}]}, 400, ["loras[0].id"], "loras[0].id"),
    ({"loras": [{"scale": 1}]}, 400, ["loras[0].id", "missing"], "loras[0].id"),
    ({"loras": [{"id": "sketch", "scale": "1"}]}, 400, ["loras[0].scale", "finite f32"], "loras[0].scale"),
    ({"loras": [{"id": "sketch", "scale": 1e39}]}, 400, ["loras[0].scale", "finite f32"], "loras[0].scale"),
    ({"loras": [{"id": "sketch", "scale": -1e39}]}, 400, ["loras[0].scale", "finite f32"], "loras[0].scale"),
    ({"loras": [{"id": "sketch", "scale": 3.4028236e38}]}, 400, ["loras[0].scale"], "loras[0].scale"),
    ({"loras": [{"id": "sketch", "scale": 1e400}]}, 400, ["1e400", "out of range"], None),   # not even decoded
    ({"loras": [{"id": "sketch", "scale": True}]}, 400, ["loras[0].scale", "finite f32"], "loras[0].scale"),
    ({"loras": [{"id": "sketch", "scale": None}]}, 400, ["loras[0].scale"], "loras[0].scale"),
    ({"loras": [{"id": "sketch", "weight": 1}]}, 400, ["unknown field 'loras[0].weight'"], "loras[0].weight"),
    ({"loras": [{"id": "sketch", "path": "/etc/passwd"}]}, 400, ["loras[0].path"], "loras[0].path"),
])
def test_rejections(server, change, status, words, param):
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    # JSON has no infinity: Python's 1e400 is sent as the literal that overflows to it
    text = json.dumps(body).replace("Infinity", "1e400")
    before = scheduler(server)["images"]
    assert_error(generate(server, text), status, *words, param=param)
    assert scheduler(server)["images"] == before       # rejected before any generation
    assert server.request("GET", "/healthz").status == 200


def test_a_size_the_source_generates_is_accepted(server):
    """96x80: multiples of 16 within 32..128 on both sides, neither the default."""
    assert image(server, (96, 80), size="96x80").shape == (80, 96, 3)


def test_unknown_model_and_other_kinds_are_404(server):
    assert_error(generate(server, {**BODY, "model": "nobody"}), 404, "nobody")
    assert_error(generate(server, {**BODY, "model": "mini"}), 404)


def test_malformed_and_non_json_bodies(server):
    assert_error(generate(server, b'{"model": "illustrator", "prompt": '), 400, "json")
    assert_error(generate(server, b'{"model": "illustrator", "prompt": "a", }'), 400)
    assert_error(generate(server, b'["illustrator", "a red apple"]'), 400)
    assert_error(generate(server, b'{"model": "illustrator", "prompt": "a", "prompt": "b"}'), 400, "prompt")
    r = server.request("POST", ENDPOINT, b"model=illustrator&prompt=a",
                       {"Content-Type": "application/x-www-form-urlencoded"})
    assert_error(r, 400, "application/json")


# ---- the spec's examples ------------------------------------------------------------------------------

def test_the_spec_example_bodies(server):
    """The section's two bodies, verbatim: this source generates no 1536x1024 and registers no
    `watercolor`, so each is a 400 naming what it lacks; with a size and an adapter it has they
    run (the second with `sketch` for `watercolor`, as the spec says it needs the adapter)."""
    text = SPEC.read_text() if SPEC.is_file() else None
    for body in (IMAGES_SIZE_BODY, IMAGES_LORAS_BODY):
        if text is not None:
            assert body in text, body
    sized = json.loads(IMAGES_SIZE_BODY)
    assert_error(generate(server, IMAGES_SIZE_BODY), 400, "1536x1024", *NOT_ROUNDED)
    assert_error(generate(server, IMAGES_LORAS_BODY), 400, "'watercolor'", "registered: 'sketch', 'ink'",
                 param="loras")
    small = pixels(generate(server, {**sized, "size": "64x64"}))
    assert np.array_equal(small, image(server, prompt=sized["prompt"]))     # "seed": "0" is the default
    loras = json.loads(IMAGES_LORAS_BODY)
    loras["loras"][0]["id"] = "sketch"
    mixed = pixels(generate(server, loras))
    assert not np.array_equal(mixed, small)


# ---- sizes compiled on demand ----------------------------------------------------------------------

def test_a_new_size_compiles_while_the_default_keeps_serving(server):
    assert "80x96" not in image_info(server)["compiled_sizes"]
    start = time.monotonic()
    done: dict[str, float] = {}

    def timed(name, body, size):
        p = pixels(generate(server, body), size)
        done[name] = time.monotonic() - start
        return p

    with ThreadPoolExecutor(4) as pool:
        new = pool.submit(timed, "new", {**BODY, "size": "80x96", "seed": 5}, (80, 96))
        time.sleep(0.2)                 # the new size is asked for first
        defaults = [pool.submit(timed, f"default{i}", {**BODY, "seed": 10 + i}, (64, 64)) for i in range(3)]
        results = [f.result(timeout=IMAGE_TIMEOUT_S) for f in defaults]
        assert new.result(timeout=IMAGE_TIMEOUT_S).shape == (96, 80, 3)
    assert all(r.shape == (64, 64, 3) for r in results)
    print("seconds to each result:", done)
    info = image_info(server)
    assert "80x96" in info["compiled_sizes"] and info["compiled_sizes"][0] == "64x64", info
    assert len(info["compiled_sizes"]) <= info["specialization_capacity"], info
    # the journal: the new size's request waited for its compilation, the default ones did not
    events = [json.loads(line) for line in server.request("GET", "/logz?limit=1000").body.decode().splitlines()]
    requests = [e for e in events if e["event"] == "request" and e.get("model") == "illustrator"]
    assert any(e["width"] == 80 and e["height"] == 96 and e["compiled_size"] for e in requests), requests[-5:]


def test_models_lists_the_illustrator(server):
    data = listed(server)
    illustrator = data["illustrator"]
    assert illustrator["input_modalities"] == ["text"] and illustrator["output_modalities"] == ["image"]
    loom = illustrator["loom"]
    assert loom["kind"] == "image" and loom["endpoint"] == ENDPOINT, loom
    info = loom["image"]
    assert info["loras"] == ["sketch", "ink"], info
    assert info["width"] == 64 and info["height"] == 64, info
    assert info["sizes"] == {"min_side": 32, "max_side": 128, "step": 16}, info     # control.loom's image_geometry
    assert info["specialization_capacity"] == 4 and "64x64" in info["compiled_sizes"], info
    assert loom["variants"]["count"] == 1, loom
    assert "image" not in data["mini"]["loom"]


def test_specialization_capacity_bounds_the_compiled_sizes(server, tmp_path):
    """A copy of the document registered over HTTP with specialization_capacity 2 (its sources
    by absolute path, its weights and adapters under an absolute base_directory): three other
    sizes in turn all generate, and at most two sizes (the default's included) are compiled at
    any time."""
    document = json.loads(ILLUSTRATOR.read_text())
    package = ILLUSTRATOR.parent
    document.update(model="capped", specialization_capacity=2, base_directory=str(package),
                    control=str(package / document["control"]), prepare=str(package / document["prepare"]),
                    sources=[str(package / s) for s in document["sources"]])
    r = server.request("POST", "/v1/models/register", document)
    assert r.status == 202, r.body
    try:
        assert wait_ready(server, ["capped"], timeout=READY_DEADLINE_S)
        assert image_info(server, "capped")["compiled_sizes"] == ["64x64"]
        seen = []
        for w, h in ((32, 32), (48, 32), (32, 48)):
            assert pixels(generate(server, {**BODY, "model": "capped", "size": f"{w}x{h}"}), (w, h)).shape == (h, w, 3)
            info = image_info(server, "capped")
            seen.append(info["compiled_sizes"])
            assert info["specialization_capacity"] == 2
            assert info["compiled_sizes"] == ["64x64", f"{w}x{h}"], seen
        assert scheduler(server, "capped")["sizes_compiled"] == 3
        # the first one was dropped: asking for it again compiles it again
        pixels(generate(server, {**BODY, "model": "capped", "size": "32x32"}), (32, 32))
        assert scheduler(server, "capped")["sizes_compiled"] == 4
        assert image_info(server, "capped")["compiled_sizes"] == ["64x64", "32x32"]
    finally:
        assert server.request("POST", "/v1/models/unregister", {"model": "capped", "mode": "abort"}).status == 202
        poll(server, lambda regs: "capped" not in regs, "capped to be removed")


# ---- residency and variants -------------------------------------------------------------------------

def primary(server: Daemon) -> dict:
    [found] = [c for c in registrations(server)["illustrator"]["components"] if c["component"] == "primary"]
    return found


def test_residency_and_variants(server, base):
    assert [c["component"] for c in registrations(server)["illustrator"]["components"]] == ["primary"]
    assert server.request("POST", "/v1/models/drain", {"model": "illustrator"}).status == 200
    try:
        assert_error(generate(server, BODY), 503, "drained")
        for op in ("deactivate", "activate"):
            assert_error(server.request("POST", f"/v1/models/{op}", {"model": "illustrator", "component": "image"}),
                         404, "image", param="component")
        activations = primary(server)["activations"]
        r = server.request("POST", "/v1/models/deactivate", {"model": "illustrator", "component": "primary"})
        assert r.status == 202, r.body
        poll(server, lambda regs: not regs["illustrator"]["components"][0]["resident"], "illustrator to be evicted")
        assert "illustrator" in listed(server)
        r = server.request("POST", "/v1/models/activate", {"model": "illustrator", "component": "primary"})
        assert r.status == 202, r.body
        poll(server, lambda regs: regs["illustrator"]["components"][0]["resident"]
             and regs["illustrator"]["components"][0]["activations"] > activations, "illustrator to be reloaded")
    finally:
        assert server.request("POST", "/v1/models/undrain", {"model": "illustrator"}).status == 200
    assert np.array_equal(image(server), base)

    r = server.request("GET", "/v1/models/variants", headers={"X-Loom-Model": "illustrator"})
    assert r.status == 200, r.body
    inventory = r.json()
    assert inventory["object"] == "list" and inventory["model"] == "illustrator", inventory
    assert inventory["count"] == 1 and len(inventory["data"]) == 1, inventory
    [variant] = inventory["data"]
    assert variant["id"] == inventory["selected"] and variant["phase"] == "ready", variant


# ---- the official openai client ---------------------------------------------------------------------

def test_the_openai_client(server, base):
    with openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", timeout=IMAGE_TIMEOUT_S,
                       max_retries=0) as client:
        result = client.images.generate(model="illustrator", prompt=BODY["prompt"], response_format="b64_json",
                                        size="64x64")
        assert len(result.data) == 1 and result.data[0].url is None
        assert np.array_equal(decode_png(result.data[0].b64_json), base)           # no seed sent: seed 0
        seeded = client.images.generate(model="illustrator", prompt=BODY["prompt"], response_format="b64_json",
                                        size="64x64", extra_body={"seed": 3})
        raw = image(server, seed=3)
        assert np.array_equal(decode_png(seeded.data[0].b64_json), raw) and not np.array_equal(raw, base)
        with pytest.raises(openai.BadRequestError) as caught:
            client.images.generate(model="illustrator", prompt=BODY["prompt"], size="1024x1024")
        assert "1024x1024" in str(caught.value)
        with pytest.raises(openai.BadRequestError):
            client.images.generate(model="illustrator", prompt=BODY["prompt"], n=2)
        with pytest.raises(openai.NotFoundError):
            client.images.generate(model="nobody", prompt=BODY["prompt"])


def test_decode_png_rejects_what_is_not_base64():
    with pytest.raises(binascii.Error):
        decode_png("not base64!")

