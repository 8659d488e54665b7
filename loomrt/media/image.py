"""Chat image parts in, RGB8 pixels out: part validation, data URLs, signature sniffing, limits, decoding.

    parse_image_part(part, where) -> ImageRef            the JSON shape only (spec "Image input")
    image_bytes(ref, limits) -> bytes                     the data URL's base64 payload, bounded
    probe(data, media_type, ...) -> ImageHeader           format, geometry and frame count; no pixels
    decode_image(data, media_type, ...) -> DecodedImage   RGB8 pixels plus the bytes' sha256

The server never fetches an image: a part's `url` must be a base64 `data:` URL, and anything
else (http(s), a file path, another scheme) is the client's error. The container's bytes
select the decoder (as for audio, `audio.py`), and the data URL's media type must name the
same format, so a label cannot steer bytes into a decoder that was not meant for them.

PAM (`image/x-portable-arbitrarymap`) is decoded here, without a codec library, and is
always on: a build whose Pillow lacks every codec still takes images. PNG, JPEG, GIF and
WebP go through Pillow and can each be turned off (`ImageFormats`) without touching the
others.

Limits (`ImageLimits`: bytes, longest side, pixels) are checked from the header, with our own
parsers, before Pillow sees the bytes: Pillow's `Image.open` runs its own decompression-bomb
check (an error past 2 x `Image.MAX_IMAGE_PIXELS`) and libwebp allocates the whole canvas when
a WebP is opened, so a few-KB file declaring 40000 x 40000 must be refused before either
runs. Pillow's reported size is checked again after it opens the file (a GIF frame may
extend the logical screen), and its bomb error, should a configured limit exceed Pillow's,
becomes the same 400.

Every image comes out as RGB8 `[H, W, 3]`: straight alpha (PAM's `_ALPHA` tuple types, PNG,
GIF or WebP transparency) is composited on white, once samples are 8-bit, by
`composite_on_white`. The model consumes RGB8 and has no use for alpha; compositing on one
fixed background keeps a transparent logo's identity stable instead of exposing whatever
colour the encoder left in transparent pixels. Samples of more than 8 bits are scaled with
rounding, `round(v * 255 / maxval)`.

Animated or multi-image inputs (GIF, WebP or APNG with more than one frame, an MPO JPEG, a
PAM followed by another image) reject: a part is one image.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loomrt.errors import InvalidRequest
from loomrt.fields import reject_unknown, shown

DETAILS = ("auto", "low", "high")
PART_FIELDS = ("type", "image_url")
IMAGE_URL_FIELDS = ("url", "detail")
OPTIONAL_FORMATS = ("png", "jpeg", "gif", "webp")   # through Pillow, each can be disabled
ALL_FORMATS = ("pam",) + OPTIONAL_FORMATS
MEDIA_TYPES: dict[str, tuple[str, ...]] = {          # the labels each format accepts (first: canonical)
    "pam": ("image/x-portable-arbitrarymap",),
    "png": ("image/png",),
    "jpeg": ("image/jpeg", "image/jpg"),
    "gif": ("image/gif",),
    "webp": ("image/webp",),
}
PILLOW_FORMAT = {"png": "PNG", "jpeg": "JPEG", "gif": "GIF", "webp": "WEBP"}
PAM_HEADER_BYTES = 4096   # a PAM header longer than this (before ENDHDR) is refused unread
# PAM tuple types: (depth, has alpha)
PAM_TUPLE_TYPES: dict[str, tuple[int, bool]] = {
    "BLACKANDWHITE": (1, False), "GRAYSCALE": (1, False), "RGB": (3, False),
    "BLACKANDWHITE_ALPHA": (2, True), "GRAYSCALE_ALPHA": (2, True), "RGB_ALPHA": (4, True),
}
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_TOKEN = r"[A-Za-z0-9!#$&^_.+\-]+"
_MEDIA_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}")
_PARAMETER = re.compile(rf"{_TOKEN}=[^;,]*")


@dataclass(frozen=True)
class ImageLimits:
    """What a source accepts per image: compressed bytes, the longest side and width x height.

    The defaults (20 MiB, 8192 a side, 32 Mi pixels: 96 MiB as RGB8) keep every accepted image
    below Pillow's own decompression-bomb threshold (`Image.MAX_IMAGE_PIXELS`, about 89 Mi
    pixels), so Pillow never warns about one we accept."""

    max_bytes: int = 20 * 1024 * 1024
    max_side: int = 8192
    max_pixels: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_side", "max_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ImageLimits.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ImageFormats:
    """The formats a deployment decodes: PAM always, plus `enabled` of PNG, JPEG, GIF and WebP
    (all by default) where the installed Pillow can decode them. Names are lower case."""

    enabled: frozenset[str] = field(default_factory=lambda: frozenset(OPTIONAL_FORMATS))

    def __post_init__(self) -> None:
        names = frozenset(self.enabled)
        unknown = sorted(names - set(ALL_FORMATS))
        if unknown:
            raise ValueError(f"unknown image format(s) {', '.join(unknown)}; known: {', '.join(ALL_FORMATS)}")
        object.__setattr__(self, "enabled", names - {"pam"})

    def accepts(self, fmt: str) -> bool:
        return fmt == "pam" or (fmt in self.enabled and fmt in pillow_formats())

    def supported(self) -> tuple[str, ...]:
        """What this deployment decodes, PAM first, for messages and discovery."""
        return tuple(f for f in ALL_FORMATS if self.accepts(f))


DEFAULT_LIMITS = ImageLimits()
DEFAULT_FORMATS = ImageFormats()


@dataclass(frozen=True)
class ImageRef:
    """A validated `image_url` part: its data URL (not yet decoded), the data URL's media type,
    the detail (`auto` when omitted) and `param`, the url's path for every later error."""

    url: str
    media_type: str
    detail: str
    param: str


