"""loomrt.media.image: the image_url part's shape, data URLs, signature sniffing against the
label, enabled formats, limits checked from the header before Pillow opens a file, our PAM
decoder against Pillow's PNG of the same pixels, rejections, and `probe` without decoding.

Whether Pillow opened or loaded a file is observed through recording subclasses of Pillow's
own plugin classes, registered in Pillow's format table for the test that needs them (Pillow
is a third-party library; nothing of ours is replaced)."""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import tracemalloc
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
from PIL import GifImagePlugin, Image, JpegImagePlugin, PngImagePlugin, WebPImagePlugin

from image_files import data_url, encoded, pam, part, png_declaring, webp_declaring  # noqa: F401
from loomrt.errors import InvalidRequest
from loomrt.media.image import (
    DecodedImage, ImageFormats, ImageHeader, ImageLimits, composite_on_white, decode_image, image_bytes,
    parse_image_part, probe, sniff,
)

PAM = "image/x-portable-arbitrarymap"
MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}
RNG = np.random.default_rng(21)
PIXELS = RNG.integers(0, 256, (7, 13, 3), dtype=np.uint8)    # 13 wide, 7 high


def rejected(call, *args, **kwargs) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        call(*args, **kwargs)
    assert info.value.status == 400
    return info.value


# ------------------------------------------------------------------------- Pillow, observed


@pytest.fixture
def pillow_calls() -> Iterator[list[tuple[str, str]]]:
    """Every `_open` and `load` Pillow runs for PNG, JPEG, GIF and WebP while the test runs,
    as (what, format), through subclasses of Pillow's plugins put in its format table."""
    calls: list[tuple[str, str]] = []

    def recording(base: type) -> type:
        class Recording(base):
            def _open(self) -> None:
                calls.append(("open", self.format))
                super()._open()

            def load(self):
                calls.append(("load", self.format))
                return super().load()
        return Recording

    Image.init()
    saved = {fmt: Image.OPEN[fmt] for fmt in ("PNG", "JPEG", "GIF", "WEBP")}
    jpeg = recording(JpegImagePlugin.JpegImageFile)
    Image.OPEN["PNG"] = (recording(PngImagePlugin.PngImageFile), saved["PNG"][1])
    Image.OPEN["GIF"] = (recording(GifImagePlugin.GifImageFile), saved["GIF"][1])
    Image.OPEN["WEBP"] = (recording(WebPImagePlugin.WebPImageFile), saved["WEBP"][1])
    Image.OPEN["JPEG"] = (lambda fp, filename=None: jpeg(fp, filename), saved["JPEG"][1])
    try:
        yield calls
    finally:
        Image.OPEN.update(saved)


def test_the_recording_subclasses_see_a_real_decode(pillow_calls):
    """The observation the bomb tests rely on: decoding a PNG opens and loads it through Pillow."""
    decode_image(encoded(PIXELS, "PNG"), "image/png")
    assert ("open", "PNG") in pillow_calls and ("load", "PNG") in pillow_calls


# ------------------------------------------------------------------------------- the JSON part


def test_parse_image_part_keeps_url_media_type_detail_and_param():
    url = data_url(b"whatever", "image/PNG")
    ref = parse_image_part(part(url), "messages[0].content[1]")
    assert (ref.url, ref.media_type, ref.detail, ref.param) == (
        url, "image/png", "auto", "messages[0].content[1].image_url.url")
    assert parse_image_part(part(url, detail="low")).detail == "low"
    assert parse_image_part(part(url, detail="high")).detail == "high"


def test_parse_image_part_names_an_unknown_key():
    url = data_url(b"x", "image/png")
    error = rejected(parse_image_part, {**part(url), "alt": "a cat", "caption": "c"}, "p")
    assert "unknown field 'p.alt'" in error.message and error.param == "p.alt"   # as every JSON field is
    error = rejected(parse_image_part, part(url, size=3), "p")
    assert "'p.image_url.size'" in error.message and error.param == "p.image_url.size"


