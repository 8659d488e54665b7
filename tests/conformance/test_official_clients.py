"""Every served endpoint through the official `openai` Python client, unmodified, against one real
`loomd` serving the bundled samples scout (chat), vectors (embeddings), speaker (speech) and
recognizer (transcriptions).

The client only gets a base_url (`http://127.0.0.1:PORT/v1`), a placeholder api_key and
`max_retries=0`; everything else is its own request building and response parsing, so these
tests check that loomd's responses (JSON, SSE chunks, tool calls, base64 embeddings, a PCM
stream, plain-text transcripts, OpenAI-style errors) are shapes the client accepts, and that
what it parses is what the server meant: streamed text equals the greedy JSON answer, base64
vectors decode to exactly the f32 values of the float ones, speech is the bytes a plain HTTP
request gets, a known recording transcribes to its known text.

Image input: an image part (a PNG data URL) reaches scout's image component and gets an answer,
counted as the input-token endpoint counts it. Image generation through this client
(`client.images.generate`) is in test_images_endpoint.py, beside the illustrator's own daemon
(its sample is large: a fifth model here would slow every test of this module). The spec's
curl examples run verbatim elsewhere (`spec_examples`).

The daemon runs with OPENBLAS_NUM_THREADS=1, as the embeddings module's (see its BLAS note).
"""

from __future__ import annotations

import base64
import io
import json
import struct

import numpy as np
import openai
import pytest
import soundfile
from PIL import Image

from conformance_support import serving
from loomd_process import REPO, Daemon
from loomrt.locator import resolve_locator
from scout_daemon import scout_document
from tool_history import HISTORY, WEATHER

SAMPLES = REPO / "samples"
MODELS = ["scout", "vectors", "speaker", "recognizer"]
READY_DEADLINE_S = 600.0       # four samples compile and prepare; a hang guard
CLIENT_TIMEOUT_S = 300.0       # a model's first request can include compiling its kernels
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WIDTH = 384                    # vectors' embedding width
SENTENCES = ["A man is eating food.", "Embeddings map text to vectors.", "東京は日本の首都です。"]
RATE = 24000                   # speaker's PCM16 mono rate
PCM_TYPE = "audio/pcm;rate=24000;channels=1"
BECKETT = "package:moonshine_onnx/assets/beckett.wav"          # as test_transcriptions_endpoint
BECKETT_TEXT = " Ever tried, ever failed. No matter, try again. Fail again. Fail better."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("official-clients")
    docs = [scout_document(tmp, rows=2, context_length=1024, max_output_tokens=64),
            *(SAMPLES / name / "model.json" for name in MODELS[1:])]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENBLAS_NUM_THREADS", "1")
        daemon = Daemon.start(tmp, docs)
    with serving(daemon, MODELS, READY_DEADLINE_S):
        yield daemon


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", timeout=CLIENT_TIMEOUT_S,
                       max_retries=0) as c:
        yield c


@pytest.fixture(autouse=True)
def still_healthy(request):
    """After every test the daemon still answers /healthz (as conftest's for its `daemon`)."""
    yield
    if "server" in request.fixturenames:
        request.getfixturevalue("server").assert_healthy()


# ---- models --------------------------------------------------------------------------------------

def test_models_list_names_every_deployment(client):
    models = {m.id: m for m in client.models.list().data}
    assert set(MODELS) <= set(models), sorted(models)
    for name in MODELS:
        assert models[name].object == "model" and models[name].owned_by == "local"
        assert isinstance(models[name].created, int)
    # loom's extensions survive the client's parsing as extra fields
    assert models["speaker"].model_extra["output_modalities"] == ["audio"]
    assert models["recognizer"].model_extra["input_modalities"] == ["audio"]
    assert models["scout"].model_extra["input_modalities"] == ["text", "image"]


# ---- chat ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def answer(client):
    return client.chat.completions.create(model="scout", messages=QUESTION, temperature=0, max_tokens=24)


