"""`POST /v1/audio/speech` over a real `loomd` serving the speaker sample (hibari's af_heart voice
from `hibari-tts`, in .loom), the recognizer (Whisper tiny.en, for the round trip) and `mini`
(a deployment of another kind).

The stream is PCM16LE mono at the model's rate; the same request gives the same bytes (the
noise is a counter-based function of the seed), alone or beside others; the journal shows a
request's first audio written before its last sentence was synthesized; every rejection of
the spec's section is answered with an OpenAI-style error over a real socket while the
daemon keeps serving; the spec's example body runs through curl (the `openai` client's
speech is in test_official_clients.py); and ten sentences spoken by Loom and transcribed by Loom's
recognizer come back with a word error rate of at most 10 %.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conformance_support import wait_ready, write_document
from loomd_process import REPO, Daemon

SPEAKER = REPO / "samples" / "speaker" / "model.json"
RECOGNIZER = REPO / "samples" / "recognizer" / "model.json"
ENDPOINT = "/v1/audio/speech"
RATE = 24000
HOP = 300                      # samples per output frame (12.5 ms)
CONTENT_TYPE = "audio/pcm;rate=24000;channels=1"
SPEC_BODY = {"model": "speaker", "input": "Good day.", "voice": "alba", "response_format": "pcm"}
FIVE = ("The sun rose over the quiet harbor. Fishermen loaded their boats with nets. A gull cried "
        "above the water. Children ran along the old stone pier. By noon the market was full of voices.")
SIXTH = "The evening was calm again."
#: Ten sentences for the round trip: numbers, punctuation, a word no lexicon has.
ROUND_TRIP = [
    "The weather is lovely today.",
    "Please call me back at seven thirty.",
    "She bought 3 apples and 12 oranges.",
    "Where did you put the keys?",
    "We finally arrived, tired but happy!",
    "The meeting starts at 9 in the morning.",
    "My brother lives in a small house near the river.",
    "Can you read this book to the children tonight?",
    "He drank a cup of hot coffee.",
    "The blorft was sitting on the table.",
]


def speak(server: Daemon, body, timeout: float = 180):
    return server.request("POST", ENDPOINT, body, {"Content-Type": "application/json"}, timeout=timeout)


def audio_of(response) -> np.ndarray:
    assert response.status == 200, response.body
    assert response.headers["content-type"] == CONTENT_TYPE, response.headers
    assert len(response.body) % 2 == 0 and len(response.body) > 0
    return np.frombuffer(response.body, "<i2")


def assert_error(response, status: int, *words: str, param: str | None = None) -> dict:
    assert response.status == status, (response.status, response.body)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    error = response.json()["error"]
    assert {"message", "type", "code"} <= set(error) and error["message"], error
    assert all(w.lower() in error["message"].lower() for w in words), (words, error)
    if param is not None:
        assert error["param"] == param, error
    return error


def journal(server: Daemon, after: int = 0) -> list[dict]:
    entries = []
    while True:
        r = server.request("GET", f"/logz?cursor={after}&limit=1000")
        assert r.status == 200, r.body
        page = [json.loads(line) for line in r.body.decode().splitlines()]
        if not page:
            return entries
        entries += page
        after = page[-1]["id"]


def newest_id(server: Daemon) -> int:
    entries = journal(server)
    return entries[-1]["id"] if entries else 0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("speaker")
    daemon = Daemon.start(tmp, [SPEAKER, RECOGNIZER, write_document(tmp, "mini")])
    try:
        assert wait_ready(daemon, ["speaker", "recognizer", "mini"], timeout=600), \
            daemon.request("GET", "/v1/status").body.decode()
        yield daemon
    finally:
        code = daemon.stop()
        assert code == 0, "".join(daemon.output)


# ---- audio ----------------------------------------------------------------------------------------

def test_the_spec_example_streams_pcm16_at_24k(server):
    audio = audio_of(speak(server, SPEC_BODY))
    assert len(audio) % HOP == 0 and 0.3 * RATE < len(audio) < 3 * RATE, len(audio)
    rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
    assert 100 < rms < 20000, rms                 # speech, neither silence nor clipping noise
    # the same request gives the same bytes; the seed moves only the noise, never the length
    assert np.array_equal(audio_of(speak(server, SPEC_BODY)), audio)
    other = audio_of(speak(server, {**SPEC_BODY, "seed": 7}))
    assert len(other) == len(audio) and not np.array_equal(other, audio)


def test_seed_as_decimal_string_equals_the_integer(server):
    big = 2 ** 64 - 1
    a = audio_of(speak(server, {**SPEC_BODY, "seed": big}))
    assert np.array_equal(a, audio_of(speak(server, {**SPEC_BODY, "seed": str(big)})))
    assert np.array_equal(audio_of(speak(server, SPEC_BODY)), audio_of(speak(server, {**SPEC_BODY, "seed": 0})))


def test_voice_aliases_and_object_form_are_the_same_voice(server):
    alba = audio_of(speak(server, SPEC_BODY))
    for voice in ("alloy", "heart", "AF_Heart", {"id": "alba"}, {"id": "nova"}):
        assert np.array_equal(audio_of(speak(server, {**SPEC_BODY, "voice": voice})), alba), voice


def test_speed_changes_the_length(server):
    base = len(audio_of(speak(server, {**SPEC_BODY, "input": FIVE})))
    fast = len(audio_of(speak(server, {**SPEC_BODY, "input": FIVE, "speed": 2.0})))
    slow = len(audio_of(speak(server, {**SPEC_BODY, "input": FIVE, "speed": 0.5})))
    assert 0.35 * base < fast < 0.65 * base and 1.6 * base < slow < 2.4 * base, (base, fast, slow)
    for speed in (0.25, 4, 1):
        audio_of(speak(server, {**SPEC_BODY, "speed": speed}))


def test_stream_format_audio_and_empty_instructions_are_accepted(server):
    a = audio_of(speak(server, SPEC_BODY))
    assert np.array_equal(audio_of(speak(server, {**SPEC_BODY, "stream_format": "audio", "instructions": ""})), a)


# ---- streaming, batching, disconnects --------------------------------------------------------------

def test_first_audio_is_written_before_the_last_sentence_is_synthesized(server):
    """Six sentences: with an output credit of 4 untaken blocks (loomrt.services.speech), the
    service cannot synthesize the sixth before the client's first block was written and the
    second taken, so the order in the journal holds on any machine, however loaded."""
    start = newest_id(server)
    audio_of(speak(server, {**SPEC_BODY, "input": FIVE + " " + SIXTH}))
    # the request's outcome entry is published just after its last block reached the client;
    # an earlier test's request may publish its own after `start` too, so ours is the request
    # that wrote a sixth block
    deadline = time.monotonic() + 60
    while True:
        entries = journal(server, start)
        sixth = {e["request"] for e in entries if e["event"] == "speech_block" and e["block"] == 5}
        done = [e for e in entries if e["event"] == "request" and e.get("kind") == "speech" and e["request"] in sixth]
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # poll interval; the deadline bounds the wait
    assert len(done) == 1 and done[0]["blocks"] == 6, done
    request = done[0]["request"]
    mine = [e for e in entries if e.get("request") == request]
    blocks = [e for e in mine if e["event"] == "speech_block"]
    first = [e for e in mine if e["event"] == "speech_first_audio"]
    assert [e["block"] for e in blocks] == [0, 1, 2, 3, 4, 5] and len(first) == 1
    assert blocks[0]["id"] < first[0]["id"] < blocks[-1]["id"], [(e["event"], e["id"]) for e in mine]
    # the same milestone is the time-to-first-audio histogram: one observation per event
    first_audio = [e for e in journal(server, 0) if e["event"] == "speech_first_audio" and e["model"] == "speaker"]
    scraped = server.request("GET", "/metrics").body.decode()
    count = re.search(r'^loom_speech_time_to_first_audio_seconds_count\{model="speaker"\} (\S+)$', scraped, re.M)
    assert count is not None and float(count.group(1)) >= len(first_audio) >= 1, scraped[-2000:]


def test_concurrent_requests_get_the_bytes_they_get_alone(server):
    bodies = [{**SPEC_BODY, "input": text, "seed": i, "speed": s}
              for i, (text, s) in enumerate([(FIVE, 1.0), ("Good day.", 1.5), (ROUND_TRIP[2], 0.8),
                                             (ROUND_TRIP[4], 1.0)])]
    alone = [audio_of(speak(server, b)) for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: audio_of(speak(server, b)), bodies))
    for a, t in zip(alone, together):
        assert np.array_equal(a, t)


def test_a_client_that_leaves_stops_only_its_own_request(server):
    long_text = " ".join([FIVE] * 6)             # 30 sentences
    body = json.dumps({**SPEC_BODY, "input": long_text}).encode()
    start = newest_id(server)
    leaving = server.connect(timeout=60)
    leaving.sendall(f"POST {ENDPOINT} HTTP/1.1\r\nHost: loom\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert leaving.recv(1)                      # the stream has started
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(lambda: audio_of(speak(server, SPEC_BODY)))
        leaving.close()
        assert len(other.result(timeout=180)) > 0
    deadline = time.monotonic() + 120
    while True:
        done = [e for e in journal(server, start) if e["event"] == "request" and e.get("kind") == "speech"
                and e.get("blocks") == 30]
        if done:
            break
        assert time.monotonic() < deadline, "the abandoned request never ended"
        time.sleep(0.1)  # poll interval; the deadline bounds the wait
    assert done[0]["blocks_done"] < 30 and "error" in done[0], done[0]


def test_an_unknown_word_is_read_by_the_packages_fallback_network(server):
    """"blorft" is in no lexicon: the phonemizer reads it with the speaker's `phonemizer`
    component (hibari's out-of-vocabulary network in .loom), so it is spoken, not skipped."""
    r = server.request("POST", "/tokenize", {"model": "speaker", "content": "blorft"})
    assert r.status == 200, r.body
    ids = r.json()["tokens"]
    assert len(ids) >= 4, ids
    phonemes = server.request("POST", "/detokenize", {"model": "speaker", "tokens": ids}).json()["content"]
    assert phonemes.startswith("bl"), phonemes
    with_word = audio_of(speak(server, {**SPEC_BODY, "input": "The blorft sat down."}))
    without = audio_of(speak(server, {**SPEC_BODY, "input": "The sat down."}))
    assert len(with_word) > len(without) + RATE // 10


# ---- rejections -----------------------------------------------------------------------------------

@pytest.mark.parametrize("change, status, words, param", [
    ({"model": None}, 400, ["model"], None),
    ({"input": None}, 400, ["input"], "input"),
    ({"voice": None}, 400, ["voice"], "voice"),
    ({"response_format": None}, 400, ["response_format"], "response_format"),
    ({"input": ""}, 400, ["input"], "input"),
    ({"input": "   \n"}, 400, ["input"], "input"),
    ({"input": 7}, 400, ["input"], "input"),
    ({"response_format": "mp3"}, 400, ["encoded"], "response_format"),
    ({"response_format": "wav"}, 400, ["encoded"], "response_format"),
    ({"response_format": "opus"}, 400, ["encoded"], "response_format"),
    ({"response_format": "aac"}, 400, ["encoded"], "response_format"),
    ({"response_format": "flac"}, 400, ["encoded"], "response_format"),
    ({"response_format": "text"}, 400, ["pcm"], "response_format"),
    ({"stream_format": "sse"}, 400, ["server-sent"], "stream_format"),
    ({"stream_format": "bytes"}, 400, ["stream_format"], "stream_format"),
    ({"speed": 0.2}, 400, ["speed"], "speed"),
    ({"speed": 4.01}, 400, ["speed"], "speed"),
    ({"speed": "1"}, 400, ["speed"], "speed"),
    ({"speed": True}, 400, ["speed"], "speed"),
    ({"seed": -1}, 400, ["seed"], "seed"),
    ({"seed": 1.5}, 400, ["seed"], "seed"),
    ({"seed": "12a"}, 400, ["seed"], "seed"),
    ({"seed": "-3"}, 400, ["seed"], "seed"),
    ({"voice": "emma"}, 400, ["emma", "voices"], None),
    ({"voice": "fable"}, 400, ["fable"], None),
    ({"voice": ""}, 400, ["voice"], "voice"),
    ({"voice": 3}, 400, ["voice"], "voice"),
    ({"voice": {}}, 400, ["voice.id"], "voice.id"),
    ({"voice": {"id": "alba", "name": "x"}}, 400, ["voice.name"], "voice.name"),
    ({"instructions": "Speak softly."}, 400, ["instructions"], None),
    ({"instructions": 3}, 400, ["instructions"], "instructions"),
    ({"stream": True}, 400, ["unknown field"], "stream"),
    ({"input": "a" * 4097}, 400, ["4096"], None),
])
def test_rejections(server, change, status, words, param):
    body = {k: v for k, v in {**SPEC_BODY, **change}.items() if v is not None}
    assert_error(speak(server, body), status, *words, param=param)
    assert server.request("GET", "/healthz").status == 200


def test_unknown_model_and_other_kinds_are_404(server):
    assert_error(speak(server, {**SPEC_BODY, "model": "nobody"}), 404, "nobody")
    assert_error(speak(server, {**SPEC_BODY, "model": "mini"}), 404)
    assert_error(speak(server, {**SPEC_BODY, "model": "recognizer"}), 404)


def test_malformed_and_non_json_bodies(server):
    r = server.request("POST", ENDPOINT, b'{"model": "speaker", ', {"Content-Type": "application/json"})
    assert_error(r, 400, "json")
    r = server.request("POST", ENDPOINT, b"model=speaker", {"Content-Type": "application/x-www-form-urlencoded"})
    assert_error(r, 400, "application/json")


# ---- discovery, curl ---------------------------------------------------------------------------------

def test_models_lists_the_speaker_with_its_voices(server):
    data = {m["id"]: m for m in server.request("GET", "/v1/models").json()["data"]}
    speaker = data["speaker"]
    assert speaker["input_modalities"] == ["text"] and speaker["output_modalities"] == ["audio"]
    assert speaker["loom"]["endpoint"] == ENDPOINT and speaker["loom"]["kind"] == "speech"
    assert speaker["loom"]["output_format"] == {"format": "pcm", "sample_rate": RATE, "channels": 1}
    assert {"alba", "alloy", "heart"} <= set(speaker["loom"]["voices"])


def test_curl_output_of_the_spec_example(server, tmp_path):
    if shutil.which("curl") is None:
        pytest.fail("curl is not installed; the spec's example needs it")
    out = tmp_path / "speech.pcm"
    subprocess.run(["curl", "--fail-with-body", "-sS", f"http://127.0.0.1:{server.port}{ENDPOINT}",
                    "-H", "Content-Type: application/json", "-d", json.dumps(SPEC_BODY), "--output", str(out)],
                   check=True, timeout=180)
    assert out.read_bytes() == speak(server, SPEC_BODY).body


# ---- round trip -----------------------------------------------------------------------------------

NUMBERS = {"3": "three", "7": "seven", "9": "nine", "12": "twelve", "30": "thirty"}


def words_of(text: str) -> list[str]:
    """Lower-case words, numbers spelled out (a transcript may write "7:30" for "seven thirty")."""
    text = re.sub(r"(\d+)[:.](\d+)", r"\1 \2", text.lower())
    return [NUMBERS.get(w, w) for w in re.findall(r"[a-z0-9']+", text)]


def edit_distance(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def wav_bytes(audio: np.ndarray) -> bytes:
    import io

    import soundfile
    out = io.BytesIO()
    soundfile.write(out, audio, RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


def test_round_trip_through_the_recognizer(server):
    boundary = "speech-round-trip"
    errors = words = 0
    for sentence in ROUND_TRIP:
        audio = audio_of(speak(server, {**SPEC_BODY, "input": sentence}))
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nrecognizer\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"s.wav\"\r\n"
                f"Content-Type: audio/wav\r\n\r\n").encode() + wav_bytes(audio) + f"\r\n--{boundary}--\r\n".encode()
        r = server.request("POST", "/v1/audio/transcriptions", body,
                           {"Content-Type": f"multipart/form-data; boundary={boundary}"}, timeout=180)
        assert r.status == 200, r.body
        heard = r.json()["text"]
        said, got = words_of(sentence), words_of(heard)
        errors += edit_distance(said, got)
        words += len(said)
        print(f"said: {sentence!r}\nheard: {heard!r}\n")
    wer = errors / words
    print(f"word error rate over {len(ROUND_TRIP)} sentences: {wer:.3f} ({errors}/{words})")
    assert wer <= 0.10, wer
