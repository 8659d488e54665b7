"""Image input in chat completions (spec "Image input", the image parts of "Retained
conversations" and "Input-token counting"), against a real `loomd` serving scout with its
`image` component (DINOv2-S/14 + the trained projector, samples/scout/vision).

The pictures are drawn here with Pillow (nothing needs the emoji font), except the 100
held-out emoji renderings of the vision recipe (samples/scout/vision/train/eval_seen.png),
which scout must name as often as the committed projector measured (issue 21's "It sees";
the table is printed). The rest checks that image positions count as a generation counts them, a follow-up turn reuses the image without
projecting it (the `loom_image_inputs_total` counter), a change of detail or bytes replays,
concurrent and disconnected peers leave each other's answers alone, PAM and PNG of the same
pixels read alike, and every rejection is a 400 naming the field while the server serves on.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw
from prometheus_client.parser import text_string_to_metric_families

from scout_daemon import IO_TIMEOUT_S, chat, open_stream, start_scout, wait_idle, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "loomrt"))
from image_files import data_url, encoded, pam, part, png_declaring  # noqa: E402

TRAIN = Path(__file__).resolve().parents[2] / "samples" / "scout" / "vision" / "train"
sys.path.insert(0, str(TRAIN))
from build_data import ATLAS, ATLAS_COLUMNS, SIZE, load_split, names  # noqa: E402

QUESTION = "What is in this image? Answer in a few words."
HIGH, LOW = 64, 16              # scout's positions per image for detail auto/high and low
PAM_TYPE = "image/x-portable-arbitrarymap"


def picture(seed: int, size: tuple[int, int] = (96, 80)) -> np.ndarray:
    """A small RGB picture: a background and a few shapes, different for every seed."""
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", size, tuple(int(c) for c in rng.integers(120, 256, 3)))
    d = ImageDraw.Draw(im)
    for _ in range(3):
        x, y = int(rng.integers(0, size[0] - 30)), int(rng.integers(0, size[1] - 30))
        d.ellipse((x, y, x + 30, y + 24), fill=tuple(int(c) for c in rng.integers(0, 200, 3)))
    return np.asarray(im)


PNG_A = encoded(picture(1), "PNG")
PNG_B = encoded(picture(2), "PNG")


def image_part(data: bytes = PNG_A, media_type: str = "image/png", **detail: str) -> dict:
    return part(data_url(data, media_type), **detail)


def asking(*images: dict, text: str = QUESTION, max_tokens: int = 12) -> dict:
    return {"model": "scout", "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": [*images, {"type": "text", "text": text}]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    daemon = start_scout(tmp_path_factory.mktemp("image-input"), rows=2, context_length=512, max_output_tokens=24)
    yield daemon
    daemon.stop()


@pytest.fixture(autouse=True)
def still_healthy(request):
    yield
    if "server" in request.fixturenames:
        request.getfixturevalue("server").assert_healthy()


def answer(server, body: dict, **headers: str) -> dict:
    response = chat(server, body, **headers)
    assert response.status == 200, response.body
    return response.json()


def image_counts(server) -> dict[str, float]:
    text = server.request("GET", "/metrics", timeout=IO_TIMEOUT_S).body.decode()
    out = {"projected": 0.0, "reused": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name == "loom_image_inputs":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["model"] == "scout":
                    out[sample.labels["outcome"]] = sample.value
    return out


def counted(server, want: dict[str, float]) -> dict[str, float]:
    """The image counters once they read `want`: a request's outcome reaches /metrics from the
    service thread just after its response is written, so a scrape right after may precede it."""
    wait_until(lambda: image_counts(server) == want, f"loom_image_inputs_total to read {want}")
    return want


def settled_counts(server) -> dict[str, float]:
    """The image counters once two reads 0.2 s apart agree (earlier requests' outcomes are in)."""
    def stable() -> dict[str, float] | None:
        first = image_counts(server)
        time.sleep(0.2)  # the gap between the two reads
        return first if image_counts(server) == first else None
    return wait_until(stable, "the image counters to settle")


def count(server, body: dict) -> int:
    response = server.request("POST", "/v1/chat/completions/input_tokens", body, timeout=IO_TIMEOUT_S)
    assert response.status == 200, response.body
    return response.json()["input_tokens"]


# ---- discovery -----------------------------------------------------------------------------------

def test_scout_reports_image_input(server):
    scout = next(m for m in server.request("GET", "/v1/models").json()["data"] if m["id"] == "scout")
    assert scout["input_modalities"] == ["text", "image"] and scout["output_modalities"] == ["text"]
    image = scout["loom"]["image_input"]
    assert image["formats"][0] == "pam" and {"png", "jpeg"} <= set(image["formats"])
    assert (image["max_bytes"], image["max_side"], image["max_pixels"]) == (8 << 20, 4096, 8 << 20)


# ---- counting --------------------------------------------------------------------------------------

def test_input_tokens_count_image_positions_as_the_generation_does(server):
    body = asking(image_part())
    n = count(server, body)
    text_only = count(server, asking())
    assert n == text_only + HIGH
    assert count(server, asking(image_part(detail="low"))) == text_only + LOW
    assert count(server, asking(image_part(), image_part(PNG_B, detail="high"))) == text_only + 2 * HIGH
    assert answer(server, body)["usage"]["prompt_tokens"] == n


# ---- generation and reuse --------------------------------------------------------------------------

def test_an_answer_about_an_image_then_a_follow_up_reuses_it_without_projecting(server):
    wait_idle(server)
    before = settled_counts(server)
    first = answer(server, asking(image_part(PNG_B)))
    reply = first["choices"][0]["message"]["content"]
    assert isinstance(reply, str) and reply.strip()
    after_first = counted(server, {"projected": before["projected"] + 1, "reused": before["reused"]})
    wait_idle(server)

    history = asking(image_part(PNG_B))["messages"] + [{"role": "assistant", "content": reply}]
    follow = {**asking(image_part(PNG_B)), "messages": history + [{"role": "user", "content": "Say it again."}]}
    second = answer(server, follow)
    # the whole first turn (image positions included) came from the retained row
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
    after_second = counted(server, {"projected": after_first["projected"], "reused": after_first["reused"] + 1})
    wait_idle(server)

    # another detail is another image identity: the image is projected again
    low = {**follow, "messages": [asking(image_part(PNG_B, detail="low"))["messages"][0], *follow["messages"][1:]]}
    third = answer(server, low)
    assert third["usage"]["prompt_tokens"] == second["usage"]["prompt_tokens"] - HIGH + LOW
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] < first["usage"]["prompt_tokens"] - HIGH
    counted(server, {"projected": after_second["projected"] + 1, "reused": after_second["reused"]})
    wait_idle(server)

    # and so are other bytes in the same place
    other = {**follow, "messages": [asking(image_part(PNG_A))["messages"][0], *follow["messages"][1:]]}
    fourth = answer(server, other)
    assert fourth["usage"]["prompt_tokens_details"]["cached_tokens"] < first["usage"]["prompt_tokens"] - HIGH
    counted(server, {"projected": after_second["projected"] + 2, "reused": after_second["reused"]})