def test_chat_completion(answer):
    assert answer.object == "chat.completion" and answer.model == "scout"
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_chat_with_an_image_part(client, server):
    pixels = np.zeros((60, 80, 3), np.uint8)
    pixels[:, :, 0] = np.linspace(0, 255, 80, dtype=np.uint8)          # a red ramp with a blue square
    pixels[20:40, 30:50] = (30, 60, 220)
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, "PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url, "detail": "low"}},
                                             {"type": "text", "text": "What is in this image?"}]}]
    reply = client.chat.completions.create(model="scout", messages=messages, temperature=0, max_tokens=16)
    assert reply.choices[0].message.content.strip()
    counted = server.request("POST", "/v1/chat/completions/input_tokens", {"model": "scout", "messages": messages})
    assert reply.usage.prompt_tokens == counted.json()["input_tokens"]


def test_streamed_chat_concatenates_to_the_same_text(client, answer):
    stream = client.chat.completions.create(model="scout", messages=QUESTION, temperature=0, max_tokens=24,
                                            stream=True, stream_options={"include_usage": True})
    parts, finish, usage, roles = [], None, None, []
    with stream:
        for chunk in stream:
            assert chunk.object == "chat.completion.chunk"
            if chunk.usage is not None:
                assert chunk.choices == []
                usage = chunk.usage
                continue
            delta = chunk.choices[0].delta
            roles.append(delta.role)
            parts.append(delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert roles[0] == "assistant"
    assert "".join(parts) == answer.choices[0].message.content
    assert finish == answer.choices[0].finish_reason
    assert usage is not None
    # token counts are the same; cached_tokens may differ (the second run can reuse the first's row)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
        (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens)
    assert 0 <= usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_invalid_chat_requests_are_client_errors(client):
    with pytest.raises(openai.BadRequestError) as rejected:
        client.chat.completions.create(model="scout", messages=QUESTION, max_tokens=4, temperature=3)
    assert rejected.value.status_code == 400
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nobody", messages=QUESTION, max_tokens=4)


def test_tool_call_round_trip(client):
    """Tools out, a generated call back as the client's own types, the result sent back in.

    The conversation (`tool_history.HISTORY`: two earlier calls of the same tool)
    makes the model call `get_weather` for London under greedy decoding; the client parses
    it, and the second turn sends the full history with that assistant `tool_calls` message
    and a `tool` result message and must get a completion back."""
    messages = HISTORY
    first = client.chat.completions.create(model="scout", messages=messages, tools=[WEATHER], temperature=0,
                                           max_tokens=48)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls, choice.message
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "London"}
    calls = [c.model_dump() for c in choice.message.tool_calls]

    history = messages + [
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"temperature_c": 18, "sky": "clear"})}
          for c in calls),
    ]
    second = client.chat.completions.create(model="scout", messages=history, tools=[WEATHER], temperature=0,
                                            max_tokens=32)
    follow = second.choices[0]
    assert follow.finish_reason in ("stop", "length", "tool_calls")
    if follow.message.tool_calls:
        for call in follow.message.tool_calls:
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert isinstance(follow.message.content, str)
    # the history (tool catalog, the call written back, the result) is part of the prompt
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    assert second.usage.completion_tokens <= 32

    # tool_choice "none" keeps the catalog and the history, and answers in text
    summary = client.chat.completions.create(model="scout", messages=history, tools=[WEATHER], tool_choice="none",
                                             temperature=0, max_tokens=8)
    assert summary.usage.prompt_tokens == second.usage.prompt_tokens
    assert not summary.choices[0].message.tool_calls


# ---- embeddings ----------------------------------------------------------------------------------