@pytest.mark.parametrize("bad, param", [
    ("not a dict", "p"),
    ({"type": "text", "image_url": {"url": "data:image/png;base64,AA=="}}, "p.type"),
    ({"type": "image_url"}, "p.image_url"),
    ({"type": "image_url", "image_url": "data:image/png;base64,AA=="}, "p.image_url"),
    ({"type": "image_url", "image_url": {}}, "p.image_url.url"),
    ({"type": "image_url", "image_url": {"url": 7}}, "p.image_url.url"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==", "detail": "medium"}},
     "p.image_url.detail"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==", "detail": None}}, "p.image_url.detail"),
])
def test_parse_image_part_rejects_wrong_shapes_naming_the_field(bad, param):
    assert rejected(parse_image_part, bad, "p").param == param


@pytest.mark.parametrize("url, says", [
    ("http://example.com/cat.png", "http URLs are not fetched"),
    ("https://example.com/cat.png", "https URLs are not fetched"),
    ("HTTPS://example.com/cat.png", "https URLs are not fetched"),
    ("file:///etc/passwd", "file: URLs are not accepted"),
    ("ftp://example.com/cat.png", "ftp: URLs are not accepted"),
    ("/tmp/cat.png", "the server reads no files"),
    ("cat.png", "the server reads no files"),
    ("iVBORw0KGgo=", "the server reads no files"),
    ("", "the server reads no files"),
])
def test_only_data_urls_are_accepted(url, says):
    error = rejected(parse_image_part, part(url), "m")
    assert says in error.message and "base64 data URL" in error.message and error.param == "m.image_url.url"


@pytest.mark.parametrize("url, says", [
    ("data:image/png;base64", "no ','"),
    ("data:image/png,iVBORw0KGgo=", "must be base64"),
    ("data:;base64,iVBORw0KGgo=", "names no media type"),
    ("data:image png;base64,iVBORw0KGgo=", "malformed data URL media type"),
    ("data:image/png;charset;base64,iVBORw0KGgo=", "malformed data URL media type"),
])
def test_malformed_data_urls_reject(url, says):
    assert says in rejected(parse_image_part, part(url)).message


def test_data_url_parameters_are_allowed():
    assert parse_image_part(part("data:image/png;name=cat.png;base64,AA==")).media_type == "image/png"


@pytest.mark.parametrize("payload", ["@@@@", "iVBORw0KGgo", "iVBO Rw0KGgo=", "iVBORw0K\nGgo=", "iVBORw0KGg-_", "é===",
                                     ""])
def test_bad_base64_rejects(payload):
    ref = parse_image_part(part(f"data:image/png;base64,{payload}"))
    error = rejected(image_bytes, ref)
    assert ("not valid base64" in error.message or "holds no image bytes" in error.message)
    assert error.param == "image.image_url.url"


def test_image_bytes_decodes_and_bounds_the_payload_before_decoding():
    png = encoded(PIXELS, "PNG")
    ref = parse_image_part(part(data_url(png, "image/png")))
    assert image_bytes(ref) == png
    assert image_bytes(ref, ImageLimits(max_bytes=len(png))) == png
    error = rejected(image_bytes, ref, ImageLimits(max_bytes=len(png) - 1))
    assert f"the image is {len(png)} bytes; this model accepts at most {len(png) - 1}" in error.message
    unpadded = parse_image_part(part("data:image/png;base64," + "A" * 30))   # 22 bytes, were it padded
    assert "the image is 22 bytes; this model accepts at most 21" in rejected(
        image_bytes, unpadded, ImageLimits(max_bytes=21)).message


# ----------------------------------------------------------------------------- formats and labels


def test_sniff_by_bytes():
    assert sniff(encoded(PIXELS, "PNG")) == "png" and sniff(encoded(PIXELS, "JPEG")) == "jpeg"
    assert sniff(encoded(PIXELS, "GIF")) == "gif" and sniff(encoded(PIXELS, "WEBP")) == "webp"
    assert sniff(pam(PIXELS, "RGB", 255)) == "pam" and sniff(encoded(PIXELS, "BMP")) == "bmp"
    assert sniff(encoded(PIXELS, "TIFF")) == "tiff" and sniff(b"P6\n13 7\n255\n") == "pnm"
    assert sniff(b"<svg xmlns='x'/>") == "svg" and sniff(b"hello") == "unknown" and sniff(b"") == "unknown"


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_each_pillow_format_decodes_to_rgb8(fmt):
    data = encoded(PIXELS, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    image = decode_image(data, MIME[fmt])
    assert isinstance(image, DecodedImage)
    assert (image.width, image.height, image.format) == (13, 7, fmt.lower())
    assert image.rgb.dtype == np.uint8 and image.rgb.shape == (7, 13, 3)
    assert image.digest == hashlib.sha256(data).hexdigest()
    if fmt in ("PNG", "WEBP"):     # lossless
        assert np.array_equal(image.rgb, PIXELS)


def test_digest_is_of_the_compressed_bytes_not_the_pixels():
    a, b = encoded(PIXELS, "PNG", compress_level=1), encoded(PIXELS, "PNG", compress_level=9)
    assert a != b
    da, db = decode_image(a, "image/png"), decode_image(b, "image/png")
    assert np.array_equal(da.rgb, db.rgb) and da.digest != db.digest
    assert da.digest == hashlib.sha256(a).hexdigest()


def test_jpg_is_an_alias_of_jpeg():
    assert decode_image(encoded(PIXELS, "JPEG"), "image/jpg").format == "jpeg"


@pytest.mark.parametrize("data_fmt, label", [("PNG", "image/jpeg"), ("JPEG", "image/png"), ("GIF", "image/webp"),
                                              ("WEBP", "image/gif"), ("PNG", PAM), ("PNG", "image/bmp"),
                                              ("PNG", "")])
def test_label_must_agree_with_the_signature(data_fmt, label):
    error = rejected(decode_image, encoded(PIXELS, data_fmt), label, param="x")
    assert f"the bytes are {data_fmt}" in error.message and error.param == "x"


def test_pam_label_must_agree_too():
    assert "the bytes are PAM" in rejected(decode_image, pam(PIXELS, "RGB", 255), "image/png").message


@pytest.mark.parametrize("data, label, what", [
    (encoded(PIXELS, "BMP"), "image/bmp", "BMP, which is not supported"),
    (encoded(PIXELS, "TIFF"), "image/tiff", "TIFF, which is not supported"),
    (b"P6\n13 7\n255\n" + PIXELS.tobytes(), "image/x-portable-pixmap", "PNM, which is not supported"),
    (b"\0\0\0\x1cftypavif" + bytes(20), "image/avif", "AVIF, which is not supported"),
    (b"just some bytes", "image/png", "not an image format this server knows"),
])
def test_unsupported_types_name_the_supported_ones(data, label, what):
    message = rejected(decode_image, data, label).message
    assert what in message
    assert "send one of image/x-portable-arbitrarymap, image/png, image/jpeg, image/gif, image/webp" in message


def test_a_disabled_format_rejects_while_the_others_work():
    formats = ImageFormats(frozenset({"jpeg", "gif", "webp"}))
    assert formats.supported() == ("pam", "jpeg", "gif", "webp")
    message = rejected(decode_image, encoded(PIXELS, "PNG"), "image/png", formats=formats).message
    assert "PNG images are not accepted by this deployment" in message
    assert "send one of image/x-portable-arbitrarymap, image/jpeg, image/gif, image/webp" in message
    assert "image/png" not in message.split("send one of")[1]
    assert decode_image(encoded(PIXELS, "JPEG"), "image/jpeg", formats=formats).format == "jpeg"
    assert decode_image(encoded(PIXELS, "GIF"), "image/gif", formats=formats).format == "gif"
    assert decode_image(pam(PIXELS, "RGB", 255), PAM, formats=formats).format == "pam"


def test_pam_cannot_be_disabled():
    only_pam = ImageFormats(frozenset())
    assert only_pam.supported() == ("pam",)
    assert np.array_equal(decode_image(pam(PIXELS, "RGB", 255), PAM, formats=only_pam).rgb, PIXELS)
    assert ImageFormats(frozenset({"pam"})).supported() == ("pam",)
    for fmt in ("PNG", "JPEG", "GIF", "WEBP"):
        message = rejected(decode_image, encoded(PIXELS, fmt), MIME[fmt], formats=only_pam).message
        assert message.endswith(f"{fmt} images are not accepted by this deployment; send one of "
                                "image/x-portable-arbitrarymap")


def test_configuration_objects_validate_themselves():
    with pytest.raises(ValueError, match="unknown image format"):
        ImageFormats(frozenset({"png", "bmp"}))
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="must be a positive integer"):
            ImageLimits(max_side=bad)


# ---------------------------------------------------------------------------- frames, corruption


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG"])
def test_animated_images_reject(fmt):
    frames = [Image.fromarray(PIXELS), Image.fromarray(255 - PIXELS), Image.fromarray(PIXELS[::-1].copy())]
    out = io.BytesIO()
    frames[0].save(out, fmt, save_all=True, append_images=frames[1:])
    for call in (decode_image, probe):
        message = rejected(call, out.getvalue(), MIME[fmt]).message
        assert f"an animated {fmt} with 3 frames; send one still image" in message


def test_multi_picture_jpeg_rejects():
    out = io.BytesIO()
    Image.fromarray(PIXELS).save(out, "MPO", save_all=True, append_images=[Image.fromarray(255 - PIXELS)])
    assert sniff(out.getvalue()) == "jpeg"
    message = rejected(decode_image, out.getvalue(), "image/jpeg").message
    assert "an MPO (multi-picture) JPEG with 2 frames; send one still image" in message


def test_truncated_png_rejects():
    png = encoded(RNG.integers(0, 256, (64, 64, 3), dtype=np.uint8), "PNG")
    for cut in (len(png) // 2, 20, 9):
        message = rejected(decode_image, png[:cut], "image/png").message
        assert "the PNG image is truncated or corrupt" in message


def test_corrupt_jpeg_rejects():
    jpg = encoded(RNG.integers(0, 256, (32, 48, 3), dtype=np.uint8), "JPEG")
    dht = jpg.index(b"\xff\xc4")
    sos = jpg.index(b"\xff\xda")
    for bad in (jpg[:len(jpg) // 2],                                   # truncated scan
                jpg[:dht + 4] + bytes(40) + jpg[dht + 44:],             # zeroed Huffman table
                jpg[:sos + 2] + b"\xff\xff\x00\x00" + jpg[sos + 6:],    # broken scan header
                jpg[:2] + b"\xff\xfe\x00\x04ab\xff\xda\x00\x02"):       # no frame header at all
        assert "the JPEG image is truncated or corrupt" in rejected(decode_image, bad, "image/jpeg").message


def test_empty_bytes_reject():
    assert "the image is empty" in rejected(decode_image, b"", "image/png").message


# --------------------------------------------------------------------------------------- limits


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP", "PAM"])
def test_limits_on_bytes_side_and_pixels(fmt):
    wide = RNG.integers(0, 256, (10, 300, 3), dtype=np.uint8)
    square = RNG.integers(0, 256, (200, 200, 3), dtype=np.uint8)
    make = (lambda px: pam(px, "RGB", 255)) if fmt == "PAM" else (lambda px: encoded(px, fmt))
    label = PAM if fmt == "PAM" else MIME[fmt]
    data = make(wide)
    exact = ImageLimits(max_bytes=len(data), max_side=300, max_pixels=3000)
    assert decode_image(data, label, limits=exact).width == 300
    message = rejected(decode_image, data, label, limits=ImageLimits(max_bytes=len(data) - 1)).message
    assert f"the image is {len(data)} bytes; this model accepts at most {len(data) - 1}" in message
    message = rejected(decode_image, data, label, limits=ImageLimits(max_side=299)).message
    assert "the image is 300 x 10; this model accepts at most 299 pixels a side" in message
    message = rejected(decode_image, make(square), label, limits=ImageLimits(max_pixels=39999)).message
    assert "the image is 200 x 200 = 40000 pixels; this model accepts at most 39999" in message
    message = rejected(probe, make(square), label, limits=ImageLimits(max_pixels=39999)).message
    assert "= 40000 pixels" in message


def test_a_png_bomb_is_refused_before_pillow_opens_it(pillow_calls):
    bomb = png_declaring(40000, 40000)
    assert len(bomb) < 100
    tracemalloc.start()
    try:
        message = rejected(decode_image, bomb, "image/png").message
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "the image is 40000 x 40000; this model accepts at most 8192 pixels a side" in message
    assert pillow_calls == []                  # neither Pillow's header parser nor its decoder ran
    assert peak < 1 << 20                      # the pixel buffer would be 4.8 GB
    assert rejected(probe, bomb, "image/png").message == message and pillow_calls == []


def test_a_bomb_within_our_limits_but_past_pillows_is_still_a_400_without_pixels(pillow_calls):
    huge = ImageLimits(max_side=40000, max_pixels=40000 * 40000)
    message = rejected(decode_image, png_declaring(40000, 40000), "image/png", limits=huge).message
    assert "more pixels than this server decodes" in message
    assert ("load", "PNG") not in pillow_calls


def test_a_webp_canvas_is_refused_before_libwebp_allocates_it(pillow_calls):
    message = rejected(decode_image, webp_declaring(10000, 10000), "image/webp").message
    assert "the image is 10000 x 10000; this model accepts at most 8192 pixels a side" in message
    assert pillow_calls == []


def test_a_gif_frame_outside_its_small_screen_is_refused_before_pillow_opens_it(pillow_calls):
    """Pillow widens a GIF's size to its first frame; a 10 x 10 screen must not hide a 60000 x
    60000 frame from our limits (Pillow's bomb error would otherwise answer first)."""
    screen = b"GIF89a" + struct.pack("<HHBBB", 10, 10, 0, 0, 0)
    comment = b"!\xfe\x03abc\x00"
    frame = b"," + struct.pack("<HHHHB", 5, 0, 60000, 60000, 0) + b"\x02\x02\x44\x01\x00;"
    message = rejected(decode_image, screen + comment + frame, "image/gif").message
    assert "the image is 60005 x 60000; this model accepts at most 8192 pixels a side" in message
    assert pillow_calls == []


def test_a_pam_bomb_is_refused_before_any_sample_is_read():
    bomb = b"P7\nWIDTH 40000\nHEIGHT 40000\nDEPTH 3\nMAXVAL 255\nTUPLTYPE RGB\nENDHDR\n" + bytes(16)
    tracemalloc.start()
    try:
        message = rejected(decode_image, bomb, PAM).message
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "the image is 40000 x 40000; this model accepts at most 8192 pixels a side" in message
    assert peak < 1 << 20


# ------------------------------------------------------------------------------------------ PAM


def _variants() -> list[tuple[str, int]]:
    out = [("BLACKANDWHITE", 1), ("BLACKANDWHITE_ALPHA", 1)]
    for tupltype in ("GRAYSCALE", "RGB", "GRAYSCALE_ALPHA", "RGB_ALPHA"):
        out += [(tupltype, maxval) for maxval in (1, 255, 65535)]
    return out


@pytest.mark.parametrize("tupltype, maxval", _variants())
def test_pam_matches_pillows_png_of_the_same_pixels(tupltype, maxval):
    colour = 3 if tupltype.startswith("RGB") else 1
    alpha = tupltype.endswith("_ALPHA")
    eight = RNG.integers(0, 256, (9, 11, colour + alpha), dtype=np.uint8)
    if maxval == 1:
        eight = np.where(eight >= 128, 255, 0).astype(np.uint8)
    else:
        eight[0, 0, -1], eight[0, 1, -1] = 0, 255    # fully transparent and opaque pixels
    samples = {1: eight // 255, 255: eight, 65535: eight.astype(np.uint16) * 257}[maxval]
    mode = {(1, False): "L", (1, True): "LA", (3, False): "RGB", (3, True): "RGBA"}[colour, alpha]
    png = encoded(eight[..., 0] if mode == "L" else eight, "PNG", mode)
    from_pam = decode_image(pam(samples, tupltype, maxval), PAM)
    from_png = decode_image(png, "image/png")
    assert (from_pam.width, from_pam.height, from_pam.format) == (11, 9, "pam")
    assert from_pam.rgb.dtype == np.uint8 and from_pam.rgb.shape == (9, 11, 3)
    assert np.array_equal(from_pam.rgb, from_png.rgb)
    rgb = np.repeat(eight[..., :colour], 3 // colour, axis=2)
    want = composite_on_white(np.concatenate([rgb, eight[..., -1:]], axis=2)) if alpha else rgb
    assert np.array_equal(from_pam.rgb, want)


def test_composite_on_white_rounds_straight_alpha():
    rgba = np.array([[[0, 100, 255, 0], [0, 100, 255, 255], [0, 100, 200, 128]]], np.uint8)
    assert composite_on_white(rgba).tolist() == [[[255, 255, 255], [0, 100, 255], [127, 177, 227]]]


def test_pam_samples_scale_with_rounding():
    samples = np.array([[[0], [1], [499], [500], [501], [999], [1000]]], np.uint16)
    got = decode_image(pam(samples, "GRAYSCALE", 1000), PAM).rgb[0, :, 0]
    assert got.tolist() == [int(int(v) * 255 / 1000 + 0.5) for v in samples[0, :, 0]]
    assert got.tolist() == [0, 0, 127, 128, 128, 255, 255]


def test_sixteen_bit_png_scales_like_pam():
    gray = np.array([[0, 128, 129, 32767, 32768, 65406, 65407, 65535]], np.uint16)
    png = encoded(gray, "PNG")
    assert Image.open(io.BytesIO(png)).mode == "I;16"     # Pillow's own convert would clip, not scale
    from_png = decode_image(png, "image/png").rgb
    from_pam = decode_image(pam(gray[..., None], "GRAYSCALE", 65535), PAM).rgb
    assert np.array_equal(from_png, from_pam) and from_pam[0, :, 0].tolist() == [0, 0, 1, 127, 128, 254, 255, 255]


def test_pam_comments_are_allowed():
    data = b"P7\n# made by hand\nWIDTH 1\nHEIGHT 1\n#x\nDEPTH 3\nMAXVAL 255\nTUPLTYPE RGB\nENDHDR\n\x01\x02\x03"
    assert decode_image(data, PAM).rgb.tolist() == [[[1, 2, 3]]]


HEAD = "P7\nWIDTH 2\nHEIGHT 1\nDEPTH 3\nMAXVAL 255\nTUPLTYPE RGB\nENDHDR\n"


@pytest.mark.parametrize("data, says", [
    (HEAD.replace("ENDHDR\n", "").encode() + bytes(6), "no ENDHDR line"),
    (HEAD.replace("ENDHDR", "ENDHDR ").encode() + bytes(6), "no ENDHDR line"),
    (b"P7\n" + b"#" * 5000 + HEAD[2:].encode() + bytes(6), "no ENDHDR line in the first 4096 bytes"),
    (HEAD.replace("WIDTH 2\n", "").encode() + bytes(6), "missing WIDTH"),
    (HEAD.replace("TUPLTYPE RGB\n", "").encode() + bytes(6), "missing TUPLTYPE"),
    (HEAD.replace("HEIGHT 1\n", "HEIGHT 1\nHEIGHT 1\n").encode() + bytes(6), "HEIGHT appears twice"),
    (HEAD.replace("MAXVAL 255", "MAXVAL 0").encode() + bytes(6), "MAXVAL must be a positive decimal integer"),
    (HEAD.replace("MAXVAL 255", "MAXVAL 65536").encode() + bytes(12), "MAXVAL must be 1..65535"),
    (HEAD.replace("WIDTH 2", "WIDTH -2").encode() + bytes(6), "WIDTH must be a positive decimal integer"),
    (HEAD.replace("WIDTH 2", "WIDTH 0x2").encode() + bytes(6), "WIDTH must be a positive decimal integer"),
    (HEAD.replace("WIDTH 2", "WIDTH 2 3").encode() + bytes(6), "WIDTH needs exactly one value"),
    (HEAD.replace("DEPTH 3", "DEPTH 4").encode() + bytes(8), "TUPLTYPE RGB has DEPTH 3, not 4"),
    (HEAD.replace("TUPLTYPE RGB", "TUPLTYPE CMYK").encode() + bytes(6), "TUPLTYPE 'CMYK' is not one of"),
    (HEAD.replace("DEPTH 3", "DEPTH 1").replace("RGB", "BLACKANDWHITE").encode() + bytes(2),
     "BLACKANDWHITE needs MAXVAL 1, got 255"),
    (HEAD.replace("MAXVAL 255", "MAXVAL 255\nCOLOR red").encode() + bytes(6), "unknown header line 'COLOR red'"),
    (HEAD.replace("WIDTH 2", "WIDTH ²").encode() + bytes(6), "the header is not ASCII"),
])
def test_bad_pam_headers_reject(data, says):
    message = rejected(decode_image, data, PAM).message
    assert "malformed PAM header: " + says in message
    assert rejected(probe, data, PAM).message == message


@pytest.mark.parametrize("data, says", [
    (HEAD.encode() + bytes(5), "the PAM image is truncated (5 of 6 raster bytes)"),
    (HEAD.encode() + bytes(12), "6 bytes follow the PAM raster; a part holds one image"),
    (HEAD.replace("MAXVAL 255", "MAXVAL 7").encode() + bytes([1, 2, 3, 4, 5, 8]), "a sample above its MAXVAL 7"),
])
def test_bad_pam_rasters_reject(data, says):
    assert says in rejected(decode_image, data, PAM).message


# ---------------------------------------------------------------------------------------- probe


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP", "PAM"])
def test_probe_reads_the_header_geometry_without_decoding(fmt, pillow_calls):
    data = pam(PIXELS, "RGB", 255) if fmt == "PAM" else encoded(PIXELS, fmt)
    assert probe(data, PAM if fmt == "PAM" else MIME[fmt]) == ImageHeader(fmt.lower(), 13, 7, 1)
    assert not [call for call in pillow_calls if call[0] == "load"]
    if fmt != "PAM":
        assert pillow_calls == [("open", fmt)]


def test_probe_checks_labels_and_formats_like_decoding():
    png = encoded(PIXELS, "PNG")
    assert "the bytes are PNG" in rejected(probe, png, "image/gif").message
    assert "not accepted by this deployment" in rejected(probe, png, "image/png",
                                                         formats=ImageFormats(frozenset())).message
