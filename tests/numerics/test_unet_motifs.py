"""std:unet.loom against torch (convolution, GroupNorm, interpolate and reshape, the timestep embedding)
and numpy (the rest) at odd shapes, plus batch invariance and the noise formula bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F


def rows(images: np.ndarray) -> np.ndarray:
    """[B, C, H, W] -> token rows [B * H * W, C]: image b's pixel (y, x) is row (b * H + y) * W + x."""
    b, c, h, w = images.shape
    return np.ascontiguousarray(images.transpose(0, 2, 3, 1).reshape(b * h * w, c))


def unrows(x: np.ndarray, b: int, h: int, w: int) -> np.ndarray:
    return np.ascontiguousarray(x.reshape(b, h, w, -1).transpose(0, 3, 1, 2))


def conv_rows(kernel, w: np.ndarray) -> np.ndarray:
    o, i, kh, kw = w.shape
    out = np.full((o, kh * kw * i), np.nan, np.float32)
    kernel("conv_weight_rows")(w, out)
    return out


def columns(kernel, x: np.ndarray, h: int, w: int, stride: int, images: int) -> np.ndarray:
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    cols = np.full((images * oh * ow, 9 * x.shape[1]), np.nan, np.float32)
    kernel("conv3x3_columns")(x, h, w, stride, cols)
    return cols


def test_conv_weight_rows(kernel, rng):
    w = rng.standard_normal((7, 5, 3, 2)).astype(np.float32)
    got = conv_rows(kernel, w)
    assert np.array_equal(got, w.transpose(0, 2, 3, 1).reshape(7, -1))


@pytest.mark.parametrize("h, w, stride", [(6, 10, 1), (7, 5, 1), (6, 10, 2), (7, 9, 2), (1, 1, 2)])
def test_conv3x3_columns_times_weight_rows_is_torch_conv2d(kernel, rng, h, w, stride):
    b, c, o = 3, 5, 4
    images = rng.standard_normal((b, c, h, w)).astype(np.float32)
    weight = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    cols = columns(kernel, rows(images), h, w, stride, b)
    got = cols @ conv_rows(kernel, weight).T + bias
    want = F.conv2d(torch.from_numpy(images), torch.from_numpy(weight), torch.from_numpy(bias),
                    stride=stride, padding=1).numpy()
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    assert want.shape == (b, o, oh, ow)
    np.testing.assert_allclose(unrows(got, b, oh, ow), want, rtol=1e-5, atol=1e-5)
    # an image alone: the same columns
    alone = columns(kernel, rows(images[1:2]), h, w, stride, 1)
    assert np.array_equal(alone, cols[oh * ow:2 * oh * ow])


def group_norm_rows(kernel, name, images, groups, weight, bias, eps, ss=None):
    """group_norm_stats then the apply kernel `name` on images [B, C, H, W], as token rows."""
    b, c, h, w = images.shape
    stats = np.full((b, 2 * c), np.nan, np.float32)
    kernel("group_norm_stats")(rows(images), h * w, groups, eps, stats)
    y = np.full((b * h * w, c), np.nan, np.float32)
    extra = () if ss is None else (ss,)
    kernel(name)(rows(images), stats, h * w, weight, bias, *extra, y)
    return y


@pytest.mark.parametrize("name", ["group_norm_apply", "group_norm_apply_silu", "group_norm_apply_film_silu"])
@pytest.mark.parametrize("c, groups", [(6, 3), (5, 1), (8, 8), (32, 8)])
def test_group_norm_is_torchs(kernel, rng, name, c, groups):
    b, h, w = 3, 6, 10
    images = (rng.standard_normal((b, c, h, w)) * 2 + 3).astype(np.float32)
    weight, bias = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    ss = rng.standard_normal((b, 2 * c)).astype(np.float32) if name.endswith("film_silu") else None
    eps = np.float32(1e-5)
    y = group_norm_rows(kernel, name, images, groups, weight, bias, eps, ss)

    def torch_reference(dtype):
        t = lambda a: torch.from_numpy(a).to(dtype)  # noqa: E731
        out = F.group_norm(t(images), groups, t(weight), t(bias), float(eps))
        if ss is not None:   # torch's FiLM: h * (1 + scale) + shift per image, then SiLU
            out = out * (1 + t(ss[:, :c])[:, :, None, None]) + t(ss[:, c:])[:, :, None, None]
        return F.silu(out) if name != "group_norm_apply" else out

    np.testing.assert_allclose(unrows(y, b, h, w), torch_reference(torch.float64).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(unrows(y, b, h, w), torch_reference(torch.float32).numpy(), rtol=1e-5, atol=1e-5)
    # image 1 alone gives the bits it gives in the batch of 3
    alone = group_norm_rows(kernel, name, images[1:2], groups, weight, bias, eps, None if ss is None else ss[1:2].copy())
    assert np.array_equal(alone, y[h * w:2 * h * w])


def test_silu_of_large_magnitudes(kernel):
    # the polynomial exp's clamp: silu stays v for large v and 0 (within 1e-36) for very negative v
    v = np.array([-200.0, -88.5, -87.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 87.0, 88.5, 200.0], np.float32)
    images = v.reshape(1, 1, 1, -1)
    # one group over one channel, weight = std and bias = mean undo the norm (up to rounding)
    mean, std = np.float32(v.mean()), np.float32(np.sqrt(v.var() + 1e-5))
    y = group_norm_rows(kernel, "group_norm_apply_silu", images, 1, np.array([std], np.float32),
                        np.array([mean], np.float32), np.float32(1e-5))[:, 0]
    pre = group_norm_rows(kernel, "group_norm_apply", images, 1, np.array([std], np.float32),
                          np.array([mean], np.float32), np.float32(1e-5))[:, 0]
    want = F.silu(torch.from_numpy(pre).double()).numpy()
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-30)


