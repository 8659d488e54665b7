"""std:vocoder.loom: the hibari vocoder against hibari's own `hibari.dsp.synth`, on real head outputs.

The head values (lh, theta, ln, lr, phi, f0) come from running the installed hibari-tts
ONNX model on a real sentence (onnxruntime); the vocoder itself is only .loom. With the
noise branch switched off on both sides (ln = -1e4, so ex(ln) == 0 exactly), Loom's audio
must match dsp.synth closely; with it on, the noise cannot match numpy's PCG64 stream
(std:vocoder.loom uses a counter-based Gaussian so that a row's noise never depends on
the packing), so it is checked statistically."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loomc.check import load_files
from loomc.lower.prepare import prepare_plan
from loomc.run.compile import compile_command
from loomrt.prepare import prepare_params

FIXTURE = Path(__file__).parent / "fixtures" / "vocoder.loom"
BINS, HOP = 601, 300
OFF = -1.0e4                                   # ex(-1e4) = exp(-1e4) == 0.0 in f32: a branch switched off


@pytest.fixture(scope="module")
def vocoder():
    checked = load_files([FIXTURE])
    assert checked.ok, checked.diagnostics
    program = compile_command(checked, "synthesize")
    params = prepare_params(prepare_plan(checked), None)

    def run(parts: np.ndarray, f0: np.ndarray, frame_rows, seeds) -> np.ndarray:
        return program.run(params, {}, {"parts": np.ascontiguousarray(parts, np.float32),
                                        "f0": np.ascontiguousarray(f0, np.float32),
                                        "frame_rows": np.asarray(frame_rows, np.int32),
                                        "seed": np.asarray(seeds, np.uint64)})["audio"]

    return run


@pytest.fixture(scope="module")
def heads():
    """hibari's head outputs for a real sentence: {lh, theta, ln, lr, phi: [601, F], f0: [F]}."""
    import hibari           # the sample weights' package (make install)
    import onnxruntime      # noqa: F401 - hibari's own pipeline runs on it (test extra)

    tts = hibari.Hibari()
    ids = tts.ids(tts.phonemize("Hello there, this is hibari.")[0])
    out = tts.sess.run(None, {"ids": np.asarray([ids], np.int64), "speed": np.asarray([1.0], np.float32)})
    names = ("lh", "theta", "ln", "lr", "phi", "f0")
    return {name: np.ascontiguousarray(o[0]) for name, o in zip(names, out)}


def pack(h: dict, a: int, b: int, **override) -> tuple[np.ndarray, np.ndarray]:
    """Frames a..b of the heads as (parts f32[F, 3005], f0 f32[F]); override replaces whole parts by a value."""
    cols = [np.full_like(h[k][:, a:b], override[k]) if k in override else h[k][:, a:b]
            for k in ("lh", "theta", "ln", "lr", "phi")]
    return np.concatenate(cols, 0).T.copy(), h["f0"][a:b].copy()


def dsp_synth(h: dict, a: int, b: int, rng, **override) -> np.ndarray:
    from hibari import dsp

    parts, f0 = pack(h, a, b, **override)
    lh, th, ln, lr, phi = (parts[:, i * BINS:(i + 1) * BINS].T.copy() for i in range(5))
    return dsp.synth(lh, th, ln, lr, phi, f0, rng)


# Rows of the sentence (184 frames): the whole of it, and short voiced pieces whose reflect
# padding (600 samples) is longer than the row itself (1 and 2 frames) or barely fits.
SPANS = [(0, 184), (60, 61), (60, 62), (60, 63), (100, 105), (150, 184)]


def test_noise_free_audio_matches_dsp_synth(vocoder, heads):
    """All spans packed in one call, each compared with dsp.synth of that span alone.

    Measured (numpy FFT backend, this host): max |error| 1.0e-7 over the 184-frame sentence,
    whose peak is 0.30 and RMS 0.044 (5e-8 on the short spans). The bound: Loom's DFTs are
    two float32 stages of fma chains (40 and 30 terms, std:vocoder.loom's factored DFT)
    against float32 bases, dsp's are float64 FFTs of float32 inputs, and the harmonic gains
    reach exp(lh) ~ 440; each output sample carries a few 2^-24 relative errors on terms of
    order 0.3 twice over (forward and inverse), and the pulse train's sin and vocoder_shape's
    exp, tanh, sin and cos are Cephes polynomials a few ulp from numpy's SIMD float32 ones.
    1e-6 leaves a 10x margin while still catching any real mistake (a wrong window, bin,
    hop, edge or mirrored bin shows as errors of 1e-3 or more)."""
    parts, f0s, rows = [], [], []
    for r, (a, b) in enumerate(SPANS):
        p, f = pack(heads, a, b, ln=OFF)
        parts.append(p)
        f0s.append(f)
        rows += [r] * (b - a)
    audio = vocoder(np.concatenate(parts), np.concatenate(f0s), rows, np.arange(len(SPANS)))
    start = 0
    for a, b in SPANS:
        got = audio[start:start + b - a].reshape(-1)
        start += b - a
        want = dsp_synth(heads, a, b, np.random.default_rng(0), ln=OFF)
        err = np.abs(got - want).max()
        assert err < 1e-6, f"frames {a}..{b}: max |error| {err:.3g} (peak {np.abs(want).max():.3g})"
    whole = audio[:184].reshape(-1)
    assert np.abs(whole).max() > 0.1              # really audio, not silence


