"""Soak: mixed traffic against one `loomd` for a while; error counts, latencies and the daemon's RSS.

Run by hand (never in CI):

    .venv/bin/python bench/soak.py --duration 1800 --concurrency 8
    .venv/bin/python bench/soak.py --url http://127.0.0.1:8080 --pid 12345 --duration 600

Without `--url` it starts `python -m loomd serve` on the bundled samples named by `--models`
(default scout, vectors, judge, encoder: every kind of traffic below, none of the slow-to-
compile speech samples) on a free loopback port, and stops it at the end. With `--url` it
drives a daemon that is already running; its RSS is sampled only if `--pid` names it.

Traffic: `--concurrency` clients, each picking a kind by weight (seeded), until `--duration`
seconds have passed: chat (JSON and streamed), chat continued under `X-Loom-Session` names
(a few turns each, then a new name), embeddings, systemone decisions, sequences,
tokenize/detokenize, and admin reads (`/v1/status`, `/v1/models`, `/v1/models/variants`,
`/v1/requests`, `/metrics`). Before the clock starts, one request of each kind is sent
(kernels compile on first use) and a kind the daemon does not offer (no such deployment,
variants or sessions not enabled: a 4xx or a 501 on that first request) is left out and named.

Prints the machine (`bench/machine.py`), then a line every `--interval` seconds (requests,
errors, RSS), then per kind: count, p50/p99 latency and status counts, and the RSS samples.
RSS is read with psutil when installed, else from /proc/PID/status. The verdict: 0 responses
>= 500 and no transport errors, and RSS growth after warm-up (the first `--warmup` seconds,
default 10% of the duration) below 5%, measured from the first sample after warm-up to
the largest sample after it. Exit status 1 when either fails.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe  # noqa: E402  (bench/machine.py, beside this script)

READY_DEADLINE_S = 1200.0     # the daemon compiles and prepares every sample first
REQUEST_TIMEOUT_S = 300.0     # one request, start to end of body (first requests compile kernels)
RSS_GROWTH_LIMIT = 0.05
WORDS = ("river stone lantern quiet market orange signal harbor winter paper garden silver "
         "engine cloud mirror violin forest candle ladder planet").split()
QUESTIONS = {
    "route": {"type": "choice", "instructions": "Choose a team.",
              "criteria": {"support": "Account access", "billing": "Payments"}},
    "urgency": {"type": "score", "instructions": "Rate urgency.", "criteria": ["Low", "Medium", "High"]},
}


# ---- the traffic ---------------------------------------------------------------------------------

class Traffic:
    """Builds requests of each kind: (method, path, headers, JSON body or None, streamed)."""

    WEIGHTS = {"chat": 20, "chat_stream": 20, "chat_session": 10, "embeddings": 10, "systemone": 8,
               "sequences": 10, "tokenize": 8, "status": 4, "models": 3, "variants": 3, "requests": 2,
               "metrics": 2}

    def __init__(self, seed: int, max_tokens: int):
        self.rng = random.Random(seed)
        self.max_tokens = max_tokens
        self.sessions: dict[str, list[dict[str, str]]] = {}
        self.session_ids = itertools.count()
        self.busy: set[str] = set()

    def sentence(self, low: int = 4, high: int = 16) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(low, high)))

    def chat_body(self, messages: list[dict[str, str]], stream: bool) -> dict[str, Any]:
        return {"model": "scout", "messages": messages, "max_tokens": self.rng.randint(1, self.max_tokens),
                "temperature": self.rng.choice([0, 0.7]), "seed": self.rng.randrange(1 << 31), "stream": stream}

    def request(self, kind: str) -> tuple[str, str, dict[str, str], dict[str, Any] | None, bool]:
        rng = self.rng
        if kind in ("chat", "chat_stream"):
            messages = [{"role": "user", "content": "Say something about " + self.sentence(1, 6) + "."}]
            return "POST", "/v1/chat/completions", {}, self.chat_body(messages, kind == "chat_stream"), \
                kind == "chat_stream"
        if kind == "chat_session":   # one request at a time per session, as one client's conversation
            idle = [name for name in self.sessions if name not in self.busy]
            if not idle or rng.random() < 0.3:
                idle.append(f"soak-{next(self.session_ids)}")
                self.sessions[idle[-1]] = []
                for old in [n for n in self.sessions if n not in self.busy][:-8]:   # a bounded set of conversations
                    self.sessions.pop(old)
                    idle.remove(old)
            name = rng.choice(idle)
            self.busy.add(name)
            history = self.sessions[name]
            if len(history) >= 6:
                history.clear()
            history.append({"role": "user", "content": self.sentence(2, 8)})
            return "POST", "/v1/chat/completions", {"X-Loom-Session": name}, \
                self.chat_body(list(history), False) | {"_session": name}, False
        if kind == "embeddings":
            return "POST", "/v1/embeddings", {}, {"model": "vectors",
                                                  "input": [self.sentence() for _ in range(rng.randint(1, 8))]}, False
        if kind == "systemone":
            return "POST", "/v1/systemone", {}, {"model": "judge", "state": self.sentence(4, 20),
                                                 "questions": QUESTIONS}, False
        if kind == "sequences":
            ids = [rng.randrange(1, 40000) for _ in range(rng.randint(4, 96))]
            return "POST", "/v1/sequences", {}, {"model": "encoder", "position": 0, "token_ids": ids}, True
        if kind == "tokenize":
            if rng.random() < 0.5:
                return "POST", "/tokenize", {}, {"model": "scout", "content": self.sentence()}, False
            return "POST", "/detokenize", {}, {"model": "scout",
                                               "tokens": [rng.randrange(1, 40000) for _ in range(8)]}, False
        if kind == "variants":
            return "GET", "/v1/models/variants", {"X-Loom-Model": "scout"}, None, False
        return "GET", {"status": "/v1/status", "models": "/v1/models", "requests": "/v1/requests",
                       "metrics": "/metrics"}[kind], {}, None, False

    def answered(self, body: dict[str, Any] | None, data: bytes | None) -> None:
        """A session's answer (None: it failed) joins its history, as a client continuing the
        conversation would; the session is free for its next turn."""
        name = (body or {}).get("_session")
        self.busy.discard(name)
        if name in self.sessions and data is not None:
            try:
                content = json.loads(data)["choices"][0]["message"]["content"] or ""
            except (ValueError, KeyError, IndexError, TypeError):
                self.sessions.pop(name, None)
                return
            self.sessions[name].append({"role": "assistant", "content": content})


class Tally:
    def __init__(self):
        self.latencies: dict[str, list[float]] = collections.defaultdict(list)
        self.statuses: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.examples: dict[tuple[str, Any], str] = {}

    def add(self, kind: str, status: int | str, seconds: float, detail: str = "") -> None:
        self.latencies[kind].append(seconds)
        self.statuses[kind][status] += 1
        if (status == "transport" or (isinstance(status, int) and status >= 400)) and (kind, status) not in self.examples:
            self.examples[(kind, status)] = detail[:300]

    def total(self) -> int:
        return sum(sum(c.values()) for c in self.statuses.values())

    def errors(self) -> int:
        return sum(n for c in self.statuses.values() for s, n in c.items() if s == "transport" or s >= 500)


async def send(client: aiohttp.ClientSession, base: str, request, traffic: Traffic) -> tuple[int | str, str]:
    method, path, headers, body, streamed = request
    payload = None if body is None else {k: v for k, v in body.items() if not k.startswith("_")}
    try:
        async with client.request(method, base + path, json=payload, headers=headers,
                                  timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as response:
            if streamed:
                data = b"".join([chunk async for chunk in response.content.iter_any()])
            else:
                data = await response.read()
            traffic.answered(body, data if response.status == 200 else None)
            return response.status, data.decode("utf-8", "replace")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        traffic.answered(body, None)
        return "transport", repr(exc)


# ---- the daemon and its RSS -----------------------------------------------------------------------

def rss_bytes(pid: int) -> int | None:
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(models: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    docs = [str(REPO / "samples" / m / "model.json") for m in models]
    log = open(os.environ.get("SOAK_DAEMON_LOG", os.devnull), "w")
    process = subprocess.Popen([sys.executable, "-m", "loomd", "serve", *docs, "--listen", f"127.0.0.1:{port}"],
                               cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{port}"


async def wait_ready(base: str, process: subprocess.Popen | None) -> list[str]:
    deadline = time.monotonic() + READY_DEADLINE_S
    async with aiohttp.ClientSession() as client:
        while True:
            if process is not None and process.poll() is not None:
                raise SystemExit(f"loomd exited with {process.returncode} before it was ready")
            try:
                async with client.get(base + "/v1/status") as r:
                    regs = (await r.json())["registrations"]
                if regs and all(reg["phase"] in ("ready", "failed") for reg in regs):
                    failed = [reg["model"] for reg in regs if reg["phase"] == "failed"]
                    if failed:
                        print(f"not ready (failed): {', '.join(failed)}")
                    return [reg["model"] for reg in regs if reg["phase"] == "ready"]
            except (aiohttp.ClientError, OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the daemon did not become ready")
            await asyncio.sleep(0.5)


# ---- the run --------------------------------------------------------------------------------------

async def probe(base: str, traffic: Traffic, tally: Tally, kinds: list[str]) -> dict[str, int]:
    """One request of each kind, in turn (compiles kernels); the weights of the kinds offered."""
    weights = {}
    async with aiohttp.ClientSession() as client:
        for kind, weight in Traffic.WEIGHTS.items():
            if kind not in kinds:
                continue
            status, detail = await send(client, base, traffic.request(kind), traffic)
            if status == 200:
                weights[kind] = weight
            elif status == "transport" or (status >= 500 and status != 501):   # 501: not enabled
                tally.add(kind, status, 0.0, detail)
                weights[kind] = weight
            else:
                print(f"left out {kind}: {status} {detail[:200]}")
    return weights


async def soak(base: str, args, pid: int | None) -> tuple[Tally, list[tuple[float, int]]]:
    traffic = Traffic(args.seed, args.max_tokens)
    tally = Tally()
    weights = await probe(base, traffic, tally, args.kinds.split(","))
    kinds, cumulative = list(weights), list(itertools.accumulate(weights.values()))
    rss: list[tuple[float, int]] = []
    start = time.monotonic()
    stop_at = start + args.duration

    async def client_loop(client: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop_at:
            kind = traffic.rng.choices(kinds, cum_weights=cumulative)[0]
            t0 = time.monotonic()
            status, detail = await send(client, base, traffic.request(kind), traffic)
            tally.add(kind, status, time.monotonic() - t0, detail)

    async def monitor(client: aiohttp.ClientSession) -> None:
        while True:
            now = time.monotonic() - start
            value = rss_bytes(pid) if pid is not None else None
            if value is not None:
                rss.append((now, value))
            pages = await kv_pages(client, base)
            print(f"[{now:7.0f} s] {tally.total():7d} requests, {tally.errors()} errors >= 500/transport"
                  + (f", RSS {value / 2**20:8.1f} MiB" if value is not None else "") + f", KV pages {pages}",
                  flush=True)
            if now >= args.duration:
                return
            await asyncio.sleep(min(args.interval, max(args.duration - now, 0.1)))

    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as client:
        async with aiohttp.ClientSession() as observer:   # its own connection: never queued behind the clients
            await asyncio.gather(monitor(observer), *(client_loop(client) for _ in range(args.concurrency)))
    return tally, rss


async def kv_pages(client: aiohttp.ClientSession, base: str) -> str:
    """KV pages ever written so far, per deployment that has a pool ("used/total" from /v1/status).
    The pools are allocated zeroed at preparation, and the OS backs a page of one with memory
    only when it is first written: RSS grows until every page has been used once, which is
    warm-up, not a leak (see the verdict in docs/operations.md, "Soak")."""
    try:
        async with client.get(base + "/v1/status") as r:
            regs = (await r.json())["registrations"]
    except (aiohttp.ClientError, OSError, ValueError, KeyError):
        return "?"
    out = []
    for reg in regs:
        s = reg.get("scheduler") or {}
        if "pages_used" in s:
            out.append(f"{reg['model']} {s['pages_used']}/{s['pages_used'] + s['pages_free']}")
    return ", ".join(out)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(tally: Tally, rss: list[tuple[float, int]], args) -> bool:
    print(f"\n{'kind':14} {'count':>7} {'p50 ms':>9} {'p99 ms':>9}  statuses")
    for kind in sorted(tally.latencies):
        lat = tally.latencies[kind]
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(tally.statuses[kind].items(), key=str))
        print(f"{kind:14} {len(lat):7d} {percentile(lat, 0.5) * 1e3:9.1f} {percentile(lat, 0.99) * 1e3:9.1f}  {statuses}")
    overall = collections.Counter()
    for c in tally.statuses.values():
        overall.update(c)
    print("all statuses:", dict(sorted(overall.items(), key=str)))
    for (kind, status), detail in sorted(tally.examples.items(), key=str):
        print(f"  e.g. {kind} {status}: {detail}")
    errors_ok = tally.errors() == 0
    print(f"errors >= 500 or transport: {tally.errors()}")
    growth_ok = True
    if rss:
        warmup = args.warmup if args.warmup is not None else 0.1 * args.duration
        after = [v for t, v in rss if t >= warmup]
        print("RSS (MiB) over time:", "  ".join(f"{t:.0f}s {v / 2**20:.1f}" for t, v in rss))
        if len(after) >= 2:
            growth = (max(after) - after[0]) / after[0]
            growth_ok = growth < RSS_GROWTH_LIMIT
            print(f"RSS after warm-up ({warmup:.0f} s): {after[0] / 2**20:.1f} -> max {max(after) / 2**20:.1f} MiB, "
                  f"final {after[-1] / 2**20:.1f} MiB: growth {growth * 100:.2f}% "
                  f"({'<' if growth_ok else '>='} {RSS_GROWTH_LIMIT * 100:.0f}%)")
        else:
            print("RSS: too few samples after warm-up for a verdict")
    else:
        print("RSS: not sampled (give --pid with --url)")
    return errors_ok and growth_ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of traffic (default 1800)")
    parser.add_argument("--concurrency", type=int, default=8, help="clients at once (default 8)")
    parser.add_argument("--url", help="a running daemon (default: start one on the bundled samples)")
    parser.add_argument("--pid", type=int, help="the running daemon's process id, for its RSS (with --url)")
    parser.add_argument("--models", default="scout,vectors,judge,encoder", help="samples to serve (no --url)")
    parser.add_argument("--warmup", type=float, help="seconds before RSS growth is measured (default 10%% of --duration)")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between RSS samples (default 15)")
    parser.add_argument("--max-tokens", type=int, default=16, help="largest max_tokens of a chat (default 16)")
    parser.add_argument("--kinds", default=",".join(Traffic.WEIGHTS),
                        help="the kinds of traffic, comma-separated (default: all; a subset tells which leaks)")
    parser.add_argument("--seed", type=int, default=23)
    args = parser.parse_args()

    print("machine:", describe())
    process = None
    if args.url:
        base, pid = args.url.rstrip("/"), args.pid
    else:
        process, base = start_daemon(args.models.split(","))
        pid = process.pid
    try:
        started = time.monotonic()
        ready = asyncio.run(wait_ready(base, process))
        print(f"daemon {base} (pid {pid}) ready in {time.monotonic() - started:.0f} s: {', '.join(ready)}; "
              f"{args.duration:.0f} s at concurrency {args.concurrency}", flush=True)
        tally, rss = asyncio.run(soak(base, args, pid))
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    ok = report(tally, rss, args)
    if process is not None:
        print(f"daemon exit status: {process.returncode}")
        ok = ok and process.returncode == 0
    print("verdict:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