@dataclass(frozen=True)
class ImageHeader:
    """What the header says: the format, its geometry and how many frames the file holds."""

    format: str
    width: int
    height: int
    frames: int


@dataclass(frozen=True, eq=False)
class DecodedImage:
    """One decoded image. `digest` is the sha256 (hex) of the compressed bytes: the image's
    identity for retained-history reuse, which must not depend on how it decodes."""

    width: int
    height: int
    rgb: np.ndarray     # uint8 [height, width, 3]
    format: str
    digest: str


# ---------------------------------------------------------------------------------- the JSON part


def parse_image_part(part: Any, where: str = "image") -> ImageRef:
    """The part `{"type": "image_url", "image_url": {"url", "detail"?}}`, checked field by field;
    the url must be a base64 data URL (its payload is not decoded here). `where` is the part's
    path (`messages[0].content[1]`), the prefix of every error's param."""
    if not isinstance(part, dict):
        raise InvalidRequest(f"{where}: expected an image_url part object, got {shown(part)}", param=where)
    reject_unknown(part, PART_FIELDS, f"{where}.")
    if part.get("type") != "image_url":
        raise InvalidRequest(f"{where}.type: expected \"image_url\", got {shown(part.get('type'))}",
                             param=f"{where}.type")
    image = part.get("image_url")
    if not isinstance(image, dict):
        what = "is missing" if "image_url" not in part else f"must be an object, got {shown(image)}"
        raise InvalidRequest(f"{where}.image_url {what} (an object with url and optional detail)",
                             param=f"{where}.image_url")
    reject_unknown(image, IMAGE_URL_FIELDS, f"{where}.image_url.")
    param = f"{where}.image_url.url"
    url = image.get("url")
    if not isinstance(url, str):
        what = "is missing" if "url" not in image else f"must be a string, got {shown(url)}"
        raise InvalidRequest(f"{param} {what} (a base64 data URL: data:image/png;base64,...)", param=param)
    detail = image.get("detail", "auto")
    if detail not in DETAILS:
        raise InvalidRequest(f"{where}.image_url.detail must be one of {', '.join(DETAILS)}, got {shown(detail)}",
                             param=f"{where}.image_url.detail")
    media_type, _ = _split_data_url(url, param)
    return ImageRef(url=url, media_type=media_type, detail=detail, param=param)


