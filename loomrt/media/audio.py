"""Recorded audio in, the model's input geometry out: container sniffing, decoding, mixing, resampling.

    decode_recording(data, media_type, params, geometry) -> float32 samples at geometry.rate, mono

(`media_type` and `params` are the file part's Content-Type, parsed by the caller: HTTP
header syntax is loomd's.)

The container's bytes select the decoder, never its filename or MIME label: WAV, FLAC and
MP3 go through `soundfile` (libsndfile) when the installed build reports the format;
WebM, Matroska, MP4/AAC and anything unrecognised reject with a message telling the client
what to send instead. Raw PCM16LE has no header, so it is the one case the part's label
decides: `audio/pcm;rate=R;channels=C`, with both parameters given exactly once, a positive
rate, the model's channel count and whole frames. Containers are mixed down to the model's
channel count (the mean of the channels); raw PCM is never mixed.

Rates are converted by soxr's streaming resampler (`soxr.ResampleStream`, "HQ": a
bandlimited filter, not interpolation), fed block by block so its filter history carries
across blocks and the lookahead is flushed only at the recording's end; N input frames give
exactly ceil(N * rate / input_rate) frames. Equal rates copy every sample. Frame limits are
checked before anything is converted for raw PCM (from the byte count) and as frames are
decoded for containers, so an overlong recording is refused without a partial result.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

from loomrt.errors import InvalidRequest

BLOCK_FRAMES = 65536          # frames staged per conversion step, input or output, whichever is more
MAX_RATE_RATIO = 48           # rates further than this from the model's reject (the staging budget, at full quality)
PCM = "audio/pcm"


@dataclass(frozen=True)
class Geometry:
    """What a recognition source takes: its sample rate, channel count and frame limit."""

    rate: int
    channels: int
    max_frames: int


def sniff(data: bytes) -> str:
    """The container of `data` by its first bytes: wav, flac, mp3, ogg, webm, mp4 or unknown."""
    head = data[:16]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE" or head[:4] in (b"RF64", b"BW64"):
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:3] == b"ID3" or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    if head[4:8] == b"ftyp":
        return "mp4"
    return "unknown"


def container_formats() -> list[str]:
    """The containers this build decodes (what libsndfile reports), for discovery."""
    try:
        import soundfile
    except (ImportError, OSError):
        return []
    available = soundfile.available_formats()
    return [name.lower() for name in ("WAV", "FLAC", "MP3") if name in available]


def decode_recording(data: bytes, media_type: str | None, params: dict[str, str], geometry: Geometry) -> np.ndarray:
    """The recording as float32 samples at the model's rate and channel layout (mono: 1-D)."""
    if not data:
        raise InvalidRequest("file: the recording is empty", param="file")
    if (media_type or "").lower() == PCM:
        return _raw_pcm(data, params, geometry)
    container = sniff(data)
    if container in ("webm", "mp4", "ogg"):
        raise InvalidRequest(f"file: {container} uploads are not accepted; convert the recording to WAV, FLAC, MP3 or "
                             "raw PCM16LE (audio/pcm;rate=R;channels=C) first", param="file")
    if container == "unknown":
        raise InvalidRequest("file: unsupported audio container (the bytes are not WAV, FLAC or MP3); send one of "
                             "those, or raw PCM16LE labelled audio/pcm;rate=R;channels=C", param="file")
    if container not in container_formats():
        raise InvalidRequest(f"file: {container} decoding is not available in this build; send WAV or raw PCM16LE",
                             param="file")
    return _container(data, container, geometry)


def _raw_pcm(data: bytes, params: dict[str, str], geometry: Geometry) -> np.ndarray:
    for name in ("rate", "channels"):
        if name not in params:
            raise InvalidRequest(f"file: audio/pcm needs its {name} (audio/pcm;rate=R;channels=C)", param="file")
    rate, channels = _positive(params["rate"], "rate"), _positive(params["channels"], "channels")
    if channels != geometry.channels:
        raise InvalidRequest(f"file: the recording has {channels} channels; this model takes {geometry.channels} "
                             "(raw PCM is never mixed: send it with the model's channel count)", param="file")
    frame_bytes = 2 * channels
    if len(data) % frame_bytes:
        raise InvalidRequest(f"file: {len(data)} bytes are not whole PCM16 frames of {channels} channel(s) "
                             f"({frame_bytes} bytes each)", param="file")
    frames = len(data) // frame_bytes
    converted = math.ceil(frames * geometry.rate / rate)
    _check_limit(converted, geometry)
    out = _Resampler(rate, geometry.rate, channels)
    pcm = np.frombuffer(data, "<i2").reshape(frames, channels)
    step = out.block_frames
    parts = [out.push(pcm[i:i + step].astype(np.float32) / 32768.0, last=i + step >= frames)
             for i in range(0, frames, step)]
    return _exactly(np.concatenate(parts), converted, channels)


