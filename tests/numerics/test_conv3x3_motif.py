"""The `conv3x3` motif: bit for bit std:unet.loom's columns, `matmul` and the bias, without the columns.

docs/language.md §11: conv3x3(x, w, bias, height, width, stride, y) computes what
conv3x3_columns(x, height, width, stride, cols), matmul(cols, w, y) and bias_add(y, bias)
compute, every element the same fma chain over k (zero padding included) plus the bias. So
the reference is those calls, and equality is the contract; torch's conv2d checks the
convolution itself, within rounding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from loomc.check import load_files
from loomc.run.compile import compile_command
from loomc.run.dispatch import DispatchError

FIXTURE = Path(__file__).parent / "fixtures" / "conv3x3.loom"


@pytest.fixture(scope="module")
def programs():
    checked = load_files([FIXTURE])
    assert checked.ok, checked.diagnostics
    return {name: compile_command(checked, name) for name in ("implicit", "explicit")}


def run(program, x, w, height, width, stride, bias=None):
    oh, ow = (height - 1) // stride + 1, (width - 1) // stride + 1
    rows = np.zeros(x.shape[0] // (height * width) * oh * ow, np.int32)
    bias = np.zeros(w.shape[0], np.float32) if bias is None else bias
    return program.run({}, {}, {"x": x, "w": w, "bias": bias, "height": height, "width": width, "stride": stride,
                                "rows": rows})["y"]


# (images, height, width, channels in, channels out, stride): odd sizes, borders on every side,
# blocks of 16 output pixels that straddle image rows and images, one pixel, more than one
# panel of weights, and the UNet's own shapes
SHAPES = [(2, 6, 10, 5, 4, 1), (3, 7, 9, 5, 7, 2), (1, 1, 1, 3, 2, 2), (1, 1, 1, 3, 2, 1), (2, 5, 3, 17, 33, 1),
          (1, 48, 24, 16, 20, 1), (2, 32, 32, 32, 32, 2), (2, 16, 16, 80, 128, 1), (2, 64, 64, 32, 32, 1)]


@pytest.mark.parametrize("images, height, width, c, o, stride", SHAPES)
def test_equals_columns_then_matmul_bit_for_bit(programs, rng, images, height, width, c, o, stride):
    x = rng.standard_normal((images * height * width, c)).astype(np.float32)
    w = rng.standard_normal((o, 9 * c)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    got = run(programs["implicit"], x, w, height, width, stride, bias)
    np.testing.assert_array_equal(got, run(programs["explicit"], x, w, height, width, stride, bias))


def test_is_torch_conv2d(programs, rng):
    images, c, o, h, w_ = 2, 6, 5, 9, 11
    x = rng.standard_normal((images, c, h, w_)).astype(np.float32)
    weight = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    rows_x = np.ascontiguousarray(x.transpose(0, 2, 3, 1).reshape(-1, c))
    rows_w = np.ascontiguousarray(weight.transpose(0, 2, 3, 1).reshape(o, -1))  # conv_weight_rows' layout
    for stride in (1, 2):
        want = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias), stride=stride,
                        padding=1).numpy()
        oh, ow = want.shape[2:]
        got = run(programs["implicit"], rows_x, rows_w, h, w_, stride, bias).reshape(images, oh, ow, o).transpose(0, 3, 1, 2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_an_image_gives_the_same_bits_alone_or_batched(programs, rng):
    h, w_, c, o = 12, 20, 8, 16
    x = rng.standard_normal((3 * h * w_, c)).astype(np.float32)
    w = rng.standard_normal((o, 9 * c)).astype(np.float32)
    batch = run(programs["implicit"], x, w, h, w_, 1)
    alone = run(programs["implicit"], np.ascontiguousarray(x[h * w_:2 * h * w_]), w, h, w_, 1)
    np.testing.assert_array_equal(alone, batch[h * w_:2 * h * w_])


def test_shapes_that_are_not_a_convolution_are_refused(programs, rng):
    x = rng.standard_normal((2 * 4 * 4, 3)).astype(np.float32)
    with pytest.raises(DispatchError, match="3x3 convolution"):
        run(programs["implicit"], x, rng.standard_normal((4, 20)).astype(np.float32), 4, 4, 1)   # K != 9 C
    with pytest.raises(DispatchError, match="whole"):
        run(programs["implicit"], x[:30].copy(), rng.standard_normal((4, 27)).astype(np.float32), 4, 4, 1)