def image_bytes(ref: ImageRef, limits: ImageLimits = DEFAULT_LIMITS) -> bytes:
    """The data URL's payload, strictly base64 (no whitespace, padding required). Its decoded
    size is computed from the text and checked against `max_bytes` before anything is decoded."""
    _, payload = _split_data_url(ref.url, ref.param)
    if not payload:
        raise InvalidRequest(f"{ref.param}: the data URL holds no image bytes", param=ref.param)
    padding = 2 if payload.endswith("==") else 1 if payload.endswith("=") else 0
    _check_bytes(len(payload) * 3 // 4 - padding, limits, ref.param)   # exact for well-formed base64
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(f"{ref.param}: the data URL's payload is not valid base64 ({exc})",
                             param=ref.param) from None
    return data


def _split_data_url(url: str, param: str) -> tuple[str, str]:
    """(media type, base64 text) of `data:TYPE/SUBTYPE[;k=v]*;base64,PAYLOAD`; 400 for any other URL."""
    scheme = _SCHEME.match(url)
    if scheme is None or scheme.group(1).lower() != "data":
        raise InvalidRequest(f"{param}: {_not_a_data_url(url, scheme)}; images must be sent inline as a base64 "
                             "data URL (data:image/png;base64,...)", param=param)
    head, comma, payload = url[len("data:"):].partition(",")
    if not comma:
        raise InvalidRequest(f"{param}: malformed data URL (no ',' before the payload)", param=param)
    pieces = head.split(";")
    if pieces[-1].lower() != "base64":
        raise InvalidRequest(f"{param}: the data URL must be base64 (data:{head or 'TYPE'};base64,...)", param=param)
    media_type, parameters = pieces[0], pieces[1:-1]
    if not media_type:
        raise InvalidRequest(f"{param}: the data URL names no media type (data:image/png;base64,...)", param=param)
    if not _MEDIA_TYPE.fullmatch(media_type) or not all(_PARAMETER.fullmatch(p) for p in parameters):
        raise InvalidRequest(f"{param}: malformed data URL media type {head!r}", param=param)
    return media_type.lower(), payload


def _not_a_data_url(url: str, scheme: re.Match[str] | None) -> str:
    if scheme is None:
        return "not a URL (a path or bare base64?); the server reads no files"
    name = scheme.group(1).lower()
    if name in ("http", "https"):
        return f"{name} URLs are not fetched"
    return f"{name}: URLs are not accepted"


# --------------------------------------------------------------------------- sniffing and headers


def sniff(data: bytes) -> str:
    """The image container of `data` by its first bytes: one of ALL_FORMATS, a recognised but
    unsupported format (bmp, tiff, pnm, avif, heic, svg), or `unknown`."""
    head = data[:32]
    if head.startswith(b"P7\n"):
        return "pam"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:2] == b"BM":
        return "bmp"
    if head[:4] in (b"II*\0", b"MM\0*"):
        return "tiff"
    if len(head) >= 3 and head[0:1] == b"P" and head[1:2] in b"123456" and head[2:3].isspace():
        return "pnm"
    if head[4:8] == b"ftyp":
        return "avif" if head[8:12] in (b"avif", b"avis") else "heic"
    if head.lstrip()[:5] in (b"<?xml", b"<svg "):
        return "svg"
    return "unknown"


def probe(data: bytes, media_type: str, *, formats: ImageFormats = DEFAULT_FORMATS,
          limits: ImageLimits = DEFAULT_LIMITS, param: str = "image_url.url") -> ImageHeader:
    """Format, geometry and frame count from the header, with every check `decode_image` makes
    short of the pixels (signature, label, enabled format, limits, one frame); no pixel is
    decoded. Input-token counting uses this."""
    fmt = _admit(data, media_type, formats, limits, param)
    if fmt == "pam":
        header = _pam_header(data, param)
        _check_geometry(header.width, header.height, limits, param)
        _pam_raster(data, header, param)   # a truncated raster or a second image: the same 400 as decoding
        return ImageHeader("pam", header.width, header.height, 1)
    with _pillow_open(data, fmt, limits, param) as im:
        return ImageHeader(fmt, im.size[0], im.size[1], _frames(im, fmt, param))


def decode_image(data: bytes, media_type: str, *, formats: ImageFormats = DEFAULT_FORMATS,
                 limits: ImageLimits = DEFAULT_LIMITS, param: str = "image_url.url") -> DecodedImage:
    """One still image as RGB8 (alpha composited on white). `media_type` is the data URL's label,
    which must name the format the bytes carry; `param` names the field for every error."""
    fmt = _admit(data, media_type, formats, limits, param)
    digest = hashlib.sha256(data).hexdigest()
    if fmt == "pam":
        rgb = _decode_pam(data, limits, param)
    else:
        with _pillow_open(data, fmt, limits, param) as im:
            _frames(im, fmt, param)
            rgb = _pillow_pixels(im, fmt, param)
    return DecodedImage(width=rgb.shape[1], height=rgb.shape[0], rgb=rgb, format=fmt, digest=digest)