def test_packed_rows_are_bit_identical_to_each_alone(vocoder, heads):
    """Noise on: a row gives the same bits alone, first, last or between other rows."""
    a_parts, a_f0 = pack(heads, 0, 184)
    b_parts, b_f0 = pack(heads, 30, 97)
    c_parts, c_f0 = pack(heads, 60, 61)
    alone_a = vocoder(a_parts, a_f0, np.zeros(184, np.int32), [7])
    alone_b = vocoder(b_parts, b_f0, np.zeros(67, np.int32), [9])
    alone_c = vocoder(c_parts, c_f0, np.zeros(1, np.int32), [4])
    packed = vocoder(np.concatenate([b_parts, a_parts, c_parts]), np.concatenate([b_f0, a_f0, c_f0]),
                     [0] * 67 + [1] * 184 + [2], [9, 7, 4])
    np.testing.assert_array_equal(packed[:67], alone_b)
    np.testing.assert_array_equal(packed[67:251], alone_a)
    np.testing.assert_array_equal(packed[251:], alone_c)
    again = vocoder(np.concatenate([c_parts, a_parts]), np.concatenate([c_f0, a_f0]), [0] + [1] * 184, [4, 7])
    np.testing.assert_array_equal(again[1:], alone_a)
    other_seed = vocoder(a_parts, a_f0, np.zeros(184, np.int32), [8])
    assert not np.array_equal(other_seed, alone_a)


def noise(kernel, frame_rows, seeds) -> np.ndarray:
    """vocoder_noise as complex [F, 601]."""
    frame_rows = np.asarray(frame_rows, np.int32)
    seeds = np.asarray(seeds, np.uint64)
    first, count = np.zeros(len(seeds), np.int32), np.zeros(len(seeds), np.int32)
    kernel("vocoder_row_spans")(frame_rows, first, count)
    z = np.full((len(frame_rows), 2 * BINS), np.nan, np.float32)
    kernel("vocoder_noise")(frame_rows, first, seeds, z)
    return z[:, :BINS] + 1j * z[:, BINS:]


def test_noise_is_standard_complex_gaussian(kernel):
    z = noise(kernel, np.zeros(400, np.int32), [12345])              # 240 400 complex draws
    n = z.size
    for part in (z.real, z.imag):
        assert abs(part.mean()) < 5 / np.sqrt(n)
        assert abs(part.var() - 1.0) < 5 * np.sqrt(2 / n)
        assert abs(np.mean(np.abs(part) < 1.0) - 0.6827) < 0.005      # N(0, 1)'s mass within 1 sigma
        assert abs(np.mean(part ** 4) / part.var() ** 2 - 3.0) < 0.1  # kurtosis
    assert abs(np.mean(z.real * z.imag)) < 5 / np.sqrt(n)              # re and im uncorrelated
    per_bin = z.var(axis=0)                                           # E|z|^2 = 2 in every bin
    assert abs(per_bin.mean() - 2.0) < 0.02 and per_bin.min() > 1.5 and per_bin.max() < 2.5
    lag = np.mean(z[1:] * np.conj(z[:-1])), np.mean(z[:, 1:] * np.conj(z[:, :-1]))
    assert max(abs(v) for v in lag) < 5 * np.sqrt(2 / n)              # no correlation across frames or bins


def test_noise_depends_on_the_seed_and_own_position_only(kernel):
    alone = noise(kernel, np.zeros(50, np.int32), [3])
    np.testing.assert_array_equal(noise(kernel, np.zeros(50, np.int32), [3]), alone)
    packed = noise(kernel, [0] * 17 + [1] * 50 + [2] * 5, [99, 3, 4])
    np.testing.assert_array_equal(packed[17:67], alone)
    np.testing.assert_array_equal(packed[:17], noise(kernel, np.zeros(17, np.int32), [99]))
    for other in (noise(kernel, np.zeros(50, np.int32), [4]), noise(kernel, np.zeros(50, np.int32), [2])):
        assert np.mean(other == alone) < 1e-3                        # different seeds: different draws
        assert abs(np.mean(other * np.conj(alone))) < 0.05            # and uncorrelated ones
    assert np.mean(alone[1:] == alone[:-1]) < 1e-3                   # frames do not repeat


def noise_energy(vocoder, heads, ln) -> tuple[np.ndarray, np.ndarray]:
    """Mean energy per frame over 6 seeds, (Loom, dsp.synth with its own PCG64 noise), with
    the harmonic and free branches off (lh = lr = -1e4) and the noise gain `ln`."""
    seeds = range(6)
    override = {"lh": OFF, "lr": OFF} if ln is None else {"lh": OFF, "lr": OFF, "ln": ln}
    parts, f0 = pack(heads, 0, 184, **override)
    ours = np.stack([vocoder(parts, f0, np.zeros(184, np.int32), [s]) for s in seeds])
    theirs = np.stack([dsp_synth(heads, 0, 184, np.random.default_rng(s), **override).reshape(184, HOP)
                       for s in seeds])
    return tuple((x.astype(np.float64) ** 2).mean(axis=(0, 2)) for x in (ours, theirs))


def test_noise_branch_energy_matches_dsp_synth(vocoder, heads):
    """White noise (ln = 0): Loom's energy per frame matches dsp.synth's in expectation.
    Measured: total ratio 1.001, per frame 0.87..1.14 (median 1.004)."""
    ours, theirs = noise_energy(vocoder, heads, 0.0)
    ratio = ours / theirs
    assert abs(ours.sum() / theirs.sum() - 1.0) < 0.03
    assert 0.95 < np.median(ratio) < 1.05 and ratio.min() > 0.7 and ratio.max() < 1.4


def test_shaped_noise_energy_matches_dsp_synth(vocoder, heads):
    """The real ln (noise in a few bins of a few frames, so each frame's energy varies a lot
    from draw to draw): only the typical frame is compared. Measured median ratio 1.013."""
    ours, theirs = noise_energy(vocoder, heads, None)
    assert 0.8 < np.median(ours / theirs) < 1.25