# The naming rate the committed projector measured on eval_seen through loomd
# (samples/scout/vision/train/eval_results.md); issue 21 asks for 60 %.
MEASURED_NAMING = 0.63


def test_scout_names_held_out_emoji_renderings_as_measured(server):
    """The 100 eval_seen renderings (training emoji under augmentations never trained on), each
    asked about alone, greedy, two at a time: the head noun of the emoji's name must appear
    in at least as many answers as the recipe measured. Prints every answer."""
    entries = load_split()["eval_seen"]
    atlas = Image.open(ATLAS).convert("RGB")
    answers: list[str | None] = [None] * len(entries)

    def ask(i: int) -> None:
        x, y = (i % ATLAS_COLUMNS) * SIZE, (i // ATLAS_COLUMNS) * SIZE
        tile = encoded(np.asarray(atlas.crop((x, y, x + SIZE, y + SIZE))), "PNG")
        reply = answer(server, asking(image_part(tile), max_tokens=16))
        answers[i] = reply["choices"][0]["message"]["content"].strip()

    lanes = [threading.Thread(target=lambda k=k: [ask(i) for i in range(k, len(entries), 2)]) for k in range(2)]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    named = [names(a or "", e["head"]) for a, e in zip(answers, entries)]
    print(f"\n{'emoji':<8} {'caption':<44} {'head':<14} named  answer")
    for e, a, n in zip(entries, answers, named):
        print(f"U+{e['cp']:04X}  {e['caption']:<44} {e['head']:<14} {'yes' if n else 'no ':<5}  {a!r}")
    print(f"named {sum(named)} / {len(named)}")
    assert None not in answers
    assert sum(named) >= round(MEASURED_NAMING * len(named)), f"{sum(named)} of {len(named)} named"


def test_pam_and_png_of_the_same_pixels_give_the_same_answer(server):
    rgba = np.concatenate([picture(3), np.full((80, 96, 1), 255, np.uint8)], axis=2)
    rgba[:10, :, 3] = 0                                                 # a transparent band, composited on white
    wide = (rgba.astype(np.uint32) * 65535 // 255).astype(np.uint16)    # the same samples at maxval 65535
    png = answer(server, asking(image_part(encoded(rgba, "PNG"))))
    as_pam = answer(server, asking(image_part(pam(wide, "RGB_ALPHA", 65535), PAM_TYPE)))
    assert as_pam["choices"][0]["message"]["content"] == png["choices"][0]["message"]["content"]
    assert as_pam["usage"]["prompt_tokens"] == png["usage"]["prompt_tokens"]


def test_concurrent_and_departing_peers_leave_an_answer_alone(server):
    alone = {seed: answer(server, asking(image_part(encoded(picture(seed), "PNG"))))["choices"][0]["message"]
             for seed in (4, 5)}
    wait_idle(server)
    results: dict[int, dict] = {}

    def ask(seed: int) -> None:
        results[seed] = answer(server, asking(image_part(encoded(picture(seed), "PNG"))))["choices"][0]["message"]

    threads = [threading.Thread(target=ask, args=(seed,)) for seed in (4, 5)]
    leaving = open_stream(server, {**asking(image_part(encoded(picture(6), "PNG"))), "stream": True})
    for t in threads:
        t.start()
    leaving.close()                      # a peer that disconnects while the others are projected
    for t in threads:
        t.join(IO_TIMEOUT_S)
    assert results == alone
    assert answer(server, asking(image_part(encoded(picture(4), "PNG")), image_part(PNG_A)))["usage"][
        "prompt_tokens"] == count(server, asking()) + 2 * HIGH


# ---- rejections ------------------------------------------------------------------------------------

def animated_gif() -> bytes:
    frames = [Image.fromarray(picture(7)), Image.fromarray(picture(8))]
    import io
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    return out.getvalue()


URL = "messages[0].content[0].image_url.url"
REJECTIONS = {
    "network-url": (part("https://example.com/cat.png"), URL, "https URLs are not fetched"),
    "file-path": (part("/etc/passwd"), URL, "the server reads no files"),
    "not-base64": (part("data:image/png;base64,@@@@"), URL, "not valid base64"),
    "mime-mismatch": (image_part(PNG_A, "image/jpeg"), URL, "the data URL says image/jpeg but the bytes are PNG"),
    "unsupported-type": (image_part(encoded(picture(9), "BMP"), "image/bmp"), URL, "BMP, which is not supported"),
    "animated": (image_part(animated_gif(), "image/gif"), URL, "an animated GIF with 2 frames"),
    "bomb": (image_part(png_declaring(40000, 40000)), URL, "the image is 40000 x 40000; this model accepts at most "
                                                           "4096 pixels a side"),
    "too-wide": (image_part(encoded(np.zeros((8, 5000, 3), np.uint8), "PNG")), URL, "at most 4096 pixels a side"),
    "too-many-pixels": (image_part(encoded(np.zeros((2049, 4096, 3), np.uint8), "PNG")), URL,
                        "= 8392704 pixels; this model accepts at most 8388608"),
    "too-many-bytes": (image_part(b"\x89PNG\r\n\x1a\n" + bytes((8 << 20) - 7)), URL,
                       f"the image is {(8 << 20) + 1} bytes; this model accepts at most {8 << 20}"),
    "truncated": (image_part(PNG_A[:len(PNG_A) // 2]), URL, "the PNG image is truncated or corrupt"),   # decoding finds it
    "empty": (part("data:image/png;base64,"), URL, "holds no image bytes"),
    "bad-detail": (image_part(detail="medium"), "messages[0].content[0].image_url.detail", "must be one of auto, low"),
    "unknown-field": ({"type": "image_url", "image_url": {"url": data_url(PNG_A, "image/png"), "size": 3}},
                      "messages[0].content[0].image_url.size", "size"),
}


#: found in the pixels, not the header: counting (header only) takes them as any image
DECODING_ONLY = {"truncated"}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_each_bad_image_is_a_400_naming_the_field(server, case):
    bad, param, says = REJECTIONS[case]
    paths = ["/v1/chat/completions"] + ([] if case in DECODING_ONLY else ["/v1/chat/completions/input_tokens"])
    for path in paths:
        response = server.request("POST", path, asking(bad), timeout=IO_TIMEOUT_S)
        assert response.status == 400, (path, response.body)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, error
        assert says in error["message"], error["message"]


def test_an_image_outside_a_user_message_is_a_400(server):
    body = {"model": "scout", "messages": [{"role": "system", "content": [image_part()]},
                                           {"role": "user", "content": "Hi"}]}
    response = chat(server, body)
    assert response.status == 400 and "only user messages may hold images" in response.json()["error"]["message"]


# ---- the image component's residency ---------------------------------------------------------------

def image_component(server) -> dict:
    status = server.request("GET", "/v1/status", timeout=IO_TIMEOUT_S).json()
    scout = next(r for r in status["registrations"] if r["model"] == "scout")
    return {c["component"]: c for c in scout["components"]}


def test_the_image_component_unloads_alone_and_reloads_with_the_next_image(server):
    answer(server, asking(image_part()))
    assert image_component(server)["image"]["resident"] is True
    assert server.request("POST", "/v1/models/drain", {"model": "scout"}).status == 200
    try:
        response = server.request("POST", "/v1/models/deactivate", {"model": "scout", "component": "image"})
        assert response.status == 202, response.body
        wait_until(lambda: not image_component(server)["image"]["resident"], "the image params to be released")
        assert image_component(server)["primary"]["resident"] is True
        pinned = server.request("POST", "/v1/models/pin", {"model": "scout", "component": "image"})
        assert pinned.status == 200, pinned.body
    finally:
        assert server.request("POST", "/v1/models/undrain", {"model": "scout"}).status == 200
    answer(server, asking(image_part(PNG_B, detail="low")))          # loads the params again
    components = image_component(server)
    assert components["image"]["resident"] is True and components["image"]["pinned"] is True
    assert server.request("POST", "/v1/models/unpin", {"model": "scout", "component": "image"}).status == 200
