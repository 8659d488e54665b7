"""loomrt.media.audio: container sniffing, the exact frame count of rate conversion, filter
history across blocks, bandlimiting, channel mixing and the frame limit at its boundary.

The conversion is checked against soxr's one-shot `soxr.resample` (the same library, no
blocks) and against what a bandlimited filter must do: keep a tone below the new Nyquist
frequency and remove one above it (linear interpolation would fold it back as an alias)."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import soundfile
import soxr

from loomrt.errors import InvalidRequest
from loomrt.media.audio import BLOCK_FRAMES, Geometry, decode_recording, sniff

MONO16K = Geometry(rate=16000, channels=1, max_frames=10 * 60 * 16000)


def pcm(samples: np.ndarray) -> bytes:
    return np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2").tobytes()


def wav(samples: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=fmt, subtype="PCM_16")
    return out.getvalue()


def tone(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def raw(samples: np.ndarray, rate: int, geometry: Geometry = MONO16K) -> np.ndarray:
    return decode_recording(pcm(samples), "audio/pcm", {"rate": str(rate), "channels": "1"}, geometry)


def test_sniff_by_bytes():
    x = tone(440, 16000, 0.1)
    assert sniff(wav(x, 16000)) == "wav" and sniff(wav(x, 16000, "FLAC")) == "flac"
    out = io.BytesIO()
    soundfile.write(out, x, 16000, format="MP3")
    assert sniff(out.getvalue()) == "mp3"
    assert sniff(b"\x1a\x45\xdf\xa3rest") == "webm" and sniff(b"\0\0\0\x18ftypmp42") == "mp4"
    assert sniff(b"OggS\0") == "ogg" and sniff(b"hello") == "unknown" and sniff(b"") == "unknown"


def test_equal_rates_keep_every_sample():
    x = np.random.default_rng(1).uniform(-1, 1, 40001).astype(np.float32)
    got = raw(x, 16000)
    want = np.frombuffer(pcm(x), "<i2").astype(np.float32) / 32768.0
    assert np.array_equal(got, want)


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 24000, 44100, 48000, 96000])
@pytest.mark.parametrize("frames", [1, 7, 4410, BLOCK_FRAMES + 3, 3 * BLOCK_FRAMES + 1])
def test_raw_conversion_gives_exactly_ceil_frames(rate, frames):
    x = np.random.default_rng(frames).uniform(-0.5, 0.5, frames).astype(np.float32)
    assert len(raw(x, rate)) == math.ceil(frames * 16000 / rate)


@pytest.mark.parametrize("rate", [24000, 44100, 8000])
def test_blocks_carry_filter_history(rate):
    """Converted in BLOCK_FRAMES pieces, the result equals one uninterrupted conversion: no
    click or gap at block edges (the stream keeps its history; lookahead is flushed once)."""
    x = tone(300, rate, 4 * BLOCK_FRAMES / rate) + tone(2100, rate, 4 * BLOCK_FRAMES / rate, 0.2)
    got = raw(x, rate)
    quantized = np.frombuffer(pcm(x), "<i2").astype(np.float32) / 32768.0
    whole = soxr.resample(quantized, rate, 16000, quality="HQ")
    n = min(len(got), len(whole))
    assert abs(len(got) - len(whole)) <= 1
    assert np.max(np.abs(got[:n] - whole[:n])) < 1e-4


def test_conversion_is_bandlimited():
    inside = raw(tone(5000, 48000, 1.0), 48000)      # below 8 kHz: kept
    outside = raw(tone(11000, 48000, 1.0), 48000)    # above 8 kHz: removed, not aliased to 5 kHz
    middle = slice(2000, 14000)
    assert 0.3 < np.sqrt(np.mean(inside[middle] ** 2)) / (0.5 / np.sqrt(2)) < 1.1
    assert np.sqrt(np.mean(outside[middle] ** 2)) < 1e-3


def test_containers_are_mixed_to_mono_and_converted():
    left, right = tone(440, 44100, 0.5), tone(660, 44100, 0.5, 0.25)
    stereo = np.stack([left, right], axis=1)
    got = decode_recording(wav(stereo, 44100), None, {}, MONO16K)
    quantized = np.frombuffer(wav(stereo, 44100)[44:], "<i2").reshape(-1, 2).astype(np.float32) / 32768.0
    want = soxr.resample(quantized.mean(axis=1), 44100, 16000, quality="HQ")
    assert len(got) == math.ceil(len(left) * 16000 / 44100)
    n = min(len(got), len(want))
    assert np.max(np.abs(got[:n] - want[:n])) < 1e-4


def test_raw_pcm_is_never_mixed():
    with pytest.raises(InvalidRequest, match="never mixed"):
        decode_recording(bytes(400), "audio/pcm", {"rate": "16000", "channels": "2"}, MONO16K)


@pytest.mark.parametrize("rate", [16000, 8000, 48000])
def test_the_frame_limit_at_its_boundary(rate):
    limit = Geometry(16000, 1, max_frames=48000)          # 3 s
    at = int(limit.max_frames * rate / 16000)            # converts to exactly max_frames
    assert len(raw(np.zeros(at, np.float32), rate, limit)) == limit.max_frames
    over = at + 1 if rate <= 16000 else at + rate // 16000
    with pytest.raises(InvalidRequest, match="longer than"):
        raw(np.zeros(over, np.float32), rate, limit)
    assert len(decode_recording(wav(np.zeros(at, np.float32), rate), None, {}, limit)) == limit.max_frames
    with pytest.raises(InvalidRequest, match="longer than"):
        decode_recording(wav(np.zeros(over, np.float32), rate), None, {}, limit)


def test_rates_too_far_from_the_models_reject():
    with pytest.raises(InvalidRequest, match="too far"):
        raw(np.zeros(100, np.float32), 300)
    with pytest.raises(InvalidRequest, match="too far"):
        decode_recording(wav(np.zeros(100, np.float32), 300), None, {}, MONO16K)