def test_embeddings_float_and_base64(client, server):
    floats = client.embeddings.create(model="vectors", input=SENTENCES, encoding_format="float")
    packed = client.embeddings.create(model="vectors", input=SENTENCES, encoding_format="base64")
    for response in (floats, packed):
        assert response.object == "list" and response.model == "vectors"
        assert [(d.object, d.index) for d in response.data] == [("embedding", i) for i in range(len(SENTENCES))]
        assert response.usage.prompt_tokens == response.usage.total_tokens > 0
    assert packed.usage == floats.usage
    for f, b in zip(floats.data, packed.data):
        assert len(f.embedding) == WIDTH and isinstance(b.embedding, str)   # asked for: left encoded
        raw = base64.b64decode(b.embedding, validate=True)
        # little-endian f32, and the JSON floats are exactly those f32 values
        assert list(struct.unpack(f"<{WIDTH}f", raw)) == f.embedding
        assert abs(np.linalg.norm(np.array(f.embedding, np.float64)) - 1.0) < 1e-5

    # without encoding_format the client asks for base64 and decodes it itself
    default = client.embeddings.create(model="vectors", input=SENTENCES)
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]
    # token ids, as /tokenize gives them, embed like the text
    ids = server.request("POST", "/tokenize", {"model": "vectors", "content": SENTENCES[0]}).json()["tokens"]
    by_ids = client.embeddings.create(model="vectors", input=[ids], encoding_format="float")
    assert by_ids.data[0].embedding == floats.data[0].embedding


def test_embeddings_unsupported_dimensions_is_a_client_error(client):
    with pytest.raises(openai.BadRequestError) as rejected:
        client.embeddings.create(model="vectors", input="x", dimensions=128)
    assert "dimensions" in str(rejected.value)


# ---- speech --------------------------------------------------------------------------------------

def plain_speech(server: Daemon, **body) -> bytes:
    """The same request without the client: a plain HTTP POST."""
    r = server.request("POST", "/v1/audio/speech", body, timeout=CLIENT_TIMEOUT_S)
    assert r.status == 200, r.body
    return r.body


def test_speech_streams_pcm16(client, server):
    with client.audio.speech.with_streaming_response.create(model="speaker", voice="alloy", input="Good day.",
                                                            response_format="pcm") as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == PCM_TYPE
        data = b"".join(response.iter_bytes())
    assert len(data) % 2 == 0
    audio = np.frombuffer(data, "<i2")
    assert 0.3 * RATE < len(audio) < 3 * RATE, len(audio)          # "Good day." is about a second
    rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
    assert 100 < rms < 20000, rms                                  # speech, neither silence nor clipping
    assert data == plain_speech(server, model="speaker", voice="alloy", input="Good day.", response_format="pcm")
    # the spec's only stream_format, through the non-streaming helper: the same bytes
    whole = client.audio.speech.create(model="speaker", voice="alloy", input="Good day.", response_format="pcm",
                                       stream_format="audio")
    assert whole.content == data


def test_speech_encoded_formats_are_client_errors(client):
    with pytest.raises(openai.BadRequestError) as rejected:
        client.audio.speech.create(model="speaker", voice="alloy", input="Good day.", response_format="mp3")
    assert "response_format" in str(rejected.value)


# ---- transcriptions ------------------------------------------------------------------------------

def test_transcriptions_json_and_text(client):
    path = resolve_locator(BECKETT)                  # a real WAV recording from the test assets
    with open(path, "rb") as f:
        result = client.audio.transcriptions.create(model="recognizer", file=f)
    assert result.text == BECKETT_TEXT
    with open(path, "rb") as f:
        plain = client.audio.transcriptions.create(model="recognizer", file=f, response_format="text")
    assert plain == BECKETT_TEXT
    with open(path, "rb") as f, pytest.raises(openai.BadRequestError) as rejected:
        client.audio.transcriptions.create(model="recognizer", file=f, response_format="srt")
    assert "response_format" in str(rejected.value)


def test_speech_round_trips_through_transcription(client):
    """Speech from the client, written as a WAV file, transcribed through the client."""
    said = "The weather is lovely today."
    pcm = client.audio.speech.create(model="speaker", voice="alloy", input=said, response_format="pcm").content
    wav = io.BytesIO()
    soundfile.write(wav, np.frombuffer(pcm, "<i2"), RATE, format="WAV", subtype="PCM_16")
    heard = client.audio.transcriptions.create(model="recognizer", file=("said.wav", wav.getvalue(), "audio/wav"),
                                               response_format="text")
    assert "weather" in heard.lower() and "today" in heard.lower(), heard
