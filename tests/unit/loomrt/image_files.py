"""Image files for tests, built byte by byte or with Pillow: encodings of an array, PAM files,
data URLs and image_url parts, and headers that declare more pixels than they hold (bombs).
Shared by the unit tests of loomrt/media/image.py and the image-input conformance tests."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
from PIL import Image


def encoded(array: np.ndarray, fmt: str, mode: str | None = None, **options) -> bytes:
    out = io.BytesIO()
    image = Image.fromarray(array, mode) if mode else Image.fromarray(array)
    image.save(out, fmt, **options)
    return out.getvalue()


def pam(samples: np.ndarray, tupltype: str, maxval: int, extra: bytes = b"") -> bytes:
    """A PAM file of `samples` [H, W, depth], already in 0..maxval."""
    h, w, depth = samples.shape
    header = f"P7\nWIDTH {w}\nHEIGHT {h}\nDEPTH {depth}\nMAXVAL {maxval}\nTUPLTYPE {tupltype}\nENDHDR\n".encode()
    return header + samples.astype(">u2" if maxval > 255 else "u1").tobytes() + extra


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def part(url: str, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_declaring(width: int, height: int) -> bytes:
    """A valid-looking 8-bit RGB PNG header declaring width x height, with one tiny IDAT."""
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(bytes(1000))) + png_chunk(b"IEND", b""))


def webp_declaring(width: int, height: int) -> bytes:
    """An extended (VP8X) WebP header declaring a width x height canvas, and no image data."""
    canvas = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    vp8x = b"VP8X" + struct.pack("<I", 10) + bytes(4) + canvas
    return b"RIFF" + struct.pack("<I", 4 + len(vp8x)) + b"WEBP" + vp8x
