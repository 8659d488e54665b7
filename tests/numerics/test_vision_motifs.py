"""std:vision.loom against references at odd shapes: resize_bicubic against onnxruntime's own
Resize (cubic, half_pixel, a = -0.75, the node DINOv2's ONNX export uses), the others
against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402 - the reference (test extra)
from onnx import helper


def ort_resize(src_hwc: np.ndarray, out_hw: tuple[int, int], a: float) -> np.ndarray:
    """ONNX Resize (opset 14, mode cubic, half_pixel, exclude_outside 0, sizes given) on [1, C, H, W]."""
    h, w, c = src_hwc.shape
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="cubic",
                            coordinate_transformation_mode="half_pixel", cubic_coeff_a=a, nearest_mode="floor")
    graph = helper.make_graph([node], "resize", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, c, h, w]),
                                                 helper.make_tensor_value_info("sizes", onnx.TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ascontiguousarray(src_hwc.transpose(2, 0, 1)[None])
    y = session.run(None, {"x": x, "sizes": np.array([1, c, *out_hw], np.int64)})[0]
    return y[0].transpose(1, 2, 0)


@pytest.mark.parametrize("src, dst, a", [((37, 37, 5), (16, 16), -0.75), ((9, 7, 3), (4, 11), -0.75),
                                         ((5, 6, 2), (13, 3), -0.5)])
def test_resize_bicubic_equals_onnxruntimes_resize(kernel, rng, src, dst, a):
    x = rng.standard_normal(src).astype(np.float32)
    y = np.zeros(dst + (src[2],), np.float32)
    kernel("resize_bicubic")(x, np.float32(a), y)
    want = ort_resize(x, dst, a)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-6)


def test_patchify_normalize_is_the_convolutions_im2col(kernel, rng):
    b, size, grid, c = 2, 3, 5, 3
    pixels = rng.integers(0, 256, (b, grid * size, grid * size, c), dtype=np.uint8)
    mean, std = np.array([0.4, 0.5, 0.6], np.float32), np.array([0.2, 0.25, 0.3], np.float32)
    rows = np.zeros((b * grid * grid, c * size * size), np.float32)
    kernel("patchify_normalize")(pixels, mean, std, size, rows)
    # a stride-size convolution with a random weight, by numpy, against rows . weight^T
    norm = (pixels / 255.0 - mean) / std                                   # [b, H, W, c]
    weight = rng.standard_normal((4, c, size, size))
    want = np.zeros((b, grid, grid, 4))
    for gy in range(grid):
        for gx in range(grid):
            patch = norm[:, gy * size:(gy + 1) * size, gx * size:(gx + 1) * size, :]   # [b, ky, kx, c]
            want[:, gy, gx] = np.einsum("byxc,ocyx->bo", patch, weight)
    got = rows @ weight.reshape(4, -1).T
    np.testing.assert_allclose(got.reshape(b, grid, grid, 4), want, rtol=1e-5, atol=1e-5)


def test_vit_embed_layerscale_and_drop_class_token(kernel, rng):
    b, grid, d = 3, 3, 5
    p, per = grid * grid, grid * grid + 1
    patches = rng.standard_normal((b * p, d)).astype(np.float32)
    bias, cls, cls_pos = (rng.standard_normal(d).astype(np.float32) for _ in range(3))
    pos = rng.standard_normal((grid, grid, d)).astype(np.float32)
    x = np.zeros((b * per, d), np.float32)
    kernel("vit_embed")(patches, bias, cls, cls_pos, pos, x)
    want = np.concatenate([np.broadcast_to(cls + cls_pos, (b, 1, d)),
                           (patches.reshape(b, p, d) + bias) + pos.reshape(1, p, d)], 1).reshape(b * per, d)
    np.testing.assert_array_equal(x, want)

    y, gamma = rng.standard_normal((b * per, d)).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    residual = x.copy()
    kernel("layerscale_residual")(residual, y, bias, gamma)
    np.testing.assert_array_equal(residual, (y + bias) * gamma + x)

    out = np.zeros((b, p, d), np.float32)
    kernel("drop_class_token")(x, out)
    np.testing.assert_array_equal(out, x.reshape(b, per, d)[:, 1:])


def _fit_reference(src: np.ndarray, size: int) -> np.ndarray:
    """fit_rows + fit_cols restated in float64: the triangle filter widened by the reduction."""
    def weights(n: int) -> np.ndarray:
        scale = n / size
        support = max(scale, 1.0)
        out = np.zeros((size, n))
        for x in range(size):
            centre = (x + 0.5) * scale
            i = np.arange(n)
            w = np.maximum(1.0 - np.abs((i + 0.5 - centre) / support), 0.0)
            out[x] = w / w.sum()
        return out
    h, w, _ = src.shape
    rows = np.einsum("xi,hic->hxc", weights(w), src.astype(np.float64))
    cols = np.einsum("yi,ixc->yxc", weights(h), rows)
    return np.clip(np.floor(cols + 0.5), 0, 255)


@pytest.mark.parametrize("shape, size", [((300, 451, 3), 224), ((97, 61, 3), 224), ((224, 224, 3), 224),
                                         ((5, 7, 1), 3)])
def test_fit_image_is_antialiased_bilinear(kernel, rng, shape, size):
    from PIL import Image

    src = rng.integers(0, 256, shape, dtype=np.uint8)
    if shape[0] > 50:   # a smooth picture: the filters' differences show at edges, not in noise
        yy, xx = np.mgrid[0:shape[0], 0:shape[1]]
        src = np.stack([(xx * 255 // shape[1]), (yy * 255 // shape[0]), ((xx + yy) % 256)], -1).astype(np.uint8)
    rows = np.zeros((shape[0], size, shape[2]), np.float32)
    out = np.zeros((size, size, shape[2]), np.uint8)
    kernel("fit_rows")(src, rows)
    kernel("fit_cols")(rows, out)
    want = _fit_reference(src, size)
    diff = np.abs(out.astype(np.int64) - want.astype(np.int64))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99, (diff.max(), (diff == 0).mean())
    if shape == (224, 224, 3):
        assert np.array_equal(out, src)          # the encoder's own geometry passes through untouched
    if shape[2] == 3:   # Pillow's bilinear resize (8-bit between its passes): within one step
        pillow = np.asarray(Image.fromarray(src).resize((size, size), Image.Resampling.BILINEAR))
        assert np.abs(out.astype(np.int64) - pillow.astype(np.int64)).max() <= 1


@pytest.mark.parametrize("k, grid", [(4, 16), (2, 16), (1, 4), (3, 9)])
def test_pool_grid_is_the_mean_of_each_block(kernel, rng, k, grid):
    b, d = 3, 5
    features = rng.standard_normal((b, grid * grid, d)).astype(np.float32)
    side = grid // k
    pooled = np.zeros((b * side * side, d), np.float32)
    kernel("pool_grid")(features, k, pooled)
    want = features.reshape(b, side, k, side, k, d).astype(np.float64).mean(axis=(2, 4)).reshape(-1, d)
    np.testing.assert_allclose(pooled, want, rtol=1e-6, atol=1e-6)
    one = np.zeros((side * side, d), np.float32)
    kernel("pool_grid")(features[1:2].copy(), k, one)
    assert np.array_equal(one, pooled[side * side:2 * side * side])   # an image alone: the same bits