def _container(data: bytes, container: str, geometry: Geometry) -> np.ndarray:
    import soundfile

    try:
        with soundfile.SoundFile(io.BytesIO(data)) as f:
            rate = f.samplerate
            resampler = _Resampler(rate, geometry.rate, geometry.channels)
            parts, read = [], 0
            for block in f.blocks(blocksize=resampler.block_frames, dtype="float32", always_2d=True):
                read += len(block)
                _check_limit(math.ceil(read * geometry.rate / rate), geometry)
                parts.append(resampler.push(_mix(block, geometry.channels), last=False))
            parts.append(resampler.push(np.zeros((0, geometry.channels), np.float32), last=True))
    except InvalidRequest:
        raise
    except Exception as exc:  # libsndfile's errors: a truncated or corrupt file
        raise InvalidRequest(f"file: the {container} recording cannot be decoded: {exc}", param="file") from None
    if read == 0:
        raise InvalidRequest(f"file: the {container} recording holds no audio frames", param="file")
    return _exactly(np.concatenate(parts), math.ceil(read * geometry.rate / rate), geometry.channels)


def _mix(block: np.ndarray, channels: int) -> np.ndarray:
    """A container's channels down (or up) to the model's: the mean, for a mono model."""
    if block.shape[1] == channels:
        return block
    if channels == 1:
        return block.mean(axis=1, keepdims=True, dtype=np.float32)
    return np.repeat(block.mean(axis=1, keepdims=True, dtype=np.float32), channels, axis=1)


class _Resampler:
    """soxr's streaming resampler, or a copy when the rates are equal.

    `block_frames` input frames per push keep each step's output within BLOCK_FRAMES too, so
    a request stages a bounded number of frames whatever its rate; a ratio beyond
    MAX_RATE_RATIO rejects rather than lowering the filter's quality to fit."""

    def __init__(self, rate_in: int, rate_out: int, channels: int):
        ratio = max(rate_in / rate_out, rate_out / rate_in)
        if ratio > MAX_RATE_RATIO:
            raise InvalidRequest(f"file: a {rate_in} Hz recording is too far from this model's {rate_out} Hz to "
                                 f"convert (at most {MAX_RATE_RATIO}x either way)", param="file")
        self.block_frames = max(1, min(BLOCK_FRAMES, BLOCK_FRAMES * rate_in // rate_out))
        self.channels = channels
        self.stream = None
        if rate_in != rate_out:
            import soxr

            self.stream = soxr.ResampleStream(rate_in, rate_out, channels, dtype="float32", quality="HQ")

    def push(self, block: np.ndarray, last: bool) -> np.ndarray:
        block = np.ascontiguousarray(block, np.float32).reshape(-1, self.channels)
        if self.stream is None:
            return block
        return self.stream.resample_chunk(block, last=last).reshape(-1, self.channels)


def _exactly(samples: np.ndarray, frames: int, channels: int) -> np.ndarray:
    """Exactly `frames` frames (the resampler's flush may differ by one), mono as 1-D."""
    samples = samples.reshape(-1, channels)
    if len(samples) > frames:
        samples = samples[:frames]
    elif len(samples) < frames:
        samples = np.concatenate([samples, np.zeros((frames - len(samples), channels), np.float32)])
    return samples[:, 0].copy() if channels == 1 else samples


def _check_limit(frames: int, geometry: Geometry) -> None:
    if frames > geometry.max_frames:
        raise InvalidRequest(f"file: the recording is longer than this model accepts ({geometry.max_frames} frames "
                             f"at {geometry.rate} Hz, {geometry.max_frames / geometry.rate:.0f} s)", param="file")


def _positive(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0 or str(value) != text.strip():
        raise InvalidRequest(f"file: audio/pcm {name} must be a positive integer, got {text!r}", param="file")
    return value


__all__ = ["Geometry", "container_formats", "decode_recording", "sniff"]
