"""Helpers for the numerics tests: GGUF blocks built with numpy, and checked references."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

QTYPES = {"q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1, "q8_0": GGMLQuantizationType.Q8_0}
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}
MOTIFS = Path(__file__).resolve().parents[2] / "loomc" / "motifs"


def quantized(rng: np.random.Generator, qtype: str, rows: int, cols: int, scale: float = 1.0):
    """Random f32 weights quantized by gguf's reference quantizer: (GGUF bytes, dequantized f32)."""
    w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    blocks = quantize(w, QTYPES[qtype])
    return blocks, dequantize(blocks, QTYPES[qtype])


def random_blocks(rng: np.random.Generator, qtype: str, shape: tuple[int, ...], scale: float = 0.02) -> np.ndarray:
    """Valid GGUF blocks with random codes and small f16 scales (fast for big tensors)."""
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    nb, bpb = cols // 32, BLOCK_BYTES[qtype]
    b = rng.integers(0, 256, (rows, nb, bpb), dtype=np.uint8)
    b[:, :, 0:2] = (rng.random((rows, nb)) * scale + scale / 4).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    if qtype == "q4_1":
        b[:, :, 2:4] = (-rng.random((rows, nb)) * scale * 8).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    return b.reshape(shape[:-1] + (nb * bpb,))


def dequantized(qtype: str, blocks: np.ndarray) -> np.ndarray:
    return dequantize(blocks, QTYPES[qtype])


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