def test_broadcast_rows_add(kernel, rng):
    b, pixels, c = 3, 7, 5
    y0 = rng.standard_normal((b * pixels, c)).astype(np.float32)
    bias = rng.standard_normal((b, c)).astype(np.float32)
    y = y0.copy()
    kernel("broadcast_rows_add")(y, bias, pixels)
    assert np.array_equal(y, y0 + np.repeat(bias, pixels, axis=0))


@pytest.mark.parametrize("h, w", [(3, 5), (4, 4)])
def test_upsample_nearest2x_is_interpolate(kernel, rng, h, w):
    b, c = 3, 5
    images = rng.standard_normal((b, c, h, w)).astype(np.float32)
    y = np.full((b * 4 * h * w, c), np.nan, np.float32)
    kernel("upsample_nearest2x")(rows(images), h, w, y)
    want = F.interpolate(torch.from_numpy(images), scale_factor=2, mode="nearest").numpy()
    assert np.array_equal(unrows(y, b, 2 * h, 2 * w), want)


@pytest.mark.parametrize("h, w", [(16, 16), (8, 12), (32, 24), (12, 28), (5, 7)])
def test_map_rows_is_reshape_then_interpolate(kernel, rng, h, w):
    b, c, side = 3, 4, 16
    vectors = rng.standard_normal((b, c * side * side)).astype(np.float32)
    y = np.full((b * h * w, c), np.nan, np.float32)
    kernel("map_rows")(vectors, side, h, w, y)
    maps = torch.from_numpy(vectors).reshape(b, c, side, side)
    want = F.interpolate(maps, size=(h, w), mode="nearest").numpy()
    assert np.array_equal(unrows(y, b, h, w), want)


def test_concat_channels(kernel, rng):
    a, bb = rng.standard_normal((11, 3)).astype(np.float32), rng.standard_normal((11, 5)).astype(np.float32)
    y = np.full((11, 8), np.nan, np.float32)
    kernel("concat_channels")(a, bb, y)
    assert np.array_equal(y, np.concatenate([a, bb], 1))


def test_lora_conv_add_is_a_scaled_low_rank_conv(kernel, rng):
    b, c, h, w, o, rank = 3, 5, 6, 5, 7, 4
    images = rng.standard_normal((b, c, h, w)).astype(np.float32)
    down = rng.standard_normal((rank, c, 3, 3)).astype(np.float32)
    up = rng.standard_normal((o, rank, 1, 1)).astype(np.float32)
    scales = np.array([[0.5, 0.0], [0.0, 0.0], [-1.25, 2.0]], np.float32)   # [B, adapters]
    a = conv_rows(kernel, down)
    y0 = rng.standard_normal((b * h * w, o)).astype(np.float32)
    for adapter in range(2):
        y = y0.copy()
        kernel("lora_conv_add")(rows(images), h, w, a, np.ascontiguousarray(up[:, :, 0, 0]), scales, adapter, y)
        lora = F.conv2d(F.conv2d(torch.from_numpy(images).double(), torch.from_numpy(down).double(), padding=1),
                        torch.from_numpy(up).double()).numpy()
        want = unrows(y0, b, h, w) + scales[:, adapter].reshape(b, 1, 1, 1) * lora
        np.testing.assert_allclose(unrows(y, b, h, w), want, rtol=1e-5, atol=1e-4)
        for i in range(b):
            part = slice(i * h * w, (i + 1) * h * w)
            if scales[i, adapter] == 0:   # untouched, bit for bit
                assert np.array_equal(y[part], y0[part])
            else:
                assert not np.array_equal(y[part], y0[part])


