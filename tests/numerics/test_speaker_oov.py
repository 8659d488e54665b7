"""The speaker's OOV G2P network (hibari-tts 0.2.1's `hibari/assets/oov.onnx`, fp32) in `.loom`
(`samples/speaker/oov/`) against onnxruntime running that very file.

hibari reads a word its lexicon lacks with this character transformer: one onnxruntime call
per word (`hibari.g2p.oov.OOV`, CPU, 1 thread), whose `ids` [1, 4 L] are the argmax classes of
4 output slots per character, then greedy CTC decoding in Python. Ours is the sample's `oov`
command, compiled from `.loom`, with the words packed along the character axis.

* (a) The classes of ~20 words (made-up words, names, accented and non-Latin letters, words
  of 1 and of 24+ characters) equal onnxruntime's exactly. The logits themselves differ in
  the last bits (other summation orders, erf as a rational approximation, the online
  softmax): measured on these words, at most 1.7e-5 apart (relative RMS 4e-7, logits in
  -16..12), while onnxruntime's two best logits of a slot are never closer than 0.077
  ("Przybylski"), so no argmax is near a tie. A mismatch reports onnxruntime's margin there.
* (b) hibari's own `OOV`, given an adapter that runs the Loom program in place of its
  onnxruntime session, decodes the same phonemes as with onnxruntime.
* (c) Several words packed in one call give the same classes as each alone (positions
  restart and attention stays inside each word).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hibari  # noqa: F401 - the sample weights' package (make install)
import onnx
import onnxruntime as ort  # the reference (test extra)
from hibari.g2p.oov import OOV

from loomc.check import load_files
from loomc.lower.prepare import prepare_plan
from loomc.run.compile import compile_command
from loomrt.checkpoints import open_checkpoint
from loomrt.locator import resolve_locator
from loomrt.prepare import prepare_params

SOURCE = Path(__file__).resolve().parents[2] / "samples" / "speaker" / "oov" / "model.loom"
OOV_ONNX = "package:hibari/assets/oov.onnx"
SLOTS, CLASSES = 4, 54
WORDS = ["hibari", "Zyxwvut", "onnxruntime", "Kokoro", "quixotically", "blorft", "Siobhan", "Nguyen",
         "Tchaikovsky", "Przybylski", "Aoife", "Cthulhu", "Mxyzptlk", "Björk", "Dvořák", "Zürich",
         "Llanfairpwllgwyngyll", "pneumonoultramicroscopic",            # 20 and 24 characters
         "antidisestablishmentarianism", "supercalifragilisticexpialidocious",   # truncated to 24
         "x", "Q", "GPUs", "Москва"]


@pytest.fixture(scope="module")
def program():
    checked = load_files([SOURCE])
    assert checked.ok, checked.diagnostics
    command = compile_command(checked, "g2p_fallback")
    with open_checkpoint(resolve_locator(OOV_ONNX)) as ckpt:
        params = prepare_params(prepare_plan(checked), ckpt)

    def run(chars: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return command.run(params, {}, {"chars": chars.astype(np.int32), "rows": rows.astype(np.int32)})["classes"]

    return run


@pytest.fixture(scope="module")
def reference():
    """hibari's OOV with its own onnxruntime session, and a session on a copy of the graph
    that also outputs the logits ([1, 4 L, 54], before the ArgMax)."""
    model = onnx.load(str(resolve_locator(OOV_ONNX)))
    model.graph.output.append(onnx.ValueInfoProto(name="/Reshape_16_output_0"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return OOV(), session


class LoomSession:
    """Stands in for onnxruntime's session in `hibari.g2p.oov.OOV`: `chars` int64 [1, L] in,
    `[ids int64 [1, 4 L]]` out, computed by the Loom program."""

    def __init__(self, run):
        self._run = run

    def run(self, names, feeds):
        chars = np.asarray(feeds["chars"])[0]
        classes = self._run(chars, np.zeros(len(chars), np.int32))
        return [classes.reshape(1, -1).astype(np.int64)]


def char_ids(oov: OOV, word: str) -> np.ndarray:
    ids = [oov.cin[c] for c in word if c in oov.cin][: oov.maxlen]   # as OOV.__call__ does
    assert ids, word
    return np.asarray(ids, np.int64)


def test_the_words_exercise_what_they_should(reference):
    oov, _ = reference
    lengths = {len(char_ids(oov, w)) for w in WORDS}
    assert {1, 24} <= lengths
    assert all(len(w) == len(char_ids(oov, w)) for w in WORDS if len(w) <= 24)   # no character dropped


def test_classes_equal_onnxruntimes(program, reference):
    oov, session = reference
    margins = []
    for word in WORDS:
        ids = char_ids(oov, word)
        ref, logits = session.run(None, {"chars": ids[None]})
        top2 = np.sort(logits[0], axis=-1)[:, -2:]
        margins.append((float((top2[:, 1] - top2[:, 0]).min()), word))
        ours = program(ids, np.zeros(len(ids), np.int32))
        assert ours.shape == (len(ids), SLOTS)
        differ = np.nonzero(ours.reshape(-1) != ref[0])[0]
        assert len(differ) == 0, (word, differ.tolist(), "onnxruntime's margins there:",
                                  (top2[differ, 1] - top2[differ, 0]).tolist())
    # The closest call over all words (0.077 measured): far above the logits' deviation
    # (1.7e-5), so an exact match is what to expect and not luck.
    assert min(margins)[0] > 1e-2, min(margins)


def test_hibari_decodes_the_same_phonemes(program, reference):
    oov, _ = reference
    ours = OOV(session=LoomSession(program))
    for word in WORDS:
        assert ours(word) == oov(word), word


def test_packed_words_give_the_same_classes_as_each_alone(program, reference):
    oov, _ = reference
    words = [char_ids(oov, w) for w in ["pneumonoultramicroscopic", "x", "hibari", "Tchaikovsky", "Q",
                                        "supercalifragilisticexpialidocious", "Björk", "blorft"]]
    alone = [program(ids, np.zeros(len(ids), np.int32)) for ids in words]
    rows = np.concatenate([np.full(len(ids), r, np.int32) for r, ids in enumerate(words)])
    packed = program(np.concatenate(words), rows)
    assert np.array_equal(packed, np.concatenate(alone))
    # In another order, too: a word's classes do not depend on its neighbours or its offset.
    order = [3, 0, 7, 1, 6, 2, 5, 4]
    rows = np.concatenate([np.full(len(words[i]), r, np.int32) for r, i in enumerate(order)])
    packed = program(np.concatenate([words[i] for i in order]), rows)
    assert np.array_equal(packed, np.concatenate([alone[i] for i in order]))
