"""std:audio.loom against numpy and HF transformers' audio utilities, at odd shapes."""

from __future__ import annotations

import numpy as np
import pytest


def test_hann_dft_basis_is_the_windowed_real_dft(kernel):
    n, bins = 12, 7
    basis = np.zeros((2 * bins, n), np.float32)
    kernel("hann_dft_basis")(basis)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)
    f, k = np.arange(bins)[:, None], np.arange(n)[None, :]
    np.testing.assert_allclose(basis[:bins], window * np.cos(2 * np.pi * f * k / n), atol=1e-6)
    np.testing.assert_allclose(basis[bins:], -window * np.sin(2 * np.pi * f * k / n), atol=1e-6)


def test_slaney_mel_filters_match_transformers(kernel):
    from transformers.audio_utils import mel_filter_bank

    fb = np.zeros((80, 201), np.float32)
    kernel("slaney_mel_filters")(16000.0, fb)
    want = mel_filter_bank(num_frequency_bins=201, num_mel_filters=80, min_frequency=0.0, max_frequency=8000.0,
                           sampling_rate=16000, norm="slaney", mel_scale="slaney").T
    np.testing.assert_allclose(fb, want, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("batch, samples, hop, n", [(1, 37, 3, 8), (2, 60, 5, 12)])
def test_frames_and_power_are_torch_stfts(kernel, rng, batch, samples, hop, n):
    audio = rng.standard_normal((batch, samples)).astype(np.float32)
    frames_per = samples // hop
    framed = np.zeros((batch * frames_per, n), np.float32)
    kernel("stft_frames")(audio, hop, framed)
    padded = np.pad(audio, ((0, 0), (n // 2, n // 2)), mode="reflect")
    for b in range(batch):
        for t in range(frames_per):
            np.testing.assert_array_equal(framed[b * frames_per + t], padded[b, t * hop:t * hop + n])
    bins = n // 2 + 1
    spec = np.concatenate([framed @ np.cos(2 * np.pi * np.outer(np.arange(n), np.arange(bins)) / n),
                           framed @ -np.sin(2 * np.pi * np.outer(np.arange(n), np.arange(bins)) / n)],
                          axis=1).astype(np.float32)
    power = np.zeros((batch * frames_per, bins), np.float32)
    kernel("power_spectrum")(spec, power)
    np.testing.assert_allclose(power, np.abs(np.fft.rfft(framed, axis=1)) ** 2, rtol=1e-4, atol=1e-4)


def test_log_mel_normalization_per_window(kernel, rng):
    frames, mels = 7, 5
    mel = (rng.random((3 * frames, mels)) ** 8).astype(np.float32)
    mel[4, 2] = 0.0                                           # below the 1e-10 floor
    peak = np.zeros(3, np.float32)
    kernel("window_log_peak")(mel, frames, peak)
    x = np.zeros_like(mel)
    kernel("log_mel_normalize")(mel, peak, frames, x)
    log = np.log10(np.maximum(mel.astype(np.float64), 1e-10)).reshape(3, frames, mels)
    want = (np.maximum(log, log.max(axis=(1, 2), keepdims=True) - 8.0) + 4.0) / 4.0
    np.testing.assert_allclose(peak, log.max(axis=(1, 2)), rtol=1e-6)
    np.testing.assert_allclose(x, want.reshape(-1, mels), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stride", [1, 2])
def test_conv3_columns_times_the_weight_is_a_conv1d(kernel, rng, stride):
    batch, frames, cin, cout = 2, 9, 5, 7
    x = rng.standard_normal((batch * frames, cin)).astype(np.float32)
    w = rng.standard_normal((cout, cin, 3)).astype(np.float32)
    out_frames = frames // stride
    cols = np.zeros((batch * out_frames, cin * 3), np.float32)
    kernel("conv3_columns")(x, frames, stride, cols)
    got = cols @ w.reshape(cout, cin * 3).T
    for b in range(batch):
        xb = np.pad(x[b * frames:(b + 1) * frames], ((1, 1), (0, 0)))
        want = np.stack([np.einsum("ock,kc->o", w, xb[t * stride:t * stride + 3]) for t in range(out_frames)])
        np.testing.assert_allclose(got[b * out_frames:(b + 1) * out_frames], want, rtol=1e-5, atol=1e-5)


def test_window_positions_repeat_per_window(kernel, rng):
    x = rng.standard_normal((6, 4)).astype(np.float32)
    table = rng.standard_normal((3, 4)).astype(np.float32)
    want = x + np.tile(table, (2, 1))
    kernel("add_window_positions")(x, table, 3)
    np.testing.assert_array_equal(x, want)