def composite_on_white(rgba: np.ndarray) -> np.ndarray:
    """RGB8 of straight-alpha RGBA8 `[H, W, 4]` over white: round((c*a + 255*(255 - a)) / 255)."""
    c = rgba[..., :3].astype(np.uint32)
    a = rgba[..., 3:4].astype(np.uint32)
    return ((c * a + 255 * (255 - a) + 127) // 255).astype(np.uint8)


def _admit(data: bytes, media_type: str, formats: ImageFormats, limits: ImageLimits, param: str) -> str:
    """The format the bytes carry, once it is enabled, the label agrees and the header's geometry
    is within limits (PAM's geometry is checked by its own parser, which owns that header)."""
    if not data:
        raise InvalidRequest(f"{param}: the image is empty", param=param)
    _check_bytes(len(data), limits, param)
    fmt = sniff(data)
    supported = formats.supported()
    named = ", ".join(MEDIA_TYPES[f][0] for f in supported)
    if fmt not in ALL_FORMATS:
        what = "not an image format this server knows" if fmt == "unknown" else f"{fmt.upper()}, which is not supported"
        raise InvalidRequest(f"{param}: unsupported image type (the bytes are {what}); send one of {named}",
                             param=param)
    if not formats.accepts(fmt):
        raise InvalidRequest(f"{param}: {fmt.upper()} images are not accepted by this deployment; send one of "
                             f"{named}", param=param)
    label = (media_type or "").strip().lower()
    if label not in MEDIA_TYPES[fmt]:
        raise InvalidRequest(f"{param}: the data URL says {label or 'nothing'} but the bytes are {fmt.upper()} "
                             f"({MEDIA_TYPES[fmt][0]}); label the image with its real type", param=param)
    if fmt != "pam":
        width, height = _GEOMETRY[fmt](data, param)
        _check_geometry(width, height, limits, param)
    return fmt


def _png_geometry(data: bytes, param: str) -> tuple[int, int]:
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise _corrupt("png", "no IHDR header", param)
    return struct.unpack(">II", data[16:24])


def _gif_geometry(data: bytes, param: str) -> tuple[int, int]:
    """The logical screen, widened to the first frame's extent as Pillow widens it: a frame may
    lie outside a small screen, so the screen alone would let a bomb through to Pillow."""
    if len(data) < 13:
        raise _corrupt("gif", "truncated header", param)
    width, height, flags = struct.unpack("<HHB", data[6:11])
    i = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    while i < len(data):
        block = data[i]
        if block == 0x2C:   # image descriptor: left, top, width, height
            if i + 9 > len(data):
                break
            left, top, w, h = struct.unpack("<HHHH", data[i + 1:i + 9])
            return max(width, left + w), max(height, top + h)
        if block != 0x21:   # anything but an extension before the first image
            break
        i += 2
        while i < len(data) and data[i]:   # the extension's sub-blocks, up to the empty one
            i += 1 + data[i]
        i += 1
    raise _corrupt("gif", "no image before the end of the file", param)


def _webp_geometry(data: bytes, param: str) -> tuple[int, int]:
    chunk, body = data[12:16], data[20:]
    if chunk == b"VP8X" and len(body) >= 10:
        return 1 + int.from_bytes(body[4:7], "little"), 1 + int.from_bytes(body[7:10], "little")
    if chunk == b"VP8 " and len(body) >= 10 and body[3:6] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", body[6:10])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(body) >= 5 and body[0] == 0x2F:
        bits = int.from_bytes(body[1:5], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    raise _corrupt("webp", "no VP8, VP8L or VP8X header", param)


def _jpeg_geometry(data: bytes, param: str) -> tuple[int, int]:
    """The frame header's size: markers are walked from SOI to the first SOFn (never past SOS)."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise _corrupt("jpeg", f"no marker at byte {i}", param)
        marker = data[i + 1]
        if marker == 0xFF:          # fill byte
            i += 1
            continue
        if 0xD0 <= marker <= 0xD8 or marker == 0x01:   # RSTn, SOI, TEM: no length
            i += 2
            continue
        if marker in (0xD9, 0xDA):
            break
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if length < 8 or i + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            if height == 0 or width == 0:
                raise _corrupt("jpeg", "the frame header declares no size", param)
            return width, height
        i += 2 + length
    raise _corrupt("jpeg", "no frame header before the scan", param)


_GEOMETRY = {"png": _png_geometry, "gif": _gif_geometry, "webp": _webp_geometry, "jpeg": _jpeg_geometry}


def _check_bytes(size: int, limits: ImageLimits, param: str) -> None:
    if size > limits.max_bytes:
        raise InvalidRequest(f"{param}: the image is {size} bytes; this model accepts at most {limits.max_bytes}",
                             param=param)


def _check_geometry(width: int, height: int, limits: ImageLimits, param: str) -> None:
    if width < 1 or height < 1:
        raise InvalidRequest(f"{param}: the image declares a size of {width} x {height}", param=param)
    if max(width, height) > limits.max_side:
        raise InvalidRequest(f"{param}: the image is {width} x {height}; this model accepts at most "
                             f"{limits.max_side} pixels a side", param=param)
    if width * height > limits.max_pixels:
        raise InvalidRequest(f"{param}: the image is {width} x {height} = {width * height} pixels; this model "
                             f"accepts at most {limits.max_pixels}", param=param)


def _corrupt(fmt: str, why: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: the {fmt.upper()} image is truncated or corrupt ({why})", param=param)


# ------------------------------------------------------------------------------------------ PAM


@dataclass(frozen=True)
class _PamHeader:
    width: int
    height: int
    depth: int
    maxval: int
    tupltype: str
    offset: int     # first raster byte


def _pam_header(data: bytes, param: str) -> _PamHeader:
    """Netpbm's PAM header, strictly: each of WIDTH, HEIGHT, DEPTH, MAXVAL and TUPLTYPE exactly
    once, decimal values, a known tuple type whose depth DEPTH matches, `#` comments, ENDHDR."""
    end = data.find(b"\nENDHDR\n", 0, PAM_HEADER_BYTES)
    if end < 0:
        raise _bad_pam(f"no ENDHDR line in the first {PAM_HEADER_BYTES} bytes", param)
    try:
        text = data[3:end].decode("ascii")
    except UnicodeDecodeError:
        raise _bad_pam("the header is not ASCII", param) from None
    fields: dict[str, str] = {}
    for line in text.split("\n"):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        key = words[0]
        if key not in ("WIDTH", "HEIGHT", "DEPTH", "MAXVAL", "TUPLTYPE"):
            raise _bad_pam(f"unknown header line {line.strip()!r}", param)
        if key in fields:
            raise _bad_pam(f"{key} appears twice", param)
        if len(words) != 2:
            raise _bad_pam(f"{key} needs exactly one value, got {line.strip()!r}", param)
        fields[key] = words[1]
    missing = [k for k in ("WIDTH", "HEIGHT", "DEPTH", "MAXVAL", "TUPLTYPE") if k not in fields]
    if missing:
        raise _bad_pam(f"missing {', '.join(missing)}", param)
    numbers = {}
    for key in ("WIDTH", "HEIGHT", "DEPTH", "MAXVAL"):
        value = fields[key]
        if not value.isascii() or not value.isdigit() or len(value) > 9 or int(value) < 1:
            raise _bad_pam(f"{key} must be a positive decimal integer, got {value!r}", param)
        numbers[key] = int(value)
    tupltype = fields["TUPLTYPE"]
    if tupltype not in PAM_TUPLE_TYPES:
        raise _bad_pam(f"TUPLTYPE {tupltype!r} is not one of {', '.join(PAM_TUPLE_TYPES)}", param)
    depth = PAM_TUPLE_TYPES[tupltype][0]
    if numbers["DEPTH"] != depth:
        raise _bad_pam(f"TUPLTYPE {tupltype} has DEPTH {depth}, not {numbers['DEPTH']}", param)
    if numbers["MAXVAL"] > 65535:
        raise _bad_pam(f"MAXVAL must be 1..65535, got {numbers['MAXVAL']}", param)
    if tupltype.startswith("BLACKANDWHITE") and numbers["MAXVAL"] != 1:
        raise _bad_pam(f"{tupltype} needs MAXVAL 1, got {numbers['MAXVAL']}", param)
    return _PamHeader(numbers["WIDTH"], numbers["HEIGHT"], depth, numbers["MAXVAL"], tupltype,
                      end + len(b"\nENDHDR\n"))


def _pam_raster(data: bytes, header: _PamHeader, param: str) -> memoryview:
    """Exactly the raster the header promises: fewer bytes are truncation, more a second image."""
    size = header.width * header.height * header.depth * (2 if header.maxval > 255 else 1)
    got = len(data) - header.offset
    if got < size:
        raise InvalidRequest(f"{param}: the PAM image is truncated ({got} of {size} raster bytes)", param=param)
    if got > size:
        raise InvalidRequest(f"{param}: {got - size} bytes follow the PAM raster; a part holds one image, not "
                             "several", param=param)
    return memoryview(data)[header.offset:]


def _decode_pam(data: bytes, limits: ImageLimits, param: str) -> np.ndarray:
    header = _pam_header(data, param)
    _check_geometry(header.width, header.height, limits, param)   # before any sample is read
    raster = _pam_raster(data, header, param)
    samples = np.frombuffer(raster, ">u2" if header.maxval > 255 else "u1")
    samples = samples.reshape(header.height, header.width, header.depth)
    if header.maxval not in (255, 65535) and int(samples.max()) > header.maxval:
        raise InvalidRequest(f"{param}: the PAM raster has a sample above its MAXVAL {header.maxval}", param=param)
    maxval = header.maxval
    if maxval == 255:
        eight = samples
    else:
        eight = ((samples.astype(np.uint32) * 255 + maxval // 2) // maxval).astype(np.uint8)
    colour = eight[..., :-1] if PAM_TUPLE_TYPES[header.tupltype][1] else eight
    if colour.shape[2] == 1:
        colour = np.repeat(colour, 3, axis=2)
    if PAM_TUPLE_TYPES[header.tupltype][1]:
        return composite_on_white(np.concatenate([colour, eight[..., -1:]], axis=2))
    return np.ascontiguousarray(colour)


def _bad_pam(why: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: malformed PAM header: {why}", param=param)


# ---------------------------------------------------------------------------------------- Pillow


def pillow_formats() -> frozenset[str]:
    """The optional formats the installed Pillow decodes (what its features report)."""
    try:
        from PIL import features
    except ImportError:
        return frozenset()
    have = {"gif"}
    if features.check_codec("zlib"):
        have.add("png")
    if features.check_codec("jpg"):
        have.add("jpeg")
    if features.check_module("webp"):
        have.add("webp")
    return frozenset(have)


@contextlib.contextmanager
def _pillow_open(data: bytes, fmt: str, limits: ImageLimits, param: str) -> Iterator[Any]:
    """`Image.open` restricted to the sniffed format, with Pillow's size checked against our
    limits before the caller loads a pixel; Pillow's own errors become the client's 400."""
    from PIL import Image

    try:
        im = Image.open(io.BytesIO(data), formats=[PILLOW_FORMAT[fmt]])
    except Image.DecompressionBombError:   # only when a configured limit exceeds Pillow's own
        raise InvalidRequest(f"{param}: the image has more pixels than this server decodes", param=param) from None
    except Exception as exc:    # Pillow's errors: a truncated or corrupt header
        raise _corrupt(fmt, f"{type(exc).__name__}: {exc}", param) from None
    with im:
        _check_geometry(im.size[0], im.size[1], limits, param)
        yield im


def _frames(im: Any, fmt: str, param: str) -> int:
    """The file's frame count (GIF frames are walked without decoding); more than one rejects."""
    try:
        frames = int(getattr(im, "n_frames", 1))
    except Exception as exc:
        raise _corrupt(fmt, f"{type(exc).__name__}: {exc}", param) from None
    if frames > 1:
        what = "an MPO (multi-picture) JPEG" if fmt == "jpeg" else f"an animated {fmt.upper()}"
        raise InvalidRequest(f"{param}: the image is {what} with {frames} frames; send one still image",
                             param=param)
    return frames


def _pillow_pixels(im: Any, fmt: str, param: str) -> np.ndarray:
    try:
        im.load()
        if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):   # Pillow's convert clips these to 8 bits
            wide = np.asarray(im).astype(np.uint64)
            gray = np.clip(wide, 0, 65535) if im.mode == "I" else wide
            return np.repeat(((gray * 255 + 32767) // 65535).astype(np.uint8)[..., None], 3, axis=2)
        if im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in im.info:
            return composite_on_white(np.asarray(im.convert("RGBA")))
        return np.ascontiguousarray(np.asarray(im.convert("RGB")))
    except Exception as exc:    # truncated or corrupt data
        raise _corrupt(fmt, f"{type(exc).__name__}: {exc}", param) from None


# ----------------------------------------------------------------------------------------- helpers


__all__ = [
    "ALL_FORMATS", "DEFAULT_FORMATS", "DEFAULT_LIMITS", "DETAILS", "DecodedImage", "ImageFormats", "ImageHeader",
    "ImageLimits", "ImageRef", "MEDIA_TYPES", "OPTIONAL_FORMATS", "composite_on_white", "decode_image", "image_bytes",
    "parse_image_part", "pillow_formats", "probe", "sniff",
]