def test_timestep_embedding_is_the_torch_formula(kernel):
    t = np.array([0.0, 0.013, 0.5, 0.97, 1.0], np.float32)
    half = 16
    e = np.full((len(t), 2 * half), np.nan, np.float32)
    kernel("timestep_embedding")(t, e)
    freqs = torch.exp(-np.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = (1000 * torch.from_numpy(t))[:, None] * freqs[None]
    want = torch.cat([torch.sin(args), torch.cos(args)], 1).numpy()
    # exp and sin/cos come from different libraries (glibc here, SLEEF in torch): an ulp of
    # the frequency moves an argument near 1000 by ~6e-5.
    np.testing.assert_allclose(e, want, rtol=0, atol=2e-4)
    assert np.array_equal(e[0], np.concatenate([np.zeros(half), np.ones(half)]).astype(np.float32))


def noise_reference(seed: int, pixels: int, c: int) -> np.ndarray:
    """gaussian_noise's formula in numpy: splitmix64 outputs 2j and 2j + 1, Box-Muller in f64."""
    def mix(n: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            z = np.uint64(seed) + (n + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            return z ^ (z >> np.uint64(31))
    j = np.arange(pixels * c, dtype=np.uint64)
    u1 = ((mix(2 * j) >> np.uint64(40)) + np.uint64(1)).astype(np.float64) * 2.0 ** -24
    u2 = (mix(2 * j + np.uint64(1)) >> np.uint64(40)).astype(np.float64) * 2.0 ** -24
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)).astype(np.float32).reshape(pixels, c)


def test_gaussian_noise_is_per_image_and_the_documented_formula(kernel):
    pixels, c = 6 * 10, 5
    seeds = np.array([7, 2 ** 64 - 3, 7], np.uint64)
    x = np.full((3 * pixels, c), np.nan, np.float32)
    kernel("gaussian_noise")(seeds, x)
    for i, s in enumerate(seeds):
        assert np.array_equal(x[i * pixels:(i + 1) * pixels], noise_reference(int(s), pixels, c))
    assert np.array_equal(x[:pixels], x[2 * pixels:])               # same seed, same noise
    assert not np.array_equal(x[:pixels], x[pixels:2 * pixels])     # another seed, other noise
    alone = np.full((pixels, c), np.nan, np.float32)
    kernel("gaussian_noise")(seeds[1:2].copy(), alone)
    assert np.array_equal(alone, x[pixels:2 * pixels])
    # statistics over 60k samples
    big = np.zeros((2 * 3000, 10), np.float32)
    kernel("gaussian_noise")(np.array([123, 456], np.uint64), big)
    assert abs(big.mean()) < 0.02 and abs(big.std() - 1) < 0.02
    assert np.abs(big).max() <= 5.8


def test_fill_repeat_rows_with_null_rows_and_cfg_euler_step(kernel, rng):
    v = np.zeros(7, np.float32)
    kernel("fill")(v, np.float32(0.35))
    assert np.array_equal(v, np.full(7, 0.35, np.float32))

    x = rng.standard_normal((9, 5)).astype(np.float32)
    y = np.full((18, 5), np.nan, np.float32)
    kernel("repeat_rows")(x, y)
    assert np.array_equal(y, np.concatenate([x, x]))

    text = rng.standard_normal((3, 4)).astype(np.float32)
    t2 = np.full((6, 4), np.nan, np.float32)
    kernel("with_null_rows")(text, t2)
    assert np.array_equal(t2, np.concatenate([text, np.zeros_like(text)]))

    vel = rng.standard_normal((18, 5)).astype(np.float32)
    guidance, steps = np.float32(4.5), 20
    dt = np.float32(1.0 / steps)
    got = x.copy()
    kernel("cfg_euler_step")(vel, guidance, dt, got)
    vc, vu = vel[:9], vel[9:]
    assert np.array_equal(got, x - (vu + guidance * (vc - vu)) * dt)
    xt, vct, vut = (torch.from_numpy(a) for a in (x, vc, vu))
    torch_step = (xt - (vut + float(guidance) * (vct - vut)) / steps).numpy()
    np.testing.assert_allclose(got, torch_step, rtol=0, atol=1e-6)


def test_to_pixels_clamps_and_rounds_half_up(kernel):
    b, h, w, c = 2, 3, 2, 3
    x = np.linspace(-1.3, 1.3, b * h * w * c).astype(np.float32).reshape(b * h * w, c)
    # 0 is the one exact half in range ((v + 1) * 127.5 = 127.5 rounds up to 128); the next two sit
    # just below 0.5 and 1.5 (0.49999997, 1.4999999): the first's + 0.5 rounds to 1.0 in f32 (a
    # tie, to even), so it gives 1; the second stays below 2 and gives 1
    x[0, :3] = [-1.0, 1.0, 0.0]
    x[1, :3] = [np.float32(1 / 127.5) * 0.5 - 1, np.float32(-1 + 3 / 255), 5.0]
    image = np.zeros((b, h, w, c), np.uint8)
    kernel("to_pixels")(x, image)
    v = np.clip(x, -1, 1)
    want = np.clip(np.floor((v + np.float32(1)) * np.float32(127.5) + np.float32(0.5)), 0, 255).astype(np.uint8)
    assert np.array_equal(image.reshape(-1, c), want)
    assert list(image[0, 0, 0]) == [0, 255, 128]
    assert list(image[0, 0, 1]) == [1, 1, 255]
